// The small-M expert GEMMs of moe_prefill (gemm.h: moe_small_gate_up / moe_small_down, the path choice
// in moe_use_small): for prompts whose experts get few tokens each.
//
// Why: the grouped GEMM (gemm.cuh) tiles each expert's tokens by 128 and dequantizes a whole weight tile
// per CTA; at ~16 tokens per expert the tiles are mostly padding and the MoE weights stream at ~0.6 TB/s.
// Here the weights are the mma's A operand, read for each 16-token chunk of an expert (by concurrent CTAs:
// from HBM about once), and the tokens are the B operand (n = 8 per mma), so the kernel streams weights
// like the decode GEMV does.
//
// Layout. A CTA (8 warps) works on one expert (blockIdx.y) and a block of weight rows (blockIdx.x / Z). A warp
// owns two 16-row A operands for all of K: SwiGLU (gate/up): gate rows r..r+15 and up rows r..r+15 (r =
// 16 per warp), so silu(g)·u is formed in registers; down: rows r..r+15 and r+16..r+31 (r = 32 per warp).
// For each 16-token chunk of the expert: X rows (gathered through a_rows) are staged whole-K in shared
// memory in the mma's fragment order, with Σx per (token, 64-group); then per 64-column group the warp
// multiplies its rows with the chunk's two n-tiles, 4 mma m16n8k16 per tile and operand.
//
// Exactness. Thread c of a row quad holds 16 columns of a group: 4-bit one 8-byte word pair (column block
// x_block4(c)), 8-bit one 16-byte chunk (block c). Each value becomes q − zc (zc = 8
// or 128) in bf16 exactly; X is bf16 already, so every product is exact and sums in fp32. After each group:
// y += s·dot + (zc·s + b)·Σx in fp32 (W = s·q + b = s·(q − zc) + (zc·s + b)). The only roundings are the
// fp32 sums and the output (bf16 h for gate/up). (The grouped GEMM rounds s·q + b to bf16: 2^-9.)
// The k order inside an mma is a permutation of the group's columns (4-bit: a word's nibbles i and i+4
// form one bf16 pair); the staged X follows the same permutation, so the dot products are unchanged.
//
// An expert with more than 16 tokens has several chunks: Z CTAs per (expert, row block), adjacent in launch
// order (blockIdx.x = row block · Z + z), take near-equal runs of its chunks at the same time, so the weights
// they share come from HBM once and from L2 for the others (Z from the average tokens per expert, z_ctas()).
// Weights are read in 64-byte units of a row, 16 bytes per lane (4-bit: two groups, lanes 0, 1 holding the first
// and 2, 3 the second, then swapped in halves with lane c ^ 2 by two shuffles per row), one unit ahead in registers;
// 2 CTAs per SM (16 warps). Reading one group's 32 bytes per row per load instead left the loads alone as slow as
// the whole kernel (bench/GPU_NOTES.md "Nineteenth stop"). The CTA's scales and biases are copied into shared memory
// once (16-byte cp.async of the checkpoint's rows, overlapping the X staging), so a group's scale is one shared load;
// a chunk of at most 8 tokens runs one n-tile, not two.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#include "core/error.h"
#include "cuda/cuda_common.h"
#include "cuda/kernels/gemm/gemm.h"
#include "cuda/kernels/ptx.cuh"

