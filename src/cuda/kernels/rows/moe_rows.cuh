// Shared pieces of the multi-row MoE kernels (moe_route_rows.cu, moe_rows.cu): the scratch layout the
// routing writes and the expert kernels read, and the mapping of work items to chunks.
//
// Scratch (byte offsets from `scratch`, computed from the launch's M, so every launch of one step agrees):
//   hdr     int32[4]      {routed chunks, all chunks, entries, active rows}
//   chunks  int4[M·k + M] {expert (E = the shared expert), first entry, rows, 0}: an expert's rows (ascending)
//                         cut into chunks of at most moe_chunk_rows(bits, M); the routed chunks by expert id,
//                         then the shared expert's chunks of all active rows
//   entries int32[M·k + M] (row << 8) | slot (slot j < k: the row's j-th choice; k: the shared expert)
//   pe      float[M][k + 1][H]  MoE down's expert sums P_e (slot j: the row's j-th choice; k: the shared expert),
//                               unweighted (rows_mm.h)
#pragma once
#include <cstddef>
#include <cstdint>

#include "cuda/kernels/gemv/gemv.h"

namespace lilac::cuda::rows_dev {

constexpr int kMoEMaxRows = 64;  // the routing keeps each expert's rows as one 64-bit mask
constexpr int kMoEOneTileM = 32;  // up to this M, 4-bit chunks hold one mma tile (moe_chunk_rows)

struct MoEScratch {
  int32_t* hdr;
  int4* chunks;
  int32_t* entries;
  float* pe;
};
__host__ __device__ inline size_t moe_align(size_t b) { return (b + 255) / 256 * 256; }
__host__ __device__ inline MoEScratch moe_carve(void* base, const MoEDecodeWeights& w, int M) {
  char* p = static_cast<char*>(base);
  const size_t nent = size_t(M) * (w.top_k + 1);
  MoEScratch s;
  s.hdr = reinterpret_cast<int32_t*>(p);
  p += 256;
  s.chunks = reinterpret_cast<int4*>(p);
  p += moe_align(nent * sizeof(int4));
  s.entries = reinterpret_cast<int32_t*>(p);
  p += moe_align(nent * sizeof(int32_t));
  s.pe = reinterpret_cast<float*>(p);
  return s;
}
__host__ __device__ inline size_t moe_scratch_size(const MoEDecodeWeights& w, int M) {
  const size_t nent = size_t(M) * (w.top_k + 1);
  return 256 + moe_align(nent * sizeof(int4)) + moe_align(nent * sizeof(int32_t)) +
         moe_align(size_t(M) * (w.top_k + 1) * w.down.first.rows * sizeof(float));
}

}  // namespace lilac::cuda::rows_dev
