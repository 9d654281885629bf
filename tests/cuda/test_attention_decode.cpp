// Decode attention (attention/attention.h: attn_qk_norm_rope_append + attention_decode) against the CPU
// reference at long contexts (many splits, two combine levels, lengths that are not multiples of the
// tiles), odd shapes (head_dim 32..256, G = 1..16 incl. non powers of two), cache rows past *pos
// poisoned with NaN, and graph replays of one captured launch for increasing *pos with a partial buffer
// that is never re-initialised (the arrival counters must reset themselves); and the basic case at the
// model's shape (AttentionMatchesCpu). Fresh seed per run; ‖Δ‖/‖ref‖ ≤ 1e-4 on the bf16-exact cache
// (the CPU is fed the same bf16-rounded cache; the k written to the cache is compared after bf16
// rounding).
#include <gtest/gtest.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "attention_decode_data.h"
#include "core/bf16.h"
#include "cpu/ops.h"
#include "cuda/kernels/attention/attention.h"
#include "cuda/kernels/sampling/sampling.h"
#include "decode_test_util.h"

using namespace lilac;
namespace lc = lilac::cuda;

namespace {

using namespace lilac::cuda::testing;

// One eager append + attention at `pos` (cache rows [0, pos) random, rows > pos NaN), checked.
void check_once(Rng& r, AttnShape c, int64_t pos, int split) {
  SCOPED_TRACE("heads " + std::to_string(c.heads) + "/" + std::to_string(c.kv) + " hd " + std::to_string(c.hd) +
               " pos " + std::to_string(pos) + " split " + std::to_string(split));
  AttnLayer ly(r, c, pos + 3);
  ly.fill_rows(r, pos);
  lc::AttnDecodeShape s{c.heads, c.kv, c.hd, c.rot, 1e-6f};
  Dev<float> dqg(ly.qg), dk(ly.kn), dv(ly.vn), dqw(ly.qw), dkw(ly.kw), dinv(ly.inv), qrot(size_t(c.heads) * c.hd),
      out(size_t(c.heads) * c.hd);
  Dev<uint16_t> dK(ly.Kb), dV(ly.Vb);
  Dev<int32_t> dpos(std::vector<int32_t>{int32_t(pos)});
  Dev<float> partial(lc::attn_decode_partial_floats(s, split));
  qrot.poison();
  out.poison();
  partial.poison();
  auto* Kd = reinterpret_cast<__nv_bfloat16*>(dK.p);
  auto* Vd = reinterpret_cast<__nv_bfloat16*>(dV.p);
  lc::attn_qk_norm_rope_append(s, dqg.p, dk.p, dv.p, dqw.p, dkw.p, dinv.p, dpos.p, qrot.p, Kd, Vd, nullptr);
  lc::attention_decode(s, qrot.p, dqg.p, Kd, Vd, dpos.p, split, partial.p, out.p, nullptr);
  CK(cudaDeviceSynchronize());
  std::vector<float> gate;
  EXPECT_LE(rel_err(qrot.get(), ly.q_ref(pos, &gate)), 1e-5);
  const auto Kg = dK.get(), Vg = dV.get();
  const auto kr = ly.k_ref(pos);
  for (int64_t d = 0; d < ly.kvd; ++d) {
    EXPECT_NEAR(bf16_to_f32(Kg[size_t(pos * ly.kvd + d)]), kr[size_t(d)], 1e-2 * std::fabs(kr[size_t(d)]) + 1e-3);
    EXPECT_EQ(Vg[size_t(pos * ly.kvd + d)], f32_to_bf16(ly.vn[size_t(d)]));
  }
  EXPECT_LE(rel_err(out.get(), ly.attn_ref(pos, Kg, Vg)), 1e-4);
  // the same launch again (counters must have reset themselves; partial not re-initialised)
  out.poison();
  lc::attention_decode(s, qrot.p, dqg.p, Kd, Vd, dpos.p, split, partial.p, out.p, nullptr);
  CK(cudaDeviceSynchronize());
  EXPECT_LE(rel_err(out.get(), ly.attn_ref(pos, Kg, Vg)), 1e-4) << "second launch at the same position";
}

TEST(CudaDecodeAttention, LongContextsMatchCpu) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  const AttnShape qwen{16, 2, 256, 64};
  for (const int64_t pos : {int64_t(0), int64_t(62), int64_t(63), int64_t(64), int64_t(511), int64_t(512),
                            int64_t(1000), int64_t(4099), int64_t(16390)})
    check_once(r, qwen, pos, lc::kAttnMaxSplit);
  check_once(r, qwen, 16390, 7);  // few splits, each long
  check_once(r, qwen, 3000, 1);
}

