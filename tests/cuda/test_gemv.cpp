// The decode GEMV family (src/cuda/kernels/gemv/gemv.h) against the CPU reference ops (src/cpu/ops.h)
// on random inputs: dense GEMV with every prologue and the conv epilogue, the embedding gather, the MoE
// decode GEMVs (routing, gate/up, down). A fresh seed per run (printed on failure), outputs poisoned with
// NaN before each launch, sizes that are not multiples of the tiles (odd row counts, columns of 7
// groups). fp32 throughout, so errors are summation-order differences: ‖Δ‖/‖ref‖ ≤ 1e-5.
// (The tensor-core kernel at the model's shapes: test_gemv_tc.cpp.)
#include <gtest/gtest.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cpu/ops.h"
#include "cuda/kernels/gemv/gemv.h"
#include "decode_test_util.h"

using namespace lilac;
namespace lc = lilac::cuda;

namespace {

using namespace lilac::cuda::testing;

// ------------------------------------------------------------------------------------------------ GEMV
TEST(CudaDecode, GemvMatchesCpuAllPrologues) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  struct Case {
    int64_t rows, cols;
    int bits;
  };
  for (const Case c : {Case{1001, 448, 4}, Case{517, 2048, 4}, Case{257, 2048, 8}, Case{33, 4096, 4},
                       Case{2048, 512, 4}, Case{3, 64, 8}, Case{77, 192, 4}}) {
    SCOPED_TRACE("rows " + std::to_string(c.rows) + " cols " + std::to_string(c.cols) + " bits " +
                 std::to_string(c.bits));
    HostQ hq(r, c.rows, c.cols, c.bits);
    DevQ dq(hq);
    const auto x = randv(r, size_t(c.cols), 2.f);
    const auto nw = randv(r, size_t(c.cols), 0.3f);
    std::vector<float> w1(nw);
    for (auto& v : w1) v += 1.f;
    const int hd = 64;
    const auto z = randv(r, size_t(c.cols));
    std::vector<float> gw(hd);
    for (auto& v : gw) v = r.uni(0.5f, 1.5f);
    Dev<float> dx(x), dw(w1), dz(z), dgw(gw), dy(size_t(c.rows));
    for (int pro = 0; pro < 3; ++pro) {
      for (int acc = 0; acc < 2; ++acc) {
        SCOPED_TRACE("prologue " + std::to_string(pro) + " accumulate " + std::to_string(acc));
        std::vector<float> xin(x);
        if (pro == 1) cpu::rmsnorm(x.data(), w1.data(), c.cols, 1e-6f, xin.data());
        if (pro == 2)
          for (int64_t h = 0; h < c.cols / hd; ++h)
            cpu::gated_rmsnorm(x.data() + h * hd, z.data() + h * hd, gw.data(), hd, 1e-6f, xin.data() + h * hd);
        std::vector<float> ref(size_t(c.rows));
        cpu::qmatvec(hq.m, xin.data(), ref.data());
        const auto y0 = randv(r, size_t(c.rows));
        if (acc) {
          dy.set(y0);
          for (size_t i = 0; i < ref.size(); ++i) ref[i] += y0[i];
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
        lc::gemv(a, nullptr);
        CK(cudaDeviceSynchronize());
        EXPECT_LE(rel_err(dy.get(), ref), 1e-5);
      }
    }
  }
}

TEST(CudaDecode, GemvConvEpilogueMatchesCpu) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  const int64_t rows = 301, cols = 256, conv_rows = 200;
  const int K = 4;
  HostQ hq(r, rows, cols, 4);
  DevQ dq(hq);
  auto cw = randv(r, size_t(conv_rows * K), 0.5f);
  auto st = randv(r, size_t(conv_rows * (K - 1)));
  Dev<float> dcw(cw), dst(st), dy(static_cast<size_t>(rows));
  for (int step = 0; step < 3; ++step) {
    const auto x = randv(r, size_t(cols));
    Dev<float> dx(x);
    std::vector<float> ref(static_cast<size_t>(rows));
    cpu::qmatvec(hq.m, x.data(), ref.data());
    cpu::conv1d_silu_step(cw.data(), conv_rows, K, st.data(), ref.data(), ref.data());
    dy.poison();
    lc::GemvArgs a;
    a.W = dq.d;
    a.x = dx.p;
    a.y = dy.p;
    a.conv_rows = int(conv_rows);
    a.conv_k = K;
    a.conv_w = dcw.p;
    a.conv_state = dst.p;
    lc::gemv(a, nullptr);
    CK(cudaDeviceSynchronize());
    EXPECT_LE(rel_err(dy.get(), ref), 1e-5) << "step " << step;
    EXPECT_LE(rel_err(dst.get(), st), 1e-5) << "conv state, step " << step;
  }
}

