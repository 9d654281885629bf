// Prototype (not part of the build; bench/BENCHMARKS.md "Sixth stop" quotes its output): the dense multi-row GEMV
// with 4 input rows per mma instead of 2. Each mma's 16 k values come from one 64-group of the 4-bit weights (a
// quad's 4 lanes hold 8 bytes each of the same group), so a B column is one input row's hi or lo part and the group
// scale applies to the whole output column; today (tc_rows.cuh) a column holds one row's part of one group, and
// each row needs 4 of the 8 columns. The arithmetic is not gemv_tc's (the k order inside a group differs), so this
// measures what a layout change for batch 1 and the rows kernels together would buy: checked against an fp32
// reference, timed against bench_kernels_rows's gemv_rows (same shapes and k-slice rule, same block structure:
// weights one k-tile ahead in registers, per-group barrier, fixed-order combine, PDL with the first two k-tiles
// requested before the wait). PROTO_ONE="name,M,NT,L16" runs one case once (for Nsight Compute).
// nvcc -O3 -std=c++20 -arch=sm_90a --expt-relaxed-constexpr -I src bench/proto_rows4.cu src/cuda/kernels/launch.cu -o proto_rows4
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "cuda/kernels/launch.cuh"
#include "cuda/kernels/tc_common.cuh"
#include "proto_common.cuh"

using namespace lilac::cuda::tc;
using lilac::cuda::dev::mma_m16n8k16_f16;

namespace {

struct Args {
  const char* q;              // [rows][cols/2] MLX 4-bit
  const unsigned short* s;    // [rows][cols/64] bf16
  const unsigned short* b;
  int rows, cols;
  const char* xs;             // staged input: [M][ngroups][256 B]
  const float2* meta;         // [M][ngroups] {2^E, Σx}
  int M;
  float* y;                   // [M][rows]
};

__device__ __forceinline__ float bfq(uint2 v, int q) {
  const uint32_t w = (q & 2) ? v.y : v.x;
  return __uint_as_float(__byte_perm(w, 0u, (q & 1) ? 0x3244u : 0x1044u));
}

// Staging: one thread per (row m, group G, quarter c): 16 values x[m][64G + 16c ..], E from the group's max
// (4 lanes), hi/lo halves at m·RS + G·256 + h·128 + (c·2 + p)·16 in the order (0,4),(1,5),(2,6),(3,7) of each 8.
// pi: with 16-byte weight loads and the exchange of gemv4<.., true>, lane c of a quad holds bytes 8·pi(c) .. of
// each group (pi swaps 1 and 2); the staging puts quarter c's values where lane pi(c) reads them.
__global__ void stage4(const float* x, int M, int K, char* xs, float2* meta, bool perm) {
  const int ng = K / 64;
  const int id = blockIdx.x * blockDim.x + threadIdx.x;
  const int c = id & 3, mg = id >> 2, m = mg / ng, G = mg % ng;
  const bool ok = m < M;
  float v[16];
  float mx = 0.f, sum = 0.f;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    v[i] = ok ? x[int64_t(m) * K + G * 64 + 16 * c + i] : 0.f;
    mx = fmaxf(mx, fabsf(v[i]));
    sum += v[i];
  }
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  sum += __shfl_xor_sync(0xffffffffu, sum, 2);
  if (!ok) return;
  const int E = frexp_e(mx);
  const float inv = pow2i(-E);
  char* base = xs + (int64_t(m) * ng + G) * 256;
  const int cw = perm ? ((c & 1) << 1) | (c >> 1) : c;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    uint32_t hi[4], lo[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float xa = v[8 * h + j] * inv, xb = v[8 * h + j + 4] * inv;
      const __half ha = __float2half_rn(xa), hb = __float2half_rn(xb);
      const __half la = __float2half_rn(xa - __half2float(ha)), lb = __float2half_rn(xb - __half2float(hb));
      const __half2 h2 = __halves2half2(ha, hb), l2 = __halves2half2(la, lb);
      hi[j] = *reinterpret_cast<const uint32_t*>(&h2);
      lo[j] = *reinterpret_cast<const uint32_t*>(&l2);
    }
    *reinterpret_cast<uint4*>(base + h * 128 + (cw * 2 + 0) * 16) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
    *reinterpret_cast<uint4*>(base + h * 128 + (cw * 2 + 1) * 16) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
  }
  if (c == 0) meta[int64_t(m) * ng + G] = make_float2(pow2i(E), sum);
}

