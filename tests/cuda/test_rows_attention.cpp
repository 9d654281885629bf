// Multi-row decode attention (attn_qk_norm_rope_append_rows + attention_rows, src/cuda/kernels/rows/)
// against the CPU reference: rows of sequences of different lengths in one call (1, 2, 63, 64, 65,
// 511, 4097, 16390), each in its own slot of a slot-strided pool, padding rows (slot -1) whose
// outputs stay NaN-poisoned, multi-row sequences (verification: rows at consecutive positions attend
// causally to each other's freshly appended K/V), cache rows past each row's position NaN (never read)
// and slots not in the batch byte-for-byte untouched. Batch invariance by memcmp: every row alone
// (M = 1) and inside a permuted batch gives the same bytes, and so do today's single-row kernels
// (attn_qk_norm_rope_append + attention_decode with the same n_split). Graph replays with the rows
// changed between replays and a partial buffer never re-initialised. Fresh seed per run; tolerances
// as test_decode_attention.cpp (‖Δ‖/‖ref‖ ≤ 1e-4 on the bf16-exact cache).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "cpu/ops.h"
#include "cuda/kernels/attention/attention.h"
#include "cuda/kernels/sampling/sampling.h"
#include "cuda/kernels/rows/rows_state.h"
#include "decode_test_util.h"

using namespace lilac;
namespace lc = lilac::cuda;
namespace lr = lilac::cuda::rows;

