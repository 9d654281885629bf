// The CUDA backend: weights uploaded once (projections that read the same input fused row-wise),
// the session's state on the device, a decode step captured once per session as a CUDA graph
// (embed → 40 layers → LM head → sampling, the position and the token read from device memory).
#include "cuda/cuda_backend.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda/cuda_common.h"
#include "cuda/kernels/attention/attention.h"
#include "cuda/kernels/gdn/gdn.h"
#include "cuda/kernels/gemv/gemv.h"
#include "cuda/kernels/sampling/sampling.h"
#include "cuda/prefill_glue.h"
#include "cpu/ops.h"

namespace lilac::cuda {

// ------------------------------------------------------------------------------------------------ memory
namespace {

struct DevAlloc {
  std::vector<void*> ptrs;
  size_t bytes = 0;
  void* get(size_t n) {
    void* p = nullptr;
    LILAC_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 16)));
    ptrs.push_back(p);
    bytes += n;
    return p;
  }
  template <typename T>
  T* upload(const T* host, size_t count) {
    T* d = static_cast<T*>(get(count * sizeof(T)));
    LILAC_CUDA_CHECK(cudaMemcpy(d, host, count * sizeof(T), cudaMemcpyHostToDevice));
    return d;
  }
  float* upload(const std::vector<float>& v) { return upload(v.data(), v.size()); }
  ~DevAlloc() {
    for (void* p : ptrs) cudaFree(p);
  }
};

// A projection: one or more quantized matrices whose outputs are written back to back.
struct Part {
  QMatrixDev m;
  int64_t offset = 0;
};
struct Proj {
  std::vector<Part> parts;
  int64_t rows = 0;
};

struct DevLayer {
  bool attn = false;
  float *input_norm = nullptr, *post_norm = nullptr;
  // attention
  Proj qkv;
  QMatrixDev o_proj;
  float *q_norm = nullptr, *k_norm = nullptr;
  // gated deltanet: in_proj = [qkv (conv) | z | b | a]
  Proj in_proj;
  QMatrixDev out_proj;
  float *conv_w = nullptr, *A_log = nullptr, *dt_bias = nullptr, *gdn_norm = nullptr;
  // moe: router = [router E | shared_expert_gate 1]
  Proj router;
  MoEDecodeWeights moe;
  MoEPrefillWeights moe_prefill;
};

struct DevModel {
  ModelConfig cfg;
  DevAlloc mem;
  QMatrixDev embed, lm_head;
  float* final_norm = nullptr;
  float* inv_freq = nullptr;
  std::vector<DevLayer> layers;
};

QMatrixDev upload_q(DevAlloc& mem, const QMatrix& q, const std::string& name) {
  LILAC_CHECK(q.quantized(), "cuda: " + name + " is not quantized (dense matrices are not supported on the GPU)");
  LILAC_CHECK(q.bits == 4 || q.bits == 8, "cuda: " + name + ": only 4- and 8-bit matrices are supported");
  QMatrixDev d;
  d.rows = q.rows;
  d.cols = q.cols;
  d.bits = q.bits;
  d.group_size = q.group_size;
  d.qweight = mem.upload(q.qweight, size_t(q.rows * q.words_per_row()));
  d.scales = reinterpret_cast<const __nv_bfloat16*>(mem.upload(q.scales, size_t(q.rows * q.groups_per_row())));
  d.biases = reinterpret_cast<const __nv_bfloat16*>(mem.upload(q.biases, size_t(q.rows * q.groups_per_row())));
  return d;
}

// Rows of several matrices in one allocation (fused where bits / group / cols agree).
Proj upload_fused(DevAlloc& mem, const std::vector<std::pair<const QMatrix*, std::string>>& mats) {
  Proj p;
  size_t i = 0;
  while (i < mats.size()) {
    size_t j = i + 1;
    const QMatrix& a = *mats[i].first;
    LILAC_CHECK(a.quantized(), "cuda: " + mats[i].second + " is not quantized (dense matrices are not supported)");
    while (j < mats.size() && mats[j].first->quantized() && mats[j].first->bits == a.bits &&
           mats[j].first->group_size == a.group_size && mats[j].first->cols == a.cols)
      ++j;
    int64_t rows = 0;
    for (size_t k = i; k < j; ++k) rows += mats[k].first->rows;
    QMatrixDev d;
    d.rows = rows;
    d.cols = a.cols;
    d.bits = a.bits;
    d.group_size = a.group_size;
    LILAC_CHECK(a.bits == 4 || a.bits == 8, "cuda: " + mats[i].second + ": only 4- and 8-bit supported");
    const int64_t wpr = a.words_per_row(), gpr = a.groups_per_row();
    auto* qw = static_cast<uint32_t*>(mem.get(size_t(rows * wpr) * 4));
    auto* sc = static_cast<uint16_t*>(mem.get(size_t(rows * gpr) * 2));
    auto* bi = static_cast<uint16_t*>(mem.get(size_t(rows * gpr) * 2));
    int64_t r0 = 0;
    for (size_t k = i; k < j; ++k) {
      const QMatrix& m = *mats[k].first;
      LILAC_CUDA_CHECK(cudaMemcpy(qw + r0 * wpr, m.qweight, size_t(m.rows * wpr) * 4, cudaMemcpyHostToDevice));
      LILAC_CUDA_CHECK(cudaMemcpy(sc + r0 * gpr, m.scales, size_t(m.rows * gpr) * 2, cudaMemcpyHostToDevice));
      LILAC_CUDA_CHECK(cudaMemcpy(bi + r0 * gpr, m.biases, size_t(m.rows * gpr) * 2, cudaMemcpyHostToDevice));
      r0 += m.rows;
    }
    d.qweight = qw;
    d.scales = reinterpret_cast<const __nv_bfloat16*>(sc);
    d.biases = reinterpret_cast<const __nv_bfloat16*>(bi);
    p.parts.push_back({d, p.rows});
    p.rows += rows;
    i = j;
  }
  return p;
}

