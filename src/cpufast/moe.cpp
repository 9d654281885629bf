// The MoE block of the fast CPU path: router + shared expert gate/up in one phase, the selected
// experts' gate/up (tokens grouped by expert: each expert's weights read once for all its tokens) in a
// second, all down projections and the weighted sum in a third (tasks = rows of the output, so every
// token's sum runs in one fixed order: shared expert, then its experts by rank).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu/ops.h"
#include "cpufast/forward.h"

namespace lilac::cpufast {

namespace {

// h = silu(g) ⊙ u over columns [c0, c1) (whole 64-blocks) of rows [0, n), quantized into X.
void swiglu_quantize(const float* G, const float* U, int64_t ld, int64_t n, int64_t c0, int64_t c1, const QActs& X,
                     float* h) {
  for (int64_t t = 0; t < n; ++t) {
    float* ht = h + t * ld;
    for (int64_t i = c0; i < c1; ++i) ht[i] = cpu::silu(G[t * ld + i]) * U[t * ld + i];
    quantize_act_cols(X, t, c0, c1, ht + c0);
  }
}

}  // namespace

void FastModel::moe(int l, int64_t n, float* x) {
  const ModelConfig& c = config();
  const PackedLayer& pl = pm_->layers[static_cast<size_t>(l)];
  const int E = c.num_experts, K = c.num_experts_per_tok;
  const int64_t H = c.hidden_size, I = c.moe_intermediate_size, Is = c.shared_expert_intermediate_size;
  const QActs X = s_.act.view();
  // Phase 1: router logits (+ shared_expert_gate as row E) and the shared expert's gate/up, h quantized.
  std::vector<float> logits(static_cast<size_t>(n * (E + 1)));
  s_.g.resize(static_cast<size_t>(3 * n * Is));
  float *Gs = s_.g.data(), *Us = Gs + n * Is, *Hs = Us + n * Is;
  QActs Xs = s_.act3.resize(n, Is, levels_);
  {
    const GemmJob jobs[] = {{&pl.router, X, logits.data(), E + 1}, {&pl.shared_gate, X, Gs, Is}, {&pl.shared_up, X, Us, Is}};
    gemm_phase(jobs);
  }
  stage(l, "router", n, E + 1, logits.data());
  auto shared_h = [&](int64_t t) { swiglu_quantize(Gs + t * Is, Us + t * Is, Is, 1, 0, Is, act_rows(Xs, t, t + 1), Hs + t * Is); };
  if (n >= 4)
    pool_.run(n, shared_h);
  else
    for (int64_t t = 0; t < n; ++t) shared_h(t);
  // Routing: top-k per token; pairs (token, slot) sorted by expert.
  std::vector<int> ids(static_cast<size_t>(n * K));
  std::vector<float> wts(static_cast<size_t>(n * K)), sg(static_cast<size_t>(n));
  auto route = [&](int64_t t) {
    cpu::moe_route(logits.data() + t * (E + 1), E, K, c.norm_topk_prob, ids.data() + t * K, wts.data() + t * K);
    sg[static_cast<size_t>(t)] = cpu::sigmoid(logits[static_cast<size_t>(t * (E + 1) + E)]);
  };
  if (n >= 4)
    pool_.run(n, route);
  else
    for (int64_t t = 0; t < n; ++t) route(t);
  std::vector<int64_t> count(static_cast<size_t>(E) + 1, 0), pos(static_cast<size_t>(n * K));
  for (int id : ids) ++count[static_cast<size_t>(id) + 1];
  for (int e = 0; e < E; ++e) count[static_cast<size_t>(e) + 1] += count[static_cast<size_t>(e)];  // now offsets
  {
    std::vector<int64_t> fill(count.begin(), count.end() - 1);
    for (int64_t p = 0; p < n * K; ++p) pos[static_cast<size_t>(p)] = fill[static_cast<size_t>(ids[static_cast<size_t>(p)])]++;
  }
  const int64_t P = n * K;
  // Gather the inputs in expert order.
  ActBuffer& xg_buf = s_.act2;
  QActs Xg = xg_buf.resize(P, H, levels_);
  auto gather = [&](int64_t p) {
    const int64_t t = p / K, r = pos[static_cast<size_t>(p)];
    std::memcpy(Xg.q + r * H, X.q + t * H, static_cast<size_t>(H));
    std::memcpy(Xg.d + r * Xg.blocks, X.d + t * X.blocks, static_cast<size_t>(Xg.blocks) * sizeof(float));
    std::memcpy(Xg.sum + r * Xg.blocks, X.sum + t * X.blocks, static_cast<size_t>(Xg.blocks) * sizeof(float));
    std::memcpy(Xg.rsum + r * Xg.blocks, X.rsum + t * X.blocks, static_cast<size_t>(Xg.blocks) * sizeof(float));
    if (X.q2) {
      std::memcpy(Xg.q2 + r * H, X.q2 + t * H, static_cast<size_t>(H));
      std::memcpy(Xg.d2 + r * Xg.blocks, X.d2 + t * X.blocks, static_cast<size_t>(Xg.blocks) * sizeof(float));
    }
  };
  if (P >= 64)
    pool_.run(P, gather);
  else
    for (int64_t p = 0; p < P; ++p) gather(p);
  // Phase 2: gate/up of every used expert on its tokens; each task owns whole 64-blocks of h.
  s_.u.resize(static_cast<size_t>(3 * P * I));
  float *G = s_.u.data(), *U = G + P * I, *Hh = U + P * I;
  QActs Xh = s_.hact.resize(P, I, levels_);
  struct Task {
    int e;
    int64_t b0, b1;  // 64-blocks of I
  };
  std::vector<Task> tasks;
  const int64_t IB = I / kBlock;
  // ~4 tasks per thread when only a few experts are in use (decode); whole experts when many tokens.
  const int64_t used = std::min<int64_t>(P, E);
  const int64_t step = std::clamp<int64_t>(IB * used / (4 * int64_t(pool_.size())), 1, IB);
  for (int e = 0; e < E; ++e) {
    if (count[static_cast<size_t>(e) + 1] == count[static_cast<size_t>(e)]) continue;
    for (int64_t b = 0; b < IB; b += step) tasks.push_back({e, b, std::min(IB, b + step)});
  }
  pool_.run(int64_t(tasks.size()), [&](int64_t i) {
    const Task& tk = tasks[static_cast<size_t>(i)];
    const int64_t off = count[static_cast<size_t>(tk.e)], m = count[static_cast<size_t>(tk.e) + 1] - off;
    const QActs Xe = act_rows(Xg, off, off + m);
    const PackedMatrix& Wg = pl.expert_gate[static_cast<size_t>(tk.e)];
    const PackedMatrix& Wu = pl.expert_up[static_cast<size_t>(tk.e)];
    const int64_t t0 = tk.b0 * kBlock / Wg.R, t1 = std::min(Wg.tiles, tk.b1 * kBlock / Wg.R);
    k_->gemm(Wg, t0, t1, Xe, G + off * I, I);
    k_->gemm(Wu, t0, t1, Xe, U + off * I, I);
    swiglu_quantize(G + off * I, U + off * I, I, m, tk.b0 * kBlock, tk.b1 * kBlock, act_rows(Xh, off, off + m),
                    Hh + off * I);
  });
  // Phase 3: per task a range of output rows: shared down + every used expert's down, then the sum.
  s_.dout.resize(static_cast<size_t>((P + n) * H));
  float* D = s_.dout.data();  // rows [0, P): experts (expert order); [P, P + n): shared expert
  const PackedMatrix& Wsd = pl.shared_down;
  const int64_t tiles = Wsd.tiles;
  const int64_t tstep = std::max<int64_t>(1, tiles / (int64_t(pool_.size()) * 4));
  const int64_t ntask = (tiles + tstep - 1) / tstep;
  pool_.run(ntask, [&](int64_t i) {
    const int64_t t0 = i * tstep, t1 = std::min(tiles, t0 + tstep);
    k_->gemm(Wsd, t0, t1, Xs, D + P * H, H);
    for (int e = 0; e < E; ++e) {
      const int64_t off = count[static_cast<size_t>(e)], m = count[static_cast<size_t>(e) + 1] - off;
      if (m == 0) continue;
      k_->gemm(pl.expert_down[static_cast<size_t>(e)], t0, t1, act_rows(Xh, off, off + m), D + off * H, H);
    }
    const int64_t r0 = t0 * Wsd.R, r1 = std::min(H, t1 * Wsd.R);
    for (int64_t t = 0; t < n; ++t) {
      float* xt = x + t * H;
      const float* sh = D + (P + t) * H;
      const float s = sg[static_cast<size_t>(t)];
      for (int64_t r = r0; r < r1; ++r) {
        float acc = s * sh[r];
        for (int k = 0; k < K; ++k) acc += wts[static_cast<size_t>(t * K + k)] * D[pos[static_cast<size_t>(t * K + k)] * H + r];
        xt[r] += acc;
      }
    }
  });
  stage(l, "moe", n, H, x);
}

}  // namespace lilac::cpufast
