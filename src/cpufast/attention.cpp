#include "cpufast/attention.h"

#include <algorithm>
#include <cmath>

#include "cpu/ops.h"

namespace lilac::cpufast {

namespace {
constexpr int64_t kKeyTile = 32;        // K / V rows converted to fp32 at a time
constexpr int64_t kMaxQueries = 16;     // queries per task
constexpr int64_t kMaxScores = 1 << 20; // a task's scores (floats) at most, about
}  // namespace

std::vector<AttentionTask> attention_tasks(std::span<const Segment> segs, int kv_heads, int group, int threads) {
  int64_t max_ctx = 1;
  for (const Segment& s : segs) max_ctx = std::max(max_ctx, s.st->len + s.n);
  const int64_t qb = std::clamp<int64_t>(kMaxScores / (int64_t(group) * max_ctx), 1, kMaxQueries);
  int64_t blocks = 0;
  for (const Segment& s : segs) blocks += (s.n + qb - 1) / qb;
  int split = 1;  // parts of a group; a part's rows convert their own tiles
  while (split < group && group % (2 * split) == 0 && blocks * kv_heads * split < 2 * int64_t(threads)) split *= 2;
  std::vector<AttentionTask> tasks;
  tasks.reserve(static_cast<size_t>(blocks * kv_heads * split));
  const int part = group / split;
  for (size_t si = 0; si < segs.size(); ++si)
    for (int kv = 0; kv < kv_heads; ++kv)
      for (int h0 = kv * group; h0 < (kv + 1) * group; h0 += part)
        for (int64_t t0 = 0; t0 < segs[si].n; t0 += qb)
          tasks.push_back({int(si), kv, h0, h0 + part, t0, std::min(segs[si].n, t0 + qb)});
  return tasks;
}

void attention_rows(const KernelSet& k, const AttentionShape& s, const uint16_t* K, const uint16_t* V, int64_t pos0,
                    int64_t nq, int kv, int h0, int h1, const float* q, const float* gate, float* out) {
  const int64_t hd = s.head_dim, qd = int64_t(s.heads) * hd, nh = h1 - h0, kvo = int64_t(kv) * hd;
  const int64_t ctx_end = pos0 + nq;  // the last query's context
  thread_local std::vector<float> tile, scores, inv;  // inv: 1 / Σ_j p_j per (query, head) row
  tile.resize(static_cast<size_t>(kKeyTile * hd));
  scores.resize(static_cast<size_t>(nq * nh * ctx_end));
  inv.resize(static_cast<size_t>(nq * nh));
  auto row_scores = [&](int64_t i, int64_t h) { return scores.data() + (i * nh + (h - h0)) * ctx_end; };
  // Each tile covers keys [j0, j0 + jn); query i reads the first min(jn, its context − j0) of them.
  auto for_tiles = [&](const uint16_t* cache, auto&& rows) {
    for (int64_t j0 = 0; j0 < ctx_end; j0 += kKeyTile) {
      const int64_t jn = std::min(kKeyTile, ctx_end - j0);
      for (int64_t j = 0; j < jn; ++j) k.f16_to_f32(cache + (j0 + j) * s.kv_dim + kvo, tile.data() + j * hd, hd);
      for (int64_t i = 0; i < nq; ++i) {
        const int64_t ctx = pos0 + i + 1;
        if (j0 < ctx) rows(j0, std::min(jn, ctx - j0), i);
      }
    }
  };
  for_tiles(K, [&](int64_t j0, int64_t m, int64_t i) {
    for (int64_t h = h0; h < h1; ++h) {
      float* sc = row_scores(i, h) + j0;
      k.dots(q + i * qd + h * hd, tile.data(), hd, m, hd, sc);
      for (int64_t j = 0; j < m; ++j) sc[j] *= s.scale;
    }
  });
  for (int64_t i = 0; i < nq; ++i)
    for (int64_t h = h0; h < h1; ++h) {
      float* sc = row_scores(i, h);
      const int64_t ctx = pos0 + i + 1;
      float mx = -INFINITY, sum = 0.f;
      for (int64_t j = 0; j < ctx; ++j) mx = std::max(mx, sc[j]);
      for (int64_t j = 0; j < ctx; ++j) sum += (sc[j] = std::exp(sc[j] - mx));
      inv[static_cast<size_t>(i * nh + (h - h0))] = 1.f / sum;
      std::fill(out + i * qd + h * hd, out + i * qd + (h + 1) * hd, 0.f);
    }
  for_tiles(V, [&](int64_t j0, int64_t m, int64_t i) {
    for (int64_t h = h0; h < h1; ++h) k.axpys(row_scores(i, h) + j0, tile.data(), hd, m, out + i * qd + h * hd, hd);
  });
  for (int64_t i = 0; i < nq; ++i)
    for (int64_t h = h0; h < h1; ++h) {
      const float iv = inv[static_cast<size_t>(i * nh + (h - h0))];
      float* o = out + i * qd + h * hd;
      const float* g = gate ? gate + i * qd + h * hd : nullptr;
      for (int64_t d = 0; d < hd; ++d) o[d] *= g ? iv * cpu::sigmoid(g[d]) : iv;
    }
}

}  // namespace lilac::cpufast
