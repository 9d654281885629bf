#include "cuda/seq_state.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "cuda/cuda_common.h"
#include "engine/sampler.h"

namespace lilac::cuda {
namespace {

// Device copies of a sequence's state at length `len` (KV rows [0, len), all recurrent and conv
// states, the current logits).
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

void sync(cudaStream_t s) { LILAC_CUDA_CHECK(cudaStreamSynchronize(s)); }

// Copies the GDN and conv states between `st` and one contiguous block per kind ([n_gdn][elems]),
// either way: one copy each when st's own states are contiguous, else one per layer.
void copy_states(const SeqState& st, void* gdn_block, void* conv_block, bool to_block, cudaStream_t s) {
  const SeqShape& sh = st.shape;
  auto copy = [&](float* state, int64_t stride, int64_t elems, size_t whole, void* block) {
    if (stride == elems) {
      LILAC_CUDA_CHECK(to_block ? cudaMemcpyAsync(block, state, whole, cudaMemcpyDeviceToDevice, s)
                                : cudaMemcpyAsync(state, block, whole, cudaMemcpyDeviceToDevice, s));
      return;
    }
    for (int j = 0; j < sh.n_gdn; ++j) {
      float* layer = state + j * stride;
      float* b = static_cast<float*>(block) + j * elems;
      LILAC_CUDA_CHECK(to_block ? cudaMemcpyAsync(b, layer, size_t(elems) * 4, cudaMemcpyDeviceToDevice, s)
                                : cudaMemcpyAsync(layer, b, size_t(elems) * 4, cudaMemcpyDeviceToDevice, s));
    }
  };
  copy(st.gdn_state, st.gdn_layer_stride, sh.gdn_elems, sh.gdn_bytes(), gdn_block);
  copy(st.conv_state, st.conv_layer_stride, sh.conv_elems, sh.conv_bytes(), conv_block);
}

}  // namespace

SeqShape SeqShape::of(const DevModel& m) {
  const ModelConfig& c = m.cfg;
  SeqShape sh;
  sh.n_attn = m.n_attn;
  sh.n_gdn = m.n_gdn;
  sh.kv_row = c.kv_dim();
  sh.gdn_elems = int64_t(c.linear_num_value_heads) * c.linear_key_head_dim * c.linear_value_head_dim;
  sh.conv_elems = c.gdn_conv_dim() * (c.linear_conv_kernel_dim - 1);
  sh.vocab = c.vocab_size;
  return sh;
}

void SeqState::upload_pos(cudaStream_t s) {
  const int32_t p = int32_t(len);
  LILAC_CUDA_CHECK(cudaMemcpyAsync(pos, &p, 4, cudaMemcpyHostToDevice, s));
  sync(s);
}

void SeqState::reset(cudaStream_t s) {
  len = 0;
  if (gdn_contiguous()) {
    LILAC_CUDA_CHECK(cudaMemsetAsync(gdn_state, 0, shape.gdn_bytes(), s));
    LILAC_CUDA_CHECK(cudaMemsetAsync(conv_state, 0, shape.conv_bytes(), s));
  } else {
    for (int j = 0; j < shape.n_gdn; ++j) {
      LILAC_CUDA_CHECK(cudaMemsetAsync(gdn(j), 0, size_t(shape.gdn_elems) * 4, s));
      LILAC_CUDA_CHECK(cudaMemsetAsync(conv(j), 0, size_t(shape.conv_elems) * 4, s));
    }
  }
  upload_pos(s);
  sync(s);
}

void SeqState::begin_generation(const SamplingParams& p, std::span<const int32_t> context, cudaStream_t s) {
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
  d.bias = nullptr;
  std::vector<float> dense;
  if (!p.logit_bias.empty()) {
    if (bias == nullptr) throw InputError("logit_bias: this session has no bias row");
    check_logit_bias(p, shape.vocab);
    dense.assign(size_t(shape.vocab), 0.f);
    for (const auto& [t, b] : p.logit_bias) dense[size_t(t)] += b;  // summed as the host sampler does
    LILAC_CUDA_CHECK(cudaMemcpyAsync(bias, dense.data(), dense.size() * 4, cudaMemcpyHostToDevice, s));
    d.bias = bias;
  }
  want_logprobs = p.logprobs;
  LILAC_CUDA_CHECK(cudaMemcpyAsync(params, &d, sizeof d, cudaMemcpyHostToDevice, s));
  LILAC_CUDA_CHECK(cudaMemsetAsync(counts, 0, size_t(shape.vocab) * 4, s));
  std::vector<uint8_t> mask(size_t(shape.vocab), 0);
  for (int32_t t : context)
    if (t >= 0 && t < shape.vocab) mask[size_t(t)] = 1;
  LILAC_CUDA_CHECK(cudaMemcpyAsync(prompt_mask, mask.data(), mask.size(), cudaMemcpyHostToDevice, s));
  sync(s);
}

std::shared_ptr<const SessionSnapshot> SeqState::snapshot(const void* owner, cudaStream_t s) const {
  auto snap = std::make_shared<CudaSnapshot>();
  snap->owner = owner;
  snap->len = len;
  const size_t kvb = size_t(len) * shape.kv_row * 2;
  for (size_t i = 0; i < k_cache.size(); ++i) {
    void* p = snap->mem.get(2 * kvb);
    if (kvb) {
      LILAC_CUDA_CHECK(cudaMemcpyAsync(p, k_cache[i], kvb, cudaMemcpyDeviceToDevice, s));
      LILAC_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(p) + kvb, v_cache[i], kvb, cudaMemcpyDeviceToDevice, s));
    }
    snap->kv.push_back(p);
  }
  snap->gdn = snap->mem.get(shape.gdn_bytes());
  snap->conv = snap->mem.get(shape.conv_bytes());
  snap->logits = snap->mem.get(size_t(shape.vocab) * 4);
  copy_states(*this, snap->gdn, snap->conv, true, s);
  LILAC_CUDA_CHECK(cudaMemcpyAsync(snap->logits, logits, size_t(shape.vocab) * 4, cudaMemcpyDeviceToDevice, s));
  sync(s);
  snap->nbytes = snap->mem.bytes;
  return snap;
}

void SeqState::restore(const SessionSnapshot& snap, const void* owner, cudaStream_t s) {
  const auto* c = dynamic_cast<const CudaSnapshot*>(&snap);
  if (!c || c->owner != owner) throw Error("cuda: snapshot from another backend or model");
  if (c->len > max_len) throw Error("cuda: snapshot longer than this session's capacity");
  const size_t kvb = size_t(c->len) * shape.kv_row * 2;
  for (size_t i = 0; i < k_cache.size() && kvb; ++i) {
    LILAC_CUDA_CHECK(cudaMemcpyAsync(k_cache[i], c->kv[i], kvb, cudaMemcpyDeviceToDevice, s));
    LILAC_CUDA_CHECK(cudaMemcpyAsync(v_cache[i], static_cast<const char*>(c->kv[i]) + kvb, kvb,
                                     cudaMemcpyDeviceToDevice, s));
  }
  copy_states(*this, c->gdn, c->conv, false, s);
  LILAC_CUDA_CHECK(cudaMemcpyAsync(logits, c->logits, size_t(shape.vocab) * 4, cudaMemcpyDeviceToDevice, s));
  len = c->len;
  upload_pos(s);
  sync(s);
}

}  // namespace lilac::cuda
