// Quantized GEMM core shared by qgemm (gemm.cu) and the MoE grouped GEMMs (moe_prefill.cu).
//
// Y[m, n] = Σ_k X[m, k] · W[n, k]: A = activations (bf16, row-major, k contiguous), B = a
// quantized matrix in the MLX layout (rows = outputs, k contiguous, 4- or 8-bit, groups of 64).
// Block tile 128 (tokens) × 128 (weight rows) × 64 (k = one quantization group), 8 warps (2 × 4),
// warp tile 64 × 32, mma.sync m16n8k16 bf16 → fp32.
// Pipeline: cp.async of A tiles and of the raw packed weight words, STAGES deep; the raw words of
// tile kt+1 are dequantized (smem → smem, bf16, one rounding of s·q + b) while tile kt is multiplied,
// into a double-buffered bf16 B tile; ldmatrix from XOR-swizzled tiles (conflict-free). One barrier
// per k tile.
#pragma once
#include <cstdint>
#include <type_traits>
#include <cuda_bf16.h>

#include "cuda/kernels/ptx.cuh"
#include "cuda/kernels/qmatrix.cuh"
#include "cuda/kernels/wgmma.cuh"

namespace lilac::cuda::gemm {

constexpr int BM = 128, BN = 128, BK = 64, THREADS = 256;
// Pipeline depth: 4 stages (112 KiB of shared memory, 2 blocks per SM on sm_80 / sm_90); the GPUs
// with ~100 KiB per block (sm_86, sm_87, sm_89) get 3 (92 KiB). The host side picks the matching
// allocation with stages_for(cc) (gemm.cu).
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 860 || __CUDA_ARCH__ == 870 || __CUDA_ARCH__ == 890)
constexpr int STAGES = 3;
#else
constexpr int STAGES = 4;
#endif
constexpr int stages_for(int cc_major, int cc_minor) {
  return cc_major == 8 && (cc_minor == 6 || cc_minor == 7 || cc_minor == 9) ? 3 : 4;
}

enum Epi : int {
  EPI_STORE_F32 = 0,
  EPI_ADD_F32 = 1,
  EPI_STORE_BF16 = 2,
  EPI_SWIGLU_BF16 = 3,  // tile rows [0,64) from W0 (gate), [64,128) from W1 (up); out = silu(g)·u
  EPI_SCALED_F32 = 4,   // Y[row] = row_scale[row] · acc
};

struct Params {
  const __nv_bfloat16* X = nullptr;
  int64_t ldx = 0;
  const int32_t* a_rows = nullptr;  // grouped: X row of sorted row i (else identity)
  int M = 0;                        // plain: rows of X / Y
  QMatrixDev W0, W1;                // W1: up matrix in SwiGLU mode
  int N = 0;                        // output columns (W rows)
  void* Y = nullptr;
  int64_t ldy = 0;
  const float* row_scale = nullptr;  // EPI_SCALED_F32, indexed by output row
  // Grouped (MoE): expert e owns sorted rows [expert_start[e], expert_start[e+1]) and m-tiles
  // [tile_start[e], tile_start[e+1]); matrices are experts(e) of W0s / W1s.
  const int32_t* expert_start = nullptr;
  const int32_t* tile_start = nullptr;
  int E = 0;
  QExpertsDev W0s, W1s;
  // Split-K (plain GEMMs, the SPLIT kernel instance, fp32 partials): blockIdx.z of k_split takes k tiles
  // [KT·z / k_split, KT·(z+1) / k_split) and stores its fp32 partial tile to partial + z·M·N (ld N);
  // splitk_reduce (gemm.cu) adds the partials in order and applies the store / add. With split_cluster (sm_90) the
  // k_split blocks of a tile are one thread-block cluster and add the partials themselves (split_cluster_store):
  // no partial buffer, no second launch; split_add: Y += the sum instead of Y = the sum.
  int k_split = 1;
  float* partial = nullptr;
  bool split_cluster = false, split_add = false;
};

// The PTX wrappers (ptx.cuh).
using dev::cp_async16_zfill;
using dev::cp_async_commit;
using dev::cp_async_wait;
using dev::ldmatrix_x4;
using dev::ldmatrix_x4_trans;
using dev::mma_m16n8k16_bf16;
using dev::smem_u32;

