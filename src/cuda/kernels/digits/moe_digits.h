// The MoE on the digits arithmetic (digits.h explains it): routed gate/up with SwiGLU and down for one row (the
// decode step's moe_gate_up / moe_down, gemv.h) and for the rows step (rows_mm.h's launches 2 and 3), computing
// the same bits for a row whatever the batch. Opt-in (LILAC_DIGITS_MOE=1, MoEDecodeWeights::digits): the one-row
// kernels match the fp16 ones' speed, the rows kernels are still slower (bench/GPU_NOTES.md, "Fourteenth stop").
//
// Weights are read in the checkpoint's own layout (qmatrix.cuh; no repack, so the prefill kernels share them):
// lane (g8, c) of a 16-row tile takes 8 bytes of rows g8 and g8 + 8 of a 64-group (columns 16c..16c+15) and
// splits their nibbles into bytes as they are; the input's digits are stored in the matching order, so the
// mma's k index is a permutation of the group's columns and the group dot Σ q·v is the same exact int32.
//
// Input layout (per row, K columns, G = K / 64): digit l of group g at bytes [(l·G + g)·64, +64), column
// 8t' + 2i + p of the group (t' = 0..7, i = 0..3, p = 0..1) at byte 8t' + 4p + i; then, after all M rows'
// digits, {2^(E-21), Σx} per row and group (float2 [M][G]). rows::stage writes it (StageArgs::digits); the
// one-row kernels stage it in shared memory with the same arithmetic (the values t(x) as the fp16 staging
// computes them, the group's E and Σx from group_meta, tile::put_digits).
//
// The order that makes a row's bits independent of M:
//  gate/up: per output, the chain fold() over the groups in order inside 8-group slices from 0, the slices'
//           sums added in order from 0; act = silu(gate)·up;
//  down:    per output and expert (slot e), P_e = the sum from 0 of group_value() over the expert's groups in
//           order; then y += acc, acc = fmaf(w_e, P_e, acc) from 0 over e = 0..k (moe_combine_rows's order).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cuda_runtime.h>

#include "cuda/kernels/gemv/gemv.h"

namespace lilac::cuda::digits {

// 4-bit experts in 64-groups; hidden size <= 2048 (one row's digits and an item's 8 rows fit shared memory),
// I and Is multiples of 64, top_k + 1 <= 32.
bool moe_supported(const MoEDecodeWeights& w);
size_t moe_stage_bytes(int64_t K, int M);

// One row: routing (as moe_gate_up), RMSNorm, gate/up and SwiGLU into act [k·I + Is]; then down with the
// weighted combine added into y [H]. Same arguments and launch order as gemv.h's moe_gate_up / moe_down.
void moe_gate_up_one(const MoEDecodeWeights& w, const float* logits, const float* x, const float* norm_w, float eps,
                     int32_t* sel_ids, float* sel_w, float* act, cudaStream_t stream);
void moe_down_one(const MoEDecodeWeights& w, const int32_t* sel_ids, const float* sel_w, const float* act, float* y,
                  cudaStream_t stream);

// M rows, after rows::moe_route_rows with chunk_rows = kMoEChunk: xdig = the RMSNorm'd rows' digits
// (moe_stage_bytes(H, M)) → act [M][k·I + Is]; adig = act's digits (moe_stage_bytes(k·I + Is, M)) → the
// experts' sums P_e in the routing scratch, which rows::moe_combine_rows adds into y.
constexpr int kMoEChunk = 8;  // rows per chunk: one digit n-tile
void moe_gate_up_rows(const MoEDecodeWeights& w, const void* xdig, int M, const void* scratch, float* act,
                      cudaStream_t stream);
void moe_down_rows(const MoEDecodeWeights& w, const void* adig, int M, void* scratch, cudaStream_t stream);

}  // namespace lilac::cuda::digits
