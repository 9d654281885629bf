// Speculative verification of one sequence on the rows step (rows_step.h): the pending token and n drafts
// as one step of M = n + 1 rows at positions len .. len + n, captured once per n as a CUDA graph:
//   prep (row 0's token = the pending token, row_pos[i] = *pos + i) → the rows step's body and head with
//   Gated DeltaNet in Log mode (the recurrent and conv states stay as they were; each row's inputs are
//   logged) → for rows i = 0..n in order, sample_token on row i's logits with the sequence's sampler (the
//   very kernel decode_step() runs: penalties count the rows before it, params.step gives row i the random
//   draw decode_step() would make) — or, for a sequence without penalties (`one_pass`), the same sampler
//   over all rows at once (rows::sample_rows, one_sequence: row i at params.step + i) → accept: m = the
//   first i < n whose choice differs from draft i or that has no choice (else n); the penalty counts and the
//   step cover rows 0..m only; the pending token = choice m; *pos += m + 1
//   → the logits of row m become the sequence's current logits. Then, on a stream of its own and so off the
//   path to the host's results (and to the MTP head's next drafts, which do not read the GDN state),
//   gdn_commit_rows(keep = m + 1) advances every GDN layer's state over the kept rows; join() orders the
//   sequence's next work that reads or writes its state after it.
// Every row's logits are bit for bit decode_step()'s for that token when verify_rows_ok() holds
// (rows_step_exact: the rows kernels compute the single-row kernels' arithmetic per row); the attention KV
// rows past len + m need no rollback (never read before they are overwritten).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "cuda/decode_step.h"
#include "cuda/device_model.h"
#include "cuda/kernels/sampling/sampling.h"
#include "cuda/seq_state.h"

namespace lilac::cuda {

constexpr int kMaxVerifyDrafts = 16;  // drafts one verify step takes (more: plain decode steps)

// Whether the model's verify rows are bit for bit decode steps (rows_step_supported + rows_step_exact);
// where not, the session verifies by plain decode steps (exact, without the speed).
bool verify_rows_ok(const DevModel& m);

// What a verify step returns to the host (pinned memory).
struct VerifyOut {
  int32_t accepted = 0;
  SampleResult results[kMaxVerifyDrafts + 1];
};

class VerifyStep {
 public:
  // For the sequence `st` (its capacity fixes the attention split count, as decode_step's); `dsc`: the
  // session's decode scratch (its sampling scratch is shared: the two never run at once). Allocates from
  // `mem` (the rows scratch for kMaxVerifyDrafts + 1 rows and the GDN logs).
  VerifyStep(const DevModel& m, const SeqState& st, const DecodeScratch& dsc, DevAlloc& mem);
  ~VerifyStep();
  VerifyStep(const VerifyStep&) = delete;
  VerifyStep& operator=(const VerifyStep&) = delete;

  // Device int32 [kMaxVerifyDrafts]: where the drafts go before run().
  int32_t* drafts() const;
  // Enqueues the step for n drafts (1 <= n <= kMaxVerifyDrafts) and the copy of its results into `out`
  // (pinned host memory) on s, the GDN commit on the side stream; the caller synchronises s, and calls
  // join() before anything else reads or writes the sequence's state. one_pass: the sequence's sampling
  // has no penalties (presence, frequency, repetition), so its rows are sampled in one pass.
  void run(int n, bool one_pass, VerifyOut* out, cudaStream_t s);
  // Makes s wait for the last run()'s GDN commit (no-op when none is owed).
  void join(cudaStream_t s);
  // After run(): the rows' tokens (device [n + 1]) and their hiddens (device [n + 1][hidden], the residual
  // stream after the last layer), for the MTP head.
  const int32_t* tokens() const;
  const float* hidden() const;
  // The sequence's state moved (its pool grew, after a device synchronisation; `st` now holds the new
  // views): drops the graphs, which hold the old ones.
  void rebind();

 private:
  struct Impl;
  std::unique_ptr<Impl> p_;
};

}  // namespace lilac::cuda
