// A CUDA session: one sequence (SeqState, seq_state.h) plus what stepping it needs per session — a
// stream, the decode scratch and the prefill workspace, and the decode step captured as CUDA graphs
// (body, head, and body + head + sampling) on first use. Prompts run through the batched prefill
// (prefill_step.h) in chunks, or token by token through the decode body when logits of every position
// are wanted or the model is outside the prefill kernels' limits.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "cuda/decode_step.h"
#include "cuda/device_model.h"
#include "cuda/mtp_head.h"
#include "cuda/prefill_step.h"
#include "cuda/seq_state.h"
#include "cuda/verify_step.h"
#include "engine/backend.h"

namespace lilac::cuda {

class CudaSession : public Session {
 public:
  CudaSession(const DevModel& m, int64_t max_len);
  ~CudaSession() override;
  CudaSession(const CudaSession&) = delete;
  CudaSession& operator=(const CudaSession&) = delete;

  int64_t length() const override { return seq_.len; }
  int64_t max_length() const override { return seq_.max_len; }
  void prefill(std::span<const int32_t> tokens, const LogitsSink* sink) override;
  void begin_generation(const SamplingParams& p, std::span<const int32_t> context) override;
  TokenChoice sample() override;
  void advance() override;
  TokenChoice decode_step() override;
  std::vector<float> logits() override;
  std::shared_ptr<const SessionSnapshot> snapshot() override;
  void restore(const SessionSnapshot& snap) override;
  void reset() override;

  // ---- speculative decoding (cuda_session_spec.cu; the head: mtp_head.h)
  bool can_draft() const override { return m_.mtp != nullptr; }
  void enable_drafting(bool on) override;
  std::vector<int32_t> draft(int k) override;
  std::vector<TokenChoice> verify(std::span<const int32_t> drafts) override;
  void set_draft_logits_sink(LogitsSink sink) override;

  const SeqState& seq() const { return seq_; }
  // Verify steps run on the multi-row kernels so far (the others ran as plain decode steps).
  int64_t rows_verifies() const { return rows_verifies_; }

 private:
  void sync();
  void check_room() const;
  void launch(cudaGraphExec_t g);
  template <typename F>
  cudaGraphExec_t capture(F&& f);
  cudaGraphExec_t body();
  cudaGraphExec_t head();
  cudaGraphExec_t step();
  TokenChoice fetch_result();
  void prefill_chunk_batched(int n, bool last);
  void prefill_chunk_stepwise(int n, bool last, const LogitsSink* sink, std::vector<float>& rows);
  TokenChoice decode_step_profiled();
  // The MTP head's hooks (no-ops unless drafting): a step feeds *seq_.token at seq_.len (before it) and
  // leaves its hidden in sc_.h (after it); a prefill chunk feeds n tokens with hiddens [n][hidden].
  bool following_mtp() const { return mtp_ && drafting_ && mtp_->valid(); }
  void mtp_before_step();
  void mtp_after_step();
  void mtp_prefill_rows(const int32_t* tokens, int n, const float* hidden);
  std::vector<TokenChoice> verify_rows(std::span<const int32_t> drafts);
  TokenChoice choice_of(const SampleResult& r) const;

  const DevModel& m_;
  cudaStream_t stream_ = nullptr;
  DevAlloc mem_;        // the sequence's state and the scratch below
  SeqState seq_;
  DecodeScratch sc_;
  int32_t* prompt_ = nullptr;  // device [prefill_chunk_tokens()]: the prompt chunk being prefilled
  PrefillWorkspace pw_;
  SampleResult* host_result_ = nullptr;  // pinned
  cudaGraphExec_t g_body_ = nullptr, g_head_ = nullptr, g_step_ = nullptr;
  std::unique_ptr<StepProfile> prof_;  // LILAC_CUDA_PROFILE=1
  bool pending_ = false;               // a sampled token waits in seq_.token (sample / decode_step)
  // Speculative decoding: the head (allocated when drafting is first enabled) and where drafts go.
  std::unique_ptr<MtpHead> mtp_;
  bool drafting_ = false;
  int32_t* drafts_ = nullptr;  // device [kMaxDrafts]
  LogitsSink draft_sink_;
  std::unique_ptr<VerifyStep> verify_;  // allocated on the first verify the rows step takes exactly
  VerifyOut* host_verify_ = nullptr;    // pinned
  int64_t rows_verifies_ = 0;
  int rows_verify_ = -1;  // whether verify runs on the rows step (verify_rows_ok; -1: not asked yet)
};

}  // namespace lilac::cuda
