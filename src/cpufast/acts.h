// Quantized activations for the integer kernels: int8 per block of 64 with a float scale (max-abs
// scaling to [-127, 127], round to nearest), the block's exact fp32 sum and its residual's sum
// (kernels.h, QActs).
#pragma once
#include <cstdint>
#include <vector>

#include "cpufast/kernels.h"

namespace lilac::cpufast {

// One row of `cols` values (a multiple of 64). With q2/d2 non-null also the second level (the residual
// x - d q quantized the same way). rsum (when non-null): per block Σ_j (x_j − d q_j [− d2 q2_j]).
void quantize_act_row(const float* x, int64_t cols, int8_t* q, float* d, float* sum, int8_t* q2 = nullptr,
                      float* d2 = nullptr, float* rsum = nullptr);
// Row t, columns [c0, c1) (whole blocks) of X.
void quantize_act_cols(const QActs& X, int64_t t, int64_t c0, int64_t c1, const float* x);

// Storage for n rows; view() is valid until the next resize.
class ActBuffer {
 public:
  // levels: 1 (int8) or 2 (int8 + int8 residual).
  QActs resize(int64_t n, int64_t cols, int levels);
  QActs view() const { return v_; }
  // Row t of the current view.
  void quantize_row(int64_t t, const float* x) { quantize_act_cols(v_, t, 0, v_.cols, x); }

 private:
  std::vector<int8_t> q_, q2_;
  std::vector<float> d_, s_, r_, d2_;
  QActs v_;
};

// Rows [t0, t1) of X (n x cols, a view into other storage) as a view.
QActs act_rows(const QActs& X, int64_t t0, int64_t t1);

}  // namespace lilac::cpufast
