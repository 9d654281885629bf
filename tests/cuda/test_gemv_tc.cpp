// Tensor-core decode GEMV (gemv/gemv_tc.cu, GemvImpl::Tensor — the default): the model's real matrix
// shapes against the CPU reference and the fp32 GPU kernel, inputs with a wide dynamic range inside
// one quantization group (the fp16 hi + lo split must keep fp32 accuracy), and a chain of dependent
// GEMVs launched with programmatic dependent launch, captured in a CUDA graph and replayed.
#include <gtest/gtest.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "cpu/ops.h"
#include "cuda/kernels/gemv/gemv.h"
#include "decode_test_util.h"
#include "model/quant.h"

using namespace lilac;
namespace lc = lilac::cuda;
using namespace lilac::cuda::testing;

namespace {

lc::GemvArgs args(const DevQ& W, const float* x, float* y, lc::GemvImpl impl) {
  lc::GemvArgs a;
  a.W = W.d;
  a.x = x;
  a.y = y;
  a.impl = impl;
  return a;
}

// LILAC_GEMV=fp32 selects the fp32 kernel for GemvImpl::FromEnv (the default); anything else or unset: tensor
// cores. No GPU needed (only reads the environment).
TEST(CudaGemvTc, EnvironmentSelectsTheKernel) {
  const char* old = std::getenv("LILAC_GEMV");
  const std::string saved = old ? old : "";
  setenv("LILAC_GEMV", "fp32", 1);
  EXPECT_EQ(lc::gemv_impl_from_env(), lc::GemvImpl::Fp32);
  setenv("LILAC_GEMV", "dp4a", 1);  // the removed variants' names fall through to the default
  EXPECT_EQ(lc::gemv_impl_from_env(), lc::GemvImpl::Tensor);
  unsetenv("LILAC_GEMV");
  EXPECT_EQ(lc::gemv_impl_from_env(), lc::GemvImpl::Tensor);
  if (old) setenv("LILAC_GEMV", saved.c_str(), 1);
}

TEST(CudaGemvTc, RealShapesMatchCpuAndFp32Kernel) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  struct Case {
    int64_t rows, cols;
    int bits;
  };
  // GDN in_proj, out_proj, attention qkv, router + shared_expert_gate (8-bit), a tall matrix (one
  // k-slice per row block, like the LM head), a narrow one (MoE down width).
  for (const Case c : {Case{12352, 2048, 4}, Case{2048, 4096, 4}, Case{9216, 2048, 4}, Case{257, 2048, 8},
                       Case{50704, 2048, 4}, Case{2048, 512, 4}, Case{1000, 320, 8}}) {
    SCOPED_TRACE("rows " + std::to_string(c.rows) + " cols " + std::to_string(c.cols) + " bits " +
                 std::to_string(c.bits));
    HostQ hq(r, c.rows, c.cols, c.bits);
    DevQ dq(hq);
    const auto x = randv(r, size_t(c.cols), 3.f);
    std::vector<float> ref(size_t(c.rows));
    cpu::qmatvec(hq.m, x.data(), ref.data());
    Dev<float> dx(x), dy(size_t(c.rows)), dy32(size_t(c.rows));
    dy.poison();
    dy32.poison();
    lc::gemv(args(dq, dx.p, dy.p, lc::GemvImpl::Tensor), nullptr);
    lc::gemv(args(dq, dx.p, dy32.p, lc::GemvImpl::Fp32), nullptr);
    CK(cudaDeviceSynchronize());
    const auto got = dy.get();
    EXPECT_LE(rel_err(got, ref), 2e-6);
    EXPECT_LE(rel_err(got, dy32.get()), 2e-6);
  }
}

