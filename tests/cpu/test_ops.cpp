// Unit tests of the reference ops (src/cpu/ops.h) on hand-computed cases and random inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/bf16.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "cpu/ops.h"
#include "model/quant.h"

using namespace lilac;
using namespace lilac::cpu;

namespace {

// A quantized matrix over buffers the test owns, built from explicit q / scale / bias values.
struct PackedMatrix {
  std::vector<uint32_t> q;
  std::vector<uint16_t> scales, biases;
  std::vector<float> deq;  // the values it encodes, computed independently of dequantize_row
  QMatrix m;
};

PackedMatrix make_packed(int64_t rows, int64_t cols, int bits, uint32_t seed, int gs = 64) {
  PackedMatrix p;
  const int per = 32 / bits;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint32_t> qd(0, (1u << bits) - 1);
  std::normal_distribution<float> nd(0.f, 0.05f);
  p.q.assign(static_cast<size_t>(rows * cols / per), 0u);
  p.scales.resize(static_cast<size_t>(rows * cols / gs));
  p.biases.resize(p.scales.size());
  for (auto& s : p.scales) s = f32_to_bf16(std::abs(nd(rng)) + 1e-3f);
  for (auto& b : p.biases) b = f32_to_bf16(nd(rng) * 4.f);
  p.deq.resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      uint32_t v = qd(rng);
      p.q[r * (cols / per) + c / per] |= v << ((c % per) * bits);
      const size_t g = static_cast<size_t>(r * (cols / gs) + c / gs);
      p.deq[r * cols + c] = bf16_to_f32(p.scales[g]) * float(v) + bf16_to_f32(p.biases[g]);
    }
  p.m.rows = rows;
  p.m.cols = cols;
  p.m.bits = bits;
  p.m.group_size = gs;
  p.m.qweight = p.q.data();
  p.m.scales = p.scales.data();
  p.m.biases = p.biases.data();
  return p;
}

std::vector<float> randn(size_t n, uint32_t seed, float std = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, std);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

}  // namespace

TEST(CpuOps, DequantRowMatchesPackedValues4And8Bit) {
  for (int bits : {4, 8}) {
    PackedMatrix p = make_packed(5, 192, bits, 7 + bits);
    std::vector<float> row(192);
    for (int r = 0; r < 5; ++r) {
      dequantize_row(p.m, r, row.data());
      for (int c = 0; c < 192; ++c) ASSERT_EQ(row[c], p.deq[r * 192 + c]) << "bits " << bits << " r " << r << " c " << c;
    }
  }
}

TEST(CpuOps, QMatmulMatchesDoubleReference) {
  ThreadPool pool(2);
  PackedMatrix p = make_packed(37, 256, 4, 3);
  const int n = 5;
  auto X = randn(static_cast<size_t>(n * 256), 11);
  std::vector<float> Y(static_cast<size_t>(n * 37), -999.f), y1(37, -999.f);
  qmatmul(p.m, X.data(), n, Y.data(), &pool);
  qmatvec(p.m, X.data() + 256, y1.data(), nullptr);
  for (int t = 0; t < n; ++t)
    for (int r = 0; r < 37; ++r) {
      double ref = 0;
      for (int c = 0; c < 256; ++c) ref += double(p.deq[r * 256 + c]) * X[t * 256 + c];
      EXPECT_NEAR(Y[t * 37 + r], ref, 1e-4 * (1 + std::abs(ref))) << t << "," << r;
      if (t == 1) EXPECT_NEAR(y1[r], ref, 1e-4 * (1 + std::abs(ref)));  // the fused matvec path
    }
}

TEST(CpuOps, QMatvec8BitAndSingleRowMatmulAgainstDoubleReference) {
  PackedMatrix p = make_packed(19, 192, 8, 21);
  auto x = randn(192, 22);
  std::vector<float> y(19, -999.f), y2(19, -999.f);
  qmatvec(p.m, x.data(), y.data(), nullptr);
  qmatmul(p.m, x.data(), 1, y2.data(), nullptr);
  for (int r = 0; r < 19; ++r) {
    double ref = 0;
    for (int c = 0; c < 192; ++c) ref += double(p.deq[r * 192 + c]) * x[c];
    EXPECT_NEAR(y[r], ref, 1e-4 * (1 + std::abs(ref))) << r;
    EXPECT_EQ(y2[r], y[r]);
  }
}

