#include "accuracy_stages.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <map>
#include <memory>

#include "cpu/attention.h"
#include "cpu/ops.h"
#include "cpufast/forward.h"

namespace lilac::cpufast::accuracy {

namespace {

using Rows = std::vector<float>;

StageError compare(int layer, const char* stage, const Rows& fast, const Rows& ref, const Rows* base = nullptr) {
  double num = 0, den = 0, mx = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double f = fast[i] - (base ? (*base)[i] : 0.f), r = ref[i];
    num += (f - r) * (f - r);
    den += r * r;
    mx = std::max(mx, std::fabs(double(fast[i]) - (double(ref[i]) + (base ? (*base)[i] : 0.f))));
  }
  return {layer, stage, den > 0 ? std::sqrt(num / den) : std::sqrt(num), mx};
}

Rows norm_rows(const Rows& x, const std::vector<float>& w, int64_t n, int64_t H, float eps) {
  Rows y(x.size());
  for (int64_t t = 0; t < n; ++t) cpu::rmsnorm(x.data() + t * H, w.data(), H, eps, y.data() + t * H);
  return y;
}

// The rows of W X for the parts stacked by rows (as the fast path packs them), [n][Σ rows].
Rows project(const std::vector<const QMatrix*>& parts, const Rows& X, int64_t n) {
  int64_t R = 0;
  for (const QMatrix* m : parts) R += m->rows;
  Rows Y(static_cast<size_t>(n * R));
  int64_t off = 0;
  for (const QMatrix* m : parts) {
    Rows y(static_cast<size_t>(n * m->rows));
    cpu::qmatmul(*m, X.data(), n, y.data());
    for (int64_t t = 0; t < n; ++t) std::memcpy(Y.data() + t * R + off, y.data() + t * m->rows, m->rows * sizeof(float));
    off += m->rows;
  }
  return Y;
}

// The Gated DeltaNet core from in_proj's output after the conv ([n][C | z | b | a]), fresh state.
Rows gdn_core(const ModelConfig& c, const DeltaNetWeights& g, const Rows& mix, int64_t n) {
  const int Hk = c.linear_num_key_heads, Hv = c.linear_num_value_heads, dk = c.linear_key_head_dim;
  const int dv = c.linear_value_head_dim, ratio = Hv / Hk;
  const int64_t C = c.gdn_conv_dim(), kd = c.gdn_key_dim(), vd = c.gdn_value_dim(), W = C + vd + 2 * Hv;
  Rows m(static_cast<size_t>(n * C)), beta(static_cast<size_t>(n * Hv)), gg(static_cast<size_t>(n * Hv));
  for (int64_t t = 0; t < n; ++t) {
    float* mt = m.data() + t * C;
    std::memcpy(mt, mix.data() + t * W, C * sizeof(float));
    for (int h = 0; h < Hk; ++h) {
      cpu::l2norm(mt + h * dk, dk);
      for (int d = 0; d < dk; ++d) mt[h * dk + d] *= 1.f / std::sqrt(float(dk));
      cpu::l2norm(mt + kd + h * dk, dk);
    }
    const float* row = mix.data() + t * W;
    cpu::gdn_gates(row + C + vd, row + C + vd + Hv, g.A_log.data(), g.dt_bias.data(), Hv, beta.data() + t * Hv,
                   gg.data() + t * Hv);
  }
  Rows o(static_cast<size_t>(n * vd));
  for (int h = 0; h < Hv; ++h) {
    const int kh = h / ratio;
    Rows S(static_cast<size_t>(dk * dv), 0.f), bh(static_cast<size_t>(n)), gh(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t) {
      bh[t] = beta[t * Hv + h];
      gh[t] = gg[t * Hv + h];
    }
    cpu::gdn_chunked(S.data(), m.data() + kh * dk, C, m.data() + kd + kh * dk, C, m.data() + 2 * kd + h * dv, C,
                     gh.data(), bh.data(), n, dk, dv, o.data() + h * dv, vd, 64);
    for (int64_t t = 0; t < n; ++t)
      cpu::gated_rmsnorm(o.data() + t * vd + h * dv, mix.data() + t * W + C + h * dv, g.norm.data(), dv,
                         float(c.rms_norm_eps), o.data() + t * vd + h * dv);
  }
  return o;
}

// The gated attention core from the q|gate, k, v projections ([n][qrows | kvd | kvd]), fp32 cache.
Rows attention_core(const ModelConfig& c, const AttentionWeights& a, const Rows& proj, int64_t n) {
  const int64_t qrows = c.q_proj_rows(), kvd = c.kv_dim(), qd = int64_t(c.num_heads) * c.head_dim;
  const int64_t W = qrows + 2 * kvd;
  const std::vector<float> inv_freq = cpu::rope_inv_freq(c.rotary_dim, c.rope_theta);
  const cpu::AttentionCall call{c, inv_freq.data(), n};
  Rows K(static_cast<size_t>(n * kvd)), V(static_cast<size_t>(n * kvd)), q(static_cast<size_t>(n * qd)),
      gate(static_cast<size_t>(n * qd)), out(static_cast<size_t>(n * qd)), scores(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) {
    std::memcpy(K.data() + t * kvd, proj.data() + t * W + qrows, kvd * sizeof(float));
    std::memcpy(V.data() + t * kvd, proj.data() + t * W + qrows + kvd, kvd * sizeof(float));
    cpu::attention_qk_token(call, a, proj.data() + t * W, t, q.data() + t * qd,
                            c.attn_output_gate ? gate.data() + t * qd : nullptr, K.data() + t * kvd, V.data() + t * kvd);
  }
  for (int64_t t = 0; t < n; ++t)
    cpu::gated_attention_token(q.data() + t * qd, c.attn_output_gate ? gate.data() + t * qd : nullptr, K.data(),
                               V.data(), t + 1, c.num_heads, c.num_kv_heads, c.head_dim, out.data() + t * qd,
                               scores.data());
  return out;
}

}  // namespace

