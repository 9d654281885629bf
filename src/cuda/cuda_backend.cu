// The CUDA backend: a model on the device (device_model.h: uploaded from a checkpoint, or synthetic)
// shared by its sessions (cuda_session.h: one sequence each, the decode step as CUDA graphs).
#include "cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>
#include <utility>

#include "core/error.h"
#include "core/log.h"
#include "cuda/batch_step.h"
#include "cuda/cuda_common.h"
#include "cuda/cuda_session.h"
#include "cuda/device_model.h"
#include "cuda/kernels/gemv/gemv_tc.h"
#include "cuda/kernels/stream_scratch.h"
#include "cuda/rows_step.h"
#include "cuda/seq_pool.h"
#include "cuda/synthetic_model.h"

namespace lilac::cuda {
namespace {

// LILAC_CUDA_BATCH: "loop" steps a batch session by session; "rows" runs the rows step even where its
// rows are not bit for bit single decode steps (rows_step_exact false: tests of the batched path on small
// models); unset / anything else: the rows step where it is exact, else the loop.
enum class BatchMode { Auto, Rows, Loop };
BatchMode batch_mode_from_env() {
  const char* e = std::getenv("LILAC_CUDA_BATCH");
  if (e && std::string(e) == "rows") return BatchMode::Rows;
  if (e && std::string(e) == "loop") return BatchMode::Loop;
  return BatchMode::Auto;
}

class CudaBackendImpl : public Backend {
 public:
  explicit CudaBackendImpl(std::unique_ptr<DevModel> m) : m_(std::move(m)) {
    cudaDeviceProp p{};
    LILAC_CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
    desc_ = std::string(p.name) + ", " + std::to_string(p.multiProcessorCount) + " SMs, " +
            std::to_string(p.totalGlobalMem >> 20) + " MiB";
    const BatchMode mode = batch_mode_from_env();
    rows_batch_ = mode != BatchMode::Loop && rows_step_supported(*m_, rows::kMaxRows) &&
                  (mode == BatchMode::Rows || rows_step_exact(*m_));
  }
  std::string name() const override { return "cuda"; }
  const ModelConfig& config() const override { return m_->cfg; }
  std::unique_ptr<Session> new_session(int64_t max_length) override {
    std::lock_guard<std::mutex> lk(mu_);  // one at a time: a new session may move its pool's arrays
    auto s = std::make_unique<CudaSession>(*m_, pool_for(clamp_len(max_length)));
    s->set_draft_vocab(draft_vocab_);
    return s;
  }
  std::vector<TokenChoice> decode_batch(std::span<Session* const> sessions) override;
  int max_batch() const override { return rows::kMaxRows; }
  bool supports_logit_bias() const override { return true; }
  size_t session_bytes(int64_t max_length) const override;
  int default_sessions(int64_t max_length) const override;
  void reserve_sessions(int n, int64_t max_length) override;
  std::string describe() const override { return desc_; }
  size_t weight_bytes() const { return m_->weight_bytes(); }

 private:
  int64_t clamp_len(int64_t n) const {
    if (n > 0) return n;
    return m_->cfg.max_position_embeddings > 0 ? m_->cfg.max_position_embeddings : 4096;
  }
  std::shared_ptr<SeqPool> pool_for(int64_t max_len);
  // GDN log rows per pool slot (rows steps in Log mode, i.e. speculative verify on the rows kernels): none
  // while no CUDA step uses Log mode.
  int pool_log_rows() const { return 0; }
  void step_rows(BatchStep& b, std::span<CudaSession* const> group, std::span<TokenChoice> out);

