// 4-bit matrices on the integer tensor cores ("digits"): the LM head's kernels, for one row (decode, the MTP
// head) and for up to 64 rows (the rows step), computing the same bits for a row whatever M is.
//
// Arithmetic. Each input row's 64-group (after the RMSNorm) is scaled by the power of two 2^E > max|x| of the
// group and rounded to a 21-bit integer v (|v| <= 2^21), written as three signed base-256 digits. The weights'
// nibbles q (0..15) are the u8 A operand of mma.m16n8k32.u8.s8 as they are (no zero point, no fp16 conversion),
// the digits the s8 B operand (one n-tile per digit and 8 rows), so each group dot Σ q·v = (S0·256 + S1)·256 + S2
// is an exact int32 (|Σ q·v| <= 64·15·2^21 < 2^31). The float part per (output, row, group):
//   y = fma(scale, float(Σ q·v)·2^(E-21), y); y = fma(bias, Σx, y)
// in group order inside fixed 8-group slices, the slices' sums added in order from 0 (a slice's chain starts at
// 0). Nothing of it depends on M, on the row's place in the batch or on how a launch splits the rows, so a row's
// logits are the same bits alone and in any batch (tested by memcmp). Error against a double-precision product
// of the same RMSNorm output: ~3e-6 relative (rounding to 21 bits and the float fold; a plain fp32 chain ~1e-6).
//
// Weights are repacked at load into tile order (tiles_repack): per 16-row block and 64-group 512 bytes, lane l's
// 16 bytes being exactly its A fragments of the group's two k32 steps, and per (block, group) 16 words {bf16
// scale (low half), bf16 bias (high half)}; the same bytes per weight as the checkpoint's layout. Rows are padded
// to a multiple of 16 with zero weights (their outputs are never stored).
//
// Every launch is asynchronous on `stream`, allocates nothing, is CUDA-graph capturable and uses programmatic
// dependent launch (launch.cuh rules).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cuda_runtime.h>

#include "cuda/kernels/qmatrix.cuh"

namespace lilac::cuda::digits {

constexpr int kMaxRows = 64;
constexpr int kChunkRows = 32;  // rows per staged chunk (one GEMV launch covers rows of one chunk)

struct TilesDev {
  int64_t rows = 0, K = 0;
  const uint4* q = nullptr;      // [ceil(rows/16)][K/64][32 lanes] 16 bytes
  const uint32_t* sb = nullptr;  // [ceil(rows/16)][K/64][16] {scale, bias}
  explicit operator bool() const { return q != nullptr; }
};

// Whether W can take the tile layout: 4-bit, 64-column groups, 64 <= K <= kMaxK.
constexpr int64_t kMaxK = 2048;  // 8 rows of digits fit 99 KB of shared memory (sm_86 / sm_89)
bool tiles_supported(const QMatrixDev& W);
size_t tiles_q_bytes(const QMatrixDev& W);
size_t tiles_sb_bytes(const QMatrixDev& W);
// Writes W's tiles into q / sb (device buffers of tiles_*_bytes); W stays as it was.
void tiles_repack(const QMatrixDev& W, void* q, void* sb, cudaStream_t stream);

// The staged input of M <= kMaxRows rows of K columns: digits and per-group {2^(E-21), Σx}.
size_t stage_bytes(int64_t K, int M);
struct StageArgs {
  const float* x = nullptr;  // [M][ldx]
  int64_t ldx = 0;           // 0: K
  int64_t K = 0;             // multiple of 64, <= kMaxK
  int M = 0;
  const int32_t* row_slot = nullptr;  // row_slot[r] < 0: padding (nothing read; its outputs never stored)
  const float* norm_w = nullptr;      // RMSNorm weights [K]: x̃ = x · rsqrt(mean(x²) + eps) · w
  float eps = 1e-6f;
  void* buf = nullptr;  // stage_bytes(K, M)
};
void stage_rmsnorm(const StageArgs& a, cudaStream_t stream);

// y[r][n] = Σ_k W[n][k] · x̃_r[k] for the M staged rows (padding rows' outputs are not written).
struct GemvArgs {
  TilesDev W;
  const void* buf = nullptr;  // stage_rmsnorm's
  int M = 0;
  const int32_t* row_slot = nullptr;
  float* y = nullptr;  // [M][ldy]
  int64_t ldy = 0;     // 0: W.rows
  // Rows per launch (each launch streams the whole matrix once): 0 = the most (8, 16 or 32) whose digits fit
  // the device's shared memory, capped by LILAC_DIGITS_ROWS when set; 8 / 16 / 32 force a size (tests).
  int launch_rows = 0;
};
void gemv(const GemvArgs& a, cudaStream_t stream);

}  // namespace lilac::cuda::digits
