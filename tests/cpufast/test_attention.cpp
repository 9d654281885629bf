// The fast CPU path's attention core (cpufast/attention.h) and the several-row helpers it runs on
// (kernels.h: dots, axpys, f16_to_f32): on every kernel set this CPU has and the emulated avx512-vnni
// set, bit for bit what the one-row helpers give, whatever rows share a task.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "avx512_emu.h"
#include "core/bf16.h"
#include "cpu/ops.h"
#include "cpufast/attention.h"
#include "cpufast/isa.h"

using namespace lilac;
using namespace lilac::cpufast;

namespace {

std::vector<const KernelSet*> sets() {
  std::vector<const KernelSet*> v = available_kernels();
  v.push_back(&emu::avx512_emulated());
  return v;
}

std::vector<float> randn(int64_t n, uint32_t seed, float sd = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, sd);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<uint16_t> to_half(const std::vector<float>& x) {
  std::vector<uint16_t> h(x.size());
  for (size_t i = 0; i < x.size(); ++i) h[i] = f32_to_f16(x[i]);
  return h;
}

bool same_bits(const float* a, const float* b, int64_t n) { return std::memcmp(a, b, static_cast<size_t>(n) * 4) == 0; }

// The attention of one (query, head) row as the fast path computed it before tiles: the one-row helpers
// straight on the f16 cache.
void reference_row(const KernelSet& k, const AttentionShape& s, const uint16_t* K, const uint16_t* V, int64_t pos, int h,
                   const float* q, const float* gate, float* o) {
  const int64_t hd = s.head_dim, group = s.heads * hd / s.kv_dim, kvo = h / group * hd;
  std::vector<float> sc(static_cast<size_t>(pos + 1));
  float mx = -INFINITY, sum = 0.f;
  for (int64_t j = 0; j <= pos; ++j) {
    sc[static_cast<size_t>(j)] = k.dot_f16(q, K + j * s.kv_dim + kvo, hd) * s.scale;
    mx = std::max(mx, sc[static_cast<size_t>(j)]);
  }
  for (int64_t j = 0; j <= pos; ++j) sum += (sc[static_cast<size_t>(j)] = std::exp(sc[static_cast<size_t>(j)] - mx));
  std::fill(o, o + hd, 0.f);
  for (int64_t j = 0; j <= pos; ++j) k.axpy_f16(sc[static_cast<size_t>(j)], V + j * s.kv_dim + kvo, o, hd);
  const float inv = 1.f / sum;
  for (int64_t d = 0; d < hd; ++d) o[d] *= gate ? inv * cpu::sigmoid(gate[d]) : inv;
}

}  // namespace

TEST(CpuFastAttention, SeveralRowHelpersEqualTheOneRowHelpers) {
  for (const KernelSet* k : sets())
    for (int64_t n : {256, 128, 96, 64, 48, 32, 16, 133, 8, 3})
      for (int64_t m : {1, 3, 4, 5, 8, 9}) {
        const int64_t ldb = n + 7;
        const auto a = randn(n, 1), B = randn(m * ldb, 2), p = randn(m, 3);
        std::vector<float> got(static_cast<size_t>(m)), want(static_cast<size_t>(m));
        k->dots(a.data(), B.data(), ldb, m, n, got.data());
        for (int64_t j = 0; j < m; ++j) want[static_cast<size_t>(j)] = k->dot(a.data(), B.data() + j * ldb, n);
        EXPECT_TRUE(same_bits(got.data(), want.data(), m)) << k->name << " dots n=" << n << " m=" << m;
        std::vector<float> y = randn(n, 4), y1 = y;
        k->axpys(p.data(), B.data(), ldb, m, y.data(), n);
        for (int64_t j = 0; j < m; ++j) k->axpy(p[static_cast<size_t>(j)], B.data() + j * ldb, y1.data(), n);
        EXPECT_TRUE(same_bits(y.data(), y1.data(), n)) << k->name << " axpys n=" << n << " m=" << m;
      }
}

TEST(CpuFastAttention, HalfToFloatIsExactOnEveryHalf) {
  std::vector<uint16_t> h;
  for (uint32_t v = 0; v < 0x10000u; ++v)
    if ((v & 0x7c00u) != 0x7c00u || !(v & 0x3ffu)) h.push_back(uint16_t(v));  // NaN payloads aside
  for (const KernelSet* k : sets()) {
    std::vector<float> f(h.size());
    k->f16_to_f32(h.data(), f.data(), int64_t(h.size()) - 3);  // a ragged tail too
    for (size_t i = 0; i + 3 < h.size(); ++i) {
      const float want = f16_to_f32(h[i]);
      ASSERT_EQ(std::memcmp(&f[i], &want, 4), 0) << k->name << " half 0x" << std::hex << h[i];
    }
  }
}

