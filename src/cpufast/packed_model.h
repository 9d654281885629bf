// The model's matrices repacked for the fast CPU path (pack.h), grouped the way the forward pass uses
// them: matrices that read the same input are stacked into one packed matrix (q|k|v; the Gated DeltaNet
// in_proj qkv|z|b|a; the MoE router|shared_expert_gate), so one phase of the
// worker pool covers them with one work list.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "cpufast/pack.h"
#include "model/weights.h"

namespace lilac::cpufast {

struct PackedLayer {
  // Attention: qkv rows [q_proj rows | k rows | v rows]; o_proj.
  // Gated DeltaNet: in rows [qkv (conv channels) | z | b | a]; out_proj.
  PackedMatrix in, out;
  PackedMatrix router;  // [router (num_experts rows) | shared_expert_gate (1 row)]
  PackedMatrix shared_gate, shared_up, shared_down;
  std::vector<PackedMatrix> expert_gate, expert_up, expert_down;
};

struct PackedModel {
  const KernelSet* kernels = nullptr;
  std::vector<PackedLayer> layers;
  PackedMatrix lm_head;
  size_t bytes = 0;  // packed weight bytes
  std::vector<std::shared_ptr<PackedBuffer>> owners;
};

// Packs every matrix of `w` for `kernels` (its rows_per_tile), on up to `threads` threads.
std::unique_ptr<PackedModel> pack_model(const ModelWeights& w, const KernelSet& kernels, int threads);

}  // namespace lilac::cpufast
