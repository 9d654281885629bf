#include "cuda/decode_step.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cuda/cuda_common.h"
#include "cuda/kernels/gemv/gemv.h"
#include "cuda/kernels/sampling/sampling.h"
#include "engine/backend.h"

namespace lilac::cuda {
namespace {

float* f32(DevAlloc& mem, int64_t n) { return static_cast<float*>(mem.get(size_t(std::max<int64_t>(n, 1)) * 4)); }

// A fused projection (one GEMV per part), with the conv epilogue on its first conv_rows output rows.
void proj(const ModelConfig& c, const DevProj& p, const float* x, Prologue pro, const float* norm_w, float* y,
          cudaStream_t s, int conv_rows = 0, const float* conv_w = nullptr, float* conv_state = nullptr) {
  for (const DevPart& part : p.parts) {
    GemvArgs a;
    a.W = part.m;
    a.x = x;
    a.y = y + part.offset;
    a.pro = pro;
    a.norm_w = norm_w;
    a.eps = float(c.rms_norm_eps);
    const int64_t cr = std::min<int64_t>(part.m.rows, conv_rows - part.offset);
    if (cr > 0) {
      a.conv_rows = int(cr);
      a.conv_k = c.linear_conv_kernel_dim;
      a.conv_w = conv_w + part.offset * c.linear_conv_kernel_dim;
      a.conv_state = conv_state + part.offset * (c.linear_conv_kernel_dim - 1);
    }
    gemv(a, s);
  }
}

void gemv_into(const ModelConfig& c, const QMatrixDev& W, const float* x, Prologue pro, const float* norm_w,
               const float* z, float* y, bool acc, cudaStream_t s) {
  GemvArgs a;
  a.W = W;
  a.x = x;
  a.y = y;
  a.accumulate = acc;
  a.pro = pro;
  a.norm_w = norm_w;
  a.z = z;
  a.head_dim = c.linear_value_head_dim;
  a.eps = float(c.rms_norm_eps);
  gemv(a, s);
}

// LILAC_GDN_GATE=0 keeps the gated output norm in out_proj's prologue (the same bits either way with the tensor-core
// GEMV; LILAC_GEMV=fp32's prologue sums a head's squares in another order).
bool gdn_gate_in_step() {
  static const bool on = [] {
    const char* e = std::getenv("LILAC_GDN_GATE");
    return !(e && std::string(e) == "0");
  }();
  return on;
}

}  // namespace

int decode_n_split(int64_t max_len) {
  return int(std::min<int64_t>(kAttnMaxSplit, std::max<int64_t>(1, (max_len + 31) / 32)));
}

DecodeScratch alloc_decode_scratch(DevAlloc& mem, const DevModel& m, int64_t max_len) {
  const ModelConfig& c = m.cfg;
  DecodeScratch sc;
  sc.attn.heads = c.num_heads;
  sc.attn.kv_heads = c.num_kv_heads;
  sc.attn.head_dim = c.head_dim;
  sc.attn.rotary_dim = c.rotary_dim;
  sc.attn.eps = float(c.rms_norm_eps);
  sc.gdn.Hk = c.linear_num_key_heads;
  sc.gdn.Hv = c.linear_num_value_heads;
  sc.gdn.dk = c.linear_key_head_dim;
  sc.gdn.dv = c.linear_value_head_dim;
  sc.n_split = decode_n_split(max_len);
  sc.h = f32(mem, c.hidden_size);
  sc.proj = f32(mem, m.max_in_rows);
  sc.gdn_o = f32(mem, c.gdn_value_dim());
  sc.q_rot = f32(mem, int64_t(c.num_heads) * c.head_dim);
  sc.attn_out = f32(mem, int64_t(c.num_heads) * c.head_dim);
  sc.partial = f32(mem, int64_t(attn_decode_partial_floats(sc.attn, sc.n_split)));
  sc.rlogits = f32(mem, c.num_experts + 1);
  sc.sel_ids = static_cast<int32_t*>(mem.get(64 * 4));
  sc.sel_w = f32(mem, 64);
  sc.act = f32(mem, int64_t(c.num_experts_per_tok) * c.moe_intermediate_size + c.shared_expert_intermediate_size);
  sc.sample_scratch = mem.get(sample_scratch_bytes(c.vocab_size));
  if (m.lm_tiles) sc.digits = mem.get(digits::stage_bytes(c.hidden_size, 1));
  return sc;
}

cudaGraphExec_t capture_graph(cudaStream_t s, const std::function<void()>& enqueue) {
  cudaGraph_t g = nullptr;
  LILAC_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  try {
    enqueue();
  } catch (...) {
    cudaStreamEndCapture(s, &g);
    if (g) cudaGraphDestroy(g);
    throw;
  }
  LILAC_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t e = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&e, g, 0);
  cudaGraphDestroy(g);
  LILAC_CUDA_CHECK(err);
  return e;
}

