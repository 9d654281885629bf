// Probe (issue 11): does Hopper's wgmma (A from registers, B from shared memory) accumulate fp16 products into fp32
// bit for bit as mma.sync m16n8k16 does? The decode GEMVs' group layout (src/cuda/kernels/tc_g4.cuh) computes a
// group's dot as two chains of two m16n8k16 mmas (d0 = mma 0 then 2, d1 = mma 1 then 3) over 4-bit weights (q - 8,
// exact in fp16) and the input's hi / lo fp16 parts. A multi-row kernel on wgmma (N = input rows × {hi, lo}) can
// keep the batched rows bitwise equal to the single row only if every k16 step gives the same fp32 bits.
//
// Each block: a 64-row × 64-k weight group (one per warp: 16 rows, mma.sync's A fragments, reused as wgmma's A) and
// N = 64 columns (32 input rows × hi/lo) of inputs spanning many exponents; both paths' d0 / d1 written out and
// compared bit for bit on the host. Build:
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -o probe_wgmma_exact bench/probe_wgmma_exact.cu
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

constexpr int N = 64;      // B columns
constexpr int KG = 64;     // one 64-group of k
constexpr int NACC = N / 2;  // wgmma m64n64: 32 accumulators per thread

__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint64_t desc128(uint32_t saddr) {  // K-major, 128-byte swizzle, SBO 1024
  return uint64_t((saddr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

__device__ __forceinline__ void wgmma_rs_f16_n64(float* d, const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
      "%23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, 1, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

// W: [block][64 rows][64 k] fp16 bits; X: [block][N cols][64 k] fp16 bits.
// out_ref / out_wg: [block][2 chains][64 rows][N] floats.
__global__ void __launch_bounds__(128) probe(const uint16_t* W, const uint16_t* X, float* out_ref, float* out_wg) {
  __shared__ __align__(1024) uint16_t bs[N * KG];  // N rows of 128 bytes, 128B-swizzled
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
  const uint16_t* w = W + size_t(blockIdx.x) * 64 * KG;
  const uint16_t* x = X + size_t(blockIdx.x) * N * KG;
  for (int i = tid; i < N * KG / 8; i += 128) {  // 16-byte chunk i: row n = i / 8, chunk q = i % 8
    const int n = i / 8, q = i % 8;
    *reinterpret_cast<uint4*>(reinterpret_cast<char*>(bs) + n * 128 + ((q ^ (n % 8)) * 16)) =
        *reinterpret_cast<const uint4*>(x + n * KG + q * 8);
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  auto pair = [](uint16_t lo, uint16_t hi) { return uint32_t(lo) | uint32_t(hi) << 16; };
  // A fragments of the 4 k16 steps for rows 16·warp + g (+8)
  uint32_t A[4][4];
  const int r0 = 16 * warp + g, r1 = r0 + 8;
  for (int s = 0; s < 4; ++s) {
    const int k0 = 16 * s + 2 * c, k1 = k0 + 8;
    A[s][0] = pair(w[r0 * KG + k0], w[r0 * KG + k0 + 1]);
    A[s][1] = pair(w[r1 * KG + k0], w[r1 * KG + k0 + 1]);
    A[s][2] = pair(w[r0 * KG + k1], w[r0 * KG + k1 + 1]);
    A[s][3] = pair(w[r1 * KG + k1], w[r1 * KG + k1 + 1]);
  }
  // mma.sync: per n8 block j, chains d0 = s0, s2 and d1 = s1, s3 (tc_g4.cuh's g4_dots)
  float* oref = out_ref + size_t(blockIdx.x) * 2 * 64 * N;
  for (int j = 0; j < N / 8; ++j) {
    const int n = 8 * j + g;
    float d[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
    for (int s = 0; s < 4; ++s) {
      const int k0 = 16 * s + 2 * c, k1 = k0 + 8;
      mma16816(d[s & 1], A[s], pair(x[n * KG + k0], x[n * KG + k0 + 1]), pair(x[n * KG + k1], x[n * KG + k1 + 1]));
    }
    for (int ch = 0; ch < 2; ++ch) {
      oref[(ch * 64 + r0) * N + 8 * j + 2 * c] = d[ch][0];
      oref[(ch * 64 + r0) * N + 8 * j + 2 * c + 1] = d[ch][1];
      oref[(ch * 64 + r1) * N + 8 * j + 2 * c] = d[ch][2];
      oref[(ch * 64 + r1) * N + 8 * j + 2 * c + 1] = d[ch][3];
    }
  }
  // wgmma: the same chains, B from shared memory (k16 step s at +32·s bytes inside the swizzle atom)
  float acc[2][NACC];
  for (int ch = 0; ch < 2; ++ch)
    for (int i = 0; i < NACC; ++i) acc[ch][i] = 0.f;
  const uint32_t sb = uint32_t(__cvta_generic_to_shared(bs));
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
  wgmma_rs_f16_n64(acc[0], A[0], desc128(sb + 0 * 32));
  wgmma_rs_f16_n64(acc[1], A[1], desc128(sb + 1 * 32));
  wgmma_rs_f16_n64(acc[0], A[2], desc128(sb + 2 * 32));
  wgmma_rs_f16_n64(acc[1], A[3], desc128(sb + 3 * 32));
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  float* owg = out_wg + size_t(blockIdx.x) * 2 * 64 * N;
  for (int ch = 0; ch < 2; ++ch)
    for (int j = 0; j < N / 8; ++j) {
      owg[(ch * 64 + r0) * N + 8 * j + 2 * c] = acc[ch][4 * j + 0];
      owg[(ch * 64 + r0) * N + 8 * j + 2 * c + 1] = acc[ch][4 * j + 1];
      owg[(ch * 64 + r1) * N + 8 * j + 2 * c] = acc[ch][4 * j + 2];
      owg[(ch * 64 + r1) * N + 8 * j + 2 * c + 1] = acc[ch][4 * j + 3];
    }
}

static uint16_t h16(float f) {
  __half h = __float2half_rn(f);
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}
static float f16(uint16_t u) {
  __half h;
  std::memcpy(&h, &u, 2);
  return __half2float(h);
}

int main(int argc, char** argv) {
  const int blocks = argc > 1 ? std::atoi(argv[1]) : 4096;
  std::mt19937_64 rng(12345);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_int_distribution<int> q16(0, 15), expd(-12, 12), mode(0, 3);
  std::vector<uint16_t> W(size_t(blocks) * 64 * KG), X(size_t(blocks) * N * KG);
  for (auto& v : W) v = h16(float(q16(rng) - 8));
  // inputs as the staging makes them: per input row and group, v = x·2^-E with E the exponent of max|x|, hi =
  // fp16(v), lo = fp16(v − hi); columns 2r (hi) and 2r + 1 (lo) of input row r
  for (int b = 0; b < blocks; ++b)
    for (int r = 0; r < N / 2; ++r) {
      float xv[KG];
      const int m = mode(rng);
      for (int k = 0; k < KG; ++k) {
        float v = nd(rng);
        if (m == 1) v *= std::ldexp(1.f, expd(rng));  // wide exponent spread inside the group
        if (m == 2 && k % 7 == 0) v *= 300.f;         // outliers
        if (m == 3) v = 1.f + 1e-3f * nd(rng);        // near-equal values (cancellation against q − 8)
        xv[k] = v;
      }
      float mx = 0.f;
      for (float v : xv) mx = std::fmax(mx, std::fabs(v));
      int E;
      std::frexp(mx, &E);
      for (int k = 0; k < KG; ++k) {
        const float v = std::ldexp(xv[k], -E);
        const uint16_t hi = h16(v), lo = h16(v - f16(hi));
        X[(size_t(b) * N + 2 * r) * KG + k] = hi;
        X[(size_t(b) * N + 2 * r + 1) * KG + k] = lo;
      }
    }
  uint16_t *dW, *dX;
  float *dR, *dG;
  const size_t nout = size_t(blocks) * 2 * 64 * N;
  cudaMalloc(&dW, W.size() * 2);
  cudaMalloc(&dX, X.size() * 2);
  cudaMalloc(&dR, nout * 4);
  cudaMalloc(&dG, nout * 4);
  cudaMemcpy(dW, W.data(), W.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dX, X.data(), X.size() * 2, cudaMemcpyHostToDevice);
  probe<<<blocks, 128>>>(dW, dX, dR, dG);
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    std::printf("CUDA error: %s\n", cudaGetErrorString(e));
    return 2;
  }
  std::vector<float> R(nout), G(nout);
  cudaMemcpy(R.data(), dR, nout * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(G.data(), dG, nout * 4, cudaMemcpyDeviceToHost);
  size_t diff = 0, shown = 0;
  double maxrel = 0.0;
  for (size_t i = 0; i < nout; ++i) {
    if (std::memcmp(&R[i], &G[i], 4) != 0) {
      ++diff;
      const double rel = std::fabs(double(R[i]) - double(G[i])) / std::fmax(1e-30, std::fabs(double(R[i])));
      maxrel = std::fmax(maxrel, rel);
      if (shown++ < 8) std::printf("  differs at %zu: mma.sync %.9g wgmma %.9g\n", i, R[i], G[i]);
    }
  }
  std::printf("wgmma vs mma.sync (f16, fp32 accumulate, chains of 2 k16 steps): %zu of %zu accumulators differ "
              "(max rel %.3g)\n", diff, nout, maxrel);
  return diff == 0 ? 0 : 1;
}
