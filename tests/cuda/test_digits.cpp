// The LM head on the integer tensor cores (kernels/digits/digits.h): the tile repack + RMSNorm digits + GEMV
// against a double-precision product of the checkpoint-layout matrix with the RMSNorm output, at the fixtures'
// odd shapes (rows not a multiple of 16, fewer than 8 groups) and the model's width; a row's logits the same
// bits alone, inside any M up to 64 and for every rows-per-launch split (memcmp); padding rows neither read nor
// written; non-finite outputs never.
#include <gtest/gtest.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/bf16.h"
#include "cuda/kernels/digits/digits.h"
#include "decode_test_util.h"

using namespace lilac;
namespace lc = lilac::cuda;
namespace ld = lilac::cuda::digits;
using namespace lilac::cuda::testing;

namespace {

struct Tiles {
  Dev<uint8_t> q, sb;
  ld::TilesDev t;
  explicit Tiles(const lc::QMatrixDev& W) : q(ld::tiles_q_bytes(W)), sb(ld::tiles_sb_bytes(W)) {
    ld::tiles_repack(W, q.p, sb.p, nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    t.rows = W.rows;
    t.K = W.cols;
    t.q = reinterpret_cast<const uint4*>(q.p);
    t.sb = reinterpret_cast<const uint32_t*>(sb.p);
  }
};

// y = W · rmsnorm(x) in double, W dequantized from the checkpoint layout.
std::vector<double> reference(const HostQ& W, const std::vector<float>& x, int M, const std::vector<float>& nw) {
  const int64_t R = W.m.rows, K = W.m.cols, G = K / 64;
  std::vector<double> y(static_cast<size_t>(M * R));
  for (int m = 0; m < M; ++m) {
    const float* xr = x.data() + m * K;
    double ss = 0;
    for (int64_t k = 0; k < K; ++k) ss += double(xr[k]) * xr[k];
    const double r = 1.0 / std::sqrt(ss / double(K) + 1e-6);
    std::vector<double> t(static_cast<size_t>(K));
    for (int64_t k = 0; k < K; ++k) t[size_t(k)] = double(xr[k]) * r * nw[size_t(k)];
    for (int64_t n = 0; n < R; ++n) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) {
        const uint32_t q = (W.q[size_t(n * (K / 8) + k / 8)] >> (4 * (k % 8))) & 15u;
        const double s = bf16_to_f32(W.s[size_t(n * G + k / 64)]), b = bf16_to_f32(W.b[size_t(n * G + k / 64)]);
        acc += (s * q + b) * t[size_t(k)];
      }
      y[size_t(m * R + n)] = acc;
    }
  }
  return y;
}

struct HeadRun {
  const Tiles& T;
  const float* nw;  // device
  int launch_rows = 0;
  // the GEMV's output for the M rows of x (NaN-poisoned first; padding rows' outputs hold `sentinel`)
  std::vector<float> operator()(const std::vector<float>& x, int M, const std::vector<int32_t>& slots = {},
                                float sentinel = 0.f) const {
    const int64_t K = T.t.K, R = T.t.rows;
    Dev<float> dx(x);
    Dev<uint8_t> buf(ld::stage_bytes(K, M));
    Dev<float> y(size_t(M * R));
    y.poison();
    std::vector<float> init(size_t(M * R), sentinel);
    if (!slots.empty()) y.set(init);
    Dev<int32_t> ds(slots.empty() ? std::vector<int32_t>(1) : slots);
    ld::StageArgs st;
    st.x = dx.p;
    st.K = K;
    st.M = M;
    st.row_slot = slots.empty() ? nullptr : ds.p;
    st.norm_w = nw;
    st.buf = buf.p;
    ld::stage_rmsnorm(st, nullptr);
    ld::GemvArgs g;
    g.W = T.t;
    g.buf = buf.p;
    g.M = M;
    g.row_slot = st.row_slot;
    g.y = y.p;
    g.launch_rows = launch_rows;
    ld::gemv(g, nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return y.get();
  }
};

std::vector<float> inputs(Rng& r, int M, int64_t K) {
  std::vector<float> x(static_cast<size_t>(M * K));
  for (size_t i = 0; i < x.size(); ++i) x[i] = r.normal() * (i % 53 == 7 ? 20.f : 1.f);  // outlier channels
  return x;
}

std::vector<float> norm_weights(Rng& r, int64_t K) {
  std::vector<float> nw(static_cast<size_t>(K));
  for (auto& v : nw) v = r.uni(0.6f, 1.4f);
  return nw;
}

struct Shape {
  int64_t rows, K;
};
// tiny / tiny2 / tiny-mtp's LM heads, a width with a partial last slice, the model's width with odd rows
const Shape kShapes[] = {{2048, 256}, {777, 192}, {1000, 128}, {300, 640}, {4099, 2048}};

}  // namespace

