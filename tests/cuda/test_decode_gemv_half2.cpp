// The half2 decode GEMV (GemvImpl::Half2, LILAC_GEMV=half2) against the CPU fp32 reference (src/cpu/ops.h)
// on random inputs: a fresh seed per run (printed on failure), outputs poisoned with NaN before each
// launch, the model's shapes, sizes that are not multiples of the 4-row quads, inputs of large and of
// mixed magnitude (fp16 range handling), every prologue, accumulate, the conv epilogue, the MoE
// gather-GEMVs. 8-bit matrices fall back to the fp32 kernel (one case checks that path still works).
//
// Error budget (relative, ‖Δ‖/‖ref‖, random centred weights):
//  - input rounding: x̂ = fp16(x / sg) with sg a power of two per chunk of 32: relative error ≤ 2^-11
//    per element (rms ≈ 2^-12 ≈ 2.4e-4; scale invariant, so large inputs or heavy tails do not change
//    it; only values below 2^-14 of the chunk's power of two become subnormal, negligible);
//  - fp16 accumulation: per 16-byte chunk, each half of two half2 accumulators takes 8 fused products
//    (one rounding each, relative 2^-11 of the partial sum): ≈ √32·2^-12 relative to the chunk's
//    partial sums, about 6e-4..1e-3 of the row value; chunks are summed in fp32.
//  Together ≈ 1e-3; bound 3e-3 (≈ 3× margin: fp16 errors are not a concern of a few outliers, they
//  are averaged over ≥ 256 rows). A wrong activation layout, scale or offset gives errors of 1e-2..1.
//  Besides, against a host model of the input rounding (the same x̂, exact products and sums, in
//  double): the fp16 accumulation alone, bound 2e-3. With fewer than 256 rows the ratio is noisy:
//  bound 1e-2 there (still far below a layout error).
#include <gtest/gtest.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "cpu/ops.h"
#include "model/quant.h"
#include "cuda/kernels/decode.h"
#include "decode_test_util.h"

using namespace lilac;
namespace lc = lilac::cuda;