QExpertsDev upload_experts(DevAlloc& mem, const QExperts& e, const std::string& name) {
  QExpertsDev d;
  d.n = e.n;
  QMatrix all = e.first;
  all.rows = e.first.rows * e.n;  // experts are contiguous
  d.first = upload_q(mem, all, name);
  d.first.rows = e.first.rows;
  return d;
}

void finish_moe(DevLayer& L, const ModelConfig& cfg) {
  L.moe.E = cfg.num_experts;
  L.moe.top_k = cfg.num_experts_per_tok;
  L.moe.renormalise = cfg.norm_topk_prob;
  MoEPrefillWeights& p = L.moe_prefill;
  p.gate = L.moe.gate;
  p.up = L.moe.up;
  p.down = L.moe.down;
  p.shared_gate = L.moe.shared_gate;
  p.shared_up = L.moe.shared_up;
  p.shared_down = L.moe.shared_down;
  p.top_k = cfg.num_experts_per_tok;
  p.renormalise = cfg.norm_topk_prob;
  // router view(s): the prefill path takes the router and shared_expert_gate as separate matrices
  const Part& r0 = L.router.parts[0];
  if (L.router.parts.size() == 1) {
    p.router = r0.m;
    p.router.rows = cfg.num_experts;
    p.shared_expert_gate = r0.m;
    p.shared_expert_gate.rows = 1;
    p.shared_expert_gate.qweight += cfg.num_experts * r0.m.words_per_row();
    p.shared_expert_gate.scales += cfg.num_experts * r0.m.groups_per_row();
    p.shared_expert_gate.biases += cfg.num_experts * r0.m.groups_per_row();
  } else {
    p.router = r0.m;
    p.shared_expert_gate = L.router.parts[1].m;
  }
}

void check_config(const ModelConfig& c) {
  LILAC_CHECK(c.attn_output_gate, "cuda: attn_output_gate false is not supported");
  LILAC_CHECK(c.linear_num_value_heads % c.linear_num_key_heads == 0, "cuda: bad linear head counts");
  LILAC_CHECK(c.hidden_size % 64 == 0, "cuda: hidden_size must be a multiple of 64");
}

std::unique_ptr<DevModel> upload_model(const ModelWeights& w) {
  auto m = std::make_unique<DevModel>();
  m->cfg = w.config;
  const ModelConfig& c = m->cfg;
  check_config(c);
  m->embed = upload_q(m->mem, w.embed, "embed_tokens");
  if (w.lm_head.qweight == w.embed.qweight)
    m->lm_head = m->embed;
  else
    m->lm_head = upload_q(m->mem, w.lm_head, "lm_head");
  m->final_norm = m->mem.upload(w.final_norm);
  m->inv_freq = m->mem.upload(cpu::rope_inv_freq(c.rotary_dim, c.rope_theta));
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& lw = w.layers[i];
    const std::string pre = "layers." + std::to_string(i) + ".";
    DevLayer L;
    L.attn = lw.full_attention;
    L.input_norm = m->mem.upload(lw.input_norm);
    L.post_norm = m->mem.upload(lw.post_norm);
    if (L.attn) {
      L.qkv = upload_fused(m->mem, {{&lw.attn.q_proj, pre + "q_proj"}, {&lw.attn.k_proj, pre + "k_proj"},
                                    {&lw.attn.v_proj, pre + "v_proj"}});
      L.o_proj = upload_q(m->mem, lw.attn.o_proj, pre + "o_proj");
      L.q_norm = m->mem.upload(lw.attn.q_norm);
      L.k_norm = m->mem.upload(lw.attn.k_norm);
    } else {
      L.in_proj = upload_fused(m->mem, {{&lw.gdn.in_proj_qkv, pre + "in_proj_qkv"},
                                        {&lw.gdn.in_proj_z, pre + "in_proj_z"},
                                        {&lw.gdn.in_proj_b, pre + "in_proj_b"},
                                        {&lw.gdn.in_proj_a, pre + "in_proj_a"}});
      L.out_proj = upload_q(m->mem, lw.gdn.out_proj, pre + "out_proj");
      L.conv_w = m->mem.upload(lw.gdn.conv1d);
      L.A_log = m->mem.upload(lw.gdn.A_log);
      L.dt_bias = m->mem.upload(lw.gdn.dt_bias);
      L.gdn_norm = m->mem.upload(lw.gdn.norm);
    }
    L.router = upload_fused(m->mem, {{&lw.moe.router, pre + "mlp.gate"},
                                     {&lw.moe.shared_expert_gate, pre + "mlp.shared_expert_gate"}});
    L.moe.gate = upload_experts(m->mem, lw.moe.gate, pre + "switch_mlp.gate_proj");
    L.moe.up = upload_experts(m->mem, lw.moe.up, pre + "switch_mlp.up_proj");
    L.moe.down = upload_experts(m->mem, lw.moe.down, pre + "switch_mlp.down_proj");
    L.moe.shared_gate = upload_q(m->mem, lw.moe.shared_gate, pre + "shared_expert.gate_proj");
    L.moe.shared_up = upload_q(m->mem, lw.moe.shared_up, pre + "shared_expert.up_proj");
    L.moe.shared_down = upload_q(m->mem, lw.moe.shared_down, pre + "shared_expert.down_proj");
    finish_moe(L, c);
    m->layers.push_back(std::move(L));
  }
  return m;
}

// ------------------------------------------------------------------------------------------------ synthetic
__device__ __forceinline__ uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
__global__ void fill_words_kernel(uint32_t* p, int64_t n, uint64_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = uint32_t(mix64(seed ^ uint64_t(i) * 0xD1B54A32D192ED03ull));
}
// scales ~ base·(0.75 + 0.5u), biases = −center·scale (+ small noise): values ~ zero-mean, std ≈ base·sd(q)
__global__ void fill_sb_kernel(__nv_bfloat16* s, __nv_bfloat16* b, int64_t n, float base, float center,
                               uint64_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t r = mix64(seed ^ uint64_t(i) * 0x9E3779B97F4A7C15ull);
    const float u1 = float(r & 0xffffff) / 16777216.f, u2 = float((r >> 24) & 0xffffff) / 16777216.f;
    const float sc = base * (0.75f + 0.5f * u1);
    s[i] = __float2bfloat16(sc);
    b[i] = __float2bfloat16(-center * sc + (u2 - 0.5f) * sc);
  }
}
__global__ void fill_uniform_kernel(float* p, int64_t n, float lo, float hi, uint64_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t r = mix64(seed ^ uint64_t(i) * 0x9E3779B97F4A7C15ull);
    p[i] = lo + (hi - lo) * float(r & 0xffffff) / 16777216.f;
  }
}

