#include "cuda/seq_pool.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "cuda/batch_step.h"
#include "cuda/cuda_common.h"
#include "cuda/decode_step.h"
#include "cuda/kernels/rows/rows_mm.h"

namespace lilac::cuda {

// The pool's device arrays for `cap` slots (slot-major, see seq_pool.h).
struct SeqPool::Arrays {
  DevAlloc mem;
  std::vector<__nv_bfloat16*> k, v;  // per attention layer [cap][kv_stride]
  float* gdn = nullptr;              // [cap][n_gdn][gdn_elems]
  float* conv = nullptr;             // [cap][n_gdn][conv_elems]
  float* log = nullptr;              // [cap][n_gdn][log_floats] (null without log rows)
  std::vector<unsigned*> sync;       // per GDN layer [cap][Hk]: the rows GDN kernel's conv_sync counters (zero)
  float* logits = nullptr;           // [cap][vocab]
  int32_t* token = nullptr;          // [cap]
  int32_t* pos = nullptr;            // [cap]
  SampleParamsDev* params = nullptr;  // [cap]
  int32_t* counts = nullptr;         // [cap][vocab]
  uint8_t* prompt_mask = nullptr;    // [cap][vocab]
  SampleResult* result = nullptr;    // [cap]
  uint32_t* allowed = nullptr;       // [cap][allowed_words(vocab)]
  int32_t* allowed_on = nullptr;     // [cap]
  std::vector<std::pair<void*, size_t>> parts;  // every array and its bytes per slot (for moves)
};

namespace {

int64_t round8(int64_t n) { return (n + 7) / 8 * 8; }

}  // namespace

size_t SeqPool::slot_bytes(const DevModel& m, int64_t max_len, int log_rows) {
  const SeqShape sh = SeqShape::of(m);
  const size_t V = size_t(sh.vocab);
  size_t b = size_t(sh.n_attn) * 2 * size_t(round8(max_len * sh.kv_row)) * 2;
  b += size_t(sh.n_gdn) * size_t(sh.gdn_elems + sh.conv_elems + m.cfg.linear_num_key_heads) * 4;
  if (log_rows > 0) {
    const ModelConfig& c = m.cfg;
    const int64_t row = c.gdn_conv_dim() + 2LL * c.linear_num_value_heads;
    b += size_t(sh.n_gdn) * size_t(log_rows) * size_t(row) * 4;
  }
  b += V * 4 + V * 4 + V + size_t(rows::allowed_words(sh.vocab)) * 4;  // logits, counts, prompt mask, allowed
  b += 3 * 4 + sizeof(SampleParamsDev) + sizeof(SampleResult);
  return b;
}

SeqPool::SeqPool(const DevModel& m, int64_t max_len, int log_rows) : m_(m), max_len_(max_len), log_rows_(log_rows) {
  sh_ = SeqShape::of(m);
  kv_stride_ = round8(max_len * sh_.kv_row);
  if (log_rows > 0) {
    const ModelConfig& c = m.cfg;
    log_floats_ = int64_t(log_rows) * (c.gdn_conv_dim() + 2LL * c.linear_num_value_heads);
  }
}

SeqPool::~SeqPool() = default;

BatchStep& SeqPool::batch() {
  if (!batch_) batch_ = std::make_unique<BatchStep>(m_, *this);
  return *batch_;
}

std::unique_ptr<SeqPool::Arrays> SeqPool::alloc(int cap) const {
  auto a = std::make_unique<Arrays>();
  const size_t n = size_t(cap), V = size_t(sh_.vocab);
  auto get = [&](size_t per_slot) {
    void* p = a->mem.get(std::max<size_t>(per_slot * n, 16));
    a->parts.push_back({p, per_slot});
    return p;
  };
  for (int i = 0; i < sh_.n_attn; ++i) {
    a->k.push_back(static_cast<__nv_bfloat16*>(get(size_t(kv_stride_) * 2)));
    a->v.push_back(static_cast<__nv_bfloat16*>(get(size_t(kv_stride_) * 2)));
  }
  a->gdn = static_cast<float*>(get(size_t(sh_.n_gdn) * size_t(sh_.gdn_elems) * 4));
  a->conv = static_cast<float*>(get(size_t(sh_.n_gdn) * size_t(sh_.conv_elems) * 4));
  if (log_floats_ > 0) a->log = static_cast<float*>(get(size_t(sh_.n_gdn) * size_t(log_floats_) * 4));
  const size_t hk = size_t(m_.cfg.linear_num_key_heads);
  for (int j = 0; j < sh_.n_gdn; ++j) {
    a->sync.push_back(static_cast<unsigned*>(get(hk * 4)));
    LILAC_CUDA_CHECK(cudaMemset(a->sync.back(), 0, n * hk * 4));
  }
  a->logits = static_cast<float*>(get(V * 4));
  a->token = static_cast<int32_t*>(get(4));
  a->pos = static_cast<int32_t*>(get(4));
  a->params = static_cast<SampleParamsDev*>(get(sizeof(SampleParamsDev)));
  a->counts = static_cast<int32_t*>(get(V * 4));
  a->prompt_mask = static_cast<uint8_t*>(get(V));
  a->result = static_cast<SampleResult*>(get(sizeof(SampleResult)));
  a->allowed = static_cast<uint32_t*>(get(size_t(rows::allowed_words(sh_.vocab)) * 4));
  a->allowed_on = static_cast<int32_t*>(get(4));
  LILAC_CUDA_CHECK(cudaMemset(a->logits, 0, n * V * 4));
  LILAC_CUDA_CHECK(cudaMemset(a->allowed_on, 0, n * 4));
  return a;
}

int SeqPool::used() const {
  std::lock_guard<std::mutex> lk(mu_);
  return int(std::count_if(owner_.begin(), owner_.end(), [](PoolClient* c) { return c != nullptr; }));
}

int SeqPool::acquire(PoolClient* c) {
  std::lock_guard<std::mutex> lk(mu_);
  for (int s = 0; s < cap_; ++s)
    if (!owner_[size_t(s)]) {
      owner_[size_t(s)] = c;
      return s;
    }
  if (cap_ >= rows::kMaxRows) return -1;
  const int s = cap_;
  const int twice = std::min(rows::kMaxRows, std::max(1, 2 * cap_));
  try {
    grow_to(twice);
  } catch (const Error&) {
    if (twice == cap_ + 1) throw;
    grow_to(cap_ + 1);  // the old arrays and twice the slots do not fit side by side: one more
  }
  owner_[size_t(s)] = c;
  return s;
}

void SeqPool::reserve(int slots) {
  std::lock_guard<std::mutex> lk(mu_);
  slots = std::min(slots, rows::kMaxRows);
  if (slots > cap_) grow_to(slots);
}

// Reallocates the arrays for cap2 > cap_ slots, the old contents copied to their prefix; tells the slots'
// holders.
void SeqPool::grow_to(int cap2) {
  LILAC_CUDA_CHECK(cudaDeviceSynchronize());  // nothing may still use the old arrays
  std::unique_ptr<Arrays> b;
  try {
    b = alloc(cap2);
  } catch (const Error& e) {
    cudaGetLastError();  // the failed cudaMalloc's error is not sticky: do not let a later launch check see it
    throw Error("cuda: no device memory for " + std::to_string(cap2) + " sequences of " + std::to_string(max_len_) +
                " tokens (" + std::to_string(slot_bytes(m_, max_len_, log_rows_) >> 20) + " MiB each): " + e.what());
  }
  if (a_)
    for (size_t i = 0; i < a_->parts.size(); ++i)
      LILAC_CUDA_CHECK(cudaMemcpy(b->parts[i].first, a_->parts[i].first, a_->parts[i].second * size_t(cap_),
                                  cudaMemcpyDeviceToDevice));
  LILAC_CUDA_CHECK(cudaDeviceSynchronize());
  a_ = std::move(b);
  cap_ = cap2;
  owner_.resize(size_t(cap_), nullptr);
  ++gen_;
  build_rows_state();
  for (PoolClient* o : owner_)
    if (o) o->pool_moved();
}

void SeqPool::release(int slot) {
  std::lock_guard<std::mutex> lk(mu_);
  if (slot >= 0 && slot < cap_) owner_[size_t(slot)] = nullptr;
}

SeqState SeqPool::view(int slot) const {
  LILAC_CHECK(slot >= 0 && slot < cap_, "cuda: sequence pool slot out of range");
  const Arrays& a = *a_;
  const int64_t s = slot, V = sh_.vocab;
  SeqState st;
  st.shape = sh_;
  st.max_len = max_len_;
  for (int i = 0; i < sh_.n_attn; ++i) {
    st.k_cache.push_back(a.k[size_t(i)] + s * kv_stride_);
    st.v_cache.push_back(a.v[size_t(i)] + s * kv_stride_);
  }
  st.gdn_state = a.gdn + s * sh_.n_gdn * sh_.gdn_elems;
  st.conv_state = a.conv + s * sh_.n_gdn * sh_.conv_elems;
  st.gdn_layer_stride = sh_.gdn_elems;
  st.conv_layer_stride = sh_.conv_elems;
  st.logits = a.logits + s * V;
  st.token = a.token + s;
  st.pos = a.pos + s;
  st.params = a.params + s;
  st.counts = a.counts + s * V;
  st.prompt_mask = a.prompt_mask + s * V;
  st.result = a.result + s;
  st.allowed = a.allowed + s * rows::allowed_words(V);
  return st;
}

void SeqPool::build_rows_state() {
  const Arrays& a = *a_;
  const ModelConfig& c = m_.cfg;
  RowsState r;
  for (int i = 0; i < sh_.n_attn; ++i) r.kv.push_back(rows::KvPool{a.k[size_t(i)], a.v[size_t(i)], kv_stride_});
  int j = 0;
  for (const DevLayer& L : m_.layers) {
    if (L.attn) continue;
    rows::GdnLayer g;
    g.conv_w = L.conv_w;
    g.A_log = L.A_log;
    g.dt_bias = L.dt_bias;
    g.state = a.gdn + int64_t(j) * sh_.gdn_elems;
    g.conv_state = a.conv + int64_t(j) * sh_.conv_elems;
    g.log = a.log ? a.log + int64_t(j) * log_floats_ : nullptr;
    g.conv_sync = a.sync[size_t(j)];
    r.gdn.push_back(g);
    ++j;
  }
  r.gdn_pool.state_stride = int64_t(sh_.n_gdn) * sh_.gdn_elems;
  r.gdn_pool.conv_stride = int64_t(sh_.n_gdn) * sh_.conv_elems;
  r.gdn_pool.log_stride = int64_t(sh_.n_gdn) * log_floats_;
  r.gdn_pool.log_rows = log_rows_;
  r.n_split = decode_n_split(max_len_);
  r.params = a.params;
  r.counts = a.counts;
  r.prompt_mask = a.prompt_mask;
  r.allowed = a.allowed;
  r.allowed_on = a.allowed_on;
  r.token = a.token;
  r.logits = a.logits;
  r.pos = a.pos;
  (void)c;
  rows_ = std::move(r);
}

}  // namespace lilac::cuda