namespace {

using namespace lilac::cuda::testing;

// Round to the nearest fp16 value (ties to even), ignoring overflow (the kernel's inputs are < 1).
double round_fp16(double v) {
  if (v == 0.0) return 0.0;
  const double a = std::fabs(v);
  if (a < std::ldexp(1.0, -14)) return std::nearbyint(v * std::ldexp(1.0, 24)) * std::ldexp(1.0, -24);
  int e = 0;
  std::frexp(a, &e);  // a = m·2^e, m in [0.5, 1): 11 significant bits → ulp 2^(e-11)
  return std::nearbyint(v * std::ldexp(1.0, 11 - e)) * std::ldexp(1.0, e - 11);
}

// The kernel's fp16 input, rescaled: per chunk of 32, sg = 2^e with max|x| = m·2^e, m in [0.5, 1);
// x̂ = sg·fp16(x / sg) (odd pairs are staged as x/(16 sg): the same rounding, outside subnormals).
std::vector<float> half_input(const std::vector<float>& x) {
  std::vector<float> o(x.size());
  for (size_t c = 0; c < x.size(); c += 32) {
    float amax = 0.f;
    for (size_t i = c; i < c + 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    int e = 0;
    if (amax > 0.f) std::frexp(amax, &e);
    for (size_t i = c; i < c + 32; ++i) o[i] = float(std::ldexp(round_fp16(std::ldexp(double(x[i]), -e)), e));
  }
  return o;
}

// Host model: Σ s·q·x̂ + b·x per row... in the kernel's form s·((q − 8)·x̂ + 8·x) + b·x, in double.
std::vector<float> model_rows(const QMatrix& m, int64_t row0, int64_t nrows, const std::vector<float>& x,
                              const std::vector<float>& xh) {
  const int per = 32 / m.bits;
  const uint32_t mask = (1u << m.bits) - 1u;
  std::vector<float> y(static_cast<size_t>(nrows));
  for (int64_t r = row0; r < row0 + nrows; ++r) {
    double acc = 0;
    for (int64_t c = 0; c < m.cols; ++c) {
      const uint32_t w = m.qweight[size_t(r * m.words_per_row() + c / per)];
      const double q = double((w >> ((c % per) * m.bits)) & mask);
      const int64_t g = r * m.groups_per_row() + c / m.group_size;
      const double s = bf16_to_f32(m.scales[size_t(g)]), b = bf16_to_f32(m.biases[size_t(g)]);
      acc += s * ((q - 8.0) * xh[size_t(c)] + 8.0 * x[size_t(c)]) + b * x[size_t(c)];
    }
    y[size_t(r - row0)] = float(acc);
  }
  return y;
}

enum class Mag { Normal, Large, Huge, Mixed };

std::vector<float> make_input(Rng& r, size_t n, Mag mag) {
  switch (mag) {
    case Mag::Normal: return randv(r, n, 2.f);
    case Mag::Large: return randv(r, n, 30.f);
    case Mag::Huge: return randv(r, n, 3e5f);  // far beyond fp16's 65504
    case Mag::Mixed: {  // chunks of very different magnitude, some all zero
      auto v = randv(r, n);
      for (size_t c = 0; c < n; c += 32) {
        const int k = int(r.word() % 6);
        const float f = k == 0 ? 0.f : std::ldexp(1.f, -20 + 8 * k);  // 2^-12 .. 2^20
        for (size_t i = c; i < c + 32; ++i) v[i] *= f;
      }
      return v;
    }
  }
  return {};
}

struct Case {
  int64_t rows, cols;
  int bits;
  bool all_prologues;
  Mag mag = Mag::Normal;
};

void run_case(Rng& r, const Case& c) {
  SCOPED_TRACE("rows " + std::to_string(c.rows) + " cols " + std::to_string(c.cols) + " bits " +
               std::to_string(c.bits) + " magnitude " + std::to_string(int(c.mag)));
  HostQ hq(r, c.rows, c.cols, c.bits);
  DevQ dq(hq);
  const auto x = make_input(r, size_t(c.cols), c.mag);
  std::vector<float> w1 = randv(r, size_t(c.cols), 0.3f);
  for (auto& v : w1) v += 1.f;
  const int hd = 64;
  const auto z = randv(r, size_t(c.cols));
  std::vector<float> gw(hd);
  for (auto& v : gw) v = r.uni(0.5f, 1.5f);
  Dev<float> dx(x), dw(w1), dz(z), dgw(gw), dy(size_t(c.rows));
  const int npro = c.all_prologues ? 3 : 1;
  for (int pro = 0; pro < npro; ++pro) {
    for (int acc = 0; acc < (c.all_prologues ? 2 : 1); ++acc) {
      SCOPED_TRACE("prologue " + std::to_string(pro) + " accumulate " + std::to_string(acc));
      std::vector<float> xin(x);
      if (pro == 1) cpu::rmsnorm(x.data(), w1.data(), c.cols, 1e-6f, xin.data());
      if (pro == 2)
        for (int64_t h = 0; h < c.cols / hd; ++h)
          cpu::gated_rmsnorm(x.data() + h * hd, z.data() + h * hd, gw.data(), hd, 1e-6f, xin.data() + h * hd);
      std::vector<float> ref(size_t(c.rows));
      cpu::qmatvec(hq.m, xin.data(), ref.data());
      std::vector<float> model = c.bits == 4 ? model_rows(hq.m, 0, c.rows, xin, half_input(xin)) : ref;
      const auto y0 = randv(r, size_t(c.rows));
      if (acc) {
        dy.set(y0);
      } else {
        dy.poison();
      }
      lc::GemvArgs a;
      a.W = dq.d;
      a.x = dx.p;
      a.y = dy.p;
      a.accumulate = acc;
      a.pro = lc::Prologue(pro);
      a.norm_w = pro == 2 ? dgw.p : dw.p;
      a.z = dz.p;
      a.head_dim = hd;
      a.eps = 1e-6f;
      a.impl = lc::GemvImpl::Half2;
      lc::gemv(a, nullptr);
      CK(cudaDeviceSynchronize());
      auto got = dy.get();
      if (acc)  // compare the product itself (adding y0 to both would dilute the ratio)
        for (size_t i = 0; i < got.size(); ++i) got[i] -= y0[i];
      const bool many = c.rows >= 256;
      EXPECT_LE(rel_err(got, ref), many ? 3e-3 : 1e-2) << "vs fp32";
      EXPECT_LE(rel_err(got, model), many ? 2e-3 : 1e-2) << "vs the host model of the fp16 input";
    }
  }
}

TEST(CudaDecodeHalf2, GemvMatchesCpuOddSizes) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  for (const Case c : {Case{1001, 448, 4, true}, Case{77, 192, 4, true}, Case{3, 64, 4, true}, Case{1, 128, 4, true},
                       Case{5, 4096, 4, true}, Case{257, 320, 4, true}, Case{258, 320, 8, true}})
    run_case(r, c);
}

TEST(CudaDecodeHalf2, GemvMatchesCpuModelShapes) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  // in_proj-like 2048→8192, 2048→512, out_proj 4096→2048, 512→2048.
  for (const Case c : {Case{8192, 2048, 4, true}, Case{512, 2048, 4, true}, Case{2048, 4096, 4, true},
                       Case{2048, 512, 4, true}})
    run_case(r, c);
}