struct Tile {
  uint2 w[2][4];  // rows g, g+8; groups 0..3 of the k-tile: 8 bytes at 8c
  uint2 s[2], b[2];
};

// L16: each lane loads 16 bytes per row and 2-group chunk (lanes 0,1: the first group, 2,3: the second, as gemv_tc)
// and trades 8 of them with lane c ^ 2, instead of two 8-byte loads.
template <int KS, int NT, bool L16, int MB>
__global__ void __launch_bounds__(256, MB) gemv4(Args a) {
  constexpr int RB = 8 / KS, MT = 4 * NT;
  extern __shared__ float4 smem4[];
  __shared__ float part[2][8][MT * 16];
  const int K = a.cols, KT = K / 256, ng = K / 64, RS = ng * 256;
  char* xs = reinterpret_cast<char*>(smem4);
  float2* meta = reinterpret_cast<float2*>(xs + MT * RS);
  char* zero = reinterpret_cast<char*>(meta + MT * ng);  // one group of zeros: the B units of absent rows
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int rbw = warp / KS, ks = warp % KS, iters = (KT + KS - 1) / KS;
  const int nrb = a.rows / 16, ngrp = (nrb + RB - 1) / RB;
  const int tok0 = blockIdx.y * MT, nt = min(MT, a.M - tok0);
  const int qrow = K / 2, srow = ng;
  auto load = [&](Tile& t, int grp, int j) {
    const int kt = ks + j * KS;
    if (grp >= ngrp || kt >= KT) return;
    const int r0 = (grp * RB + rbw) * 16 + g;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const char* q = a.q + int64_t(r0 + 8 * h) * qrow + kt * 128 + 8 * c;
      if constexpr (L16) {
        const char* q16 = a.q + int64_t(r0 + 8 * h) * qrow + kt * 128 + 16 * c;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const uint4 u = __ldg(reinterpret_cast<const uint4*>(q16 + 64 * i));
          t.w[h][2 * i] = make_uint2(u.x, u.y);      // exchanged in step()
          t.w[h][2 * i + 1] = make_uint2(u.z, u.w);
        }
      } else {
#pragma unroll
        for (int qq = 0; qq < 4; ++qq) t.w[h][qq] = __ldg(reinterpret_cast<const uint2*>(q + 32 * qq));
      }
      t.s[h] = __ldg(reinterpret_cast<const uint2*>(a.s + int64_t(r0 + 8 * h) * srow + kt * 4));
      t.b[h] = __ldg(reinterpret_cast<const uint2*>(a.b + int64_t(r0 + 8 * h) * srow + kt * 4));
    }
  };
  float acc[NT][2];
#pragma unroll
  for (int p = 0; p < NT; ++p) acc[p][0] = acc[p][1] = 0.f;
  int grp = blockIdx.x, j = 0, par = 0;
  Tile t0, t1;
  load(t0, grp, 0);
  auto nxt = [&](int& gg, int& jj) {
    if (++jj == iters) {
      jj = 0;
      gg += gridDim.x;
    }
  };
  {
    int g2 = grp, j2 = j;
    nxt(g2, j2);
    load(t1, g2, j2);
  }
  bool loaded = true;
  // (the first two k-tiles' weights are requested before the wait for the previous kernel, as gemv_rows does)
  lilac::cuda::dev::pdl_wait();
  lilac::cuda::dev::pdl_trigger();
  // the input tile's present rows (absent rows read the zero group)
  for (int i = threadIdx.x; i < nt * RS / 16; i += blockDim.x)
    lilac::cuda::dev::cp_async16(xs + 16 * i, a.xs + int64_t(tok0) * RS + 16 * i);
  for (int i = threadIdx.x; i < MT * ng; i += blockDim.x)
    meta[i] = i / ng < nt ? a.meta[int64_t(tok0) * ng + i] : make_float2(0.f, 0.f);
  for (int i = threadIdx.x; i < 16; i += blockDim.x) reinterpret_cast<uint4*>(zero)[i] = make_uint4(0, 0, 0, 0);
  lilac::cuda::dev::cp_async_wait_all();
  // this lane's B units of tile p: group G at xb0[p] + G·gst[p]
  const char* xb0[NT];
  int gst[NT];