// ------------------------------------------------------------------------------------------------ profile
bool StepProfile::requested() {
  const char* e = std::getenv("LILAC_CUDA_PROFILE");
  return e && std::string(e) == "1";
}

void StepProfile::mark(const char* label, cudaStream_t s) {
  cudaEvent_t e;
  LILAC_CUDA_CHECK(cudaEventCreate(&e));
  LILAC_CUDA_CHECK(cudaEventRecord(e, s));
  marks_.push_back({label, e});
}

void StepProfile::collect() {
  for (size_t i = 1; i < marks_.size(); ++i) {
    float ms = 0;
    LILAC_CUDA_CHECK(cudaEventElapsedTime(&ms, marks_[i - 1].second, marks_[i].second));
    ms_[marks_[i].first] += ms;
  }
  for (auto& m : marks_) cudaEventDestroy(m.second);
  marks_.clear();
  ++steps_;
}

StepProfile::~StepProfile() {
  for (auto& m : marks_) cudaEventDestroy(m.second);
  if (steps_ == 0) return;
  double total = 0;
  for (auto& [k, v] : ms_) total += v;
  std::fprintf(stderr, "lilac cuda profile: %d eager decode steps, %.3f ms/step (GPU time between marks)\n", steps_,
               total / steps_);
  for (auto& [k, v] : ms_)
    std::fprintf(stderr, "  %-22s %9.1f us/step %6.1f %%\n", k.c_str(), v / steps_ * 1e3, 100 * v / total);
}

// ------------------------------------------------------------------------------------------------ the step
namespace {
void mark(StepProfile* prof, const char* label, cudaStream_t s) {
  if (prof) prof->mark(label, s);
}
}  // namespace

void enqueue_attn_kv(const DevModel& m, const DevLayer& L, __nv_bfloat16* k_cache, __nv_bfloat16* v_cache,
                     const int32_t* pos, const DecodeScratch& sc, cudaStream_t s, StepProfile* prof) {
  const ModelConfig& c = m.cfg;
  proj(c, L.in_proj, sc.h, Prologue::RmsNorm, L.input_norm, sc.proj, s);
  mark(prof, "attn.qkv_gemv", s);
  const float* k = sc.proj + c.q_proj_rows();
  const float* v = k + c.kv_dim();
  attn_qk_norm_rope_append(sc.attn, sc.proj, k, v, L.q_norm, L.k_norm, m.inv_freq, pos, sc.q_rot, k_cache, v_cache, s);
  mark(prof, "attn.qk_norm_rope", s);
}

void enqueue_attn_mixer(const DevModel& m, const DevLayer& L, __nv_bfloat16* k_cache, __nv_bfloat16* v_cache,
                        const int32_t* pos, const DecodeScratch& sc, cudaStream_t s, StepProfile* prof) {
  const ModelConfig& c = m.cfg;
  enqueue_attn_kv(m, L, k_cache, v_cache, pos, sc, s, prof);
  attention_decode(sc.attn, sc.q_rot, sc.proj, k_cache, v_cache, pos, sc.n_split, sc.partial, sc.attn_out, s);
  mark(prof, "attn.attention", s);
  gemv_into(c, L.out_proj, sc.attn_out, Prologue::None, nullptr, nullptr, sc.h, true, s);
  mark(prof, "attn.o_proj", s);
}

void enqueue_moe(const DevModel& m, const DevLayer& L, const DecodeScratch& sc, cudaStream_t s, StepProfile* prof) {
  const ModelConfig& c = m.cfg;
  proj(c, L.router, sc.h, Prologue::RmsNorm, L.post_norm, sc.rlogits, s);
  mark(prof, "moe.router", s);
  moe_gate_up(L.moe, sc.rlogits, sc.h, L.post_norm, float(c.rms_norm_eps), sc.sel_ids, sc.sel_w, sc.act, s);
  mark(prof, "moe.gate_up", s);
  moe_down(L.moe, sc.sel_ids, sc.sel_w, sc.act, sc.h, s);
  mark(prof, "moe.down", s);
}