TEST(CpuOps, OtherGroupSizes) {
  for (int gs : {32, 128})
    for (int bits : {4, 8}) {
      PackedMatrix p = make_packed(7, 256, bits, 31 + gs + bits, gs);
      auto x = randn(256 * 2, 32);
      std::vector<float> y(7), Y(14), row(256);
      qmatvec(p.m, x.data(), y.data(), nullptr);
      qmatmul(p.m, x.data(), 2, Y.data(), nullptr);
      for (int r = 0; r < 7; ++r) {
        dequantize_row(p.m, r, row.data());
        for (int c = 0; c < 256; ++c) ASSERT_EQ(row[c], p.deq[r * 256 + c]);
        for (int t = 0; t < 2; ++t) {
          double ref = 0;
          for (int c = 0; c < 256; ++c) ref += double(p.deq[r * 256 + c]) * x[t * 256 + c];
          EXPECT_NEAR(Y[t * 7 + r], ref, 1e-4 * (1 + std::abs(ref))) << gs << " " << bits;
          if (t == 0) EXPECT_NEAR(y[r], ref, 1e-4 * (1 + std::abs(ref))) << gs << " " << bits;
        }
      }
    }
}

TEST(CpuOps, EmbedRowRejectsOutOfRangeIds) {
  PackedMatrix p = make_packed(4, 64, 4, 5);
  std::vector<float> row(64);
  embed_row(p.m, 3, row.data());
  EXPECT_EQ(row[10], p.deq[3 * 64 + 10]);
  EXPECT_THROW(embed_row(p.m, 4, row.data()), InputError);
  EXPECT_THROW(embed_row(p.m, -1, row.data()), InputError);
}

TEST(CpuOps, RmsNormBothVariantsHandComputed) {
  const float x[4] = {1, 2, 3, 4};  // mean(x²) = 7.5
  const float w[4] = {1.f, 0.5f, 2.f, -1.f};
  float out[4];
  rmsnorm(x, w, 4, 0.f, out);
  const double inv = 1 / std::sqrt(7.5);
  EXPECT_NEAR(out[0], 1 * inv * 1.0, 1e-6);
  EXPECT_NEAR(out[1], 2 * inv * 0.5, 1e-6);
  EXPECT_NEAR(out[2], 3 * inv * 2.0, 1e-6);
  EXPECT_NEAR(out[3], 4 * inv * -1.0, 1e-6);
  // eps enters under the square root.
  rmsnorm(x, w, 4, 0.5f, out);
  EXPECT_NEAR(out[0], 1 / std::sqrt(8.0), 1e-6);
  // Zero-centred: multiplier 1 + w.
  const float wr[4] = {0.f, -0.5f, 1.f, -2.f};
  float out2[4];
  rmsnorm_zero_centred(x, wr, 4, 0.f, out2);
  rmsnorm(x, w, 4, 0.f, out);
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(out2[i], out[i]);
  // Gated: RMSNorm(o; w) * silu(z).
  const float z[4] = {0.f, 1.f, -1.f, 2.f};
  float g[4];
  gated_rmsnorm(x, z, w, 4, 0.f, g);
  EXPECT_NEAR(g[0], 0.f, 1e-7);
  EXPECT_NEAR(g[1], 2 * inv * 0.5 * (1 / (1 + std::exp(-1.0))), 1e-6);
  EXPECT_NEAR(g[3], 4 * inv * -1.0 * (2 / (1 + std::exp(-2.0))), 1e-6);
}

TEST(CpuOps, RopeHandComputed) {
  // head_dim 6, rotary_dim 4, theta 100: inv_freq = [1, 100^-0.5 = 0.1]; pos 3 → angles [3, 0.3].
  float x[6] = {1, 2, 3, 4, 5, 6};
  rope(x, 4, 3, 100.0);
  // pairs (x0, x2) with angle 3 and (x1, x3) with angle 0.3; x4, x5 pass through.
  EXPECT_NEAR(x[0], 1 * std::cos(3.0) - 3 * std::sin(3.0), 1e-5);
  EXPECT_NEAR(x[2], 3 * std::cos(3.0) + 1 * std::sin(3.0), 1e-5);
  EXPECT_NEAR(x[1], 2 * std::cos(0.3) - 4 * std::sin(0.3), 1e-5);
  EXPECT_NEAR(x[3], 4 * std::cos(0.3) + 2 * std::sin(0.3), 1e-5);
  EXPECT_EQ(x[4], 5.f);
  EXPECT_EQ(x[5], 6.f);
  // Position 0 is the identity.
  float y[4] = {1, 2, 3, 4};
  rope(y, 4, 0, 1e7);
  EXPECT_EQ(y[0], 1.f);
  EXPECT_EQ(y[3], 4.f);
}

