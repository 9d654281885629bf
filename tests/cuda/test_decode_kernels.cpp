// Decode kernels (src/cuda/kernels/decode.h) against the CPU reference ops (src/cpu/ops.h) on random
// inputs: a fresh seed per run (printed on failure), outputs poisoned with NaN before each launch,
// sizes that are not multiples of the tiles (odd row counts, columns of 7 groups, odd context lengths).
// The decode path is fp32 except the bf16 KV cache (the test feeds the CPU the same bf16-rounded
// cache), so errors are fp32 summation-order differences: ‖Δ‖/‖ref‖ ≤ 1e-4 (attention 1e-4 on
// bf16-exact inputs; the q/k written to the cache are compared after bf16 rounding).
#include <gtest/gtest.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/bf16.h"
#include "cpu/ops.h"
#include "cuda/kernels/decode.h"
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

TEST(CudaDecode, MoERoutingTiesGoToLowerId) {
  NEED_GPU();
  const int E = 64, k = 8;
  Rng r(fresh_seed());
  const int64_t H = 64, I = 64;  // only routing is checked: tiny experts
  HostQ gate(r, I * E, H, 4), up(r, I * E, H, 4), down(r, H * E, I, 4), sg(r, I, H, 4), su(r, I, H, 4), sd(r, H, I, 4);
  DevMoE dmoe(gate, up, down, sg, su, sd, E, k, I, H);
  const lc::MoEDecodeWeights& dw = dmoe.w;
  std::vector<float> logits(E + 1, 0.f);  // all equal: the top 8 must be ids 0..7
  for (int e = 40; e < 44; ++e) logits[size_t(e)] = 1.f;  // four clear winners first
  Dev<float> dl(logits), dh(randv(r, H)), dnw(std::vector<float>(H, 1.f)), act(size_t(k * I + I)), selw(k + 1);
  Dev<int32_t> sel(k);
  lc::moe_gate_up(dw, dl.p, dh.p, dnw.p, 1e-6f, sel.p, selw.p, act.p, nullptr);
  CK(cudaDeviceSynchronize());
  const std::vector<int32_t> want = {40, 41, 42, 43, 0, 1, 2, 3};
  EXPECT_EQ(sel.get(), want);
}

