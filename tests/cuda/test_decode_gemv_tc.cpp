// Tensor-core decode GEMV (gemv_tc.cu, GemvImpl::Tensor — the default): the model's real matrix
// shapes against the CPU reference and the fp32 GPU kernel, inputs with a wide dynamic range inside
// one quantization group (the fp16 hi + lo split must keep fp32 accuracy), and a chain of dependent
// GEMVs launched with programmatic dependent launch, captured in a CUDA graph and replayed.
#include <gtest/gtest.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cpu/ops.h"
#include "cuda/kernels/decode.h"
#include "cuda/kernels/gemv_tc.h"
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

// Timing of the decode GEMVs at the model's shapes (printed; the numbers go to bench/BENCHMARKS.md):
// CUDA-event time per launch over a graph of back-to-back launches, and the per-block timeline of one
// launch (entry, after the PDL wait, after staging, exit) from %globaltimer. Checks the result once.
namespace {
struct TimedCase {
  const char* name;
  int64_t rows, cols;
  int bits;
  lc::Prologue pro;
  bool acc;
  int conv_rows;
};
}  // namespace

// µs per `copies` repetition of `body` (launches on stream s), captured once in a graph and replayed
// `reps` times after one warm-up replay; -1 on a CUDA error.
template <typename Body>
double graph_us(cudaStream_t s, int copies, int reps, Body&& body) {
  cudaGraph_t g = nullptr;
  cudaGraphExec_t ge = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  double us = -1.0;
  if (cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess) {
    for (int i = 0; i < copies; ++i) body();
    if (cudaStreamEndCapture(s, &g) == cudaSuccess && cudaGraphInstantiate(&ge, g, 0) == cudaSuccess &&
        cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess) {
      cudaGraphLaunch(ge, s);
      cudaEventRecord(e0, s);
      for (int rep = 0; rep < reps; ++rep) cudaGraphLaunch(ge, s);
      cudaEventRecord(e1, s);
      float ms = 0.f;
      if (cudaEventSynchronize(e1) == cudaSuccess && cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess)
        us = 1000.0 * ms / (double(reps) * copies);
    }
  }
  if (ge) cudaGraphExecDestroy(ge);
  if (g) cudaGraphDestroy(g);
  if (e0) cudaEventDestroy(e0);
  if (e1) cudaEventDestroy(e1);
  return us;
}

// Phase trace of one launch (gemv_tc_trace): per mark, the block medians (and the maximum of the
// exit mark) in µs after the earliest block entry. Marks a block did not record are left out.
struct PhaseTrace {
  int blocks = 0;
  double med[8] = {-1, -1, -1, -1, -1, -1, -1, -1};
  double exit_max = -1;
};
template <typename Launch>
PhaseTrace trace_launch(cudaStream_t s, Launch&& launch) {
  constexpr size_t kBlocks = 4096;
  Dev<unsigned long long> tr(kBlocks * 8);
  (void)(cudaMemset(tr.p, 0, kBlocks * 8 * sizeof(unsigned long long)));
  lc::gemv_tc_trace(tr.p);
  launch();
  cudaStreamSynchronize(s);
  lc::gemv_tc_trace(nullptr);
  const auto t = tr.get();
  PhaseTrace pt;
  unsigned long long t0 = ~0ull;
  for (size_t b = 0; b < kBlocks; ++b)
    if (t[b * 8]) {
      t0 = std::min(t0, t[b * 8]);
      ++pt.blocks;
    }
  for (int k = 0; k < 8; ++k) {
    std::vector<double> v;
    for (size_t b = 0; b < size_t(pt.blocks); ++b)
      if (t[b * 8 + size_t(k)]) v.push_back((double(t[b * 8 + size_t(k)]) - double(t0)) / 1e3);
    if (v.empty()) continue;
    std::sort(v.begin(), v.end());
    pt.med[k] = v[v.size() / 2];
    if (k == 7) pt.exit_max = v.back();
  }
  return pt;
}

TEST(CudaGemvTcTiming, ModelShapes) {
  NEED_GPU();
  Rng r(fresh_seed());
  for (const TimedCase c : {TimedCase{"gdn in_proj", 12352, 2048, 4, lc::Prologue::RmsNorm, false, 8192},
                            TimedCase{"gdn out_proj", 2048, 4096, 4, lc::Prologue::GatedHeadNorm, true, 0},
                            TimedCase{"attn qkv", 9216, 2048, 4, lc::Prologue::RmsNorm, false, 0},
                            TimedCase{"router", 257, 2048, 8, lc::Prologue::RmsNorm, false, 0},
                            TimedCase{"lm head", 248320, 2048, 4, lc::Prologue::RmsNorm, false, 0}}) {
    HostQ hq(r, c.rows, c.cols, c.bits);
    DevQ dq(hq);
    const auto x = randv(r, size_t(c.cols));
    std::vector<float> nw(static_cast<size_t>(c.cols), 1.f), z = randv(r, size_t(c.cols));
    Dev<float> dx(x), dnw(nw), dz(z), dy(static_cast<size_t>(c.rows));
    Dev<float> cw(randv(r, size_t(c.conv_rows * 4) + 1, 0.5f)), cst(randv(r, size_t(c.conv_rows * 3) + 1));
    lc::GemvArgs a = args(dq, dx.p, dy.p, lc::GemvImpl::Tensor);
    a.pro = c.pro;
    a.norm_w = dnw.p;
    a.z = dz.p;
    a.head_dim = 128;
    a.accumulate = c.acc;
    if (c.conv_rows) {
      a.conv_rows = c.conv_rows;
      a.conv_k = 4;
      a.conv_w = cw.p;
      a.conv_state = cst.p;
    }
    {  // the result, once (plain store, no conv): tensor cores vs the fp32 kernel
      lc::GemvArgs chk = a;
      chk.accumulate = false;
      chk.conv_rows = 0;
      Dev<float> y32(static_cast<size_t>(c.rows));
      lc::gemv(chk, nullptr);
      chk.y = y32.p;
      chk.impl = lc::GemvImpl::Fp32;
      lc::gemv(chk, nullptr);
      CK(cudaDeviceSynchronize());
      EXPECT_LE(rel_err(dy.get(), y32.get()), 2e-6) << c.name;
    }
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const double us = graph_us(s, 50, 4, [&] { lc::gemv(a, s); });
    const double mb = (double(c.rows) * c.cols * c.bits / 8 + double(c.rows) * (c.cols / 64) * 4) / 1e6;
    // one traced launch (after the graph replays: L2 holds what fits of the weights)
    const PhaseTrace pt = trace_launch(s, [&] { lc::gemv(a, s); });
    const int blocks = pt.blocks;
    printf("gemv-timing %-13s %6lld x %5lld %d-bit: %7.2f us/launch (%6.2f MB, %5.2f TB/s) | blocks %d, median "
           "us after first entry: entry %.2f wait %.2f copies %.2f staged %.2f group1 %.2f exit %.2f (max %.2f)\n",
           c.name, (long long)c.rows, (long long)c.cols, c.bits, us, mb, mb / us, blocks, pt.med[0], pt.med[1],
           pt.med[2], pt.med[3], pt.med[4], pt.med[7], pt.exit_max);
    EXPECT_GT(us, 0.0);
    EXPECT_GT(blocks, 0) << "the trace recorded no block";
    cudaStreamDestroy(s);
  }
}

