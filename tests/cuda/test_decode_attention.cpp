// Decode attention (attn_qk_norm_rope_append + attention_decode) against the CPU reference at long
// contexts (many splits, two combine levels, lengths that are not multiples of the tiles), odd shapes
// (head_dim 32..256, G = 1..16 incl. non powers of two), cache rows past *pos poisoned with NaN, and
// graph replays of one captured launch for increasing *pos with a partial buffer that is never
// re-initialised (the arrival counters must reset themselves). Fresh seed per run; ‖Δ‖/‖ref‖ ≤ 1e-4
// on the bf16-exact cache, as in test_decode_kernels.cpp.
#include <gtest/gtest.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "cpu/ops.h"
#include "cuda/kernels/decode.h"
#include "decode_test_util.h"

using namespace lilac;
namespace lc = lilac::cuda;

namespace {

using namespace lilac::cuda::testing;

struct Shape {
  int heads, kv, hd, rot;
};

// Inputs of one attention layer and the CPU reference for a given position.
struct Layer {
  Shape c;
  int64_t max_len, kvd;
  std::vector<float> qg, kn, vn, qw, kw, inv;
  std::vector<uint16_t> Kb, Vb;  // host cache (bf16), rows > current pos are NaN
  Layer(Rng& r, Shape c_, int64_t max_len_) : c(c_), max_len(max_len_), kvd(int64_t(c_.kv) * c_.hd) {
    Kb.assign(size_t(max_len * kvd), 0xffff);  // NaN
    Vb.assign(Kb.size(), 0xffff);
    qg = randv(r, size_t(c.heads) * c.hd * 2, 1.f);
    kn = randv(r, size_t(kvd));
    vn = randv(r, size_t(kvd));
    qw.resize(size_t(c.hd));
    kw.resize(size_t(c.hd));
    for (auto& v : qw) v = r.uni(0.5f, 1.5f);
    for (auto& v : kw) v = r.uni(0.5f, 1.5f);
    inv = cpu::rope_inv_freq(c.rot, 1e7);
  }
  void fill_rows(Rng& r, int64_t n) {  // rows [0, n) random bf16
    for (size_t i = 0; i < size_t(n * kvd); ++i) {
      Kb[i] = f32_to_bf16(r.normal());
      Vb[i] = f32_to_bf16(r.normal());
    }
  }
  std::vector<float> q_ref(int64_t pos, std::vector<float>* gate) const {
    std::vector<float> q(size_t(c.heads) * c.hd);
    gate->resize(q.size());
    cpu::split_query_gate(qg.data(), c.heads, c.hd, q.data(), gate->data());
    for (int h = 0; h < c.heads; ++h) {
      cpu::rmsnorm(q.data() + h * c.hd, qw.data(), c.hd, 1e-6f, q.data() + h * c.hd);
      cpu::rope_with(q.data() + h * c.hd, c.rot, pos, inv.data());
    }
    return q;
  }
  std::vector<float> k_ref(int64_t pos) const {
    std::vector<float> kr(kn);
    for (int h = 0; h < c.kv; ++h) {
      cpu::rmsnorm(kn.data() + h * c.hd, kw.data(), c.hd, 1e-6f, kr.data() + h * c.hd);
      cpu::rope_with(kr.data() + h * c.hd, c.rot, pos, inv.data());
    }
    return kr;
  }
  // CPU attention over rows [0, pos] of the given (GPU-written) caches.
  std::vector<float> attn_ref(int64_t pos, const std::vector<uint16_t>& Kg, const std::vector<uint16_t>& Vg) const {
    std::vector<float> gate;
    const auto q = q_ref(pos, &gate);
    const int64_t L = pos + 1;
    std::vector<float> Kc(size_t(L * kvd)), Vc(Kc.size());
    for (size_t i = 0; i < Kc.size(); ++i) {
      Kc[i] = bf16_to_f32(Kg[i]);
      Vc[i] = bf16_to_f32(Vg[i]);
    }
    std::vector<float> ref(q.size()), scores(static_cast<size_t>(L));
    cpu::gated_attention_token(q.data(), gate.data(), Kc.data(), Vc.data(), L, c.heads, c.kv, c.hd, ref.data(),
                               scores.data());
    return ref;
  }
};

// One eager append + attention at `pos` (cache rows [0, pos) random, rows > pos NaN), checked.
void check_once(Rng& r, Shape c, int64_t pos, int split) {
  SCOPED_TRACE("heads " + std::to_string(c.heads) + "/" + std::to_string(c.kv) + " hd " + std::to_string(c.hd) +
               " pos " + std::to_string(pos) + " split " + std::to_string(split));
  Layer ly(r, c, pos + 3);
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
  const Shape qwen{16, 2, 256, 64};
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
  const Shape shapes[] = {{4, 2, 64, 16},   {8, 2, 32, 8},   {12, 4, 128, 32}, {16, 1, 64, 64},
                          {3, 3, 256, 256}, {10, 1, 32, 0},  {6, 2, 256, 30},  {32, 2, 128, 128}};
  for (const Shape& c : shapes)
    for (const int64_t pos : {int64_t(0), int64_t(37), int64_t(700), int64_t(5001)}) check_once(r, c, pos, 40);
}

// One captured graph (append → attention → *pos += 1) replayed for increasing positions, the partial
// buffer shared by two "layers" as in the backend and never re-initialised.
TEST(CudaDecodeAttention, GraphReplaysForIncreasingPositions) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  const Shape c{16, 2, 256, 64};
  const int64_t max_len = 700;
  const int split = lc::kAttnMaxSplit;
  lc::AttnDecodeShape s{c.heads, c.kv, c.hd, c.rot, 1e-6f};
  Layer l0(r, c, max_len), l1(r, c, max_len);
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


// Timing at the real model shape (16 q heads, 2 kv heads, head_dim 256, rotary 64) with the split
// counts the backend uses for a given max_len (n_split = min(kAttnMaxSplit, ceil(max_len / 32))):
// qk_norm_rope + attention_decode, and attention_decode alone, each captured in a CUDA graph on a
// non-default stream (PDL launches as in the backend) 10 times in a row (like 10 layers), 20 warm-up
// replays, then 200 timed with events; the time per copy (per layer) is printed.
// The cache holds only the rows the kernels read (pos + 1); it stays L2-resident across replays, so
// these are L2-warm numbers (the decode step streams it from DRAM). Then one traced eager launch of
// attention_decode (attn_decode_trace): medians / maxima over the working blocks of each phase mark.
// Prints one line per case and checks the output of the replays and of the traced launch against the CPU.
TEST(CudaDecodeAttentionTiming, RealShape) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  const Shape c{16, 2, 256, 64};
  lc::AttnDecodeShape s{c.heads, c.kv, c.hd, c.rot, 1e-6f};
  const int64_t rows = 16384;
  Layer ly(r, c, rows);
  ly.fill_rows(r, rows);
  Dev<float> dqg(ly.qg), dk(ly.kn), dv(ly.vn), dqw(ly.qw), dkw(ly.kw), dinv(ly.inv), qrot(size_t(c.heads) * c.hd),
      out(size_t(c.heads) * c.hd);
  Dev<uint16_t> dK(ly.Kb), dV(ly.Vb);
  Dev<int32_t> dpos(std::vector<int32_t>{0});
  auto* Kd = reinterpret_cast<__nv_bfloat16*>(dK.p);
  auto* Vd = reinterpret_cast<__nv_bfloat16*>(dV.p);
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  // kLayers copies of the sequence per graph (as consecutive layers of a decode step, sharing the
  // partial buffer) so the graph launch overhead does not dominate; reported per copy
  const int kWarm = 20, kReps = 200, kLayers = 10;
  const size_t kTraceBlocks = 4096;  // >= units * n_split
  Dev<unsigned long long> tr(kTraceBlocks * 8);
  for (const int64_t max_len : {int64_t(640), int64_t(17000), int64_t(262144)}) {
    const int split = int(std::min<int64_t>(lc::kAttnMaxSplit, std::max<int64_t>(1, (max_len + 31) / 32)));
    Dev<float> partial(lc::attn_decode_partial_floats(s, split));
    partial.poison();
    for (const int64_t pos : {int64_t(511), int64_t(4095), int64_t(16383)}) {
      if (pos >= max_len) continue;
      SCOPED_TRACE("max_len " + std::to_string(max_len) + " pos " + std::to_string(pos) + " split " +
                   std::to_string(split));
      dpos.set(std::vector<int32_t>{int32_t(pos)});
      float us[2] = {0.f, 0.f};
      for (int with_rope = 1; with_rope >= 0; --with_rope) {
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        for (int l = 0; l < kLayers; ++l) {
          if (with_rope)
            lc::attn_qk_norm_rope_append(s, dqg.p, dk.p, dv.p, dqw.p, dkw.p, dinv.p, dpos.p, qrot.p, Kd, Vd, st);
          lc::attention_decode(s, qrot.p, dqg.p, Kd, Vd, dpos.p, split, partial.p, out.p, st);
        }
        CK(cudaStreamEndCapture(st, &graph));
        CK(cudaGraphInstantiate(&exec, graph, 0));
        for (int i = 0; i < kWarm; ++i) CK(cudaGraphLaunch(exec, st));
        CK(cudaStreamSynchronize(st));
        if (with_rope == 0) out.poison();  // the attention-only replays must rewrite it
        CK(cudaEventRecord(e0, st));
        for (int i = 0; i < kReps; ++i) CK(cudaGraphLaunch(exec, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaStreamSynchronize(st));
        float ms = 0.f;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        us[with_rope] = 1000.f * ms / float(kReps * kLayers);
        CK(cudaGraphExecDestroy(exec));
        CK(cudaGraphDestroy(graph));
      }
      // one traced eager launch (L2-warm, after the replays): per-block %globaltimer marks, see
      // attn_decode_trace in decode.h; times in us after the earliest block entry
      CK(cudaMemset(tr.p, 0, tr.n * sizeof(unsigned long long)));
      lc::attn_decode_trace(tr.p);
      out.poison();
      lc::attention_decode(s, qrot.p, dqg.p, Kd, Vd, dpos.p, split, partial.p, out.p, st);
      CK(cudaStreamSynchronize(st));
      lc::attn_decode_trace(nullptr);
      const auto t = tr.get();
      unsigned long long t0 = ~0ull;
      for (size_t b = 0; b < kTraceBlocks; ++b)
        if (t[b * 8]) t0 = std::min(t0, t[b * 8]);
      std::vector<std::vector<double>> at(8);  // working blocks (mark 2 set) per mark; 6: mergers; 7: all
      int blocks = 0, work = 0;
      for (size_t b = 0; b < kTraceBlocks; ++b) {
        if (!t[b * 8]) continue;
        ++blocks;
        const bool w = t[b * 8 + 2] != 0;
        work += w;
        for (int k = 0; k < 8; ++k)
          if (t[b * 8 + size_t(k)] && (w || k == 7 || k == 1))
            at[size_t(k)].push_back((double(t[b * 8 + size_t(k)]) - double(t0)) / 1e3);
      }
      auto med = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v.empty() ? -1.0 : v[v.size() / 2];
      };
      auto mx = [](const std::vector<double>& v) { return v.empty() ? -1.0 : *std::max_element(v.begin(), v.end()); };
      std::printf("attn-timing pos %lld nsplit %d (max_len %lld): rope+attn %.2f us, attn alone %.2f us | trace "
                  "blocks %d work %d mergers %zu, us med(max): wait %.2f(%.2f) staged %.2f(%.2f) kv %.2f(%.2f) "
                  "part %.2f(%.2f) arrive %.2f(%.2f) merged %.2f(%.2f) exit-max %.2f\n",
                  static_cast<long long>(pos), split, static_cast<long long>(max_len), us[1], us[0], blocks, work,
                  at[6].size(), med(at[1]), mx(at[1]), med(at[2]), mx(at[2]), med(at[3]), mx(at[3]), med(at[4]),
                  mx(at[4]), med(at[5]), mx(at[5]), med(at[6]), mx(at[6]), mx(at[7]));
      std::fflush(stdout);
      EXPECT_GT(work, 0) << "the trace recorded no working block";
      ASSERT_LE(rel_err(out.get(), ly.attn_ref(pos, dK.get(), dV.get())), 1e-4);
    }
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  CK(cudaStreamDestroy(st));
}

}  // namespace