TEST(CpuOps, RopeRoundsEachProductAsWritten) {
  // a * c - b * s with each product rounded to fp32 and then subtracted, as the source (and the oracle) says. A build
  // that lets the compiler fuse it into fma(a, c, -(b * s)) -- GCC's default wherever the target has FMA: aarch64,
  // -march=native (LILAC_NATIVE) -- computes other bits on other machines; 139 of these 512 values differed
  // under -march=native before CMakeLists.txt pinned -ffp-contract=off.
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  const float inv_freq = 0.37f;
  int differ = 0;
  for (int64_t pos = 1; pos <= 256; ++pos) {
    float x[2] = {u(rng), u(rng)};
    const float a = x[0], b = x[1];
    rope_with(x, 2, pos, &inv_freq);
    const float ang = float(pos) * inv_freq;
    const float c = float(std::cos(double(ang))), s = float(std::sin(double(ang)));
    volatile float ac = a * c, bs = b * s, bc = b * c, as = a * s;  // each product rounded on its own
    const float e0 = ac - bs, e1 = bc + as;
    differ += (std::memcmp(&x[0], &e0, 4) != 0) + (std::memcmp(&x[1], &e1, 4) != 0);
  }
  EXPECT_EQ(differ, 0) << "rope's products were fused with their sum (floating-point contraction)";
}

TEST(CpuOps, GatedAttentionGqaAgainstNaive) {
  // 4 query heads on 2 kv heads, head_dim 8, 5 cached positions.
  const int heads = 4, kvh = 2, hd = 8, n = 5;
  auto q = randn(heads * hd, 1), gate = randn(heads * hd, 2), K = randn(n * kvh * hd, 3), V = randn(n * kvh * hd, 4);
  std::vector<float> out(heads * hd), scores(n);
  gated_attention_token(q.data(), gate.data(), K.data(), V.data(), n, heads, kvh, hd, out.data(), scores.data());
  for (int h = 0; h < heads; ++h) {
    const int g = h / (heads / kvh);
    double s[n], mx = -1e30, sum = 0;
    for (int j = 0; j < n; ++j) {
      s[j] = 0;
      for (int d = 0; d < hd; ++d) s[j] += double(q[h * hd + d]) * K[(j * kvh + g) * hd + d];
      s[j] /= std::sqrt(double(hd));
      mx = std::max(mx, s[j]);
    }
    for (int j = 0; j < n; ++j) sum += (s[j] = std::exp(s[j] - mx));
    for (int d = 0; d < hd; ++d) {
      double o = 0;
      for (int j = 0; j < n; ++j) o += s[j] / sum * V[(j * kvh + g) * hd + d];
      o *= 1 / (1 + std::exp(-double(gate[h * hd + d])));
      EXPECT_NEAR(out[h * hd + d], o, 1e-5) << h << "," << d;
    }
  }
}

TEST(CpuOps, Conv1dStepHandComputed) {
  // One channel, K = 3: y_t = silu(w0 x_{t-2} + w1 x_{t-1} + w2 x_t).
  const float w[3] = {0.5f, -1.f, 2.f};
  float state[2] = {0, 0};
  const float xs[4] = {1, 2, 3, 4};
  const double expect_pre[4] = {2, 4 - 1, 6 - 2 + 0.5, 8 - 3 + 1};
  for (int t = 0; t < 4; ++t) {
    float y;
    conv1d_silu_step(w, 1, 3, state, &xs[t], &y);
    EXPECT_NEAR(y, expect_pre[t] / (1 + std::exp(-expect_pre[t])), 1e-6) << t;
  }
  EXPECT_EQ(state[0], 3.f);
  EXPECT_EQ(state[1], 4.f);
}

