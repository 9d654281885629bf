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
// Exactness. Thread c of a row quad holds columns [16c, 16c+16) of a group: 4-bit one 8-byte word pair,
// 8-bit one 16-byte chunk (every warp load reads whole 32-byte sectors). Each value becomes q − zc (zc = 8
// or 128) in bf16 exactly; X is bf16 already, so every product is exact and sums in fp32. After each group:
// y += s·dot + (zc·s + b)·Σx in fp32 (W = s·q + b = s·(q − zc) + (zc·s + b)). The only roundings are the
// fp32 sums and the output (bf16 h for gate/up). (The grouped GEMM rounds s·q + b to bf16: 2^-9.)
// The k order inside an mma is a permutation of the group's columns (4-bit: a word's nibbles i and i+4
// form one bf16 pair); the staged X follows the same permutation, so the dot products are unchanged.
//
// An expert with more than 16 tokens has several chunks: Z CTAs per (expert, row block), adjacent in launch
// order (blockIdx.x = row block · Z + z), take near-equal runs of its chunks at the same time, so the weights
// they share come from HBM once and from L2 for the others (Z from the average tokens per expert, z_ctas()).
// Weights are loaded into registers kPF groups ahead (ld.global.nc); 2 CTAs per SM (16 warps).
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#include "core/error.h"
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
// weight groups loaded ahead (8-bit stages are twice as large: 1 keeps them in 128 registers)
template <int BITS>
constexpr int kPF = BITS == 4 ? 2 : 1;
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

__host__ __device__ inline int x_stride(int K) { return 2 * K + 16; }  // bytes; +16: conflict-free fragments
__host__ __device__ inline int smem_bytes(int K) { return kTok * x_stride(K) + (K / kGroup) * kTok * 4; }

// One group's weights for one thread: rows (A0, g), (A0, g+8), (A1, g), (A1, g+8) (kPF groups ahead), and
// their scales / biases (one group ahead: they mostly hit L1, a 32-byte sector holds 16 groups).
template <int BITS>
struct Stage {
  using Word = typename std::conditional<BITS == 4, uint2, uint4>::type;
  Word w[4];
};
struct ScaleBias {
  unsigned short s[4], b[4];
};

