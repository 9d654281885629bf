// Launch-shape knobs of the multi-row kernels (host side), for measuring alternatives without rebuilding:
// LILAC_ROWS_TUNE="np=8,ksw=1,ring=6,moe_ring=8" (read once; unset or 0: the defaults chosen in the .cu files).
//   np        dense: most mma tiles (row pairs of 4-bit weights) per block: 1, 2, 4 or 8
//   ksw       dense: 1 = every warp walks whole rows (all k-slices), 2 = one k-slice per warp (gemv_tc's split)
//   ring      dense: weight-ring stages per warp (3..8)
//   moe_ring  MoE gate/up and down: weight-ring stages per warp (3..8)
//   moe_split MoE gate/up: 1 = a warp per item, 2 = a block per item (default: a block per item when the
//             items are fewer than half the warps)
//   pipe=reg  weights through registers (one tile in flight per warp, as gemv_tc) instead of the rings;
//   pipe=reg2 two tiles in flight
// The knobs change speed only: every choice computes the same bits.
#pragma once

namespace lilac::cuda::rows {

struct RowsTune {
  int np = 0, ksw = 0, ring = 0, moe_ring = 0;
  int moe_split = 0;
  int pipe = 0;  // 0: default, 1: rings, 2: registers, 3: registers two tiles ahead
};
const RowsTune& rows_tune();

}  // namespace lilac::cuda::rows
