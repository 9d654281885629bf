// A CUDA session: one sequence (SeqState, seq_state.h: views of its slot in a sequence pool, seq_pool.h)
// plus what stepping it alone needs — a stream, the decode scratch and the prefill workspace, and the
// decode step captured as CUDA graphs (body, head, and body + head + sampling) on first use. The batched
// step of several sessions of one pool is the backend's (batch_step.h); it uses the accessors at the end.
// Prompts run through the batched prefill (prefill_step.h) in chunks; a chunk of 2 .. prefill_rows_max()
// tokens as one step of the pool's multi-row decode kernels (BatchStep::prefill); when logits of every
// position are wanted, through the batched prefill and the LM head over its rows (prefill_scored_ok); token by
// token through the decode body when the model is outside the prefill kernels' limits.
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
#include "cuda/seq_pool.h"
#include "cuda/seq_state.h"
#include "cuda/verify_step.h"
#include "engine/backend.h"

namespace lilac::cuda {

// Prompt chunks of 2 .. prefill_rows_max() tokens run as one step of the multi-row decode kernels
// (BatchStep::prefill: each row bit for bit a decode step of its token, the whole chunk reading the weights
// once) instead of the prefill kernels, whose fixed cost dominates short chunks (bench/BENCHMARKS.md, "Short
// prompts on the rows step"). LILAC_PREFILL_ROWS overrides (0 = never; at most rows::kMaxRows).
int prefill_rows_max();

class CudaSession : public Session, public PoolClient {
 public:
  // Takes a slot of `pool` (throws lilac::Error when it has none or cannot grow).
  CudaSession(const DevModel& m, std::shared_ptr<SeqPool> pool);
  ~CudaSession() override;
  CudaSession(const CudaSession&) = delete;
  CudaSession& operator=(const CudaSession&) = delete;

  int64_t length() const override { return seq_.len; }
  int64_t max_length() const override { return seq_.max_len; }
  int64_t vocab_size() const override { return m_.cfg.vocab_size; }
  void prefill(std::span<const int32_t> tokens, const LogitsSink* sink) override;
  void begin_generation(const SamplingParams& p, std::span<const int32_t> context) override;
  TokenChoice sample() override;
  void advance() override;
  TokenChoice decode_step() override;
  std::vector<float> logits() override;
  std::shared_ptr<const SessionSnapshot> snapshot() override;
  void restore(const SessionSnapshot& snap) override;
  void reset() override;
  void set_token_mask(const uint32_t* bits) override;

  // ---- speculative decoding (cuda_session_spec.cu; the head: mtp_head.h)
  bool can_draft() const override { return m_.mtp != nullptr; }
  void enable_drafting(bool on) override;
  std::vector<int32_t> draft(int k) override;
  std::vector<TokenChoice> verify(std::span<const int32_t> drafts) override;
  void set_draft_logits_sink(LogitsSink sink) override;
  void set_draft_vocab(int64_t n) override;
  // Measured on the H200 (bench/BENCHMARKS.md, "Speculative decoding (MTP head), CUDA"): a draft ~0.11 of a
  // 2.2 ms step, a verify of m rows ~1 + 0.4 (m - 1) steps. Only the adaptive policy's start: it times them.
  SpecCostHint spec_cost_hint() const override { return {0.12, 0.4}; }

  const SeqState& seq() const { return seq_; }
  // Verify steps run on the multi-row kernels so far (the others ran as plain decode steps).
  int64_t rows_verifies() const { return rows_verifies_; }
  // Prefill chunks run on the multi-row kernels so far (prefill_rows_max()).
  int64_t rows_prefills() const { return rows_prefills_; }
  // Chunks whose every position's logits were wanted that ran on the prefill kernels so far (prefill_scored_ok).
  int64_t scored_prefills() const { return scored_prefills_; }
  // The MTP head's catch-up rows run on the multi-row kernels so far (mtp_head.h).
  int64_t mtp_rows_catchups() const { return mtp_ ? mtp_->rows_catchups() : 0; }
  // Whether the session's MTP head follows its context (its steps feed the head: its own, verify steps
  // and the batched step's rows, through begin_batched / end_batched).
  bool following_mtp_head() const { return following_mtp(); }
  void pool_moved() override;

  // ---- for the batched step (cuda_backend.cu, batch_step.h)
  const DevModel& model() const { return m_; }
  SeqPool& pool() const { return *pool_; }
  int slot() const { return slot_; }
  bool mask_on() const { return mask_on_; }
  // Throws lilac::Error unless a sampled token is pending and the context has room for it.
  void check_decodable() const;
  // Before the batched step: stages the pending token for the MTP head (when following it; the step's
  // sampling overwrites the token cell), then records an event on the session's stream (the batched
  // step waits for it) and returns it.
  cudaEvent_t begin_batched();
  // Between the batched step's launch and its synchronisation, on its stream `s`: hands the head (when
  // following it) the row's hidden (`hidden`: the rows step's residual after the last layer, this row's).
  void end_batched(const float* hidden, cudaStream_t s);
  // After the batched step fed the pending token and sampled `r`: the host side of decode_step().
  TokenChoice finish_batched(const SampleResult& r);