void enqueue_decode_body(const DevModel& m, const SeqState& st, const DecodeScratch& sc, cudaStream_t s,
                         StepProfile* prof) {
  const ModelConfig& c = m.cfg;
  embed_gather(m.embed, st.token, sc.h, s);
  mark(prof, "embed", s);
  int ai = 0, gi = 0;
  for (const DevLayer& L : m.layers) {
    if (L.attn) {
      enqueue_attn_mixer(m, L, st.k_cache[ai], st.v_cache[ai], st.pos, sc, s, prof);
      ++ai;
    } else {
      const int64_t conv_dim = c.gdn_conv_dim();
      proj(c, L.in_proj, sc.h, Prologue::RmsNorm, L.input_norm, sc.proj, s, int(conv_dim), L.conv_w, st.conv(gi));
      mark(prof, "gdn.in_proj+conv", s);
      const float* z = sc.proj + conv_dim;
      const float* b = z + c.gdn_value_dim();
      const float* a = b + c.linear_num_value_heads;
      // the gated output norm in the step's clusters where it can run there, else in out_proj's prologue
      const GdnGate gate{z, L.gdn_norm, float(c.rms_norm_eps)};
      const bool gated = gdn_gate_in_step() && gdn_decode_gate_supported(sc.gdn, st.gdn(gi));
      gdn_decode_step(sc.gdn, sc.proj, b, a, L.A_log, L.dt_bias, st.gdn(gi), sc.gdn_o, s, gated ? &gate : nullptr);
      mark(prof, "gdn.step", s);
      if (gated)
        gemv_into(c, L.out_proj, sc.gdn_o, Prologue::None, nullptr, nullptr, sc.h, true, s);
      else
        gemv_into(c, L.out_proj, sc.gdn_o, Prologue::GatedHeadNorm, L.gdn_norm, z, sc.h, true, s);
      mark(prof, "gdn.out_proj", s);
      ++gi;
    }
    enqueue_moe(m, L, sc, s, prof);
  }
  increment_i32(st.pos, s);
}

void enqueue_lm_head(const DevModel& m, const float* x, int64_t ldx, int M, const int32_t* row_slot,
                     const float* norm_w, float* y, int64_t ldy, void* buf, cudaStream_t s, int64_t rows) {
  digits::StageArgs st;
  st.x = x;
  st.ldx = ldx;
  st.K = m.cfg.hidden_size;
  st.M = M;
  st.row_slot = row_slot;
  st.norm_w = norm_w;
  st.eps = float(m.cfg.rms_norm_eps);
  st.buf = buf;
  digits::stage_rmsnorm(st, s);
  digits::GemvArgs g;
  g.W = m.lm_tiles;
  g.W.rows = Session::draft_rows(rows, g.W.rows);
  g.buf = buf;
  g.M = M;
  g.row_slot = row_slot;
  g.y = y;
  g.ldy = ldy > 0 ? ldy : m.lm_tiles.rows;  // a row stride of the whole vocabulary whatever `rows` is
  digits::gemv(g, s);
}

void enqueue_head_row(const DevModel& m, const float* norm_w, float* logits, const DecodeScratch& sc, cudaStream_t s,
                      int64_t rows) {
  if (m.lm_tiles) {
    enqueue_lm_head(m, sc.h, 0, 1, nullptr, norm_w, logits, 0, sc.digits, s, rows);
  } else {
    QMatrixDev W = m.lm_head;
    W.rows = Session::draft_rows(rows, W.rows);
    gemv_into(m.cfg, W, sc.h, Prologue::RmsNorm, norm_w, nullptr, logits, false, s);
  }
}

void enqueue_decode_head(const DevModel& m, const SeqState& st, const DecodeScratch& sc, cudaStream_t s) {
  enqueue_head_row(m, m.final_norm, st.logits, sc, s);
}

void enqueue_sample(const SeqState& st, const DecodeScratch& sc, cudaStream_t s) {
  sample_token(st.logits, st.shape.vocab, st.params, st.counts, st.prompt_mask, sc.sample_scratch, st.token,
               st.result, s);
}

}  // namespace lilac::cuda
