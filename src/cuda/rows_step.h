// The rows step: one decode step of the whole model over M rows (1 <= M <= rows::kMaxRows) on the multi-row kernels
// (kernels/rows/; the exactness contract: kernels/rows/rows_mm.h). A row is one token of one sequence; the
// sequences' states live in slot-strided pools (RowsState). Shared by the batched decode (decode_batch: M distinct
// slots, one row each, GDN Advance) and the speculative verify (one slot at consecutive positions, GDN Log, then
// rows::gdn_commit_rows over RowsState::gdn with the accepted counts).
//
// Interface in short:
//   RowsState   where the per-sequence state is: per attention layer a KvPool, per GDN layer a GdnLayer
//               (weights + slot-0 bases of state / conv / log) + the pools' strides, the attention split
//               count, and (optional) the per-slot sampling state, token cells, logits and position cells.
//   RowsScratch the step's activations for up to max_rows rows (alloc_rows_scratch); after a step:
//               h [M][hidden]   the residual stream after the last layer (before the final norm: the MTP
//                               head's input hidden), logits [M][vocab], results [M] (when sampled).
//   RowsArgs    M and device arrays read by the kernels (write them before the launch of the step's graph,
//               e.g. a cudaMemcpyAsync on the same stream): row_slot [M] (< 0: padding row), row_pos [M],
//               the token of row r = tokens[tok_idx[r]] (tok_idx null: tokens[r]); the GDN mode; what to do
//               after the LM head (sample, scatter the logits / advance the positions per slot).
//   enqueue_rows_step(m, state, scratch, args, stream)  embed → layers → final norm + LM head → [sample_rows]
//               → [finish]. Graph-capturable (every kernel reads its row arrays from device memory), no
//               allocation, no host sync. enqueue_rows_body / _head / _sample / _finish are its parts.
// Per row, every kernel computes bit for bit what the single-row decode step (decode_step.h) computes for
// that token when rows_step_exact(m) holds (MoE down's expert width a multiple of 256, the tensor-core GEMV);
// whatever M and the other rows are, a row's results are the same bits (batch invariance) in any case.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cuda/device_model.h"
#include "cuda/kernels/rows/rows_mm.h"
#include "cuda/kernels/rows/rows_state.h"
#include "cuda/kernels/sampling/sampling.h"

