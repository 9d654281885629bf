// The dp4a decode GEMV (GemvImpl::Dp4a, LILAC_GEMV=dp4a) against the CPU reference (src/cpu/ops.h) on
// random inputs: a fresh seed per run (printed on failure), outputs poisoned with NaN before each launch,
// the model's shapes and sizes that are not multiples of the tiles (rows not a multiple of the 4-row
// quads, columns of 7 or 3 groups), 4- and 8-bit, every prologue, accumulate, the conv epilogue.
//
// Two checks per launch:
// 1. Exact arithmetic: against a host model of the kernel's arithmetic (the same int8 input, the same
//    per-chunk correction), in double. With Prologue::None the host and the GPU quantize the identical
//    fp32 input with the identical IEEE operations, so the only differences are fp32 summation order:
//    ‖Δ‖/‖ref‖ ≤ 1e-4. With the norm prologues the GPU's normalised input differs from the host's by
//    fp32 rounding, which can move a value across a rounding boundary of the int8 grid (probability
//    ~1e-5 per value); one such flip changes y by about d·‖column‖, i.e. ‖Δ‖/‖ref‖ ≈ d/‖x‖, so the bound
//    is 1e-4 + 3·max_g(d_g)/‖x‖ (at most ~2e-3 here). A wrong activation layout or correction term
//    gives errors of order 1e-2..1.
// 2. Accuracy: against the fp32 CPU reference. The int8 rounding error e (|e| ≤ d/2, d = max|x|/127
//    per group of 64) only meets the centred weights, so ‖Δ‖/‖ref‖ ≈ ‖e‖/‖x‖ for random centred
//    weights: ≈ 6e-3 for Gaussian inputs (max ≈ 2.5σ per 64), ≈ 7e-3 after RMSNorm with random
//    multipliers, ≈ 1.2e-2 for the gated head norm (x·silu(z) is heavy-tailed: max ≈ 5 rms).
//    Bound: 1e-2 for Prologue::None / RmsNorm (cols >= 2048); for every prologue 1.5·‖e‖/‖x‖ + 1e-4 with ‖e‖/‖x‖
//    measured on the host's quantization of the CPU's input. Checked for rows ≥ 256 (fewer rows make
//    the ratio a noisy estimate; check 1 covers those).
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