#pragma unroll
  for (int p = 0; p < NT; ++p) {
    const bool on = 4 * p + (g >> 1) < nt;
    xb0[p] = (on ? xs + (4 * p + (g >> 1)) * RS : zero) + (c * 2 + (g & 1)) * 16;
    gst[p] = on ? 256 : 0;
  }
  __syncthreads();

  auto step = [&](const Tile& cur, Tile& nx) {
    if (grp >= ngrp) return false;
    int gn = grp, jn = j;
    nxt(gn, jn);
    if (!loaded) load(nx, gn, jn);
    loaded = false;
    const int kt = ks + j * KS;
    if (kt < KT) {
      uint2 wv[2][4];
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          if constexpr (L16) {  // lanes 0,1 keep their first 8 bytes (group 2i), 2,3 their last (group 2i+1)
            const bool lo = c < 2;
            const uint2 f = cur.w[h][2 * i], l = cur.w[h][2 * i + 1];
            const uint2 snd = lo ? l : f;
            const uint2 rcv =
                make_uint2(__shfl_xor_sync(0xffffffffu, snd.x, 2), __shfl_xor_sync(0xffffffffu, snd.y, 2));
            wv[h][2 * i] = lo ? f : rcv;
            wv[h][2 * i + 1] = lo ? rcv : l;
          } else {
            wv[h][2 * i] = cur.w[h][2 * i];
            wv[h][2 * i + 1] = cur.w[h][2 * i + 1];
          }
        }
#pragma unroll
      for (int qq = 0; qq < 4; ++qq) {
        const int G = kt * 4 + qq;
        uint32_t A0[4], A1[4], B0[4], B1[4];
        dq4(wv[0][qq].x, A0);
        dq4(wv[1][qq].x, A1);
        dq4(wv[0][qq].y, B0);
        dq4(wv[1][qq].y, B1);
        const float s0 = bfq(cur.s[0], qq), s1 = bfq(cur.s[1], qq);
        const float c0 = fmaf(8.f, s0, bfq(cur.b[0], qq)), c1 = fmaf(8.f, s1, bfq(cur.b[1], qq));
#pragma unroll
        for (int p = 0; p < NT; ++p) {
          const char* xb = xb0[p] + G * gst[p];
          const uint4 b0 = *reinterpret_cast<const uint4*>(xb), b1 = *reinterpret_cast<const uint4*>(xb + 128);
          float d0[4] = {0.f, 0.f, 0.f, 0.f}, d1[4] = {0.f, 0.f, 0.f, 0.f};
          mma_m16n8k16_f16(d0, A0[0], A1[0], A0[1], A1[1], b0.x, b0.y);
          mma_m16n8k16_f16(d1, A0[2], A1[2], A0[3], A1[3], b0.z, b0.w);
          mma_m16n8k16_f16(d0, B0[0], B1[0], B0[1], B1[1], b1.x, b1.y);
          mma_m16n8k16_f16(d1, B0[2], B1[2], B0[3], B1[3], b1.z, b1.w);
          const float dot0 = (d0[0] + d0[1]) + (d1[0] + d1[1]), dot1 = (d0[2] + d0[3]) + (d1[2] + d1[3]);
          const float2 m = meta[(4 * p + c) * ng + G];
          acc[p][0] += fmaf(s0 * m.x, dot0, c0 * m.y);
          acc[p][1] += fmaf(s1 * m.x, dot1, c1 * m.y);
        }
      }
    }
    if (jn == 0) {  // end of the group
#pragma unroll
      for (int p = 0; p < NT; ++p) {
        part[par][warp][(4 * p + c) * 16 + g] = acc[p][0];
        part[par][warp][(4 * p + c) * 16 + g + 8] = acc[p][1];
        acc[p][0] = acc[p][1] = 0.f;
      }
      __syncthreads();
      for (int e = threadIdx.x; e < nt * RB * 16; e += blockDim.x) {
        const int tk = e / (RB * 16), rem = e % (RB * 16), rb = rem / 16, rr = rem % 16;
        const int n = (grp * RB + rb) * 16 + rr;
        if (n < a.rows) {
          float v = 0.f;
#pragma unroll
          for (int s2 = 0; s2 < KS; ++s2) v += part[par][rb * KS + s2][tk * 16 + rr];
          a.y[int64_t(tok0 + tk) * a.rows + n] = v;
        }
      }
      par ^= 1;
    }
    grp = gn;
    j = jn;
    return true;
  };
  while (step(t0, t1) && step(t1, t0)) {
  }
}

