// Hardware probe for the multi-row kernels (not part of the build; bench/GPU_NOTES.md "Multi-row decode kernels"
// quotes its output): (1) mma.sync m16n8k16 f16→f32 throughput per SM with NA independent tile chains per warp
// and 8 / 16 / 32 warps per SM, register operands only; (2) streaming the weight pattern of one 16-row block
// (16 rows × 128 bytes per k-tile, rows 1 KB apart) through the warp rings of ring_rows.cuh at D stages, and
// through registers with R tiles in flight, with a trivial consumer: GB/s over a 2 GB buffer.
// nvcc -O3 -std=c++20 -arch=sm_90a -I src bench/probe_rows_hw.cu -o probe_rows_hw
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

#include "cuda/kernels/rows/ring_rows.cuh"

using namespace lilac::cuda::rows_dev;

#define CK(x)                                                              \
  do {                                                                     \
    cudaError_t e_ = (x);                                                  \
    if (e_ != cudaSuccess) {                                               \
      std::printf("%s: %s\n", #x, cudaGetErrorString(e_));                 \
      return 1;                                                            \
    }                                                                      \
  } while (0)

template <int NA>
__global__ void mma_probe(int iters, float* sink) {
  float d[NA][2][4] = {};
  uint32_t a = threadIdx.x * 0x10001u, b = blockIdx.x * 0x3C003C00u;
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int u = 0; u < 4; ++u)
#pragma unroll
      for (int p = 0; p < NA; ++p) {
        mma16816(d[p][0], a, a + 1, a + 2, a + 3, b, b + u);
        mma16816(d[p][1], a + 4, a + 5, a + 6, a + 7, b + p, b);
      }
  }
  float s = 0.f;
#pragma unroll
  for (int p = 0; p < NA; ++p)
#pragma unroll
    for (int z = 0; z < 4; ++z) s += d[p][0][z] + d[p][1][z];
  if (s == 1.2345f) sink[threadIdx.x] = s;
}

