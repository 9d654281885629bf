// gemv_rows' launch for many rows of matrices with many 16-row blocks (gemv_rows_wide.cu), used by gemv_rows.cu.
#pragma once
#include <cuda_runtime.h>

#include "cuda/kernels/rows/rows_mm.h"

namespace lilac::cuda::rows {

// Whether the wide launch takes these arguments and is the faster one (4-bit, M >= 16, enough row blocks).
bool rows_wide_applies(const GemvRowsArgs& a);
// KS: gemv_tc's k-slice count for the shape (gemv_rows.cu's rule).
void gemv_rows_wide(const GemvRowsArgs& a, int KS, cudaStream_t stream);

}  // namespace lilac::cuda::rows
