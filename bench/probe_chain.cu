// Probe of what one dependency costs in the decode step (not part of the build; bench/GPU_NOTES.md "Tenth stop"
// quotes its output). The step is a chain of ~255 (batch 1) to ~480 (rows step) launches, each depending on the one
// before through memory. Measured on this GPU:
//   (1) a CUDA graph of N kernels that do nothing but the dependency (block 0 reads the previous kernel's counter
//       and writes it + 1; every block waits for the previous kernel), launched with programmatic dependent launch
//       (PDL: pdl_wait / pdl_trigger as lilac's kernels call them) and without, for grids of 1 .. 1,056 blocks;
//   (2) the same dependencies inside one persistent kernel: N phases separated by a grid-wide barrier (an arrival
//       counter and a generation word, polled with ld.acquire), the alternative a persistent decode kernel pays.
// µs per dependency = graph (or kernel) time / N, the graph replayed 50 times after a warm-up.
// nvcc -O3 -std=c++20 -arch=sm_90a -I src bench/probe_chain.cu -o probe_chain
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#include "cuda/kernels/ptx.cuh"

// A failed CUDA call ends the probe with its name and the error.
static void ck(cudaError_t e, const char* call) {
  if (e == cudaSuccess) return;
  std::printf("%s: %s\n", call, cudaGetErrorString(e));
  std::exit(1);
}
#define CK(x) ck((x), #x)

using lilac::cuda::dev::pdl_trigger;
using lilac::cuda::dev::pdl_wait;

// One link: every block waits for the previous kernel; block 0 carries the value on.
__global__ void link_kernel(unsigned* ctr, int k) {
  pdl_wait();
  pdl_trigger();
  if (blockIdx.x == 0 && threadIdx.x == 0) ctr[(k + 1) & 1] = ctr[k & 1] + 1u;
}

// N phases over a co-resident grid: phase p's block 0 carries the value on, then every block arrives at the grid
// barrier (counter `arrive`, generation `gen`) and waits for the others.
__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__global__ void phases_kernel(unsigned* ctr, unsigned* arrive, unsigned* gen, int n) {
  for (int p = 0; p < n; ++p) {
    if (blockIdx.x == 0 && threadIdx.x == 0) ctr[(p + 1) & 1] = ctr[p & 1] + 1u;
    __syncthreads();
    if (threadIdx.x == 0) {
      const unsigned g = ld_acquire(gen);
      __threadfence();
      if (atomicAdd(arrive, 1u) == gridDim.x - 1) {
        *arrive = 0u;
        __threadfence();
        atomicAdd(gen, 1u);
      } else {
        while (ld_acquire(gen) == g) {
        }
      }
    }
    __syncthreads();
  }
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  unsigned *ctr = nullptr, *bar = nullptr;
  CK(cudaMalloc(&ctr, 2 * sizeof(unsigned)));
  CK(cudaMalloc(&bar, 2 * sizeof(unsigned)));
  CK(cudaMemset(ctr, 0, 2 * sizeof(unsigned)));
  CK(cudaMemset(bar, 0, 2 * sizeof(unsigned)));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const int N = 256, reps = 50;
  std::printf("launch chain: µs per dependent launch (graph of %d kernels, 256 threads per block)\n", N);
  std::printf("%8s %10s %10s\n", "blocks", "PDL", "plain");
  for (const int blocks : {1, 16, 132, 264, 528, 1056}) {
    float us[2];
    for (int pdl = 1; pdl >= 0; --pdl) {
      cudaGraph_t g;
      CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
      for (int k = 0; k < N; ++k) {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(blocks);
        cfg.blockDim = dim3(256);
        cfg.stream = s;
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = attr;
        cfg.numAttrs = pdl ? 1 : 0;
        CK(cudaLaunchKernelEx(&cfg, link_kernel, ctr, k));
      }
      CK(cudaStreamEndCapture(s, &g));
      cudaGraphExec_t ge;
      CK(cudaGraphInstantiate(&ge, g, 0));
      CK(cudaGraphLaunch(ge, s));
      CK(cudaStreamSynchronize(s));
      CK(cudaEventRecord(e0, s));
      for (int r = 0; r < reps; ++r) CK(cudaGraphLaunch(ge, s));
      CK(cudaEventRecord(e1, s));
      CK(cudaEventSynchronize(e1));
      float ms = 0.f;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      us[pdl] = 1000.f * ms / float(reps * N);
      CK(cudaGraphExecDestroy(ge));
      CK(cudaGraphDestroy(g));
    }
    std::printf("%8d %10.2f %10.2f\n", blocks, us[1], us[0]);
  }
  std::printf("persistent kernel: µs per grid barrier (%d phases)\n", N);
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, phases_kernel, 256, 0));
  for (const int blocks : {1, 16, 132, 264, 528}) {
    if (blocks > per_sm * sms) continue;
    phases_kernel<<<blocks, 256, 0, s>>>(ctr, bar, bar + 1, N);
    CK(cudaStreamSynchronize(s));
    CK(cudaEventRecord(e0, s));
    for (int r = 0; r < reps; ++r) phases_kernel<<<blocks, 256, 0, s>>>(ctr, bar, bar + 1, N);
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms = 0.f;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    std::printf("%8d %10.2f\n", blocks, 1000.f * ms / float(reps * N));
  }
  unsigned h[2];
  CK(cudaMemcpy(h, ctr, sizeof h, cudaMemcpyDeviceToHost));
  std::printf("counter %u (checks the chain ran)\n", h[0] > h[1] ? h[0] : h[1]);
  return 0;
}
