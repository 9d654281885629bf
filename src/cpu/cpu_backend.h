// The CPU backend: the reference implementation of the model in plain fp32 (src/cpu/ops.h), threaded
// over rows / heads / experts. Prefill runs in bounded chunks (attention over the KV cache, the Gated
// DeltaNet in its chunked form); a one-token step uses the recurrent form.
//
// decode_batch() (continuous batching) is a real batched step: one qmatvec_rows per weight matrix for
// the whole batch (each weight row read once for all sessions; row b computed exactly as session b's
// own one-token step computes it), attention and the Gated DeltaNet per session on its own state. So
// every session's logits and choice are bit-identical to its decode_step(). Activation taps are not
// called by a batched step (a batch with a tapped session runs session by session).
//
// Session state: KV cache fp32 [attn_layer][len][kv_heads * head_dim] (k after norm + RoPE), Gated
// DeltaNet state fp32 [layer][Hv][dk][dv] and conv state fp32 [layer][conv_dim][K-1] (oldest first).
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "engine/backend.h"
#include "model/weights.h"

namespace lilac::cpu {

// Debug taps of the hidden state, called during prefill with rows [first_pos, first_pos + n_rows)
// of `data` [n_rows, hidden]: "embed" (token embeddings), "layer.N" (residual stream after decoder
// layer N), "final_norm" (after the final RMSNorm).
using ActivationTap =
    std::function<void(const std::string& name, int64_t first_pos, int64_t n_rows, const float* data)>;

class CpuSession : public Session {
 public:
  virtual void set_activation_tap(ActivationTap tap) = 0;
  // Tokens per prefill chunk (default 256; at least 1). Larger chunks amortise the dequantization of
  // each expert over more tokens; memory grows linearly with it.
  virtual void set_prefill_chunk(int64_t tokens) = 0;
  // Store the attention K/V cache rounded to bf16 (as the CUDA backend does), to compare the two
  // backends on the same function. Off by default (fp32 cache). Set before the first prefill.
  virtual void set_kv_bf16(bool on) = 0;
};

// threads <= 0: all hardware threads. max_length <= 0 in new_session: the config's
// max_position_embeddings. Sessions refer to their backend (weights, thread pool): destroy them first.
// Sessions of one backend may run on different threads; they share its pool (one parallel loop at a time).
std::unique_ptr<Backend> make_cpu_backend(std::shared_ptr<const ModelWeights> weights, int threads = 0);

// MemAvailable of /proc/meminfo in bytes (0 when unknown): what the CPU backends size their default
// session pools by.
size_t available_ram_bytes();
// The default pool of a CPU backend: kDefault sessions, fewer when half the available RAM would not
// hold them at full length (per = session_bytes(max_length); 0 = unknown: kDefault).
int default_cpu_sessions(size_t per_session_bytes, int k_default = 4);

}  // namespace lilac::cpu

namespace lilac {
using cpu::make_cpu_backend;
}