TEST(CudaDecode, EmbedGatherMatchesCpu) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  Rng r(seed);
  for (int bits : {4, 8}) {
    HostQ hq(r, 999, 320, bits);
    DevQ dq(hq);
    const int32_t tok = int32_t(r.g() % 999);
    Dev<int32_t> dt(std::vector<int32_t>{tok});
    Dev<float> out(320);
    out.poison();
    lc::embed_gather(dq.d, dt.p, out.p, nullptr);
    CK(cudaDeviceSynchronize());
    std::vector<float> ref(320);
    cpu::embed_row(hq.m, tok, ref.data());
    EXPECT_LE(rel_err(out.get(), ref), 1e-6) << "seed " << seed << " bits " << bits;
  }
}

// ------------------------------------------------------------------------------------------------ MoE
TEST(CudaDecode, MoEMatchesCpu) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  struct Case {
    int E, k;
    int64_t H, I, Is;
  };
  for (const Case c : {Case{256, 8, 512, 192, 128}, Case{16, 4, 256, 128, 128}, Case{37, 3, 320, 64, 192},
                       Case{300, 8, 128, 64, 64}, Case{64, 8, 320, 512, 576}}) {
    SCOPED_TRACE("E " + std::to_string(c.E));
    HostQ gate(r, c.I * c.E, c.H, 4), up(r, c.I * c.E, c.H, 4), down(r, c.H * c.E, c.I, 4);
    HostQ sg(r, c.Is, c.H, 4), su(r, c.Is, c.H, 4), sd(r, c.H, c.Is, 4), router(r, c.E, c.H, 8), seg(r, 1, c.H, 8);
    MoEWeights w;
    w.router = router.m;
    w.gate.n = w.up.n = w.down.n = c.E;
    w.gate.first = gate.m;
    w.gate.first.rows = c.I;
    w.up.first = up.m;
    w.up.first.rows = c.I;
    w.down.first = down.m;
    w.down.first.rows = c.H;
    w.shared_gate = sg.m;
    w.shared_up = su.m;
    w.shared_down = sd.m;
    w.shared_expert_gate = seg.m;
    ModelConfig cfg;
    cfg.num_experts = c.E;
    cfg.num_experts_per_tok = c.k;
    cfg.hidden_size = c.H;
    cfg.moe_intermediate_size = c.I;
    cfg.shared_expert_intermediate_size = c.Is;
    cfg.norm_topk_prob = true;
    const auto h = randv(r, size_t(c.H), 1.5f);
    std::vector<float> nw(size_t(c.H));
    for (auto& v : nw) v = r.uni(0.7f, 1.3f);
    std::vector<float> xn(size_t(c.H));
    cpu::rmsnorm(h.data(), nw.data(), c.H, 1e-6f, xn.data());
    std::vector<float> logits(size_t(c.E + 1));
    cpu::qmatvec(router.m, xn.data(), logits.data());
    cpu::qmatvec(seg.m, xn.data(), logits.data() + c.E);
    std::vector<float> ref(size_t(c.H));
    cpu::moe_forward(w, cfg, xn.data(), 1, ref.data());
    std::vector<int> ids(size_t(c.k));
    std::vector<float> wts(size_t(c.k));
    cpu::moe_route(logits.data(), c.E, c.k, true, ids.data(), wts.data());

    DevMoE dmoe(gate, up, down, sg, su, sd, c.E, c.k, c.I, c.H);
    const lc::MoEDecodeWeights& dw = dmoe.w;
    Dev<float> dl(logits), dh(h), dnw(nw), act(size_t(c.k * c.I + c.Is)), y(size_t(c.H)), selw(size_t(c.k + 1));
    Dev<int32_t> sel(size_t(c.k));
    act.poison();
    selw.poison();
    const auto y0 = randv(r, size_t(c.H));
    y.set(y0);
    lc::moe_gate_up(dw, dl.p, dh.p, dnw.p, 1e-6f, sel.p, selw.p, act.p, nullptr);
    lc::moe_down(dw, sel.p, selw.p, act.p, y.p, nullptr);
    CK(cudaDeviceSynchronize());
    const auto gs = sel.get();
    const auto gw = selw.get();
    for (int i = 0; i < c.k; ++i) {
      EXPECT_EQ(gs[size_t(i)], ids[size_t(i)]) << "slot " << i;
      EXPECT_NEAR(gw[size_t(i)], wts[size_t(i)], 1e-6) << "slot " << i;
    }
    EXPECT_NEAR(gw[size_t(c.k)], 1.f / (1.f + std::exp(-logits[size_t(c.E)])), 1e-6);
    auto got = y.get();
    for (size_t i = 0; i < got.size(); ++i) got[i] -= y0[i];
    EXPECT_LE(rel_err(got, ref), 1e-5);
  }
}