TEST(CudaDecodeHalf2, GemvLargeAndMixedInputs) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  for (const Mag m : {Mag::Large, Mag::Huge, Mag::Mixed})
    for (const Case c : {Case{2048, 4096, 4, true, m}, Case{8192, 2048, 4, false, m}, Case{301, 448, 4, false, m}})
      run_case(r, c);
}

TEST(CudaDecodeHalf2, GemvLmHeadShape) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  run_case(r, Case{248320, 2048, 4, false});
}

TEST(CudaDecodeHalf2, GemvConvEpilogueMatchesCpu) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  const int64_t rows = 301, cols = 256, conv_rows = 201;
  const int K = 4;
  HostQ hq(r, rows, cols, 4);
  DevQ dq(hq);
  auto cw = randv(r, size_t(conv_rows * K), 0.5f);
  auto st = randv(r, size_t(conv_rows * (K - 1)));
  auto st_model = st;
  Dev<float> dcw(cw), dst(st), dy(static_cast<size_t>(rows));
  for (int step = 0; step < 3; ++step) {
    const auto x = randv(r, size_t(cols));
    Dev<float> dx(x);
    std::vector<float> ref(static_cast<size_t>(rows));
    cpu::qmatvec(hq.m, x.data(), ref.data());
    cpu::conv1d_silu_step(cw.data(), conv_rows, K, st_model.data(), ref.data(), ref.data());
    dy.poison();
    lc::GemvArgs a;
    a.W = dq.d;
    a.x = dx.p;
    a.y = dy.p;
    a.conv_rows = int(conv_rows);
    a.conv_k = K;
    a.conv_w = dcw.p;
    a.conv_state = dst.p;
    a.impl = lc::GemvImpl::Half2;
    lc::gemv(a, nullptr);
    CK(cudaDeviceSynchronize());
    EXPECT_LE(rel_err(dy.get(), ref), 3e-3) << "step " << step;
    EXPECT_LE(rel_err(dst.get(), st_model), 3e-3) << "conv state, step " << step;
    st_model = dst.get();  // continue from the GPU's state (the errors must not compound in the check)
  }
}