TEST(Digits, TilesSupported) {
  lc::QMatrixDev W;
  W.rows = 100;
  W.cols = 2048;
  W.bits = 4;
  W.group_size = 64;
  W.qweight = reinterpret_cast<const uint32_t*>(16);
  EXPECT_TRUE(ld::tiles_supported(W));
  W.bits = 8;
  EXPECT_FALSE(ld::tiles_supported(W));
  W.bits = 4;
  W.group_size = 32;
  EXPECT_FALSE(ld::tiles_supported(W));
  W.group_size = 64;
  W.cols = 4096;  // more than ld::kMaxK
  EXPECT_FALSE(ld::tiles_supported(W));
  EXPECT_EQ(ld::tiles_q_bytes(lc::QMatrixDev{100, 2048, 4, 64}), size_t(7 * 32 * 512));
}

TEST(Digits, MatchesDoubleReference) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  for (const Shape& sh : kShapes) {
    HostQ W(r, sh.rows, sh.K, 4);
    DevQ dW(W);
    const Tiles T(dW.d);
    const std::vector<float> nw = norm_weights(r, sh.K);
    const Dev<float> dnw(nw);
    const HeadRun run{T, dnw.p};
    for (int M : {1, 5, 33}) {
      SCOPED_TRACE("rows " + std::to_string(sh.rows) + " K " + std::to_string(sh.K) + " M " + std::to_string(M));
      const std::vector<float> x = inputs(r, M, sh.K);
      const std::vector<float> y = run(x, M);
      const std::vector<double> ref = reference(W, x, M, nw);
      for (int m = 0; m < M; ++m) {
        double num = 0, den = 0;
        for (int64_t n = 0; n < sh.rows; ++n) {
          const size_t i = size_t(m * sh.rows + n);
          ASSERT_TRUE(std::isfinite(y[i])) << "row " << m << " output " << n;
          num += (y[i] - ref[i]) * (y[i] - ref[i]);
          den += ref[i] * ref[i];
        }
        // 21-bit inputs and the float fold: ~3e-6 measured; a wrong digit, group or scale is >1e-3
        EXPECT_LT(std::sqrt(num / den), 2e-5) << "row " << m;
      }
    }
  }
}

TEST(Digits, RowBitsIndependentOfBatchAndLaunchSplit) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  for (const Shape& sh : {kShapes[1], kShapes[4]}) {
    HostQ W(r, sh.rows, sh.K, 4);
    DevQ dW(W);
    const Tiles T(dW.d);
    const Dev<float> dnw(norm_weights(r, sh.K));
    HeadRun run{T, dnw.p};
    const int Mmax = ld::kMaxRows;
    const std::vector<float> x = inputs(r, Mmax, sh.K);
    std::vector<std::vector<float>> alone(static_cast<size_t>(Mmax));
    for (int m = 0; m < Mmax; ++m)
      alone[size_t(m)] = run(std::vector<float>(x.begin() + m * sh.K, x.begin() + (m + 1) * sh.K), 1);
    for (int lr : {0, 8, 16, 32}) {
      run.launch_rows = lr;
      for (int M : {2, 8, 9, 24, 31, 32, 40, 64}) {
        SCOPED_TRACE("K " + std::to_string(sh.K) + " launch rows " + std::to_string(lr) + " M " + std::to_string(M));
        const std::vector<float> y = run(std::vector<float>(x.begin(), x.begin() + M * sh.K), M);
        for (int m = 0; m < M; ++m)
          ASSERT_EQ(std::memcmp(y.data() + m * sh.rows, alone[size_t(m)].data(), size_t(sh.rows) * 4), 0) << "row " << m;
      }
    }
  }
}

TEST(Digits, PaddingRowsNeitherReadNorWritten) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  const Shape sh = kShapes[2];
  HostQ W(r, sh.rows, sh.K, 4);
  DevQ dW(W);
  const Tiles T(dW.d);
  const Dev<float> dnw(norm_weights(r, sh.K));
  const HeadRun run{T, dnw.p};
  const int M = 37;
  std::vector<float> x = inputs(r, M, sh.K);
  std::vector<int32_t> slots(static_cast<size_t>(M));
  for (int m = 0; m < M; ++m) slots[size_t(m)] = m % 3 == 1 ? -1 : m;
  for (int m = 0; m < M; ++m)
    if (slots[size_t(m)] < 0)
      for (int64_t k = 0; k < sh.K; ++k) x[size_t(m * sh.K + k)] = std::nanf("");  // never read
  const float sentinel = 12345.f;
  const std::vector<float> y = run(x, M, slots, sentinel);
  for (int m = 0; m < M; ++m) {
    const std::vector<float> one =
        slots[size_t(m)] < 0 ? std::vector<float>() : run(std::vector<float>(x.begin() + m * sh.K, x.begin() + (m + 1) * sh.K), 1);
    for (int64_t n = 0; n < sh.rows; ++n) {
      const float v = y[size_t(m * sh.rows + n)];
      if (slots[size_t(m)] < 0)
        ASSERT_EQ(v, sentinel) << "padding row " << m << " written at " << n;
      else
        ASSERT_EQ(std::memcmp(&v, &one[size_t(n)], 4), 0) << "row " << m << " output " << n;
    }
  }
}