// The kernel's int8 input: per group of 64, d = max|x|/127, q = round-half-even(x · (127/max|x|)).
struct Int8Input {
  std::vector<float> xhat;  // d·q
  double max_d = 0, err_ratio = 0;  // max_g d_g; ‖x̂ − x‖/‖x‖
};
Int8Input quantize_host(const std::vector<float>& x) {
  Int8Input o;
  o.xhat.resize(x.size());
  double ee = 0, xx = 0;
  for (size_t g = 0; g < x.size(); g += 64) {
    float amax = 0.f;
    for (size_t i = g; i < g + 64; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float d = amax / 127.f;
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    o.max_d = std::max(o.max_d, double(d));
    for (size_t i = g; i < g + 64; ++i) {
      const float qf = std::nearbyint(x[i] * inv);  // default rounding mode: to nearest, ties to even
      const float q = std::max(-127.f, std::min(127.f, qf));
      o.xhat[i] = d * q;
      ee += (double(o.xhat[i]) - x[i]) * (double(o.xhat[i]) - x[i]);
      xx += double(x[i]) * x[i];
    }
  }
  o.err_ratio = std::sqrt(ee / std::max(xx, 1e-30));
  return o;
}

// Host model of the dp4a kernel's arithmetic, in double: per element
// s_g·(q·x̂ + zc·(x − x̂)) + b_g·x, zc = (2^bits − 1)/2.
std::vector<float> dp4a_model_rows(const QMatrix& m, int64_t row0, int64_t nrows, const std::vector<float>& x,
                                   const Int8Input& xi) {
  const int per = 32 / m.bits;
  const uint32_t mask = (1u << m.bits) - 1u;
  const double zc = double((1 << m.bits) - 1) * 0.5;
  std::vector<float> y(static_cast<size_t>(nrows));
  for (int64_t r = row0; r < row0 + nrows; ++r) {
    double acc = 0;
    for (int64_t c = 0; c < m.cols; ++c) {
      const uint32_t w = m.qweight[size_t(r * m.words_per_row() + c / per)];
      const double q = double((w >> ((c % per) * m.bits)) & mask);
      const int64_t g = r * m.groups_per_row() + c / m.group_size;
      const double s = bf16_to_f32(m.scales[size_t(g)]), b = bf16_to_f32(m.biases[size_t(g)]);
      const double xv = x[size_t(c)], xh = xi.xhat[size_t(c)];
      acc += s * (q * xh + zc * (xv - xh)) + b * xv;
    }
    y[size_t(r - row0)] = float(acc);
  }
  return y;
}

std::vector<float> dp4a_model(const HostQ& h, const std::vector<float>& x, const Int8Input& xi) {
  const QMatrix& m = h.m;
  const int per = 32 / m.bits;
  const uint32_t mask = (1u << m.bits) - 1u;
  const double zc = double((1 << m.bits) - 1) * 0.5;
  std::vector<float> y(size_t(m.rows));
  for (int64_t r = 0; r < m.rows; ++r) {
    double acc = 0;
    for (int64_t c = 0; c < m.cols; ++c) {
      const uint32_t w = h.q[size_t(r * m.words_per_row() + c / per)];
      const double q = double((w >> ((c % per) * m.bits)) & mask);
      const int64_t g = r * m.groups_per_row() + c / m.group_size;
      const double s = bf16_to_f32(h.s[size_t(g)]), b = bf16_to_f32(h.b[size_t(g)]);
      const double xv = x[size_t(c)], xh = xi.xhat[size_t(c)];
      acc += s * (q * xh + zc * (xv - xh)) + b * xv;
    }
    y[size_t(r)] = float(acc);
  }
  return y;
}

struct Case {
  int64_t rows, cols;
  int bits;
  bool all_prologues;
};

void run_case(Rng& r, const Case& c) {
  SCOPED_TRACE("rows " + std::to_string(c.rows) + " cols " + std::to_string(c.cols) + " bits " +
               std::to_string(c.bits));
  HostQ hq(r, c.rows, c.cols, c.bits);
  DevQ dq(hq);
  const auto x = randv(r, size_t(c.cols), 2.f);
  std::vector<float> w1 = randv(r, size_t(c.cols), 0.3f);
  for (auto& v : w1) v += 1.f;
  const int hd = 64;
  const auto z = randv(r, size_t(c.cols));
  std::vector<float> gw(hd);
  for (auto& v : gw) v = r.uni(0.5f, 1.5f);
  Dev<float> dx(x), dw(w1), dz(z), dgw(gw), dy(size_t(c.rows));
  const int npro = c.all_prologues ? 3 : 2;
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
      const Int8Input xi = quantize_host(xin);
      std::vector<float> model = dp4a_model(hq, xin, xi);
      const auto y0 = randv(r, size_t(c.rows));
      if (acc) {
        dy.set(y0);
        for (size_t i = 0; i < ref.size(); ++i) {
          ref[i] += y0[i];
          model[i] += y0[i];
        }
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
      a.impl = lc::GemvImpl::Dp4a;
      lc::gemv(a, nullptr);
      CK(cudaDeviceSynchronize());
      const auto got = dy.get();
      double xn = 0;
      for (float v : xin) xn += double(v) * v;
      const double tol_model = pro == 0 ? 1e-4 : 1e-4 + 3 * xi.max_d / std::sqrt(xn);
      EXPECT_LE(rel_err(got, model), tol_model) << "vs the host model of the int8 arithmetic";
      if (c.rows >= 256 && !acc) {  // accumulate adds y0 to both: the ratio would be diluted
        const double e = rel_err(got, ref);
        EXPECT_LE(e, 1.5 * xi.err_ratio + 1e-4) << "vs fp32; input rounding error " << xi.err_ratio;
        if (pro != 2 && c.cols >= 2048) {  // ‖e‖/‖x‖ over >= 32 groups: concentrated near 6-7e-3
          EXPECT_LE(e, 1e-2) << "vs fp32";
        }
      }
    }
  }
}

TEST(CudaDecodeDp4a, GemvMatchesCpuOddSizes) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  for (const Case c : {Case{1001, 448, 4, true}, Case{77, 192, 4, true}, Case{3, 64, 4, true}, Case{3, 64, 8, true},
                       Case{257, 2048, 8, true}, Case{517, 448, 8, true}, Case{1, 128, 4, true},
                       Case{5, 4096, 4, true}, Case{258, 320, 8, true}})
    run_case(r, c);
}

TEST(CudaDecodeDp4a, GemvMatchesCpuModelShapes) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  // in_proj-like 2048→8192, 2048→512, out_proj 4096→2048, 512→2048, the 8-bit router 2048→257.
  for (const Case c : {Case{8192, 2048, 4, true}, Case{512, 2048, 4, true}, Case{2048, 4096, 4, true},
                       Case{2048, 512, 4, true}, Case{257, 2048, 8, true}, Case{2048, 512, 8, true}})
    run_case(r, c);
}