TEST(CpuOps, GatesAndL2NormHandComputed) {
  const float b[2] = {0.f, 2.f}, a[2] = {0.5f, 30.f}, A_log[2] = {0.f, std::log(2.f)}, dt[2] = {0.5f, -5.f};
  float beta[2], g[2];
  gdn_gates(b, a, A_log, dt, 2, beta, g);
  EXPECT_NEAR(beta[0], 0.5, 1e-7);
  EXPECT_NEAR(beta[1], 1 / (1 + std::exp(-2.0)), 1e-7);
  EXPECT_NEAR(g[0], -std::log1p(std::exp(1.0)), 1e-6);
  EXPECT_NEAR(g[1], -2 * 25.0, 1e-4);  // softplus(25) = 25 (above the threshold)
  float x[2] = {3, 4};
  l2norm(x, 2);
  EXPECT_NEAR(x[0], 3 / std::sqrt(25 + 1e-6), 1e-7);
  EXPECT_NEAR(x[1], 4 / std::sqrt(25 + 1e-6), 1e-7);
}

TEST(CpuOps, RecurrentStepHandComputed) {
  // dk = 1, dv = 2: S = [[1, 2]], g = log(0.5), beta = 0.5, k = 1, v = [3, 5], q = 2.
  float S[2] = {1, 2};
  const float q = 2, k = 1, v[2] = {3, 5};
  float o[2];
  gdn_recurrent_step(S, &q, &k, v, std::log(0.5f), 0.5f, 1, 2, o);
  // S ← 0.5 S = [0.5, 1]; u = [0.5, 1]; S += 0.5 (v − u) = [0.5 + 1.25, 1 + 2] = [1.75, 3]; o = 2 S.
  EXPECT_NEAR(S[0], 1.75, 1e-6);
  EXPECT_NEAR(S[1], 3.0, 1e-6);
  EXPECT_NEAR(o[0], 3.5, 1e-6);
  EXPECT_NEAR(o[1], 6.0, 1e-6);
}

// The chunked (WY) form must equal the token-by-token recurrence, from a non-zero state, for lengths
// around the chunk size, with dk != dv.
TEST(CpuOps, ChunkedDeltaRuleEqualsRecurrent) {
  const int dk = 32, dv = 48;
  for (float decay_scale : {0.5f, 20.f})  // mild decay, and decay strong enough to underflow e^{cumsum g}
  for (int T : {1, 63, 64, 65, 130}) {
    auto q = randn(static_cast<size_t>(T * dk), 100 + T), k = randn(static_cast<size_t>(T * dk), 200 + T);
    auto v = randn(static_cast<size_t>(T * dv), 300 + T);
    for (int t = 0; t < T; ++t) {
      l2norm(&q[t * dk], dk);
      for (int d = 0; d < dk; ++d) q[t * dk + d] /= std::sqrt(float(dk));
      l2norm(&k[t * dk], dk);
    }
    std::mt19937 rng(T);
    std::uniform_real_distribution<float> ud(0.f, 1.f);
    std::vector<float> g(T), beta(T);
    for (int t = 0; t < T; ++t) {
      g[t] = -ud(rng) * decay_scale;
      beta[t] = ud(rng);
    }
    auto S0 = randn(static_cast<size_t>(dk * dv), 400 + T, 0.5f);
    std::vector<float> S_rec = S0, S_chk = S0;
    std::vector<float> o_rec(static_cast<size_t>(T * dv)), o_chk(static_cast<size_t>(T * dv), -999.f);
    for (int t = 0; t < T; ++t)
      gdn_recurrent_step(S_rec.data(), &q[t * dk], &k[t * dk], &v[t * dv], g[t], beta[t], dk, dv, &o_rec[t * dv]);
    gdn_chunked(S_chk.data(), q.data(), dk, k.data(), dk, v.data(), dv, g.data(), beta.data(), T, dk, dv,
                o_chk.data(), dv, 64);
    double max_o = 0, max_s = 0;
    for (size_t i = 0; i < o_rec.size(); ++i) max_o = std::max(max_o, double(std::abs(o_rec[i] - o_chk[i])));
    for (size_t i = 0; i < S_rec.size(); ++i) max_s = std::max(max_s, double(std::abs(S_rec[i] - S_chk[i])));
    EXPECT_LT(max_o, 1e-5) << "T=" << T << " decay " << decay_scale;
    EXPECT_LT(max_s, 1e-5) << "T=" << T << " decay " << decay_scale;
  }
}

