// The digits kernels (digits.h): the weights' repack into tile order, the input's RMSNorm and digits, and the
// GEMV on mma.m16n8k32.u8.s8. bench/GPU_NOTES.md ("Twelfth stop", "Thirteenth stop") has the measurements that
// chose them; the prototype it was taken from, bench/proto_int8_rows.cu, is in the history at 97c3d76.
#include "cuda/kernels/digits/digits.h"
#include "cuda/kernels/digits/digits_tile.cuh"

#include <algorithm>
#include <cstdlib>

#include "core/error.h"
#include "cuda/cuda_common.h"
#include "cuda/kernels/launch.cuh"
#include "cuda/kernels/qdot.cuh"

namespace lilac::cuda::digits {
namespace {

using ::lilac::cuda::dev::block_sum;
using ::lilac::cuda::dev::ld_stream;
using ::lilac::cuda::dev::pdl_trigger;
using ::lilac::cuda::dev::pdl_wait;

constexpr int kL = 3;             // digits per value
constexpr int kBits = 8 * kL - 3;  // 21: |v| <= 2^21
constexpr int kThreads = 256, kWarps = 8, kSliceGroups = 8;

int64_t row_blocks(int64_t rows) { return (rows + 15) / 16; }
// Rows per staged chunk for M rows: M rounded up to 8, at most kChunkRows.
int chunk_stride(int M) { return std::min(kChunkRows, (M + 7) / 8 * 8); }
__host__ __device__ inline size_t chunk_digit_bytes(int G, int cs) { return size_t(kL) * G * cs * 64; }
size_t launch_smem(int G, int mpad) { return chunk_digit_bytes(G, mpad) + size_t(G) * mpad * sizeof(float2); }

// ------------------------------------------------------------------------------------------------ repack
// Lane l = 4·g8 + c of tile (rb, g): word 2·half + h holds rows 16rb + g8 + 8h, columns 64g + 32half + 4c + i in
// the low nibble of byte i and 64g + 32half + 16 + 4c + i in the high one.
__global__ void repack_q_kernel(QMatrixDev W, int64_t nrb, uint4* out) {
  const int G = int(W.cols / 64);
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= nrb * G * 32) return;
  const int lane = int(id % 32), g8 = lane >> 2, c = lane & 3;
  const int64_t tile = id / 32, rb = tile / G;
  const int g = int(tile % G);
  const int64_t wpr = W.words_per_row();
  uint32_t w[4];
  for (int half = 0; half < 2; ++half)
    for (int h = 0; h < 2; ++h) {
      const int64_t row = 16 * rb + g8 + 8 * h;
      uint32_t word = 0;
      if (row < W.rows)
        for (int i = 0; i < 4; ++i)
          for (int hi = 0; hi < 2; ++hi) {
            const int64_t k = 64 * g + 32 * half + 16 * hi + 4 * c + i;
            const uint32_t q = (W.qweight[row * wpr + k / 8] >> (4 * (k % 8))) & 15u;
            word |= q << (8 * i + 4 * hi);
          }
      w[2 * half + h] = word;
    }
  out[id] = make_uint4(w[0], w[1], w[2], w[3]);
}

__global__ void repack_sb_kernel(QMatrixDev W, int64_t nrb, uint32_t* out) {
  const int G = int(W.cols / 64);
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= nrb * G * 16) return;
  const int r = int(id % 16);
  const int64_t tile = id / 16, rb = tile / G, row = 16 * rb + r;
  const int g = int(tile % G);
  uint32_t v = 0;
  if (row < W.rows) {
    const uint16_t* s = reinterpret_cast<const uint16_t*>(W.scales);
    const uint16_t* b = reinterpret_cast<const uint16_t*>(W.biases);
    v = uint32_t(s[row * G + g]) | (uint32_t(b[row * G + g]) << 16);
  }
  out[id] = v;
}