// Byte offset of element (r, k) in a [rows][64] bf16 tile with 16-byte chunks XOR-swizzled by r % 8.
__device__ __forceinline__ uint32_t swz(int r, int k) {
  return uint32_t(r * 128 + ((((k >> 3) ^ r) & 7) << 4) + ((k & 7) << 1));
}

__device__ __forceinline__ uint32_t bf2_as_u32(__nv_bfloat162 v) { return *reinterpret_cast<uint32_t*>(&v); }
__device__ __forceinline__ __nv_bfloat162 u32_as_bf2(uint32_t v) { return *reinterpret_cast<__nv_bfloat162*>(&v); }

// 8 packed 4-bit values (element j at bits 4j) → 8 bf16 = round(s·q + b), in element order.
__device__ __forceinline__ uint4 dequant8_q4(uint32_t w, __nv_bfloat162 s2, __nv_bfloat162 b2) {
  const __nv_bfloat162 k128 = __floats2bfloat162_rn(128.f, 128.f);
  uint32_t p[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    // (e_i, e_{i+4}) as bf16 (128 + q): 0x4300 = 128.0, mantissa step 1 at exponent 7.
    uint32_t v = ((w >> (4 * i)) & 0x000F000Fu) | 0x43004300u;
    __nv_bfloat162 q = __hsub2(u32_as_bf2(v), k128);  // exact
    p[i] = bf2_as_u32(__hfma2(q, s2, b2));           // one rounding of s·q + b
  }
  // p[i] = (e_i lo, e_{i+4} hi) → (e0,e1), (e2,e3), (e4,e5), (e6,e7)
  uint4 o;
  o.x = __byte_perm(p[0], p[1], 0x5410);
  o.y = __byte_perm(p[2], p[3], 0x5410);
  o.z = __byte_perm(p[0], p[1], 0x7632);
  o.w = __byte_perm(p[2], p[3], 0x7632);
  return o;
}

// 4 packed 8-bit values → 4 bf16 (fp32 math, then one rounding).
__device__ __forceinline__ uint2 dequant4_q8(uint32_t w, float s, float b) {
  float f0 = fmaf(s, float(w & 0xff), b), f1 = fmaf(s, float((w >> 8) & 0xff), b);
  float f2 = fmaf(s, float((w >> 16) & 0xff), b), f3 = fmaf(s, float(w >> 24), b);
  uint2 o;
  o.x = bf2_as_u32(__floats2bfloat162_rn(f0, f1));
  o.y = bf2_as_u32(__floats2bfloat162_rn(f2, f3));
  return o;
}

template <int BITS>
struct Smem {
  static constexpr int A_BYTES = BM * BK * 2;                    // 16 KiB
  static constexpr int WRAW_BYTES = BN * BK * BITS / 8;          // 4 / 8 KiB
  static constexpr int STAGE_BYTES = A_BYTES + WRAW_BYTES;
  static constexpr int B_BYTES = BN * BK * 2;                    // 16 KiB, ×2
  static constexpr int TOTAL = STAGES * STAGE_BYTES + 2 * B_BYTES;
  static constexpr int ALLOC = TOTAL + 1024;  // room to align the base to 1024 bytes
  static constexpr int total(int stages) { return stages * STAGE_BYTES + 2 * B_BYTES; }
  static constexpr int EPI_LD = BN + 4;                          // fp32 staging row (SwiGLU)
  static_assert(BM * EPI_LD * 4 <= 3 * STAGE_BYTES + 2 * B_BYTES, "epilogue staging must fit");
};

// The wgmma wrappers (wgmma.cuh), used unqualified by the GEMM kernels.
using dev::fence_proxy_async;
using dev::wg_arrive;
using dev::wg_commit;
using dev::wg_desc;
using dev::wg_fence_acc;
using dev::wg_hold;
using dev::wg_wait;
using dev::wgmma_m64n128k16;
using dev::wgmma_rs_m64n256k16;

// 1 when this code was compiled for sm_90a (wgmma available), else 0.
__global__ void probe_wgmma_kernel(int* out);