namespace {

using Stages = std::map<std::pair<int, std::string>, Rows>;

// The reference's stages of every layer; each stage's input is the fast path's result of the stage
// before it (`fast` non-null) or the reference's own. mixer / moe hold the hidden state after the residual.
Stages reference_stages(const ModelWeights& w, const std::vector<int32_t>& tokens, const Stages* fast) {
  const ModelConfig& c = w.config;
  const int64_t n = int64_t(tokens.size()), H = c.hidden_size;
  const float eps = float(c.rms_norm_eps);
  Stages ref;
  auto in = [&](int l, const char* s) -> const Rows& { return fast ? fast->at({l, s}) : ref.at({l, s}); };
  Rows x(static_cast<size_t>(n * H));
  for (int64_t t = 0; t < n; ++t) cpu::embed_row(w.embed, tokens[t], x.data() + t * H);
  auto residual = [&](const Rows& base, Rows inc) {
    for (size_t i = 0; i < inc.size(); ++i) inc[i] += base[i];
    return inc;
  };
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& lw = w.layers[l];
    const Rows y = norm_rows(x, lw.input_norm, n, H, eps);
    if (lw.full_attention) {
      const AttentionWeights& a = lw.attn;
      ref[{l, "mixer_in"}] = project({&a.q_proj, &a.k_proj, &a.v_proj}, y, n);
      ref[{l, "core"}] = attention_core(c, a, in(l, "mixer_in"), n);
      ref[{l, "mixer"}] = residual(x, project({&a.o_proj}, in(l, "core"), n));
    } else {
      const DeltaNetWeights& g = lw.gdn;
      Rows p = project({&g.in_proj_qkv, &g.in_proj_z, &g.in_proj_b, &g.in_proj_a}, y, n);
      const int64_t C = c.gdn_conv_dim(), Wd = int64_t(p.size()) / n;
      Rows state(static_cast<size_t>(C * (c.linear_conv_kernel_dim - 1)), 0.f);
      for (int64_t t = 0; t < n; ++t)
        cpu::conv1d_silu_step(g.conv1d.data(), C, c.linear_conv_kernel_dim, state.data(), p.data() + t * Wd,
                              p.data() + t * Wd);
      ref[{l, "mixer_in"}] = std::move(p);
      ref[{l, "core"}] = gdn_core(c, g, in(l, "mixer_in"), n);
      ref[{l, "mixer"}] = residual(x, project({&g.out_proj}, in(l, "core"), n));
    }
    x = in(l, "mixer");
    const Rows y2 = norm_rows(x, lw.post_norm, n, H, eps);
    ref[{l, "router"}] = project({&lw.moe.router, &lw.moe.shared_expert_gate}, y2, n);
    Rows moe(static_cast<size_t>(n * H));
    cpu::moe_forward(lw.moe, c, y2.data(), n, moe.data());
    ref[{l, "moe"}] = residual(x, std::move(moe));
    x = in(l, "moe");
  }
  return ref;
}

}  // namespace

