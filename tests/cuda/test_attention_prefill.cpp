// Attention prefill (src/cuda/kernels/attention/attention.h: attention_prefill) against the CPU reference
// (cpu::attention_head) on random bf16 inputs: causal GQA with a cached prefix, the fused output gate,
// head dims 64 / 128 / 256. Fresh seeds (printed on failure), output poisoned with NaN. The GPU rounds
// probabilities and the output to bf16, so ‖Δ‖/‖ref‖ ≤ 1e-2.
#include <gtest/gtest.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cpu/ops.h"
#include "cuda/kernels/attention/attention.h"
#include "prefill_test_util.h"

using namespace lilac;
namespace lc = lilac::cuda;
using namespace lilac::cuda::prefill_testing;

namespace {

// -------------------------------------------------------------------------------------- attention
void check_attention(int heads, int kv_heads, int hd, int64_t start_pos, int n_new, bool gate,
                     lc::AttnPrefillPath path = lc::AttnPrefillPath::Auto) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " hd=" + std::to_string(hd) + " start=" + std::to_string(start_pos) +
               " n=" + std::to_string(n_new) + " path=" + std::to_string(int(path)));
  std::mt19937 rng(seed);
  const int64_t n_ctx = start_pos + n_new;
  const int64_t kv_stride = int64_t(kv_heads) * hd;
  // q laid out like q_proj's output: per head [query hd | gate hd]
  const int64_t q_stride = int64_t(heads) * hd * 2, q_head_stride = 2 * hd;
  std::vector<float> qf, kf, vf;
  auto qb = rand_bf16(size_t(n_new) * q_stride, rng, -1.f, 1.f, &qf);
  auto kb = rand_bf16(size_t(n_ctx) * kv_stride, rng, -1.f, 1.f, &kf);
  auto vb = rand_bf16(size_t(n_ctx) * kv_stride, rng, -1.f, 1.f, &vf);
  auto gf = rand_f(size_t(n_new) * q_stride, rng, -3.f, 3.f);
  const float scale = 1.f / std::sqrt(float(hd));
  std::vector<float> ref(size_t(n_new) * heads * hd), scores(n_ctx);
  for (int i = 0; i < n_new; ++i)
    for (int h = 0; h < heads; ++h) {
      const int kvh = h / (heads / kv_heads);
      float* o = &ref[(size_t(i) * heads + h) * hd];
      cpu::attention_head(&qf[i * q_stride + h * q_head_stride], &kf[kvh * hd], &vf[kvh * hd], start_pos + i + 1,
                          kv_stride, hd, scale, o, scores.data());
      if (gate)
        for (int d = 0; d < hd; ++d) o[d] *= sigm(gf[i * q_stride + h * q_head_stride + hd + d]);
    }
  Dev<uint16_t> dq(qb), dk(kb), dv(vb), dout(size_t(n_new) * heads * hd);
  Dev<float> dg(gf);
  dout.poison();
  lc::AttentionPrefillArgs a;
  a.q = reinterpret_cast<const __nv_bfloat16*>(dq.p);
  a.q_stride = q_stride;
  a.q_head_stride = q_head_stride;
  a.k_cache = reinterpret_cast<const __nv_bfloat16*>(dk.p);
  a.v_cache = reinterpret_cast<const __nv_bfloat16*>(dv.p);
  a.kv_stride = kv_stride;
  if (gate) {
    a.gate = dg.p + hd;
    a.gate_stride = q_stride;
    a.gate_head_stride = q_head_stride;
  }
  a.out = reinterpret_cast<__nv_bfloat16*>(dout.p);
  a.out_stride = int64_t(heads) * hd;
  a.n_new = n_new;
  a.start_pos = start_pos;
  a.heads = heads;
  a.kv_heads = kv_heads;
  a.head_dim = hd;
  lc::attention_prefill(a, nullptr, path);
  CK(cudaDeviceSynchronize());
  EXPECT_LT(rel_err(bf16_to_f(dout.get()), ref), 1e-2);
}

TEST(PrefillAttention, CausalGqaHead256WithPrefixAndGate) {
  NEED_GPU();
  check_attention(4, 2, 256, 37, 90, true);
  check_attention(16, 2, 256, 0, 130, true);
}
// Both kernels of head_dim 256 forced (the wgmma one runs where sm_90a code and a Hopper GPU are present, else the
// forced path falls back to mma.sync): several 128-query blocks and 64-key tiles, positions not multiples of 64, a
// last block whose second warpgroup has no rows and whose first has a few.
TEST(PrefillAttention, Head256BothKernels) {
  NEED_GPU();
  for (auto path : {lc::AttnPrefillPath::MmaSync, lc::AttnPrefillPath::Wgmma}) {
    check_attention(16, 2, 256, 0, 130, true, path);
    check_attention(4, 1, 256, 101, 389, true, path);
    check_attention(8, 2, 256, 700, 1, false, path);
    check_attention(2, 2, 256, 0, 64, false, path);
  }
}
TEST(PrefillAttention, OtherHeadDims) {
  NEED_GPU();
  check_attention(4, 1, 128, 200, 65, false);
  check_attention(2, 2, 64, 5, 1, false);
}

}  // namespace