// The rows of X and the matrices one block works on: its tile's first sorted row, how many of the tile's BM rows
// are valid and the matrices (grouped: expert e of W0s / W1s, found from tile_start by binary search). False when a
// grouped block has no tile (the grid is an upper bound).
struct Block {
  int row_base = 0, rows_valid = 0;
  QMatrixDev W0, W1;
};
template <bool GROUPED, bool SWIGLU>
__device__ __forceinline__ bool block_rows(const Params& p, Block& b) {
  b.W0 = p.W0;
  b.W1 = p.W1;
  if constexpr (GROUPED) {
    const int t = blockIdx.y;
    if (t >= p.tile_start[p.E]) return false;
    int lo = 0, hi = p.E - 1;  // largest e with tile_start[e] <= t
    while (lo < hi) {
      int mid = (lo + hi + 1) >> 1;
      if (p.tile_start[mid] <= t) lo = mid; else hi = mid - 1;
    }
    const int e = lo;
    b.row_base = p.expert_start[e] + (t - p.tile_start[e]) * BM;
    b.rows_valid = min(BM, p.expert_start[e + 1] - b.row_base);
    b.W0 = p.W0s.expert(e);
    if constexpr (SWIGLU) b.W1 = p.W1s.expert(e);
  } else {
    b.row_base = blockIdx.y * BM;
    b.rows_valid = min(BM, p.M - b.row_base);
  }
  return true;
}

// The TM × BK tile of X rows a block streams (bf16, swizzled as swz): thread tid copies TM / 32 chunks of 16 bytes
// per k tile (rows tid / 8 + 32·i, chunk tid % 8), rows past rows_valid as zeros. The sources are kept as pointers:
// rebuilding 64-bit addresses from 32-bit row indices cost the register-operand kernel ~60 instructions per k tile.
template <int TM = BM>
struct XRows {
  static constexpr int NC = TM * (BK / 8) / THREADS;
  const __nv_bfloat16* src[NC];  // this thread's chunk of k tile 0 (null: a row past rows_valid)
  __device__ __forceinline__ XRows(const Params& p, int row_base, int rows_valid, int kt0, int tid) {
#pragma unroll
    for (int i = 0; i < NC; ++i) {
      const int r = (tid >> 3) + 32 * i;
      const int64_t x = r < rows_valid ? (p.a_rows ? p.a_rows[row_base + r] : row_base + r) : -1;
      src[i] = x < 0 ? nullptr : p.X + x * p.ldx + (tid & 7) * 8 + int64_t(kt0) * BK;
    }
  }
  __device__ __forceinline__ void load(const Params& p, uint32_t dst, int kt, int tid) const {
#pragma unroll
    for (int i = 0; i < NC; ++i) {
      const int r = (tid >> 3) + 32 * i;
      cp_async16_zfill(dst + swz(r, (tid & 7) * 8), src[i] ? src[i] + int64_t(kt) * BK : p.X, src[i] ? 16 : 0);
    }
  }
};

// The SwiGLU epilogue from an fp32 tile st[TM][EPI_LD] in shared memory whose columns [0, BN/2) are the gate and
// [BN/2, BN) the up projection of output columns n0 ...: Y = silu(gate)·up in bf16, row by row.
template <int EPI_LD, int TM = BM>
__device__ __forceinline__ void swiglu_store(const Params& p, const float* st, int row_base, int rows_valid, int n0,
                                             int tid) {
  constexpr int BN_OUT = BN / 2;
  __nv_bfloat16* Y = static_cast<__nv_bfloat16*>(p.Y);
  for (int idx = tid; idx < TM * (BN_OUT / 2); idx += THREADS) {
    int r = idx / (BN_OUT / 2), c = (idx % (BN_OUT / 2)) * 2;
    if (r >= rows_valid) continue;
    float g0 = st[r * EPI_LD + c], g1 = st[r * EPI_LD + c + 1];
    float u0 = st[r * EPI_LD + BN_OUT + c], u1 = st[r * EPI_LD + BN_OUT + c + 1];
    float h0 = g0 / (1.f + __expf(-g0)) * u0, h1 = g1 / (1.f + __expf(-g1)) * u1;
    int col = n0 + c;
    __nv_bfloat16* yp = Y + int64_t(row_base + r) * p.ldy + col;
    if (col + 1 < p.N && ((p.ldy & 1) == 0) && (reinterpret_cast<uintptr_t>(Y) & 3) == 0) {
      *reinterpret_cast<__nv_bfloat162*>(yp) = __floats2bfloat162_rn(h0, h1);
    } else {
      if (col < p.N) yp[0] = __float2bfloat16_rn(h0);
      if (col + 1 < p.N) yp[1] = __float2bfloat16_rn(h1);
    }
  }
}