// Ties in the probabilities go to the lower id, in every lane and slot: logits with exact ties (equal logits give
// equal probabilities on any device; a 0.25 grid keeps unequal ones apart), probabilities that underflow to 0 (the
// choice among them by id alone), four winners then ties. E = 320 takes the 16-slot routing.
TEST(CudaDecode, MoERoutingTiesGoToLowerId) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  const int k = 8;
  for (const int E : {64, 256, 320}) {
    SCOPED_TRACE("E " + std::to_string(E));
    const int64_t H = 64, I = 64;  // only routing is checked: tiny experts
    HostQ gate(r, I * E, H, 4), up(r, I * E, H, 4), down(r, H * E, I, 4), sg(r, I, H, 4), su(r, I, H, 4),
        sd(r, H, I, 4);
    DevMoE dmoe(gate, up, down, sg, su, sd, E, k, I, H);
    const lc::MoEDecodeWeights& dw = dmoe.w;
    auto route = [&](const std::vector<float>& logits) -> std::pair<std::vector<int32_t>, std::vector<float>> {
      Dev<float> dl(logits), dh(randv(r, H)), dnw(std::vector<float>(H, 1.f)), act(size_t(k * I + I)), selw(k + 1);
      Dev<int32_t> sel(k);
      sel.poison();
      lc::moe_gate_up(dw, dl.p, dh.p, dnw.p, 1e-6f, sel.p, selw.p, act.p, nullptr);
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      return std::make_pair(sel.get(), selw.get());
    };
    std::vector<float> logits(size_t(E + 1), 0.f);  // all equal: the top 8 must be ids 0..7
    for (int e = 40; e < 44; ++e) logits[size_t(e)] = 1.f;  // four clear winners first
    EXPECT_EQ(route(logits).first, (std::vector<int32_t>{40, 41, 42, 43, 0, 1, 2, 3}));
    for (int trial = 0; trial < 6; ++trial) {
      SCOPED_TRACE("trial " + std::to_string(trial));
      for (auto& v : logits) v = trial < 3 ? 0.25f * float(int(r.uni(0.f, 8.f))) : -200.f;
      if (trial >= 3)  // one to three experts hold everything; the rest underflow to probability 0
        for (int j = 0; j < trial - 2; ++j) logits[size_t(int(r.uni(0.f, float(E))) % E)] = 0.f;
      std::vector<int> ids(static_cast<size_t>(k));
      std::vector<float> wts(static_cast<size_t>(k));
      cpu::moe_route(logits.data(), E, k, true, ids.data(), wts.data());
      const auto [gs, gw] = route(logits);
      for (int i = 0; i < k; ++i) {
        EXPECT_EQ(gs[size_t(i)], ids[size_t(i)]) << "slot " << i;
        EXPECT_NEAR(gw[size_t(i)], wts[size_t(i)], 1e-6) << "slot " << i;
      }
    }
  }
}

}  // namespace