// The MoE decode kernels at the model's shape (256 experts, top 8, hidden 2048, intermediate 512 +
// shared 512): time per layer over graph replays and the phase trace of each kernel; checks the
// output against the fp32 kernels once.
TEST(CudaGemvTcTiming, MoEModelShape) {
  NEED_GPU();
  Rng r(fresh_seed());
  const int E = 256, k = 8;
  const int64_t H = 2048, I = 512, Is = 512;
  HostQ gate(r, I * E, H, 4), up(r, I * E, H, 4), down(r, H * E, I, 4), sg(r, Is, H, 4), su(r, Is, H, 4),
      sd(r, H, Is, 4);
  DevMoE dm(gate, up, down, sg, su, sd, E, k, I, H);
  const auto logits = randv(r, size_t(E + 1), 2.f);
  const auto h = randv(r, size_t(H));
  std::vector<float> nw(static_cast<size_t>(H), 1.f);
  Dev<float> dl(logits), dh(h), dnw(nw), act(size_t(k * I + Is)), y(static_cast<size_t>(H)), selw(size_t(k + 1));
  Dev<float> act32(size_t(k * I + Is)), y32(static_cast<size_t>(H));
  Dev<int32_t> sel(static_cast<size_t>(k));
  {  // once: tensor cores vs fp32
    y.set(std::vector<float>(size_t(H), 0.f));
    y32.set(std::vector<float>(size_t(H), 0.f));
    lc::moe_gate_up(dm.w, dl.p, dh.p, dnw.p, 1e-6f, sel.p, selw.p, act.p, nullptr, lc::GemvImpl::Tensor);
    lc::moe_down(dm.w, sel.p, selw.p, act.p, y.p, nullptr, lc::GemvImpl::Tensor);
    lc::moe_gate_up(dm.w, dl.p, dh.p, dnw.p, 1e-6f, sel.p, selw.p, act32.p, nullptr, lc::GemvImpl::Fp32);
    lc::moe_down(dm.w, sel.p, selw.p, act32.p, y32.p, nullptr, lc::GemvImpl::Fp32);
    CK(cudaDeviceSynchronize());
    EXPECT_LE(rel_err(act.get(), act32.get()), 2e-6);
    EXPECT_LE(rel_err(y.get(), y32.get()), 2e-6);
  }
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const double us = graph_us(s, 20, 5, [&] {
    lc::moe_gate_up(dm.w, dl.p, dh.p, dnw.p, 1e-6f, sel.p, selw.p, act.p, s, lc::GemvImpl::Tensor);
    lc::moe_down(dm.w, sel.p, selw.p, act.p, y.p, s, lc::GemvImpl::Tensor);
  });
  printf("moe-timing gate_up + down (E 256, top 8 + shared): %.2f us per layer (same experts each layer: L2-warm)\n",
         us);
  EXPECT_GT(us, 0.0);
  lc::moe_gate_up(dm.w, dl.p, dh.p, dnw.p, 1e-6f, sel.p, selw.p, act.p, s, lc::GemvImpl::Tensor);
  CK(cudaStreamSynchronize(s));
  for (int which : {0, 1}) {  // gate/up, then down
    const PhaseTrace pt = trace_launch(s, [&] {
      if (which == 0)
        lc::moe_gate_up(dm.w, dl.p, dh.p, dnw.p, 1e-6f, sel.p, selw.p, act.p, s, lc::GemvImpl::Tensor);
      else
        lc::moe_down(dm.w, sel.p, selw.p, act.p, y.p, s, lc::GemvImpl::Tensor);
    });
    printf("moe-timing %s: blocks %d, median us after first entry: entry %.2f wait %.2f routed/table %.2f copies %.2f "
           "staged %.2f exit %.2f (max %.2f)\n",
           which == 0 ? "gate_up" : "down", pt.blocks, pt.med[0], pt.med[1], pt.med[5], pt.med[2], pt.med[3],
           pt.med[7], pt.exit_max);
    EXPECT_GT(pt.blocks, 0) << "the trace recorded no block";
  }
  cudaStreamDestroy(s);
}