namespace lilac::cuda {

struct RowsState {
  std::vector<rows::KvPool> kv;     // per attention layer (DevModel order)
  std::vector<rows::GdnLayer> gdn;  // per GDN layer: weights and the slot-0 bases of state, conv (and log)
  rows::GdnPool gdn_pool;
  int n_split = 1;  // attention splits: the single-row step's DecodeScratch::n_split (same max_len) for exactness
  // Per slot s (used by enqueue_rows_sample / enqueue_rows_finish only; null where not wanted):
  SampleParamsDev* params = nullptr;  // params[s]
  int32_t* counts = nullptr;          // counts + s * vocab
  uint8_t* prompt_mask = nullptr;     // prompt_mask + s * vocab
  const uint32_t* allowed = nullptr;  // allowed + s * rows::allowed_words(vocab), when allowed_on[s] != 0
  const int32_t* allowed_on = nullptr;
  int32_t* token = nullptr;           // token[s]: the pending token cell (the sampler writes it)
  float* logits = nullptr;            // logits + s * vocab: the slot's current logits (finish copies row logits)
  int32_t* pos = nullptr;             // pos[s]: the slot's position cell (finish sets last row's pos + 1)
};

struct RowsScratch {
  int max_rows = 0;
  int64_t proj_stride = 0, act_stride = 0, kmax = 0;
  float *h = nullptr, *proj = nullptr, *q = nullptr, *attn_out = nullptr, *gdn_o = nullptr;
  float* gdn_conv = nullptr;  // [max_rows][gdn conv_dim]: gdn_step_rows' conv outputs
  void *frag4g = nullptr, *frag4 = nullptr, *frag8 = nullptr;  // staged inputs (rows_mm.h: stage)
  void* frag4w = nullptr;  // the in_proj / q-kv input for the wgmma rows GEMV (null: that kernel never runs here)
  float2* meta = nullptr;
  float* partial = nullptr;
  float* gemv_partials = nullptr;  // the dense slice kernel's k-slice sums (rows_mm.h: gemv_rows_partial_floats)
  size_t gemv_partial_floats = 0;
  float *rlogits = nullptr, *sel_w = nullptr, *act = nullptr;
  int32_t* sel_ids = nullptr;
  void* moe = nullptr;
  float* logits = nullptr;  // [max_rows][vocab]
  void* digits = nullptr;   // the LM head's staged input (DevModel::lm_tiles)
  void *moe_xdig = nullptr, *moe_adig = nullptr;  // the digits MoE's staged inputs (MoEDecodeWeights::digits)
  void* sample = nullptr;
  SampleResult* results = nullptr;  // [max_rows] (device)
};
// Scratch for up to max_rows rows with attention split count n_split. Allocates from `mem`.
RowsScratch alloc_rows_scratch(DevAlloc& mem, const DevModel& m, int max_rows, int n_split);
// Bytes alloc_rows_scratch takes (approximately, without allocation padding).
size_t rows_scratch_bytes(const DevModel& m, int max_rows, int n_split);

struct RowsArgs {
  int M = 0;
  const int32_t* row_slot = nullptr;  // [M] device
  const int32_t* row_pos = nullptr;   // [M] device
  const int32_t* tokens = nullptr;    // device
  const int32_t* tok_idx = nullptr;   // [M] device, or null
  rows::GdnMode gdn_mode = rows::GdnMode::Advance;
  bool sample = false;  // enqueue_rows_step: sample_rows with the slots' state into results / token cells
  bool finish = false;  // enqueue_rows_step: enqueue_rows_finish
};

// The staging and the dense products of a rows step (what every layer of enqueue_rows_body runs), for a.M rows
// over a scratch: its frag4g / frag4 / frag8 / meta for the staged input, gemv_partials for the slice kernel. Also
// for other multi-row passes (the MTP head's catch-up rows, mtp_head.cu) with a scratch that has those fields.
struct RowsOps {
  const DevModel& m;
  const RowsScratch& sc;
  const RowsArgs& a;
  cudaStream_t s;
  // Stages x ([M][ldx], K wide) with the prologue into the layouts wanted: 4-bit dense (the group layout),
  // 4-bit MoE, 8-bit, the digits MoE's (into `digits`, when not null).
  void stage(const float* x, int64_t ldx, int64_t K, Prologue pro, const float* norm_w, bool need4g, bool need4,
             bool need8, const float* z = nullptr, int64_t ldz = 0, int head_dim = 0, void* digits = nullptr) const;
  // stage()'s arguments, for a kernel that stages as it ends (rows::moe_combine_stage_rows).
  rows::StageArgs stage_args(const float* x, int64_t ldx, int64_t K, Prologue pro, const float* norm_w, bool need4g,
                             bool need4, bool need8, const float* z = nullptr, int64_t ldz = 0, int head_dim = 0,
                             void* digits = nullptr) const;
  // y [M][ldy] (+)= W · the staged rows.
  void gemv(const QMatrixDev& W, float* y, int64_t ldy, bool acc,
            rows::RowsGemvKernel kernel = rows::RowsGemvKernel::Auto, bool wg_in = false) const;
  // Every part of p into its columns of y; wg_in: the staged input has the frag4w layout too (wg_input(p)).
  void proj(const DevProj& p, float* y, int64_t ldy, rows::RowsGemvKernel kernel = rows::RowsGemvKernel::Auto,
            bool wg_in = false) const;
  // Whether the staging of p's input writes frag4w: the wgmma rows GEMV takes a part of p at a.M rows.
  bool wg_input(const DevProj& p) const;
};

// Whether the rows kernels take this model (shapes, limits) for up to max_rows rows.
bool rows_step_supported(const DevModel& m, int max_rows);
// Whether a row of the rows step is bit for bit the single-row decode step (see the top of this file).
bool rows_step_exact(const DevModel& m);

// embed → every layer; the residual stream ends in sc.h [M][hidden].
void enqueue_rows_body(const DevModel& m, const RowsState& st, const RowsScratch& sc, const RowsArgs& a,
                       cudaStream_t s);
// final RMSNorm + LM head: sc.h → sc.logits [M][vocab].
void enqueue_rows_head(const DevModel& m, const RowsScratch& sc, const RowsArgs& a, cudaStream_t s);
// sample_rows from sc.logits with each row's slot state (rows of distinct slots: a slot's counts and
// step advance once per row) → sc.results[r], st.token[slot].
void enqueue_rows_sample(const DevModel& m, const RowsState& st, const RowsScratch& sc, const RowsArgs& a,
                         cudaStream_t s);
// Per active row r: copies its logits to st.logits[slot] (if set); for the last row of each slot's run,
// st.pos[slot] = row_pos[r] + 1 (if set).
void enqueue_rows_finish(const DevModel& m, const RowsState& st, const RowsScratch& sc, const RowsArgs& a,
                         cudaStream_t s);
// body + head (+ sample when a.sample) (+ finish when a.finish).
void enqueue_rows_step(const DevModel& m, const RowsState& st, const RowsScratch& sc, const RowsArgs& a,
                       cudaStream_t s);
// After a Log-mode step: rows::gdn_commit_rows over every GDN layer of st (sequence i: slot seq_slot[i],
// keep seq_keep[i] logged rows; device arrays). Needs st.gdn_pool.log_rows > 0. Before the next rows step's
// first gdn_step_rows there must be another kernel (embed_rows is one: rows_state.h).
void enqueue_rows_commit(const DevModel& m, const RowsState& st, int n_seq, const int32_t* seq_slot,
                         const int32_t* seq_keep, cudaStream_t s);
// The rows kernels' shapes of the model.
AttnDecodeShape rows_attn_shape(const ModelConfig& c);
rows::GdnRowsShape rows_gdn_shape(const ModelConfig& c);

}  // namespace lilac::cuda