namespace lilac::cuda {
namespace {

using dev::ld_stream;
using dev::mma_m16n8k16_bf16;

// 8-byte streaming load (ld_stream's path). Kept here, not in ptx.cuh, for now: every kernel family
// includes ptx.cuh, so touching it rebuilds them all (move it there with the next ptx.cuh change).
__device__ __forceinline__ uint2 ld_stream8(const uint2* p) {
  uint2 r;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
  return r;
}

constexpr int kWarps = 8, kThreads = 256;
constexpr int kNT = 2;            // n-tiles (8 tokens) per chunk
constexpr int kTok = kNT * 8;     // tokens per chunk
constexpr int kGroup = 64;
constexpr int kCtaRows = kThreads;  // weight rows per CTA: 32 per warp (SwiGLU: 16 gate + 16 up), one per thread
// Weights are read in units of 64 bytes of a row (4-bit: two groups, 8-bit: one), 16 bytes per lane, one unit
// ahead: a warp load takes 64 contiguous bytes of each of 8 rows, where one group's 32 bytes per row (4-bit) left
// a quarter of the load stream's speed on the table (bench/GPU_NOTES.md "Nineteenth stop").
constexpr int kUnitBytes = 64;
template <int BITS>
__host__ __device__ inline int units(int ngroups) { return BITS == 4 ? ngroups / 2 : ngroups; }
constexpr int kMaxSmem = 200 * 1024;
constexpr int kStageUnroll = 2;   // X loads per thread in flight while staging (4 spills registers)

struct Args {
  QExpertsDev W0, W1;  // SwiGLU: gate, up; down: W1 == W0
  const __nv_bfloat16* X = nullptr;
  int64_t ldx = 0;
  const int32_t* a_rows = nullptr;  // X row of sorted row i (null: i)
  const int32_t* expert_start = nullptr;
  int N = 0;                        // output columns (weight rows)
  int Z = 1;                        // CTAs per (expert, row block), each a run of the expert's chunks
  void* Y = nullptr;
  int64_t ldy = 0;
  const float* row_scale = nullptr;  // down: per sorted row
};

template <bool SWIGLU>
constexpr int rows_per_warp() { return SWIGLU ? 16 : 32; }

// Shared memory: the chunk's X in fragment order (kTok rows of x_stride bytes), Σx per (group, token), then the
// CTA's scales and biases, each [local row][group] bf16 with rows kSbStride bytes apart (a copy of the checkpoint's
// rows: 16-byte copies; 80 = 20 words puts a warp's 8 rows g in 8 different banks).
constexpr int kSbStride = 80;
constexpr int kMaxGroups = kSbStride / 2;  // K <= 2560 (the model's widths: 2048 and 512)
constexpr int kSbBytes = kCtaRows * kSbStride;  // one of the two arrays
__host__ __device__ inline int x_stride(int K) { return 2 * K + 16; }  // bytes; +16: conflict-free fragments
__host__ __device__ inline int smem_bytes(int K) { return kTok * x_stride(K) + (K / kGroup) * kTok * 4 + 2 * kSbBytes; }
// Whether rows of K columns fit: the scales' room (kMaxGroups) and the shared memory of a staged chunk.
inline bool cols_fit(int64_t K) { return K / kGroup <= kMaxGroups && smem_bytes(int(K)) <= kMaxSmem; }

// A thread's weight rows are (operand m, half h) for m, h in {0, 1}: row g + 8h of operand m (SwiGLU: m = 0 gate,
// 1 up, rows r0..r0+15 of each; down: rows r0 + 16m ..). Its local row (the scales' row) is warp·32 + 16m + 8h + g.
__device__ __forceinline__ int local_row(int warp, int m, int g, int h) { return warp * 32 + 16 * m + 8 * h + g; }
template <bool SWIGLU>
__device__ __forceinline__ int matrix_row(int r0, int m, int g, int h) {
  return r0 + g + 8 * h + (SWIGLU ? 0 : 16 * m);
}

// The matrix and row of the CTA's local row lr (the layout of local_row: warp, operand m, half h, g), clamped to N − 1.
template <bool SWIGLU>
__device__ __forceinline__ void cta_row(const Args& p, int lr, int e, int rb, QMatrixDev& M, int64_t& row) {
  const int w = lr >> 5, m = (lr >> 4) & 1, h = (lr >> 3) & 1, g = lr & 7;
  M = (SWIGLU && m == 1 ? p.W1 : p.W0).expert(e);
  row = min(matrix_row<SWIGLU>((rb * kWarps + w) * rows_per_warp<SWIGLU>(), m, g, h), p.N - 1);
}

// One group's weights for one thread: w[2m + h] = 16 columns of row (m, h).
template <int BITS>
struct Stage {
  using Word = typename std::conditional<BITS == 4, uint2, uint4>::type;
  Word w[4];
};

__device__ __forceinline__ uint32_t bsub2(uint32_t a, uint32_t b) {  // bf16x2 a − b
  __nv_bfloat162 r = __hsub2(*reinterpret_cast<__nv_bfloat162*>(&a), *reinterpret_cast<__nv_bfloat162*>(&b));
  return *reinterpret_cast<uint32_t*>(&r);
}
// Nibbles i and i+4 of w as the bf16 pair (n_i − 8, n_{i+4} − 8), exact: 0x4300 = 128, step 1. The mask and the
// exponent in one lop3 (the compiler's two immediates would take two).
__device__ __forceinline__ uint32_t nib_pair(uint32_t w, int i) {
  return bsub2(dev::and_or(w >> (4 * i), 0x000F000Fu, 0x43004300u), 0x43084308u);  // − 136
}
// Bytes 2h, 2h+1 of w as the bf16 pair (b − 128, b' − 128), exact (|b − 128| ≤ 128).
__device__ __forceinline__ uint32_t byte_pair(uint32_t w, int h) {
  const float f0 = __uint_as_float(0x4B000000u | ((w >> (16 * h)) & 0xFFu)) - 8388736.f;  // 2^23 + 128
  const float f1 = __uint_as_float(0x4B000000u | ((w >> (16 * h + 8)) & 0xFFu)) - 8388736.f;
  __nv_bfloat162 r = __floats2bfloat162_rn(f0, f1);
  return *reinterpret_cast<uint32_t*>(&r);
}
// The A register of pair p (0..7) of the thread's 16 columns of one row.
template <int BITS>
__device__ __forceinline__ uint32_t a_pair(const typename Stage<BITS>::Word& w, int p) {
  if constexpr (BITS == 4) {
    return nib_pair(p < 4 ? w.x : w.y, p & 3);
  } else {
    const uint32_t word = (p >> 1) == 0 ? w.x : (p >> 1) == 1 ? w.y : (p >> 1) == 2 ? w.z : w.w;
    return byte_pair(word, p & 1);
  }
}

// The CTA's scales and biases into shared memory (sb: the scales array, the biases kSbBytes after it), thread t
// copying local row t (rows past N copy row N − 1; their outputs are not stored): whole 16-byte chunks by cp.async
// when the row's groups are (the model's shapes), else bf16 by bf16. The caller waits for the copies.
template <bool SWIGLU>
__device__ void stage_scales(const Args& p, int e, int rb, int ngroups, unsigned char* sb) {
  const int t = threadIdx.x;
  QMatrixDev M;
  int64_t row;
  cta_row<SWIGLU>(p, t, e, rb, M, row);
  const unsigned short* sp = reinterpret_cast<const unsigned short*>(M.scales) + row * ngroups;
  const unsigned short* bp = reinterpret_cast<const unsigned short*>(M.biases) + row * ngroups;
  unsigned char* dst = sb + t * kSbStride;
  if (ngroups % 8 == 0) {
    for (int j = 0; j < ngroups / 8; ++j) {
      dev::cp_async16(dst + 16 * j, sp + 8 * j);
      dev::cp_async16(dst + kSbBytes + 16 * j, bp + 8 * j);
    }
    dev::cp_async_commit();
  } else {
    for (int G = 0; G < ngroups; ++G) {
      reinterpret_cast<unsigned short*>(dst)[G] = sp[G];
      reinterpret_cast<unsigned short*>(dst + kSbBytes)[G] = bp[G];
    }
  }
}

// 16 bytes of X (8 bf16 columns): their sum over the 8 lanes l ^ 1, l ^ 2, l ^ 4 (a 64-column group's Σx when those
// lanes hold its 8 pieces), and the 4-bit kernels' column order: (x0,x4), (x1,x5), (x2,x6), (x3,x7), the nibble pairs
// of a word.
__device__ __forceinline__ float group_sum8(const uint4& v) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 f = __bfloat1622float2(h[j]);
    sum += f.x + f.y;
  }
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  sum += __shfl_xor_sync(0xffffffffu, sum, 2);
  sum += __shfl_xor_sync(0xffffffffu, sum, 4);
  return sum;
}
__device__ __forceinline__ uint4 nibble_pair_order(const uint4& o) {
  return make_uint4(__byte_perm(o.x, o.z, 0x5410), __byte_perm(o.x, o.z, 0x7632), __byte_perm(o.y, o.w, 0x5410),
                    __byte_perm(o.y, o.w, 0x7632));
}

