#include "cuda/cuda_session.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "cuda/cuda_common.h"

namespace lilac::cuda {

CudaSession::CudaSession(const DevModel& m, int64_t max_len) : m_(m) {
  LILAC_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  sc_ = alloc_decode_scratch(mem_, m_, max_len);
  seq_ = alloc_seq_state(mem_, m_, max_len);
  prompt_ = static_cast<int32_t*>(mem_.get(size_t(prefill_chunk_tokens()) * 4));
  LILAC_CUDA_CHECK(cudaMallocHost(&host_result_, sizeof(SampleResult)));
  if (StepProfile::requested()) prof_ = std::make_unique<StepProfile>();
  SamplingParams greedy;
  begin_generation(greedy, {});
  reset();
}

CudaSession::~CudaSession() {
  prof_.reset();  // prints the profile, if any
  mtp_.reset();
  verify_.reset();
  if (host_verify_) cudaFreeHost(host_verify_);
  if (g_body_) cudaGraphExecDestroy(g_body_);
  if (g_head_) cudaGraphExecDestroy(g_head_);
  if (g_step_) cudaGraphExecDestroy(g_step_);
  if (host_result_) cudaFreeHost(host_result_);
  cudaStreamDestroy(stream_);
}

// ------------------------------------------------------------------------------------------------ helpers
void CudaSession::sync() { LILAC_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

void CudaSession::check_room() const {
  if (seq_.len + 1 > seq_.max_len) throw InputError("context full: " + std::to_string(seq_.max_len) + " tokens");
}

void CudaSession::launch(cudaGraphExec_t g) { LILAC_CUDA_CHECK(cudaGraphLaunch(g, stream_)); }

template <typename F>
cudaGraphExec_t CudaSession::capture(F&& f) {
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

cudaGraphExec_t CudaSession::body() {
  if (!g_body_) g_body_ = capture([&] { enqueue_decode_body(m_, seq_, sc_, stream_); });
  return g_body_;
}

cudaGraphExec_t CudaSession::head() {
  if (!g_head_) g_head_ = capture([&] { enqueue_decode_head(m_, seq_, sc_, stream_); });
  return g_head_;
}

cudaGraphExec_t CudaSession::step() {
  if (!g_step_)
    g_step_ = capture([&] {
      enqueue_decode_body(m_, seq_, sc_, stream_);
      enqueue_decode_head(m_, seq_, sc_, stream_);
      enqueue_sample(seq_, sc_, stream_);
    });
  return g_step_;
}

TokenChoice CudaSession::fetch_result() {
  LILAC_CUDA_CHECK(cudaMemcpyAsync(host_result_, seq_.result, sizeof(SampleResult), cudaMemcpyDeviceToHost, stream_));
  sync();
  return choice_of(*host_result_);
}

TokenChoice CudaSession::choice_of(const SampleResult& r) const {
  TokenChoice t;
  t.token = r.token;
  t.logprob = r.logprob;
  if (seq_.want_logprobs)
    for (int i = 0; i < r.n_top; ++i) t.top.push_back({r.top_ids[i], r.top_lp[i]});
  return t;
}

// ------------------------------------------------------------------------------------------------ prefill
void CudaSession::prefill(std::span<const int32_t> tokens, const LogitsSink* sink) {
  if (tokens.empty()) return;
  pending_ = false;
  const int64_t V = m_.cfg.vocab_size;
  for (int32_t t : tokens)
    if (t < 0 || t >= V)
      throw InputError("token id " + std::to_string(t) + " is outside the vocabulary (size " + std::to_string(V) +
                       ")");
  if (seq_.len + int64_t(tokens.size()) > seq_.max_len)
    throw InputError("context too long: " + std::to_string(seq_.len + int64_t(tokens.size())) + " tokens, max " +
                     std::to_string(seq_.max_len));
  std::vector<float> rows;
  size_t i = 0;
  while (i < tokens.size()) {
    const size_t n = std::min<size_t>(prefill_chunk_tokens(), tokens.size() - i);
    LILAC_CUDA_CHECK(cudaMemcpyAsync(prompt_, tokens.data() + i, n * 4, cudaMemcpyHostToDevice, stream_));
    const bool last = i + n == tokens.size();
    if (!sink && n >= 2 && prefill_batched_ok(m_))
      prefill_chunk_batched(int(n), last);
    else
      prefill_chunk_stepwise(int(n), last, sink, rows);
    i += n;
  }
  sync();
}

// The chunk in prompt_ through the prefill kernels; the head too when it is the prompt's last chunk.
void CudaSession::prefill_chunk_batched(int n, bool last) {
  prefill_chunk(m_, seq_, pw_, prompt_, n, sc_.h, stream_);  // the last row of the residual stream → h
  mtp_prefill_rows(prompt_, n, pw_.H);
  seq_.len += n;
  const int32_t p = int32_t(seq_.len);
  LILAC_CUDA_CHECK(cudaMemcpyAsync(seq_.pos, &p, 4, cudaMemcpyHostToDevice, stream_));
  if (last) launch(head());
  sync();
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
}

TokenChoice CudaSession::sample() {
  enqueue_sample(seq_, sc_, stream_);
  pending_ = true;
  return fetch_result();
}

void CudaSession::advance() {
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
  check_room();
  pending_ = true;
  if (prof_) return decode_step_profiled();
  mtp_before_step();
  launch(step());
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
  enqueue_sample(seq_, sc_, stream_);
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
  seq_.reset(stream_);
  pending_ = false;
  if (mtp_) mtp_->reset(drafting_, stream_);
}

}  // namespace lilac::cuda
