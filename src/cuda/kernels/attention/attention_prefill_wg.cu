// Causal GQA attention prefill for head_dim 256 on Hopper (sm_90a): wgmma for both products (attention.h:
// attention_prefill picks it; the mma.sync kernel of attention_prefill.cu stays the fallback and the reference).
//
// Why: the mma.sync kernel runs at ~185 TFLOP/s at 4096 tokens, ~240 at 16384 (its benchmark): each warp reads every
// K and V tile through ldmatrix for its 16 queries, ~16 FLOP per byte of shared memory. Here a warpgroup owns 64
// queries: S = Q·Kᵀ is m64n64k16 with both operands read by the tensor cores from shared memory (Q and K K-major),
// and O += P·V is m64n256k16 with P in registers (the S accumulators, rounded to bf16, are exactly the A fragments)
// and V read MN-major through the instruction's transpose bit — the K and V tiles have the same layout: [4 column
// blocks of 64][64 keys][128 bytes], 16-byte chunks swizzled by key % 8. 357 / 405 / 416 TFLOP/s at 4096 / 16384 /
// 32768 tokens (bench/BENCHMARKS.md and bench/GPU_NOTES.md, "Twenty-first stop").
//
// Block: 2 warpgroups × 64 queries of one head, one block per SM (192 KiB: Q 64, K 2 × 32, V 2 × 32); the key/value
// tiles of 64 keys double-buffered through cp.async by all 256 threads. Per key tile kt and warpgroup:
//   barrier A (K[kt], V[kt] landed) → copies of K[kt + 1] → S = Q·K[kt]ᵀ issued (behind the P·V of kt - 1, still
//   running) → wait for both → barrier B (V[kt - 1]'s buffer is free) → copies of V[kt + 1] → online softmax in fp32
//   (row maxima over the raw logits, p = 2^(s·scale − max·scale) by one fma and one exp2; O rescaled only when a row
//   maximum of the warp grew) → P·V issued (it runs while the next tile's barrier and copies are issued).
// One barrier per tile with V triple-buffered (225 KiB; the warpgroups free to drift apart within a tile) measured
// no faster. The grid is heads-fastest, so every head's heaviest query tile starts first.
// A warpgroup whose queries all precede a key tile skips its products (the diagonal's last tile for the first
// warpgroup); it still takes part in the barriers and copies.
#include <cmath>
#include <string>

#include "core/error.h"
#include "cuda/kernels/attention/attention.h"
#include "cuda/kernels/attention/attn_prefill.cuh"
#include "cuda/kernels/ptx.cuh"
#include "cuda/kernels/wgmma.cuh"

