// The token mixers of the fast CPU path: gated attention over the f16 KV cache and the Gated
// DeltaNet (conv fused into the in_proj phase; the recurrence per (session, value head), chunked for
// prefill, one step for decode).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/bf16.h"
#include "cpu/ops.h"
#include "cpufast/attention.h"
#include "cpufast/forward.h"
#include "cpufast/gdn.h"

namespace lilac::cpufast {

namespace {

// Row index of each segment's first row.
std::vector<int64_t> segment_rows(std::span<const Segment> segs) {
  std::vector<int64_t> r;
  int64_t acc = 0;
  for (const Segment& s : segs) {
    r.push_back(acc);
    acc += s.n;
  }
  return r;
}

// The K/V cache's format: IEEE half (11 significant bits: 8x finer than bf16 at the same size), values
// beyond its range saturated to ±65504 (k is RMS-normed; v of a real checkpoint stays far below).
void to_f16(const float* x, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = f32_to_f16(std::clamp(x[i], -65504.f, 65504.f));
}

}  // namespace

void FastModel::attention(int l, std::span<const Segment> segs, int64_t n, float* x) {
  const ModelConfig& c = config();
  const AttentionWeights& a = w_->layers[static_cast<size_t>(l)].attn;
  const PackedLayer& pl = pm_->layers[static_cast<size_t>(l)];
  const int heads = c.num_heads, kvh = c.num_kv_heads, hd = c.head_dim, group = heads / kvh;
  const int64_t qrows = c.q_proj_rows(), kvd = c.kv_dim(), qd = int64_t(heads) * hd, rows_in = pl.in.rows;
  const int64_t H = c.hidden_size;
  const bool gated = c.attn_output_gate;
  const float eps = float(c.rms_norm_eps);
  const std::vector<int64_t> row0 = segment_rows(segs);
  s_.proj.resize(static_cast<size_t>(n * rows_in));
  float* proj = s_.proj.data();
  {
    const GemmJob job{&pl.in, s_.act.view(), proj, rows_in};
    gemm_phase(std::span<const GemmJob>(&job, 1));
  }
  stage(l, "mixer_in", n, rows_in, proj);
  for (const Segment& s : segs) {
    LayerState& st = s.st->layers[static_cast<size_t>(l)];
    if (int64_t(st.k.size()) < (s.st->len + s.n) * kvd) {
      const int64_t cap = std::min(s.max_len, std::max(s.st->len + s.n, 2 * s.st->len));
      st.k.resize(static_cast<size_t>(cap * kvd));
      st.v.resize(static_cast<size_t>(cap * kvd));
    }
  }
  // q: norm + RoPE into mix [n][qd]; gate [n][qd]; k (norm + RoPE) and v into the cache as f16.
  s_.mix.resize(static_cast<size_t>(2 * n * qd));
  float* q = s_.mix.data();
  float* gate = q + n * qd;
  std::vector<std::pair<int, int64_t>> where(static_cast<size_t>(n));
  for (size_t si = 0; si < segs.size(); ++si)
    for (int64_t i = 0; i < segs[si].n; ++i) where[static_cast<size_t>(row0[si] + i)] = {int(si), segs[si].st->len + i};
  auto prep = [&](int64_t t) {
    const auto [si, pos] = where[static_cast<size_t>(t)];
    LayerState& st = segs[static_cast<size_t>(si)].st->layers[static_cast<size_t>(l)];
    float* qg = proj + t * rows_in;
    for (int h = 0; h < heads; ++h) {
      float* qh = q + t * qd + int64_t(h) * hd;
      const float* src = qg + (gated ? int64_t(h) * 2 * hd : int64_t(h) * hd);
      cpu::rmsnorm(src, a.q_norm.data(), hd, eps, qh);
      cpu::rope_with(qh, c.rotary_dim, pos, inv_freq_.data());
      if (gated) std::memcpy(gate + t * qd + int64_t(h) * hd, src + hd, static_cast<size_t>(hd) * sizeof(float));
    }
    float* kt = qg + qrows;
    for (int h = 0; h < kvh; ++h) {
      float* kh = kt + int64_t(h) * hd;
      cpu::rmsnorm(kh, a.k_norm.data(), hd, eps, kh);
      cpu::rope_with(kh, c.rotary_dim, pos, inv_freq_.data());
    }
    to_f16(kt, kvd, st.k.data() + pos * kvd);
    to_f16(kt + kvd, kvd, st.v.data() + pos * kvd);
  };
  if (n >= 4)
    pool_.run(n, prep);
  else
    for (int64_t t = 0; t < n; ++t) prep(t);
  s_.out.resize(static_cast<size_t>(n * qd));
  float* att = s_.out.data();
  // The core per task (attention.h): (segment, kv head, some of its query heads, a block of queries).
  const AttentionShape shape{heads, hd, kvd, 1.f / std::sqrt(float(hd))};
  const std::vector<AttentionTask> tasks = attention_tasks(segs, kvh, group, pool_.size());
  pool_.run(int64_t(tasks.size()), [&](int64_t ti) {
    const AttentionTask& tk = tasks[static_cast<size_t>(ti)];
    const Segment& sg = segs[static_cast<size_t>(tk.seg)];
    const LayerState& st = sg.st->layers[static_cast<size_t>(l)];
    const int64_t first = row0[static_cast<size_t>(tk.seg)] + tk.t0;  // the task's first row of the batch
    attention_rows(*k_, shape, st.k.data(), st.v.data(), sg.st->len + tk.t0, tk.t1 - tk.t0, tk.kv, tk.h0, tk.h1,
                   q + first * qd, gated ? gate + first * qd : nullptr, att + first * qd);
  });
  stage(l, "core", n, qd, att);
  quantize_rows(att, n, qd, s_.act2);
  s_.dout.resize(static_cast<size_t>(n * H));
  float* y = s_.dout.data();
  const GemmJob job{&pl.out, s_.act2.view(), y, H};
  const Epilogue add = [&](size_t, int64_t r0, int64_t r1) {
    for (int64_t t = 0; t < n; ++t)
      for (int64_t r = r0; r < r1; ++r) x[t * H + r] += y[t * H + r];
  };
  gemm_phase(std::span<const GemmJob>(&job, 1), &add);
  stage(l, "mixer", n, H, x);
}

void FastModel::deltanet(int l, std::span<const Segment> segs, int64_t n, float* x) {
  const ModelConfig& c = config();
  const DeltaNetWeights& g = w_->layers[static_cast<size_t>(l)].gdn;
  const PackedLayer& pl = pm_->layers[static_cast<size_t>(l)];
  const int Hk = c.linear_num_key_heads, Hv = c.linear_num_value_heads, ratio = Hv / Hk;
  const int dk = c.linear_key_head_dim, dv = c.linear_value_head_dim, K = c.linear_conv_kernel_dim;
  const int64_t C = c.gdn_conv_dim(), kd = c.gdn_key_dim(), vd = c.gdn_value_dim(), rows_in = pl.in.rows;
  const int64_t H = c.hidden_size;
  const float eps = float(c.rms_norm_eps);
  const std::vector<int64_t> row0 = segment_rows(segs);
  s_.proj.resize(static_cast<size_t>(n * rows_in));
  float* proj = s_.proj.data();
  // in_proj for all rows; each task then runs the causal conv + SiLU over time for its conv channels.
  {
    const GemmJob job{&pl.in, s_.act.view(), proj, rows_in};
    const Epilogue conv = [&](size_t, int64_t r0, int64_t r1) {
      const int S = K - 1;
      for (size_t si = 0; si < segs.size(); ++si) {
        float* state = segs[si].st->layers[static_cast<size_t>(l)].conv.data();
        for (int64_t ch = r0; ch < std::min(r1, C); ++ch) {
          const float* w = g.conv1d.data() + ch * K;
          float* st = state + ch * S;
          for (int64_t i = 0; i < segs[si].n; ++i) {
            float* p = proj + (row0[si] + i) * rows_in + ch;
            const float xv = *p;
            float acc = 0.f;
            for (int k = 0; k < S; ++k) acc += w[k] * st[k];
            acc += w[S] * xv;
            for (int k = 0; k + 1 < S; ++k) st[k] = st[k + 1];
            if (S > 0) st[S - 1] = xv;
            *p = cpu::silu(acc);
          }
        }
      }
    };
    gemm_phase(std::span<const GemmJob>(&job, 1), &conv);
  }
  stage(l, "mixer_in", n, rows_in, proj);
  // The recurrence per (segment, value head).
  s_.out.resize(static_cast<size_t>(n * vd));
  float* out = s_.out.data();
  const float qscale = 1.f / std::sqrt(float(dk));
  const int64_t ntasks = int64_t(segs.size()) * Hv;
  pool_.run(ntasks, [&](int64_t ti) {
    const size_t si = size_t(ti / Hv);
    const int h = int(ti % Hv), kh = h / ratio;
    const Segment& sg = segs[si];
    const int64_t m = sg.n, r0 = row0[si];
    thread_local std::vector<float> qb, kb, gb, bb, u, scratch;
    qb.resize(static_cast<size_t>(m * dk));
    kb.resize(static_cast<size_t>(m * dk));
    gb.resize(static_cast<size_t>(m));
    bb.resize(static_cast<size_t>(m));
    u.resize(static_cast<size_t>(dv));
    for (int64_t i = 0; i < m; ++i) {
      const float* row = proj + (r0 + i) * rows_in;
      float* qi = qb.data() + i * dk;
      float* ki = kb.data() + i * dk;
      std::memcpy(qi, row + int64_t(kh) * dk, static_cast<size_t>(dk) * sizeof(float));
      std::memcpy(ki, row + kd + int64_t(kh) * dk, static_cast<size_t>(dk) * sizeof(float));
      cpu::l2norm(qi, dk);
      for (int d = 0; d < dk; ++d) qi[d] *= qscale;
      cpu::l2norm(ki, dk);
      const float b = row[C + vd + h], a = row[C + vd + Hv + h];
      bb[static_cast<size_t>(i)] = cpu::sigmoid(b);
      gb[static_cast<size_t>(i)] = -std::exp(g.A_log[static_cast<size_t>(h)]) * cpu::softplus(a + g.dt_bias[static_cast<size_t>(h)]);
    }
    float* S = sg.st->layers[static_cast<size_t>(l)].S.data() + int64_t(h) * dk * dv;
    const float* v = proj + r0 * rows_in + 2 * kd + int64_t(h) * dv;
    float* o = out + r0 * vd + int64_t(h) * dv;
    if (m == 1)
      gdn_step_fast(S, qb.data(), kb.data(), v, gb[0], bb[0], dk, dv, o, u.data());
    else
      gdn_chunked_fast(*k_, S, qb.data(), dk, kb.data(), dk, v, rows_in, gb.data(), bb.data(), m, dk, dv, o, vd, scratch);
    for (int64_t i = 0; i < m; ++i)
      cpu::gated_rmsnorm(o + i * vd, proj + (r0 + i) * rows_in + C + int64_t(h) * dv, g.norm.data(), dv, eps, o + i * vd);
  });
  stage(l, "core", n, vd, out);
  quantize_rows(out, n, vd, s_.act2);
  s_.dout.resize(static_cast<size_t>(n * H));
  float* y = s_.dout.data();
  const GemmJob job{&pl.out, s_.act2.view(), y, H};
  const Epilogue add = [&](size_t, int64_t r0, int64_t r1) {
    for (int64_t t = 0; t < n; ++t)
      for (int64_t r = r0; r < r1; ++r) x[t * H + r] += y[t * H + r];
  };
  gemm_phase(std::span<const GemmJob>(&job, 1), &add);
  stage(l, "mixer", n, H, x);
}

}  // namespace lilac::cpufast