struct SynthGen {
  DevAlloc& mem;
  uint64_t seed;
  uint64_t next() { return seed = seed * 6364136223846793005ull + 1442695040888963407ull; }
  QMatrixDev q(int64_t rows, int64_t cols, int bits) {
    QMatrixDev d;
    d.rows = rows;
    d.cols = cols;
    d.bits = bits;
    d.group_size = 64;
    const int64_t nw = rows * d.words_per_row(), ng = rows * d.groups_per_row();
    auto* qw = static_cast<uint32_t*>(mem.get(size_t(nw) * 4));
    auto* sc = static_cast<__nv_bfloat16*>(mem.get(size_t(ng) * 2));
    auto* bi = static_cast<__nv_bfloat16*>(mem.get(size_t(ng) * 2));
    fill_words_kernel<<<1024, 256>>>(qw, nw, next());
    const float levels = float((1 << bits) - 1);
    const float sd_q = levels / std::sqrt(12.f);  // std of a uniform integer in [0, levels]
    fill_sb_kernel<<<1024, 256>>>(sc, bi, ng, 1.f / (std::sqrt(float(cols)) * sd_q), levels / 2, next());
    LILAC_CUDA_LAUNCH_CHECK();
    d.qweight = qw;
    d.scales = sc;
    d.biases = bi;
    return d;
  }
  float* vec(int64_t n, float lo, float hi) {
    auto* p = static_cast<float*>(mem.get(size_t(n) * 4));
    fill_uniform_kernel<<<256, 256>>>(p, n, lo, hi, next());
    LILAC_CUDA_LAUNCH_CHECK();
    return p;
  }
};

std::unique_ptr<DevModel> synthetic_model(const ModelConfig& c, uint64_t seed) {
  auto m = std::make_unique<DevModel>();
  m->cfg = c;
  check_config(c);
  SynthGen g{m->mem, seed};
  const int64_t H = c.hidden_size;
  m->embed = g.q(c.vocab_size, H, 4);
  m->lm_head = g.q(c.vocab_size, H, 4);
  m->final_norm = g.vec(H, 0.9f, 1.1f);
  m->inv_freq = m->mem.upload(cpu::rope_inv_freq(c.rotary_dim, c.rope_theta));
  for (int i = 0; i < c.num_layers; ++i) {
    DevLayer L;
    L.attn = c.full_attention[i];
    L.input_norm = g.vec(H, 0.9f, 1.1f);
    L.post_norm = g.vec(H, 0.9f, 1.1f);
    if (L.attn) {
      const int64_t rows = c.q_proj_rows() + 2 * c.kv_dim();
      L.qkv.parts.push_back({g.q(rows, H, 4), 0});
      L.qkv.rows = rows;
      L.o_proj = g.q(H, int64_t(c.num_heads) * c.head_dim, 4);
      L.q_norm = g.vec(c.head_dim, 0.9f, 1.1f);
      L.k_norm = g.vec(c.head_dim, 0.9f, 1.1f);
    } else {
      const int64_t rows = c.gdn_conv_dim() + c.gdn_value_dim() + 2 * c.linear_num_value_heads;
      L.in_proj.parts.push_back({g.q(rows, H, 4), 0});
      L.in_proj.rows = rows;
      L.out_proj = g.q(H, c.gdn_value_dim(), 4);
      L.conv_w = g.vec(c.gdn_conv_dim() * c.linear_conv_kernel_dim, -0.5f, 0.5f);
      L.A_log = g.vec(c.linear_num_value_heads, -1.f, 1.f);
      L.dt_bias = g.vec(c.linear_num_value_heads, -0.5f, 0.5f);
      L.gdn_norm = g.vec(c.linear_value_head_dim, 0.9f, 1.1f);
    }
    L.router.parts.push_back({g.q(c.num_experts + 1, H, 8), 0});
    L.router.rows = c.num_experts + 1;
    auto experts = [&](int64_t rows, int64_t cols) {
      QExpertsDev e;
      e.n = c.num_experts;
      e.first = g.q(rows * c.num_experts, cols, 4);
      e.first.rows = rows;
      return e;
    };
    L.moe.gate = experts(c.moe_intermediate_size, H);
    L.moe.up = experts(c.moe_intermediate_size, H);
    L.moe.down = experts(H, c.moe_intermediate_size);
    L.moe.shared_gate = g.q(c.shared_expert_intermediate_size, H, 4);
    L.moe.shared_up = g.q(c.shared_expert_intermediate_size, H, 4);
    L.moe.shared_down = g.q(H, c.shared_expert_intermediate_size, 4);
    finish_moe(L, c);
    m->layers.push_back(std::move(L));
  }
  LILAC_CUDA_CHECK(cudaDeviceSynchronize());
  return m;
}

// ------------------------------------------------------------------------------------------------ session
class CudaBackendImpl;

struct CudaSnapshot : SessionSnapshot {
  const void* owner = nullptr;
  int64_t len = 0;
  size_t nbytes = 0;
  DevAlloc mem;
  std::vector<void*> kv;  // per attention layer: K rows then V rows [0, len)
  void* gdn = nullptr;    // all GDN states
  void* conv = nullptr;   // all conv states
  void* logits = nullptr;
  int64_t length() const override { return len; }
  size_t bytes() const override { return nbytes; }
};