// X[chunk] into shared memory in fragment order, and Σx per (group, token); 8 lanes per 64-group. kStageUnroll loads
// per thread in flight; total = kTok·K/8 is a multiple of 32, so whole warps take each branch. Rows past the
// expert's tokens are zeros.
template <int BITS>
__device__ void stage_x(const Args& p, int start, int count, int chunk0, int K, unsigned char* smem, float* sumx) {
  const int tid = threadIdx.x, XS = x_stride(K);
  const int cpr = K / 8, total = kTok * cpr;  // 16-byte chunks per row, in the tile
  for (int base = 0; base < total; base += kStageUnroll * kThreads) {
    uint4 v[kStageUnroll];
#pragma unroll
    for (int u = 0; u < kStageUnroll; ++u) {
      const int idx = base + u * kThreads + tid, t = idx / cpr;
      v[u] = make_uint4(0, 0, 0, 0);
      if (idx < total && chunk0 + t < count) {
        const int sr = start + chunk0 + t;
        const int64_t xr = p.a_rows ? p.a_rows[sr] : sr;
        v[u] = *reinterpret_cast<const uint4*>(p.X + xr * p.ldx + (idx - t * cpr) * 8);
      }
    }
#pragma unroll
    for (int u = 0; u < kStageUnroll; ++u) {
      const int idx = base + u * kThreads + tid, t = idx / cpr, q = idx - t * cpr;
      if (base + u * kThreads >= total) break;  // uniform over the block
      const float sum = group_sum8(v[u]);
      uint4 o = v[u];
      if constexpr (BITS == 4) o = nibble_pair_order(o);
      if (idx < total) {
        *reinterpret_cast<uint4*>(smem + t * XS + q * 16) = o;
        if ((q & 7) == 0) sumx[(q >> 3) * kTok + t] = sum;
      }
    }
  }
}

// One group of the thread's 4 rows: each A fragment dequantized once and used for every n-tile, then
// tot += s·dot + (zc·s + b)·Σx (rows g / g+8 of operand m; tokens 2c, 2c+1 of tile t). The lane's 16 columns are one
// column block of the group. xg: the staged X at (tile 0, token g, the group, that block), tile t xts bytes further;
// sxg: the group's Σx per token; sbg: the scale of the thread's row (0, 0) at the group, row (m, h)
// (16m + 8h)·SB_ROW bytes further, its bias SB_ARR bytes further.
template <int BITS, int NT, int SB_ROW, int SB_ARR>
__device__ __forceinline__ void group_math(const Stage<BITS>& cur, const unsigned char* xg, int xts, const float* sxg,
                                           int c, const unsigned char* sbg, float (&tot)[2][NT][4]) {
  constexpr float ZC = BITS == 4 ? 8.f : 128.f;
  uint32_t bx[NT][8];  // the tiles' B registers: pairs 0..7 of token g, the lane's 16 columns
  float2 sx[NT];       // Σx of tokens 2c, 2c+1 of each tile
#pragma unroll
  for (int t = 0; t < NT; ++t) {  // (a tile past the expert's tokens multiplies staged zeros; not stored)
    const unsigned char* xb = xg + t * xts;
    const uint4 x0 = *reinterpret_cast<const uint4*>(xb), x1 = *reinterpret_cast<const uint4*>(xb + 16);
    bx[t][0] = x0.x, bx[t][1] = x0.y, bx[t][2] = x0.z, bx[t][3] = x0.w;
    bx[t][4] = x1.x, bx[t][5] = x1.y, bx[t][6] = x1.z, bx[t][7] = x1.w;
    sx[t] = *reinterpret_cast<const float2*>(sxg + t * 8 + 2 * c);
  }
  auto sb_at = [&](int m, int h, int bias) {
    return __uint_as_float(uint32_t(*reinterpret_cast<const unsigned short*>(sbg + bias * SB_ARR +
                                                                               (16 * m + 8 * h) * SB_ROW)) << 16);
  };

#pragma unroll
  for (int m = 0; m < 2; ++m) {
    float dot[NT][4];
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) dot[t][i] = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t a[4] = {a_pair<BITS>(cur.w[2 * m], 2 * j), a_pair<BITS>(cur.w[2 * m + 1], 2 * j),
                             a_pair<BITS>(cur.w[2 * m], 2 * j + 1), a_pair<BITS>(cur.w[2 * m + 1], 2 * j + 1)};
#pragma unroll
      for (int t = 0; t < NT; ++t) dev::mma_m16n8k16_bf16(dot[t], a, bx[t][2 * j], bx[t][2 * j + 1]);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // row g + 8h
      const float s = sb_at(m, h, 0);
      const float cb = fmaf(ZC, s, sb_at(m, h, 1));
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        tot[m][t][2 * h] = fmaf(s, dot[t][2 * h], fmaf(cb, sx[t].x, tot[m][t][2 * h]));
        tot[m][t][2 * h + 1] = fmaf(s, dot[t][2 * h + 1], fmaf(cb, sx[t].y, tot[m][t][2 * h + 1]));
      }
    }
  }
}