// Values from 1e-7 to 1e4 in every group (and a zero group): the power-of-two group scale puts the
// largest value just below 1 and hi + lo keeps ~22 bits below it; exact double reference.
TEST(CudaGemvTc, WideDynamicRangeKeepsFp32Accuracy) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  for (int bits : {4, 8}) {
    const int64_t rows = 333, cols = 1024;
    HostQ hq(r, rows, cols, bits);
    DevQ dq(hq);
    std::vector<float> x(static_cast<size_t>(cols));
    for (int64_t i = 0; i < cols; ++i) {
      const float mag = std::pow(10.f, r.uni(-7.f, 4.f));
      x[size_t(i)] = (r.word() & 1 ? mag : -mag);
    }
    for (int i = 128; i < 192; ++i) x[size_t(i)] = 0.f;  // one all-zero group
    std::vector<double> ref(size_t(rows), 0.0);
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t rr = 0; rr < rows; ++rr) {
      dequantize_row(hq.m, rr, row.data());
      double acc = 0;
      for (int64_t i = 0; i < cols; ++i) acc += double(row[size_t(i)]) * x[size_t(i)];
      ref[size_t(rr)] = acc;
    }
    Dev<float> dx(x), dy(static_cast<size_t>(rows));
    dy.poison();
    lc::gemv(args(dq, dx.p, dy.p, lc::GemvImpl::Tensor), nullptr);
    CK(cudaDeviceSynchronize());
    const auto got = dy.get();
    // per row: error relative to Σ|w x| (the scale of the rounding of any fp32 summation)
    double worst = 0;
    for (int64_t rr = 0; rr < rows; ++rr) {
      dequantize_row(hq.m, rr, row.data());
      double l1 = 0;
      for (int64_t i = 0; i < cols; ++i) l1 += std::fabs(double(row[size_t(i)]) * x[size_t(i)]);
      worst = std::max(worst, std::fabs(got[size_t(rr)] - ref[size_t(rr)]) / std::max(l1, 1e-30));
    }
    EXPECT_LE(worst, 2e-6) << "bits " << bits;
  }
}

// y1 = W1 x; y2 = W2 RmsNorm(y1); x += W3 y2 (the residual is the next replay's input): every kernel
// reads what the previous one wrote and the last one overwrites what the first one read.
TEST(CudaGemvTc, PdlChainInAGraphMatchesCpu) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  const int64_t H = 1024, M = 3072;
  HostQ w1(r, M, H, 4), w2(r, H, M, 4), w3(r, H, H, 8);
  DevQ d1(w1), d2(w2), d3(w3);
  auto x = randv(r, size_t(H));
  std::vector<float> nw(static_cast<size_t>(M));
  for (auto& v : nw) v = r.uni(0.8f, 1.2f);
  Dev<float> dx(x), dy1(static_cast<size_t>(M)), dy2(static_cast<size_t>(H)), dnw(nw);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  lc::gemv(args(d1, dx.p, dy1.p, lc::GemvImpl::Tensor), s);
  lc::GemvArgs a2 = args(d2, dy1.p, dy2.p, lc::GemvImpl::Tensor);
  a2.pro = lc::Prologue::RmsNorm;
  a2.norm_w = dnw.p;
  lc::gemv(a2, s);
  lc::GemvArgs a3 = args(d3, dy2.p, dx.p, lc::GemvImpl::Tensor);
  a3.accumulate = true;
  lc::gemv(a3, s);
  cudaGraph_t g;
  CK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t ge;
  CK(cudaGraphInstantiate(&ge, g, 0));
  std::vector<float> y1(static_cast<size_t>(M)), y1n(static_cast<size_t>(M)), y2(static_cast<size_t>(H)),
      y3(static_cast<size_t>(H));
  for (int rep = 0; rep < 4; ++rep) {
    CK(cudaGraphLaunch(ge, s));
    cpu::qmatvec(w1.m, x.data(), y1.data());
    cpu::rmsnorm(y1.data(), nw.data(), M, 1e-6f, y1n.data());
    cpu::qmatvec(w2.m, y1n.data(), y2.data());
    cpu::qmatvec(w3.m, y2.data(), y3.data());
    for (int64_t i = 0; i < H; ++i) x[size_t(i)] += y3[size_t(i)];
  }
  CK(cudaStreamSynchronize(s));
  EXPECT_LE(rel_err(dx.get(), x), 1e-5);
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
}

}  // namespace