// The plain epilogue of qgemm_kernel: each thread's accumulator pairs (fragment f, rows frag_row(f) and + 8, columns
// frag_col(f) and + 1) to Y — stored, added (EPI_ADD_F32), scaled by the row's scale (EPI_SCALED_F32) or rounded to
// bf16 —, or with SPLIT to this block's fp32 partial tile.
template <int EPI, bool WG, bool SPLIT, typename FragRow, typename FragCol>
__device__ __forceinline__ void store_frags(const Params& p, const float (&acc)[16][4], FragRow frag_row, FragCol frag_col,
                                            int row_base, int rows_valid, int n0) {
  // split-K: this block's fp32 partial tile, stored (not added)
  void* const Yo = SPLIT ? static_cast<void*>(p.partial + int64_t(blockIdx.z) * p.M * p.N) : p.Y;
  const int64_t ldo = SPLIT ? p.N : p.ldy;
  constexpr bool add = EPI == EPI_ADD_F32 && !SPLIT;
  // pairs of columns are stored as one 8-byte (fp32) / 4-byte (bf16) access when aligned
  const bool vec = (ldo & 1) == 0 && (reinterpret_cast<uintptr_t>(Yo) & (EPI == EPI_STORE_BF16 ? 3 : 7)) == 0;
  // the row scales of this thread's rows (2 with wgmma, 8 with mma.sync), loaded before the first store: loads
  // after stores that may alias them would wait for each other in turn
  constexpr int MT = WG ? 1 : 4;
  float rsc[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = frag_row(4 * mt) + half * 8;
      rsc[mt][half] = EPI == EPI_SCALED_F32 && r < rows_valid ? p.row_scale[row_base + r] : 1.f;
    }
#pragma unroll
  for (int f = 0; f < 16; ++f)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      int r = frag_row(f) + half * 8;
      if (r >= rows_valid) continue;
      int64_t yrow = row_base + r;
      const float rs = rsc[WG ? 0 : f >> 2][half];
      int col = n0 + frag_col(f);
      float v0 = acc[f][half * 2] * rs, v1 = acc[f][half * 2 + 1] * rs;
      if constexpr (EPI == EPI_STORE_BF16) {
        __nv_bfloat16* yp = static_cast<__nv_bfloat16*>(Yo) + yrow * ldo + col;
        if (vec && col + 1 < p.N) {
          *reinterpret_cast<__nv_bfloat162*>(yp) = __floats2bfloat162_rn(v0, v1);
        } else {
          if (col < p.N) yp[0] = __float2bfloat16_rn(v0);
          if (col + 1 < p.N) yp[1] = __float2bfloat16_rn(v1);
        }
      } else {
        float* yp = static_cast<float*>(Yo) + yrow * ldo + col;
        if (vec && col + 1 < p.N) {
          float2 o = make_float2(v0, v1);
          if (add) {
            float2 old = *reinterpret_cast<float2*>(yp);
            o.x += old.x;
            o.y += old.y;
          }
          *reinterpret_cast<float2*>(yp) = o;
        } else {
          if (col < p.N) yp[0] = (add ? yp[0] : 0.f) + v0;
          if (col + 1 < p.N) yp[1] = (add ? yp[1] : 0.f) + v1;
        }
      }
    }
}