namespace {

using namespace lilac::cuda::testing;

struct Shape {
  int heads, kv, hd, rot;
};
struct Row {
  int slot;
  int64_t pos;
};

bool same_bytes(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }
bool all_ff(const float* a, size_t n) {
  const auto* p = reinterpret_cast<const unsigned char*>(a);
  return std::all_of(p, p + n * sizeof(float), [](unsigned char c) { return c == 0xff; });
}

// One layer's slot-strided KV pool (host mirror + device copy), its weights and the rows of a call.
struct Case {
  Shape c;
  int n_slots;
  int64_t max_len, kvd, slot_elems, proj_stride;
  std::vector<uint16_t> K, V;  // [slot][max_len][kvd]: rows before the slot's first row random, then NaN
  std::vector<float> qw, kw, inv, proj;
  std::vector<Row> rows;
  Case(Rng& r, Shape c_, int n_slots_, int64_t max_len_, std::vector<Row> rows_)
      : c(c_), n_slots(n_slots_), max_len(max_len_), kvd(int64_t(c_.kv) * c_.hd), rows(std::move(rows_)) {
    slot_elems = max_len * kvd + 8 * c.hd;  // a gap between slots: strides are honoured, not assumed
    proj_stride = int64_t(c.heads) * 2 * c.hd + 2 * kvd + 12;
    K.assign(size_t(n_slots * slot_elems), 0xffff);
    V.assign(K.size(), 0xffff);
    for (int s = 0; s < n_slots; ++s) {
      int64_t first = -1;  // a slot in the batch: filled up to its first row
      for (const Row& rw : rows)
        if (rw.slot == s) first = first < 0 ? rw.pos : std::min(first, rw.pos);
      if (first < 0) first = max_len / 2;  // slots not in the batch: half filled
      for (int64_t i = 0; i < first * kvd; ++i) {
        K[size_t(s * slot_elems + i)] = f32_to_bf16(r.normal());
        V[size_t(s * slot_elems + i)] = f32_to_bf16(r.normal());
      }
    }
    qw.resize(static_cast<size_t>(c.hd));
    kw.resize(static_cast<size_t>(c.hd));
    for (auto& v : qw) v = r.uni(0.5f, 1.5f);
    for (auto& v : kw) v = r.uni(0.5f, 1.5f);
    inv = cpu::rope_inv_freq(c.rot, 1e7);
    proj = randv(r, rows.size() * size_t(proj_stride));
  }
  int M() const { return int(rows.size()); }
  int64_t qd() const { return int64_t(c.heads) * c.hd; }
  const float* prow(int r) const { return proj.data() + r * proj_stride; }
  std::vector<float> q_ref(int r, std::vector<float>* gate) const {
    std::vector<float> q(static_cast<size_t>(qd()));
    gate->resize(q.size());
    cpu::split_query_gate(prow(r), c.heads, c.hd, q.data(), gate->data());
    for (int h = 0; h < c.heads; ++h) {
      cpu::rmsnorm(q.data() + h * c.hd, qw.data(), c.hd, 1e-6f, q.data() + h * c.hd);
      cpu::rope_with(q.data() + h * c.hd, c.rot, rows[size_t(r)].pos, inv.data());
    }
    return q;
  }
  std::vector<float> k_ref(int r) const {
    const float* k = prow(r) + int64_t(c.heads) * 2 * c.hd;
    std::vector<float> kr(static_cast<size_t>(kvd));
    for (int h = 0; h < c.kv; ++h) {
      cpu::rmsnorm(k + h * c.hd, kw.data(), c.hd, 1e-6f, kr.data() + h * c.hd);
      cpu::rope_with(kr.data() + h * c.hd, c.rot, rows[size_t(r)].pos, inv.data());
    }
    return kr;
  }
  // CPU attention of row r over rows [0, pos] of its slot in the given (GPU-written) caches.
  std::vector<float> attn_ref(int r, const std::vector<uint16_t>& Kg, const std::vector<uint16_t>& Vg) const {
    std::vector<float> gate;
    const auto q = q_ref(r, &gate);
    const int64_t L = rows[size_t(r)].pos + 1, base = rows[size_t(r)].slot * slot_elems;
    std::vector<float> Kc(size_t(L * kvd)), Vc(Kc.size());
    for (size_t i = 0; i < Kc.size(); ++i) {
      Kc[i] = bf16_to_f32(Kg[size_t(base) + i]);
      Vc[i] = bf16_to_f32(Vg[size_t(base) + i]);
    }
    std::vector<float> ref(q.size()), scores(static_cast<size_t>(L));
    cpu::gated_attention_token(q.data(), gate.data(), Kc.data(), Vc.data(), L, c.heads, c.kv, c.hd, ref.data(),
                               scores.data());
    return ref;
  }
};

// Device side of a Case: pools, inputs, outputs (poisoned), row arrays.
struct DevCase {
  lc::AttnDecodeShape s;
  Dev<uint16_t> K, V;
  Dev<float> proj, qw, kw, inv, q_out, out, partial;
  Dev<int32_t> slot, pos;
  int n_split;
  DevCase(const Case& k, int n_split_)
      : s{k.c.heads, k.c.kv, k.c.hd, k.c.rot, 1e-6f},
        K(k.K),
        V(k.V),
        proj(k.proj),
        qw(k.qw),
        kw(k.kw),
        inv(k.inv),
        q_out(size_t(k.M() * k.qd())),
        out(size_t(k.M() * k.qd())),
        partial(lr::attention_rows_partial_floats(s, n_split_, k.M())),
        slot(static_cast<size_t>(k.M())),
        pos(static_cast<size_t>(k.M())),
        n_split(n_split_) {
    std::vector<int32_t> sl, ps;
    for (const Row& rw : k.rows) {
      sl.push_back(rw.slot);
      ps.push_back(int32_t(rw.pos));
    }
    slot.set(sl);
    pos.set(ps);
    q_out.poison();
    out.poison();
    partial.poison();
  }
  lr::KvPool kv(int64_t slot_elems) {
    return {reinterpret_cast<__nv_bfloat16*>(K.p), reinterpret_cast<__nv_bfloat16*>(V.p), slot_elems};
  }
  void run(const Case& k, int M, cudaStream_t st = nullptr) {
    lr::attn_qk_norm_rope_append_rows(s, M, slot.p, pos.p, proj.p, k.proj_stride, qw.p, kw.p, inv.p, q_out.p,
                                      kv(k.slot_elems), st);
    lr::attention_rows(s, M, slot.p, pos.p, q_out.p, proj.p, k.proj_stride, kv(k.slot_elems), n_split, partial.p, out.p,
                       st);
  }
};

// Runs the case once and checks everything against the CPU; returns q_out / out for further checks.
void check_case(const Case& k, int n_split, std::vector<float>* q_got = nullptr, std::vector<float>* o_got = nullptr) {
  DevCase d(k, n_split);
  d.run(k, k.M());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto q = d.q_out.get(), o = d.out.get();
  const auto Kg = d.K.get(), Vg = d.V.get();
  const size_t qd = size_t(k.qd());
  std::vector<char> written(size_t(k.n_slots * k.max_len), 0);
  for (int r = 0; r < k.M(); ++r) {
    const Row rw = k.rows[size_t(r)];
    SCOPED_TRACE("row " + std::to_string(r) + " slot " + std::to_string(rw.slot) + " pos " + std::to_string(rw.pos));
    if (rw.slot < 0) {
      EXPECT_TRUE(all_ff(q.data() + r * qd, qd)) << "padding row: q_out written";
      EXPECT_TRUE(all_ff(o.data() + r * qd, qd)) << "padding row: out written";
      continue;
    }
    written[size_t(rw.slot * k.max_len + rw.pos)] = 1;
    std::vector<float> gate;
    const std::vector<float> qr(q.begin() + r * qd, q.begin() + (r + 1) * qd);
    EXPECT_LE(rel_err(qr, k.q_ref(r, &gate)), 1e-5);
    const auto kr = k.k_ref(r);
    const int64_t at = rw.slot * k.slot_elems + rw.pos * k.kvd;
    const float* v = k.prow(r) + int64_t(k.c.heads) * 2 * k.c.hd + k.kvd;
    for (int64_t i = 0; i < k.kvd; ++i) {
      EXPECT_NEAR(bf16_to_f32(Kg[size_t(at + i)]), kr[size_t(i)], 1e-2 * std::fabs(kr[size_t(i)]) + 1e-3);
      EXPECT_EQ(Vg[size_t(at + i)], f32_to_bf16(v[i]));
    }
    const std::vector<float> orow(o.begin() + r * qd, o.begin() + (r + 1) * qd);
    EXPECT_LE(rel_err(orow, k.attn_ref(r, Kg, Vg)), 1e-4);
  }
  // every cache row not appended by this call: untouched (other slots, rows past the positions, gaps)
  size_t changed = 0;
  for (int s = 0; s < k.n_slots; ++s)
    for (int64_t i = 0; i < k.slot_elems; ++i) {
      const size_t e = size_t(s * k.slot_elems + i);
      const int64_t p = i / k.kvd;
      if (p < k.max_len && written[size_t(s * k.max_len + p)]) continue;
      changed += Kg[e] != k.K[e] || Vg[e] != k.V[e];
    }
  EXPECT_EQ(changed, 0u) << "cache elements changed outside the appended rows";
  // a second launch on the same partial buffer (the counters must have reset themselves): same bytes
  d.out.poison();
  lr::attention_rows(d.s, k.M(), d.slot.p, d.pos.p, d.q_out.p, d.proj.p, k.proj_stride, d.kv(k.slot_elems), n_split,
                     d.partial.p, d.out.p, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto o2 = d.out.get();
  EXPECT_TRUE(same_bytes(o2.data(), o.data(), o.size())) << "second launch differs";
  if (q_got) *q_got = q;
  if (o_got) *o_got = o;
}

// The mixed batch of the issue: lengths 1, 2, 63, 64, 65, 511, 4097, a 3-row and a 2-row sequence
// (verification rows), padding rows between them; slot 8 is not in the batch.
std::vector<Row> mixed_rows() {
  return {{3, 0},   {-1, 0},  {0, 1},   {5, 62},   {1, 63},   {2, 64},   {-1, 7},
          {4, 508}, {4, 509}, {4, 510}, {6, 4096}, {7, 1000}, {7, 1001}, {-1, 3}};
}
const Shape kQwen{16, 2, 256, 64};

TEST(CudaRowsAttention, MixedLengthsMatchCpu) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  const Case k(r, kQwen, 9, 4100, mixed_rows());
  check_case(k, lc::kAttnMaxSplit);
  check_case(k, 7);  // few splits: long ones, one combine level
  // long contexts (two combine levels) in a 2-row batch with a short row
  const Case l(r, kQwen, 2, 16400, {{1, 16389}, {0, 5}});
  check_case(l, lc::kAttnMaxSplit);
  check_case(l, 1);
}

TEST(CudaRowsAttention, OddShapesMatchCpu) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  // chunks of 8, 4 and 2 positions (one, two and four per tensor-core pass) and of 16 (two 8-position tiles: {2, 2, 32})
  const Shape shapes[] = {{4, 2, 64, 16},   {8, 2, 32, 8},  {12, 4, 128, 32}, {16, 1, 64, 64}, {3, 3, 256, 256},
                          {10, 1, 32, 0},   {6, 2, 256, 30}, {32, 2, 128, 128}, {2, 2, 32, 16}};
  for (const Shape& c : shapes) {
    SCOPED_TRACE("heads " + std::to_string(c.heads) + "/" + std::to_string(c.kv) + " hd " + std::to_string(c.hd));
    const Case k(r, c, 4, 5010, {{2, 0}, {-1, 0}, {0, 37}, {0, 38}, {3, 700}, {1, 5001}});
    check_case(k, 40);
  }
}