// One unit of the thread's 4 rows: v[2m + h] = 16 bytes of row (m, h).
struct Unit {
  uint4 v[4];
};
// Lane c's unit holds bytes [16c, 16c + 16) of the 64: 4-bit, lanes 0, 1 the first group's 32 bytes, lanes 2, 3 the
// second's. One exchange with lane c ^ 2 gives every lane 8 bytes (16 columns) of each group: column block xc(c)
// = 0, 2, 1, 3 of the group's four (the staged X is read at the same block, so the products are unchanged).
__host__ __device__ inline int x_block4(int c) { return ((c & 1) << 1) | (c >> 1); }
__device__ __forceinline__ void split_unit(const Unit& u, int c, Stage<4>& a, Stage<4>& b) {
  const bool first = c < 2;  // holds the first group: keeps words 0, 1, sends 2, 3 (lanes 2, 3 the reverse)
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint4 v = u.v[i];
    const uint32_t r0 = __shfl_xor_sync(0xffffffffu, first ? v.z : v.x, 2);
    const uint32_t r1 = __shfl_xor_sync(0xffffffffu, first ? v.w : v.y, 2);
    a.w[i] = first ? make_uint2(v.x, v.y) : make_uint2(r0, r1);
    b.w[i] = first ? make_uint2(r0, r1) : make_uint2(v.z, v.w);
  }
}

// A thread's weight rows: row (m, 0) of operand m at q[m], row (m, 1) h8[m] bytes further (8 rows, both clamped to
// row N − 1).
template <int BITS>
struct WeightRows {
  const char* q[2];
  int h8[2];
  int lane16;  // the lane's 16 bytes of a unit
  __device__ __forceinline__ const char* row(int i) const { return q[i >> 1] + (i & 1 ? h8[i >> 1] : 0); }
  __device__ __forceinline__ void load(Unit& u, int k) const {
#pragma unroll
    for (int i = 0; i < 4; ++i) u.v[i] = ld_stream(reinterpret_cast<const uint4*>(row(i) + k * kUnitBytes + lane16));
  }
  // 4-bit, an odd group count: the last group alone, lane c's column block xc
  __device__ __forceinline__ void load_last(Stage<4>& st, int G, int xc) const {
#pragma unroll
    for (int i = 0; i < 4; ++i) st.w[i] = ld_stream8(reinterpret_cast<const uint2*>(row(i) + G * 32 + 8 * xc));
  }
};
template <int BITS, bool SWIGLU>
__device__ __forceinline__ WeightRows<BITS> weight_rows(const Args& p, int e, int r0, int g, int c) {
  WeightRows<BITS> wr;
  const int64_t row_bytes = int64_t(p.W0.first.cols) * BITS / 8;
#pragma unroll
  for (int m = 0; m < 2; ++m) {
    const QMatrixDev M = (SWIGLU && m == 1 ? p.W1 : p.W0).expert(e);
    const int ra = min(matrix_row<SWIGLU>(r0, m, g, 0), p.N - 1), rb8 = min(matrix_row<SWIGLU>(r0, m, g, 1), p.N - 1);
    wr.q[m] = reinterpret_cast<const char*>(M.qweight) + ra * row_bytes;
    wr.h8[m] = int((rb8 - ra) * row_bytes);
  }
  wr.lane16 = 16 * c;
  return wr;
}

// Where a chunk's math runs: its first token, the expert's rows in the sorted order, the warp's first weight row,
// the thread's lane coordinates and the chunk's shape.
struct ChunkAt {
  int chunk0, start, count, r0, g, c, ngroups, XS;
};

// A chunk's outputs: (row, token) = (row (m, i/2) of the thread, 2c + (i&1) of tile t) — SwiGLU: bf16
// silu(gate)·up; down: fp32 row_scale · dot.
template <bool SWIGLU, int NT>
__device__ __forceinline__ void store_chunk(const Args& p, const ChunkAt& at, const float (&tot)[2][NT][4]) {
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int tok = at.chunk0 + t * 8 + 2 * at.c + (i & 1);
      if (tok >= at.count) continue;
      const int64_t sr = at.start + tok;
      if constexpr (SWIGLU) {
        const int r = matrix_row<SWIGLU>(at.r0, 0, at.g, i >> 1);
        if (r >= p.N) continue;
        const float gv = tot[0][t][i], uv = tot[1][t][i];
        static_cast<__nv_bfloat16*>(p.Y)[sr * p.ldy + r] = __float2bfloat16_rn(gv / (1.f + __expf(-gv)) * uv);
      } else {
        const float rs = p.row_scale[sr];
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          const int r = matrix_row<SWIGLU>(at.r0, m, at.g, i >> 1);
          if (r < p.N) static_cast<float*>(p.Y)[sr * p.ldy + r] = rs * tot[m][t][i];
        }
      }
    }
}