// The accumulator fragments of a qgemm_kernel block as an fp32 tile st[BM][EPI_LD] in shared memory (after a
// barrier: the pipeline's buffers are reused).
template <int EPI_LD, typename FragRow, typename FragCol>
__device__ __forceinline__ void stage_acc(float* st, const float (&acc)[16][4], FragRow frag_row, FragCol frag_col) {
  __syncthreads();
#pragma unroll
  for (int f = 0; f < 16; ++f) {
    const int r = frag_row(f), c = frag_col(f);
    *reinterpret_cast<float2*>(st + r * EPI_LD + c) = make_float2(acc[f][0], acc[f][1]);
    *reinterpret_cast<float2*>(st + (r + 8) * EPI_LD + c) = make_float2(acc[f][2], acc[f][3]);
  }
}

// Split-K inside a thread-block cluster (sm_90; Params::split_cluster): the k_split blocks of an output tile are one
// cluster along z, block z the cluster's rank z. Each stages its fp32 partial tile in its own shared memory; after a
// cluster barrier, block z takes rows [z·BM/S, (z+1)·BM/S) of the tile and adds the S partials in rank order, read
// through distributed shared memory (v = 0, v += partial 0, …, partial S − 1), then stores v or adds it to Y: the sums
// of splitk_reduce_kernel (gemm.cu) in its order, so the same bits, without the partials' round trip through global
// memory or a second launch. The second barrier keeps every block's tile alive until its peers have read it.
template <int EPI_LD>
__device__ __forceinline__ void split_cluster_store(const Params& p, const float* st, int row_base, int rows_valid,
                                                    int n0, int tid) {
  dev::cluster_sync();
  const int S = p.k_split, z = int(blockIdx.z);
  const int r0 = BM * z / S, r1 = BM * (z + 1) / S;
  const uint32_t st_u32 = dev::smem_u32(st);
  float* const Y = static_cast<float*>(p.Y);
  const bool vec = (p.ldy & 3) == 0 && (reinterpret_cast<uintptr_t>(Y) & 15) == 0;
  constexpr int C4 = BN / 4;  // float4 columns of a tile row
  for (int idx = r0 * C4 + tid; idx < min(r1, rows_valid) * C4; idx += THREADS) {
    const int r = idx / C4, c = (idx % C4) * 4, col = n0 + c;
    if (col >= p.N) continue;
    const uint32_t off = st_u32 + uint32_t((r * EPI_LD + c) * 4);
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int q = 0; q < S; ++q) {
      const float4 t = dev::ld_cluster_f4(dev::cluster_map(off, uint32_t(q)));
      v.x += t.x;
      v.y += t.y;
      v.z += t.z;
      v.w += t.w;
    }
    float* yp = Y + int64_t(row_base + r) * p.ldy + col;
    if (vec && col + 3 < p.N) {
      float4 o = v;
      if (p.split_add) {
        const float4 y = *reinterpret_cast<const float4*>(yp);
        o = make_float4(y.x + v.x, y.y + v.y, y.z + v.z, y.w + v.w);
      }
      *reinterpret_cast<float4*>(yp) = o;
    } else {
      const float vv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (col + j < p.N) yp[j] = p.split_add ? yp[j] + vv[j] : vv[j];
    }
  }
  dev::cluster_sync();
}