namespace lilac::cuda {
namespace {

using dev::cp_async16_zfill;
using dev::cp_async_commit;
using dev::cp_async_wait;
using dev::fence_proxy_async;
using dev::smem_u32;
using dev::wg_arrive;
using dev::wg_commit;
using dev::wg_desc;
using dev::wg_desc_mn;
using dev::wg_fence_acc;
using dev::wg_wait;
using dev::wgmma_m64n64k16;
using dev::wgmma_rs_m64n256k16;

constexpr int HD = 256;                 // head dim
constexpr int WQ = 64;                  // queries per warpgroup
constexpr int NWG = 2;                  // warpgroups per block
constexpr int BQ = WQ * NWG;            // queries per block
[[maybe_unused]] constexpr int BKV = 64;  // keys per tile (unused, as tile_off, without sm_90a code)
constexpr int THREADS = 128 * NWG;
constexpr int TILE = 64 * HD * 2;       // 32 KiB: 64 rows of 256 bf16
constexpr int COLBLK = 64 * 128;        // one 64-column block of a tile: 64 rows × 128 bytes
constexpr int SMEM = (NWG + 4) * TILE + 1024;  // Q per warpgroup, K[2], V[2]; 1024 to align the base

// Byte offset of 16-byte chunk ch (0..31: columns 8ch .. 8ch + 7) of row r (0..63) in a tile.
[[maybe_unused]] __device__ __forceinline__ uint32_t tile_off(int r, int ch) {
  return uint32_t((ch >> 3) * COLBLK + r * 128 + (((ch & 7) ^ (r & 7)) << 4));
}

__global__ void __launch_bounds__(THREADS, 1) attn_prefill_wg_kernel(const AttentionPrefillArgs a, float scale_log2) {
#if LILAC_WGMMA
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t sQ = (smem_u32(smem_raw) + 1023u) & ~1023u, sK = sQ + NWG * TILE, sV = sK + 2 * TILE;
  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  const int g = lane >> 2, c2 = (lane & 3) * 2;
  const int n_qt = (a.n_new + BQ - 1) / BQ;
  // blocks start in the order of blockIdx.x + gridDim.x · blockIdx.y: every head's heaviest query tile first (the
  // longest blocks first, and the blocks running together share their kv heads' K / V in L2)
  const int q0 = (n_qt - 1 - int(blockIdx.y)) * BQ;
  const int h = blockIdx.x;
  const int kvh = h / (a.heads / a.kv_heads);
  const int64_t n_ctx = a.start_pos + a.n_new;
  const int nkt = int((a.start_pos + min(q0 + BQ - 1, a.n_new - 1)) / BKV) + 1;
  // this warpgroup's queries: chunk rows wq0 .. wq0 + 63 at positions wg_first .. (valid rows up to) wg_last
  const int wq0 = q0 + WQ * wg;
  const bool wg_live = wq0 < a.n_new;
  const int64_t wg_first = a.start_pos + wq0;
  const int64_t wg_last = a.start_pos + min(wq0 + WQ - 1, a.n_new - 1);

  for (int c = tid; c < BQ * 32; c += THREADS) {
    const int r = c >> 5, ch = c & 31;
    const bool ok = q0 + r < a.n_new;
    const __nv_bfloat16* src = a.q + (ok ? int64_t(q0 + r) * a.q_stride + int64_t(h) * a.q_head_stride : 0) + ch * 8;
    cp_async16_zfill(sQ + (r / WQ) * TILE + tile_off(r % WQ, ch), src, ok ? 16 : 0);
  }
  auto load_rows = [&](uint32_t dst, const __nv_bfloat16* cache, int kt) {
    for (int c = tid; c < BKV * 32; c += THREADS) {
      const int r = c >> 5, ch = c & 31;
      const int64_t pos = int64_t(kt) * BKV + r;
      const bool ok = pos < n_ctx;
      const __nv_bfloat16* src = cache + (ok ? pos * a.kv_stride + int64_t(kvh) * HD : 0) + ch * 8;
      cp_async16_zfill(dst + tile_off(r, ch), src, ok ? 16 : 0);
    }
  };
  load_rows(sK, a.k_cache, 0);
  load_rows(sV, a.v_cache, 0);
  cp_async_commit();

  float o[HD / 2];  // o[4j + e]: row 16·warp + g + 8·(e / 2), column 8j + c2 + e % 2
#pragma unroll
  for (int i = 0; i < HD / 2; ++i) o[i] = 0.f;
  uint32_t pf[16];  // P as the A fragments of 4 k16 steps (keys 16kk .. 16kk + 15)
#pragma unroll
  for (int i = 0; i < 16; ++i) pf[i] = 0u;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  const int64_t qp0 = wg_first + warp * 16 + g, qp1 = qp0 + 8;
  const uint32_t q_tile = sQ + wg * TILE;

  for (int kt = 0; kt < nkt; ++kt) {
    const int buf = kt & 1;
    const uint32_t k_tile = sK + buf * TILE, v_tile = sV + buf * TILE;
    cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();  // A: K[kt], V[kt] visible to the tensor cores; both warpgroups done with S of kt - 1
    if (kt + 1 < nkt) load_rows(sK + (buf ^ 1) * TILE, a.k_cache, kt + 1);
    cp_async_commit();
    const int64_t kbase = int64_t(kt) * BKV;
    const bool work = wg_live && kbase <= wg_last;
    float s[32];  // s[4j + e]: row as o, key kbase + 8j + c2 + e % 2; the first k step overwrites it
    if (work) {
      wg_arrive();
#pragma unroll
      for (int ks = 0; ks < HD / 16; ++ks) {
        const uint32_t off = (ks >> 2) * COLBLK + (ks & 3) * 32;
        wgmma_m64n64k16(s, wg_desc(q_tile + off), wg_desc(k_tile + off), ks > 0);
      }
      wg_commit();
    }
    // S and the P·V of kt - 1 done (waiting for the latter alone, wait_group 1, makes ptxas serialize every wgmma:
    // it cannot tell which group the wait retires)
    wg_wait<0>();
    wg_fence_acc<32>(s);
    __syncthreads();  // B: both warpgroups' P·V of kt - 1 done: V[buf ^ 1] may be overwritten
    if (kt + 1 < nkt) load_rows(sV + (buf ^ 1) * TILE, a.v_cache, kt + 1);
    cp_async_commit();
    if (!work) continue;

    // scale, causal mask, online softmax (rows g and g + 8 of this warp; a row's 64 keys over the quad)
    // The row maxima are taken over the raw logits (the scale is positive), and p = 2^(s·scale − max·scale) is one
    // fma and one exp2 per logit. O is rescaled only when a row's maximum grew (alpha ≠ 1 somewhere in the warp:
    // past the first tiles a row's maximum rarely moves, and multiplying by 1 changes nothing).
    if (kbase + BKV - 1 > wg_first) {  // causal mask on the diagonal tiles
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (kbase + j * 8 + c2 + (e & 1) > (e < 2 ? qp0 : qp1)) s[4 * j + e] = -INFINITY;
    }
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      mx0 = fmaxf(mx0, fmaxf(s[4 * j + 0], s[4 * j + 1]));
      mx1 = fmaxf(mx1, fmaxf(s[4 * j + 2], s[4 * j + 3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    mx0 = fmaxf(m0, mx0 * scale_log2);
    mx1 = fmaxf(m1, mx1 * scale_log2);
    // rows past the chunk end may see only masked keys: keep them finite
    const float base0 = mx0 == -INFINITY ? 0.f : mx0, base1 = mx1 == -INFINITY ? 0.f : mx1;
    const float alpha0 = exp2f(m0 - base0), alpha1 = exp2f(m1 - base1);
    m0 = mx0;
    m1 = mx1;
    float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float p0 = exp2f(fmaf(s[4 * j + 0], scale_log2, -base0));
      const float p1 = exp2f(fmaf(s[4 * j + 1], scale_log2, -base0));
      const float p2 = exp2f(fmaf(s[4 * j + 2], scale_log2, -base1));
      const float p3 = exp2f(fmaf(s[4 * j + 3], scale_log2, -base1));
      rs0 += p0 + p1;
      rs1 += p2 + p3;
      // A fragment of k step j / 2: a0 (row g, keys 2c..), a1 (row g + 8), a2 / a3 the same 8 keys further
      pf[4 * (j >> 1) + 2 * (j & 1) + 0] = attn::pack_bf16(p0, p1);
      pf[4 * (j >> 1) + 2 * (j & 1) + 1] = attn::pack_bf16(p2, p3);
    }
    l0 = l0 * alpha0 + rs0;
    l1 = l1 * alpha1 + rs1;
    if (__any_sync(0xffffffffu, alpha0 != 1.f || alpha1 != 1.f)) {
#pragma unroll
      for (int j = 0; j < HD / 8; ++j) {
        o[4 * j + 0] *= alpha0;
        o[4 * j + 1] *= alpha0;
        o[4 * j + 2] *= alpha1;
        o[4 * j + 3] *= alpha1;
      }
    }
    wg_fence_acc<HD / 2>(o);
    wg_arrive();
#pragma unroll
    for (int kk = 0; kk < BKV / 16; ++kk)
      wgmma_rs_m64n256k16<1>(o, pf + 4 * kk, wg_desc_mn(v_tile + kk * 16 * 128, COLBLK));
    wg_commit();
  }
  wg_wait<0>();
  wg_fence_acc<HD / 2>(o);
  cp_async_wait<0>();

  attn::store_rows<HD>(a, o, l0, l1, wq0 + warp * 16, h, g, c2);
#endif
}

}  // namespace

void attention_prefill_wgmma(const AttentionPrefillArgs& a, float scale_log2, cudaStream_t stream) {
  static bool attr_set = false;
  if (!attr_set) {
    cudaError_t e = cudaFuncSetAttribute(attn_prefill_wg_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
    if (e != cudaSuccess) throw Error(std::string("attention_prefill: cudaFuncSetAttribute: ") + cudaGetErrorString(e));
    attr_set = true;
  }
  dim3 grid(a.heads, (a.n_new + BQ - 1) / BQ);
  attn_prefill_wg_kernel<<<grid, THREADS, SMEM, stream>>>(a, scale_log2);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw Error(std::string("attention_prefill: launch failed: ") + cudaGetErrorString(e));
}

int attention_prefill_wgmma_blocks(int n_new, int heads) { return (n_new + BQ - 1) / BQ * heads; }

}  // namespace lilac::cuda