// ------------------------------------------------------------------------------------------------ staging
// Block (gb, r): row r's Σx² (every block of the row computes it the same way), then warp w the group
// g = 8·gb + w: lane l its columns 2l, 2l+1. Digits of column k of a group go to byte 16·c + 4·j + i of the
// row's 64 (k = 16j + 4c + i), so lane (g8, c) of the GEMV reads its B fragments of both k32 steps as 16 bytes.
__global__ void __launch_bounds__(kThreads) stage_kernel(StageArgs a, int cs) {
  __shared__ float red[32];
  const int r = blockIdx.y, K = int(a.K), G = K / 64;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = blockIdx.x * kWarps + warp;
  pdl_wait();
  pdl_trigger();
  if (a.row_slot != nullptr && a.row_slot[r] < 0) return;
  const int64_t ldx = a.ldx > 0 ? a.ldx : a.K;
  const float* x = a.x + r * ldx;
  float ss = 0.f;
  for (int i = threadIdx.x; i < K / 4; i += kThreads) {
    const float4 p = reinterpret_cast<const float4*>(x)[i];
    ss += p.x * p.x + p.y * p.y + p.z * p.z + p.w * p.w;
  }
  ss = block_sum(ss, red);
  const float scale = rsqrtf(ss / float(K) + a.eps);
  if (g >= G) return;
  const float2 xv = reinterpret_cast<const float2*>(x + 64 * g)[lane];
  const float2 wv = reinterpret_cast<const float2*>(a.norm_w + 64 * g)[lane];
  const float v0 = xv.x * scale * wv.x, v1 = xv.y * scale * wv.y;
  float mx = fmaxf(fabsf(v0), fabsf(v1)), sum = v0 + v1;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    sum += __shfl_xor_sync(0xffffffffu, sum, o);
  }
  int e = 0;
  frexpf(mx, &e);  // mx < 2^e
  int q0 = int(rintf(ldexpf(v0, kBits - e))), q1 = int(rintf(ldexpf(v1, kBits - e)));
  const int ch = r / cs, m = r % cs;
  char* dig = static_cast<char*>(a.buf) + ch * chunk_digit_bytes(G, cs);
  const int k = 2 * lane, off = 16 * ((k >> 2) & 3) + 4 * (k >> 4) + (k & 3);
  for (int l = kL - 1; l >= 0; --l) {
    int d0 = q0, d1 = q1;
    if (l > 0) {
      d0 = ((q0 + 128) & 255) - 128;
      d1 = ((q1 + 128) & 255) - 128;
      q0 = (q0 - d0) / 256;
      q1 = (q1 - d1) / 256;
    }
    const uint16_t pair = uint16_t(uint8_t(int8_t(d0)) | (uint32_t(uint8_t(int8_t(d1))) << 8));
    *reinterpret_cast<uint16_t*>(dig + ((int64_t(l) * G + g) * cs + m) * 64 + off) = pair;
  }
  if (lane == 0) {
    const int nch = (a.M + cs - 1) / cs;
    float2* meta = reinterpret_cast<float2*>(static_cast<char*>(a.buf) + nch * chunk_digit_bytes(G, cs));
    meta[(int64_t(ch) * G + g) * cs + m] = make_float2(ldexpf(1.f, e - kBits), sum);
  }
}

// ------------------------------------------------------------------------------------------------ GEMV
struct KArgs {
  const uint4* q;
  const uint32_t* sb;
  int64_t rows;
  int nrb, G;
  const char* dig;     // the launch's first row's digit unit of digit 0, group 0 (rows cs apart)
  const float2* meta;  // its meta of group 0
  int cs;              // the chunk's row stride
  int M, mpad;         // rows of this launch (a multiple of 8 in shared memory)
  const int32_t* row_slot;
  float* y;  // the launch's first row
  int64_t ldy;
};

