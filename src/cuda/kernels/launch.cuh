// Kernel launches for the decode step with programmatic dependent launch (PDL, sm_90+).
//
// A decode step is a chain of ~270 small dependent kernels. Launched with PDL, kernel N+1 is scheduled
// while kernel N still runs; it may read data that no kernel of the step writes (weights) before
// `pdl_wait()`, which returns once kernel N has completed and its memory is visible. Rules for every
// kernel launched through `launch_pdl`:
//   1. call `pdl_wait()` before its first read of an activation / state / cache and before its first
//      global write (a predecessor may still be reading what it overwrites);
//   2. call `pdl_trigger()` after `pdl_wait()` (never before): kernel N+2 then starts only once N has
//      passed its wait, i.e. once N-1 is complete, so whatever ran two launches back is complete too.
//      A block that exits counts as triggered, so a launch whose every block returns before its wait breaks
//      that chain: where a whole launch can have no work, its blocks wait before they return.
// One exception to rule 1: MoE down reads the expert ids that MoE gate/up's block 0 publishes (then
// fences) before its trigger, to request expert weights early; it reads them again after its wait and
// redoes that work if they changed, so a stale early read costs time, never correctness.
// Reads of what a kernel two or more launches back wrote are not an exception: it is complete (rule 2). The
// rows kernels use that for `row_slot` (gdn_step_rows prefetches the state) and for the MoE routing's chunk
// list (moe_down_rows requests its first expert tiles before its wait; it runs right after moe_gate_up_rows);
// attention_decode reads *pos and copies the K/V rows before it ahead of its wait (row pos, which its
// predecessor appends, after it).
// Kernels not launched through launch_pdl ignore both calls. LILAC_PDL=0 turns PDL off (plain
// stream order); devices below sm_90 never use it.
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "cuda/cuda_common.h"
#include "cuda/kernels/ptx.cuh"  // dev::pdl_wait, dev::pdl_trigger

namespace lilac::cuda {

// Whether the current device is sm_90 or later (PDL, thread-block clusters); read once.
bool sm90_or_later();
// Whether decode launches use PDL (device >= sm_90 and LILAC_PDL != 0); read once.
bool pdl_enabled();

// Multiprocessors of the current device (cached per device).
int sm_count();

// Blocks of `threads` threads and `smem` bytes of dynamic shared memory resident per SM for `kernel` (at least 1; also
// lifts the 48 KB dynamic shared memory cap for it).
template <typename Kern>
int resident_blocks(Kern kernel, int threads, size_t smem) {
  LILAC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  int occ = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, threads, smem) != cudaSuccess || occ < 1) {
    cudaGetLastError();
    occ = 1;
  }
  return occ;
}

// cluster_x > 1: thread-block clusters of cluster_x blocks along x (sm_90; grid.x a multiple of it).
template <typename... KArgs, typename... Args>
void launch_pdl_cluster(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                        unsigned cluster_x, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (pdl_enabled()) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster_x > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster_x;
    attr[n].val.clusterDim.y = 1;
    attr[n++].val.clusterDim.z = 1;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  LILAC_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

template <typename... KArgs, typename... Args>
void launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  launch_pdl_cluster(kernel, grid, block, smem, stream, 1u, std::forward<Args>(args)...);
}

}  // namespace lilac::cuda