class CudaSession : public Session {
 public:
  CudaSession(const DevModel& m, int64_t max_len) : m_(m), cfg_(m.cfg), max_len_(max_len) {
    LILAC_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    const ModelConfig& c = cfg_;
    const int64_t H = c.hidden_size;
    shape_.heads = c.num_heads;
    shape_.kv_heads = c.num_kv_heads;
    shape_.head_dim = c.head_dim;
    shape_.rotary_dim = c.rotary_dim;
    shape_.eps = float(c.rms_norm_eps);
    gshape_.Hk = c.linear_num_key_heads;
    gshape_.Hv = c.linear_num_value_heads;
    gshape_.dk = c.linear_key_head_dim;
    gshape_.dv = c.linear_value_head_dim;
    n_split_ = int(std::min<int64_t>(kAttnMaxSplit, std::max<int64_t>(1, (max_len + 31) / 32)));
    h_ = f32(H);
    logits_ = f32(c.vocab_size);
    int64_t proj = 0;
    for (const DevLayer& L : m_.layers) proj = std::max(proj, L.attn ? L.qkv.rows : L.in_proj.rows);
    proj_ = f32(proj);
    gdn_o_ = f32(c.gdn_value_dim());
    q_rot_ = f32(int64_t(c.num_heads) * c.head_dim);
    attn_out_ = f32(int64_t(c.num_heads) * c.head_dim);
    partial_ = f32(int64_t(attn_decode_partial_floats(shape_, n_split_)));
    rlogits_ = f32(c.num_experts + 1);
    sel_ids_ = static_cast<int32_t*>(mem_.get(64 * 4));
    sel_w_ = f32(64);
    act_ = f32(int64_t(c.num_experts_per_tok) * c.moe_intermediate_size + c.shared_expert_intermediate_size);
    const int64_t kvrow = c.kv_dim();
    for (const DevLayer& L : m_.layers) {
      if (L.attn) {
        k_cache_.push_back(static_cast<__nv_bfloat16*>(mem_.get(size_t(max_len) * kvrow * 2)));
        v_cache_.push_back(static_cast<__nv_bfloat16*>(mem_.get(size_t(max_len) * kvrow * 2)));
      } else {
        n_gdn_++;
      }
    }
    gdn_state_elems_ = int64_t(gshape_.Hv) * gshape_.dk * gshape_.dv;
    conv_elems_ = c.gdn_conv_dim() * (c.linear_conv_kernel_dim - 1);
    gdn_state_ = f32(std::max<int64_t>(1, n_gdn_ * gdn_state_elems_));
    conv_state_ = f32(std::max<int64_t>(1, n_gdn_ * conv_elems_));
    token_ = static_cast<int32_t*>(mem_.get(4));
    pos_ = static_cast<int32_t*>(mem_.get(4));
    params_ = static_cast<SampleParamsDev*>(mem_.get(sizeof(SampleParamsDev)));
    counts_ = static_cast<int32_t*>(mem_.get(size_t(c.vocab_size) * 4));
    mask_ = static_cast<uint8_t*>(mem_.get(size_t(c.vocab_size)));
    scratch_ = mem_.get(sample_scratch_bytes(c.vocab_size));
    result_ = static_cast<SampleResult*>(mem_.get(sizeof(SampleResult)));
    prompt_ = static_cast<int32_t*>(mem_.get(size_t(prompt_chunk()) * 4));
    LILAC_CUDA_CHECK(cudaMallocHost(&host_result_, sizeof(SampleResult)));
    LILAC_CUDA_CHECK(cudaMemset(logits_, 0, size_t(c.vocab_size) * 4));
    SamplingParams greedy;
    begin_generation(greedy, {});
    reset();
  }
  ~CudaSession() override {
    if (prof_steps_ > 0) {
      double total = 0;
      for (auto& [k, v] : prof_ms_) total += v;
      std::fprintf(stderr, "lilac cuda profile: %d eager decode steps, %.3f ms/step (GPU time between marks)\n",
                   prof_steps_, total / prof_steps_);
      for (auto& [k, v] : prof_ms_)
        std::fprintf(stderr, "  %-22s %9.1f us/step %6.1f %%\n", k.c_str(), v / prof_steps_ * 1e3, 100 * v / total);
    }
    if (g_body_) cudaGraphExecDestroy(g_body_);
    if (g_head_) cudaGraphExecDestroy(g_head_);
    if (g_step_) cudaGraphExecDestroy(g_step_);
    if (host_result_) cudaFreeHost(host_result_);
    cudaStreamDestroy(stream_);
  }

  int64_t length() const override { return len_; }
  int64_t max_length() const override { return max_len_; }

  void prefill(std::span<const int32_t> tokens, const LogitsSink* sink) override {
    if (tokens.empty()) return;
    for (int32_t t : tokens)
      if (t < 0 || t >= cfg_.vocab_size)
        throw InputError("token id " + std::to_string(t) + " is outside the vocabulary (size " +
                         std::to_string(cfg_.vocab_size) + ")");
    if (len_ + int64_t(tokens.size()) > max_len_)
      throw InputError("context too long: " + std::to_string(len_ + int64_t(tokens.size())) + " tokens, max " +
                       std::to_string(max_len_));
    std::vector<float> rows;
    const int64_t V = cfg_.vocab_size;
    size_t i = 0;
    while (i < tokens.size()) {
      const size_t n = std::min<size_t>(prompt_chunk(), tokens.size() - i);
      LILAC_CUDA_CHECK(
          cudaMemcpyAsync(prompt_, tokens.data() + i, n * 4, cudaMemcpyHostToDevice, stream_));
      const bool batched = !sink && n >= 2 && prefill_batched_ok();
      if (batched) {
        prefill_chunk_batched(int(n), i + n == tokens.size());
        len_ += int64_t(n);
      } else {
        if (sink) rows.resize(n * size_t(V));
        for (size_t j = 0; j < n; ++j) {
          LILAC_CUDA_CHECK(
              cudaMemcpyAsync(token_, prompt_ + j, 4, cudaMemcpyDeviceToDevice, stream_));
          launch(body());
          ++len_;
          if (sink || i + j + 1 == tokens.size()) launch(head());
          if (sink)
            LILAC_CUDA_CHECK(cudaMemcpyAsync(rows.data() + j * V, logits_, size_t(V) * 4,
                                             cudaMemcpyDeviceToHost, stream_));
        }
        if (sink) {
          sync();
          (*sink)(len_ - int64_t(n), int64_t(n), rows.data());
        }
      }
      i += n;
    }
    sync();
  }

