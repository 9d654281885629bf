// The row-exact multi-row ops (qmatvec_rows, moe_forward with rowwise): every row bit for bit the one-row result,
// whatever the other rows and the thread count -- what makes a verification step's logits those of
// one-token steps. On tiny-mtp's weights (4-bit matrices, the 8-bit router, the MTP head's fc) and a dense one.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "core/thread_pool.h"
#include "cpu/ops.h"
#include "model/weights.h"

using namespace lilac;
using namespace lilac::cpu;

namespace {

std::shared_ptr<const ModelWeights> weights() {
  static auto w = load_model(std::string(LILAC_SHARED_DIR) + "/fixtures/tiny-mtp/mlx4", LoadOptions{.progress = false});
  return w;
}

std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

}  // namespace

TEST(CpuOpsRows, QmatvecRowsIsQmatvecPerRow) {
  auto w = weights();
  std::vector<float> dense = randn(48 * 96, 4);
  QMatrix d;
  d.rows = 48;
  d.cols = 96;
  d.dense = dense.data();
  ThreadPool pool(2);
  for (const QMatrix* m : {&w->layers[0].gdn.in_proj_qkv, &w->layers[0].moe.router, &w->mtp.fc, &w->lm_head,
                           static_cast<const QMatrix*>(&d)}) {
    const int64_t n = 7;
    const auto X = randn(size_t(n * m->cols), 5);
    std::vector<float> Y(size_t(n * m->rows)), y(size_t(m->rows));
    qmatvec_rows(*m, X.data(), n, Y.data(), &pool);
    for (int64_t t = 0; t < n; ++t) {
      qmatvec(*m, X.data() + t * m->cols, y.data(), nullptr);
      EXPECT_EQ(0, std::memcmp(y.data(), Y.data() + t * m->rows, y.size() * sizeof(float)))
          << "row " << t << " of a " << m->rows << " x " << m->cols << " matrix at " << m->bits << " bits";
    }
  }
}

TEST(CpuOpsRows, MoeForwardRowsIsOneTokenMoePerRow) {
  auto w = weights();
  const ModelConfig& c = w->config;
  ThreadPool pool(2);
  const int64_t n = 9, H = c.hidden_size;
  const auto X = randn(size_t(n * H), 6);
  for (const MoEWeights* m : {&w->layers[1].moe, &w->mtp.layers[0].moe}) {
    std::vector<float> Y(static_cast<size_t>(n * H)), y(static_cast<size_t>(H));
    moe_forward(*m, c, X.data(), n, Y.data(), &pool, /*rowwise=*/true);
    for (int64_t t = 0; t < n; ++t) {
      moe_forward(*m, c, X.data() + t * H, 1, y.data(), nullptr);
      EXPECT_EQ(0, std::memcmp(y.data(), Y.data() + t * H, y.size() * sizeof(float))) << "row " << t;
    }
    // The batched form (experts shared by several rows: dequantized rows and dot products) is a
    // different summation order: close, and it is why verification uses the row-exact form.
    std::vector<float> B(size_t(n * H));
    moe_forward(*m, c, X.data(), n, B.data(), &pool);
    for (size_t i = 0; i < B.size(); ++i) EXPECT_NEAR(B[i], Y[i], 1e-4 * (1 + std::abs(Y[i])));
  }
}
