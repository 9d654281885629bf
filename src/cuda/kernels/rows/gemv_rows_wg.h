// The 4-bit dense rows GEMV on wgmma (gemv_rows_wg.cu), chosen by gemv_rows (rows_mm.h).
#pragma once
#include <cuda_runtime.h>

#include "cuda/kernels/rows/rows_mm.h"

namespace lilac::cuda::rows {

// Whether Auto may take the wgmma kernel at M rows (16..64, sm_90a code on a Hopper device, LILAC_ROWS_WGMMA != 0).
bool gemv_rows_wg_wanted(int M);
// Whether Auto takes it for W at M rows (given a staged frag4w): gemv_rows_wg_wanted(M) and a shape where it measured
// faster (gemv_rows_wg.cu). A rows step stages a projection's input in the frag4w layout too where this holds.
bool gemv_rows_wg_auto(const QMatrixDev& W, int M);
// Whether the wgmma kernel takes a: a.frag_wg staged, 4-bit W with K a multiple of 256 and aligned rows, scales and
// biases, 9..64 rows, sm_90a code on a Hopper device; unless forced (RowsGemvKernel::Wgmma), also gemv_rows_wg_auto.
bool gemv_rows_wg_applies(const GemvRowsArgs& a, bool forced);
// y (+)= W t(x) for the M staged rows with gemv_tc's k-slice count KS: the bits of the tiles kernel. At up to 16 rows a
// weight tile's slices are split over a 2-block cluster (LILAC_ROWS_WGMMA_SPLIT=0: not). From 49 rows
// (stream_input: from 33; LILAC_ROWS_WGS=0: never unless forced) the kernel that streams the input and dequantizes a
// weight tile once per 32 rows.
void gemv_rows_wg(const GemvRowsArgs& a, int KS, cudaStream_t stream, bool stream_input = false);

}  // namespace lilac::cuda::rows
