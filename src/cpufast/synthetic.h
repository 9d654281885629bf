// Random-weight models of the real Qwen3.6-35B-A3B shape for CPU benchmarks (`lilac bench --synthetic
// --backend cpu`): MLX-layout 4-bit matrices (8-bit router and shared_expert_gate) with random quants,
// scales and biases, built in memory (no checkpoint needed), and the bytes a decode step reads.
#pragma once
#include <cstdint>
#include <memory>

#include "model/weights.h"

namespace lilac::cpufast {

// The real model's text config with `layers` layers (layer i is full attention when i % 4 == 3).
ModelConfig synthetic_config(int layers);

// Random weights for `cfg` (about 0.56 bytes per parameter), on up to `threads` threads.
std::shared_ptr<const ModelWeights> synthetic_weights(const ModelConfig& cfg, uint64_t seed, int threads = 0);

// Bytes of packed weights one decode step reads at context length ctx (embedding row, every layer's
// attention or Gated DeltaNet projections, router, shared expert, the top-k experts, the LM head; K/V
// cache f16 and the Gated DeltaNet state read and written).
double decode_bytes_per_token(const ModelConfig& cfg, int64_t ctx);
// The same for one batched step of `streams` sequences (weights and the expected routed experts once, every
// stream's own state; ModelConfig::experts_touched).
double decode_step_bytes(const ModelConfig& cfg, int64_t ctx, int64_t streams);

}  // namespace lilac::cpufast