// One warp streams `steps` k-tiles: tile q of row block rb = (warp_global + q * nwarps_total) % nblocks at
// k-tile q % 8 of a [rows][1024 B] matrix; consumer: XOR of the 16-byte units.
__global__ void ring_probe(const char* base, int64_t nblocks, int steps, int D, uint32_t* sink) {
  extern __shared__ float4 smem4[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2;
  const int64_t wg = int64_t(blockIdx.x) * (blockDim.x >> 5) + warp, nw = int64_t(gridDim.x) * (blockDim.x >> 5);
  constexpr int STAGE = RingShape<4>::STAGE;
  int q_issue = 0;
  auto issue = [&](char* st) {
    if (q_issue >= steps) return;
    const int64_t rb = (wg + int64_t(q_issue) * nw) % nblocks;
    RowRef r[2];
    r[0].q = base + (rb * 16 + g) * 1024;
    r[1].q = base + (rb * 16 + g + 8) * 1024;
    RowRef sbr = r[0];
    ring_issue<4>(st, r, sbr, q_issue % 8, lane, 32, false);
    ++q_issue;
  };
  WarpRing ring{reinterpret_cast<char*>(smem4) + warp * D * STAGE, STAGE, D};
  ring.prologue(issue);
  uint32_t x = 0;
  for (int q = 0; q < steps; ++q) {
    const char* st = ring.step(issue);
    RowTile<4> t;
    ring_read<4>(t, st, lane, false);
    x ^= t.w[0][0].x ^ t.w[0][1].y ^ t.w[1][0].z ^ t.w[1][1].w;
  }
  cp_async_wait_all();
  if (x == 0x12345678u) sink[0] = x;
}

template <int R>
__global__ void __launch_bounds__(256, 1) ldg_probe(const char* base, int64_t nblocks, int steps, uint32_t* sink) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int64_t wg = int64_t(blockIdx.x) * (blockDim.x >> 5) + warp, nw = int64_t(gridDim.x) * (blockDim.x >> 5);
  auto load = [&](RowTile<4>& t, int q) {
    const int64_t rb = (wg + int64_t(q) * nw) % nblocks;
    RowRef r[2];
    r[0].q = base + (rb * 16 + g) * 1024;
    r[1].q = base + (rb * 16 + g + 8) * 1024;
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        t.w[h][i] = lilac::cuda::dev::ld_stream(reinterpret_cast<const uint4*>(r[h].q + (q % 8) * 128 + i * 64 + c * 16));
  };
  RowTile<4> buf[R];
#pragma unroll
  for (int k = 0; k < R; ++k) load(buf[k], k);
  uint32_t x = 0;
  for (int q = 0; q < steps; q += R) {
#pragma unroll
    for (int k = 0; k < R; ++k) {
      x ^= buf[k].w[0][0].x ^ buf[k].w[0][1].y ^ buf[k].w[1][0].z ^ buf[k].w[1][1].w;
      if (q + k + R < steps) load(buf[k], q + k + R);
    }
  }
  if (x == 0x12345678u) sink[0] = x;
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  int clk = 0;
  CK(cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0));
  std::printf("SMs %d, clock %d MHz\n", sms, clk / 1000);
  float* fsink;
  uint32_t* usink;
  CK(cudaMalloc(&fsink, 4096));
  CK(cudaMalloc(&usink, 4096));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  auto time_ms = [&](auto&& launch) {
    launch();
    cudaEventRecord(e0);
    for (int i = 0; i < 5; ++i) launch();
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    return ms / 5;
  };
  // (1) mma.sync throughput
  const int iters = 2000;
  for (int wps : {8, 16, 32}) {
    auto run = [&](auto kernel, int na) {
      const float ms = time_ms([&] { kernel<<<sms * (wps / 8), 256>>>(iters, fsink); });
      const double mmas = double(sms) * wps * iters * 4 * na * 2;
      const double clk_per_mma = (ms * 1e-3 * clk * 1e3 * sms) / mmas;
      std::printf("mma.sync m16n8k16 f32: %2d warps/SM, %d tiles/warp: %.2f SM clocks per mma (%.0f TFLOP/s)\n", wps, na,
                  clk_per_mma, mmas * 4096 / (ms * 1e-3) / 1e12);
    };
    run(mma_probe<1>, 1);
    run(mma_probe<4>, 4);
    run(mma_probe<8>, 8);
  }
  // (2) streaming
  const size_t bytes = size_t(2) << 30;
  char* buf;
  CK(cudaMalloc(&buf, bytes));
  CK(cudaMemset(buf, 1, bytes));
  const int64_t nblocks = int64_t(bytes / (16 * 1024));
  const int steps = 256;
  for (int bps : {1, 2}) {
    for (int D : {2, 3, 4, 6, 8}) {
      const size_t smem = size_t(8) * D * RingShape<4>::STAGE;
      if (smem * bps > 220 * 1024) continue;
      CK(cudaFuncSetAttribute(ring_probe, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
      const float ms = time_ms([&] { ring_probe<<<sms * bps, 256, smem>>>(buf, nblocks, steps, D, usink); });
      const double moved = double(sms) * bps * 8 * steps * 2048;
      std::printf("cp.async ring: %d blocks x 8 warps/SM, D %d: %.0f GB/s\n", bps, D, moved / (ms * 1e-3) / 1e9);
    }
  }
  for (int bps : {1, 2, 3}) {
    auto run = [&](auto kernel, int R) {
      const float ms = time_ms([&] { kernel<<<sms * bps, 256>>>(buf, nblocks, steps, usink); });
      const double moved = double(sms) * bps * 8 * steps * 2048;
      std::printf("registers: %d blocks x 8 warps/SM, %d tiles in flight: %.0f GB/s\n", bps, R, moved / (ms * 1e-3) / 1e9);
    };
    run(ldg_probe<1>, 1);
    run(ldg_probe<2>, 2);
    run(ldg_probe<4>, 4);
  }
  CK(cudaGetLastError());
  return 0;
}
