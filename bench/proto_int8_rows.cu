// Prototype (not part of the build; bench/BENCHMARKS.md "Twelfth stop" quotes its output): the 4-bit GEMV over
// M input rows on the integer tensor cores. The question it answers: how fast can the rows step's 4-bit matrices
// be once the weights need no fp16 dequantization and one dequantized tile serves every row of the batch?
//
// Arithmetic. Each input row's 64-group is scaled by a power of two 2^E >= max|x| and rounded to a (8L - 3)-bit
// integer v, written as L signed base-256 digits (the first |d0| <= 33, the others in [-128, 127]). The 4-bit
// weights q (0..15) are the u8 A operand of mma.m16n8k32.u8.s8 as they are (no zero point, no conversion beyond
// splitting nibbles into bytes), the digits the s8 B operand (one n-tile per digit and 8 rows), so every group
// dot Σ q·d_l is an exact int32, and Σ q·v = (S0·256 + S1)·256 + S2 (|Σ q·v| <= 64·15·2^21 < 2^31) is exact too.
// The float part per (output, row, group): y = fma(scale, float(Σ q·v)·2^(E-B), y); y = fma(bias, Σx, y), in group
// order inside fixed 8-group slices, the slices' sums added in order (so the result does not depend on M or on
// how a kernel splits K: a kernel with the whole K in one block folds the slices in registers, one with a block
// per slice writes per-slice partials that a second launch folds in the same order, one with a warp per slice
// folds through shared memory; every configuration's output is compared with the first one's by memcmp).
// The routed MoE (a row's 8 experts and the shared one) is bench/proto_int8_moe.cu; the shared pieces are in
// bench/proto_int8_common.cuh.
//
// Weights are packed as a load-time repack would: per 16-row block and 64-group 512 bytes, lane l's 16 bytes
// being exactly its A fragments of the group's two k32 steps (low nibbles: k 4c..4c+3, high: 16 + 4c ..), and
// per (block, group) 16 words {bf16 scale, bf16 bias}. Bytes per weight as MLX's layout.
//
// Output per case: µs per launch (a graph of 20 launches with PDL over weight copies >= 256 MB, as
// bench_kernels_rows), the weight stream rate, and the error against a double-precision reference next to a
// plain fp32 GEMV's error (the yardstick: the CPU reference computes in fp32).
// nvcc -O3 -std=c++20 -arch=sm_90a -I src -o proto_int8_rows bench/proto_int8_rows.cu
// PROTO_ONE="name,M,L,cfg" runs one case once, untimed (for Nsight Compute).
#include "proto_int8_common.cuh"