  void begin_generation(const SamplingParams& p, std::span<const int32_t> context) override {
    SampleParamsDev d{};
    d.temperature = p.temperature;
    d.top_p = p.top_p;
    d.min_p = p.min_p;
    d.presence = p.presence_penalty;
    d.frequency = p.frequency_penalty;
    d.repetition = p.repetition_penalty;
    d.top_k = p.top_k;
    d.logprobs = p.logprobs ? 1 : 0;
    d.top_logprobs = std::clamp(p.top_logprobs, 0, kMaxTopLogprobs);
    d.seed = p.seed;
    d.step = 0;
    want_logprobs_ = p.logprobs;
    LILAC_CUDA_CHECK(cudaMemcpyAsync(params_, &d, sizeof d, cudaMemcpyHostToDevice, stream_));
    LILAC_CUDA_CHECK(cudaMemsetAsync(counts_, 0, size_t(cfg_.vocab_size) * 4, stream_));
    std::vector<uint8_t> mask(size_t(cfg_.vocab_size), 0);
    for (int32_t t : context)
      if (t >= 0 && t < cfg_.vocab_size) mask[size_t(t)] = 1;
    LILAC_CUDA_CHECK(cudaMemcpyAsync(mask_, mask.data(), mask.size(), cudaMemcpyHostToDevice, stream_));
    sync();
  }

  TokenChoice sample() override {
    sample_token(logits_, cfg_.vocab_size, params_, counts_, mask_, scratch_, token_, result_, stream_);
    return fetch_result();
  }

  void advance() override {
    check_room();
    launch(body());
    launch(head());
    ++len_;
    sync();
  }

  TokenChoice decode_step() override {
    check_room();
    if (prof_) {  // LILAC_CUDA_PROFILE=1: eager launches with events between the kernel groups
      prof_active_ = true;
      mark("start");
      enqueue_body();
      enqueue_head();
      mark("lm_head");
      sample_token(logits_, cfg_.vocab_size, params_, counts_, mask_, scratch_, token_, result_, stream_);
      mark("sample");
      prof_active_ = false;
      sync();
      for (size_t i = 1; i < marks_.size(); ++i) {
        float ms = 0;
        LILAC_CUDA_CHECK(cudaEventElapsedTime(&ms, marks_[i - 1].second, marks_[i].second));
        prof_ms_[marks_[i].first] += ms;
      }
      for (auto& m : marks_) cudaEventDestroy(m.second);
      marks_.clear();
      ++prof_steps_;
      ++len_;
      return fetch_result();
    }
    launch(step());
    ++len_;
    return fetch_result();
  }

  std::vector<float> logits() override {
    std::vector<float> v(size_t(cfg_.vocab_size));
    LILAC_CUDA_CHECK(cudaMemcpyAsync(v.data(), logits_, v.size() * 4, cudaMemcpyDeviceToHost, stream_));
    sync();
    return v;
  }