// Every row alone (M = 1), the batch permuted with other padding, and today's single-row kernels
// (attn_qk_norm_rope_append + attention_decode on the slot's cache with the same n_split): the same
// bytes as the row inside the mixed batch.
TEST(CudaRowsAttention, RowsAreBatchInvariantAndEqualTheSingleRowKernels) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  const Case k(r, kQwen, 9, 4100, mixed_rows());
  std::vector<float> qb, ob;
  for (const int n_split : {lc::kAttnMaxSplit, 7}) {
    SCOPED_TRACE("n_split " + std::to_string(n_split));
    check_case(k, n_split, &qb, &ob);
    const size_t qd = size_t(k.qd());
    // the batch's caches after the append: the state every single-row run below starts from
    DevCase full(k, n_split);
    full.run(k, k.M());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto K_after = full.K.get(), V_after = full.V.get();
    for (int i = 0; i < k.M(); ++i) {
      const Row rw = k.rows[size_t(i)];
      if (rw.slot < 0) continue;
      SCOPED_TRACE("row " + std::to_string(i) + " pos " + std::to_string(rw.pos));
      Case one = k;
      one.rows = {rw};
      one.proj.assign(k.prow(i), k.prow(i) + k.proj_stride);
      DevCase d(one, n_split);
      d.K.set(K_after);  // the other rows of its sequence are in the cache (appended by the batch)
      d.V.set(V_after);
      d.run(one, 1);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_TRUE(same_bytes(d.q_out.get().data(), qb.data() + i * qd, qd)) << "q alone";
      EXPECT_TRUE(same_bytes(d.out.get().data(), ob.data() + i * qd, qd)) << "out alone";
      EXPECT_TRUE(d.K.get() == K_after && d.V.get() == V_after) << "the append alone wrote other bytes";
      // today's single-row kernels on the slot's cache
      Dev<float> q1(qd), o1(qd), part(lc::attn_decode_partial_floats(d.s, n_split));
      Dev<int32_t> p1(std::vector<int32_t>{int32_t(rw.pos)});
      q1.poison();
      o1.poison();
      part.poison();
      auto* Ks = reinterpret_cast<__nv_bfloat16*>(d.K.p) + rw.slot * k.slot_elems;
      auto* Vs = reinterpret_cast<__nv_bfloat16*>(d.V.p) + rw.slot * k.slot_elems;
      const float* pr = d.proj.p;
      lc::attn_qk_norm_rope_append(d.s, pr, pr + int64_t(k.c.heads) * 2 * k.c.hd,
                                   pr + int64_t(k.c.heads) * 2 * k.c.hd + k.kvd, d.qw.p, d.kw.p, d.inv.p, p1.p, q1.p,
                                   Ks, Vs, nullptr);
      lc::attention_decode(d.s, q1.p, pr, Ks, Vs, p1.p, n_split, part.p, o1.p, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_TRUE(same_bytes(q1.get().data(), qb.data() + i * qd, qd)) << "q vs attn_qk_norm_rope_append";
      EXPECT_TRUE(same_bytes(o1.get().data(), ob.data() + i * qd, qd)) << "out vs attention_decode";
    }
    // the same rows permuted, with padding elsewhere: row i of the batch at another index
    Case perm = k;
    // sequences must stay consecutive and ascending: reverse the sequences, not the rows
    std::vector<std::vector<int>> seqs;
    for (int i = 0; i < k.M(); ++i) {
      if (k.rows[size_t(i)].slot < 0) continue;
      if (seqs.empty() || k.rows[size_t(seqs.back().back())].slot != k.rows[size_t(i)].slot) seqs.emplace_back();
      seqs.back().push_back(i);
    }
    std::reverse(seqs.begin(), seqs.end());
    perm.rows.clear();
    perm.proj.clear();
    std::vector<int> src;
    perm.rows.push_back({-1, 0});
    src.push_back(-1);
    for (const auto& sq : seqs)
      for (const int i : sq) {
        perm.rows.push_back(k.rows[size_t(i)]);
        src.push_back(i);
      }
    for (const int i : src) {
      if (i < 0)
        perm.proj.insert(perm.proj.end(), size_t(k.proj_stride), 0.f);
      else
        perm.proj.insert(perm.proj.end(), k.prow(i), k.prow(i) + k.proj_stride);
    }
    DevCase dp(perm, n_split);
    dp.run(perm, perm.M());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto qp = dp.q_out.get(), op = dp.out.get();
    for (size_t j = 0; j < src.size(); ++j) {
      if (src[j] < 0) continue;
      EXPECT_TRUE(same_bytes(qp.data() + j * qd, qb.data() + src[j] * qd, qd)) << "q, permuted, row " << src[j];
      EXPECT_TRUE(same_bytes(op.data() + j * qd, ob.data() + src[j] * qd, qd)) << "out, permuted, row " << src[j];
    }
  }
}

