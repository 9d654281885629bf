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
#include <cuda_bf16.h>

#include "cuda/kernels/qmatrix.cuh"

namespace lilac::cuda::gemm {

constexpr int BM = 128, BN = 128, BK = 64, THREADS = 256, STAGES = 4;

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
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                                  uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
__device__ __forceinline__ void mma_bf16(float* d, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

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
  static constexpr int EPI_LD = BN + 4;                          // fp32 staging row (SwiGLU)
  static_assert(BM * EPI_LD * 4 <= TOTAL, "epilogue staging must fit");
};

template <int BITS, bool GROUPED, int EPI>
__global__ void __launch_bounds__(THREADS, 2) qgemm_kernel(const Params p) {
  extern __shared__ __align__(128) unsigned char smem[];
  using S = Smem<BITS>;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp >> 2, warp_n = warp & 3;
  constexpr bool SWIGLU = EPI == EPI_SWIGLU_BF16;
  constexpr int BN_OUT = SWIGLU ? BN / 2 : BN;

  // ---- which rows / matrices this block works on
  int row_base, rows_valid;
  QMatrixDev W0 = p.W0, W1 = p.W1;
  if constexpr (GROUPED) {
    const int t = blockIdx.y;
    if (t >= p.tile_start[p.E]) return;
    int lo = 0, hi = p.E - 1;  // largest e with tile_start[e] <= t
    while (lo < hi) {
      int mid = (lo + hi + 1) >> 1;
      if (p.tile_start[mid] <= t) lo = mid; else hi = mid - 1;
    }
    const int e = lo;
    row_base = p.expert_start[e] + (t - p.tile_start[e]) * BM;
    rows_valid = min(BM, p.expert_start[e + 1] - row_base);
    W0 = p.W0s.expert(e);
    if constexpr (SWIGLU) W1 = p.W1s.expert(e);
  } else {
    row_base = blockIdx.y * BM;
    rows_valid = min(BM, p.M - row_base);
  }
  const int n0 = blockIdx.x * BN_OUT;
  const int64_t K = W0.cols;
  const int KT = int(K / BK);
  const int64_t wpr = W0.words_per_row(), gpr = W0.groups_per_row();

  // ---- A rows this thread copies (4 chunks of 16 B per thread per tile)
  const __nv_bfloat16* a_src[4];
  bool a_ok[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    int c = tid + i * THREADS, r = c >> 3, ch = c & 7;
    a_ok[i] = r < rows_valid;
    int64_t xr = 0;
    if (a_ok[i]) xr = GROUPED && p.a_rows ? p.a_rows[row_base + r] : int64_t(row_base + r);
    a_src[i] = p.X + xr * p.ldx + ch * 8;
  }
  // ---- W rows: thread tid owns tile row wr = tid / 2 (copy and dequant)
  const int wr = tid >> 1, wh = tid & 1;
  const QMatrixDev& Wm = (SWIGLU && wr >= BN / 2) ? W1 : W0;
  const int wrow = n0 + (SWIGLU ? (wr & (BN / 2 - 1)) : wr);
  const bool w_ok = wrow < p.N;
  const uint32_t* w_src = Wm.qweight + (w_ok ? int64_t(wrow) * wpr : 0);
  const __nv_bfloat16* s_src = Wm.scales + (w_ok ? int64_t(wrow) * gpr : 0);
  const __nv_bfloat16* b_src = Wm.biases + (w_ok ? int64_t(wrow) * gpr : 0);
  constexpr int WORDS_PER_TILE_ROW = BK * BITS / 32;  // 8 or 16

  const uint32_t smem_base = smem_u32(smem);
  auto stage_a = [&](int s) { return smem_base + s * S::STAGE_BYTES; };
  auto stage_w = [&](int s) { return smem_base + s * S::STAGE_BYTES + S::A_BYTES; };
  const uint32_t b_base = smem_base + STAGES * S::STAGE_BYTES;

  auto load_tile = [&](int kt, int s) {
    if (kt < KT) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        int c = tid + i * THREADS, r = c >> 3, ch = c & 7;
        cp_async16(stage_a(s) + swz(r, ch * 8), a_src[i] + int64_t(kt) * BK, a_ok[i]);
      }
      // raw words: row wr, 16-byte chunks (BITS/2 chunks per row, this thread takes half)
#pragma unroll
      for (int j = 0; j < BITS / 4; ++j) {
        int chunk = wh * (BITS / 4) + j;
        cp_async16(stage_w(s) + wr * (WORDS_PER_TILE_ROW * 4) + chunk * 16,
                   w_src + int64_t(kt) * WORDS_PER_TILE_ROW + chunk * 4, w_ok);
      }
    }
    cp_async_commit();
  };

  float sc = 0.f, bi = 0.f;  // scale / bias of the tile being dequantized next
  auto load_sb = [&](int kt) {
    if (kt < KT && w_ok) {
      sc = __bfloat162float(s_src[kt]);
      bi = __bfloat162float(b_src[kt]);
    }
  };
  auto dequant = [&](int kt, int buf) {
    const unsigned char* raw = smem + (kt % STAGES) * S::STAGE_BYTES + S::A_BYTES + wr * (WORDS_PER_TILE_ROW * 4);
    const uint32_t dst = b_base + buf * S::B_BYTES;
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
  };

  float acc[4][4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][j][c] = 0.f;

  // ---- prologue
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) load_tile(s, s);
  load_sb(0);
  cp_async_wait<STAGES - 2>();
  __syncthreads();
  dequant(0, 0);
  load_sb(1);

  // ldmatrix lane addressing
  const int a_r = lane & 15, a_k = (lane >> 4) * 8;                       // A: rows 0-15, k 0/8
  const int b_n = (lane & 7) + ((lane >> 4) << 3), b_k = ((lane >> 3) & 1) * 8;  // B: n 0-15, k 0/8

  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<STAGES - 3>();
    __syncthreads();
    load_tile(kt + STAGES - 1, (kt + STAGES - 1) % STAGES);
    if (kt + 1 < KT) {
      dequant(kt + 1, (kt + 1) & 1);
      load_sb(kt + 2);
    }
    const uint32_t As = stage_a(kt % STAGES), Bs = b_base + (kt & 1) * S::B_BYTES;
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
        for (int ni = 0; ni < 4; ++ni) mma_bf16(acc[mi][ni], af[mi], bfr[ni][0], bfr[ni][1]);
    }
  }
  cp_async_wait<0>();

  // ---- epilogue
  const int g = lane >> 2, c2 = (lane & 3) * 2;
  if constexpr (SWIGLU) {
    __syncthreads();  // pipeline smem is reused for the fp32 tile
    float* st = reinterpret_cast<float*>(smem);
#pragma unroll
    for (int mi = 0; mi < 4; ++mi)
#pragma unroll
      for (int ni = 0; ni < 4; ++ni) {
        int r = warp_m * 64 + mi * 16 + g, c = warp_n * 32 + ni * 8 + c2;
        *reinterpret_cast<float2*>(st + r * S::EPI_LD + c) = make_float2(acc[mi][ni][0], acc[mi][ni][1]);
        *reinterpret_cast<float2*>(st + (r + 8) * S::EPI_LD + c) = make_float2(acc[mi][ni][2], acc[mi][ni][3]);
      }
    __syncthreads();
    __nv_bfloat16* Y = static_cast<__nv_bfloat16*>(p.Y);
    // 128 rows × 64 outputs; each thread does pairs of columns
    for (int idx = tid; idx < BM * (BN_OUT / 2); idx += THREADS) {
      int r = idx / (BN_OUT / 2), c = (idx % (BN_OUT / 2)) * 2;
      if (r >= rows_valid) continue;
      float g0 = st[r * S::EPI_LD + c], g1 = st[r * S::EPI_LD + c + 1];
      float u0 = st[r * S::EPI_LD + BN_OUT + c], u1 = st[r * S::EPI_LD + BN_OUT + c + 1];
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
  } else {
    // pairs of columns are stored as one 8-byte (fp32) / 4-byte (bf16) access when aligned
    const bool vec = (p.ldy & 1) == 0 &&
                     (reinterpret_cast<uintptr_t>(p.Y) & (EPI == EPI_STORE_BF16 ? 3 : 7)) == 0;
#pragma unroll
    for (int mi = 0; mi < 4; ++mi)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        int r = warp_m * 64 + mi * 16 + g + half * 8;
        if (r >= rows_valid) continue;
        int64_t yrow = row_base + r;
        float rs = 1.f;
        if constexpr (EPI == EPI_SCALED_F32) rs = p.row_scale[yrow];
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) {
          int col = n0 + warp_n * 32 + ni * 8 + c2;
          float v0 = acc[mi][ni][half * 2] * rs, v1 = acc[mi][ni][half * 2 + 1] * rs;
          if constexpr (EPI == EPI_STORE_BF16) {
            __nv_bfloat16* yp = static_cast<__nv_bfloat16*>(p.Y) + yrow * p.ldy + col;
            if (vec && col + 1 < p.N) {
              *reinterpret_cast<__nv_bfloat162*>(yp) = __floats2bfloat162_rn(v0, v1);
            } else {
              if (col < p.N) yp[0] = __float2bfloat16_rn(v0);
              if (col + 1 < p.N) yp[1] = __float2bfloat16_rn(v1);
            }
          } else {
            float* yp = static_cast<float*>(p.Y) + yrow * p.ldy + col;
            if (vec && col + 1 < p.N) {
              float2 o = make_float2(v0, v1);
              if constexpr (EPI == EPI_ADD_F32) {
                float2 old = *reinterpret_cast<float2*>(yp);
                o.x += old.x;
                o.y += old.y;
              }
              *reinterpret_cast<float2*>(yp) = o;
            } else {
              if (col < p.N) yp[0] = (EPI == EPI_ADD_F32 ? yp[0] : 0.f) + v0;
              if (col + 1 < p.N) yp[1] = (EPI == EPI_ADD_F32 ? yp[1] : 0.f) + v1;
            }
          }
        }
      }
  }
}

// Launch helper (defined in gemm.cu): validates W, sets the smem attribute once per instantiation.
void launch(const Params& p, int bits, bool grouped, int epi, int grid_y, cudaStream_t stream);

}  // namespace lilac::cuda::gemm