// One staged chunk of NT n-tiles (NT = 1 when it has at most 8 tokens): the weight units in order, one ahead through
// ub (unit 0 requested by the caller), then the outputs.
template <int BITS, bool SWIGLU, int NT>
__device__ __forceinline__ void chunk_math(const Args& p, const ChunkAt& at, const WeightRows<BITS>& wr, Unit (&ub)[2],
                                           const unsigned char* smem, const float* sumx, const unsigned char* sb_row) {
  float tot[2][NT][4] = {};
  const int ngroups = at.ngroups, nu = units<BITS>(ngroups);
  const int xc = BITS == 4 ? x_block4(at.c) : at.c;
  const unsigned char* xg = smem + at.g * at.XS + xc * 32;  // group G at + 128·G
  const int xts = 8 * at.XS;
  for (int k0 = 0; k0 < nu; k0 += 2) {
#pragma unroll
    for (int s = 0; s < 2; ++s) {  // unit k in ub[k % 2] (constant indices)
      const int k = k0 + s;
      if (k >= nu) break;
      if (k + 1 < nu) wr.load(ub[(s + 1) % 2], k + 1);
      if constexpr (BITS == 4) {
        Stage<4> a, b;
        split_unit(ub[s], at.c, a, b);
        group_math<4, NT, kSbStride, kSbBytes>(a, xg + 256 * k, xts, sumx + 2 * k * kTok, at.c, sb_row + 4 * k, tot);
        group_math<4, NT, kSbStride, kSbBytes>(b, xg + 256 * k + 128, xts, sumx + (2 * k + 1) * kTok, at.c,
                                               sb_row + 4 * k + 2, tot);
      } else {
        const Stage<8> st{{ub[s].v[0], ub[s].v[1], ub[s].v[2], ub[s].v[3]}};
        group_math<8, NT, kSbStride, kSbBytes>(st, xg + 128 * k, xts, sumx + k * kTok, at.c, sb_row + 2 * k, tot);
      }
    }
  }
  if constexpr (BITS == 4)
    if (ngroups % 2) {  // the last of an odd count (not the model's widths), not requested ahead
      const int G = ngroups - 1;
      Stage<4> st;
      wr.load_last(st, G, xc);
      group_math<4, NT, kSbStride, kSbBytes>(st, xg + 128 * G, xts, sumx + G * kTok, at.c, sb_row + 2 * G, tot);
    }
  store_chunk<SWIGLU, NT>(p, at, tot);
}

// A CTA's expert (blockIdx.y), row block and chunks: the z-th of Z near-equal runs of the expert's ceil(count / 16)
// chunks (blockIdx.x = row block · Z + z), tokens [lo, hi) of the expert's sorted rows [start, start + count).
struct CtaChunks {
  int e, start, count, rb, lo, hi;
  __device__ __forceinline__ explicit CtaChunks(const Args& p) {
    e = blockIdx.y;
    start = p.expert_start[e];
    count = p.expert_start[e + 1] - start;
    const int z = blockIdx.x % p.Z;
    rb = blockIdx.x / p.Z;
    const int per = ((count + kTok - 1) / kTok + p.Z - 1) / p.Z;
    lo = z * per * kTok;
    hi = min(count, (z + 1) * per * kTok);
  }
};

template <int BITS, bool SWIGLU>
__global__ void __launch_bounds__(kThreads, 2) moe_small_kernel(const Args p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const CtaChunks cc(p);
  if (cc.lo >= cc.hi) return;
  const int e = cc.e, start = cc.start, count = cc.count, rb = cc.rb, lo = cc.lo, hi = cc.hi;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
  const int K = int(p.W0.first.cols), ngroups = K / kGroup, XS = x_stride(K);
  float* sumx = reinterpret_cast<float*>(smem + kTok * XS);  // [group][token]
  unsigned char* sb = reinterpret_cast<unsigned char*>(sumx + ngroups * kTok);
  stage_scales<SWIGLU>(p, e, rb, ngroups, sb);

  // ---- this thread's 4 weight rows: v[2m + h] of a unit is row (m, h); rows past N load row N-1, not stored
  const int r0 = (rb * kWarps + warp) * rows_per_warp<SWIGLU>();
  const bool warp_active = r0 < p.N;
  const WeightRows<BITS> wr = weight_rows<BITS, SWIGLU>(p, e, r0, g, c);
  const unsigned char* sb_row = sb + local_row(warp, 0, g, 0) * kSbStride;

  for (int chunk0 = lo; chunk0 < hi; chunk0 += kTok) {
    Unit ub[2];
    if (warp_active && units<BITS>(ngroups) > 0) wr.load(ub[0], 0);
    stage_x<BITS>(p, start, count, chunk0, K, smem, sumx);
    dev::cp_async_wait_all();  // the scales (first chunk; later a no-op)
    __syncthreads();
    if (warp_active) {
      const ChunkAt at{chunk0, start, count, r0, g, c, ngroups, XS};
      if (min(hi, chunk0 + kTok) - chunk0 <= 8)  // one n-tile: the chunk's second would multiply zeros
        chunk_math<BITS, SWIGLU, 1>(p, at, wr, ub, smem, sumx, sb_row);
      else
        chunk_math<BITS, SWIGLU, kNT>(p, at, wr, ub, smem, sumx, sb_row);
    }
    __syncthreads();  // the X tile is restaged for the next chunk
  }
}