// The weight side of a qgemm_kernel block: thread tid copies and dequantizes half (wh = tid % 2) of tile row
// wr = tid / 2, a row of W0 or, with SwiGLU, of W1 for the tile's second half; rows past N copy zeros. The raw words
// of a k tile go to the stage by cp.async (copy), the row's scale and bias of a tile are loaded a tile ahead
// (load_sb), and dequant writes the tile's bf16 rows (s·q + b, one rounding) swizzled into a B buffer.
template <int BITS, bool SWIGLU>
struct WTile {
  static constexpr int WORDS_PER_TILE_ROW = BK * BITS / 32;  // 8 or 16
  int wr, wh;
  bool ok;
  const uint32_t* w_src;
  const __nv_bfloat16 *s_src, *b_src;
  float sc = 0.f, bi = 0.f;  // scale / bias of the tile being dequantized next
  __device__ __forceinline__ WTile(const Params& p, const QMatrixDev& W0, const QMatrixDev& W1, int n0, int kt0,
                                   int tid) {
    wr = tid >> 1;
    wh = tid & 1;
    const bool second = SWIGLU && wr >= BN / 2;  // (fields picked one by one: a reference to either matrix would
                                                  // put both on the stack)
    const int wrow = n0 + (SWIGLU ? (wr & (BN / 2 - 1)) : wr);
    ok = wrow < p.N;
    const int64_t wpr = W0.words_per_row(), gpr = W0.groups_per_row();
    w_src = (second ? W1.qweight : W0.qweight) + (ok ? int64_t(wrow) * wpr : 0) + int64_t(kt0) * WORDS_PER_TILE_ROW;
    s_src = (second ? W1.scales : W0.scales) + (ok ? int64_t(wrow) * gpr : 0) + kt0;
    b_src = (second ? W1.biases : W0.biases) + (ok ? int64_t(wrow) * gpr : 0) + kt0;
  }
  // raw words of k tile kt into a stage's W part: row wr, 16-byte chunks (BITS/2 chunks per row, this thread half)
  __device__ __forceinline__ void copy(uint32_t stage_w, int kt) const {
#pragma unroll
    for (int j = 0; j < BITS / 4; ++j) {
      const int chunk = wh * (BITS / 4) + j;
      cp_async16_zfill(stage_w + wr * (WORDS_PER_TILE_ROW * 4) + chunk * 16,
                       w_src + int64_t(kt) * WORDS_PER_TILE_ROW + chunk * 4, ok ? 16 : 0);
    }
  }
  __device__ __forceinline__ void load_sb(int kt, int KT) {
    if (kt < KT && ok) {
      sc = __bfloat162float(s_src[kt]);
      bi = __bfloat162float(b_src[kt]);
    }
  }
  // raw_w: the stage's W part (generic pointer); dst: the B buffer (shared address)
  __device__ __forceinline__ void dequant(const unsigned char* raw_w, uint32_t dst) const {
    const unsigned char* raw = raw_w + wr * (WORDS_PER_TILE_ROW * 4);
    if constexpr (BITS == 4) {
      uint4 w = *reinterpret_cast<const uint4*>(raw + wh * 16);
      __nv_bfloat162 s2 = __floats2bfloat162_rn(sc, sc), b2 = __floats2bfloat162_rn(bi, bi);
      uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint4 o = dequant8_q4(ws[j], s2, b2);
        uint32_t addr = dst + swz(wr, (wh * 4 + j) * 8);
        asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "r"(o.x), "r"(o.y), "r"(o.z), "r"(o.w));
      }
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint4 w = *reinterpret_cast<const uint4*>(raw + wh * 32 + h * 16);
        uint2 o0 = dequant4_q8(w.x, sc, bi), o1 = dequant4_q8(w.y, sc, bi);
        uint2 o2 = dequant4_q8(w.z, sc, bi), o3 = dequant4_q8(w.w, sc, bi);
        uint32_t addr0 = dst + swz(wr, (wh * 4 + h * 2) * 8);
        uint32_t addr1 = dst + swz(wr, (wh * 4 + h * 2 + 1) * 8);
        asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};\n" ::"r"(addr0), "r"(o0.x), "r"(o0.y), "r"(o1.x), "r"(o1.y));
        asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};\n" ::"r"(addr1), "r"(o2.x), "r"(o2.y), "r"(o3.x), "r"(o3.y));
      }
    }
  }
};

