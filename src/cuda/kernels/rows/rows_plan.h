// Index plans of the multi-row kernels (attention_rows.cu, gdn_rows.cu), __host__ __device__ so that
// tests/cuda/test_rows_plan.cpp checks them on the host (no GPU needed).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace lilac::cuda::rows::plan {

constexpr int kGdnSliceCols = 16;  // state columns per GDN block

// attention_decode's split rule (attention_decode.cu) for a context of L >= 1 rows with at most W
// splits, splits of at least min_rows rows where possible: nsp splits of rps rows (a multiple of R;
// the last split shorter, none empty).
__host__ __device__ inline void split_plan(int64_t L, int W, int min_rows, int R, int& nsp, int64_t& rps) {
  const int64_t want = (L + min_rows - 1) / min_rows;
  int n = want < int64_t(W) ? int(want) : W;
  n = n > 1 ? n : 1;
  int64_t r = (L + n - 1) / n;
  r = (r + R - 1) / R * R;
  nsp = int((L + r - 1) / r);
  rps = r;
}

// Work items of the multi-row attention: row r's splits are items first[r] .. first[r+1]-1 (first[0] =
// 0, first[M] = all items; rows without items have first[r+1] == first[r]). The row of `item`
// (< first[M]), scanning forward from `row` (items visited in ascending order never move back).
__host__ __device__ inline int item_row(const int* first, int item, int row) {
  while (first[row + 1] <= item) ++row;
  return row;
}

// GDN block (value head h, column slice y): its block channel c in [0, 2 dk + 16) → the conv channel
// (index into [q Hk·dk | k Hk·dk | v Hv·dv]) or -1: c < dk the q channels of the key head, then its k
// channels, then the v channels of the slice's columns (those < dv). *own: this block is the one that
// writes the channel's conv state and log entry (q/k: slice 0 of the key head's first value head; v:
// the slice's block).
__host__ __device__ inline int gdn_block_channel(int Hk, int Hv, int dk, int dv, int h, int y, int c, bool* own) {
  const int ratio = Hv / Hk, kh = h / ratio;
  *own = false;
  if (c < 2 * dk) {
    *own = h % ratio == 0 && y == 0;
    return (c < dk ? 0 : Hk * dk) + kh * dk + (c < dk ? c : c - dk);
  }
  const int col = y * kGdnSliceCols + (c - 2 * dk);
  if (c < 2 * dk + kGdnSliceCols && col < dv) {
    *own = true;
    return 2 * Hk * dk + h * dv + col;
  }
  return -1;
}

}  // namespace lilac::cuda::rows::plan