// fp32 reference: y[m][n] = Σ_k (s·q + b)·x, in double
__global__ void ref_kernel(Args a, const float* x, float* y) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x, m = blockIdx.y;
  if (n >= a.rows) return;
  const int ng = a.cols / 64;
  double acc = 0;
  for (int k = 0; k < a.cols; ++k) {
    const unsigned char byte = reinterpret_cast<const unsigned char*>(a.q)[int64_t(n) * (a.cols / 2) + k / 2];
    const int qv = (k & 1) ? (byte >> 4) : (byte & 15);
    const float s = __uint_as_float(uint32_t(a.s[int64_t(n) * ng + k / 64]) << 16);
    const float b = __uint_as_float(uint32_t(a.b[int64_t(n) * ng + k / 64]) << 16);
    acc += double(s * qv + b) * x[int64_t(m) * a.cols + k];
  }
  y[int64_t(m) * a.rows + n] = float(acc);
}

unsigned short bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<unsigned short>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

template <int KS, int NT, bool L16, int MB>
void launch(const Args& a, cudaStream_t st) {
  constexpr int MT = 4 * NT, RB = 8 / KS;
  const int ng = a.cols / 64;
  const size_t smem = size_t(MT) * ng * 256 + size_t(MT) * ng * 8 + 256;
  static size_t set = 0;
  if (smem > set) {  // (first call of each shape: outside the graph capture)
    CK(cudaFuncSetAttribute(gemv4<KS, NT, L16, MB>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    set = smem;
  }
  int occ = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, gemv4<KS, NT, L16, MB>, 256, smem));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int tiles = (a.M + MT - 1) / MT;
  const int ngrp = (a.rows / 16 + RB - 1) / RB;
  const int gx = std::max(1, std::min(ngrp, sms * std::max(occ, 1) / tiles));
  lilac::cuda::launch_pdl(gemv4<KS, NT, L16, MB>, dim3(gx, tiles), dim3(256), smem, st, a);
}

template <int NT, bool L16, int MB = 2>
void launch_nt(int KS, const Args& a, cudaStream_t st) {
  switch (KS) {
    case 1: launch<1, NT, L16, MB>(a, st); break;
    case 2: launch<2, NT, L16, MB>(a, st); break;
    case 4: launch<4, NT, L16, MB>(a, st); break;
    default: launch<8, NT, L16, MB>(a, st); break;
  }
}

}  // namespace