// Warp w of block b walks row blocks b·8 + w, + gridDim.x·8, ...: each the whole K, D weight tiles requested
// ahead of the math; the launch's rows' digits in shared memory (copied once per block after the PDL wait).
// (Two blocks per SM fit up to 16 rows' digits of the 2048-wide LM head; 32 rows take one.)
template <int J, int D>
__global__ void __launch_bounds__(kThreads, J <= 2 ? 2 : 1) gemv_kernel(KArgs a) {
  extern __shared__ uint4 sm4[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g8 = lane >> 2, c = lane & 3;
  const int G = a.G, nrb = a.nrb, mpad = a.mpad;
  const int stride = gridDim.x * kWarps, rb0 = blockIdx.x * kWarps + warp;
  char* xs = reinterpret_cast<char*>(sm4);
  float2* ms = reinterpret_cast<float2*>(xs + chunk_digit_bytes(G, mpad));

  // The load cursor walks this warp's tiles (G groups of a row block, then its next row block) D tiles ahead.
  uint4 pw[D];
  uint32_t ps0[D], ps1[D];
  const uint4* lw = a.q + int64_t(rb0) * G * 32 + lane;
  const uint32_t* ls = a.sb + int64_t(rb0) * G * 16 + g8;
  const int64_t jump = int64_t(stride - 1) * G;  // tiles from a row block's end to the next one's start
  int lrb = rb0, lg = G;
  auto load = [&](int i) {
    if (lrb < nrb) {
      pw[i] = ld_stream(lw);
      ps0[i] = __ldg(ls);
      ps1[i] = __ldg(ls + 8);
    }
    lw += 32;
    ls += 16;
    if (--lg == 0) {
      lg = G;
      lw += jump * 32;
      ls += jump * 16;
      lrb += stride;
    }
  };
#pragma unroll
  for (int i = 0; i < D; ++i) load(i);
  pdl_wait();
  pdl_trigger();
  {
    // only the present rows' units: the padding columns' products are never stored
    const int n4 = G * a.M * 4;
    const uint4* src = reinterpret_cast<const uint4*>(a.dig);
    uint4* dst = reinterpret_cast<uint4*>(xs);
    for (int l = 0; l < kL; ++l)
      for (int i = threadIdx.x; i < n4; i += kThreads) {
        const int g = (i >> 2) / a.M, m = (i >> 2) % a.M;
        dst[((l * G + g) * mpad + m) * 4 + (i & 3)] = src[((int64_t(l) * G + g) * a.cs + m) * 4 + (i & 3)];
      }
    for (int i = threadIdx.x; i < G * a.M; i += kThreads) {
      const int g = i / a.M, m = i % a.M;
      ms[g * mpad + m] = a.meta[int64_t(g) * a.cs + m];
    }
  }
  __syncthreads();

  float acc[J][4], tot[J][4];
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int v = 0; v < 4; ++v) acc[j][v] = tot[j][v] = 0.f;
  const uint32_t xb0 = uint32_t(__cvta_generic_to_shared(xs)) + g8 * 64 + c * 16;
  const uint32_t lstep = uint32_t(G * mpad * 64), gstep = uint32_t(mpad * 64);
  const float2* mp0 = ms + 2 * c;
  uint32_t xb = xb0;
  const float2* mp = mp0;
  int rb = rb0, gl = 0;
  const int mrem = a.M - 2 * c;  // rows of this lane's column pair that exist: m = 8j + (v & 1) < mrem
  uint32_t live = 0;  // bit 2j + u: row 8j + 2c + u is stored
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int m = 8 * j + u;
      if (m < mrem && (a.row_slot == nullptr || a.row_slot[2 * c + m] >= 0)) live |= 1u << (2 * j + u);
    }
  for (;;) {
#pragma unroll
    for (int i = 0; i < D; ++i) {
      if (rb >= nrb) return;
      const uint4 w = pw[i];
      const uint32_t s0 = ps0[i], s1 = ps1[i];
      load(i);
      tile::tile_math<kL, J>(w, s0, s1, xb, lstep, mp, acc);
      ++gl;
      xb += gstep;
      mp += mpad;
      if ((gl & (kSliceGroups - 1)) == 0 || gl == G) {  // a slice ends: fold it
#pragma unroll
        for (int j = 0; j < J; ++j)
#pragma unroll
          for (int v = 0; v < 4; ++v) {
            tot[j][v] += acc[j][v];
            acc[j][v] = 0.f;
          }
      }
      if (gl == G) {  // the row block's outputs
        const int64_t n0 = int64_t(rb) * 16 + g8;
#pragma unroll
        for (int j = 0; j < J; ++j)
#pragma unroll
          for (int v = 0; v < 4; ++v) {
            const int64_t n = n0 + 8 * (v >> 1);
            if (((live >> (2 * j + (v & 1))) & 1u) && n < a.rows) a.y[int64_t(8 * j + 2 * c + (v & 1)) * a.ldy + n] = tot[j][v];
            tot[j][v] = 0.f;
          }
        gl = 0;
        xb = xb0;
        mp = mp0;
        rb += stride;
      }
    }
  }
}

// Rows per GEMV launch (GemvArgs::launch_rows).
int launch_rows(int G, int want) {
  static const int env = [] {
    const char* e = std::getenv("LILAC_DIGITS_ROWS");
    return e ? std::atoi(e) : 32;
  }();
  const int v = want > 0 ? want : env;
  const int cap = v >= 32 ? 32 : v >= 16 ? 16 : 8;
  int dev = 0, optin = 0;
  LILAC_CUDA_CHECK(cudaGetDevice(&dev));
  LILAC_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  int r = cap;
  while (r > 8 && launch_smem(G, r) > size_t(optin)) r /= 2;
  return r;
}