// Every (query, head) row of attention_rows equals the one-row reference bit for bit: prefill blocks at any
// position, decode rows, heads split or not, head widths the four-row paths take (256, 64) and one they do
// not (40), with and without the output gate; and every task split of a batch gives the same bits.
TEST(CpuFastAttention, RowsEqualTheOneRowReferenceWhateverTheirTask) {
  struct Case {
    int heads, kv_heads, hd;
    int64_t ctx;
    bool gated;
  };
  for (const Case c : {Case{16, 2, 256, 150, true}, Case{4, 1, 64, 70, false}, Case{6, 3, 40, 131, true}})
    for (const KernelSet* k : sets()) {
      const int group = c.heads / c.kv_heads;
      const AttentionShape s{c.heads, c.hd, int64_t(c.kv_heads) * c.hd, 1.f / std::sqrt(float(c.hd))};
      const int64_t qd = int64_t(c.heads) * c.hd;
      const auto K = to_half(randn(c.ctx * s.kv_dim, 5)), V = to_half(randn(c.ctx * s.kv_dim, 6));
      const auto q = randn(c.ctx * qd, 7, 2.f), gate = randn(c.ctx * qd, 8);
      std::vector<float> want(static_cast<size_t>(c.ctx * qd));
      for (int64_t pos = 0; pos < c.ctx; ++pos)
        for (int h = 0; h < c.heads; ++h)
          reference_row(*k, s, K.data(), V.data(), pos, h, q.data() + pos * qd + h * c.hd,
                        c.gated ? gate.data() + pos * qd + h * c.hd : nullptr, want.data() + pos * qd + h * c.hd);
      // Query blocks of 1 (decode), 7 and 16 from assorted positions; the group whole or split in parts.
      for (int64_t qb : {1, 7, 16})
        for (int part : {group, 1}) {
          std::vector<float> got(static_cast<size_t>(c.ctx * qd), NAN);
          for (int64_t p0 = 0; p0 < c.ctx; p0 += qb)
            for (int kv = 0; kv < c.kv_heads; ++kv)
              for (int h0 = kv * group; h0 < (kv + 1) * group; h0 += part) {
                const int64_t nq = std::min(qb, c.ctx - p0);
                attention_rows(*k, s, K.data(), V.data(), p0, nq, kv, h0, h0 + part, q.data() + p0 * qd,
                               c.gated ? gate.data() + p0 * qd : nullptr, got.data() + p0 * qd);
              }
          EXPECT_TRUE(same_bits(got.data(), want.data(), c.ctx * qd))
              << k->name << " hd=" << c.hd << " block=" << qb << " heads per task=" << part;
        }
    }
}

// The tasks cover every (segment row, query head) once, and split a group's heads only when there would be
// fewer than two tasks per thread.
TEST(CpuFastAttention, TasksCoverEveryRowAndHeadOnce) {
  SeqState a, b;
  a.len = 10;
  b.len = 5000;
  const std::vector<Segment> segs{{&a, 37, 4096}, {&b, 1, 8192}};
  for (int threads : {1, 2, 16, 64}) {
    const auto tasks = attention_tasks(segs, 2, 8, threads);
    std::vector<int> seen((37 + 1) * 16, 0);
    for (const AttentionTask& t : tasks) {
      EXPECT_EQ(t.h0 / 8, t.kv);
      EXPECT_EQ((t.h1 - 1) / 8, t.kv);
      for (int64_t r = t.t0; r < t.t1; ++r)
        for (int h = t.h0; h < t.h1; ++h) ++seen[static_cast<size_t>((t.seg == 0 ? r : 37 + r) * 16 + h)];
    }
    for (int v : seen) EXPECT_EQ(v, 1) << threads << " threads";
    if (threads <= 2) EXPECT_EQ(tasks.front().h1 - tasks.front().h0, 8);
  }
  SeqState one;
  one.len = 100;
  const std::vector<Segment> decode{{&one, 1, 4096}};
  EXPECT_EQ(attention_tasks(decode, 2, 8, 16).size(), 16u);  // 2 kv heads x 8 parts: a task per query head
  EXPECT_EQ(attention_tasks(decode, 2, 8, 1).size(), 2u);
}