// ------------------------------------------------------------------------------------------------ the ring kernel
// 4-bit experts with an even number of groups (the model's widths). The staged kernel above holds a chunk's X for all
// of K (64 KB at K = 2048) and its scales (40 KB) in shared memory for the CTA's life, so its weights can only be
// requested one unit ahead in registers (~32 KB in flight per SM: the weights stream at ~1.4–2 TB/s). Here every
// operand streams through a ring of kRingStages stages in shared memory, one 64-byte unit (two groups) of K per
// stage: the CTA's 256 weight rows × 64 bytes by 16-byte cp.async (whole row segments), the two groups' scales and
// biases by 4-byte cp.async, and the chunk's 16 tokens × 128 columns of X by plain loads issued a ring's depth ahead
// and stored permuted (as stage_x does) with their Σx after the stage's math. ~90 KB per CTA: 2 CTAs per SM with
// 3 stages (48 KB of weights) each in flight. The math is the staged kernel's (group_math), lane c taking column
// block c of each group straight from shared memory (no exchange between lanes). Measured on the H200: gate/up 219 →
// 189 µs at 512 tokens, down 121 → 110; now bound by instructions per weight, not bytes in flight (bench/GPU_NOTES.md
// "Twenty-second stop").
constexpr int kRingStages = 4;
constexpr int kRingW = kCtaRows * kUnitBytes;      // 16 KB: local row lr at 64·lr, its halves swapped when lr & 2
constexpr int kRingXS = 2 * kGroup * 2 + 16;       // X row: 128 columns of bf16 + 16 (conflict-free fragments)
constexpr int kRingX = kTok * kRingXS;
constexpr int kRingSx = 2 * kTok * 4;              // Σx [group][token]
constexpr int kRingSbArr = kCtaRows * 4;           // [local row][2 groups] bf16; biases after the scales
constexpr int kRingStage = kRingW + kRingX + kRingSx + 2 * kRingSbArr;
constexpr int kRingSmem = kRingStages * kRingStage;
static_assert(kRingStage % 16 == 0, "16-byte aligned stages");

// One chunk through the ring: NT n-tiles (1 when it has at most 8 tokens). A stage's X is loaded when the stage is
// requested and stored after the math of the stage before it (storing it a stage later, to give the load a stage's
// math to arrive, measured the same).
template <bool SWIGLU, int NT>
__device__ __forceinline__ void ring_chunk(const Args& p, const ChunkAt& at, unsigned char* smem,
                                           const char* const (&wsrc)[4], const uint32_t (&wdst)[4],
                                           const unsigned short* ssrc, const unsigned short* bsrc, bool warp_active,
                                           int warp) {
  constexpr int S = kRingStages;
  const int tid = threadIdx.x, nu = at.ngroups / 2;
  const uint32_t base = dev::smem_u32(smem);
  // this thread's X piece: token tr of the chunk, 16 bytes q of a unit's 128 columns (group q / 8)
  const int tr = tid >> 4, q = tid & 15;
  const bool xv = at.chunk0 + tr < at.count;
  const int sr = at.start + at.chunk0 + tr;
  const __nv_bfloat16* xsrc = p.X + (xv ? (p.a_rows ? int64_t(p.a_rows[sr]) : int64_t(sr)) * p.ldx : 0) + q * 8;
  auto issue = [&](int k) {  // stage k's weights and scales; one commit group per stage (empty past the end)
    if (k < nu) {
      const uint32_t st = base + (k % S) * kRingStage;
#pragma unroll
      for (int i = 0; i < 4; ++i) dev::cp_async16(st + wdst[i], wsrc[i] + k * kUnitBytes);
      const uint32_t sb = st + kRingW + kRingX + kRingSx + tid * 4;
      dev::cp_async4(sb, ssrc + 2 * k);
      dev::cp_async4(sb + kRingSbArr, bsrc + 2 * k);
    }
    dev::cp_async_commit();
  };
  auto load_x = [&](int k) {
    return k < nu && xv ? *reinterpret_cast<const uint4*>(xsrc + k * 2 * kGroup) : make_uint4(0, 0, 0, 0);
  };
  auto store_x = [&](int k, uint4 v) {  // permuted into the nibble pairs' order (stage_x) with the group's Σx
    const float sum = group_sum8(v);
    if (k >= nu) return;
    unsigned char* st = smem + (k % S) * kRingStage;
    *reinterpret_cast<uint4*>(st + kRingW + tr * kRingXS + q * 16) = nibble_pair_order(v);
    if ((q & 7) == 0) reinterpret_cast<float*>(st + kRingW + kRingX)[(q >> 3) * kTok + tr] = sum;
  };

  float tot[2][NT][4] = {};
  {
    uint4 xp[S - 1];
#pragma unroll
    for (int s = 0; s < S - 1; ++s) {
      issue(s);
      xp[s] = load_x(s);
    }
#pragma unroll
    for (int s = 0; s < S - 1; ++s) store_x(s, xp[s]);
  }
  const int g = at.g, c = at.c, lr0 = warp * 32 + g;  // the thread's row (0, 0)
  const int swap = (g >> 1) & 1;                     // rows with lr & 2 hold their two groups swapped
  for (int k = 0; k < nu; ++k) {
    dev::cp_async_wait<S - 2>();  // stage k (this thread's copies)
    __syncthreads();              // everyone's copies and X of stage k; stage k − 1's slot free
    issue(k + S - 1);
    const uint4 xn = load_x(k + S - 1);
    if (warp_active) {
      const unsigned char* st = smem + (k % S) * kRingStage;
      const unsigned char* xg = st + kRingW + g * kRingXS + c * 32;
      const float* sx = reinterpret_cast<const float*>(st + kRingW + kRingX);
      const unsigned char* sb = st + kRingW + kRingX + kRingSx + lr0 * 4;
#pragma unroll
      for (int G = 0; G < 2; ++G) {
        Stage<4> w;
#pragma unroll
        for (int i = 0; i < 4; ++i)  // row (m, h) = (i / 2, i % 2): local row lr0 + 16m + 8h
          w.w[i] = *reinterpret_cast<const uint2*>(st + (lr0 + 16 * (i >> 1) + 8 * (i & 1)) * kUnitBytes +
                                                   (G ^ swap) * 32 + 8 * c);
        group_math<4, NT, 4, kRingSbArr>(w, xg + G * 128, 8 * kRingXS, sx + G * kTok, c, sb + 2 * G, tot);
      }
    }
    store_x(k + S - 1, xn);
  }
  dev::cp_async_wait_all();
  __syncthreads();  // the ring is refilled by the next chunk
  if (warp_active) store_chunk<SWIGLU, NT>(p, at, tot);
}