// ------------------------------------------------------------------------------------------------ attention
TEST(CudaDecode, AttentionMatchesCpu) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  struct Case {
    int heads, kv, hd, rot;
    int64_t L;
    int split;
  };
  for (const Case c : {Case{16, 2, 256, 64, 1, 64}, Case{16, 2, 256, 64, 37, 64}, Case{16, 2, 256, 64, 1000, 64},
                       Case{4, 2, 64, 16, 77, 3}, Case{8, 2, 128, 32, 300, 1}, Case{16, 2, 256, 64, 3001, 64}}) {
    SCOPED_TRACE("L " + std::to_string(c.L) + " hd " + std::to_string(c.hd));
    const int64_t kvd = int64_t(c.kv) * c.hd, max_len = c.L + 5;
    const int64_t pos = c.L - 1;
    // cache rows [0, L-1) random (bf16-exact), the new token's k/v come from the projection
    std::vector<float> Kc(size_t(max_len * kvd)), Vc(Kc.size());
    std::vector<uint16_t> Kb(Kc.size()), Vb(Kc.size());
    for (size_t i = 0; i < Kc.size(); ++i) {
      Kb[i] = f32_to_bf16(r.normal());
      Vb[i] = f32_to_bf16(r.normal());
      Kc[i] = bf16_to_f32(Kb[i]);
      Vc[i] = bf16_to_f32(Vb[i]);
    }
    const auto qg = randv(r, size_t(c.heads) * c.hd * 2, 1.f);
    const auto kn = randv(r, size_t(kvd)), vn = randv(r, size_t(kvd));
    std::vector<float> qw(size_t(c.hd)), kw(size_t(c.hd));
    for (auto& v : qw) v = r.uni(0.5f, 1.5f);
    for (auto& v : kw) v = r.uni(0.5f, 1.5f);
    const auto inv = cpu::rope_inv_freq(c.rot, 1e7);
    // CPU: norm + rope
    std::vector<float> q(size_t(c.heads) * c.hd), gate(q.size());
    cpu::split_query_gate(qg.data(), c.heads, c.hd, q.data(), gate.data());
    for (int h = 0; h < c.heads; ++h) {
      cpu::rmsnorm(q.data() + h * c.hd, qw.data(), c.hd, 1e-6f, q.data() + h * c.hd);
      cpu::rope_with(q.data() + h * c.hd, c.rot, pos, inv.data());
    }
    std::vector<float> kr(kn);
    for (int h = 0; h < c.kv; ++h) {
      cpu::rmsnorm(kn.data() + h * c.hd, kw.data(), c.hd, 1e-6f, kr.data() + h * c.hd);
      cpu::rope_with(kr.data() + h * c.hd, c.rot, pos, inv.data());
    }
    // GPU
    Dev<float> dqg(qg), dk(kn), dv(vn), dqw(qw), dkw(kw), dinv(inv), qrot(q.size()), out(q.size());
    Dev<uint16_t> dK(Kb), dV(Vb);
    Dev<int32_t> dpos(std::vector<int32_t>{int32_t(pos)});
    Dev<float> partial(lc::attn_decode_partial_floats({c.heads, c.kv, c.hd, c.rot, 1e-6f}, c.split));
    qrot.poison();
    out.poison();
    partial.poison();
    lc::AttnDecodeShape s{c.heads, c.kv, c.hd, c.rot, 1e-6f};
    auto* Kd = reinterpret_cast<__nv_bfloat16*>(dK.p);
    auto* Vd = reinterpret_cast<__nv_bfloat16*>(dV.p);
    lc::attn_qk_norm_rope_append(s, dqg.p, dk.p, dv.p, dqw.p, dkw.p, dinv.p, dpos.p, qrot.p, Kd, Vd, nullptr);
    lc::attention_decode(s, qrot.p, dqg.p, Kd, Vd, dpos.p, c.split, partial.p, out.p, nullptr);
    CK(cudaDeviceSynchronize());
    EXPECT_LE(rel_err(qrot.get(), q), 1e-5);
    const auto Kg = dK.get(), Vg = dV.get();
    for (int64_t d = 0; d < kvd; ++d) {  // the new row: bf16 of the CPU's k / v
      EXPECT_NEAR(bf16_to_f32(Kg[size_t(pos * kvd + d)]), kr[size_t(d)], 1e-2 * std::fabs(kr[size_t(d)]) + 1e-3);
      EXPECT_EQ(Vg[size_t(pos * kvd + d)], f32_to_bf16(vn[size_t(d)]));
      Kc[size_t(pos * kvd + d)] = bf16_to_f32(Kg[size_t(pos * kvd + d)]);
      Vc[size_t(pos * kvd + d)] = bf16_to_f32(Vg[size_t(pos * kvd + d)]);
    }
    std::vector<float> ref(q.size()), scores(size_t(c.L));
    cpu::gated_attention_token(q.data(), gate.data(), Kc.data(), Vc.data(), c.L, c.heads, c.kv, c.hd, ref.data(),
                               scores.data());
    EXPECT_LE(rel_err(out.get(), ref), 1e-4);
  }
}

