#include "model/quant.h"

#include <cmath>
#include <cstring>
#include <string>
#include <thread>

#include "core/bf16.h"
#include "core/error.h"

namespace lilac {

void pack_bits(const uint8_t* q, int64_t n, int bits, uint32_t* words) {
  const int per = 32 / bits;
  for (int64_t w = 0; w < n / per; ++w) {
    uint32_t v = 0;
    for (int k = 0; k < per; ++k) v |= uint32_t(q[w * per + k]) << (k * bits);
    words[w] = v;
  }
}

void unpack_bits(const uint32_t* words, int64_t n, int bits, uint8_t* q) {
  for (int64_t j = 0; j < n; ++j) q[j] = uint8_t(unpack_at(words, j, bits));
}

namespace {

// q for w on the grid (scale, bias) by the rule: clamp(round_half_even((w - bias) / scale), 0, levels).
inline uint8_t grid_q(float w, double scale, double bias, int levels) {
  double v = std::nearbyint((double(w) - bias) / scale);  // round half to even (default mode)
  if (!(v >= 0)) v = 0;
  if (v > levels) v = levels;
  return static_cast<uint8_t>(v);
}

// True when every value of the group is exactly bf16 scale * q + bf16 bias (computed in fp32, as the
// dequantizer does) for its q on that grid: quantizing the group there loses nothing.
bool grid_is_exact(const float* w, int n, uint16_t sb, uint16_t bb, int levels) {
  const float scale = bf16_to_f32(sb), bias = bf16_to_f32(bb);
  for (int i = 0; i < n; ++i) {
    const uint8_t q = grid_q(w[i], scale, bias, levels);
    if (scale * float(q) + bias != w[i]) return false;
  }
  return true;
}

}  // namespace

void quantize_group(const float* w, int n, int bits, uint16_t* scale_bf16, uint16_t* bias_bf16, uint8_t* q) {
  double lo = w[0], hi = w[0];
  for (int i = 1; i < n; ++i) {
    lo = std::min(lo, double(w[i]));
    hi = std::max(hi, double(w[i]));
  }
  const int levels = (1 << bits) - 1;
  double s = (hi - lo) / levels;
  if (!(s >= 1e-7)) s = 1e-7;  // clamp_min(1e-7), as the oracle does
  uint16_t sb = f32_to_bf16(static_cast<float>(s));
  uint16_t bb = f32_to_bf16(static_cast<float>(lo));
  // Values that already lie on an affine bf16 grid (an HF checkpoint dequantized from a quantized one)
  // keep that grid. The rule can miss it at 8 bits: when bf16 rounded the original scale up, the largest
  // value sits below q = levels; when bf16 rounded the original minimum down by more than half a step,
  // the smallest value sits above q = 0. So try the grids with max - min spanning k steps from q = qmin.
  // Only a grid that reproduces every value exactly is taken; any other values get the rule's result.
  if (!grid_is_exact(w, n, sb, bb, levels)) {
    bool found = false;
    for (int qmin = 0; qmin <= 3 && !found; ++qmin)
      for (int k = levels - qmin; k >= levels - qmin - 4 && k > 0 && !found; --k) {
        const uint16_t cs = f32_to_bf16(static_cast<float>((hi - lo) / k));
        const uint16_t cb = f32_to_bf16(static_cast<float>(lo - double(bf16_to_f32(cs)) * qmin));
        if (grid_is_exact(w, n, cs, cb, levels)) {
          sb = cs;
          bb = cb;
          found = true;
        }
      }
  }
  const double scale = bf16_to_f32(sb), bias = bf16_to_f32(bb);
  for (int i = 0; i < n; ++i) q[i] = grid_q(w[i], scale, bias, levels);
  *scale_bf16 = sb;
  *bias_bf16 = bb;
}

void quantize_row(const float* w, int64_t cols, int bits, int group, uint32_t* words, uint16_t* scales,
                  uint16_t* biases) {
  if (bits != 4 && bits != 8) throw Error("quantize_row: unsupported bits " + std::to_string(bits));
  if (group <= 0 || cols % group != 0 || group % (32 / bits) != 0)
    throw Error("quantize_row: " + std::to_string(cols) + " columns do not split into groups of " +
                std::to_string(group));
  std::vector<uint8_t> q(static_cast<size_t>(group));
  const int64_t words_per_group = group * bits / 32;
  for (int64_t g = 0; g < cols / group; ++g) {
    quantize_group(w + g * group, group, bits, &scales[g], &biases[g], q.data());
    pack_bits(q.data(), group, bits, words + g * words_per_group);
  }
}

float dequantize_at(const QMatrix& m, int64_t r, int64_t c) {
  if (!m.bits) return m.dense[r * m.cols + c];
  const int64_t g = r * m.groups_per_row() + c / m.group_size;
  const float q = float(unpack_at(m.qweight + r * m.words_per_row(), c, m.bits));
  return bf16_to_f32(m.scales[g]) * q + bf16_to_f32(m.biases[g]);
}

namespace {

// Row r dequantized, with the bit width a compile-time constant (so the unpacking vectorises).
template <int BITS>
void dequantize_row_bits(const QMatrix& W, int64_t r, float* out) {
  constexpr int per_word = 32 / BITS;
  constexpr uint32_t mask = (1u << BITS) - 1u;
  const uint32_t* q = W.qweight + r * W.words_per_row();
  const uint16_t* sc = W.scales + r * W.groups_per_row();
  const uint16_t* bi = W.biases + r * W.groups_per_row();
  const int64_t words_per_group = W.group_size / per_word;
  for (int64_t g = 0; g < W.groups_per_row(); ++g) {
    const float s = bf16_to_f32(sc[g]), b = bf16_to_f32(bi[g]);
    const uint32_t* qg = q + g * words_per_group;
    float* o = out + g * W.group_size;
    for (int64_t w = 0; w < words_per_group; ++w) {
      const uint32_t word = qg[w];
      for (int i = 0; i < per_word; ++i) o[w * per_word + i] = s * float((word >> (i * BITS)) & mask) + b;
    }
  }
}

}  // namespace

void dequantize_row(const QMatrix& m, int64_t r, float* out) {
  if (!m.bits) {
    std::memcpy(out, m.dense + r * m.cols, static_cast<size_t>(m.cols) * sizeof(float));
    return;
  }
  switch (m.bits) {
    case 4: return dequantize_row_bits<4>(m, r, out);
    case 8: return dequantize_row_bits<8>(m, r, out);
    case 2: return dequantize_row_bits<2>(m, r, out);
    default: throw Error("dequantize_row: unsupported bit width " + std::to_string(m.bits));
  }
}

void parallel_ranges(int64_t n, int64_t min_per_thread, const std::function<void(int64_t, int64_t)>& fn,
                     int threads) {
  if (n <= 0) return;
  int hw = threads > 0 ? threads : int(std::max(1u, std::thread::hardware_concurrency()));
  int64_t t = std::min<int64_t>(hw, (n + min_per_thread - 1) / std::max<int64_t>(min_per_thread, 1));
  if (t <= 1) {
    fn(0, n);
    return;
  }
  std::vector<std::thread> pool;
  std::vector<std::exception_ptr> errs(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) {
    int64_t b = n * i / t, e = n * (i + 1) / t;
    pool.emplace_back([&, i, b, e] {
      try {
        fn(b, e);
      } catch (...) {
        errs[size_t(i)] = std::current_exception();
      }
    });
  }
  for (auto& th : pool) th.join();
  for (auto& e : errs)
    if (e) std::rethrow_exception(e);
}

}  // namespace lilac
