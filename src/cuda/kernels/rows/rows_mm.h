// Multi-row decode kernels, part 1 (cudakern): quantized matrix products, MoE and sampling over M rows
// (1 <= M <= 64). A row is one token; activations are row-major [M][width] fp32.
// Every function is asynchronous on `stream`, allocates nothing, is CUDA-graph capturable and launched
// with programmatic dependent launch (launch.cuh rules).
//
// Exactness and batch invariance. The tensor-core products compute, for every row, the same arithmetic as
// today's single-row kernels (gemv_tc.cu): nibbles/bytes → fp16 exactly, the input split per 64-group into
// fp16 hi + lo with a power-of-two scale, mma.sync with fp32 accumulation, the same k-slices and the same
// fixed summation orders. Several rows share one mma (4-bit MoE: 2 rows, 8-bit: 4 rows; 4-bit dense: 4 rows, in
// the group layout that gemv_tc's 4-bit kernel uses with one) in B columns that the single-row kernel leaves
// zero, so a row's bits do not depend on M, on its position in the batch or on the other rows,
// and a row is bit for bit what gemv_tc / moe_gate_up_tc / moe_down_tc compute for it alone (tested by
// memcmp; for MoE down when the expert width I is a multiple of 256, as in the model).
//
// Rows with row_slot[r] < 0 are padding: nothing of theirs is read or written (row_slot may be null: every
// row is active).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cuda_runtime.h>

#include "cuda/kernels/gemv/gemv.h"
#include "cuda/kernels/sampling/sampling.h"

