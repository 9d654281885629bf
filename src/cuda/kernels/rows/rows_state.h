// Multi-row decode step, the per-sequence-state kernels (exactness: rows_mm.h): embedding gather, q/k
// norm + RoPE + KV append, attention over per-sequence KV caches, Gated DeltaNet conv + recurrence,
// and the rollback of the GDN/conv state after MTP verification. (The weight kernels of the step —
// GEMV, MoE, sampling — are declared in rows.h.)
//
// Rows. A launch covers M rows (1 <= M <= kMaxRows, fixed per captured graph); row r belongs to slot
// row_slot[r] (< 0: padding row: nothing per-sequence is read, nothing is written, its outputs stay
// untouched) at position row_pos[r]. Rows of one sequence are consecutive, with consecutive ascending
// positions. Activations are row-major fp32 [M][width] with the row strides given (floats).
// Step inputs: row_slot must be written before the step's first kernel (a host copy before the graph
// launch) or by a kernel at least two launches earlier: gdn_step_rows reads it before its pdl_wait()
// to prefetch the state (launch.cuh: when kernel K starts, kernel K-2 is complete). row_pos and the
// token arrays are read after the wait, as in the single-row kernels.
//
// Per-sequence state: slot-strided pools, element `base + slot * stride` (strides in elements):
//   KV cache of one attention layer: bf16 [max_len][kv_heads][head_dim] per slot (K and V apart).
//   GDN state of one layer: fp32 [Hv][dk][dv] per slot (today's per-session layout).
//   conv state of one layer: fp32 [conv_dim][K-1] per slot, the previous K-1 inputs of each channel
//     oldest first — today's layout exactly (not a ring: prefill and the prefix-cache snapshots keep
//     working unchanged; rollback goes through the log below, so no widening is needed).
//   GDN log of one layer: fp32 [log_rows][conv_dim + 2 Hv] per slot (rollback, see gdn_step_rows).
//
// Batch invariance: every row's results are bit for bit the same whatever M and the other rows are
// (no cross-row reductions; the attention split count depends only on the row's own length).
// Every launch is asynchronous, allocates nothing, reads rows / positions / tokens from device memory
// (graph-replayable) and uses PDL (launch.cuh) like the single-row decode kernels (decode.h).
//
// Wiring of one step (M rows; h, proj, q, attn_out, o: [M][width] activations):
//   host → device before the graph launch: row_slot, row_pos (and tok_idx)
//   [after a verification step: gdn_commit_rows(all GDN layers, per-sequence accepted counts) — here
//    or at the end of the verify step's graph — then at least one other kernel before the first
//    gdn_step_rows (embed_rows is one)]
//   embed_rows(tokens, tok_idx) → h
//   attention layer: qkv GEMV (input RMSNorm) → proj [qg | k | v];
//     attn_qk_norm_rope_append_rows(proj) → q, KV rows; attention_rows(q, proj) → attn_out;
//     o_proj GEMV (+= h)
//   GDN layer: in_proj GEMV (input RMSNorm, no conv epilogue) → proj [qkv raw | z | b | a];
//     gdn_step_rows(proj, mode) → o; out_proj GEMV (GatedHeadNorm prologue, z from the proj rows, += h)
//   MoE, LM head, sampling: rows.h.
// Verification (MTP) of a sequence = its k + 1 rows at positions n..n+k in one step with the GDN
// layers in Log mode; with m drafts accepted, gdn_commit_rows(keep = m + 1); the KV rows past n + m
// need no rollback (overwritten later, never read: a row attends to [0, its position]).
// Memory per slot at the real shape (40 layers: 10 attention, 30 GDN): KV 2 KiB per position per
// attention layer (bf16 K + V), GDN state 2 MiB + conv state 96 KiB per GDN layer (63 + 2.9 MB), log
// 33 KB per logged row per GDN layer (3.96 MB at log_rows 4). Attention scratch: one `partial` of
// attention_rows_partial_floats(s, n_split, M) floats shared by the layers (M × attention_decode's).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/kernels/attention/attention.h"
#include "cuda/kernels/gdn/gdn.h"
#include "cuda/kernels/gemv/gemv.h"
#include "cuda/kernels/qmatrix.cuh"