// One k tile's products on mma.sync: the warp's 64 × 32 part of the tile (rows warp_m·64.., columns warp_n·32..)
// from the swizzled A (As) and B (Bs) tiles by ldmatrix, into acc[mi·4 + ni].
__device__ __forceinline__ void mma_sync_tile(float (&acc)[16][4], uint32_t As, uint32_t Bs, int warp_m, int warp_n,
                                              int lane) {
  const int a_r = lane & 15, a_k = (lane >> 4) * 8;                               // A: rows 0-15, k 0/8
  const int b_n = (lane & 7) + ((lane >> 4) << 3), b_k = ((lane >> 3) & 1) * 8;  // B: n 0-15, k 0/8
#pragma unroll
  for (int ks = 0; ks < BK / 16; ++ks) {
    uint32_t af[4][4], bfr[4][2];
#pragma unroll
    for (int mi = 0; mi < 4; ++mi)
      ldmatrix_x4(As + swz(warp_m * 64 + mi * 16 + a_r, ks * 16 + a_k), af[mi][0], af[mi][1], af[mi][2], af[mi][3]);
#pragma unroll
    for (int nj = 0; nj < 2; ++nj)
      ldmatrix_x4(Bs + swz(warp_n * 32 + nj * 16 + b_n, ks * 16 + b_k), bfr[2 * nj][0], bfr[2 * nj][1],
                  bfr[2 * nj + 1][0], bfr[2 * nj + 1][1]);
#pragma unroll
    for (int mi = 0; mi < 4; ++mi)
#pragma unroll
      for (int ni = 0; ni < 4; ++ni) mma_m16n8k16_bf16(acc[mi * 4 + ni], af[mi], bfr[ni][0], bfr[ni][1]);
  }
}

template <int BITS, bool GROUPED, int EPI, bool WG, bool SPLIT = false>
__global__ void __launch_bounds__(THREADS, 2) qgemm_kernel(const Params p) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // 1024-byte aligned base (the 128-byte swizzle pattern repeats every 1024 bytes)
  // (wgmma only: the mma.sync kernel keeps the plain base and its smaller allocation)
  const uint32_t raw_u32 = smem_u32(smem_raw);
  unsigned char* smem = WG ? smem_raw + (((raw_u32 + 1023u) & ~1023u) - raw_u32) : smem_raw;
  using S = Smem<BITS>;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp >> 2, warp_n = warp & 3;
  constexpr bool SWIGLU = EPI == EPI_SWIGLU_BF16;
  constexpr int BN_OUT = SWIGLU ? BN / 2 : BN;

  // ---- which rows / matrices this block works on
  Block blk;
  if (!block_rows<GROUPED, SWIGLU>(p, blk)) return;
  const int row_base = blk.row_base, rows_valid = blk.rows_valid;
  const QMatrixDev W0 = blk.W0, W1 = blk.W1;
  const int n0 = blockIdx.x * BN_OUT;
  const int64_t K = W0.cols;
  const int KT_all = int(K / BK);
  const int kt0 = SPLIT ? int(int64_t(KT_all) * blockIdx.z / p.k_split) : 0;
  const int KT = SPLIT ? int(int64_t(KT_all) * (blockIdx.z + 1) / p.k_split) - kt0 : KT_all;  // this block's k tiles

  // ---- A rows this thread copies (4 chunks of 16 B per thread per tile); the W rows (WTile)
  const XRows<> xs(p, row_base, rows_valid, kt0, tid);
  WTile<BITS, SWIGLU> wt(p, W0, W1, n0, kt0, tid);

  const uint32_t smem_base = smem_u32(smem);
  auto stage_a = [&](int s) { return smem_base + s * S::STAGE_BYTES; };
  const uint32_t b_base = smem_base + STAGES * S::STAGE_BYTES;

  auto load_tile = [&](int kt, int s) {
    if (kt < KT) {
      xs.load(p, stage_a(s), kt, tid);
      wt.copy(stage_a(s) + S::A_BYTES, kt);
    }
    cp_async_commit();
  };
  auto load_sb = [&](int kt) { wt.load_sb(kt, KT); };
  auto dequant = [&](int kt, int buf) {
    wt.dequant(smem + (kt % STAGES) * S::STAGE_BYTES + S::A_BYTES, b_base + buf * S::B_BYTES);
  };

  // 16 accumulator fragments of 4 values: fragment f holds (row fr, cols fc, fc+1) and (fr+8, ...)
  //   mma.sync: f = mi*4 + ni, fr = warp_m*64 + mi*16 + g, fc = warp_n*32 + ni*8 + 2(lane%4)
  //   wgmma:    f = j,         fr = (warp/4)*64 + (warp%4)*16 + g, fc = 8j + 2(lane%4)
  float acc[16][4];