__device__ __forceinline__ uint32_t bsub2(uint32_t a, uint32_t b) {  // bf16x2 a − b
  __nv_bfloat162 r = __hsub2(*reinterpret_cast<__nv_bfloat162*>(&a), *reinterpret_cast<__nv_bfloat162*>(&b));
  return *reinterpret_cast<uint32_t*>(&r);
}
// Nibbles i and i+4 of w as the bf16 pair (n_i − 8, n_{i+4} − 8), exact: 0x4300 = 128, step 1.
__device__ __forceinline__ uint32_t nib_pair(uint32_t w, int i) {
  return bsub2(((w >> (4 * i)) & 0x000F000Fu) | 0x43004300u, 0x43084308u);  // − 136
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

template <int BITS, bool SWIGLU>
__global__ void __launch_bounds__(kThreads, 2) moe_small_kernel(const Args p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int e = blockIdx.y;
  const int start = p.expert_start[e], count = p.expert_start[e + 1] - start;
  // this CTA's chunks: the z-th of Z near-equal runs of the expert's ceil(count / 16) chunks
  const int z = blockIdx.x % p.Z, rb = blockIdx.x / p.Z;
  const int per = ((count + kTok - 1) / kTok + p.Z - 1) / p.Z;
  const int lo = z * per * kTok, hi = min(count, (z + 1) * per * kTok);
  if (lo >= hi) return;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
  const int K = int(p.W0.first.cols), ngroups = K / kGroup, XS = x_stride(K);
  float* sumx = reinterpret_cast<float*>(smem + kTok * XS);  // [group][token]
  constexpr float ZC = BITS == 4 ? 8.f : 128.f;

  // ---- this thread's 4 weight rows
  const int r0 = (rb * kWarps + warp) * rows_per_warp<SWIGLU>();
  const bool warp_active = r0 < p.N;
  // row of i = 0..3: (A0, g), (A0, g+8), (A1, g), (A1, g+8); A1 = A0 + 16 rows for down
  auto row_of = [&](int i) { return r0 + g + 8 * (i & 1) + (SWIGLU ? 0 : 16 * (i >> 1)); };
  const QMatrixDev M0 = p.W0.expert(e), M1 = SWIGLU ? p.W1.expert(e) : M0;
  constexpr int GROUP_BYTES = kGroup * BITS / 8;
  const int64_t row_bytes = int64_t(K) * BITS / 8;
  // rows past N load row N-1 and are not stored; addresses are formed at each load (fewer live registers)
  auto load = [&](Stage<BITS>& st, int G) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const QMatrixDev& M = i < 2 ? M0 : M1;
      const char* q = reinterpret_cast<const char*>(M.qweight) + min(row_of(i), p.N - 1) * row_bytes +
                      G * GROUP_BYTES + c * (GROUP_BYTES / 4);
      if constexpr (BITS == 4)
        st.w[i] = ld_stream8(reinterpret_cast<const uint2*>(q));
      else
        st.w[i] = ld_stream(reinterpret_cast<const uint4*>(q));
    }
  };
  auto load_sb = [&](ScaleBias& sb, int G) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const QMatrixDev& M = i < 2 ? M0 : M1;
      const int64_t sg = int64_t(min(row_of(i), p.N - 1)) * ngroups + G;
      sb.s[i] = __ldg(reinterpret_cast<const unsigned short*>(M.scales) + sg);
      sb.b[i] = __ldg(reinterpret_cast<const unsigned short*>(M.biases) + sg);
    }
  };

  for (int chunk0 = lo; chunk0 < hi; chunk0 += kTok) {
    // first weight groups in flight before the X staging
    Stage<BITS> buf[kPF<BITS>];
    ScaleBias sb_next;
    if (warp_active) {
#pragma unroll
      for (int s = 0; s < kPF<BITS>; ++s)
        if (s < ngroups) load(buf[s], s);
      load_sb(sb_next, 0);
    }
    // ---- stage X[chunk] (fragment order) and Σx per (token, group); 8 lanes per 64-group. kStageUnroll loads
    // per thread in flight; total = kTok·K/8 is a multiple of 32, so whole warps take each branch.
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
        const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v[u]);
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float2 f = __bfloat1622float2(h[j]);
          sum += f.x + f.y;
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        sum += __shfl_xor_sync(0xffffffffu, sum, 4);
        uint4 o = v[u];
        if constexpr (BITS == 4)  // (x0,x4), (x1,x5), (x2,x6), (x3,x7): the nibble pairs of a word
          o = make_uint4(__byte_perm(o.x, o.z, 0x5410), __byte_perm(o.x, o.z, 0x7632), __byte_perm(o.y, o.w, 0x5410),
                         __byte_perm(o.y, o.w, 0x7632));
        if (idx < total) {
          *reinterpret_cast<uint4*>(smem + t * XS + q * 16) = o;
          if ((q & 7) == 0) sumx[(q >> 3) * kTok + t] = sum;
        }
      }
    }
    __syncthreads();

    if (warp_active) {
      float tot[2][kNT][4];
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int t = 0; t < kNT; ++t)
#pragma unroll
          for (int i = 0; i < 4; ++i) tot[m][t][i] = 0.f;
      for (int G0 = 0; G0 < ngroups; G0 += kPF<BITS>) {
#pragma unroll
        for (int s = 0; s < kPF<BITS>; ++s) {
          const int G = G0 + s;
          if (G >= ngroups) break;
          const Stage<BITS> cur = buf[s];
          const ScaleBias sb = sb_next;
          if (G + kPF<BITS> < ngroups) load(buf[s], G + kPF<BITS>);
          if (G + 1 < ngroups) load_sb(sb_next, G + 1);
          uint32_t bx[kNT][8];  // the tiles' B registers: pairs 0..7 of token g, thread c's 16 columns
          float2 sx[kNT];       // Σx of tokens 2c, 2c+1 of each tile
#pragma unroll
          for (int t = 0; t < kNT; ++t) {  // (a tile past the expert's tokens multiplies staged zeros; not stored)
            const unsigned char* xb = smem + (t * 8 + g) * XS + G * 128 + c * 32;
            const uint4 x0 = *reinterpret_cast<const uint4*>(xb), x1 = *reinterpret_cast<const uint4*>(xb + 16);
            bx[t][0] = x0.x, bx[t][1] = x0.y, bx[t][2] = x0.z, bx[t][3] = x0.w;
            bx[t][4] = x1.x, bx[t][5] = x1.y, bx[t][6] = x1.z, bx[t][7] = x1.w;
            sx[t] = *reinterpret_cast<const float2*>(sumx + G * kTok + t * 8 + 2 * c);
          }
          // per operand m: each A fragment dequantized once and used for every n-tile, then
          // y += s·dot + (zc·s + b)·Σx   (rows g / g+8 of operand m; tokens 2c, 2c+1 of tile t)
#pragma unroll
          for (int m = 0; m < 2; ++m) {
            float dot[kNT][4];
#pragma unroll
            for (int t = 0; t < kNT; ++t)
#pragma unroll
              for (int i = 0; i < 4; ++i) dot[t][i] = 0.f;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              const uint32_t a[4] = {a_pair<BITS>(cur.w[2 * m], 2 * j), a_pair<BITS>(cur.w[2 * m + 1], 2 * j),
                                     a_pair<BITS>(cur.w[2 * m], 2 * j + 1), a_pair<BITS>(cur.w[2 * m + 1], 2 * j + 1)};
#pragma unroll
              for (int t = 0; t < kNT; ++t) mma_m16n8k16_bf16(dot[t], a, bx[t][2 * j], bx[t][2 * j + 1]);
            }
#pragma unroll
            for (int h = 0; h < 2; ++h) {  // row g + 8h
              const float sc = __uint_as_float(uint32_t(sb.s[2 * m + h]) << 16);
              const float cb = fmaf(ZC, sc, __uint_as_float(uint32_t(sb.b[2 * m + h]) << 16));
#pragma unroll
              for (int t = 0; t < kNT; ++t) {
                tot[m][t][2 * h] = fmaf(sc, dot[t][2 * h], fmaf(cb, sx[t].x, tot[m][t][2 * h]));
                tot[m][t][2 * h + 1] = fmaf(sc, dot[t][2 * h + 1], fmaf(cb, sx[t].y, tot[m][t][2 * h + 1]));
              }
            }
          }
        }
      }
      // ---- epilogue: (row, token) = (g + 8(i/2) [+16 m for down], 2c + (i&1) of tile t)