  std::shared_ptr<const SessionSnapshot> snapshot() override {
    auto s = std::make_shared<CudaSnapshot>();
    s->owner = &m_;
    s->len = len_;
    const size_t kvb = size_t(len_) * cfg_.kv_dim() * 2;
    for (size_t i = 0; i < k_cache_.size(); ++i) {
      void* p = s->mem.get(2 * kvb);
      if (kvb) {
        LILAC_CUDA_CHECK(cudaMemcpyAsync(p, k_cache_[i], kvb, cudaMemcpyDeviceToDevice, stream_));
        LILAC_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(p) + kvb, v_cache_[i], kvb, cudaMemcpyDeviceToDevice,
                                         stream_));
      }
      s->kv.push_back(p);
    }
    const size_t gb = size_t(std::max<int64_t>(1, n_gdn_ * gdn_state_elems_)) * 4;
    const size_t cb = size_t(std::max<int64_t>(1, n_gdn_ * conv_elems_)) * 4;
    s->gdn = s->mem.get(gb);
    s->conv = s->mem.get(cb);
    s->logits = s->mem.get(size_t(cfg_.vocab_size) * 4);
    LILAC_CUDA_CHECK(cudaMemcpyAsync(s->gdn, gdn_state_, gb, cudaMemcpyDeviceToDevice, stream_));
    LILAC_CUDA_CHECK(cudaMemcpyAsync(s->conv, conv_state_, cb, cudaMemcpyDeviceToDevice, stream_));
    LILAC_CUDA_CHECK(
        cudaMemcpyAsync(s->logits, logits_, size_t(cfg_.vocab_size) * 4, cudaMemcpyDeviceToDevice, stream_));
    sync();
    s->nbytes = s->mem.bytes;
    return s;
  }

  void restore(const SessionSnapshot& snap) override {
    const auto* s = dynamic_cast<const CudaSnapshot*>(&snap);
    if (!s || s->owner != &m_) throw Error("cuda: snapshot from another backend or model");
    if (s->len > max_len_) throw Error("cuda: snapshot longer than this session's capacity");
    const size_t kvb = size_t(s->len) * cfg_.kv_dim() * 2;
    for (size_t i = 0; i < k_cache_.size() && kvb; ++i) {
      LILAC_CUDA_CHECK(cudaMemcpyAsync(k_cache_[i], s->kv[i], kvb, cudaMemcpyDeviceToDevice, stream_));
      LILAC_CUDA_CHECK(cudaMemcpyAsync(v_cache_[i], static_cast<const char*>(s->kv[i]) + kvb, kvb,
                                       cudaMemcpyDeviceToDevice, stream_));
    }
    const size_t gb = size_t(std::max<int64_t>(1, n_gdn_ * gdn_state_elems_)) * 4;
    const size_t cb = size_t(std::max<int64_t>(1, n_gdn_ * conv_elems_)) * 4;
    LILAC_CUDA_CHECK(cudaMemcpyAsync(gdn_state_, s->gdn, gb, cudaMemcpyDeviceToDevice, stream_));
    LILAC_CUDA_CHECK(cudaMemcpyAsync(conv_state_, s->conv, cb, cudaMemcpyDeviceToDevice, stream_));
    LILAC_CUDA_CHECK(
        cudaMemcpyAsync(logits_, s->logits, size_t(cfg_.vocab_size) * 4, cudaMemcpyDeviceToDevice, stream_));
    len_ = s->len;
    set_pos();
    sync();
  }

  void reset() override {
    len_ = 0;
    LILAC_CUDA_CHECK(cudaMemsetAsync(gdn_state_, 0, size_t(std::max<int64_t>(1, n_gdn_ * gdn_state_elems_)) * 4,
                                     stream_));
    LILAC_CUDA_CHECK(
        cudaMemsetAsync(conv_state_, 0, size_t(std::max<int64_t>(1, n_gdn_ * conv_elems_)) * 4, stream_));
    set_pos();
    sync();
  }

 private:
  // Tokens per batched prefill chunk: bounds the prefill scratch memory (~0.5 GB at 4096 on the real model);
  // larger chunks give the GEMMs and the grouped expert GEMMs more rows per weight tile (4096 vs 512:
  // 34.8K vs 11.9K tok/s at a 4096-token prompt, bench/BENCHMARKS.md). LILAC_PREFILL_CHUNK overrides (16..16384).
  static int prompt_chunk() {
    static const int n = [] {
      const char* e = std::getenv("LILAC_PREFILL_CHUNK");
      const int v = e ? std::atoi(e) : 4096;
      return std::clamp(v, 16, 16384);
    }();
    return n;
  }

  float* f32(int64_t n) { return static_cast<float*>(mem_.get(size_t(std::max<int64_t>(n, 1)) * 4)); }
  void sync() { LILAC_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  void set_pos() {
    const int32_t p = int32_t(len_);
    LILAC_CUDA_CHECK(cudaMemcpyAsync(pos_, &p, 4, cudaMemcpyHostToDevice, stream_));
    sync();
  }
  void check_room() {
    if (len_ + 1 > max_len_) throw InputError("context full: " + std::to_string(max_len_) + " tokens");
  }
  void mark(const char* label) {
    if (!prof_active_) return;
    cudaEvent_t e;
    LILAC_CUDA_CHECK(cudaEventCreate(&e));
    LILAC_CUDA_CHECK(cudaEventRecord(e, stream_));
    marks_.push_back({label, e});
  }
  void launch(cudaGraphExec_t g) { LILAC_CUDA_CHECK(cudaGraphLaunch(g, stream_)); }

  TokenChoice fetch_result() {
    LILAC_CUDA_CHECK(cudaMemcpyAsync(host_result_, result_, sizeof(SampleResult), cudaMemcpyDeviceToHost, stream_));
    sync();
    TokenChoice t;
    t.token = host_result_->token;
    t.logprob = host_result_->logprob;
    if (want_logprobs_)
      for (int i = 0; i < host_result_->n_top; ++i)
        t.top.push_back({host_result_->top_ids[i], host_result_->top_lp[i]});
    return t;
  }

  template <typename F>
  cudaGraphExec_t capture(F&& f) {
    cudaGraph_t g = nullptr;
    LILAC_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
    try {
      f();
    } catch (...) {
      cudaStreamEndCapture(stream_, &g);
      if (g) cudaGraphDestroy(g);
      throw;
    }
    LILAC_CUDA_CHECK(cudaStreamEndCapture(stream_, &g));
    cudaGraphExec_t e = nullptr;
    LILAC_CUDA_CHECK(cudaGraphInstantiate(&e, g, 0));
    cudaGraphDestroy(g);
    return e;
  }
  cudaGraphExec_t body() {
    if (!g_body_) g_body_ = capture([&] { enqueue_body(); });
    return g_body_;
  }
  cudaGraphExec_t head() {
    if (!g_head_) g_head_ = capture([&] { enqueue_head(); });
    return g_head_;
  }
  cudaGraphExec_t step() {
    if (!g_step_)
      g_step_ = capture([&] {
        enqueue_body();
        enqueue_head();
        sample_token(logits_, cfg_.vocab_size, params_, counts_, mask_, scratch_, token_, result_, stream_);
      });
    return g_step_;
  }

  void proj(const Proj& p, const float* x, Prologue pro, const float* norm_w, float* y, int conv_rows = 0,
            const float* conv_w = nullptr, float* conv_state = nullptr) {
    for (const Part& part : p.parts) {
      GemvArgs a;
      a.W = part.m;
      a.x = x;
      a.y = y + part.offset;
      a.pro = pro;
      a.norm_w = norm_w;
      a.eps = float(cfg_.rms_norm_eps);
      const int64_t cr = std::min<int64_t>(part.m.rows, conv_rows - part.offset);
      if (cr > 0) {
        a.conv_rows = int(cr);
        a.conv_k = cfg_.linear_conv_kernel_dim;
        a.conv_w = conv_w + part.offset * cfg_.linear_conv_kernel_dim;
        a.conv_state = conv_state + part.offset * (cfg_.linear_conv_kernel_dim - 1);
      }
      gemv(a, stream_);
    }
  }
  void gemv_into(const QMatrixDev& W, const float* x, Prologue pro, const float* norm_w, const float* z, float* y,
                 bool acc) {
    GemvArgs a;
    a.W = W;
    a.x = x;
    a.y = y;
    a.accumulate = acc;
    a.pro = pro;
    a.norm_w = norm_w;
    a.z = z;
    a.head_dim = cfg_.linear_value_head_dim;
    a.eps = float(cfg_.rms_norm_eps);
    gemv(a, stream_);
  }

  void enqueue_body() {
    const ModelConfig& c = cfg_;
    embed_gather(m_.embed, token_, h_, stream_);
    mark("embed");
    int ai = 0, gi = 0;
    for (const DevLayer& L : m_.layers) {
      if (L.attn) {
        proj(L.qkv, h_, Prologue::RmsNorm, L.input_norm, proj_);
        mark("attn.qkv_gemv");
        const float* k = proj_ + c.q_proj_rows();
        const float* v = k + c.kv_dim();
        attn_qk_norm_rope_append(shape_, proj_, k, v, L.q_norm, L.k_norm, m_.inv_freq, pos_, q_rot_, k_cache_[ai],
                                 v_cache_[ai], stream_);
        mark("attn.qk_norm_rope");
        attention_decode(shape_, q_rot_, proj_, k_cache_[ai], v_cache_[ai], pos_, n_split_, partial_, attn_out_,
                         stream_);
        mark("attn.attention");
        gemv_into(L.o_proj, attn_out_, Prologue::None, nullptr, nullptr, h_, true);
        mark("attn.o_proj");
        ++ai;
      } else {
        const int64_t conv_dim = c.gdn_conv_dim();
        float* conv_state = conv_state_ + gi * conv_elems_;
        proj(L.in_proj, h_, Prologue::RmsNorm, L.input_norm, proj_, int(conv_dim), L.conv_w, conv_state);
        mark("gdn.in_proj+conv");
        const float* z = proj_ + conv_dim;
        const float* b = z + c.gdn_value_dim();
        const float* a = b + c.linear_num_value_heads;
        gdn_decode_step(gshape_, proj_, b, a, L.A_log, L.dt_bias, gdn_state_ + gi * gdn_state_elems_, gdn_o_,
                        stream_);
        mark("gdn.step");
        gemv_into(L.out_proj, gdn_o_, Prologue::GatedHeadNorm, L.gdn_norm, z, h_, true);
        mark("gdn.out_proj");
        ++gi;
      }
      proj(L.router, h_, Prologue::RmsNorm, L.post_norm, rlogits_);
      mark("moe.router");
      moe_gate_up(L.moe, rlogits_, h_, L.post_norm, float(c.rms_norm_eps), sel_ids_, sel_w_, act_, stream_);
      mark("moe.gate_up");
      moe_down(L.moe, sel_ids_, sel_w_, act_, h_, stream_);
      mark("moe.down");
    }
    increment_i32(pos_, stream_);
  }
  void enqueue_head() { gemv_into(m_.lm_head, h_, Prologue::RmsNorm, m_.final_norm, nullptr, logits_, false); }

  // ---------------------------------------------------------------- batched prefill (prefill kernels)
  bool prefill_batched_ok();
  void prefill_chunk_batched(int n, bool last);

  const DevModel& m_;
  const ModelConfig& cfg_;
  int64_t max_len_;
  int64_t len_ = 0;
  cudaStream_t stream_ = nullptr;
  DevAlloc mem_;
  AttnDecodeShape shape_;
  GdnShape gshape_;
  int n_split_ = 1;
  float *h_, *logits_, *proj_, *gdn_o_, *q_rot_, *attn_out_, *partial_, *rlogits_, *sel_w_, *act_;
  int32_t* sel_ids_;
  std::vector<__nv_bfloat16*> k_cache_, v_cache_;
  int64_t n_gdn_ = 0, gdn_state_elems_ = 0, conv_elems_ = 0;
  float *gdn_state_, *conv_state_;
  int32_t *token_, *pos_, *prompt_;
  SampleParamsDev* params_;
  int32_t* counts_;
  uint8_t* mask_;
  void* scratch_;
  SampleResult* result_;
  SampleResult* host_result_ = nullptr;
  bool want_logprobs_ = false;
  bool prof_ = [] {
    const char* e = std::getenv("LILAC_CUDA_PROFILE");
    return e && std::string(e) == "1";
  }();
  bool prof_active_ = false;
  int prof_steps_ = 0;
  std::vector<std::pair<std::string, cudaEvent_t>> marks_;
  std::map<std::string, double> prof_ms_;
  cudaGraphExec_t g_body_ = nullptr, g_head_ = nullptr, g_step_ = nullptr;
  PrefillWorkspace pw_;
};