 private:
  void sync();
  // Orders what follows on stream_ after the last speculative verify's GDN commit (verify_step.h: it runs on
  // a side stream). Every entry point that reads or writes the sequence's state calls it first; drafting
  // (the MTP head) and sampling do not need it.
  void settle();
  void check_room() const;
  void check_pending() const;  // a sampled token waits to be fed (else throws, as the CPU sessions do)
  void launch(cudaGraphExec_t g);
  cudaGraphExec_t body();
  cudaGraphExec_t head();
  cudaGraphExec_t step();
  TokenChoice fetch_result();
  TokenChoice to_choice(const SampleResult& r) const;
  TokenChoice chosen(const SampleResult& r);  // to_choice for the pending token: pending only if there is a choice
  void enqueue_sample_now();
  void drop_graphs();
  void release();
  void prefill_chunk_batched(int n, bool last);
  bool prefill_rows_ok(size_t n);
  void prefill_chunk_rows(std::span<const int32_t> tokens, bool last);
  void end_prefill_chunk(int n, bool last);
  void prefill_chunk_stepwise(int n, bool last, const LogitsSink* sink, std::vector<float>& rows);
  bool prefill_scored_ok();
  void prefill_chunk_scored(int n, bool last, const LogitsSink& sink, std::vector<float>& rows);
  TokenChoice decode_step_profiled();
  // The MTP head's hooks (no-ops unless drafting): a step feeds *seq_.token at seq_.len (before it) and
  // leaves its hidden in sc_.h (after it); a prefill chunk feeds n tokens with hiddens [n][ld] (on stream s,
  // before the chunk's end_prefill_chunk).
  bool following_mtp() const { return mtp_ && drafting_ && mtp_->valid(); }
  void mtp_before_step();
  void mtp_after_step();
  void mtp_prefill_rows(const int32_t* tokens, int n, const float* hidden, int64_t ld, cudaStream_t s);
  std::vector<TokenChoice> verify_rows(std::span<const int32_t> drafts);

  const DevModel& m_;
  std::shared_ptr<SeqPool> pool_;
  int slot_ = -1;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr, mask_copied_ = nullptr;
  DevAlloc mem_;        // the scratch below (the sequence's state is the pool's)
  SeqState seq_;
  bool pending_ = false;  // a sampled token waits in *seq_.token
  bool mask_on_ = false;  // set_token_mask's bitmask (in seq_.allowed) applies to the next choice
  bool no_penalties_ = false;  // the generation's sampling has no penalties (a verify samples in one pass)
  uint32_t* host_mask_ = nullptr;  // pinned [allowed_words(vocab)]: the upload's source
  void* masked_scratch_ = nullptr;  // rows::sample_token_masked's scratch
  float* bias_ = nullptr;           // [vocab]: the generation's logit bias row (SeqState::bias)
  DecodeScratch sc_;
  int32_t* prompt_ = nullptr;  // device [prefill_chunk_tokens()]: the prompt chunk being prefilled
  PrefillWorkspace pw_;
  SampleResult* host_result_ = nullptr;  // pinned
  cudaGraphExec_t g_body_ = nullptr, g_head_ = nullptr, g_step_ = nullptr;
  std::unique_ptr<StepProfile> prof_;  // LILAC_CUDA_PROFILE=1
  // Speculative decoding: the head (allocated when drafting is first enabled) and where drafts go.
  std::unique_ptr<MtpHead> mtp_;
  bool drafting_ = false;
  int32_t* drafts_ = nullptr;           // device [kMaxDrafts]: the last draft()'s tokens
  std::vector<int32_t> last_drafts_;    // their host copy
  LogitsSink draft_sink_;
  int64_t draft_vocab_ = 0;             // set_draft_vocab's (0: all)
  std::unique_ptr<VerifyStep> verify_;  // allocated on the first verify the rows step takes exactly
  VerifyOut* host_verify_ = nullptr;    // pinned
  int64_t rows_verifies_ = 0;
  int64_t rows_prefills_ = 0;
  int rows_prefill_ = -1;  // whether the model takes prefill chunks on the rows step (-1: not asked yet)
  int scored_prefill_ = -1;  // whether scored chunks take the prefill kernels (prefill_scored_ok; -1: not asked yet)
  int64_t scored_prefills_ = 0;
  int rows_verify_ = -1;  // whether verify runs on the rows step (verify_rows_ok; -1: not asked yet)
};

}  // namespace lilac::cuda
