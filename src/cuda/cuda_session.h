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
#include "cuda/prefill_step.h"
#include "cuda/seq_state.h"
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

  const SeqState& seq() const { return seq_; }

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
};

}  // namespace lilac::cuda