namespace lilac::cuda::rows {

constexpr int kMaxRows = 64;  // rows per launch

// ------------------------------------------------------------------------------------------------ embedding
// out[r * out_stride + c] = dequantized row t_r of E (c < E.cols), t_r = tokens[tok_idx[r]] (tok_idx
// null: tokens[r]). Same arithmetic as embed_gather (bitwise). A token outside [0, E.rows) gives a row
// of NaN. The index indirection lets one launch read, e.g., each sequence's pending token from a
// per-slot cell written by the sampler (batching: tok_idx[r] = slot) and a verify run's drafts from a
// draft buffer (tok_idx = [pending cell, draft cells...]).
void embed_rows(const QMatrixDev& E, int M, const int32_t* row_slot, const int32_t* tokens, const int32_t* tok_idx,
                float* out, int64_t out_stride, cudaStream_t stream);

// ------------------------------------------------------------------------------------------------ attention
// One attention layer's KV pool: slot s's cache starts at k + s * slot_stride (v likewise).
struct KvPool {
  __nv_bfloat16* k = nullptr;  // 16-byte aligned
  __nv_bfloat16* v = nullptr;
  int64_t slot_stride = 0;  // elements, >= max_len * kv_heads * head_dim, a multiple of 8 (16 bytes)
};

// Per row r, from the fused qkv projection row proj + r * proj_stride = [qg: heads × (q hd | gate hd)
// | k: kv_heads × hd | v: kv_heads × hd]: RMSNorm each q / k head, partial RoPE at row_pos[r];
// q → q_out + r * heads * hd; k, v → cache row row_pos[r] of slot row_slot[r]. Per row exactly the
// arithmetic of attn_qk_norm_rope_append (bitwise).
void attn_qk_norm_rope_append_rows(const AttnDecodeShape& s, int M, const int32_t* row_slot, const int32_t* row_pos,
                                   const float* proj, int64_t proj_stride, const float* q_norm, const float* k_norm,
                                   const float* inv_freq, float* q_out, const KvPool& kv, cudaStream_t stream);

// Row r attends to cache rows [0, row_pos[r]] of its slot (every row's K/V appended before, so rows
// of one sequence are causal among themselves): out + r * heads * hd = attn ⊙ sigmoid(gate), gate
// from the row's qg; q from attn_qk_norm_rope_append_rows. Each row is split over the context exactly
// as attention_decode splits a single token with the same n_split (nsp = min(W, ceil(L / min_rows)),
// W = one wave of blocks per unit, fixed per device and n_split), and the (row, split) items are
// spread over one wave of blocks; combine as attention_decode (last arriving block of each group of
// 16 splits, then of the groups), deterministic: a row's output is bitwise attention_decode's for that
// token. `partial` (attention_rows_partial_floats(s, n_split, M) floats, 16-byte aligned, no
// initialisation needed, self-resetting counters) must not be shared by launches that can run
// concurrently; it may be shared by the layers of a step and by the graphs of every M' <= M (the
// counters sit at the same place for every M). head_dim 32/64/128/256, G <= 16.
size_t attention_rows_partial_floats(const AttnDecodeShape& s, int n_split, int M);
void attention_rows(const AttnDecodeShape& s, int M, const int32_t* row_slot, const int32_t* row_pos, const float* q,
                    const float* proj, int64_t proj_stride, const KvPool& kv, int n_split, float* partial, float* out,
                    cudaStream_t stream);

// ------------------------------------------------------------------------------------------------ Gated DeltaNet
struct GdnRowsShape {
  int Hk = 0, Hv = 0, dk = 0, dv = 0, conv_k = 0;  // dk <= 256, Hv % Hk == 0, 1 <= conv_k <= 4
  __host__ __device__ int64_t conv_dim() const { return 2LL * Hk * dk + int64_t(Hv) * dv; }
  __host__ __device__ int64_t log_row_floats() const {
    return conv_dim() + 2LL * Hv;
  }  // one logged row: [qkv raw | b | a]
};
// One GDN layer: weights and the slot-0 bases of its pools.
struct GdnLayer {
  const float* conv_w = nullptr;   // [conv_dim][K] (tap K-1 multiplies the current input)
  const float* A_log = nullptr;    // [Hv]
  const float* dt_bias = nullptr;  // [Hv]
  float* state = nullptr;          // [Hv][dk][dv] of slot 0
  float* conv_state = nullptr;     // [conv_dim][K-1] of slot 0
  float* log = nullptr;            // [log_rows][log_row_floats] of slot 0 (null: no Log mode / commit)
  // [slots][Hk] arrival counters of slot 0 (required by gdn_commit_rows; zeroed once at allocation, left
  // zeroed by every launch): the blocks of a key head all read its q/k conv state, the last one to finish
  // writes it. Per layer (gdn_commit_rows runs the layers concurrently).
  unsigned* conv_sync = nullptr;
};
// Per-slot strides (floats) of the pools, the same for every layer.
struct GdnPool {
  int64_t state_stride = 0, conv_stride = 0, log_stride = 0;
  int log_rows = 0;  // rows a slot's log holds (the most rows of one sequence that can be rolled back)
};
inline int64_t gdn_log_floats(const GdnRowsShape& s, int log_rows) { return log_rows * s.log_row_floats(); }

// Advance: the sequence's state and conv state advance over all its rows (written after the last).
// Log (MTP verification): the outputs are the same bits as Advance, but the state and conv state are
//   left as they were; instead each row j < log_rows of a sequence's run writes its raw inputs (qkv
//   before the conv, b, a) to log row j of its slot. gdn_commit_rows then advances the state over the
//   first `keep` logged rows — the same code on the same inputs, so the state after commit is bitwise
//   the state Advance would have left after those rows.
enum class GdnMode { Advance = 0, Log = 1 };

// Per row r, from the fused in_proj row proj + r * proj_stride = [qkv raw (conv_dim, before the conv)
// | z (Hv*dv) | b (Hv) | a (Hv)] (the in_proj GEMV's raw output; no conv epilogue): the causal
// depthwise conv + SiLU of the qkv channels on the slot's conv state (into conv_out, [M][conv_dim]
// floats of scratch: gdn_conv_rows_floats), L2 norms of q, k, the gates, the delta-rule step on the
// slot's state, o → out + r * out_stride [Hv*dv] (raw, before the gated output norm: out_proj's
// GatedHeadNorm prologue takes z from the proj row). Rows of one sequence (a run of consecutive rows
// with the same slot) are processed in order by the same threads / blocks, the state kept in
// registers. Per row the arithmetic of the in_proj conv epilogue + gdn_decode_step (bitwise, given the
// same raw in_proj values). Two launches per layer: the conv (a thread per channel and run), the step
// (grid (Hv, dv/16, M)).
// The state and conv state are read before pdl_wait(), as in gdn_decode_step: their last writer (a
// gdn_step_rows in Advance mode, gdn_commit_rows, prefill, a copy) must be at least two launches
// earlier — never two GDN launches on the same state back to back with no other kernel in between.
void gdn_step_rows(const GdnRowsShape& s, const GdnLayer& layer, const GdnPool& pool, int M, const int32_t* row_slot,
                   const float* proj, int64_t proj_stride, float* out, int64_t out_stride, GdnMode mode,
                   float* conv_out, cudaStream_t stream);
inline int64_t gdn_conv_rows_floats(const GdnRowsShape& s, int M) { return int64_t(M) * s.conv_dim(); }

// Rollback / commit after a Log-mode step, all GDN layers in one launch: for every sequence i < n_seq
// with seq_slot[i] >= 0 and every layer, advance the slot's state and conv state over its log rows
// 0 .. keep-1, keep = min(seq_keep[i], log_rows) (<= 0: unchanged; the state stays the one before the
// verify pass). For MTP with m of k drafts accepted: keep = m + 1 (the rows [x_n, d_1..d_m]).
// Reads everything after its pdl_wait(). n_layers <= kGdnMaxLayers (the layer table is passed by
// value).
constexpr int kGdnMaxLayers = 48;
void gdn_commit_rows(const GdnRowsShape& s, const GdnLayer* layers, int n_layers, const GdnPool& pool, int n_seq,
                     const int32_t* seq_slot, const int32_t* seq_keep, cudaStream_t stream);

}  // namespace lilac::cuda::rows
