// The MTP head on the device (../shared/MODEL_MTP.md §4-5): its own bf16 KV cache, the bookkeeping that
// keeps that cache in step with a session's context, and the greedy draft chain. Built from the decode
// kernels (single row: the head is fc + one attention layer with its MoE + mtp.norm + the LM head), each
// forward captured once as a CUDA graph.
//
// Positions (§5): the pair (h_t, x_{t+1}) -- the main model's hidden at position t and the token after it --
// is an MTP row at rotary position t, in MTP cache row t. The session hands every fed row to the head: its
// token and its hidden (the residual stream after the last layer, before the final norm: the head applies
// the final norm itself) go into a ring indexed by position (kMtpRing rows). A row becomes a pair once the
// token after it is fed; pairs run lazily ("catch-up") when draft() needs them, before a snapshot, or when the
// ring is full: up to kCatchRows at a time as one step of the multi-row kernels where those are bit for bit the
// one-row kernels (the real model's shapes: rows_step.h), else one graph launch each. So `committed` (rows [0, committed) of the cache hold the
// context's pairs; also *mpos on the device) lags `length` (positions fed) by at least one.
//
// draft(k) runs the waiting pairs, then one graph per k: the row (h_{len-1}, pending token) at position
// len - 1, d_1 = argmax of its logits, then for j = 2..k the row (g_{j-1}, d_{j-1}) at position len + j - 2,
// g = RMSNorm(u; mtp.norm) of the previous row. These rows are temporary: the pending row is redone by the
// next catch-up once its token is fed, the chain rows are overwritten; rejected drafts never need an MTP
// rollback. The drafts stay on the device (`drafts` given at construction) for the verify step.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "cuda/decode_step.h"
#include "cuda/device_model.h"
#include "engine/backend.h"

namespace lilac::cuda {

constexpr int kMtpRing = 128;    // fed rows the head can hold before they must run
constexpr int kMaxDrafts = 16;   // drafts per draft() (the CLI's --spec-tokens limit)
constexpr int kCatchRows = 64;   // catch-up rows per multi-row step (a power of two >= 8)

// The head's part of a session snapshot (taken after the waiting pairs ran: only the last fed row waits).
struct MtpSnapshotData {
  bool valid = false;
  int64_t committed = 0;  // cache rows held; the context length is committed + 1 (or 0)
  std::shared_ptr<DevAlloc> mem;
  const void* kv = nullptr;      // K rows then V rows [0, committed)
  const float* hidden = nullptr;  // the last fed row's hidden [hidden_size] (null when the context is empty)
  size_t bytes = 0;
};

class MtpHead {
 public:
  // `drafts`: device int32 [kMaxDrafts] where draft() leaves its tokens. Allocates from `mem`.
  MtpHead(const DevModel& m, DevAlloc& mem, int64_t max_len, int32_t* drafts);
  ~MtpHead();
  MtpHead(const MtpHead&) = delete;
  MtpHead& operator=(const MtpHead&) = delete;

  // Receives the logits of every pair row computed from the main model's hiddens (catch-up rows and each
  // draft's first row), as the golden `mtp_logits` row t. Empty function: off.
  void set_sink(LogitsSink sink);
  // Drafts only among token ids < n (n <= 0 or >= the vocabulary: all): the draft rows' LM head computes the
  // first n rows of the matrix (all while a sink is set, which receives whole rows). Session::set_draft_vocab.
  void set_draft_vocab(int64_t n);

  // Empty context; `valid` = whether to follow it. Synchronises.
  void reset(bool valid, cudaStream_t s);
  void invalidate() { valid_ = false; }
  bool valid() const { return valid_; }
  int64_t length() const { return len_; }        // positions fed
  int64_t committed() const { return committed_; }
  int64_t rows_catchups() const { return rows_catchups_; }  // catch-up rows run on the multi-row kernels so far

  // The session fed n rows at positions pos0 .. pos0 + n - 1: tokens (device [n]) and hiddens (device
  // [n][hidden], row stride `ld` floats). Enqueues copies into the ring (running waiting pairs first when it
  // would overflow). A position other than length() invalidates the head.
  void on_fed(int64_t pos0, int64_t n, const int32_t* tokens, const float* hidden, int64_t ld, cudaStream_t s);
  // One decode step feeds the token at *token (read before the step: the step's sampling overwrites it) at
  // position pos, then its hidden (after the step): stage_token before the step, stage_hidden after.
  void stage_token(int64_t pos, const int32_t* token, cudaStream_t s);
  void stage_hidden(const float* hidden, cudaStream_t s);

  // Up to k (<= kMaxDrafts) drafts after the pending token (device `pending`, the session's token slot),
  // for a context of length() tokens (the caller checks that it is the session's). Synchronises; the drafts
  // are also left in `drafts` (the draft graphs are captured again when `pending` moves).
  std::vector<int32_t> draft(int k, const int32_t* pending, cudaStream_t s);

  // Runs the waiting pairs (all fed rows but the last). Asynchronous unless a sink is set.
  void run_pending(cudaStream_t s);

  MtpSnapshotData snapshot(cudaStream_t s);                     // synchronises
  void restore(const MtpSnapshotData& d, cudaStream_t s);        // synchronises

 private:
  struct Graphs;
  struct Rows;
  static bool rows_wanted(const DevModel& m);
  void alloc_rows(DevAlloc& mem);
  void enqueue_row(int mode, const int32_t* token, float* logits, int32_t* draft_out, cudaStream_t s);
  void enqueue_catchup_rows(int n, cudaStream_t s);
  void launch(cudaGraphExec_t g, cudaStream_t s);
  void drop_draft_graphs();  // the draft chains' graphs, captured again at the next draft()

  const DevModel& m_;
  const DevMtp& h_;
  int64_t max_len_;
  __nv_bfloat16 *k_ = nullptr, *v_ = nullptr;  // the head's KV cache [max_len][kv_row]
  float* ring_h_ = nullptr;                    // [kMtpRing][hidden]
  int32_t* ring_x_ = nullptr;                  // [kMtpRing]
  int32_t* mpos_ = nullptr;                    // device: committed (the next pair row's position)
  int32_t* dpos_ = nullptr;                    // device: the position of the row being computed
  float* cat_ = nullptr;                       // [2 hidden]: the fc input
  float* logits_ = nullptr;                    // [kMaxDrafts][vocab]: row j of draft(), row 0 of a catch-up row
  void* argmax_scratch_ = nullptr;
  int32_t* drafts_ = nullptr;
  int32_t* host_drafts_ = nullptr;             // pinned [kMaxDrafts]
  DecodeScratch sc_;                           // the layer's activations; sc_.h is the head's residual u
  std::unique_ptr<Graphs> g_;
  std::unique_ptr<Rows> rows_;                 // the multi-row catch-up's scratch (null: one row at a time)
  LogitsSink sink_;
  int64_t draft_vocab_ = 0;  // token ids the drafts choose among (set_draft_vocab; the constructor: all)
  bool valid_ = false, staged_ = false;
  int64_t len_ = 0, committed_ = 0;
  int64_t rows_catchups_ = 0;
};

}  // namespace lilac::cuda