namespace {
using namespace proto_i8;

struct Args {
  const uint4* qp;     // [rows/16][G][32 lanes] 16 bytes
  const uint32_t* sb;  // [rows/16][G][16] {bf16 scale (low), bf16 bias (high)}
  int rows, K;
  const char* xq;      // [L][G][Mpad][64] digit bytes, per (row, group) 4 words per quad lane c
  const float2* meta;  // [G][Mpad] {2^(E-B), Σx}
  int M, Mpad;
  int Gs, KS;          // groups per block range, ranges (KS = G / Gs)
  float* out;          // KS == 1: y [M][rows]; else partials [KS][M][rows]
};

// Warp w of block b: range ks = b % KS, row blocks rb0 + i·stride, n-tiles jb .. jb + J - 1 of the rows (JS warps
// share a row block when the rows need more than J n-tiles: each loads the weight tile, the second from L2).
// D: weight tiles in flight per warp.
template <int L, int J, int JS, int D>
__global__ void __launch_bounds__(kThreads, 2) gemv_i8(Args a) {
  extern __shared__ uint4 sm4[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g8 = lane >> 2, c = lane & 3;
  const int G = a.K / 64, Gs = a.Gs, KS = a.KS, nrb = a.rows / 16, Mpad = a.Mpad;
  const int ks = blockIdx.x % KS, g0 = ks * Gs;
  constexpr int WR = kWarps / JS;  // row blocks per block at a time
  const int stride = (gridDim.x / KS) * WR, rb0 = (blockIdx.x / KS) * WR + warp / JS, jb = (warp % JS) * J;
  char* xs = reinterpret_cast<char*>(sm4);
  float2* ms = reinterpret_cast<float2*>(xs + size_t(L) * Gs * Mpad * 64);

  // The load cursor walks this warp's tiles (Gs groups of a row block, then the next row block) D tiles ahead
  // of the compute cursor; both step by constants.
  uint4 pw[D];
  uint32_t ps0[D], ps1[D];
  const uint4* lw = a.qp + (int64_t(rb0) * G + g0) * 32 + lane;
  const uint32_t* ls = a.sb + (int64_t(rb0) * G + g0) * 16 + g8;
  const int64_t jump = int64_t(stride) * G - Gs;  // tiles from a range's end to the next row block's range
  int lrb = rb0, lg = Gs;
  auto load = [&](int i) {
    if (lrb < nrb) {
      pw[i] = ld_stream(lw);
      ps0[i] = __ldg(ls);
      ps1[i] = __ldg(ls + 8);
    }
    lw += 32;
    ls += 16;
    if (--lg == 0) {
      lg = Gs;
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
    const int per_l = Gs * Mpad * 4, n4 = Gs * a.M * 4;  // uint4 per digit in shared memory / copied
    const uint4* src = reinterpret_cast<const uint4*>(a.xq);
    uint4* dst = reinterpret_cast<uint4*>(xs);
    for (int l = 0; l < L; ++l)
      for (int i = threadIdx.x; i < n4; i += kThreads) {
        const int u = ((i >> 2) / a.M * Mpad + (i >> 2) % a.M) * 4 + (i & 3);
        dst[l * per_l + u] = src[(int64_t(l) * G + g0) * Mpad * 4 + u];
      }
    for (int i = threadIdx.x; i < Gs * a.M; i += kThreads) {
      const int u = i / a.M * Mpad + i % a.M;
      ms[u] = a.meta[int64_t(g0) * Mpad + u];
    }
  }
  __syncthreads();

  float acc[J][4], tot[J][4];
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int v = 0; v < 4; ++v) acc[j][v] = tot[j][v] = 0.f;

  // compute cursor: this lane's B units and meta of group gl, its outputs' base
  const uint32_t xb0 = uint32_t(__cvta_generic_to_shared(xs)) + (8 * jb + g8) * 64 + c * 16;
  const uint32_t lstep = uint32_t(Gs * Mpad * 64), gstep = uint32_t(Mpad * 64);
  const float2* mp0 = ms + 8 * jb + 2 * c;
  uint32_t xb = xb0;
  const float2* mp = mp0;
  int rb = rb0, gl = 0;
  float* ob = a.out + int64_t(ks) * a.M * a.rows + int64_t(8 * jb + 2 * c) * a.rows + g8;
  const int mrem = a.M - (8 * jb + 2 * c);  // rows of this lane's column pair that exist: m = 8j + (v & 1) < mrem
  for (;;) {
#pragma unroll
    for (int i = 0; i < D; ++i) {
      if (rb >= nrb) return;
      const uint4 w = pw[i];
      const uint32_t s0 = ps0[i], s1 = ps1[i];
      load(i);
      tile_math<L, J>(w, s0, s1, xb, lstep, mp, acc);
      ++gl;
      xb += gstep;
      mp += Mpad;
      if ((gl & (kSliceGroups - 1)) == 0) {  // a slice ends: fold it
#pragma unroll
        for (int j = 0; j < J; ++j)
#pragma unroll
          for (int v = 0; v < 4; ++v) {
            tot[j][v] += acc[j][v];
            acc[j][v] = 0.f;
          }
      }
      if (gl == Gs) {  // the range ends: this row block's outputs
        float* o = ob + rb * 16;
#pragma unroll
        for (int j = 0; j < J; ++j)
#pragma unroll
          for (int v = 0; v < 4; ++v) {
            if (8 * j + (v & 1) < mrem) o[int64_t(8 * j + (v & 1)) * a.rows + 8 * (v >> 1)] = tot[j][v];
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

// Small M: the whole K staged once per block, KW = G / 8 warps per row block, warp kw the 8-group slice kw; the
// slices' sums folded in slice order through shared memory by the row block's first warp (the same bits as the
// kernel above: that fold is its register fold).
template <int L, int J, int KW, int D>
__global__ void __launch_bounds__(kThreads, 2) gemv_i8_kw(Args a) {
  extern __shared__ uint4 sm4[];
  __shared__ float part[kWarps][4 * J][32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g8 = lane >> 2, c = lane & 3;
  const int G = a.K / 64, nrb = a.rows / 16, Mpad = a.Mpad;
  constexpr int WR = kWarps / KW;
  const int kw = warp % KW, stride = gridDim.x * WR, g0 = kSliceGroups * kw;
  int rb = blockIdx.x * WR + warp / KW;
  char* xs = reinterpret_cast<char*>(sm4);
  float2* ms = reinterpret_cast<float2*>(xs + size_t(L) * G * Mpad * 64);

  uint4 pw[D];
  uint32_t ps0[D], ps1[D];
  const uint4* lw = a.qp + (int64_t(rb) * G + g0) * 32 + lane;
  const uint32_t* ls = a.sb + (int64_t(rb) * G + g0) * 16 + g8;
  const int64_t jump = int64_t(stride) * G - kSliceGroups;
  int lrb = rb, lg = kSliceGroups;
  auto load = [&](int i) {
    if (lrb < nrb) {
      pw[i] = ld_stream(lw);
      ps0[i] = __ldg(ls);
      ps1[i] = __ldg(ls + 8);
    }
    lw += 32;
    ls += 16;
    if (--lg == 0) {
      lg = kSliceGroups;
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
    const int n4 = L * G * a.M * 4;
    const uint4* src = reinterpret_cast<const uint4*>(a.xq);
    uint4* dst = reinterpret_cast<uint4*>(xs);
    for (int i = threadIdx.x; i < n4; i += kThreads) {
      const int u = ((i >> 2) / a.M * Mpad + (i >> 2) % a.M) * 4 + (i & 3);
      dst[u] = src[u];
    }
    for (int i = threadIdx.x; i < G * a.M; i += kThreads) ms[i / a.M * Mpad + i % a.M] = a.meta[i / a.M * Mpad + i % a.M];
  }
  __syncthreads();
  const uint32_t xb = uint32_t(__cvta_generic_to_shared(xs)) + (g0 * Mpad + g8) * 64 + c * 16;
  const uint32_t lstep = uint32_t(G * Mpad * 64), gstep = uint32_t(Mpad * 64);
  const float2* mp = ms + g0 * Mpad + 2 * c;
  float* ob = a.out + int64_t(2 * c) * a.rows + g8;
  const int mrem = a.M - 2 * c;
  for (int n = 0; int(blockIdx.x) * WR + n * stride < nrb; ++n) {
    const bool on = rb < nrb;
    float acc[J][4];
#pragma unroll
    for (int j = 0; j < J; ++j)
#pragma unroll
      for (int v = 0; v < 4; ++v) acc[j][v] = 0.f;
#pragma unroll
    for (int t = 0; t < kSliceGroups; ++t) {
      const int i = t % D;
      const uint4 w = pw[i];
      const uint32_t s0 = ps0[i], s1 = ps1[i];
      load(i);
      if (on) tile_math<L, J>(w, s0, s1, xb + t * gstep, lstep, mp + t * Mpad, acc);
    }
#pragma unroll
    for (int j = 0; j < J; ++j)
#pragma unroll
      for (int v = 0; v < 4; ++v) part[warp][4 * j + v][lane] = acc[j][v];
    __syncthreads();
    if (kw == 0 && on) {
      float* o = ob + rb * 16;
#pragma unroll
      for (int j = 0; j < J; ++j)
#pragma unroll
        for (int v = 0; v < 4; ++v) {
          float tot = 0.f;
#pragma unroll
          for (int q = 0; q < KW; ++q) tot += part[warp + q][4 * j + v][lane];
          if (8 * j + (v & 1) < mrem) o[int64_t(8 * j + (v & 1)) * a.rows + 8 * (v >> 1)] = tot;
        }
    }
    __syncthreads();
    rb += stride;
  }
}

__global__ void fold_partials(const float* part, int KS, int64_t n, float* y) {
  pdl_wait();
  pdl_trigger();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float s = 0.f;
  for (int k = 0; k < KS; ++k) s += part[int64_t(k) * n + i];
  y[i] = s;
}

// references: double, and a plain fp32 chain in k order (the CPU reference's kind of arithmetic)
__global__ void ref_kernel(const uint4* qp, const uint32_t* sb, int rows, int K, const float* x, double* yd, float* yf) {
  const int o = blockIdx.x * blockDim.x + threadIdx.x, m = blockIdx.y;
  if (o >= rows) return;
  const int G = K / 64;
  double s = 0;
  float f = 0.f;
  for (int k = 0; k < K; ++k) {
    const uint32_t w = sb[(int64_t(o / 16) * G + k / 64) * 16 + o % 16];
    const float wf = fmaf(bf_lo(w), float(q_at(qp, G, o, k)), bf_hi(w));
    const float xv = x[int64_t(m) * K + k];
    s += double(wf) * xv;
    f = fmaf(wf, xv, f);
  }
  yd[int64_t(m) * rows + o] = s;
  yf[int64_t(m) * rows + o] = f;
}

template <int L, int J, int JS, int D>
void launch(const Args& a, cudaStream_t st, int sms, float* y) {
  const size_t smem = size_t(L) * a.Gs * a.Mpad * 64 + size_t(a.Gs) * a.Mpad * 8;
  static size_t set = 0;
  if (smem > set) {
    CK(cudaFuncSetAttribute(gemv_i8<L, J, JS, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    set = smem;
  }
  int occ = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, gemv_i8<L, J, JS, D>, kThreads, smem));
  const int nrb = a.rows / 16;
  const int want = a.KS * ((nrb + kWarps / JS - 1) / (kWarps / JS));
  int grid = std::min(want, sms * std::max(occ, 1));
  grid = std::max(a.KS, grid / a.KS * a.KS);
  launch_pdl(gemv_i8<L, J, JS, D>, grid, kThreads, smem, st, a);
  if (a.KS > 1) {
    const int64_t n = int64_t(a.M) * a.rows;
    launch_pdl(fold_partials, int((n + 255) / 256), 256, 0, st, (const float*)a.out, a.KS, n, y);
  }
}

template <int L, int D>
void launch_j(const Args& a, cudaStream_t st, int sms, float* y) {
  switch (a.Mpad / 8) {
    case 1: launch<L, 1, 1, D>(a, st, sms, y); break;
    case 2: launch<L, 2, 1, D>(a, st, sms, y); break;
    case 4: launch<L, 4, 1, D>(a, st, sms, y); break;
    default: launch<L, 4, 2, D>(a, st, sms, y); break;
  }
}

template <int L, int J, int KW, int D>
void launch_kw(const Args& a, cudaStream_t st, int sms) {
  const size_t smem = size_t(L) * a.Gs * a.Mpad * 64 + size_t(a.Gs) * a.Mpad * 8;
  static size_t set = 0;
  if (smem > set) {
    CK(cudaFuncSetAttribute(gemv_i8_kw<L, J, KW, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    set = smem;
  }
  int occ = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, gemv_i8_kw<L, J, KW, D>, kThreads, smem));
  constexpr int WR = kWarps / KW;
  const int grid = std::min((a.rows / 16 + WR - 1) / WR, sms * std::max(occ, 1));
  launch_pdl(gemv_i8_kw<L, J, KW, D>, grid, kThreads, smem, st, a);
}

template <int L>
void launch_kw_any(const Args& a, cudaStream_t st, int sms, bool deep) {
  const int KW = a.K / 64 / kSliceGroups;
  const bool two = a.Mpad > 8;
  if (KW == 4) {
    if (two) deep ? launch_kw<L, 2, 4, 8>(a, st, sms) : launch_kw<L, 2, 4, 4>(a, st, sms);
    else deep ? launch_kw<L, 1, 4, 8>(a, st, sms) : launch_kw<L, 1, 4, 4>(a, st, sms);
  } else {
    if (two) deep ? launch_kw<L, 2, 8, 8>(a, st, sms) : launch_kw<L, 2, 8, 4>(a, st, sms);
    else deep ? launch_kw<L, 1, 8, 8>(a, st, sms) : launch_kw<L, 1, 8, 4>(a, st, sms);
  }
}

}  // namespace

int main() {
  struct Shape {
    const char* name;
    int rows, K;
  };
  const Shape shapes[] = {{"gdn_in_proj", 12352, 2048}, {"gdn_out_proj", 2048, 4096}, {"attn_qkv", 9216, 2048},
                          {"lm_head", 248320, 2048}, {"moe_gate_up_100exp", 102400, 2048}, {"moe_down_100exp", 204800, 512}};
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::mt19937 rng(1234);
  std::normal_distribution<float> nd(0.f, 1.f);
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  for (const Shape& sh : shapes) {
    const int G = sh.K / 64, nrb = sh.rows / 16;
    const int64_t qb = int64_t(sh.rows) * sh.K / 2, sbw = int64_t(nrb) * G * 16;
    const int copies = int(std::max<int64_t>(2, (256ll << 20) / (qb + 4 * sbw)));
    std::vector<uint32_t> hq(static_cast<size_t>(qb / 4)), hs(static_cast<size_t>(sbw));
    for (auto& v : hq) v = rng();
    random_scales(hs, rng, nd);
    char* dq;
    uint32_t* ds;
    CK(cudaMalloc(&dq, qb * copies));
    CK(cudaMalloc(&ds, sbw * 4 * copies));
    for (int cp = 0; cp < copies; ++cp) {
      CK(cudaMemcpy(dq + qb * cp, hq.data(), qb, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(ds + sbw * cp, hs.data(), sbw * 4, cudaMemcpyHostToDevice));
    }
    for (int M : {1, 2, 4, 8, 16, 32, 64}) {
      if (std::strncmp(sh.name, "lm", 2) == 0 && (M == 2 || M == 8 || M == 32)) continue;
      if (std::strncmp(sh.name, "moe", 3) == 0 && M > 2) continue;  // ~100 experts of ~1.3 rows: the MoE at 16 rows
      const int Mpad = (M + 7) / 8 * 8;
      std::vector<float> hx(size_t(M) * sh.K);
      for (int m = 0; m < M; ++m)
        for (int k = 0; k < sh.K; ++k) hx[size_t(m) * sh.K + k] = nd(rng) * (k % 53 == 7 ? 20.f : 1.f);  // outlier channels
      float *dx, *dy, *dyf, *dpart;
      double* dyd;
      char* dxq;
      float2* dmeta;
      CK(cudaMalloc(&dx, hx.size() * 4));
      CK(cudaMalloc(&dy, size_t(M) * sh.rows * 4));
      CK(cudaMalloc(&dyf, size_t(M) * sh.rows * 4));
      CK(cudaMalloc(&dyd, size_t(M) * sh.rows * 8));
      CK(cudaMalloc(&dpart, size_t(G / kSliceGroups) * M * sh.rows * 4));
      CK(cudaMalloc(&dxq, size_t(3) * G * Mpad * 64));
      CK(cudaMalloc(&dmeta, size_t(G) * Mpad * 8));
      CK(cudaMemcpy(dx, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
      const bool check = sh.rows < 100000;
      std::vector<double> yd;
      std::vector<float> yf;
      if (check) {
        ref_kernel<<<dim3((sh.rows + 127) / 128, M), 128, 0, st>>>(reinterpret_cast<const uint4*>(dq), ds, sh.rows, sh.K,
                                                                   dx, dyd, dyf);
        CK(cudaStreamSynchronize(st));
        yd.resize(size_t(M) * sh.rows);
        yf.resize(yd.size());
        CK(cudaMemcpy(yd.data(), dyd, yd.size() * 8, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(yf.data(), dyf, yf.size() * 4, cudaMemcpyDeviceToHost));
      }
      auto rel = [&](const std::vector<float>& y) {
        double num = 0, den = 0;
        for (size_t i = 0; i < y.size(); ++i) {
          num += (double(y[i]) - yd[i]) * (double(y[i]) - yd[i]);
          den += yd[i] * yd[i];
        }
        return std::sqrt(num / den);
      };
      for (int L : {2, 3}) {
        std::vector<float> first;  // every configuration must give these bits
        for (int cfg = 0; cfg < 6; ++cfg) {  // bit 0: one range per 8-group slice; bit 1: 8 tiles in flight; 4, 5: KW warps per row block
          const bool sliced = cfg & 1, deep = cfg & 2, kwv = cfg >= 4;
          const size_t whole = size_t(L) * G * Mpad * 64 + size_t(G) * Mpad * 8;
          if (!sliced && whole > 110 * 1024) continue;
          if (kwv && (whole > 110 * 1024 || Mpad > 16 || (G != 32 && G != 64))) continue;
          if (sliced && G == kSliceGroups) continue;  // one slice: the same launch as "whole"
          // PROTO_ONE="name,M,L,cfg": that case only, one launch, no timing (for Nsight Compute)
          const char* one = std::getenv("PROTO_ONE");
          char want[96];
          std::snprintf(want, sizeof want, "%s,%d,%d,%d", sh.name, M, L, cfg);
          if (one && std::strcmp(one, want) != 0) continue;
          if (L == 3) stage_digits<3><<<(Mpad * G + 127) / 128, 128, 0, st>>>(dx, M, Mpad, sh.K, dxq, dmeta);
          else stage_digits<2><<<(Mpad * G + 127) / 128, 128, 0, st>>>(dx, M, Mpad, sh.K, dxq, dmeta);
          Args a{};
          a.rows = sh.rows;
          a.K = sh.K;
          a.xq = dxq;
          a.meta = dmeta;
          a.M = M;
          a.Mpad = Mpad;
          a.Gs = sliced ? kSliceGroups : G;
          a.KS = G / a.Gs;
          a.out = a.KS > 1 ? dpart : dy;
          auto run = [&](int cp) {
            Args b = a;
            b.qp = reinterpret_cast<const uint4*>(dq + qb * cp);
            b.sb = ds + sbw * cp;
            if (kwv) {
              Args c = b;
              c.Gs = G;
              c.KS = 1;
              c.out = dy;
              L == 3 ? launch_kw_any<3>(c, st, sms, cfg & 1) : launch_kw_any<2>(c, st, sms, cfg & 1);
            } else if (L == 3) deep ? launch_j<3, 8>(b, st, sms, dy) : launch_j<3, 4>(b, st, sms, dy);
            else deep ? launch_j<2, 8>(b, st, sms, dy) : launch_j<2, 4>(b, st, sms, dy);
          };
          CK(cudaMemsetAsync(dy, 0xFF, size_t(M) * sh.rows * 4, st));
          run(0);
          CK(cudaStreamSynchronize(st));
          std::vector<float> y(size_t(M) * sh.rows);
          CK(cudaMemcpy(y.data(), dy, y.size() * 4, cudaMemcpyDeviceToHost));
          if (one) {
            std::printf("%s: one launch\n", want);
            continue;
          }
          bool same = true;
          if (first.empty()) first = y;
          else same = std::memcmp(first.data(), y.data(), y.size() * 4) == 0;
          const double us = graph_us(st, [&](int i) { run(i % copies); });
          std::printf("%-22s M=%-2d L=%d %s D=%d KS=%-2d: %8.1f us  %5.2f TB/s", sh.name, M, L,
                      kwv ? "kw    " : sliced ? "slices" : "whole ", kwv ? ((cfg & 1) ? 8 : 4) : deep ? 8 : 4,
                      kwv ? 1 : a.KS, us, (qb + 4.0 * sbw) / us * 1e-6);
          if (check) std::printf("  rel_err %.2e (fp32 chain %.2e)", rel(y), rel(yf));
          std::printf("%s\n", same ? "" : "  BITS DIFFER FROM THE FIRST CONFIGURATION");
        }
      }
      cudaFree(dx), cudaFree(dy), cudaFree(dyf), cudaFree(dyd), cudaFree(dpart), cudaFree(dxq), cudaFree(dmeta);
    }
    cudaFree(dq), cudaFree(ds);
  }
  return 0;
}