bool CudaSession::prefill_batched_ok() {
  // The prefill kernels' limits: GDN dk == dv == 128, attention head_dim 64 / 128 / 256.
  const ModelConfig& c = cfg_;
  const bool gdn_ok = n_gdn_ == 0 || (c.linear_key_head_dim == 128 && c.linear_value_head_dim == 128);
  const bool attn_ok = k_cache_.empty() || c.head_dim == 64 || c.head_dim == 128 || c.head_dim == 256;
  return prefill_glue_available() && gdn_ok && attn_ok && c.hidden_size % 64 == 0;
}

void CudaSession::prefill_chunk_batched(int n, bool last) {
  PrefillCtx ctx;
  ctx.cfg = &cfg_;
  ctx.stream = stream_;
  ctx.n = n;
  ctx.start_pos = len_;
  ctx.tokens = prompt_;
  ctx.embed = m_.embed;
  ctx.inv_freq = m_.inv_freq;
  ctx.h_last = h_;
  int ai = 0, gi = 0;
  int64_t max_in = 0;
  for (const DevLayer& L : m_.layers) max_in = std::max(max_in, L.attn ? L.qkv.rows : L.in_proj.rows);
  prefill_begin(pw_, ctx, prompt_chunk(), max_in, m_.layers[0].moe_prefill);
  for (const DevLayer& L : m_.layers) {
    PrefillLayer pl;
    pl.attn = L.attn;
    pl.input_norm = L.input_norm;
    pl.post_norm = L.post_norm;
    for (const Part& p : (L.attn ? L.qkv : L.in_proj).parts) pl.in_parts.push_back(PrefillPart{p.m, p.offset});
    pl.in_rows = L.attn ? L.qkv.rows : L.in_proj.rows;
    pl.out_proj = L.attn ? L.o_proj : L.out_proj;
    pl.q_norm = L.q_norm;
    pl.k_norm = L.k_norm;
    pl.conv_w = L.conv_w;
    pl.A_log = L.A_log;
    pl.dt_bias = L.dt_bias;
    pl.gdn_norm = L.gdn_norm;
    pl.moe = &L.moe_prefill;
    if (L.attn) {
      pl.k_cache = k_cache_[ai];
      pl.v_cache = v_cache_[ai];
      ++ai;
    } else {
      pl.gdn_state = gdn_state_ + gi * gdn_state_elems_;
      pl.conv_state = conv_state_ + gi * conv_elems_;
      ++gi;
    }
    prefill_layer(pw_, ctx, pl);
  }
  prefill_finish(pw_, ctx);  // last row of the residual stream → h_
  const int32_t p = int32_t(len_ + n);
  LILAC_CUDA_CHECK(cudaMemcpyAsync(pos_, &p, 4, cudaMemcpyHostToDevice, stream_));
  if (last) launch(head());
  sync();
}

