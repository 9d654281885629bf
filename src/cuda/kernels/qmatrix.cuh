// Device-side view of an affine-quantized matrix, in the checkpoint's own (MLX) layout:
// qweight u32 [rows, cols*bits/32] (element 0 of each word in the low bits), scales / biases bf16
// [rows, cols/group]. Shared by every kernel family (decode GEMV, prefill GEMM, experts).
#pragma once
#include <cstdint>
#include <cuda_bf16.h>

namespace lilac::cuda {

struct QMatrixDev {
  int64_t rows = 0, cols = 0;
  int bits = 4;             // 4 or 8
  int group_size = 64;
  const uint32_t* qweight = nullptr;
  const __nv_bfloat16* scales = nullptr;
  const __nv_bfloat16* biases = nullptr;

  __host__ __device__ int64_t words_per_row() const { return cols * bits / 32; }
  // (64, every checkpoint's group size so far, without a 64-bit division: kernels compute this per k-tile)
  __host__ __device__ int64_t groups_per_row() const { return group_size == 64 ? cols >> 6 : cols / group_size; }
};

// `n` matrices of one shape stored back to back (experts): matrix e starts e*rows rows further.
struct QExpertsDev {
  int n = 0;
  QMatrixDev first;
  __host__ __device__ QMatrixDev expert(int e) const {
    QMatrixDev m = first;
    m.qweight += int64_t(e) * m.rows * m.words_per_row();
    m.scales += int64_t(e) * m.rows * m.groups_per_row();
    m.biases += int64_t(e) * m.rows * m.groups_per_row();
    return m;
  }
};

}  // namespace lilac::cuda
