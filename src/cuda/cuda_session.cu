#include "cuda/cuda_session.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>

#include "core/error.h"
#include "core/log.h"
#include "cuda/batch_step.h"
#include "cuda/cuda_common.h"
#include "cuda/kernels/rows/rows_mm.h"
#include "engine/sampler.h"
#include "engine/validate.h"

namespace lilac::cuda {

int prefill_rows_max() {
  constexpr int kDefault = 32;  // faster than the prefill kernels up to here on the H200 (bench/BENCHMARKS.md)
  const char* e = std::getenv("LILAC_PREFILL_ROWS");
  if (e == nullptr || *e == 0) return kDefault;
  return std::clamp(std::atoi(e), 0, rows::kMaxRows);
}

CudaSession::CudaSession(const DevModel& m, std::shared_ptr<SeqPool> pool) : m_(m), pool_(std::move(pool)) {
  try {
    // One step above the default priority: a speculative verify's GDN commit (verify_step.h), on a stream of
    // default priority, then yields the SMs to the MTP head's drafts as they free up.
    int least = 0, greatest = 0;
    LILAC_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    LILAC_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, std::max(greatest, least - 1)));
    LILAC_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    LILAC_CUDA_CHECK(cudaEventCreateWithFlags(&mask_copied_, cudaEventDisableTiming));
    const int64_t max_len = pool_->max_len();
    sc_ = alloc_decode_scratch(mem_, m_, max_len);
    prompt_ = static_cast<int32_t*>(mem_.get(size_t(prefill_chunk_tokens()) * 4));
    masked_scratch_ = mem_.get(rows::sample_rows_scratch_bytes(m_.cfg.vocab_size, 1));
    bias_ = static_cast<float*>(mem_.get(size_t(m_.cfg.vocab_size) * 4));
    LILAC_CUDA_CHECK(cudaMallocHost(&host_result_, sizeof(SampleResult)));
    LILAC_CUDA_CHECK(cudaMallocHost(&host_mask_, size_t(rows::allowed_words(m_.cfg.vocab_size)) * 4));
    if (StepProfile::requested()) prof_ = std::make_unique<StepProfile>();
    slot_ = pool_->acquire(this);
    if (slot_ < 0) throw Error("cuda: the sequence pool has no free slot");
    seq_ = pool_->view(slot_);
    seq_.bias = bias_;
    SamplingParams greedy;
    begin_generation(greedy, {});
    reset();
  } catch (...) {
    release();
    throw;
  }
}

CudaSession::~CudaSession() {
  prof_.reset();  // prints the profile, if any
  release();
}

// Gives back the slot and everything the constructor made (destructor; a constructor that throws).
void CudaSession::release() {
  drop_graphs();
  if (stream_) cudaStreamSynchronize(stream_);
  mtp_.reset();
  verify_.reset();
  if (host_verify_) cudaFreeHost(host_verify_);
  host_verify_ = nullptr;
  if (slot_ >= 0) pool_->release(slot_);
  slot_ = -1;
  if (host_result_) cudaFreeHost(host_result_);
  if (host_mask_) cudaFreeHost(host_mask_);
  if (ready_) cudaEventDestroy(ready_);
  if (mask_copied_) cudaEventDestroy(mask_copied_);
  if (stream_) cudaStreamDestroy(stream_);
  host_result_ = nullptr;
  host_mask_ = nullptr;
  ready_ = mask_copied_ = nullptr;
  stream_ = nullptr;
}

void CudaSession::drop_graphs() {
  for (cudaGraphExec_t* g : {&g_body_, &g_head_, &g_step_})
    if (*g) {
      cudaGraphExecDestroy(*g);
      *g = nullptr;
    }
}

void CudaSession::pool_moved() {
  const int64_t len = seq_.len;
  const bool lp = seq_.want_logprobs;
  float* bias = seq_.bias;
  seq_ = pool_->view(slot_);
  seq_.len = len;
  seq_.want_logprobs = lp;
  seq_.bias = bias;
  drop_graphs();
  if (verify_) verify_->rebind();  // its graphs hold the old views (the MTP head re-captures by itself)
}