// ------------------------------------------------------------------------------------------------ GDN
TEST(CudaDecode, GatedDeltaNetStepMatchesCpu) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  struct Case {
    int Hk, Hv, dk, dv;
  };
  for (const Case c : {Case{16, 32, 128, 128}, Case{2, 8, 48, 80}, Case{3, 3, 64, 33}}) {
    SCOPED_TRACE("dk " + std::to_string(c.dk) + " dv " + std::to_string(c.dv));
    const int64_t C = 2LL * c.Hk * c.dk + int64_t(c.Hv) * c.dv;
    auto S = randv(r, size_t(c.Hv) * c.dk * c.dv, 0.3f);
    std::vector<float> A(size_t(c.Hv)), dt(size_t(c.Hv));
    for (auto& v : A) v = r.uni(-1.f, 1.f);
    for (auto& v : dt) v = r.uni(-1.f, 1.f);
    Dev<float> dS(S), dA(A), ddt(dt), out(size_t(c.Hv) * c.dv);
    for (int step = 0; step < 3; ++step) {
      const auto qkv = randv(r, size_t(C));
      const auto b = randv(r, size_t(c.Hv)), a = randv(r, size_t(c.Hv));
      Dev<float> dqkv(qkv), db(b), da(a);
      out.poison();
      lc::gdn_decode_step({c.Hk, c.Hv, c.dk, c.dv}, dqkv.p, db.p, da.p, dA.p, ddt.p, dS.p, out.p, nullptr);
      CK(cudaDeviceSynchronize());
      std::vector<float> beta(size_t(c.Hv)), g(size_t(c.Hv)), ref(size_t(c.Hv) * c.dv);
      cpu::gdn_gates(b.data(), a.data(), A.data(), dt.data(), c.Hv, beta.data(), g.data());
      for (int h = 0; h < c.Hv; ++h) {
        const int kh = h / (c.Hv / c.Hk);
        std::vector<float> q(qkv.begin() + kh * c.dk, qkv.begin() + (kh + 1) * c.dk);
        std::vector<float> k(qkv.begin() + int64_t(c.Hk) * c.dk + kh * c.dk,
                             qkv.begin() + int64_t(c.Hk) * c.dk + (kh + 1) * c.dk);
        cpu::l2norm(q.data(), c.dk);
        cpu::l2norm(k.data(), c.dk);
        for (auto& v : q) v /= std::sqrt(float(c.dk));
        const float* v = qkv.data() + 2LL * c.Hk * c.dk + int64_t(h) * c.dv;
        cpu::gdn_recurrent_step(S.data() + int64_t(h) * c.dk * c.dv, q.data(), k.data(), v, g[size_t(h)],
                                beta[size_t(h)], c.dk, c.dv, ref.data() + int64_t(h) * c.dv);
      }
      EXPECT_LE(rel_err(out.get(), ref), 1e-5) << "step " << step;
      EXPECT_LE(rel_err(dS.get(), S), 1e-5) << "state, step " << step;
    }
  }
}

// ------------------------------------------------------------------------------------------------ sampling
struct SampleRig {
  int64_t V;
  Dev<float> logits;
  Dev<lc::SampleParamsDev> prm;
  Dev<int32_t> counts, slot;
  Dev<uint8_t> mask;
  Dev<char> scratch;
  Dev<lc::SampleResult> res;
  explicit SampleRig(int64_t v)
      : V(v), logits(static_cast<size_t>(v)), prm(1), counts(static_cast<size_t>(v)), slot(1), mask(static_cast<size_t>(v)),
        scratch(lc::sample_scratch_bytes(v)), res(1) {
    cudaMemset(counts.p, 0, size_t(v) * 4);
    cudaMemset(mask.p, 0, size_t(v));
  }
  lc::SampleResult run(const lc::SampleParamsDev& p) {
    prm.set({p});
    slot.poison();
    lc::sample_token(logits.p, V, prm.p, counts.p, mask.p, scratch.p, slot.p, res.p, nullptr);
    cudaDeviceSynchronize();
    return res.get()[0];
  }
};
lc::SampleParamsDev params(float t) {
  lc::SampleParamsDev p{};
  p.temperature = t;
  p.top_p = 1.f;
  p.repetition = 1.f;
  return p;
}

TEST(CudaDecode, GreedyArgmaxTiesAndLogprobs) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  Rng r(seed);
  const int64_t V = 248320 - 3;
  SampleRig rig(V);
  auto l = randv(r, size_t(V), 3.f);
  const int64_t a = int64_t(r.g() % V), b = int64_t(r.g() % V);
  l[size_t(a)] = l[size_t(b)] = 50.f;  // tie: the lower id wins
  rig.logits.set(l);
  auto p = params(0.f);
  p.logprobs = 1;
  p.top_logprobs = 5;
  const auto res = rig.run(p);
  EXPECT_EQ(res.token, int32_t(std::min(a, b))) << "seed " << seed;
  EXPECT_EQ(rig.slot.get()[0], res.token);
  double mx = -1e30, s = 0;
  for (float v : l) mx = std::max(mx, double(v));
  for (float v : l) s += std::exp(double(v) - mx);
  const double lse = mx + std::log(s);
  EXPECT_NEAR(res.logprob, l[size_t(res.token)] - lse, 1e-4);
  std::vector<int> order(static_cast<size_t>(V));
  for (int i = 0; i < V; ++i) order[size_t(i)] = i;
  std::partial_sort(order.begin(), order.begin() + 5, order.end(),
                    [&](int x, int y) { return l[size_t(x)] > l[size_t(y)] || (l[size_t(x)] == l[size_t(y)] && x < y); });
  ASSERT_EQ(res.n_top, 5);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(res.top_ids[i], order[size_t(i)]);
    EXPECT_NEAR(res.top_lp[i], l[size_t(order[size_t(i)])] - lse, 1e-4);
  }
  EXPECT_EQ(rig.counts.get()[size_t(res.token)], 1);
}

