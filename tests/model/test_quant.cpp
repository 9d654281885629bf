// Affine quantization helpers against hand-computed values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/bf16.h"
#include "core/error.h"
#include "model/quant.h"

namespace lilac {
namespace {

TEST(Quant, PackUnpack4And8Bit) {
  const uint8_t q4[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  uint32_t w = 0;
  pack_bits(q4, 8, 4, &w);
  EXPECT_EQ(w, 0x87654321u);  // element 0 in the low bits
  uint8_t back[8] = {};
  unpack_bits(&w, 8, 4, back);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(back[i], q4[i]);
  EXPECT_EQ(unpack_at(&w, 6, 4), 7u);

  const uint8_t q8[8] = {0x11, 0x22, 0x33, 0x44, 0xff, 0x00, 0x80, 0x01};
  uint32_t w8[2] = {};
  pack_bits(q8, 8, 8, w8);
  EXPECT_EQ(w8[0], 0x44332211u);
  EXPECT_EQ(w8[1], 0x018000ffu);
  EXPECT_EQ(unpack_at(w8, 4, 8), 0xffu);
  EXPECT_EQ(unpack_at(w8, 6, 8), 0x80u);
}

TEST(Quant, GroupRoundsHalfToEven4Bit) {
  // min 0, max 15 -> scale exactly 1, bias 0; halves round to even like torch.round.
  std::vector<float> w(64, 7.25f);
  w[0] = 0.0f;
  w[1] = 15.0f;
  w[2] = 0.5f;
  w[3] = 1.5f;
  w[4] = 2.5f;
  w[5] = 3.5f;
  w[6] = 14.5f;
  uint16_t s, b;
  std::vector<uint8_t> q(64);
  quantize_group(w.data(), 64, 4, &s, &b, q.data());
  EXPECT_EQ(bf16_to_f32(s), 1.0f);
  EXPECT_EQ(bf16_to_f32(b), 0.0f);
  const uint8_t expect[7] = {0, 15, 0, 2, 2, 4, 14};
  for (int i = 0; i < 7; ++i) EXPECT_EQ(q[i], expect[i]) << "element " << i;
  for (int i = 7; i < 64; ++i) EXPECT_EQ(q[i], 7) << "element " << i;
}

TEST(Quant, GroupScaleAndBiasRoundToBf16) {
  // w[i] = i / 4: min 0, max 15.75 -> (max - min) / 15 = 1.05 -> bf16 1.046875 (0x3F86); bias 0.
  // q[i] = round(0.25 i / 1.046875) = round(16 i / 67).
  std::vector<float> w(64);
  for (int i = 0; i < 64; ++i) w[i] = 0.25f * i;
  uint16_t s, b;
  std::vector<uint8_t> q(64);
  quantize_group(w.data(), 64, 4, &s, &b, q.data());
  EXPECT_EQ(s, 0x3F86);
  EXPECT_EQ(bf16_to_f32(s), 1.046875f);
  EXPECT_EQ(b, 0);
  EXPECT_EQ(q[2], 0);    // 0.478
  EXPECT_EQ(q[3], 1);    // 0.716
  EXPECT_EQ(q[10], 2);   // 2.388
  EXPECT_EQ(q[11], 3);   // 2.627
  EXPECT_EQ(q[63], 15);  // 15.04 -> clamped by round to 15
}

TEST(Quant, GroupNegativeBias8Bit) {
  // min -1, max 254 -> scale 255 / 255 = 1, bias -1. (-0.5 + 1) = 0.5 -> 0; (0.5 + 1) = 1.5 -> 2.
  std::vector<float> w(64, 10.0f);
  w[0] = -1.0f;
  w[1] = 254.0f;
  w[2] = -0.5f;
  w[3] = 0.5f;
  w[4] = 100.2f;
  uint16_t s, b;
  std::vector<uint8_t> q(64);
  quantize_group(w.data(), 64, 8, &s, &b, q.data());
  EXPECT_EQ(bf16_to_f32(s), 1.0f);
  EXPECT_EQ(bf16_to_f32(b), -1.0f);
  EXPECT_EQ(q[0], 0);
  EXPECT_EQ(q[1], 255);
  EXPECT_EQ(q[2], 0);
  EXPECT_EQ(q[3], 2);
  EXPECT_EQ(q[4], 101);  // 101.2
  EXPECT_EQ(q[5], 11);
}

TEST(Quant, ConstantGroupClampsScale) {
  // All equal: max - min = 0 -> scale clamped to 1e-7 -> bf16 1.6796875 * 2^-24; bias = bf16(3.3) =
  // 3.296875; (3.3 - 3.296875) / 1e-7 is huge -> q clamps to 15.
  std::vector<float> w(64, 3.3f);
  uint16_t s, b;
  std::vector<uint8_t> q(64);
  quantize_group(w.data(), 64, 4, &s, &b, q.data());
  EXPECT_EQ(bf16_to_f32(s), std::ldexp(1.6796875f, -24));
  EXPECT_EQ(bf16_to_f32(b), 3.296875f);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(q[i], 15);
}

TEST(Quant, RowAndDequantize) {
  // Two groups of 64 in one row: group 0 = i / 4 (as above), group 1 = -2 + i / 16 (scale 3.9375/15
  // = 0.2625 -> bf16 0.26171875 (0x3E86), bias -2).
  std::vector<float> w(128);
  for (int i = 0; i < 64; ++i) {
    w[i] = 0.25f * i;
    w[64 + i] = -2.0f + i / 16.0f;
  }
  std::vector<uint32_t> words(16);
  uint16_t sc[2], bi[2];
  quantize_row(w.data(), 128, 4, 64, words.data(), sc, bi);
  EXPECT_EQ(sc[0], 0x3F86);
  EXPECT_EQ(sc[1], 0x3E86);
  EXPECT_EQ(bf16_to_f32(bi[1]), -2.0f);
  QMatrix m;
  m.rows = 1;
  m.cols = 128;
  m.bits = 4;
  m.group_size = 64;
  m.qweight = words.data();
  m.scales = sc;
  m.biases = bi;
  // element 64+40: (40/16) / 0.26171875 = 9.55 -> q 10 -> -2 + 2.6171875 = 0.6171875
  EXPECT_EQ(dequantize_at(m, 0, 104), 0.6171875f);
  // element 11: q 3 -> 3.140625
  EXPECT_EQ(dequantize_at(m, 0, 11), 3.140625f);
  std::vector<float> row(128);
  dequantize_row(m, 0, row.data());
  EXPECT_EQ(row[104], 0.6171875f);
  EXPECT_EQ(row[11], 3.140625f);
  EXPECT_EQ(row[0], 0.0f);
  EXPECT_THROW(quantize_row(w.data(), 100, 4, 64, words.data(), sc, bi), Error);
}

TEST(Quant, QuantizeRowsMatchesQuantizeRow) {
  const int64_t rows = 37, cols = 192;
  std::vector<float> src(rows * cols);
  for (size_t i = 0; i < src.size(); ++i) src[i] = std::sin(0.37 * i) * (1 + i % 7);
  QBuffer buf;
  QMatrix m = quantize_rows(rows, cols, 8, 64, buf, [&](int64_t r, float* out) {
    std::copy(src.begin() + r * cols, src.begin() + (r + 1) * cols, out);
  });
  EXPECT_EQ(m.rows, rows);
  EXPECT_EQ(m.words_per_row(), cols / 4);
  std::vector<uint32_t> words(cols / 4);
  uint16_t sc[3], bi[3];
  for (int64_t r = 0; r < rows; ++r) {
    quantize_row(src.data() + r * cols, cols, 8, 64, words.data(), sc, bi);
    for (int64_t k = 0; k < cols / 4; ++k) ASSERT_EQ(m.qweight[r * cols / 4 + k], words[k]);
    for (int g = 0; g < 3; ++g) {
      ASSERT_EQ(m.scales[r * 3 + g], sc[g]);
      ASSERT_EQ(m.biases[r * 3 + g], bi[g]);
    }
    // Error bound of the rule: half a step, plus the bf16 rounding of the bias (min), plus up to 255
    // times the bf16 rounding of the scale (for values clamped at the top).
    for (int64_t c = 0; c < cols; ++c) {
      const int g = int(c / 64);
      double lo = 1e30, hi = -1e30;
      for (int k = 0; k < 64; ++k) {
        lo = std::min(lo, double(src[r * cols + g * 64 + k]));
        hi = std::max(hi, double(src[r * cols + g * 64 + k]));
      }
      const double s = bf16_to_f32(sc[g]), exact = (hi - lo) / 255;
      const double bound = 0.5 * s + std::fabs(bf16_to_f32(bi[g]) - lo) + 255 * std::fabs(s - exact) + 1e-6;
      ASSERT_LE(std::fabs(dequantize_at(m, r, c) - src[r * cols + c]), bound) << r << "," << c;
    }
  }
}

}  // namespace
}  // namespace lilac

namespace lilac {
namespace {

// A group that already lies on an 8-bit bf16 grid whose largest value sits at q = 254 (as happens when
// bf16 rounded the original scale up): the rule's own scale, bf16((max - min) / 255), is a different
// bf16 number, yet quantize_group keeps the exact grid, so nothing is lost.
TEST(Quant, GroupOnExistingGridKeepsIt8Bit) {
  const uint16_t sb = f32_to_bf16(0.0123f), bb = f32_to_bf16(-0.75f);
  const float s = bf16_to_f32(sb), b = bf16_to_f32(bb);
  std::vector<float> w(64);
  std::vector<uint8_t> want(64);
  for (int i = 0; i < 64; ++i) {
    want[i] = uint8_t(i == 0 ? 0 : i == 1 ? 254 : (i * 37) % 254);
    w[i] = s * float(want[i]) + b;
  }
  const uint16_t rule = f32_to_bf16(float((double(w[1]) - double(w[0])) / 255.0));
  ASSERT_NE(rule, sb) << "the case must be one the plain rule misses";
  uint16_t gs = 0, gb = 0;
  std::vector<uint8_t> q(64);
  quantize_group(w.data(), 64, 8, &gs, &gb, q.data());
  EXPECT_EQ(gs, sb);
  EXPECT_EQ(gb, bb);
  EXPECT_EQ(q, want);
}

// A grid whose smallest value sits at q = 1 (bf16 rounded the original minimum down by more than half a
// step, common at 8 bits where a step is below the bias's bf16 resolution) is recovered without loss too.
TEST(Quant, GroupOnGridAboveZeroIsLossless8Bit) {
  const float s = bf16_to_f32(f32_to_bf16(0.00159454f)), b = bf16_to_f32(f32_to_bf16(-0.267578f));
  std::vector<float> w(64);
  for (int i = 0; i < 64; ++i) w[i] = s * float(1 + (i * 53) % 253) + b;  // q in [1, 253]
  uint16_t gs = 0, gb = 0;
  std::vector<uint8_t> q(64);
  quantize_group(w.data(), 64, 8, &gs, &gb, q.data());
  for (int i = 0; i < 64; ++i) EXPECT_EQ(bf16_to_f32(gs) * float(q[i]) + bf16_to_f32(gb), w[i]) << i;
}

// Values off any grid get the plain rule's scale.
TEST(Quant, GroupOffGridUsesRule8Bit) {
  std::vector<float> w(64);
  for (int i = 0; i < 64; ++i) w[i] = std::sin(0.37f * float(i)) * 0.3f + 0.001f * float(i);
  double lo = w[0], hi = w[0];
  for (float v : w) lo = std::min(lo, double(v)), hi = std::max(hi, double(v));
  uint16_t gs = 0, gb = 0;
  std::vector<uint8_t> q(64);
  quantize_group(w.data(), 64, 8, &gs, &gb, q.data());
  EXPECT_EQ(gs, f32_to_bf16(float((hi - lo) / 255.0)));
  EXPECT_EQ(gb, f32_to_bf16(float(lo)));
}

}  // namespace
}  // namespace lilac