// ------------------------------------------------------------------------------------------------ helpers
void CudaSession::sync() { LILAC_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

void CudaSession::settle() {
  if (verify_) verify_->join(stream_);
}

void CudaSession::check_room() const {
  require(check_session_capacity(seq_.len, 1, seq_.max_len));
}

void CudaSession::launch(cudaGraphExec_t g) { LILAC_CUDA_CHECK(cudaGraphLaunch(g, stream_)); }

cudaGraphExec_t CudaSession::body() {
  if (!g_body_) g_body_ = capture_graph(stream_, [&] { enqueue_decode_body(m_, seq_, sc_, stream_); });
  return g_body_;
}

cudaGraphExec_t CudaSession::head() {
  if (!g_head_) g_head_ = capture_graph(stream_, [&] { enqueue_decode_head(m_, seq_, sc_, stream_); });
  return g_head_;
}

cudaGraphExec_t CudaSession::step() {
  if (!g_step_)
    g_step_ = capture_graph(stream_, [&] {
      enqueue_decode_body(m_, seq_, sc_, stream_);
      enqueue_decode_head(m_, seq_, sc_, stream_);
      enqueue_sample(seq_, sc_, stream_);
    });
  return g_step_;
}

TokenChoice CudaSession::fetch_result() {
  LILAC_CUDA_CHECK(cudaMemcpyAsync(host_result_, seq_.result, sizeof(SampleResult), cudaMemcpyDeviceToHost, stream_));
  sync();
  return chosen(*host_result_);
}

// The sampler's result as the pending token's choice: a row with no choice leaves nothing pending (*seq_.token then
// holds the sampler's negative code, which no later step may feed), as the CPU sessions do.
TokenChoice CudaSession::chosen(const SampleResult& r) {
  pending_ = false;
  TokenChoice t = to_choice(r);
  pending_ = true;
  return t;
}

TokenChoice CudaSession::to_choice(const SampleResult& r) const {
  // A row with no choice (sampling.h): the error the CPU sampler throws for it
  if (r.token == kNoAllowedToken) throw no_allowed_token_error();
  if (r.token == kNoFiniteLogit) throw no_finite_logit_error();
  if (r.token < 0 || r.token >= m_.cfg.vocab_size)
    throw Error("cuda sampler: token id " + std::to_string(r.token) + " is outside the vocabulary");
  TokenChoice t;
  t.token = r.token;
  t.logprob = r.logprob;
  if (seq_.want_logprobs)
    for (int i = 0; i < r.n_top; ++i) t.top.push_back({r.top_ids[i], r.top_lp[i]});
  return t;
}

// ------------------------------------------------------------------------------------------------ prefill
void CudaSession::prefill(std::span<const int32_t> tokens, const LogitsSink* sink) {
  settle();
  if (tokens.empty()) return;
  require(check_token_ids(tokens, m_.cfg.vocab_size));
  require(check_session_capacity(seq_.len, int64_t(tokens.size()), seq_.max_len));
  pending_ = false;
  std::vector<float> rows;
  size_t i = 0;
  while (i < tokens.size()) {
    const size_t n = std::min<size_t>(prefill_chunk_tokens(), tokens.size() - i);
    LILAC_CUDA_CHECK(cudaMemcpyAsync(prompt_, tokens.data() + i, n * 4, cudaMemcpyHostToDevice, stream_));
    const bool last = i + n == tokens.size();
    if (!sink && n >= 2 && prefill_rows_ok(n))
      prefill_chunk_rows(tokens.subspan(i, n), last);
    else if (!sink && n >= 2 && prefill_batched_ok(m_))
      prefill_chunk_batched(int(n), last);
    else if (sink && n >= 2 && prefill_scored_ok())
      prefill_chunk_scored(int(n), last, *sink, rows);
    else
      prefill_chunk_stepwise(int(n), last, sink, rows);
    i += n;
  }
  sync();
}

// The chunk in prompt_ through the prefill kernels; the head too when it is the prompt's last chunk.
void CudaSession::prefill_chunk_batched(int n, bool last) {
  prefill_chunk(m_, seq_, pw_, prompt_, n, sc_.h, stream_);  // the last row of the residual stream → h
  mtp_prefill_rows(prompt_, n, pw_.H, m_.cfg.hidden_size, stream_);
  end_prefill_chunk(n, last);
}

// Whether a chunk whose every position's logits are wanted (prompt scoring, check-golden) runs on the prefill
// kernels, the rows' logits from the final norm and the LM head over the chunk's residual rows (a prompt's rate
// instead of a decode step's per token): with LILAC_CUDA_SCORE=prefill, where the model takes the batched prefill
// and has the digits head. By default such chunks run token by token through the decode step (the decode path's
// logits, which check-golden has always checked): the prefill form waits for its device run (bench/GPU_NOTES.md).
bool CudaSession::prefill_scored_ok() {
  if (scored_prefill_ < 0) {
    const char* e = std::getenv("LILAC_CUDA_SCORE");
    scored_prefill_ = prefill_batched_ok(m_) && m_.lm_tiles && !prof_ && e && std::string(e) == "prefill" ? 1 : 0;
    if (scored_prefill_ == 1) try {
        pool_->batch();  // the rows scratch holds the rows' logits
      } catch (const Error& err) {
        LILAC_LOG_WARN("cuda: scored prompts run token by token (%s)", err.what());
        scored_prefill_ = 0;
      }
  }
  return scored_prefill_ == 1;
}

// The chunk in prompt_ through the prefill kernels, then the final norm and the LM head of its residual rows
// (pw_.H), up to rows::kMaxRows at a time on the pool's rows scratch, each group's logits handed to `sink`.
void CudaSession::prefill_chunk_scored(int n, bool last, const LogitsSink& sink, std::vector<float>& rows) {
  const int64_t first = seq_.len, H = m_.cfg.hidden_size, V = m_.cfg.vocab_size;
  prefill_chunk(m_, seq_, pw_, prompt_, n, sc_.h, stream_);
  mtp_prefill_rows(prompt_, n, pw_.H, H, stream_);
  LILAC_CUDA_CHECK(cudaEventRecord(ready_, stream_));
  rows.resize(size_t(std::min(n, rows::kMaxRows)) * size_t(V));
  BatchStep& b = pool_->batch();
  for (int r0 = 0; r0 < n; r0 += rows::kMaxRows) {
    const int M = std::min(rows::kMaxRows, n - r0);
    {
      std::lock_guard<std::mutex> lk(b.mu);
      b.head_rows(pw_.H + int64_t(r0) * H, H, M, ready_, rows.data());
    }
    sink(first + r0, M, rows.data());
  }
  ++scored_prefills_;
  end_prefill_chunk(n, last);
}

// After a chunk of n tokens whose last hidden is in sc_.h: the length and position move on, the head runs
// when it was the prompt's last chunk.
void CudaSession::end_prefill_chunk(int n, bool last) {
  seq_.len += n;
  const int32_t p = int32_t(seq_.len);
  LILAC_CUDA_CHECK(cudaMemcpyAsync(seq_.pos, &p, 4, cudaMemcpyHostToDevice, stream_));
  if (last) launch(head());
  sync();
}

bool CudaSession::prefill_rows_ok(size_t n) {
  if (n > size_t(prefill_rows_max()) || prof_) return false;
  if (rows_prefill_ < 0) {
    rows_prefill_ = rows_step_supported(m_, rows::kMaxRows) && rows_step_exact(m_) ? 1 : 0;
    if (rows_prefill_ == 1) try {
        pool_->batch();  // the pool's rows scratch (made on first use)
      } catch (const Error& e) {
        LILAC_LOG_WARN("cuda: short prompt chunks stay on the prefill kernels (%s)", e.what());
        rows_prefill_ = 0;
      }
  }
  return rows_prefill_ == 1;
}

// The chunk (also in prompt_, for the MTP head) as one step of the pool's rows kernels (BatchStep::prefill),
// the last row's hidden into sc_.h for the head: the state and logits n decode steps would leave.
void CudaSession::prefill_chunk_rows(std::span<const int32_t> tokens, bool last) {
  const int n = int(tokens.size());
  const int64_t H = m_.cfg.hidden_size;
  BatchStep& b = pool_->batch();
  LILAC_CUDA_CHECK(cudaEventRecord(ready_, stream_));
  {
    std::lock_guard<std::mutex> lk(b.mu);
    b.prefill(slot_, int32_t(seq_.len), tokens, ready_, [&](cudaStream_t s, const float* h, int64_t ld) {
      LILAC_CUDA_CHECK(cudaMemcpyAsync(sc_.h, h + int64_t(n - 1) * ld, size_t(H) * 4, cudaMemcpyDeviceToDevice, s));
      mtp_prefill_rows(prompt_, n, h, ld, s);  // on s: ordered after the chunk
    });
  }
  ++rows_prefills_;
  end_prefill_chunk(n, last);
}

// The chunk in prompt_ token by token through the decode body (graph replays); the head after every
// token when a sink wants every position's logits, else after the prompt's last token only.
void CudaSession::prefill_chunk_stepwise(int n, bool last, const LogitsSink* sink, std::vector<float>& rows) {
  const int64_t V = m_.cfg.vocab_size;
  if (sink) rows.resize(size_t(n) * size_t(V));
  for (int j = 0; j < n; ++j) {
    LILAC_CUDA_CHECK(cudaMemcpyAsync(seq_.token, prompt_ + j, 4, cudaMemcpyDeviceToDevice, stream_));
    mtp_before_step();
    launch(body());
    mtp_after_step();
    ++seq_.len;
    if (sink || (last && j + 1 == n)) launch(head());
    if (sink)
      LILAC_CUDA_CHECK(cudaMemcpyAsync(rows.data() + size_t(j) * size_t(V), seq_.logits, size_t(V) * 4,
                                       cudaMemcpyDeviceToHost, stream_));
  }
  if (sink) {
    sync();
    (*sink)(seq_.len - int64_t(n), int64_t(n), rows.data());
  }
}

// ------------------------------------------------------------------------------------------------ decode
void CudaSession::begin_generation(const SamplingParams& p, std::span<const int32_t> context) {
  seq_.begin_generation(p, context, stream_);
  no_penalties_ = p.presence_penalty == 0.f && p.frequency_penalty == 0.f && p.repetition_penalty == 1.f;
}

// The sampler on the current logits, with the token mask when one is set (then cleared: it is for one choice).
void CudaSession::enqueue_sample_now() {
  if (mask_on_)
    rows::sample_token_masked(seq_.logits, seq_.shape.vocab, seq_.params, seq_.counts, seq_.prompt_mask, seq_.allowed,
                              masked_scratch_, seq_.token, seq_.result, stream_);
  else
    enqueue_sample(seq_, sc_, stream_);
  mask_on_ = false;
  pending_ = true;
}

TokenChoice CudaSession::sample() {
  enqueue_sample_now();
  return fetch_result();
}

void CudaSession::check_pending() const {
  if (!pending_) throw Error("cuda session: advance() without a sampled token");
}

void CudaSession::advance() {
  settle();
  check_pending();
  check_room();
  mtp_before_step();
  launch(body());
  mtp_after_step();
  launch(head());
  ++seq_.len;
  pending_ = false;
  sync();
}

TokenChoice CudaSession::decode_step() {
  settle();
  check_pending();
  check_room();
  if (prof_) return decode_step_profiled();
  mtp_before_step();  // the MTP head's hooks: the fed token before the step, its hidden after it
  if (mask_on_) {
    launch(body());
    launch(head());
    enqueue_sample_now();
  } else {
    launch(step());
    pending_ = true;
  }
  mtp_after_step();
  ++seq_.len;
  return fetch_result();
}

// LILAC_CUDA_PROFILE=1: eager launches with events between the kernel groups.
TokenChoice CudaSession::decode_step_profiled() {
  prof_->mark("start", stream_);
  mtp_before_step();
  enqueue_decode_body(m_, seq_, sc_, stream_, prof_.get());
  mtp_after_step();
  enqueue_decode_head(m_, seq_, sc_, stream_);
  prof_->mark("lm_head", stream_);
  enqueue_sample_now();
  prof_->mark("sample", stream_);
  sync();
  prof_->collect();
  ++seq_.len;
  return fetch_result();
}

std::vector<float> CudaSession::logits() {
  std::vector<float> v(size_t(m_.cfg.vocab_size));
  LILAC_CUDA_CHECK(cudaMemcpyAsync(v.data(), seq_.logits, v.size() * 4, cudaMemcpyDeviceToHost, stream_));
  sync();
  return v;
}

// ------------------------------------------------------------------------------------------------ state
// snapshot / restore (they carry the MTP head's cache while drafting): cuda_session_spec.cu

void CudaSession::reset() {
  settle();
  seq_.reset(stream_);
  pending_ = false;
  if (mtp_) mtp_->reset(drafting_, stream_);
}

// ------------------------------------------------------------------------------------------------ token mask
void CudaSession::set_token_mask(const uint32_t* bits) {
  if (!bits) {
    mask_on_ = false;
    return;
  }
  const int64_t V = m_.cfg.vocab_size, words = rows::allowed_words(V);
  bool any = false;
  for (int64_t w = 0; w < words && !any; ++w) {
    uint32_t b = bits[w];
    if (w == words - 1 && V % 32) b &= (1u << (V % 32)) - 1;
    any = b != 0;
  }
  if (!any) throw no_allowed_token_error();
  LILAC_CUDA_CHECK(cudaEventSynchronize(mask_copied_));  // the previous upload has left host_mask_ (normally long ago)
  std::copy(bits, bits + words, host_mask_);
  LILAC_CUDA_CHECK(cudaMemcpyAsync(seq_.allowed, host_mask_, size_t(words) * 4, cudaMemcpyHostToDevice, stream_));
  LILAC_CUDA_CHECK(cudaEventRecord(mask_copied_, stream_));
  mask_on_ = true;
}

// ------------------------------------------------------------------------------------------------ batched step
void CudaSession::check_decodable() const {
  if (!pending_) throw Error("cuda decode_batch: a session has no sampled token to feed");
  check_room();
}

cudaEvent_t CudaSession::begin_batched() {
  settle();
  mtp_before_step();
  LILAC_CUDA_CHECK(cudaEventRecord(ready_, stream_));
  return ready_;
}

void CudaSession::end_batched(const float* hidden, cudaStream_t s) {
  if (following_mtp()) mtp_->stage_hidden(hidden, s);
}

TokenChoice CudaSession::finish_batched(const SampleResult& r) {
  ++seq_.len;
  mask_on_ = false;
  return chosen(r);
}

}  // namespace lilac::cuda
