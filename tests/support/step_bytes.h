// The byte model of a batched decode step (cpufast::decode_step_bytes, cuda::decode_step_bytes: what
// `bench --batch` divides by --peak-tbs for its floor), checked the same way for both backends: one stream
// is the per-token model, each stream brings its own state (K/V rows scale with the context), and the routed
// experts count once each, E (1 - (1 - k/E)^B) of them (ModelConfig::experts_touched).
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>

#include "model/config.h"

namespace lilac::testing {

// step(ctx, B): bytes of one step of B streams at context ctx; per_token(ctx): the single-stream model.
inline void check_step_bytes(const ModelConfig& c, const std::function<double(int64_t, int64_t)>& step,
                             const std::function<double(int64_t)>& per_token) {
  EXPECT_NEAR(step(512, 1), per_token(512), 1.0);
  EXPECT_NEAR(step(4096, 1), per_token(4096), 1.0);
  // every stream reads its own K/V rows: the context's share scales with B
  for (int64_t B : {2, 4, 16})
    EXPECT_NEAR(step(1024, B) - step(512, B), double(B) * (step(1024, 1) - step(512, 1)), 1.0) << "B " << B;
  // f(B) = W + B·(own state) + experts_touched(B)·X: eliminate W and the state with B = 1, 2, 16; X must be
  // one routed expert's gate, up and down matrices (4-bit, a bf16 scale and bias per 64) in every layer
  auto f = [&](int64_t B) { return step(512, B); };
  const double k = c.experts_touched(1), t2 = c.experts_touched(2), t16 = c.experts_touched(16);
  const double X = (f(16) - f(1) - 15 * (f(2) - f(1))) / ((t16 - k) - 15 * (t2 - k));
  const double I = double(c.moe_intermediate_size), H = double(c.hidden_size);
  EXPECT_NEAR(X, double(c.num_layers) * 3 * (I * H * 0.5 + I * H / 64 * 4), 1e-3 * X);
  // more streams always move more, but less than as many single steps
  for (int64_t B : {2, 16, 64}) {
    EXPECT_GT(f(B), f(B / 2)) << "B " << B;
    EXPECT_LT(f(B), double(B) * f(1)) << "B " << B;
  }
}

}  // namespace lilac::testing