  std::unique_ptr<DevModel> m_;
  std::string desc_;
  std::atomic<bool> rows_batch_{false};
  std::mutex mu_;
  std::vector<std::weak_ptr<SeqPool>> pools_;  // by capacity; a pool lives while a session holds a slot
  std::vector<std::shared_ptr<SeqPool>> reserved_;  // reserve_sessions' pools (the server's: kept for good)
};

// A pool of sessions of max_len tokens with a free slot (or room to grow), else a new one. Under mu_.
std::shared_ptr<SeqPool> CudaBackendImpl::pool_for(int64_t max_len) {
  std::erase_if(pools_, [](const std::weak_ptr<SeqPool>& w) { return w.expired(); });
  for (auto& w : pools_)
    if (auto p = w.lock(); p && p->max_len() == max_len && p->used() < rows::kMaxRows) return p;
  auto p = std::make_shared<SeqPool>(*m_, max_len, pool_log_rows());
  pools_.push_back(p);
  return p;
}

// The server's n sessions in pools of up to kMaxRows slots, allocated now (no growth, no copies later).
void CudaBackendImpl::reserve_sessions(int n, int64_t max_length) {
  std::lock_guard<std::mutex> lk(mu_);
  const int64_t L = clamp_len(max_length);
  while (n > 0) {
    const int k = std::min(n, rows::kMaxRows);
    auto p = std::make_shared<SeqPool>(*m_, L, pool_log_rows());
    try {
      p->reserve(k);
    } catch (const Error& e) {
      LILAC_LOG_WARN("cuda: could not reserve %d sessions of %lld tokens (%s)", k, (long long)L, e.what());
      return;  // the sessions grow their pools one by one as far as memory allows
    }
    pools_.push_back(p);
    reserved_.push_back(std::move(p));
    n -= k;
  }
}

size_t CudaBackendImpl::session_bytes(int64_t max_length) const {
  const int64_t L = clamp_len(max_length);
  const ModelConfig& c = m_->cfg;
  // the slot's state, the session's own decode scratch (mostly the attention partials and the sampler),
  // its prefill workspace at the chunk size, and a share of the batched step's scratch
  size_t b = SeqPool::slot_bytes(*m_, L, pool_log_rows());
  b += size_t(attn_decode_partial_floats(AttnDecodeShape{c.num_heads, c.num_kv_heads, c.head_dim, c.rotary_dim},
                                         decode_n_split(L))) * 4 +
       sample_scratch_bytes(c.vocab_size) + rows::sample_rows_scratch_bytes(c.vocab_size, 1) +
       size_t(c.vocab_size) * 4 +  // the logit bias row
       size_t(m_->max_in_rows + 4 * c.hidden_size) * 4;
  const size_t n = size_t(prefill_chunk_tokens());
  b += prefill_workspace_bytes(*m_, int(n)) + n * 4;
  b += rows_scratch_bytes(*m_, rows::kMaxRows, decode_n_split(L)) / rows::kMaxRows;
  return b;
}

int CudaBackendImpl::default_sessions(int64_t max_length) const {
  size_t fr = 0, tot = 0;
  if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) {
    cudaGetLastError();
    return 1;
  }
  // keep a margin for snapshots (the prefix cache), graphs and the runtime: 4 GiB or 10 % of the device
  const size_t margin = std::max<size_t>(size_t(4) << 30, tot / 10);
  const size_t per = session_bytes(max_length);
  if (fr <= margin || per == 0) return 1;
  return int(std::clamp<size_t>((fr - margin) / per, 1, size_t(max_batch())));
}

std::vector<TokenChoice> CudaBackendImpl::decode_batch(std::span<Session* const> sessions) {
  // validate everything before any state changes
  std::vector<CudaSession*> cs;
  for (Session* s : sessions) {
    auto* c = dynamic_cast<CudaSession*>(s);
    if (!c || &c->model() != m_.get()) throw Error("cuda decode_batch: a session from another backend");
    if (std::find(cs.begin(), cs.end(), c) != cs.end()) throw Error("cuda decode_batch: a session appears twice");
    c->check_decodable();
    cs.push_back(c);
  }
  std::vector<TokenChoice> out(cs.size());
  // sessions of one pool step together (in the order they came); a group of one steps alone. Sessions whose
  // MTP head follows their context join the rows step too: it hands each head its row (step_rows). A session
  // whose own choice fails (its row has no choice: sampling.h) gets the error in its row, the others their choices.
  auto alone = [](CudaSession* c) { return choice_or_error([c] { return c->decode_step(); }); };
  std::vector<bool> done(cs.size(), false);
  for (size_t i = 0; i < cs.size(); ++i) {
    if (done[i]) continue;
    std::vector<CudaSession*> group;
    std::vector<size_t> at;
    for (size_t j = i; j < cs.size(); ++j)
      if (!done[j] && &cs[j]->pool() == &cs[i]->pool()) {
        group.push_back(cs[j]);
        at.push_back(j);
        done[j] = true;
      }
    if (group.size() == 1 || !rows_batch_) {
      for (size_t k = 0; k < group.size(); ++k) out[at[k]] = alone(group[k]);
      continue;
    }
    BatchStep& b = group.front()->pool().batch();
    std::unique_lock<std::mutex> lk(b.mu);
    try {
      b.prepare(int(group.size()));
    } catch (const Error& e) {  // the rows kernels refuse this model: step session by session from now on
      LILAC_LOG_WARN("cuda: batched decode step unavailable, stepping sessions one by one (%s)", e.what());
      rows_batch_ = false;
      lk.unlock();
      for (size_t k = 0; k < group.size(); ++k) out[at[k]] = alone(group[k]);
      continue;
    }
    std::vector<TokenChoice> res(group.size());
    step_rows(b, group, res);
    for (size_t k = 0; k < group.size(); ++k) out[at[k]] = std::move(res[k]);
  }
  return out;
}

// One rows step of `group` (sessions of b's pool); the caller holds b.mu. A session following its MTP head
// stages its pending token for the head before the step (begin_batched) and gets its row's hidden from the
// step's scratch on the step's stream before the step syncs (end_batched), as its own decode step would.
void CudaBackendImpl::step_rows(BatchStep& b, std::span<CudaSession* const> group, std::span<TokenChoice> out) {
  std::vector<BatchRow> rows(group.size());
  for (size_t k = 0; k < group.size(); ++k) {
    rows[k].slot = group[k]->slot();
    rows[k].pos = int32_t(group[k]->length());
    rows[k].mask_on = group[k]->mask_on();
    rows[k].ready = group[k]->begin_batched();
  }
  std::vector<SampleResult> res(group.size());
  b.run(rows, res.data(), [&](cudaStream_t s, const float* hidden, int64_t ld) {
    for (size_t k = 0; k < group.size(); ++k) group[k]->end_batched(hidden + int64_t(k) * ld, s);
  });
  for (size_t k = 0; k < group.size(); ++k) {
    CudaSession* c = group[k];
    const SampleResult& r = res[k];
    out[k] = choice_or_error([c, &r] { return c->finish_batched(r); });
  }
}

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
  tc_trace_from_env();
  return std::make_unique<CudaBackendImpl>(synthetic_model(cfg, seed));
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

size_t stream_scratch_bytes() { return g_stream_scratch_bytes.load(); }

}  // namespace lilac::cuda
