// CudaSession's speculative decoding (engine/backend.h's contract; ../shared/MODEL_MTP.md): the MTP head
// (mtp_head.h) fed by the session's steps, draft(), verify(), and snapshots that carry the head's cache.
#include <algorithm>
#include <string>

#include "core/error.h"
#include "cuda/cuda_common.h"
#include "cuda/cuda_session.h"
#include "engine/validate.h"

namespace lilac::cuda {
namespace {

// Whether a verify without penalties samples its rows in one pass (LILAC_VERIFY_ONE_PASS=0: row by row, as
// with penalties; for measurement).
bool verify_one_pass() {
  static const bool on = env_switch_on("LILAC_VERIFY_ONE_PASS");
  return on;
}

// A snapshot taken while the session followed the context with its MTP head: the sequence's state plus
// the head's cache.
struct SpecSnapshot : SessionSnapshot {
  std::shared_ptr<const SessionSnapshot> seq;
  MtpSnapshotData mtp;
  int64_t length() const override { return seq->length(); }
  size_t bytes() const override { return seq->bytes() + mtp.bytes; }
};

}  // namespace

// ------------------------------------------------------------------------------------------------ the head's hooks
void CudaSession::mtp_before_step() {
  if (following_mtp()) mtp_->stage_token(seq_.len, seq_.token, stream_);
}

void CudaSession::mtp_after_step() {
  if (following_mtp()) mtp_->stage_hidden(sc_.h, stream_);
}

void CudaSession::mtp_prefill_rows(const int32_t* tokens, int n, const float* hidden, int64_t ld, cudaStream_t s) {
  if (following_mtp()) mtp_->on_fed(seq_.len, n, tokens, hidden, ld, s);
}

// ------------------------------------------------------------------------------------------------ drafting
void CudaSession::enable_drafting(bool on) {
  if (!m_.mtp || on == drafting_) return;
  drafting_ = on;
  if (on && !mtp_) {
    drafts_ = static_cast<int32_t*>(mem_.get(sizeof(int32_t) * kMaxDrafts));
    mtp_ = std::make_unique<MtpHead>(m_, mem_, seq_.max_len, drafts_);
    mtp_->set_sink(draft_sink_);
    mtp_->set_draft_vocab(draft_vocab_);
  }
  if (on && seq_.len == 0)
    mtp_->reset(true, stream_);
  else if (mtp_)
    mtp_->invalidate();  // enabled over a context it did not follow (or turned off): no drafts until reset()
}

void CudaSession::set_draft_vocab(int64_t n) {
  draft_vocab_ = n;
  if (mtp_) mtp_->set_draft_vocab(n);
}

void CudaSession::set_draft_logits_sink(LogitsSink sink) {
  draft_sink_ = std::move(sink);
  if (mtp_) mtp_->set_sink(draft_sink_);
}

std::vector<int32_t> CudaSession::draft(int k) {
  if (!following_mtp() || !pending_ || mtp_->length() != seq_.len) return {};
  k = int(std::min<int64_t>({int64_t(k), seq_.max_len - seq_.len - 1, int64_t(kMaxDrafts)}));  // verify feeds k + 1
  if (k <= 0) return {};
  last_drafts_ = mtp_->draft(k, seq_.token, stream_);
  return last_drafts_;
}

// ------------------------------------------------------------------------------------------------ verify
// The pending token and the drafts, chosen row by row with the session's sampler while the choice equals
// the next draft: one multi-row step (verify_step.h) where its rows are bit for bit decode steps, else plain
// decode steps (each choice decode_step()'s by construction; they feed the MTP head themselves). A row with no
// choice (sampling.h) is the last: its choice carries the error, after the choices before it (engine/backend.h).
std::vector<TokenChoice> CudaSession::verify(std::span<const int32_t> drafts) {
  settle();
  if (drafts.empty()) return {decode_step()};
  if (!pending_) throw Error("cuda session: verify() without a sampled token");
  const int64_t V = m_.cfg.vocab_size, n = int64_t(drafts.size());
  require(check_token_ids(drafts, V));
  require(check_session_capacity(seq_.len, n + 1, seq_.max_len));  // the pending token and the drafts
  if (rows_verify_ < 0) rows_verify_ = verify_rows_ok(m_) ? 1 : 0;
  if (n <= kMaxVerifyDrafts && !prof_ && !mask_on_ && rows_verify_) return verify_rows(drafts);
  std::vector<TokenChoice> out;
  for (int64_t i = 0; i <= n; ++i) {
    out.push_back(choice_or_error([this] { return decode_step(); }));
    if (out.back().error || i == n || out.back().token != drafts[size_t(i)]) break;
  }
  return out;  // after a row with no choice nothing is pending (decode_step saw to it)
}

// The verify step on the rows kernels: its graph leaves the state as decode steps over the kept rows would
// (GDN committed over them, the pending token, position and logits of the last kept row); the host learns
// how many rows were kept and hands them to the MTP head. A row with no choice is the last the kernel keeps (rows
// 0..m fed, as the decode step that throws there leaves them): its choice carries the error, nothing is pending.
std::vector<TokenChoice> CudaSession::verify_rows(std::span<const int32_t> drafts) {
  const int n = int(drafts.size());
  if (!verify_) {
    verify_ = std::make_unique<VerifyStep>(m_, seq_, sc_, mem_);
    LILAC_CUDA_CHECK(cudaMallocHost(&host_verify_, sizeof(VerifyOut)));
  }
  const int64_t len0 = seq_.len;
  // The head's drafts are still on the device (drafts_ holds what the last draft() returned): no host copy.
  if (drafts.size() <= last_drafts_.size() && std::equal(drafts.begin(), drafts.end(), last_drafts_.begin()))
    LILAC_CUDA_CHECK(cudaMemcpyAsync(verify_->drafts(), drafts_, size_t(n) * 4, cudaMemcpyDeviceToDevice, stream_));
  else
    LILAC_CUDA_CHECK(
        cudaMemcpyAsync(verify_->drafts(), drafts.data(), size_t(n) * 4, cudaMemcpyHostToDevice, stream_));
  verify_->run(n, no_penalties_ && verify_one_pass(), host_verify_, stream_);
  sync();
  const int m = host_verify_->accepted;
  if (m < 0 || m > n) throw Error("cuda verify: accepted count out of range");
  std::vector<TokenChoice> out;
  for (int i = 0; i <= m; ++i) {
    out.push_back(choice_or_error([&] { return to_choice(host_verify_->results[i]); }));
    if (out.back().error) break;
  }
  seq_.len = len0 + m + 1;
  pending_ = !out.back().error;
  ++rows_verifies_;
  if (following_mtp()) {
    mtp_->on_fed(len0, m + 1, verify_->tokens(), verify_->hidden(), m_.cfg.hidden_size, stream_);
    // The head's catch-up over the kept rows now, while the host takes the choices (the next draft() would
    // run it first anyway, after the host's turn; a plain step next would queue behind it either way).
    if (!draft_sink_) mtp_->run_pending(stream_);
  }
  return out;
}

// ------------------------------------------------------------------------------------------------ snapshots
std::shared_ptr<const SessionSnapshot> CudaSession::snapshot() {
  settle();
  auto base = seq_.snapshot(&m_, stream_);
  if (!following_mtp()) return base;
  auto s = std::make_shared<SpecSnapshot>();
  s->seq = std::move(base);
  s->mtp = mtp_->snapshot(stream_);
  return s;
}

void CudaSession::restore(const SessionSnapshot& snap) {
  settle();
  const auto* sp = dynamic_cast<const SpecSnapshot*>(&snap);
  seq_.restore(sp ? *sp->seq : snap, &m_, stream_);
  pending_ = false;
  if (!mtp_ || !drafting_) return;
  if (sp)
    mtp_->restore(sp->mtp, stream_);
  else
    mtp_->invalidate();  // taken without drafting: no drafts for this context
}

}  // namespace lilac::cuda