TEST(CudaDecode, SamplingFiltersAndSeeds) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  const int64_t V = 5003;
  SampleRig rig(V);
  auto l = randv(r, size_t(V), 1.f);
  for (int i = 0; i < 5; ++i) l[size_t(100 * i + 7)] = 6.f - 0.5f * i;  // top 5: 7, 107, 207, 307, 407
  rig.logits.set(l);
  // top_k = 1 is greedy
  auto p = params(1.f);
  p.top_k = 1;
  p.seed = r.g();
  EXPECT_EQ(rig.run(p).token, 7);
  // top_k = 3: only the top three ever
  p.top_k = 3;
  std::vector<int> seen(V, 0);
  for (int i = 0; i < 200; ++i) {
    p.step = uint64_t(i);
    const int t = rig.run(p).token;
    ASSERT_TRUE(t == 7 || t == 107 || t == 207) << t;
    seen[size_t(t)]++;
  }
  EXPECT_GT(seen[107], 0);
  // same seed and step → same token; many steps spread
  p.top_k = 0;
  p.seed = 42;
  p.step = 3;
  const int t1 = rig.run(p).token;
  EXPECT_EQ(rig.run(p).token, t1);
  // top_p tiny → the argmax
  p.top_p = 1e-4f;
  EXPECT_EQ(rig.run(p).token, 7);
  // min_p = 0.5 with temperature 1: only tokens with p >= 0.5 p_max: 7 (6.0) and 107 (5.5; e^-0.5 = 0.61)
  p.top_p = 1.f;
  p.min_p = 0.5f;
  for (int i = 0; i < 50; ++i) {
    p.step = uint64_t(i);
    const int t = rig.run(p).token;
    ASSERT_TRUE(t == 7 || t == 107) << t;
  }
  // frequency penalty pushes the argmax away in greedy mode
  auto g = params(0.f);
  g.frequency = 10.f;
  std::vector<int32_t> counts(size_t(V), 0);
  counts[7] = 1;
  rig.counts.set(counts);
  EXPECT_EQ(rig.run(g).token, 107);
  // repetition penalty on a prompt token
  counts[7] = 0;
  rig.counts.set(counts);
  std::vector<uint8_t> mask(size_t(V), 0);
  mask[7] = 1;
  rig.mask.set(mask);
  g.frequency = 0.f;
  g.repetition = 1.2f;  // 6 / 1.2 = 5 < 5.5
  EXPECT_EQ(rig.run(g).token, 107);
}

TEST(CudaDecode, SamplingFollowsTheDistribution) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  Rng r(seed);
  const int64_t V = 1000;
  SampleRig rig(V);
  std::vector<float> l(size_t(V), -30.f);
  l[3] = std::log(0.5f);
  l[500] = std::log(0.3f);
  l[999] = std::log(0.2f);
  rig.logits.set(l);
  auto p = params(1.f);
  p.seed = r.g();
  std::vector<int> n(size_t(V), 0);
  const int N = 2000;
  for (int i = 0; i < N; ++i) {
    p.step = uint64_t(i);
    n[size_t(rig.run(p).token)]++;
  }
  EXPECT_NEAR(n[3] / double(N), 0.5, 0.05) << "seed " << seed;
  EXPECT_NEAR(n[500] / double(N), 0.3, 0.05);
  EXPECT_NEAR(n[999] / double(N), 0.2, 0.05);
}

}  // namespace