TEST(CpuOps, MoeRouteTopKTiesToLowerIdAndRenormalises) {
  // Experts 1, 3 and 4 tie at the top; k = 2 takes 1 and 3.
  const float logits[6] = {0.f, 2.f, -1.f, 2.f, 2.f, 1.f};
  int ids[2];
  float w[2];
  moe_route(logits, 6, 2, true, ids, w);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 3);
  EXPECT_FLOAT_EQ(w[0], 0.5f);
  EXPECT_FLOAT_EQ(w[1], 0.5f);
  // Without ties: descending order; weights p_e / Σ top-k p.
  const float l2[4] = {0.f, std::log(3.f), std::log(2.f), std::log(4.f)};  // p ∝ 1, 3, 2, 4
  int ids2[3];
  float w2[3];
  moe_route(l2, 4, 3, true, ids2, w2);
  EXPECT_EQ(ids2[0], 3);
  EXPECT_EQ(ids2[1], 1);
  EXPECT_EQ(ids2[2], 2);
  EXPECT_NEAR(w2[0], 4.0 / 9, 1e-6);
  EXPECT_NEAR(w2[1], 3.0 / 9, 1e-6);
  EXPECT_NEAR(w2[2], 2.0 / 9, 1e-6);
  moe_route(l2, 4, 3, false, ids2, w2);
  EXPECT_NEAR(w2[0], 0.4, 1e-6);
}

TEST(CpuOps, SwigluAgainstNaive) {
  PackedMatrix g = make_packed(64, 128, 4, 1), u = make_packed(64, 128, 4, 2), d = make_packed(128, 64, 4, 3);
  auto X = randn(2 * 128, 9);
  std::vector<float> Y(2 * 128), hidden(2 * 2 * 64);
  ThreadPool pool(2);
  swiglu(g.m, u.m, d.m, X.data(), 2, Y.data(), hidden.data(), &pool);
  for (int t = 0; t < 2; ++t) {
    std::vector<double> h(64);
    for (int i = 0; i < 64; ++i) {
      double a = 0, b = 0;
      for (int c = 0; c < 128; ++c) {
        a += double(g.deq[i * 128 + c]) * X[t * 128 + c];
        b += double(u.deq[i * 128 + c]) * X[t * 128 + c];
      }
      h[i] = a / (1 + std::exp(-a)) * b;
    }
    for (int r = 0; r < 128; ++r) {
      double y = 0;
      for (int i = 0; i < 64; ++i) y += double(d.deq[r * 64 + i]) * h[i];
      EXPECT_NEAR(Y[t * 128 + r], y, 1e-4 * (1 + std::abs(y)));
    }
  }
}

// The batched decode step's product: row t of qmatvec_rows is bit-identical to qmatvec of input t
// alone (4 and 8 bits, several group sizes, dense), whatever the batch size and the thread count;
// qmatmul's multi-row form is not (another summation order), which is why the batch needs its own op.
TEST(CpuOps, QmatvecRowsEqualsQmatvecBitForBit) {
  ThreadPool pool(3);
  bool qmatmul_differs = false;
  for (int gs : {32, 64, 128})
    for (int bits : {4, 8}) {
      PackedMatrix p = make_packed(45, 256, bits, 101 + gs + bits, gs);
      for (int n : {1, 2, 3, 7, 16}) {
        auto X = randn(size_t(256 * n), 200 + n);
        std::vector<float> Y(size_t(45 * n), NAN), Ym(size_t(45 * n)), y(45);
        qmatvec_rows(p.m, X.data(), n, Y.data(), n % 2 ? &pool : nullptr);
        qmatmul(p.m, X.data(), n, Ym.data(), &pool);
        for (int t = 0; t < n; ++t) {
          qmatvec(p.m, X.data() + t * 256, y.data(), t % 2 ? &pool : nullptr);
          ASSERT_EQ(std::memcmp(y.data(), Y.data() + t * 45, 45 * sizeof(float)), 0)
              << "gs " << gs << " bits " << bits << " n " << n << " row " << t;
          if (n > 1 && std::memcmp(y.data(), Ym.data() + t * 45, 45 * sizeof(float)) != 0) qmatmul_differs = true;
        }
      }
    }
  EXPECT_TRUE(qmatmul_differs);
  // Dense (bits 0): the same per-row dot either way.
  auto Wd = randn(9 * 70, 5);
  QMatrix d;
  d.rows = 9;
  d.cols = 70;
  d.dense = Wd.data();
  auto X = randn(70 * 4, 6);
  std::vector<float> Y(36), y(9);
  qmatvec_rows(d, X.data(), 4, Y.data(), &pool);
  for (int t = 0; t < 4; ++t) {
    qmatvec(d, X.data() + t * 70, y.data(), nullptr);
    ASSERT_EQ(std::memcmp(y.data(), Y.data() + t * 9, 9 * sizeof(float)), 0) << t;
  }
}