TEST(CudaDecodeAttention, OddShapesMatchCpu) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  // chunks of 8, 4 and 2 positions (one, two and four per tensor-core pass) and of 16 (two 8-position tiles: {2, 2, 32})
  const AttnShape shapes[] = {{4, 2, 64, 16},   {8, 2, 32, 8},   {12, 4, 128, 32},  {16, 1, 64, 64}, {3, 3, 256, 256},
                              {10, 1, 32, 0},   {6, 2, 256, 30}, {32, 2, 128, 128}, {2, 2, 32, 16}};
  for (const AttnShape& c : shapes)
    for (const int64_t pos : {int64_t(0), int64_t(37), int64_t(700), int64_t(5001)}) check_once(r, c, pos, 40);
}

// One captured graph (append → attention → *pos += 1) replayed for increasing positions, the partial
// buffer shared by two "layers" as in the backend and never re-initialised.
TEST(CudaDecodeAttention, GraphReplaysForIncreasingPositions) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  const AttnShape c{16, 2, 256, 64};
  const int64_t max_len = 700;
  const int split = lc::kAttnMaxSplit;
  lc::AttnDecodeShape s{c.heads, c.kv, c.hd, c.rot, 1e-6f};
  AttnLayer l0(r, c, max_len), l1(r, c, max_len);
  l0.fill_rows(r, max_len);
  l1.fill_rows(r, max_len);
  Dev<float> qg0(l0.qg), k0(l0.kn), v0(l0.vn), qw0(l0.qw), kw0(l0.kw), qg1(l1.qg), k1(l1.kn), v1(l1.vn), qw1(l1.qw),
      kw1(l1.kw), dinv(l0.inv), qrot(size_t(c.heads) * c.hd), out0(qrot.n), out1(qrot.n);
  Dev<uint16_t> K0(l0.Kb), V0(l0.Vb), K1(l1.Kb), V1(l1.Vb);
  Dev<int32_t> dpos(std::vector<int32_t>{0});
  Dev<float> partial(lc::attn_decode_partial_floats(s, split));
  partial.poison();
  auto bf = [](Dev<uint16_t>& d) { return reinterpret_cast<__nv_bfloat16*>(d.p); };
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  lc::attn_qk_norm_rope_append(s, qg0.p, k0.p, v0.p, qw0.p, kw0.p, dinv.p, dpos.p, qrot.p, bf(K0), bf(V0), st);
  lc::attention_decode(s, qrot.p, qg0.p, bf(K0), bf(V0), dpos.p, split, partial.p, out0.p, st);
  lc::attn_qk_norm_rope_append(s, qg1.p, k1.p, v1.p, qw1.p, kw1.p, dinv.p, dpos.p, qrot.p, bf(K1), bf(V1), st);
  lc::attention_decode(s, qrot.p, qg1.p, bf(K1), bf(V1), dpos.p, split, partial.p, out1.p, st);
  lc::increment_i32(dpos.p, st);
  CK(cudaStreamEndCapture(st, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  // positions 0..4, then 505..520 (the split count and the number of combine groups change), then
  // back to 3 (a shorter context after a longer one, as after a rollback)
  std::vector<int32_t> starts{0, 505, 3};
  std::vector<int> steps{5, 16, 2};
  for (size_t seg = 0; seg < starts.size(); ++seg) {
    dpos.set(std::vector<int32_t>{starts[seg]});
    for (int i = 0; i < steps[seg]; ++i) {
      const int64_t pos = starts[seg] + i;
      SCOPED_TRACE("pos " + std::to_string(pos));
      out0.poison();
      out1.poison();
      CK(cudaGraphLaunch(exec, st));
      CK(cudaStreamSynchronize(st));
      EXPECT_LE(rel_err(out0.get(), l0.attn_ref(pos, K0.get(), V0.get())), 1e-4);
      EXPECT_LE(rel_err(out1.get(), l1.attn_ref(pos, K1.get(), V1.get())), 1e-4);
      EXPECT_EQ(dpos.get()[0], pos + 1);
    }
  }
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  CK(cudaStreamDestroy(st));
}

// ------------------------------------------------------------------------------------------------ basic case
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

}  // namespace
