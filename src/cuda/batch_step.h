// The batched decode step of one sequence pool (seq_pool.h): M sessions of the pool, one row each, as one
// rows step (rows_step.h: GDN Advance, sample_rows with each slot's sampler and mask, the logits and the
// position of each slot updated) replayed from a CUDA graph captured once per M (1 < M <= kMaxRows: per
// exact M rather than per bucket with padding rows, so no step computes rows nobody needs; a capture costs
// a few milliseconds once per M and pool). The rows' slots and positions, and the slots' mask switches, are
// uploaded on the step's stream before the launch; the results come back in one copy. The rows' hiddens (the
// residual after the last layer: the MTP head's input) are handed to the caller before the step syncs.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <mutex>
#include <span>
#include <vector>

#include "cuda/device_model.h"
#include "cuda/rows_step.h"
#include "cuda/seq_pool.h"

namespace lilac::cuda {

// One row of a batched step.
struct BatchRow {
  int slot = -1;
  int32_t pos = 0;              // the session's length (the pending token's position)
  bool mask_on = false;         // the slot's allowed-token bitmask applies to this choice
  cudaEvent_t ready = nullptr;  // recorded on the session's stream after its last work (the step waits)
};

class BatchStep {
 public:
  BatchStep(const DevModel& m, const SeqPool& pool);
  ~BatchStep();
  BatchStep(const BatchStep&) = delete;
  BatchStep& operator=(const BatchStep&) = delete;

  // Captures the graph for M rows if not yet done; throws lilac::Error (nothing enqueued, no state changed)
  // when the rows kernels refuse the model. Not reentrant (callers hold mu).
  void prepare(int M);
  // One step for rows (1 <= rows.size() <= kMaxRows, distinct slots of the pool); out[i] = row i's
  // choice. `hiddens` (optional) is called after the launch, before the sync, with the step's stream and
  // the rows' hiddens (device [M][ld]: row i at hidden + i * ld), valid on that stream until the step's next
  // run: enqueue copies of them there. Synchronises. Not reentrant (callers hold mu).
  using HiddenSink = std::function<void(cudaStream_t s, const float* hidden, int64_t ld)>;
  void run(std::span<const BatchRow> rows, SampleResult* out, const HiddenSink& hiddens = {});
  // A prefill chunk of one session on the rows step: its n tokens (host; 2 <= n <= kMaxRows) as n rows of
  // `slot` at positions pos .. pos + n - 1, the body only (no head, no sampling; GDN Advance: the slot's
  // recurrent and conv states move over the n rows in order, the K/V rows are appended). Each row's
  // residual stream is bit for bit the single-row decode body's for that token (rows_step_exact), so the
  // chunk leaves the state n decode steps would. A graph per n, captured on first use. `ready`: recorded on
  // the session's stream after its last work (the chunk waits for it). `hiddens` is called after the
  // launch with the rows' hiddens (device [n][ld]), as in run(). Synchronises. Not reentrant (callers hold mu).
  void prefill(int slot, int32_t pos, std::span<const int32_t> tokens, cudaEvent_t ready, const HiddenSink& hiddens);
  // The final RMSNorm and the LM head of M <= kMaxRows residual rows x (device [M][ldx], ready on a stream
  // that recorded `ready`) into host [M][vocab] (pageable), on the rows scratch: each row's logits the bits the
  // one-row head gives it (enqueue_lm_head). Requires the model's digits head (DevModel::lm_tiles).
  // Synchronises. Not reentrant (callers hold mu).
  void head_rows(const float* x, int64_t ldx, int M, cudaEvent_t ready, float* host);
  uint64_t steps() const { return steps_; }        // steps run (tests: whether the rows path ran)
  uint64_t prefills() const { return prefills_; }  // prefill chunks run
  std::mutex mu;

 private:
  cudaGraphExec_t graph(int M);
  cudaGraphExec_t prefill_graph(int n);
  void check_generation();
  void drop_graphs();

  const DevModel& m_;
  const SeqPool& pool_;
  cudaStream_t stream_ = nullptr;
  DevAlloc mem_;
  RowsScratch sc_;
  int32_t* d_rows_ = nullptr;  // device: row_slot [kMaxRows], row_pos [kMaxRows], prefill tokens [kMaxRows]
  int32_t* h_rows_ = nullptr;  // pinned: row_slot, row_pos, allowed_on, prefill tokens [kMaxRows] each
  SampleResult* h_res_ = nullptr;  // pinned [kMaxRows]
  std::vector<cudaGraphExec_t> graphs_;   // per M
  std::vector<cudaGraphExec_t> pgraphs_;  // prefill chunks, per n
  uint64_t gen_ = 0;                     // pool generation the graphs were captured on
  uint64_t steps_ = 0, prefills_ = 0;
};

}  // namespace lilac::cuda
