// The fast CPU path's integer kernels: the interface every ISA implements (one translation unit per
// ISA, compiled with its own target flags: kernels_scalar.cpp, kernels_avx2.cpp, kernels_avx512.cpp,
// kernels_neon.cpp). Plain structs and function pointers only: an ISA file must not instantiate
// templates or inline functions shared with other files (the linker could keep its copy, built for
// the wider ISA, for everyone).
//
// Weights (PackedMatrix): the MLX affine 4/8-bit matrix repacked at load (pack.h) into tiles of R
// consecutive rows (R = the kernel set's rows_per_tile, 8 or 16) and blocks of 64 columns. One
// (tile, block) is `block_bytes` contiguous bytes: the quants, then R bf16 scales, then R bf16 biases.
//   4-bit: 8 chunks of R x 4 bytes; chunk c holds row r's bytes 4c..4c+3 at [c][r][0..3]; byte j of a
//          row's 32 holds element j in its low nibble and element j + 32 in its high nibble.
//   8-bit: 16 chunks of R x 4 bytes; chunk c holds row r's elements 4c..4c+3 (one byte each).
// Rows past `rows` (the last tile's padding) have zero quants, scales and biases.
//
// Activations (QActs): n rows of K values quantized per block of 64 to int8 in [-127, 127] with a float
// scale d (x ≈ d q), plus the exact fp32 sum of the block's values (for the affine bias term) and the
// sum of the block's quantization residual, rsum = Σ_j (x_j − x̂_j) (x̂ the value the levels represent).
// Optionally a second level quantizes the residual the same way (x ≈ d q + d2 q2: ~16-bit accuracy for
// two int8 dot products per weight, which cost no extra weight bandwidth).
//
// y[t][r] = Σ_b ( scale[r,b] (d[t,b] Σ_j q_w[r,j] q_x[t,j] [+ d2[t,b] Σ_j q_w[r,j] q2_x[t,j]]
//                             + mid · rsum[t,b])
//                 + bias[r,b] xsum[t,b] ), mid = the matrix's PackedMatrix::mid: the integer sums exact, the
// float terms of a block in that order (the parenthesis first). The mid · rsum term centres the weights
// for the residual: the product's error is scale Σ_j (q_w − mid)(x_j − x̂_j) instead of scale Σ_j q_w
// (x_j − x̂_j), ~2.6× smaller for weights quantized from a bell-shaped distribution (q_w near mid).
// Every token row is computed with the same operations whatever the other rows: results are
// batch-invariant (bit-identical per row for any n).
#pragma once
#include <cstddef>
#include <cstdint>

namespace lilac::cpufast {

constexpr int kBlock = 64;  // columns per quantization block (weights and activations)

struct PackedMatrix {
  int64_t rows = 0, cols = 0;
  int bits = 0;             // 4 or 8
  int R = 8;                // rows per tile
  int64_t tiles = 0;        // ceil(rows / R)
  int64_t blocks = 0;       // cols / 64
  int64_t block_bytes = 0;  // R * 64 * bits / 8 + 4 * R
  // The quants' mid level (see y below): 7.5 when every row came from a 4-bit matrix, 127.5 when every row
  // came from an 8-bit (or re-quantized) one, 0 for a stack of both (no centring).
  float mid = 0.f;
  const uint8_t* data = nullptr;  // [tiles][blocks][block_bytes]
};

struct QActs {
  int64_t n = 0, cols = 0, blocks = 0;
  int8_t* q = nullptr;   // [n][cols]
  float* d = nullptr;    // [n][blocks]
  float* sum = nullptr;  // [n][blocks]
  float* rsum = nullptr; // [n][blocks] Σ (x − x̂) per block
  int8_t* q2 = nullptr;  // second level [n][cols], or nullptr
  float* d2 = nullptr;   // [n][blocks]
};

// Helpers with internal linkage (static): each file gets its own copy, built with its own flags.
static inline int64_t tile_bytes(const PackedMatrix& W) { return W.blocks * W.block_bytes; }
static inline const int8_t* act_q(const QActs& X, int64_t t) { return X.q + t * X.cols; }
static inline const float* act_d(const QActs& X, int64_t t) { return X.d + t * X.blocks; }
static inline const float* act_sum(const QActs& X, int64_t t) { return X.sum + t * X.blocks; }
static inline const float* act_rsum(const QActs& X, int64_t t) { return X.rsum + t * X.blocks; }

static inline const int8_t* act_q2(const QActs& X, int64_t t) { return X.q2 + t * X.cols; }
static inline const float* act_d2(const QActs& X, int64_t t) { return X.d2 + t * X.blocks; }

struct KernelSet {
  const char* name;   // "scalar", "avx2", "avx512-vnni", "neon-dot"
  int rows_per_tile;  // R of the matrices these kernels read
  // Y[t * ldy + r] for rows r of tiles [tile0, tile1) (rows < W.rows only) and tokens t in [0, X.n).
  void (*gemm)(const PackedMatrix& W, int64_t tile0, int64_t tile1, const QActs& X, float* Y, int64_t ldy);
  // Dense fp32 helpers of the float parts. dot: Σ a_i b_i; axpy: y += a x; dot_f16 / axpy_f16: the same
  // with b / x IEEE half floats (the K/V cache).
  float (*dot)(const float* a, const float* b, int64_t n);
  void (*axpy)(float a, const float* x, float* y, int64_t n);
  float (*dot_f16)(const float* a, const uint16_t* b, int64_t n);
  void (*axpy_f16)(float a, const uint16_t* x, float* y, int64_t n);
  // Several rows at once, each with exactly the operations of the one-row helper (the same bits), so
  // that a caller may group rows for speed without changing a result: out[j] = dot(a, B + j ldb, n) for
  // j < m; y += p[j] (B + j ldb) for j = 0 .. m-1 in that order (as m calls of axpy). The attention
  // runs its K / V tiles through these (mixers.cpp).
  void (*dots)(const float* a, const float* B, int64_t ldb, int64_t m, int64_t n, float* out);
  void (*axpys)(const float* p, const float* B, int64_t ldb, int64_t m, float* y, int64_t n);
  // y[i] = the IEEE half x[i] as a float (exact).
  void (*f16_to_f32)(const uint16_t* x, float* y, int64_t n);
};

// The kernel sets compiled into this binary for this architecture (nullptr when not built here).
const KernelSet* kernels_scalar();
const KernelSet* kernels_avx2();
const KernelSet* kernels_avx512();
const KernelSet* kernels_neon();

}  // namespace lilac::cpufast
