// Affine 4/8-bit quantization in the MLX layout (MODEL.md): groups of `group` consecutive values
// along a row share a bf16 scale and bias; value = scale * q + bias; q packed into uint32 words,
// element 0 in the low bits.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "model/weights.h"

namespace lilac {

// q value j of a packed row.
inline uint32_t unpack_at(const uint32_t* row_words, int64_t j, int bits) {
  const int per = 32 / bits;
  return (row_words[j / per] >> ((j % per) * bits)) & ((1u << bits) - 1u);
}

// Packs n values (n a multiple of 32/bits, each < 2^bits) into n*bits/32 words.
void pack_bits(const uint8_t* q, int64_t n, int bits, uint32_t* words);
// Unpacks n values.
void unpack_bits(const uint32_t* words, int64_t n, int bits, uint8_t* q);

// Quantizes one group of n values with the rule of MODEL.md / oracle/make_fixture.py `quantize()`:
// in double, scale = bf16(f32(max(max - min) / (2^bits - 1), 1e-7)), bias = bf16(f32(min)),
// q = clamp(round_half_even((w - bias) / scale), 0, 2^bits - 1).
// One refinement: a group whose values already lie exactly on an affine bf16 grid
// (w = scale' * q + bias' for integer q in range) keeps that grid, even where the rule's scale or bias is
// another bf16 number (8-bit groups whose original scale rounded up or minimum rounded down in bf16). So re-quantizing a dequantized
// checkpoint reproduces it bit for bit at 4 and 8 bits; for any other values the rule's result is returned.
void quantize_group(const float* w, int n, int bits, uint16_t* scale_bf16, uint16_t* bias_bf16, uint8_t* q);

// Quantizes one row of `cols` values (cols a multiple of group and of 32/bits) into words, scales, biases.
void quantize_row(const float* w, int64_t cols, int bits, int group, uint32_t* words, uint16_t* scales,
                  uint16_t* biases);

// Element (r, c) of a matrix (quantized or dense) as float.
float dequantize_at(const QMatrix& m, int64_t r, int64_t c);
// Row r dequantized into out[cols].
void dequantize_row(const QMatrix& m, int64_t r, float* out);

// Memory for matrices made at load time (quantize-on-load, dense copies). Owned by ModelWeights::storage.
struct QBuffer {
  std::vector<uint32_t> qweight;
  std::vector<uint16_t> scales, biases;
  std::vector<float> dense;
};

// Quantizes `n_rows` rows of `cols` values; row r's values come from get_row(r, float* out).
// Returns a QMatrix [n_rows, cols] viewing `buf` (which is resized). Runs on several threads when large.
template <class GetRow>
QMatrix quantize_rows(int64_t n_rows, int64_t cols, int bits, int group, QBuffer& buf, GetRow&& get_row);

// Runs fn(begin, end) over [0, n) split across up to `threads` std::threads (0 = hardware concurrency).
void parallel_ranges(int64_t n, int64_t min_per_thread, const std::function<void(int64_t, int64_t)>& fn,
                     int threads = 0);

template <class GetRow>
QMatrix quantize_rows(int64_t n_rows, int64_t cols, int bits, int group, QBuffer& buf, GetRow&& get_row) {
  QMatrix m;
  m.rows = n_rows;
  m.cols = cols;
  m.bits = bits;
  m.group_size = group;
  const int64_t wpr = cols * bits / 32, gpr = cols / group;
  buf.qweight.assign(size_t(n_rows * wpr), 0);
  buf.scales.assign(size_t(n_rows * gpr), 0);
  buf.biases.assign(size_t(n_rows * gpr), 0);
  parallel_ranges(n_rows, std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(cols, 1)),
                  [&](int64_t b, int64_t e) {
                    std::vector<float> row(static_cast<size_t>(cols));
                    for (int64_t r = b; r < e; ++r) {
                      get_row(r, row.data());
                      quantize_row(row.data(), cols, bits, group, buf.qweight.data() + r * wpr,
                                   buf.scales.data() + r * gpr, buf.biases.data() + r * gpr);
                    }
                  });
  m.qweight = buf.qweight.data();
  m.scales = buf.scales.data();
  m.biases = buf.biases.data();
  return m;
}

}  // namespace lilac