#pragma unroll
  for (int i = 0; i < 16; ++i)
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[i][c] = 0.f;

  // ---- prologue
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) load_tile(s, s);
  load_sb(0);
  cp_async_wait<STAGES - 2>();
  __syncthreads();
  dequant(0, 0);
  load_sb(1);

  if constexpr (WG) fence_proxy_async();  // B tile 0 written by ordinary stores, read by wgmma
  // Whether this warp's 64 X rows (its warpgroup's with wgmma, warp_m's with mma.sync: the same half of the tile) hold
  // any valid row: a tile of at most 64 rows (an expert's last, short tile; a short prompt) multiplies only its first
  // half. Uniform over the warpgroup; the dequantization, which both halves share, still runs in every warp.
  const bool rows_here = warp_m * 64 < rows_valid;

  // One k tile after the barrier, compiled twice: with this warp's mmas, and (ROWS false: a warp whose half of the tile
  // has no valid row) with only its share of the copies and the dequantization. The barrier stays outside, one
  // instruction for all warps: __syncthreads is bar.sync's .aligned form, which every thread of the block must reach at
  // the same instruction (two copies of it, one per form, are what compute-sanitizer's synccheck flags: the likely
  // source of the errors it reported on the batched step's prompts, stop 52).
  auto k_tile = [&](auto rows, int kt) {
    constexpr bool ROWS = decltype(rows)::value;
    load_tile(kt + STAGES - 1, (kt + STAGES - 1) % STAGES);
    const uint32_t As = stage_a(kt % STAGES), Bs = b_base + (kt & 1) * S::B_BYTES;
    if constexpr (WG) {
      float* d = &acc[0][0];
      if constexpr (ROWS) {
        wg_fence_acc(d);
        wg_arrive();
        const uint32_t a_tile = As + (warp >> 2) * 64 * 128;
#pragma unroll
        for (int ks = 0; ks < BK / 16; ++ks) wgmma_m64n128k16(d, wg_desc(a_tile + ks * 32), wg_desc(Bs + ks * 32));
        wg_commit();
      }
      if (kt + 1 < KT) {
        dequant(kt + 1, (kt + 1) & 1);
        fence_proxy_async();
        load_sb(kt + 2);
      }
      if constexpr (ROWS) {
        wg_wait<0>();
        wg_fence_acc(d);
      }
      return;
    }
    if (kt + 1 < KT) {
      dequant(kt + 1, (kt + 1) & 1);
      load_sb(kt + 2);
    }
    if constexpr (ROWS) mma_sync_tile(acc, As, Bs, warp_m, warp_n, lane);
  };
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<STAGES - 3>();
    if constexpr (WG) fence_proxy_async();  // cp.async data → async proxy
    __syncthreads();
    if (rows_here)
      k_tile(std::true_type{}, kt);
    else
      k_tile(std::false_type{}, kt);
  }
  cp_async_wait<0>();

  // ---- epilogue
  const int g = lane >> 2, c2 = (lane & 3) * 2;
  auto frag_row = [&](int f) {
    return WG ? (warp >> 2) * 64 + (warp & 3) * 16 + g : warp_m * 64 + (f >> 2) * 16 + g;
  };
  auto frag_col = [&](int f) { return WG ? f * 8 + c2 : warp_n * 32 + (f & 3) * 8 + c2; };
  if constexpr (SWIGLU) {
    float* st = reinterpret_cast<float*>(smem);  // the pipeline's shared memory, reused
    stage_acc<S::EPI_LD>(st, acc, frag_row, frag_col);
    __syncthreads();
    swiglu_store<S::EPI_LD>(p, st, row_base, rows_valid, n0, tid);
  } else if (SPLIT && p.split_cluster) {
    float* st = reinterpret_cast<float*>(smem);
    stage_acc<S::EPI_LD>(st, acc, frag_row, frag_col);
    split_cluster_store<S::EPI_LD>(p, st, row_base, rows_valid, n0, tid);
  } else {
    store_frags<EPI, WG, SPLIT>(p, acc, frag_row, frag_col, row_base, rows_valid, n0);
  }
}

// Launch helper (defined in gemm.cu): validates W, picks the mma.sync or the wgmma kernel, sets the
// smem attribute once per instantiation.
void launch(const Params& p, int bits, bool grouped, int epi, int grid_y, cudaStream_t stream);

}  // namespace lilac::cuda::gemm