namespace {

Stages fast_stages(const ModelWeights& w, const KernelSet& k, const std::vector<int32_t>& tokens) {
  // A non-owning handle: the caller keeps the weights.
  std::shared_ptr<const ModelWeights> wp(&w, [](const ModelWeights*) {});
  FastModel fm(wp, k, 1);
  const int64_t n = int64_t(tokens.size());
  Stages got;
  fm.set_stage_tap([&](int l, const char* s, int64_t rows, int64_t width, const float* d) {
    got[{l, s}].assign(d, d + rows * width);
  });
  SeqState st;
  fm.init_state(st);
  const Segment seg{&st, n, n};
  Rows final_h(static_cast<size_t>(w.config.hidden_size));
  const int64_t last = n - 1;
  fm.forward(std::span<const Segment>(&seg, 1), tokens, std::span<const int64_t>(&last, 1), final_h.data());
  return got;
}

}  // namespace

namespace {

std::vector<RouterTie> router_ties(const ModelWeights& w, const Stages& got, const Stages& ref,
                                   const std::vector<int32_t>& tokens) {
  const int E = w.config.num_experts, K = w.config.num_experts_per_tok;
  const int64_t n = int64_t(tokens.size());
  std::vector<RouterTie> out;
  for (int l = 0; l < w.config.num_layers; ++l) {
    const Rows& f = got.at({l, "router"});
    const Rows& r = ref.at({l, "router"});
    RouterTie tie{l, 0, 1e30, 0, 0};
    for (int64_t t = 0; t < n; ++t) {
      auto order = [&](const Rows& x) {
        std::vector<int> id(static_cast<size_t>(E));
        for (int e = 0; e < E; ++e) id[e] = e;
        std::stable_sort(id.begin(), id.end(), [&](int a, int b) { return x[t * (E + 1) + a] > x[t * (E + 1) + b]; });
        return id;
      };
      const auto ro = order(r), fo = order(f);
      std::vector<int> rs(ro.begin(), ro.begin() + K), fs(fo.begin(), fo.begin() + K);
      std::sort(rs.begin(), rs.end());
      std::sort(fs.begin(), fs.end());
      if (rs != fs) ++tie.flips;
      const double gap = r[t * (E + 1) + ro[K - 1]] - r[t * (E + 1) + ro[K]];
      if (gap < tie.gap) {
        tie.gap = gap;
        tie.token = t;
        tie.fast_gap = f[t * (E + 1) + ro[K - 1]] - f[t * (E + 1) + ro[K]];
      }
    }
    out.push_back(tie);
  }
  return out;
}

}  // namespace

std::vector<std::vector<RouterTie>> router_ties(const ModelWeights& w, const std::vector<const KernelSet*>& sets,
                                                const std::vector<int32_t>& tokens) {
  const Stages ref = reference_stages(w, tokens, nullptr);
  std::vector<std::vector<RouterTie>> all;
  for (const KernelSet* k : sets) all.push_back(router_ties(w, fast_stages(w, *k, tokens), ref, tokens));
  return all;
}

std::vector<StageError> stage_errors(const ModelWeights& w, const KernelSet& k, const std::vector<int32_t>& tokens,
                                     bool chained) {
  const ModelConfig& c = w.config;
  const int64_t n = int64_t(tokens.size());
  const Stages got = fast_stages(w, k, tokens);
  const Stages ref = reference_stages(w, tokens, chained ? nullptr : &got);
  std::vector<StageError> out;
  Rows x(static_cast<size_t>(n * c.hidden_size));
  for (int64_t t = 0; t < n; ++t) cpu::embed_row(w.embed, tokens[t], x.data() + t * c.hidden_size);
  for (int l = 0; l < c.num_layers; ++l)
    for (const char* s : {"mixer_in", "core", "mixer", "router", "moe"}) {
      const Rows& f = got.at({l, s});
      const Rows& r = ref.at({l, s});
      const bool res = std::string(s) == "mixer" || std::string(s) == "moe";
      if (!res || chained) {
        out.push_back(compare(l, s, f, r));
        continue;
      }
      // Local: the sublayer's increment against the reference's on the same input.
      const Rows& base = std::string(s) == "mixer" ? x : got.at({l, "mixer"});
      Rows inc(r.size());
      for (size_t i = 0; i < r.size(); ++i) inc[i] = r[i] - base[i];
      out.push_back(compare(l, s, f, inc, &base));
      if (std::string(s) == "moe") x = f;
    }
  return out;
}

std::string format_stage_errors(const std::vector<StageError>& e) {
  std::string s = "layer stage      rel         max|d|\n";
  char buf[128];
  for (const StageError& x : e) {
    std::snprintf(buf, sizeof buf, "%5d %-9s %10.3e %10.3e\n", x.layer, x.stage.c_str(), x.rel, x.max_abs);
    s += buf;
  }
  return s;
}

}  // namespace lilac::cpufast::accuracy