int main() {
  struct Shape {
    const char* name;
    int rows, cols;
  };
  const Shape shapes[] = {{"gdn_in_proj", 12352, 2048}, {"gdn_out_proj", 2048, 4096}, {"attn_qkv", 9216, 2048},
                          {"lm_head", 248320, 2048}};
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::mt19937 rng(1234);
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  for (const Shape& sh : shapes) {
    const int64_t qb = int64_t(sh.rows) * sh.cols / 2, sb = int64_t(sh.rows) * (sh.cols / 64);
    const int copies = int(std::max<int64_t>(2, (256ll << 20) / (qb + 4 * sb)));
    std::vector<uint32_t> hq(static_cast<size_t>(qb / 4));
    std::vector<unsigned short> hs(static_cast<size_t>(sb)), hb(static_cast<size_t>(sb));
    for (auto& v : hq) v = rng();
    std::normal_distribution<float> nd(0.f, 1.f);
    for (size_t i = 0; i < hs.size(); ++i) {
      hs[i] = bf16(0.01f + 0.01f * std::fabs(nd(rng)));
      hb[i] = bf16(-0.08f + 0.01f * nd(rng));
    }
    char* dq;
    unsigned short *ds, *db;
    CK(cudaMalloc(&dq, qb * copies));
    CK(cudaMalloc(&ds, sb * 2 * copies));
    CK(cudaMalloc(&db, sb * 2 * copies));
    for (int cpy = 0; cpy < copies; ++cpy) {
      CK(cudaMemcpy(dq + qb * cpy, hq.data(), qb, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(ds + sb * cpy, hs.data(), sb * 2, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(db + sb * cpy, hb.data(), sb * 2, cudaMemcpyHostToDevice));
    }
    const int nrb = sh.rows / 16, KT = sh.cols / 256;
    int KS = 1;
    while (KS < 8 && KS < KT && int64_t(nrb) * KS < int64_t(sms) * 3 * 8) KS *= 2;
    for (int M : {1, 4, 16, 64}) {
      if (sh.rows > 100000 && M == 4) continue;
      std::vector<float> hx(size_t(M) * sh.cols);
      for (auto& v : hx) v = nd(rng);
      float *dx, *dy, *dref;
      char* dxs;
      float2* dmeta;
      const int ng = sh.cols / 64;
      CK(cudaMalloc(&dx, hx.size() * 4));
      CK(cudaMalloc(&dy, size_t(M) * sh.rows * 4));
      CK(cudaMalloc(&dref, size_t(M) * sh.rows * 4));
      CK(cudaMalloc(&dxs, size_t(M) * ng * 256));
      CK(cudaMalloc(&dmeta, size_t(M) * ng * 8));
      CK(cudaMemcpy(dx, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
      Args a{dq, ds, db, sh.rows, sh.cols, dxs, dmeta, M, dy};
      ref_kernel<<<dim3((sh.rows + 127) / 128, M), 128, 0, st>>>(a, dx, dref);
      for (int cfg = 0; cfg < 8; ++cfg) {  // 6, 7: one tile at 3 blocks per SM (85 registers)
        const int NT = cfg >= 6 ? 1 : 1 << (cfg % 3);
        const bool l16 = cfg >= 3 && cfg != 6;
        const bool mb3 = cfg >= 6;
        if (mb3 && M > 4) continue;
        if (size_t(4 * NT) * ng * 264 + 256 > 220 * 1024) continue;
        stage4<<<(M * ng * 4 + 255) / 256, 256, 0, st>>>(dx, M, sh.cols, dxs, dmeta, l16);
        if ((NT == 4 && M < 16) || (NT > 1 && M == 1)) continue;
        // PROTO_ONE="name,M,NT": that case only, one launch, no timing (for Nsight Compute)
        const char* one = std::getenv("PROTO_ONE");
        char want[96];
        std::snprintf(want, sizeof want, "%s,%d,%d,%d%s", sh.name, M, NT, int(l16), mb3 ? ",3" : "");
        if (one && std::strcmp(one, want) != 0) continue;
        auto run = [&](int cpy) {
          Args b = a;
          b.q = dq + qb * cpy;
          b.s = ds + sb * cpy;
          b.b = db + sb * cpy;
          if (mb3)
            l16 ? launch_nt<1, true, 3>(KS, b, st) : launch_nt<1, false, 3>(KS, b, st);
          else if (NT == 1)
            l16 ? launch_nt<1, true>(KS, b, st) : launch_nt<1, false>(KS, b, st);
          else if (NT == 2)
            l16 ? launch_nt<2, true>(KS, b, st) : launch_nt<2, false>(KS, b, st);
          else
            l16 ? launch_nt<4, true>(KS, b, st) : launch_nt<4, false>(KS, b, st);
        };
        CK(cudaMemsetAsync(dy, 0xFF, size_t(M) * sh.rows * 4, st));
        run(0);
        CK(cudaStreamSynchronize(st));
        std::vector<float> y(size_t(M) * sh.rows), r(y.size());
        CK(cudaMemcpy(y.data(), dy, y.size() * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(r.data(), dref, r.size() * 4, cudaMemcpyDeviceToHost));
        if (one) continue;
        double num = 0, den = 0;
        for (size_t i = 0; i < y.size(); ++i) {
          num += (double(y[i]) - r[i]) * (double(y[i]) - r[i]);
          den += double(r[i]) * r[i];
        }
        const double us = proto::graph_us(st, [&](int i) { run(i % copies); });
        std::printf("%s M=%d NT=%d KS=%d %s%s: %.1f us  rel_err %.2e\n", sh.name, M, NT, KS, l16 ? "ld16+xchg" : "ld8",
                    mb3 ? " 3/SM" : "",
                    us, std::sqrt(num / den));
      }
      cudaFree(dx), cudaFree(dy), cudaFree(dref), cudaFree(dxs), cudaFree(dmeta);
    }
    cudaFree(dq), cudaFree(ds), cudaFree(db);
  }
  return 0;
}
