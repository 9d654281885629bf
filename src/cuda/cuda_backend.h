// The CUDA backend (src/cuda/): weights uploaded once and packed for the kernels (device_model.h),
// every op on the device, a decode step (all layers + LM head + sampling) replayed as one CUDA graph
// (cuda_session.h). Per-sequence device state: seq_state.h.
//
// Plain C++ header (no CUDA types) so that the CLI and the server can include it; only compiled in
// when the build has CUDA (LILAC_HAVE_CUDA).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "model/weights.h"

namespace lilac::cuda {

// True when a CUDA device is usable (driver present, at least one device). Never throws.
bool gpu_available();

// The CUDA backend over a loaded checkpoint (weights are uploaded to device 0 and packed).
// Throws lilac::Error when no GPU is present or a tensor cannot be handled.
std::unique_ptr<Backend> make_cuda_backend(std::shared_ptr<const ModelWeights> weights);

// A backend over a model of the given shape whose weights are random values generated directly on
// the GPU (for `lilac bench --synthetic`): 4-bit everywhere except the 8-bit router and
// shared_expert_gate; values ~N(0, 1/sqrt(in)) in distribution; random router so that MoE routing
// spreads over the experts; a random MTP head when cfg.mtp_num_hidden_layers > 0.
std::unique_ptr<Backend> make_synthetic_cuda_backend(const ModelConfig& cfg, uint64_t seed = 1);

// The real model's shape (Qwen3.6-35B-A3B) with `layers` layers (every 4th full attention) and its
// one-layer MTP head.
ModelConfig synthetic_config(int layers = 40);

// Bytes that must move per decode token at context length `ctx` (weights read for one token incl.
// the top-k + shared experts, router and LM head; recurrent state read + written; KV cache read),
// for the quantized layout this backend uses.
double decode_bytes_per_token(const ModelConfig& cfg, int64_t ctx);
// The same for one batched step of `streams` sequences at context ctx: the weights once, the routed experts
// the streams are expected to touch (ModelConfig::experts_touched) once, every stream's own state.
double decode_step_bytes(const ModelConfig& cfg, int64_t ctx, int64_t streams);

// GPU memory (bytes) currently used on the device, and the part held by a backend's weights.
struct MemoryInfo {
  size_t used = 0, total = 0, weights = 0;
};
MemoryInfo memory_info(const Backend& b);

// Bytes held by the kernels' own per-stream scratch buffers (kernels/stream_scratch.h), which no session's memory
// budget counts: a session's prefill and decode steps pass their scratch in and leave this unchanged.
size_t stream_scratch_bytes();

}  // namespace lilac::cuda
