// The quantized GEMM family (prefill, a chunk of n tokens): dense GEMMs with dequantization fused into
// the tile loads (gemm.cu, core in gemm.cuh: mma.sync on sm_80+, wgmma on sm_90a) and the MoE block
// built on the grouped variant (moe_prefill.cu) or, for few tokens per expert, on the small-M expert
// GEMMs (moe_small.cu). Conventions: cuda/kernels/api.h.
#pragma once
#include "cuda/kernels/api.h"

namespace lilac::cuda {

// ------------------------------------------------------------------------------------------------
// Quantized GEMM: Y[n, W.rows] = X[n, W.cols] · Wᵀ, dequantization fused into the tile loads,
// bf16 tensor cores (mma.sync m16n8k16), fp32 accumulation.
// W: 4- or 8-bit affine, group_size 64, W.cols % 64 == 0. X bf16, ldx % 8 == 0 (16-byte rows),
// X 16-byte aligned. n and W.rows may be anything >= 1 (edges are masked).
enum class GemmOut {
  StoreF32,   // Y (float*)          = X Wᵀ
  AddF32,     // Y (float*)         += X Wᵀ   (e.g. residual add after o_proj / out_proj)
  StoreBF16,  // Y (__nv_bfloat16*)  = X Wᵀ
};
// Small grids (few tokens, few output rows) split K over more blocks, with fp32 partials in a scratch buffer.
// A caller that owns its memory (the prefill workspace, moe_prefill's) passes that scratch: qgemm_split_floats(W,
// n, mode) floats, enough for every chunk of at most n rows; qgemm then allocates nothing and may split under graph
// capture too. Without one, qgemm grows a buffer of its own per stream (tests, benchmarks) and does not split while
// the stream is captured. A given scratch smaller than the need is an error.
// On sm_90+ the blocks that share an output tile form a thread-block cluster and add their partials through
// distributed shared memory (the same sums in the same order, so the same bits): no scratch, no second launch, and
// qgemm_split_floats is 0. SplitKPath::Reduce (tests) or LILAC_SPLITK_CLUSTER=0 keeps the partial buffer and the
// reduce kernel there too.
struct SplitScratch {
  float* p = nullptr;
  size_t floats = 0;
};
size_t qgemm_split_floats(const QMatrixDev& W, int n, GemmOut mode);
enum class SplitKPath { Auto, Cluster, Reduce };
void set_splitk_cluster(SplitKPath path);
bool splitk_cluster_available();  // a Hopper device running this binary's sm_90a code
void qgemm(const QMatrixDev& W, const __nv_bfloat16* X, int64_t ldx, int n, void* Y, int64_t ldy, GemmOut mode,
           cudaStream_t stream, SplitScratch scratch = {});

// Which tensor-core path the quantized GEMMs (qgemm, qgemm_swiglu, MoE grouped GEMMs) take.
// Auto (the default): wgmma (sm_90a) when the device is Hopper and the binary holds sm_90a code,
// unless LILAC_QGEMM_WGMMA=0 or LILAC_CUDA_PORTABLE=1; else mma.sync (sm_80+). A forced Wgmma falls
// back to mma.sync where it is unavailable. set_gemm_path is for tests and benchmarks.
// Measured on an H200 at n = 4096 (4-bit dense shapes): wgmma ≈ 500 TFLOP/s with the register-operand kernel,
// ≈ 380 with the shared-memory weight tile, mma.sync ≈ 240 (bench/BENCHMARKS.md "Twentieth stop").
// On the wgmma path the plain 4-bit GEMMs of ≥ 512 rows take the register-operand kernel (gemm_rs.cuh; a forced
// Wgmma takes it for every shape it supports); WgmmaSmem (or LILAC_QGEMM_RS=0) keeps them on the kernel that
// dequantizes into a shared-memory tile.
enum class GemmPath { Auto, MmaSync, Wgmma, WgmmaSmem };
void set_gemm_path(GemmPath path);
// Hopper + sm_90a code present (probed once, outside graph capture) and LILAC_CUDA_PORTABLE != 1.
bool gemm_wgmma_available();

// SwiGLU pair: H[n, G.rows] = silu(X Gᵀ) ⊙ (X Uᵀ), bf16 out (the input of the down projection).
// G and U must have the same shape and bits. (Shared expert gate+up in one pass.)
void qgemm_swiglu(const QMatrixDev& G, const QMatrixDev& U, const __nv_bfloat16* X, int64_t ldx, int n,
                  __nv_bfloat16* H, int64_t ldh, cudaStream_t stream);

// ------------------------------------------------------------------------------------------------ MoE
// MoE block for a chunk of n tokens:
//   Y[t] (+)= Σ_{top-k e} w_e · down_e(silu(gate_e x) ⊙ up_e x) + sigmoid(seg·x) · shared(x)
// Steps (a fixed number of launches): router qgemm (8-bit) → per-token softmax/top-k/renormalise
// (ties to the lower id) with an expert histogram → exclusive scan + tile list → scatter of the
// (token, slot) pairs sorted by expert → ONE grouped gate+up+SwiGLU GEMM over all experts →
// ONE grouped down GEMM (scaled by the routing weight) (or the small-M pair of GEMMs, see below) →
// shared expert (qgemm_swiglu + qgemm) → deterministic combine (per token, slot order) into Y.
struct MoEPrefillWeights {
  QMatrixDev router;                   // [E, hidden]
  QExpertsDev gate, up, down;          // E × [inter, hidden], E × [hidden, inter]
  QMatrixDev shared_gate, shared_up;   // [shared_inter, hidden]
  QMatrixDev shared_down;              // [hidden, shared_inter]
  QMatrixDev shared_expert_gate;       // [1, hidden]
  int top_k = 8;
  bool renormalise = true;
};
// Bytes of device scratch moe_prefill needs for up to n tokens (256-byte aligned pieces).
size_t moe_prefill_workspace_bytes(const MoEPrefillWeights& w, int n);
// X bf16 [n, hidden] (row stride ldx); Y fp32 [n, hidden] (row stride ldy); accumulate: Y += (residual).
// workspace: moe_prefill_workspace_bytes(w, n) bytes, 256-byte aligned.
// If ids_out / weights_out are given ([n, top_k] int32 / fp32) the routing is copied there (tests).
void moe_prefill(const MoEPrefillWeights& w, const __nv_bfloat16* X, int64_t ldx, int n, float* Y, int64_t ldy,
                 bool accumulate, void* workspace, cudaStream_t stream, int32_t* ids_out = nullptr,
                 float* weights_out = nullptr);

// The expert part alone with a given routing (ids/weights [n, top_k]); shared expert included.
// Exposed for tests (the routing is a discrete choice that rounding can flip near ties).
void moe_prefill_routed(const MoEPrefillWeights& w, const __nv_bfloat16* X, int64_t ldx, int n,
                        const int32_t* ids, const float* weights, float* Y, int64_t ldy, bool accumulate,
                        void* workspace, cudaStream_t stream);

// ------------------------------------------------------------------------------------------------ MoE, small M
// The two expert GEMMs of moe_prefill have two paths with the same inputs and outputs:
//  * Grouped (gemm.cuh): 128-token tiles per expert, weights dequantized to bf16 tiles in shared memory
//    (wgmma on Hopper); for many tokens per expert.
//  * Small (moe_small.cu): weights as the mma's A operand, dequantized in registers to exact integers,
//    tokens as the 8-wide B operand in chunks of 16; each expert's weights read once per 16-token chunk;
//    group scale / bias applied in fp32 (no bf16 rounding of the weights). For few tokens per expert.
// The rule (Auto): Small when the average number of (token, slot) pairs per expert, n·top_k / E, is at
// most kMoeSmallMaxAvg (n <= 512 for 256 experts, top 8; measured on the H200: the small path wins at 16-512
// tokens and loses from 1024, bench/BENCHMARKS.md), the experts are 4- or 8-bit with group 64 and
// the staged chunk fits in shared memory. LILAC_MOE_SMALL=0 / 1 forces Grouped / Small (A/B runs);
// set_moe_path (tests, benchmarks) overrides both. (The grouped path needs 4-bit experts.)
constexpr int kMoeSmallMaxAvg = 16;
// The small path's kernel: Ring (4-bit experts with an even number of 64-groups: weights, scales and the token chunk
// streamed through a shared-memory ring) or Staged (the chunk's X and the CTA's scales staged whole, weights one
// unit ahead in registers; 8-bit experts, odd group counts). Auto: Ring where it applies, unless LILAC_MOE_RING=0.
// Both compute the same terms; tests and benchmarks force either.
enum class MoeSmallKernel { Auto, Ring, Staged };
void set_moe_small_kernel(MoeSmallKernel k);
enum class MoePath { Auto, Grouped, Small };
void set_moe_path(MoePath path);
bool moe_small_supported(const MoEPrefillWeights& w);
// Whether moe_prefill takes the small path for a chunk of n tokens.
bool moe_use_small(const MoEPrefillWeights& w, int n);

// The small-path kernels alone (also used by moe_prefill). Sorted rows [expert_start[e], expert_start[e+1])
// (device array, E + 1 entries, E = gate.n) belong to expert e; `rows` = expert_start[E] (known on the host:
// n·top_k) sets how many CTAs share an expert's 16-token chunks.
// gate/up: H[i, :inter] = bf16(silu(gate_e · x) ⊙ (up_e · x)), x = X[a_rows[i]] (a_rows null: X[i]).
void moe_small_gate_up(const QExpertsDev& gate, const QExpertsDev& up, const __nv_bfloat16* X, int64_t ldx,
                       const int32_t* a_rows, const int32_t* expert_start, int rows, __nv_bfloat16* H, int64_t ldh,
                       cudaStream_t stream);
// down: Y[i, :hidden] = row_scale[i] · (down_e · H[i]), fp32.
void moe_small_down(const QExpertsDev& down, const __nv_bfloat16* H, int64_t ldh, const int32_t* expert_start,
                    int rows, const float* row_scale, float* Y, int64_t ldy, cudaStream_t stream);

// Routing alone: logits fp32 [n, E] → ids [n, k], weights [n, k] (softmax, top-k by descending
// probability, ties to the lower id, renormalised when asked).
void moe_route_prefill(const float* logits, int n, int E, int k, bool renormalise, int32_t* ids, float* weights,
                       cudaStream_t stream);

}  // namespace lilac::cuda