// MoE: routing by cpu::moe_route, gate/up/down rows from dequantize_row, SwiGLU, all in double (the
// fp32 reference). (1) moe_gate_up Half2 + moe_down Fp32: gate and up each ≈ 1e-3, the product
// ≈ √2 of it; (2) moe_down Half2 on the GPU's own act vs moe_down Fp32 on the same act: ≈ 1e-3
// (relative fp16 errors are scale invariant, so act's heavy tails do not matter). Bound 3e-3 where the
// output has 2048 rows, 1e-2 for the small shapes.
TEST(CudaDecodeHalf2, MoEGateUpAndDownMatchCpu) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  struct MCase {
    int E, k;
    int64_t H, I, Is;
    int bits;
    float hscale;
  };
  for (const MCase c : {MCase{256, 8, 2048, 512, 512, 4, 1.5f}, MCase{256, 8, 2048, 512, 512, 4, 40.f},
                        MCase{16, 4, 256, 128, 128, 4, 1.f}, MCase{37, 3, 320, 64, 192, 4, 1.f},
                        MCase{16, 4, 448, 128, 64, 8, 1.f}}) {
    SCOPED_TRACE("E " + std::to_string(c.E) + " H " + std::to_string(c.H) + " bits " + std::to_string(c.bits));
    HostQ gate(r, c.I * c.E, c.H, c.bits), up(r, c.I * c.E, c.H, c.bits), down(r, c.H * c.E, c.I, c.bits);
    HostQ sg(r, c.Is, c.H, c.bits), su(r, c.Is, c.H, c.bits), sd(r, c.H, c.Is, c.bits);
    HostQ router(r, c.E, c.H, 8), seg(r, 1, c.H, 8);
    const auto h = randv(r, size_t(c.H), c.hscale);
    std::vector<float> nw(size_t(c.H));
    for (auto& v : nw) v = r.uni(0.7f, 1.3f);
    std::vector<float> xn(size_t(c.H));
    cpu::rmsnorm(h.data(), nw.data(), c.H, 1e-6f, xn.data());
    std::vector<float> logits(size_t(c.E + 1));
    cpu::qmatvec(router.m, xn.data(), logits.data());
    cpu::qmatvec(seg.m, xn.data(), logits.data() + c.E);
    std::vector<int> ids(size_t(c.k));
    std::vector<float> wts(size_t(c.k));
    cpu::moe_route(logits.data(), c.E, c.k, true, ids.data(), wts.data());
    const float shared_w = 1.f / (1.f + std::exp(-logits[size_t(c.E)]));
    std::vector<double> ref(size_t(c.H), 0.0);
    for (int t = 0; t <= c.k; ++t) {
      const bool sh = t == c.k;
      const QMatrix& G = sh ? sg.m : gate.m;
      const QMatrix& U = sh ? su.m : up.m;
      const int64_t rows = sh ? c.Is : c.I, row0 = sh ? 0 : int64_t(ids[size_t(t)]) * c.I;
      const float wt = sh ? shared_w : wts[size_t(t)];
      std::vector<float> ar(static_cast<size_t>(rows)), grow(static_cast<size_t>(c.H));
      for (int64_t j = 0; j < rows; ++j) {
        dequantize_row(G, row0 + j, grow.data());
        double sg_ = 0, su_ = 0;
        for (int64_t i = 0; i < c.H; ++i) sg_ += double(grow[size_t(i)]) * xn[size_t(i)];
        dequantize_row(U, row0 + j, grow.data());
        for (int64_t i = 0; i < c.H; ++i) su_ += double(grow[size_t(i)]) * xn[size_t(i)];
        ar[size_t(j)] = float(sg_ / (1.0 + std::exp(-sg_)) * su_);
      }
      const QMatrix& D = sh ? sd.m : down.m;
      const int64_t drow0 = sh ? 0 : int64_t(ids[size_t(t)]) * c.H;
      std::vector<float> drow(static_cast<size_t>(rows));
      for (int64_t o = 0; o < c.H; ++o) {
        dequantize_row(D, drow0 + o, drow.data());
        double a2 = 0;
        for (int64_t j = 0; j < rows; ++j) a2 += double(drow[size_t(j)]) * ar[size_t(j)];
        ref[size_t(o)] += wt * a2;
      }
    }

    DevMoE dmoe(gate, up, down, sg, su, sd, c.E, c.k, c.I, c.H);
    const lc::MoEDecodeWeights& dw = dmoe.w;
    Dev<float> dl(logits), dh(h), dnw(nw), act(size_t(c.k * c.I + c.Is)), y(size_t(c.H)), selw(size_t(c.k + 1));
    Dev<int32_t> sel(size_t(c.k));
    act.poison();
    selw.poison();
    const auto y0 = randv(r, size_t(c.H));
    y.set(y0);
    lc::moe_gate_up(dw, dl.p, dh.p, dnw.p, 1e-6f, sel.p, selw.p, act.p, nullptr, lc::GemvImpl::Half2);
    lc::moe_down(dw, sel.p, selw.p, act.p, y.p, nullptr, lc::GemvImpl::Fp32);
    CK(cudaDeviceSynchronize());
    const auto gs = sel.get();
    for (int i = 0; i < c.k; ++i) EXPECT_EQ(gs[size_t(i)], ids[size_t(i)]) << "slot " << i;
    auto got = y.get();
    for (size_t i = 0; i < got.size(); ++i) got[i] -= y0[i];
    std::vector<float> rf(ref.begin(), ref.end());
    const double bound = c.H >= 2048 ? 3e-3 : 1e-2;
    EXPECT_LE(rel_err(got, rf), bound) << "gate/up half2 + down fp32 vs fp32";

    y.set(y0);
    lc::moe_down(dw, sel.p, selw.p, act.p, y.p, nullptr, lc::GemvImpl::Half2);
    CK(cudaDeviceSynchronize());
    auto got2 = y.get();
    for (size_t i = 0; i < got2.size(); ++i) got2[i] -= y0[i];
    EXPECT_LE(rel_err(got2, got), bound) << "moe_down half2 vs fp32 on the same act";
    EXPECT_LE(rel_err(got2, rf), 1.5 * bound) << "all half2 vs fp32";
  }
}

// LILAC_GEMV=half2 selects the variant for GemvImpl::FromEnv (the default).
TEST(CudaDecodeHalf2, EnvironmentSelectsTheVariant) {
  const char* old = std::getenv("LILAC_GEMV");
  const std::string saved = old ? old : "";
  setenv("LILAC_GEMV", "half2", 1);
  EXPECT_EQ(lc::gemv_impl_from_env(), lc::GemvImpl::Half2);
  setenv("LILAC_GEMV", "dp4a", 1);
  EXPECT_EQ(lc::gemv_impl_from_env(), lc::GemvImpl::Dp4a);
  unsetenv("LILAC_GEMV");
  EXPECT_EQ(lc::gemv_impl_from_env(), lc::GemvImpl::Tensor);
  if (old) setenv("LILAC_GEMV", saved.c_str(), 1);
}

}  // namespace
