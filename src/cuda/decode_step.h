// The decode step of one sequence as a fixed sequence of kernel launches (captured once per session
// into a CUDA graph and replayed): embed the pending token → every layer (attention or Gated DeltaNet
// mixer, then the MoE) → increment the position (the body) → final norm + LM head into the logits
// (the head) → sampling into the token slot. The position and the token are read from the sequence's
// device slots, so one captured graph serves every step.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cuda/device_model.h"
#include "cuda/kernels/attention/attention.h"
#include "cuda/kernels/gdn/gdn.h"
#include "cuda/seq_state.h"

namespace lilac::cuda {

// Per-session scratch of the decode step: the activations passed between its kernels (overwritten
// by every step) and the launch shapes.
struct DecodeScratch {
  AttnDecodeShape attn;
  GdnShape gdn;
  int n_split = 1;       // attention splits for sequences of up to max_len tokens
  float* h = nullptr;    // residual stream [hidden] (also where a prefill leaves its last row)
  float* proj = nullptr;  // the in_proj output [max_in_rows]
  float *gdn_o = nullptr, *q_rot = nullptr, *attn_out = nullptr, *partial = nullptr;
  float *rlogits = nullptr, *sel_w = nullptr, *act = nullptr;  // MoE: router logits, routing, activations
  int32_t* sel_ids = nullptr;
  void* sample_scratch = nullptr;
  void* digits = nullptr;  // the LM head's staged input (one row), when the model has DevModel::lm_tiles
};
DecodeScratch alloc_decode_scratch(DevAlloc& mem, const DevModel& m, int64_t max_len);
// The attention split count of a sequence of capacity max_len (DecodeScratch::n_split; the rows step of
// sequences of that capacity uses the same, rows_step.h).
int decode_n_split(int64_t max_len);

// LILAC_CUDA_PROFILE=1: decode steps run eagerly with CUDA events between the kernel groups; the GPU
// time between marks is summed per group and printed when the profile is destroyed.
class StepProfile {
 public:
  static bool requested();  // LILAC_CUDA_PROFILE=1
  ~StepProfile();
  // Records an event on `s` labelled `label` (while a profiled step is being enqueued).
  void mark(const char* label, cudaStream_t s);
  // After the step's stream has synchronised: adds the times between consecutive marks.
  void collect();

 private:
  int steps_ = 0;
  std::vector<std::pair<std::string, cudaEvent_t>> marks_;
  std::map<std::string, double> ms_;
};

// Captures what `enqueue` puts on `s` into an instantiated CUDA graph (the caller destroys it). Throws
// lilac::Error (the capture ended, nothing left captured) when enqueue throws or capture fails.
cudaGraphExec_t capture_graph(cudaStream_t s, const std::function<void()>& enqueue);

// Enqueue on `s` (graph-capturable; `prof` null except in profiled eager steps):
// the body (embed → layers → *pos += 1), reading the token at *st.token and the position *st.pos;
void enqueue_decode_body(const DevModel& m, const SeqState& st, const DecodeScratch& sc, cudaStream_t s,
                         StepProfile* prof = nullptr);
// the body's pieces on the residual stream sc.h (the MTP head's layer, mtp_head.h, is made of them too):
// an attention mixer (q|k|v GEMV with the input RMSNorm → q/k norm + RoPE + KV append at *pos → attention
// over cache rows [0, *pos] → o_proj added to sc.h) and an MoE block (router → gate/up → down added to sc.h);
void enqueue_attn_mixer(const DevModel& m, const DevLayer& L, __nv_bfloat16* k_cache, __nv_bfloat16* v_cache,
                        const int32_t* pos, const DecodeScratch& sc, cudaStream_t s, StepProfile* prof = nullptr);
// The mixer's first half alone: the q|k|v GEMV and the q/k norm + RoPE + KV append at *pos (the cache row the
// mixer would write, bit for bit; the MTP head's catch-up rows need nothing else).
void enqueue_attn_kv(const DevModel& m, const DevLayer& L, __nv_bfloat16* k_cache, __nv_bfloat16* v_cache,
                     const int32_t* pos, const DecodeScratch& sc, cudaStream_t s, StepProfile* prof = nullptr);
void enqueue_moe(const DevModel& m, const DevLayer& L, const DecodeScratch& sc, cudaStream_t s,
                 StepProfile* prof = nullptr);
// the head: final RMSNorm + LM head from sc.h into st.logits;
void enqueue_decode_head(const DevModel& m, const SeqState& st, const DecodeScratch& sc, cudaStream_t s);
// the LM head of sc.h after an RMSNorm with norm_w (the final norm; the MTP head's own), into logits: on the digits
// kernels when the model has lm_tiles, else the fp16 GEMV; rows > 0: only the logits of token ids < rows (the first
// rows of the matrix; on the digits kernels each is the same bits as in the whole head's launch);
void enqueue_head_row(const DevModel& m, const float* norm_w, float* logits, const DecodeScratch& sc, cudaStream_t s,
                      int64_t rows = 0);
// The LM head of M rows x ([M][ldx]) after an RMSNorm with norm_w, on the digits kernels (m.lm_tiles required):
// y [M][ldy]; buf: digits::stage_bytes(hidden, M). A row's logits are the same bits for every M (padding rows,
// row_slot[r] < 0, are neither read nor written).
// rows > 0: only the first `rows` outputs of each row (token ids < rows).
void enqueue_lm_head(const DevModel& m, const float* x, int64_t ldx, int M, const int32_t* row_slot,
                     const float* norm_w, float* y, int64_t ldy, void* buf, cudaStream_t s, int64_t rows = 0);
// sampling from st.logits into *st.token and *st.result.
void enqueue_sample(const SeqState& st, const DecodeScratch& sc, cudaStream_t s);

}  // namespace lilac::cuda