template <bool SWIGLU>
__global__ void __launch_bounds__(kThreads, 2) moe_ring_kernel(const Args p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const CtaChunks cc(p);
  if (cc.lo >= cc.hi) return;
  const int e = cc.e, start = cc.start, count = cc.count, rb = cc.rb, lo = cc.lo, hi = cc.hi;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int K = int(p.W0.first.cols), ngroups = K / kGroup;
  const int64_t row_bytes = int64_t(K) / 2;
  const int r0 = (rb * kWarps + warp) * rows_per_warp<SWIGLU>();
  // copies: 16-byte piece j = tid + 256 i of a stage's weights is quarter tid % 4 of local row tid / 4 + 64 i
  const char* wsrc[4];
  uint32_t wdst[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int lr = (tid >> 2) + 64 * i, qq = tid & 3;
    QMatrixDev M;
    int64_t row;
    cta_row<SWIGLU>(p, lr, e, rb, M, row);
    wsrc[i] = reinterpret_cast<const char*>(M.qweight) + row * row_bytes + qq * 16;
    wdst[i] = uint32_t(lr * kUnitBytes + ((qq ^ (((lr >> 1) & 1) << 1)) * 16));
  }
  QMatrixDev M;
  int64_t row;
  cta_row<SWIGLU>(p, tid, e, rb, M, row);  // the scales of local row tid
  const unsigned short* ssrc = reinterpret_cast<const unsigned short*>(M.scales) + row * ngroups;
  const unsigned short* bsrc = reinterpret_cast<const unsigned short*>(M.biases) + row * ngroups;
  for (int chunk0 = lo; chunk0 < hi; chunk0 += kTok) {
    const ChunkAt at{chunk0, start, count, r0, lane >> 2, lane & 3, ngroups, kRingXS};
    if (min(hi, chunk0 + kTok) - chunk0 <= 8)
      ring_chunk<SWIGLU, 1>(p, at, smem, wsrc, wdst, ssrc, bsrc, r0 < p.N, warp);
    else
      ring_chunk<SWIGLU, kNT>(p, at, smem, wsrc, wdst, ssrc, bsrc, r0 < p.N, warp);
  }
}

std::atomic<int> g_kernel{0};  // MoeSmallKernel: 0 auto, 1 ring, 2 staged

// The ring kernel takes 4-bit experts with an even number of groups, unless the staged kernel is asked for
// (set_moe_small_kernel, LILAC_MOE_RING=0).
bool ring_takes(const Args& p, int bits) {
  if (bits != 4 || (p.W0.first.cols / kGroup) % 2 != 0) return false;
  const int forced = g_kernel.load();
  if (forced != 0) return forced == 1;
  static const bool on = env_switch_on("LILAC_MOE_RING");
  return on;
}

template <typename Kernel, typename... A>
void launch_kernel(Kernel kern, int smem, int& attr_bytes, dim3 grid, cudaStream_t stream, const A&... args) {
  if (smem > 48 * 1024 && smem > attr_bytes) {
    const cudaError_t err = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess)
      throw Error("moe_small: cannot get " + std::to_string(smem) + " bytes of shared memory: " +
                  cudaGetErrorString(err));
    attr_bytes = smem;
  }
  kern<<<grid, kThreads, smem, stream>>>(args...);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw Error(std::string("moe_small: launch failed: ") + cudaGetErrorString(err));
}

template <int BITS, bool SWIGLU>
void launch_small(const Args& p, int E, cudaStream_t stream) {
  constexpr int rows_per_cta = kWarps * rows_per_warp<SWIGLU>();
  const dim3 grid(unsigned((p.N + rows_per_cta - 1) / rows_per_cta * p.Z), unsigned(E));
  static int attr_bytes = 0, ring_attr_bytes = 0;  // per instantiation (one GPU per process)
  if (ring_takes(p, BITS)) {
    launch_kernel(moe_ring_kernel<SWIGLU>, kRingSmem, ring_attr_bytes, grid, stream, p);
  } else {
    launch_kernel(moe_small_kernel<BITS, SWIGLU>, smem_bytes(int(p.W0.first.cols)), attr_bytes, grid, stream, p);
  }
}