// One captured graph (append → attention → increment_i32 of an unrelated counter) replayed with the
// rows changed by host copies between replays: sequences advancing one position per replay, a
// sequence joining, one leaving (its row turned into padding), a verify run of 3 rows, and a row
// moved back to a shorter position (a rollback). The partial buffer is never re-initialised and is
// shared with a second graph of 3 rows, replayed after each replay of the first: the same bytes.
TEST(CudaRowsAttention, GraphReplaysWithChangingRows) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  const int M = 6;
  std::vector<std::vector<Row>> steps = {
      {{0, 5}, {1, 500}, {2, 1}, {-1, 0}, {-1, 0}, {-1, 0}}, {{0, 6}, {1, 501}, {2, 2}, {3, 0}, {-1, 0}, {-1, 0}},
      {{0, 7}, {-1, 0}, {2, 3}, {3, 1}, {3, 2}, {3, 3}},     {{0, 8}, {2, 4}, {2, 5}, {2, 6}, {3, 2}, {-1, 0}},
      {{3, 3}, {2, 5}, {1, 502}, {0, 9}, {-1, 0}, {-1, 0}},
  };
  Case k(r, kQwen, 4, 640, steps[0]);
  for (int s = 0; s < 4; ++s)  // every slot: rows [0, 520) random, the rest NaN
    for (int64_t i = 0; i < k.max_len * k.kvd; ++i) {
      const size_t e = size_t(s * k.slot_elems + i);
      const bool fill = i < 520 * k.kvd;
      k.K[e] = fill ? f32_to_bf16(r.normal()) : 0xffff;
      k.V[e] = fill ? f32_to_bf16(r.normal()) : 0xffff;
    }
  DevCase d(k, lc::kAttnMaxSplit);
  Dev<int32_t> counter(std::vector<int32_t>{0});
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  d.run(k, M, st);
  lc::increment_i32(counter.p, st);
  CK(cudaStreamEndCapture(st, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  // a second graph of a smaller batch (the first 3 rows) sharing the partial buffer, as the graphs of
  // the batch-size buckets do: after each replay of the first it must give the same bytes for its rows
  const int M2 = 3;
  Dev<float> out2(size_t(M * k.qd()));
  cudaGraph_t graph2;
  cudaGraphExec_t exec2;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  lr::attn_qk_norm_rope_append_rows(d.s, M2, d.slot.p, d.pos.p, d.proj.p, k.proj_stride, d.qw.p, d.kw.p, d.inv.p,
                                    d.q_out.p, d.kv(k.slot_elems), st);
  lr::attention_rows(d.s, M2, d.slot.p, d.pos.p, d.q_out.p, d.proj.p, k.proj_stride, d.kv(k.slot_elems), d.n_split,
                     d.partial.p, out2.p, st);
  CK(cudaStreamEndCapture(st, &graph2));
  CK(cudaGraphInstantiate(&exec2, graph2, 0));
  for (size_t t = 0; t < steps.size(); ++t) {
    SCOPED_TRACE("replay " + std::to_string(t));
    k.rows = steps[t];
    k.proj = randv(r, size_t(M * k.proj_stride));
    std::vector<int32_t> sl, ps;
    for (const Row& rw : k.rows) {
      sl.push_back(rw.slot);
      ps.push_back(int32_t(rw.pos));
    }
    d.slot.set(sl);
    d.pos.set(ps);
    d.proj.set(k.proj);
    d.out.poison();
    d.q_out.poison();
    CK(cudaGraphLaunch(exec, st));
    CK(cudaStreamSynchronize(st));
    const auto o = d.out.get();
    const auto Kg = d.K.get(), Vg = d.V.get();
    const size_t qd = size_t(k.qd());
    for (int i = 0; i < M; ++i) {
      SCOPED_TRACE("row " + std::to_string(i));
      if (k.rows[size_t(i)].slot < 0) {
        EXPECT_TRUE(all_ff(o.data() + i * qd, qd));
        continue;
      }
      const std::vector<float> orow(o.begin() + i * qd, o.begin() + (i + 1) * qd);
      EXPECT_LE(rel_err(orow, k.attn_ref(i, Kg, Vg)), 1e-4);
    }
    out2.poison();
    CK(cudaGraphLaunch(exec2, st));
    CK(cudaStreamSynchronize(st));
    const auto o2 = out2.get();
    for (int i = 0; i < M2; ++i)
      EXPECT_TRUE(std::memcmp(o2.data() + i * qd, o.data() + i * qd, qd * sizeof(float)) == 0)
          << "row " << i << " in the " << M2 << "-row graph";
  }
  CK(cudaGraphExecDestroy(exec2));
  CK(cudaGraphDestroy(graph2));
  EXPECT_EQ(counter.get()[0], int(steps.size()));
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  CK(cudaStreamDestroy(st));
}

}  // namespace
