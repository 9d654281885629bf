// A model of a given shape whose weights are random values generated directly on the GPU (for
// `lilac bench --synthetic`: the real model's speed without its checkpoint). The shape of the real
// model (synthetic_config) and the bytes a decode token moves (decode_bytes_per_token) are declared in
// cuda_backend.h for the CLI.
#pragma once
#include <cstdint>
#include <memory>

#include "cuda/device_model.h"
#include "model/config.h"

namespace lilac::cuda {

// 4-bit everywhere except the 8-bit router + shared_expert_gate; values ~N(0, 1/sqrt(in)) in
// distribution; a random router, so that MoE routing spreads over the experts. Deterministic in `seed`.
std::unique_ptr<DevModel> synthetic_model(const ModelConfig& cfg, uint64_t seed);

}  // namespace lilac::cuda
