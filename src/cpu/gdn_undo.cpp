#include "cpu/gdn_undo.h"

#include <algorithm>

#include "core/error.h"
#include "cpu/ops.h"

namespace lilac::cpu {

void gdn_rollback(const GdnUndo& u, const DeltaNetWeights& w, const ModelConfig& cfg, int64_t m, std::vector<float>& S,
                  std::vector<float>& conv) {
  LILAC_CHECK(m >= 0 && m < u.n, "gdn_rollback: row out of range");
  const int Hk = cfg.linear_num_key_heads, Hv = cfg.linear_num_value_heads;
  const int dk = cfg.linear_key_head_dim, dv = cfg.linear_value_head_dim, K = cfg.linear_conv_kernel_dim;
  const int64_t C = cfg.gdn_conv_dim(), kd = cfg.gdn_key_dim();
  S = u.S;
  conv = u.conv;
  std::vector<float> scratch(static_cast<size_t>(std::max<int64_t>(C, dv)));
  const int ratio = Hv / Hk;
  for (int64_t t = 0; t <= m; ++t) {
    // The conv window only shifts (its output is not needed again).
    conv1d_silu_step(w.conv1d.data(), C, K, conv.data(), u.conv_in.data() + t * C, scratch.data());
    const float* row = u.qkv.data() + t * C;
    for (int h = 0; h < Hv; ++h) {
      const float* kp = row + kd + int64_t(h / ratio) * dk;
      const float* vp = row + 2 * kd + int64_t(h) * dv;
      // The state update does not read q: pass k in its place, drop the output.
      gdn_recurrent_step(S.data() + int64_t(h) * dk * dv, kp, kp, vp, u.g[static_cast<size_t>(t * Hv + h)],
                         u.beta[static_cast<size_t>(t * Hv + h)], dk, dv, scratch.data());
    }
  }
}

}  // namespace lilac::cpu
