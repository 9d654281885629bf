// Exact rollback of a Gated DeltaNet layer after a multi-row verification step (speculative decoding,
// ../shared/MODEL_MTP.md §7): the step saves the layer's state before it, and per row the conv input and
// the (k, v, g, beta) its recurrence consumed. Rolling back to "after row m" restores the saved state and
// re-applies rows 0..m with the one-token step's own functions (conv1d_silu_step, gdn_recurrent_step), so
// the recurrent and conv states are bit for bit those that decoding the rows one by one leaves.
// Cost per verify: one copy of the layer's S and conv (at 35B-A3B: 2 MiB + 96 KiB per layer), 2 * conv_dim
// + 2 * Hv floats per row; on rejection, m + 1 recurrent updates per value head (no projections, no MoE).
#pragma once
#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/weights.h"

namespace lilac::cpu {

struct GdnUndo {
  std::vector<float> S, conv;   // the state before the step
  std::vector<float> conv_in;   // [n, conv_dim]: the conv's inputs (in_proj_qkv's output)
  std::vector<float> qkv;       // [n, conv_dim]: after conv, SiLU, q scale and the q / k L2 norms
  std::vector<float> g, beta;   // [n, Hv]
  int64_t n = 0;
  size_t bytes() const {
    return (S.size() + conv.size() + conv_in.size() + qkv.size() + g.size() + beta.size()) * sizeof(float);
  }
};

// S / conv: the layer's state after the step (all n rows applied); afterwards the state after row `m`
// (0 <= m < n).
void gdn_rollback(const GdnUndo& u, const DeltaNetWeights& w, const ModelConfig& cfg, int64_t m, std::vector<float>& S,
                  std::vector<float>& conv);

}  // namespace lilac::cpu