void check_experts(const QExpertsDev& W, const char* what) {
  const QMatrixDev& m = W.first;
  if (m.bits != 4 && m.bits != 8)
    throw Error(std::string("moe_small: ") + what + ": experts must be 4- or 8-bit, got " + std::to_string(m.bits));
  if (m.group_size != kGroup || m.cols <= 0 || m.cols % kGroup != 0 || m.rows <= 0)
    throw Error(std::string("moe_small: ") + what + ": needs group_size 64 and cols a positive multiple of 64");
  if (!m.qweight || !m.scales || !m.biases) throw Error(std::string("moe_small: ") + what + ": null weight pointer");
  if (reinterpret_cast<uintptr_t>(m.qweight) % 16)
    throw Error(std::string("moe_small: ") + what + ": qweight not 16-byte aligned");
  if (!cols_fit(m.cols))
    throw Error(std::string("moe_small: ") + what + ": cols too large for the staged token chunk");
}

void check_x(const __nv_bfloat16* X, int64_t ldx) {
  if (reinterpret_cast<uintptr_t>(X) % 16 || ldx % 8)
    throw Error("moe_small: X must be 16-byte aligned with a row stride that is a multiple of 8 elements");
}

std::atomic<int> g_forced{0};  // 0 auto, 1 grouped, 2 small

// CTAs per (expert, row block) for `rows` sorted rows over E experts: ~1.5 × the average chunks per expert
// (an expert's count is roughly Poisson around the average), 1..4. 512 tokens top-8 of 256: 2.
int z_ctas(int64_t rows, int E) {
  const int64_t z = (3 * rows / std::max(E, 1) + 2 * kTok - 1) / (2 * kTok);
  return int(std::min<int64_t>(4, std::max<int64_t>(1, z)));
}

// The launch both entry points share (their weights and X already checked): fills N and Z from the experts
// W0 and the sorted row count, and picks the kernel instantiation for the weights' bits.
template <bool SWIGLU>
void run_small(Args p, int rows, cudaStream_t stream) {
  p.N = int(p.W0.first.rows);
  p.Z = z_ctas(rows, p.W0.n);
  if (p.W0.first.bits == 4)
    launch_small<4, SWIGLU>(p, p.W0.n, stream);
  else
    launch_small<8, SWIGLU>(p, p.W0.n, stream);
}

}  // namespace

bool moe_small_supported(const MoEPrefillWeights& w) {
  for (const QExpertsDev* x : {&w.gate, &w.up, &w.down}) {
    const QMatrixDev& m = x->first;
    if ((m.bits != 4 && m.bits != 8) || m.group_size != kGroup || m.cols % kGroup != 0 ||
        !cols_fit(m.cols))
      return false;
  }
  return w.gate.first.bits == w.up.first.bits;
}

void set_moe_small_kernel(MoeSmallKernel k) {
  g_kernel.store(k == MoeSmallKernel::Ring ? 1 : k == MoeSmallKernel::Staged ? 2 : 0);
}

void set_moe_path(MoePath path) { g_forced.store(path == MoePath::Grouped ? 1 : path == MoePath::Small ? 2 : 0); }

bool moe_use_small(const MoEPrefillWeights& w, int n) {
  if (!moe_small_supported(w)) return false;
  const int forced = g_forced.load();
  if (forced != 0) return forced == 2;
  const char* env = std::getenv("LILAC_MOE_SMALL");
  if (env && std::strcmp(env, "0") == 0) return false;
  if (env && std::strcmp(env, "1") == 0) return true;
  // average (token, slot) pairs per expert <= kMoeSmallMaxAvg
  return int64_t(n) * w.top_k <= int64_t(kMoeSmallMaxAvg) * w.gate.n;
}

void moe_small_gate_up(const QExpertsDev& gate, const QExpertsDev& up, const __nv_bfloat16* X, int64_t ldx,
                       const int32_t* a_rows, const int32_t* expert_start, int rows, __nv_bfloat16* H, int64_t ldh,
                       cudaStream_t stream) {
  check_experts(gate, "gate");
  check_experts(up, "up");
  check_x(X, ldx);
  if (gate.n != up.n || gate.first.rows != up.first.rows || gate.first.cols != up.first.cols ||
      gate.first.bits != up.first.bits)
    throw Error("moe_small: gate and up experts differ in count, shape or bits");
  run_small<true>({.W0 = gate, .W1 = up, .X = X, .ldx = ldx, .a_rows = a_rows, .expert_start = expert_start,
                   .Y = H, .ldy = ldh},
                  rows, stream);
}

void moe_small_down(const QExpertsDev& down, const __nv_bfloat16* H, int64_t ldh, const int32_t* expert_start,
                    int rows, const float* row_scale, float* Y, int64_t ldy, cudaStream_t stream) {
  check_experts(down, "down");
  check_x(H, ldh);
  run_small<false>({.W0 = down, .W1 = down, .X = H, .ldx = ldh, .expert_start = expert_start, .Y = Y, .ldy = ldy,
                    .row_scale = row_scale},
                   rows, stream);
}

}  // namespace lilac::cuda