namespace lilac::cuda::rows {

// ------------------------------------------------------------------------------------------------ staging
// The tensor-core input of M rows: t(x) (Prologue None / RmsNorm / GatedHeadNorm, as decode.h) split into
// hi/lo fp16 fragments (each [M][frag_row_bytes(K)]) in up to three layouts: the group layout of the 4-bit
// dense GEMV (frag4g, tc_g4.cuh), the k-tile layouts of the 4-bit MoE kernels (frag4) and of 8-bit weights
// (frag8); and the per-64-group meta {2^E, Σx} (meta: [M][meta_row_count(K)] float2, shared by all). One
// staging serves every matrix that reads the same input (the parts of a projection; the router and MoE gate/up).
size_t frag_row_bytes(int64_t K);   // ceil(K / 256) * 1024
size_t meta_row_count(int64_t K);   // ceil(K / 256) * 4
struct StageArgs {
  const float* x = nullptr;        // [M][ldx]
  int64_t ldx = 0;                 // 0: K
  int64_t K = 0;                   // multiple of 64
  int M = 0;
  const int32_t* row_slot = nullptr;
  Prologue pro = Prologue::None;
  const float* norm_w = nullptr;   // RmsNorm [K]; GatedHeadNorm [head_dim]
  const float* z = nullptr;        // GatedHeadNorm [M][ldz]
  int64_t ldz = 0;                 // 0: K
  int head_dim = 0;
  float eps = 1e-6f;
  void* frag4g = nullptr;          // group layout for 4-bit dense weights (gemv_rows; null: not wanted)
  void* frag4 = nullptr;           // k-tile layout for 4-bit MoE weights (moe_gate_up_rows; null: not wanted)
  void* frag8 = nullptr;           // layout for 8-bit weights (null: not wanted)
  // The 4-bit dense input as the wgmma rows GEMV's B operand (gemv_rows_wg.cu; null: not wanted): the frag4g units'
  // fp16 words rearranged, per row and 64-group 256 bytes: hi then lo, 128 bytes each = the group's 4 mma k16 steps
  // of 16 values in mma k order (bytes 32σ + 4c: lane c's b0 of step σ, + 16: its b1).
  void* frag4w = nullptr;
  float2* meta = nullptr;          // required with a frag* output
  // The digits MoE's input (kernels/digits/moe_digits.h: moe_stage_bytes(K, M)): each row's three base-256
  // digits per 64-group in that header's layout, then {2^(E-21), Σx} per row and group (null: not wanted).
  void* digits = nullptr;
};
// Whether the staging takes these arguments (K % 64 == 0, 16-byte aligned rows, K and head_dim limits).
bool stage_supported(const StageArgs& a);
void stage(const StageArgs& a, cudaStream_t stream);

// ------------------------------------------------------------------------------------------------ dense
// y[r][n] (+)= Σ_k W[n][k] · t(x_r)[k] for the M staged rows (stage() output: frag4g for 4-bit W, frag8 for
// 8-bit). W: 4- or 8-bit, 64-column groups. The tiles kernel loads each weight tile once per block of up to 8
// (4-bit) / 4 (8-bit) rows; larger M runs several such row tiles side by side, their blocks reading the same
// weights at the same time (L2). For 4-bit W and M > 8 the slice kernel dequantizes each weight tile once per 16
// or 32 rows (a block per k-slice, 8 row blocks and row tile, the slice's input of its rows in shared memory); with
// more than one k-slice it needs `partials` for the slices' chains, added in slice order by a second launch. Both
// compute the same bits. On Hopper the wgmma kernel (gemv_rows_wg.cu) takes in_proj's shape from 16 rows, where it
// measured faster, when the staging wrote frag4w (frag_wg): each weight tile dequantized once per 16 rows into wgmma's
// A registers, the same bits again, no partials. The GDN conv epilogue of gemv_tc is not here (the conv kernel of the
// rows family does it).
// Auto: LILAC_ROWS_GEMV=tiles|slices|wgmma, else by M and shape (LILAC_ROWS_WGMMA=0: never the wgmma kernel).
// WgmmaStream: the wgmma kernel's input-streaming form from 33 rows (gemv_rows_wg.cu; below 33 rows as Wgmma).
enum class RowsGemvKernel { Auto, Tiles, Slices, Wgmma, WgmmaStream };
struct GemvRowsArgs {
  QMatrixDev W;
  const void* frag = nullptr;      // stage() output: frag4g (4-bit W) or frag8
  const void* frag_wg = nullptr;   // stage() output frag4w of the same rows, or null: the wgmma kernel cannot run
  const float2* meta = nullptr;
  int M = 0;
  const int32_t* row_slot = nullptr;
  float* y = nullptr;              // [M][ldy]
  int64_t ldy = 0;                 // 0: W.rows
  bool accumulate = false;         // y += W t(x) (residual add)
  float* partials = nullptr;       // the slice kernel's k-slice sums (gemv_rows_partial_floats); null: tiles kernel
  size_t partial_floats = 0;
  RowsGemvKernel kernel = RowsGemvKernel::Auto;
};
// Floats of partials the slice kernel needs for W at M rows (0: none, or the slice kernel does not run there).
size_t gemv_rows_partial_floats(const QMatrixDev& W, int M);
bool gemv_rows_supported(const GemvRowsArgs& a);
void gemv_rows(const GemvRowsArgs& a, cudaStream_t stream);

// ------------------------------------------------------------------------------------------------ MoE
// Decode MoE over M rows, in four launches:
//  (1) moe_route_rows: per row, exactly moe_gate_up's routing (softmax over E router logits, top-k by
//      probability with ties to the lower id, renormalised when asked; weight k = sigmoid(logit E)) into
//      sel_ids [M][k] / sel_w [M][k+1]; then the rows grouped by expert on the device (a counting sort, rows in
//      ascending order inside an expert) into chunks of at most moe_chunk_rows(bits, M) rows, in `scratch`.
//  (2) moe_gate_up_rows: act[r][j·I + i] = silu(gate_e · x̃_r) · (up_e · x̃_r) for the k experts of each row
//      (slot j) and the shared expert (slot k, at k·I), x̃ = the staged RMSNorm(x) (stage(), layout of the
//      expert bits); each chunk's expert weights are read once for all its rows.
//  (3) moe_down_rows: each row's product with each of its experts' down matrices (read once per chunk) into
//      `scratch`, unweighted: k + 1 floats per row and output, P_e = (a0 + a1) + (a2 + a3), a_σ = the sum, in
//      k-tile order from 0, of the group values of the expert's 64-groups 4j + σ (its own k-tiles j of 256);
//  (4) moe_combine_rows: y[r] += acc, acc = fmaf(w_e, P_e, acc) from 0 over the slots e = 0..k in order.
//  (3) and (4) are moe_down_tc's order for every M (moe_tc.cu), so a row gets its bits alone and in a batch.
// The four launch in this order, each right after the one before: moe_down_rows reads the routing's chunks (two
// launches back, complete when it starts: launch.cuh) before its wait, to request its first expert weights while
// gate/up's last blocks run.
// act: [M][k·I + Is]. Requirements: moe_rows_supported.
int moe_chunk_rows(int bits, int M);  // rows per chunk for M rows: 4-bit 2 (M <= 32) or 4, 8-bit 4
size_t moe_rows_scratch_bytes(const MoEDecodeWeights& w, int max_rows);
bool moe_rows_supported(const MoEDecodeWeights& w, int max_rows);
// chunk_rows > 0: chunks of at most that many rows (the digits kernels' 8) instead of moe_chunk_rows(bits, M).
void moe_route_rows(const MoEDecodeWeights& w, const float* logits, int64_t ld_logits, int M, const int32_t* row_slot,
                    int32_t* sel_ids, float* sel_w, void* scratch, cudaStream_t stream, int chunk_rows = 0);
// Whether moe_route_rows splits more than 32 rows over a cluster of two blocks on this device (sm_90+ with the routing
// kernel's code built for it; LILAC_MOE_ROUTE_CLUSTER=0: never).
bool moe_route_cluster_ok();
void moe_gate_up_rows(const MoEDecodeWeights& w, const void* frag, const float2* meta, int M, const void* scratch,
                      float* act, cudaStream_t stream);
void moe_down_rows(const MoEDecodeWeights& w, const float* act, int M, void* scratch, cudaStream_t stream);
void moe_combine_rows(const MoEDecodeWeights& w, const float* sel_w, int M, const int32_t* row_slot,
                      const void* scratch, float* y, int64_t ldy, cudaStream_t stream);
// moe_combine_rows, then stage(st) of the combined rows (st.x = y, its RMSNorm prologue: the next layer's input
// norm), in one launch: a block per row, the same bits as the two launches.
bool combine_stage_supported(const MoEDecodeWeights& w, const StageArgs& st);
void moe_combine_stage_rows(const MoEDecodeWeights& w, const float* sel_w, int M, const int32_t* row_slot,
                            const void* scratch, float* y, int64_t ldy, const StageArgs& st, cudaStream_t stream);

// ------------------------------------------------------------------------------------------------ sampling
// sample_token for M rows: row r samples from logits + r·ld_logits with the state of its slot s = row_slot[r]
// (row_slot null: s = r): params[s], counts + s·vocab, prompt_mask + s·vocab, and, when allowed != null and
// (allowed_on == null or allowed_on[s] != 0), the bitmask allowed + s·allowed_words(vocab) (bit i of word
// i/32 = 1: token i allowed), applied before penalties, params[s].bias and temperature (a disallowed token is never chosen;
// a row with no choice, its mask allowing no token or no allowed logit above -inf, gets kNoAllowedToken or
// kNoFiniteLogit: sampling.h). Logprobs are those of the raw distribution. The token goes to results[r] and, when token_by_slot != null, to token_by_slot[s]; counts
// and params[s].step advance as in sample_token. With no mask, each row's choice, logprob and top logprobs
// are bit for bit what sample_token computes for it (same seed and step → same RNG draw).
// results may be host-mapped memory (cudaHostAllocMapped).
int64_t allowed_words(int64_t vocab);
size_t sample_rows_scratch_bytes(int64_t vocab, int max_rows);
struct SampleRowsArgs {
  const float* logits = nullptr;
  int64_t ld_logits = 0;           // 0: vocab
  int64_t vocab = 0;
  int M = 0;
  const int32_t* row_slot = nullptr;
  SampleParamsDev* params = nullptr;
  int32_t* counts = nullptr;
  const uint8_t* prompt_mask = nullptr;
  const uint32_t* allowed = nullptr;
  const int32_t* allowed_on = nullptr;
  int32_t* token_by_slot = nullptr;
  int32_t* token_by_row = nullptr;  // optional: row r's token
  // The M rows are one sequence's next M choices (slot 0; row_slot, token_by_slot unused): row r samples at
  // its params' step + r, and nothing of the sequence's state is written (counts, step: the caller's, for
  // the rows it keeps). Only for a sequence without penalties: a row's choice must not depend on the rows
  // before it.
  bool one_sequence = false;
  SampleResult* results = nullptr;
  void* scratch = nullptr;         // sample_rows_scratch_bytes(vocab, M)
};
void sample_rows(const SampleRowsArgs& a, cudaStream_t stream);
// The single-sequence sample_token with an optional allowed-token bitmask (null: exactly sample_token).
// scratch: sample_rows_scratch_bytes(vocab, 1).
void sample_token_masked(const float* logits, int64_t vocab, SampleParamsDev* params, int32_t* counts,
                         const uint8_t* prompt_mask, const uint32_t* allowed, void* scratch, int32_t* token_slot,
                         SampleResult* result, cudaStream_t stream);

}  // namespace lilac::cuda::rows