TEST(CudaDecodeDp4a, GemvLmHeadShape) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  run_case(r, Case{248320, 2048, 4, false});  // None and RmsNorm (the LM head's), no accumulate
}

TEST(CudaDecodeDp4a, GemvConvEpilogueMatchesCpu) {
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
    // Prologue::None: the host model is exact up to summation order (see the top of the file).
    std::vector<float> ref = dp4a_model(hq, x, quantize_host(x));
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
    a.impl = lc::GemvImpl::Dp4a;
    lc::gemv(a, nullptr);
    CK(cudaDeviceSynchronize());
    EXPECT_LE(rel_err(dy.get(), ref), 1e-4) << "step " << step;
    EXPECT_LE(rel_err(dst.get(), st_model), 1e-4) << "conv state, step " << step;
  }
}

// moe_gate_up with GemvImpl::Dp4a (gate/up from the int8 normalised input), moe_down fp32. Checked
// against a host model (routing by cpu::moe_route from the same logits; gate/up rows by the host model
// of the int8 arithmetic; SwiGLU; down in double): the normalised input differs from the host's by fp32
// rounding, so the bound is that of the norm prologues above, 1e-4 + 3·max_d/‖x‖ (applied to y; the
// SwiGLU product and the weighted sum of 9 experts do not amplify a single flip beyond it for these
// random weights). And against cpu::moe_forward (all fp32): gate and up each carry ≈ ‖e‖/‖x‖ of relative
// error, their product about √2 of it: bound 3·‖e‖/‖x‖ + 1e-4 (E = 256 case: 2048 output rows).
TEST(CudaDecodeDp4a, MoEGateUpAndDownMatchCpu) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  struct MCase {
    int E, k;
    int64_t H, I, Is;
    int bits;
  };
  for (const MCase c : {MCase{256, 8, 2048, 512, 512, 4}, MCase{16, 4, 256, 128, 128, 4}, MCase{37, 3, 320, 64, 192, 4},
                        MCase{16, 4, 448, 128, 64, 8}}) {
    SCOPED_TRACE("E " + std::to_string(c.E) + " H " + std::to_string(c.H) + " bits " + std::to_string(c.bits));
    HostQ gate(r, c.I * c.E, c.H, c.bits), up(r, c.I * c.E, c.H, c.bits), down(r, c.H * c.E, c.I, c.bits);
    HostQ sg(r, c.Is, c.H, c.bits), su(r, c.Is, c.H, c.bits), sd(r, c.H, c.Is, c.bits);
    HostQ router(r, c.E, c.H, 8), seg(r, 1, c.H, 8);
    const auto h = randv(r, size_t(c.H), 1.5f);
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
    // host model and fp32 reference of y
    const Int8Input xi = quantize_host(xn);
    std::vector<double> model(size_t(c.H), 0.0), ref(size_t(c.H), 0.0);
    for (int t = 0; t <= c.k; ++t) {
      const bool sh = t == c.k;
      const QMatrix& G = sh ? sg.m : gate.m;
      const QMatrix& U = sh ? su.m : up.m;
      const int64_t rows = sh ? c.Is : c.I, row0 = sh ? 0 : int64_t(ids[size_t(t)]) * c.I;
      const float wt = sh ? shared_w : wts[size_t(t)];
      const auto gm = dp4a_model_rows(G, row0, rows, xn, xi), um = dp4a_model_rows(U, row0, rows, xn, xi);
      std::vector<float> am(static_cast<size_t>(rows)), ar(static_cast<size_t>(rows));
      std::vector<float> grow(static_cast<size_t>(c.H));
      for (int64_t j = 0; j < rows; ++j) {
        dequantize_row(G, row0 + j, grow.data());
        double sg_ = 0, su_ = 0;
        for (int64_t i = 0; i < c.H; ++i) sg_ += double(grow[size_t(i)]) * xn[size_t(i)];
        dequantize_row(U, row0 + j, grow.data());
        for (int64_t i = 0; i < c.H; ++i) su_ += double(grow[size_t(i)]) * xn[size_t(i)];
        const auto silu = [](double v) { return v / (1.0 + std::exp(-v)); };
        am[size_t(j)] = float(silu(gm[size_t(j)]) * um[size_t(j)]);
        ar[size_t(j)] = float(silu(sg_) * su_);
      }
      const QMatrix& D = sh ? sd.m : down.m;
      const int64_t drow0 = sh ? 0 : int64_t(ids[size_t(t)]) * c.H;
      std::vector<float> drow(static_cast<size_t>(rows));
      for (int64_t o = 0; o < c.H; ++o) {
        dequantize_row(D, drow0 + o, drow.data());
        double a1 = 0, a2 = 0;
        for (int64_t j = 0; j < rows; ++j) {
          a1 += double(drow[size_t(j)]) * am[size_t(j)];
          a2 += double(drow[size_t(j)]) * ar[size_t(j)];
        }
        model[size_t(o)] += wt * a1;
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
    lc::moe_gate_up(dw, dl.p, dh.p, dnw.p, 1e-6f, sel.p, selw.p, act.p, nullptr, lc::GemvImpl::Dp4a);
    lc::moe_down(dw, sel.p, selw.p, act.p, y.p, nullptr, lc::GemvImpl::Fp32);
    CK(cudaDeviceSynchronize());
    const auto gs = sel.get();
    for (int i = 0; i < c.k; ++i) EXPECT_EQ(gs[size_t(i)], ids[size_t(i)]) << "slot " << i;
    auto got = y.get();
    for (size_t i = 0; i < got.size(); ++i) got[i] -= y0[i];
    std::vector<float> mf(model.begin(), model.end()), rf(ref.begin(), ref.end());
    double xx = 0;
    for (float v : xn) xx += double(v) * v;
    EXPECT_LE(rel_err(got, mf), 1e-4 + 3 * xi.max_d / std::sqrt(xx)) << "vs the host model of the int8 arithmetic";
    if (c.H >= 2048) {
      EXPECT_LE(rel_err(got, rf), 3 * xi.err_ratio + 1e-4) << "vs fp32; input rounding error " << xi.err_ratio;
    }

    // moe_down with GemvImpl::Dp4a on the GPU's own act and weights: the host model sees the identical
    // fp32 input (no rounding-boundary flips), so only summation order differs: ≤ 1e-4. Against the fp32
    // down of the same act: ≈ ‖e‖/‖act‖ (act = silu(g)·u is heavy-tailed), bound 1.5·‖e‖/‖act‖ + 1e-4.
    const auto ga = act.get();
    const auto gw = selw.get();
    const Int8Input ai = quantize_host(ga);
    std::vector<double> dmodel(size_t(c.H), 0.0);
    for (int t = 0; t <= c.k; ++t) {
      const bool sh = t == c.k;
      const int64_t len = sh ? c.Is : c.I, off = int64_t(t) * c.I;
      const std::vector<float> seg_x(ga.begin() + off, ga.begin() + off + len);
      Int8Input seg_i;
      seg_i.xhat.assign(ai.xhat.begin() + off, ai.xhat.begin() + off + len);
      const auto part = dp4a_model_rows(sh ? sd.m : down.m, sh ? 0 : int64_t(gs[size_t(t)]) * c.H, c.H, seg_x, seg_i);
      for (int64_t o = 0; o < c.H; ++o) dmodel[size_t(o)] += double(gw[size_t(t)]) * part[size_t(o)];
    }
    y.set(y0);
    lc::moe_down(dw, sel.p, selw.p, act.p, y.p, nullptr, lc::GemvImpl::Dp4a);
    CK(cudaDeviceSynchronize());
    auto got2 = y.get();
    for (size_t i = 0; i < got2.size(); ++i) got2[i] -= y0[i];
    std::vector<float> dm(dmodel.begin(), dmodel.end());
    EXPECT_LE(rel_err(got2, dm), 1e-4) << "moe_down dp4a vs the host model";
    if (c.H >= 2048) {
      EXPECT_LE(rel_err(got2, got), 1.5 * ai.err_ratio + 1e-4) << "moe_down dp4a vs fp32; act rounding " << ai.err_ratio;
    }
  }
}

// LILAC_GEMV=dp4a selects the variant for GemvImpl::FromEnv (the default), fp32 the fp32 kernel; unset: tensor cores.
TEST(CudaDecodeDp4a, EnvironmentSelectsTheVariant) {
  const char* old = std::getenv("LILAC_GEMV");
  const std::string saved = old ? old : "";
  setenv("LILAC_GEMV", "dp4a", 1);
  EXPECT_EQ(lc::gemv_impl_from_env(), lc::GemvImpl::Dp4a);
  setenv("LILAC_GEMV", "fp32", 1);
  EXPECT_EQ(lc::gemv_impl_from_env(), lc::GemvImpl::Fp32);
  unsetenv("LILAC_GEMV");
  EXPECT_EQ(lc::gemv_impl_from_env(), lc::GemvImpl::Tensor);
  if (old) setenv("LILAC_GEMV", saved.c_str(), 1);
}

}  // namespace
