// FastModel: construction, the layer loop, the LM head, and the phase helpers.
#include "cpufast/forward.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/log.h"
#include "cpu/ops.h"

namespace lilac::cpufast {

FastModel::FastModel(std::shared_ptr<const ModelWeights> w, const KernelSet& kernels, int threads)
    : w_(std::move(w)), k_(&kernels), pool_(threads) {
  const ModelConfig& c = w_->config;
  LILAC_CHECK(int(w_->layers.size()) == c.num_layers, "cpu backend: weights have " + std::to_string(w_->layers.size()) +
                                                          " layers, config " + std::to_string(c.num_layers));
  LILAC_CHECK(c.num_kv_heads > 0 && c.num_heads % c.num_kv_heads == 0,
              "cpu backend: num_attention_heads must be a multiple of num_key_value_heads");
  LILAC_CHECK(c.linear_num_key_heads > 0 && c.linear_num_value_heads % c.linear_num_key_heads == 0,
              "cpu backend: linear_num_value_heads must be a multiple of linear_num_key_heads");
  LILAC_CHECK(int64_t(c.full_attention.size()) == c.num_layers, "cpu backend: config has no layer types");
  pm_ = pack_model(*w_, kernels, pool_.size());
  inv_freq_ = cpu::rope_inv_freq(c.rotary_dim, c.rope_theta);
  if (const char* e = std::getenv("LILAC_CPU_ACT_LEVELS")) levels_ = std::atoi(e) == 1 ? 1 : 2;
}

void FastModel::init_state(SeqState& s) const {
  const ModelConfig& c = config();
  const int64_t Hv = c.linear_num_value_heads, dk = c.linear_key_head_dim, dv = c.linear_value_head_dim;
  s.layers.assign(static_cast<size_t>(c.num_layers), LayerState{});
  for (int l = 0; l < c.num_layers; ++l) {
    if (c.full_attention[static_cast<size_t>(l)]) continue;
    s.layers[static_cast<size_t>(l)].S.assign(static_cast<size_t>(Hv * dk * dv), 0.f);
    s.layers[static_cast<size_t>(l)].conv.assign(static_cast<size_t>(c.gdn_conv_dim() * (c.linear_conv_kernel_dim - 1)), 0.f);
  }
  s.len = 0;
}

void FastModel::gemm_phase(std::span<const GemmJob> jobs, const Epilogue* epi) {
  struct Task {
    size_t job;
    int64_t t0, t1;
  };
  int64_t total = 0;
  for (const GemmJob& j : jobs) total += j.W->tiles;
  // ~8 tasks per thread for balance.
  const int64_t step = std::max<int64_t>(1, total / (int64_t(pool_.size()) * 8));
  std::vector<Task> tasks;
  for (size_t j = 0; j < jobs.size(); ++j)
    for (int64_t t = 0; t < jobs[j].W->tiles; t += step) tasks.push_back({j, t, std::min(jobs[j].W->tiles, t + step)});
  pool_.run(int64_t(tasks.size()), [&](int64_t i) {
    const Task& t = tasks[static_cast<size_t>(i)];
    const GemmJob& j = jobs[t.job];
    k_->gemm(*j.W, t.t0, t.t1, j.X, j.Y, j.ldy);
    if (epi) (*epi)(t.job, t.t0 * j.W->R, std::min(j.W->rows, t.t1 * j.W->R));
  });
}

void FastModel::quantize_rows(const float* x, int64_t n, int64_t cols, ActBuffer& out) {
  out.resize(n, cols, levels_);
  auto row = [&](int64_t t) { out.quantize_row(t, x + t * cols); };
  if (n >= 4)
    pool_.run(n, row);
  else
    for (int64_t t = 0; t < n; ++t) row(t);
}

void FastModel::norm_quantize(const float* x, const float* w, int64_t n, ActBuffer& out, float* y) {
  const int64_t H = config().hidden_size;
  const float eps = float(config().rms_norm_eps);
  out.resize(n, H, levels_);
  auto row = [&](int64_t t) {
    thread_local std::vector<float> tmp;
    float* yt = y ? y + t * H : (tmp.resize(static_cast<size_t>(H)), tmp.data());
    cpu::rmsnorm(x + t * H, w, H, eps, yt);
    out.quantize_row(t, yt);
  };
  if (n >= 4)
    pool_.run(n, row);
  else
    for (int64_t t = 0; t < n; ++t) row(t);
}

void FastModel::forward(std::span<const Segment> segs, std::span<const int32_t> tokens,
                        std::span<const int64_t> out_rows, float* out, const Tap* tap) {
  std::lock_guard<std::mutex> lk(mu_);
  const ModelConfig& c = config();
  const int64_t H = c.hidden_size;
  const float eps = float(c.rms_norm_eps);
  int64_t n = 0;
  for (const Segment& s : segs) n += s.n;
  LILAC_CHECK(n == int64_t(tokens.size()), "cpu backend: segments and tokens disagree");
  if (n == 0) return;
  if (tap && segs.size() != 1) tap = nullptr;
  const int64_t first_pos = segs[0].st->len;
  std::vector<float>& x = s_.x;
  x.resize(static_cast<size_t>(n * H));
  for (int64_t t = 0; t < n; ++t) cpu::embed_row(w_->embed, tokens[static_cast<size_t>(t)], x.data() + t * H);
  if (tap) (*tap)("embed", first_pos, n, x.data());
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& lw = w_->layers[static_cast<size_t>(l)];
    norm_quantize(x.data(), lw.input_norm.data(), n, s_.act, nullptr);
    if (lw.full_attention)
      attention(l, segs, n, x.data());
    else
      deltanet(l, segs, n, x.data());
    norm_quantize(x.data(), lw.post_norm.data(), n, s_.act, nullptr);
    moe(l, n, x.data());
    if (tap) (*tap)("layer." + std::to_string(l), first_pos, n, x.data());
  }
  for (const Segment& s : segs) s.st->len += s.n;
  if (tap) {
    std::vector<float> y(static_cast<size_t>(n * H));
    for (int64_t t = 0; t < n; ++t) cpu::rmsnorm(x.data() + t * H, w_->final_norm.data(), H, eps, y.data() + t * H);
    (*tap)("final_norm", first_pos, n, y.data());
  }
  for (size_t i = 0; i < out_rows.size(); ++i)
    cpu::rmsnorm(x.data() + out_rows[i] * H, w_->final_norm.data(), H, eps, out + int64_t(i) * H);
}

void FastModel::lm_head(const float* h, int64_t m, float* logits) {
  std::lock_guard<std::mutex> lk(mu_);
  const int64_t H = config().hidden_size;
  quantize_rows(h, m, H, s_.act);
  const GemmJob job{&pm_->lm_head, s_.act.view(), logits, config().vocab_size};
  gemm_phase(std::span<const GemmJob>(&job, 1));
}

}  // namespace lilac::cpufast