// ------------------------------------------------------------------------------------------------ backend
class CudaBackendImpl : public Backend {
 public:
  explicit CudaBackendImpl(std::unique_ptr<DevModel> m, std::shared_ptr<const ModelWeights> keep = nullptr)
      : m_(std::move(m)), keep_(std::move(keep)) {
    cudaDeviceProp p{};
    LILAC_CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
    desc_ = std::string(p.name) + ", " + std::to_string(p.multiProcessorCount) + " SMs, " +
            std::to_string(p.totalGlobalMem >> 20) + " MiB";
  }
  std::string name() const override { return "cuda"; }
  const ModelConfig& config() const override { return m_->cfg; }
  std::unique_ptr<Session> new_session(int64_t max_length) override {
    if (max_length <= 0) max_length = m_->cfg.max_position_embeddings > 0 ? m_->cfg.max_position_embeddings : 4096;
    return std::make_unique<CudaSession>(*m_, max_length);
  }
  std::string describe() const override { return desc_; }
  size_t weight_bytes() const { return m_->mem.bytes; }

 private:
  std::unique_ptr<DevModel> m_;
  std::shared_ptr<const ModelWeights> keep_;
  std::string desc_;
};

}  // namespace

bool gpu_available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

std::unique_ptr<Backend> make_cuda_backend(std::shared_ptr<const ModelWeights> weights) {
  LILAC_CHECK(weights, "cuda: no weights");
  LILAC_CHECK(gpu_available(), "cuda: no CUDA GPU is available");
  auto m = upload_model(*weights);
  return std::make_unique<CudaBackendImpl>(std::move(m));  // weights are on the device: drop the host copy
}

std::unique_ptr<Backend> make_synthetic_cuda_backend(const ModelConfig& cfg, uint64_t seed) {
  LILAC_CHECK(gpu_available(), "cuda: no CUDA GPU is available");
  return std::make_unique<CudaBackendImpl>(synthetic_model(cfg, seed));
}

ModelConfig synthetic_config(int layers) {
  ModelConfig c;
  c.model_type = "qwen3_5_moe";
  c.vocab_size = 248320;
  c.hidden_size = 2048;
  c.num_layers = layers;
  c.num_heads = 16;
  c.num_kv_heads = 2;
  c.head_dim = 256;
  c.attn_output_gate = true;
  c.rope_theta = 10000000.0;
  c.partial_rotary_factor = 0.25;
  c.rotary_dim = 64;
  c.max_position_embeddings = 262144;
  c.linear_num_key_heads = 16;
  c.linear_num_value_heads = 32;
  c.linear_key_head_dim = 128;
  c.linear_value_head_dim = 128;
  c.linear_conv_kernel_dim = 4;
  c.num_experts = 256;
  c.num_experts_per_tok = 8;
  c.moe_intermediate_size = 512;
  c.shared_expert_intermediate_size = 512;
  c.norm_topk_prob = true;
  c.rms_norm_eps = 1e-6;
  c.full_attention.resize(size_t(layers));
  for (int i = 0; i < layers; ++i) c.full_attention[size_t(i)] = (i % 4 == 3);
  c.quantized = true;
  c.quant = {4, 64};
  c.eos_token_ids = {248046, 248044};
  return c;
}

double decode_bytes_per_token(const ModelConfig& c, int64_t ctx) {
  auto q = [](double rows, double cols, int bits) { return rows * cols * bits / 8.0 + rows * cols / 64.0 * 4.0; };
  const double H = double(c.hidden_size);
  double b = 0;
  b += q(1, H, 4);                          // embedding row
  b += q(double(c.vocab_size), H, 4);       // LM head
  for (int i = 0; i < c.num_layers; ++i) {
    if (c.full_attention[size_t(i)]) {
      b += q(double(c.q_proj_rows() + 2 * c.kv_dim()), H, 4);
      b += q(H, double(c.num_heads) * c.head_dim, 4);
      b += double(ctx) * double(c.kv_dim()) * 2 * 2;  // K and V rows, bf16
    } else {
      b += q(double(c.gdn_conv_dim() + c.gdn_value_dim() + 2 * c.linear_num_value_heads), H, 4);
      b += q(H, double(c.gdn_value_dim()), 4);
      b += 2.0 * c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim * 4;  // state r+w
      b += 2.0 * c.gdn_conv_dim() * (c.linear_conv_kernel_dim - 1) * 4;
    }
    b += q(double(c.num_experts + 1), H, 8);  // router + shared_expert_gate
    const double experts = c.num_experts_per_tok;
    b += experts * 3 * q(double(c.moe_intermediate_size), H, 4);
    b += 3 * q(double(c.shared_expert_intermediate_size), H, 4);
  }
  return b;
}

MemoryInfo memory_info(const Backend& b) {
  MemoryInfo m;
  size_t fr = 0, tot = 0;
  if (cudaMemGetInfo(&fr, &tot) == cudaSuccess) {
    m.used = tot - fr;
    m.total = tot;
  }
  if (const auto* cb = dynamic_cast<const CudaBackendImpl*>(&b)) m.weights = cb->weight_bytes();
  return m;
}

}  // namespace lilac::cuda
