#include "cpufast/acts.h"

#include <cmath>

namespace lilac::cpufast {

namespace {

// Max-abs scaling of 64 values to [-127, 127]; returns the scale.
float quantize_block(const float* x, int8_t* q) {
  float amax = 0.f;
  for (int j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float inv = amax > 0.f ? 127.f / amax : 0.f;
  // Round to nearest even by the 1.5 * 2^23 trick (|x * inv| <= 127): what nearbyint gives in the default
  // rounding mode, without a libm call on the baseline x86-64 build.
  constexpr float kMagic = 12582912.f;
  for (int j = 0; j < kBlock; ++j) {
    const float r = (x[j] * inv + kMagic) - kMagic;
    q[j] = int8_t(int(r));
  }
  return amax / 127.f;
}

}  // namespace

void quantize_act_row(const float* x, int64_t cols, int8_t* q, float* d, float* sum, int8_t* q2, float* d2,
                      float* rsum) {
  for (int64_t b = 0; b < cols / kBlock; ++b) {
    const float* xb = x + b * kBlock;
    int8_t* qb = q + b * kBlock;
    float s = 0.f;
    for (int j = 0; j < kBlock; ++j) s += xb[j];
    sum[b] = s;
    d[b] = quantize_block(xb, qb);
    float r[kBlock];
    for (int j = 0; j < kBlock; ++j) r[j] = xb[j] - d[b] * float(qb[j]);
    if (q2) {
      int8_t* q2b = q2 + b * kBlock;
      d2[b] = quantize_block(r, q2b);
      for (int j = 0; j < kBlock; ++j) r[j] -= d2[b] * float(q2b[j]);
    }
    if (rsum) {
      float e = 0.f;
      for (int j = 0; j < kBlock; ++j) e += r[j];
      rsum[b] = e;
    }
  }
}

void quantize_act_cols(const QActs& X, int64_t t, int64_t c0, int64_t c1, const float* x) {
  const int64_t b0 = c0 / kBlock;
  quantize_act_row(x, c1 - c0, X.q + t * X.cols + c0, X.d + t * X.blocks + b0, X.sum + t * X.blocks + b0,
                   X.q2 ? X.q2 + t * X.cols + c0 : nullptr, X.q2 ? X.d2 + t * X.blocks + b0 : nullptr,
                   X.rsum + t * X.blocks + b0);
}

QActs ActBuffer::resize(int64_t n, int64_t cols, int levels) {
  const int64_t blocks = cols / kBlock;
  if (int64_t(q_.size()) < n * cols) q_.resize(static_cast<size_t>(n * cols));
  if (int64_t(d_.size()) < n * blocks) {
    d_.resize(static_cast<size_t>(n * blocks));
    s_.resize(static_cast<size_t>(n * blocks));
    r_.resize(static_cast<size_t>(n * blocks));
  }
  if (levels == 2) {
    if (int64_t(q2_.size()) < n * cols) q2_.resize(static_cast<size_t>(n * cols));
    if (int64_t(d2_.size()) < n * blocks) d2_.resize(static_cast<size_t>(n * blocks));
  }
  v_.q2 = levels == 2 ? q2_.data() : nullptr;
  v_.d2 = levels == 2 ? d2_.data() : nullptr;
  v_.n = n;
  v_.cols = cols;
  v_.blocks = blocks;
  v_.q = q_.data();
  v_.d = d_.data();
  v_.sum = s_.data();
  v_.rsum = r_.data();
  return v_;
}

QActs act_rows(const QActs& X, int64_t t0, int64_t t1) {
  QActs v = X;
  v.n = t1 - t0;
  v.q = X.q + t0 * X.cols;
  v.d = X.d + t0 * X.blocks;
  v.sum = X.sum + t0 * X.blocks;
  v.rsum = X.rsum + t0 * X.blocks;
  if (X.q2) {
    v.q2 = X.q2 + t0 * X.cols;
    v.d2 = X.d2 + t0 * X.blocks;
  }
  return v;
}

}  // namespace lilac::cpufast