#pragma unroll
      for (int t = 0; t < kNT; ++t)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int tok = chunk0 + t * 8 + 2 * c + (i & 1);
          if (tok >= count) continue;
          const int64_t sr = start + tok;
          if constexpr (SWIGLU) {
            const int r = row_of(i >> 1);
            if (r >= p.N) continue;
            const float gv = tot[0][t][i], uv = tot[1][t][i];
            static_cast<__nv_bfloat16*>(p.Y)[sr * p.ldy + r] = __float2bfloat16_rn(gv / (1.f + __expf(-gv)) * uv);
          } else {
            const float rs = p.row_scale[sr];
#pragma unroll
            for (int m = 0; m < 2; ++m) {
              const int r = row_of(2 * m + (i >> 1));
              if (r < p.N) static_cast<float*>(p.Y)[sr * p.ldy + r] = rs * tot[m][t][i];
            }
          }
        }
    }
    __syncthreads();  // the X tile is restaged for the next chunk
  }
}

template <int BITS, bool SWIGLU>
void launch_small(const Args& p, int E, cudaStream_t stream) {
  auto kern = moe_small_kernel<BITS, SWIGLU>;
  const int smem = smem_bytes(int(p.W0.first.cols));
  static int attr_bytes = 0;  // per instantiation (one GPU per process)
  if (smem > 48 * 1024 && smem > attr_bytes) {
    const cudaError_t err = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess)
      throw Error("moe_small: cannot get " + std::to_string(smem) + " bytes of shared memory: " +
                  cudaGetErrorString(err));
    attr_bytes = smem;
  }
  constexpr int rows_per_cta = kWarps * rows_per_warp<SWIGLU>();
  const dim3 grid(unsigned((p.N + rows_per_cta - 1) / rows_per_cta * p.Z), unsigned(E));
  kern<<<grid, kThreads, smem, stream>>>(p);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw Error(std::string("moe_small: launch failed: ") + cudaGetErrorString(err));
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
  if (smem_bytes(int(m.cols)) > kMaxSmem)
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
        smem_bytes(int(m.cols)) > kMaxSmem)
      return false;
  }
  return w.gate.first.bits == w.up.first.bits;
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
