// The MTP head on the CPU (../shared/MODEL_MTP.md): the head's forward pass, its own KV cache, and the
// bookkeeping that keeps that cache in step with a session's context; the greedy draft chain.
//
// Positions (§5): the pair (h_t, x_{t+1}) -- main-model hidden at position t after the final norm, and the
// token after it -- is an MTP row at rotary position t, written to MTP cache slot t. The session hands every
// fed row's hidden to on_rows(); a row becomes a pair once the token after it is fed. Pairs are run lazily,
// in multi-row passes: when 64 are waiting (prefill chunks, plain decoding) or when draft() needs them. So
// `committed` lags the context: cache rows [0, committed) hold the pairs of positions 0 .. committed - 1,
// and the hiddens of positions committed .. len - 1 wait in `pending_h` (always at least the last one).
//
// draft(next, len, k) runs the waiting pairs, the last one with the pending token `next` (that row is
// temporary: `next` is only committed once the session feeds it, so the row is redone by the next pass),
// takes d_1 = argmax of its logits, then for j = 2..k the row (g_{j-1}, d_{j-1}) at position len + j - 2
// (temporary cache rows: overwritten later). Rejected drafts therefore never need an MTP rollback.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "core/thread_pool.h"
#include "cpu/attention.h"
#include "engine/backend.h"
#include "model/weights.h"

namespace lilac::cpu {

// The part of the state a session snapshot keeps.
struct MtpData {
  bool valid = false;              // false: the cache is not in step with the context (no drafts)
  int64_t committed = 0;           // cache rows [0, committed) hold the context's pairs
  KvCache cache;                   // in snapshots: exactly `committed` rows
  std::vector<float> pending_h;    // [P, hidden]: hiddens of positions committed .. committed + P - 1
  std::vector<int32_t> pending_x;  // P - 1 tokens: those at positions committed + 1 .. committed + P - 1
  size_t bytes() const {
    return (cache.k.size() + cache.v.size() + pending_h.size()) * sizeof(float) + pending_x.size() * sizeof(int32_t);
  }
};

class MtpHead {
 public:
  // Rows a pending list may hold before they are run without waiting for a draft.
  static constexpr int64_t kFlushRows = 64;

  MtpHead(const ModelWeights& w, ThreadPool* pool, const float* inv_freq, int64_t max_len);
  void set_kv_bf16(bool on) { kv_bf16_ = on; }
  // Receives the logits of every pair row (h_t from the main model, x_{t+1}) at its position t, as the
  // golden `mtp_logits`; draft-chain rows (j >= 2) are not sent. Empty function: off.
  void set_sink(LogitsSink sink) { sink_ = std::move(sink); }

  // Empty context; `valid` = whether to follow it.
  void reset(bool valid);
  // Stop following the context (drafting was enabled late, or a snapshot without MTP data was restored).
  void invalidate();
  bool valid() const { return d_.valid; }

  // The session fed `tokens` at positions pos0 .. pos0 + n - 1; `hidden` [n, hidden] their post-norm hiddens.
  void on_rows(int64_t pos0, std::span<const int32_t> tokens, const float* hidden);
  // Drafts only among token ids < n (n <= 0 or >= the vocabulary: all): a chain row's LM head computes n rows.
  void set_draft_vocab(int64_t n) { draft_vocab_ = Session::draft_rows(n, cfg_.vocab_size); }
  // Up to k drafts after the pending token `next` (context length `len`); empty when not valid.
  std::vector<int32_t> draft(int32_t next, int64_t len, int k);

  MtpData snapshot() const;
  void restore(const MtpData& d);

 private:
  void run_pending_pairs();
  // The head over n rows (h [n, H], x [n]) at positions pos0..: writes the cache, g [n, H] (after mtp.norm);
  // logits of row n - 1 into last_logits when non-null; every row's to the sink when `to_sink`.
  void forward(const float* h, const int32_t* x, int64_t n, int64_t pos0, float* g, float* last_logits, bool to_sink);

  const ModelWeights& w_;
  const ModelConfig& cfg_;
  ThreadPool* pool_;
  const float* inv_freq_;
  int64_t max_len_;
  bool kv_bf16_ = false;
  LogitsSink sink_;
  int64_t draft_vocab_;  // set_draft_vocab's (the constructor: all)
  MtpData d_;
};

}  // namespace lilac::cpu