template <int J, int D>
void launch(const KArgs& a, cudaStream_t stream) {
  const size_t smem = launch_smem(a.G, a.mpad);
  static size_t set = 0;  // the largest shared-memory size allowed so far (per instantiation)
  if (smem > set) {
    LILAC_CUDA_CHECK(cudaFuncSetAttribute(gemv_kernel<J, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    set = smem;
  }
  int occ = 0;
  LILAC_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, gemv_kernel<J, D>, kThreads, smem));
  const int want = (a.nrb + kWarps - 1) / kWarps;
  const int grid = std::max(1, std::min(want, sm_count() * std::max(occ, 1)));
  launch_pdl(gemv_kernel<J, D>, dim3(unsigned(grid)), dim3(kThreads), smem, stream, a);
}

}  // namespace

bool tiles_supported(const QMatrixDev& W) {
  return W.bits == 4 && W.group_size == 64 && W.cols % 64 == 0 && W.cols >= 64 && W.cols <= kMaxK && W.rows >= 1 &&
         W.qweight != nullptr;
}

size_t tiles_q_bytes(const QMatrixDev& W) { return size_t(row_blocks(W.rows)) * size_t(W.cols / 64) * 512; }
size_t tiles_sb_bytes(const QMatrixDev& W) { return size_t(row_blocks(W.rows)) * size_t(W.cols / 64) * 64; }

void tiles_repack(const QMatrixDev& W, void* q, void* sb, cudaStream_t stream) {
  LILAC_CHECK(tiles_supported(W), "digits: the matrix cannot take the tile layout");
  const int64_t nrb = row_blocks(W.rows), G = W.cols / 64;
  repack_q_kernel<<<unsigned((nrb * G * 32 + 255) / 256), 256, 0, stream>>>(W, nrb, static_cast<uint4*>(q));
  repack_sb_kernel<<<unsigned((nrb * G * 16 + 255) / 256), 256, 0, stream>>>(W, nrb, static_cast<uint32_t*>(sb));
  LILAC_CUDA_LAUNCH_CHECK();
}

size_t stage_bytes(int64_t K, int M) {
  const int cs = chunk_stride(M), nch = (M + cs - 1) / cs, G = int(K / 64);
  return size_t(nch) * (chunk_digit_bytes(G, cs) + size_t(G) * cs * sizeof(float2));
}

void stage_rmsnorm(const StageArgs& a, cudaStream_t stream) {
  LILAC_CHECK(a.M >= 1 && a.M <= kMaxRows && a.K % 64 == 0 && a.K >= 64 && a.K <= kMaxK && a.norm_w && a.buf,
              "digits: bad staging arguments");
  const int G = int(a.K / 64);
  launch_pdl(stage_kernel, dim3(unsigned((G + kWarps - 1) / kWarps), unsigned(a.M)), dim3(kThreads), 0, stream, a,
             chunk_stride(a.M));
}

void gemv(const GemvArgs& a, cudaStream_t stream) {
  LILAC_CHECK(a.W && a.M >= 1 && a.M <= kMaxRows && a.buf && a.y, "digits: bad GEMV arguments");
  const int G = int(a.W.K / 64), cs = chunk_stride(a.M), nch = (a.M + cs - 1) / cs, per = launch_rows(G, a.launch_rows);
  const char* dig = static_cast<const char*>(a.buf);
  const float2* meta = reinterpret_cast<const float2*>(dig + nch * chunk_digit_bytes(G, cs));
  const int64_t ldy = a.ldy > 0 ? a.ldy : a.W.rows;
  for (int m0 = 0; m0 < a.M;) {
    const int ch = m0 / cs, mi = m0 % cs;  // a launch's rows lie in one chunk
    KArgs k;
    k.q = a.W.q;
    k.sb = a.W.sb;
    k.rows = a.W.rows;
    k.nrb = int(row_blocks(a.W.rows));
    k.G = G;
    k.dig = dig + ch * chunk_digit_bytes(G, cs) + size_t(mi) * 64;
    k.meta = meta + (int64_t(ch) * G) * cs + mi;
    k.cs = cs;
    k.M = std::min({per, a.M - m0, cs - mi});
    k.mpad = (k.M + 7) / 8 * 8;
    k.row_slot = a.row_slot ? a.row_slot + m0 : nullptr;
    k.y = a.y + int64_t(m0) * ldy;
    k.ldy = ldy;
    switch (k.mpad / 8) {
      case 1: launch<1, 8>(k, stream); break;
      case 2: launch<2, 4>(k, stream); break;
      case 3: launch<3, 4>(k, stream); break;
      default: launch<4, 4>(k, stream); break;
    }
    m0 += k.M;
  }
}

}  // namespace lilac::cuda::digits
