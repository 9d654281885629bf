// Batched prefill of one sequence: a chunk of n prompt tokens through every layer with the prefill
// kernels (GEMMs, flash attention, the chunked GDN, the grouped MoE), reading the model's DevLayers
// and writing the sequence's KV caches, GDN and conv states directly. Small row kernels of its own:
// embedding rows, RMSNorm → bf16, q/k norm + RoPE + KV append for n rows.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cuda/device_model.h"
#include "cuda/seq_state.h"

namespace lilac::cuda {

// Per-session scratch of the batched prefill, sized on first use for the largest chunk.
struct PrefillWorkspace {
  int cap = 0;  // tokens the buffers hold
  float* H = nullptr;
  __nv_bfloat16* Xb = nullptr;
  float* P = nullptr;
  float* conv_out = nullptr;
  __nv_bfloat16* Qb = nullptr;
  __nv_bfloat16* Ob = nullptr;
  float* o_scratch = nullptr;
  void* moe_ws = nullptr;
  size_t moe_ws_bytes = 0;
  float* gdn_work = nullptr;  // the GDN prefill's scratch (chunked or column scan)
  float* split = nullptr;     // split-K partials of the mixers' projections
  size_t split_floats = 0;
  std::vector<void*> owned;
  PrefillWorkspace() = default;
  PrefillWorkspace(const PrefillWorkspace&) = delete;
  PrefillWorkspace& operator=(const PrefillWorkspace&) = delete;
  ~PrefillWorkspace();
};

// Tokens per batched prefill chunk: bounds the prefill scratch memory (~0.5 GB at 4096 on the real
// model); larger chunks give the GEMMs and the grouped expert GEMMs more rows per weight tile (4096 vs
// 512: 34.8K vs 11.9K tok/s at a 4096-token prompt, bench/BENCHMARKS.md). LILAC_PREFILL_CHUNK
// overrides (16..16384).
int prefill_chunk_tokens();

// Bytes of device memory a PrefillWorkspace holds for chunks of up to max_n tokens of model m: every buffer the
// batched prefill uses (prefill_chunk allocates nothing else; the sessions' memory budget counts this).
size_t prefill_workspace_bytes(const DevModel& m, int max_n);

// Whether the batched prefill takes this model: the prefill kernels' limits (GDN dk == dv == 128,
// attention head_dim 64 / 128 / 256, hidden % 64 == 0), and not LILAC_CUDA_TOKEN_PREFILL=1 (which
// forces the token-by-token decode path).
bool prefill_batched_ok(const DevModel& m);

// Runs tokens[0, n) (device memory, n <= prefill_chunk_tokens()) at positions st.len .. st.len + n - 1
// through every layer: appends their K/V rows, advances the GDN and conv states, and copies the last
// row of the residual stream to h_last [hidden]. Leaves st.len and *st.pos to the caller. Asynchronous
// on `s` (allocates ws on first use).
void prefill_chunk(const DevModel& m, const SeqState& st, PrefillWorkspace& ws, const int32_t* tokens, int n,
                   float* h_last, cudaStream_t s);

}  // namespace lilac::cuda
