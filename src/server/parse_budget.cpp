#include "server/parse_budget.h"

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <chrono>
#include <string>

#include "server/api_error.h"

namespace lilac::server {

void ParseBudget::Lease::release() {
  if (b_) std::exchange(b_, nullptr)->give_back(n_);
}

void ParseBudget::give_back(size_t n) {
  {
    std::lock_guard lk(mu_);
    held_ -= n;
  }
  cv_.notify_all();  // (every waiter: the one to go is the first waiting, whichever a notify_one would wake)
#ifdef __GLIBC__
  // A large body's values were freed in the arena of the thread that read it, and glibc keeps freed memory in each
  // arena (a worker thread is one, up to 8 per core): without this, bodies read one after the other by different
  // workers left resident memory growing to one body's peak per arena, whatever the budget (16 bodies of 6 MB sent at
  // once to `lilac serve`, read 2 at a time: 2.0 GB resident at the peak, 1.0 GB with it).
  if (n >= kTrimBytes) malloc_trim(0);
#endif
}

void ParseBudget::refuse_locked(int busy_status) {
  ++refused_;
  const bool whole_mib = cap_ > 0 && cap_ % (size_t(1) << 20) == 0;
  ApiError e(busy_status,
             "The server is busy reading other request bodies (" +
                 (whole_mib ? std::to_string(cap_ >> 20) + " MiB" : std::to_string(cap_) + " bytes") +
                 " of them are parsed at once, --parse-mb); retry shortly.",
             "", "server_busy");
  e.retry_after_s = 1;
  throw e;
}

ParseBudget::Lease ParseBudget::acquire(size_t bytes, int busy_status) {
  std::unique_lock lk(mu_);
  if (!waiting_.empty() || !fits_locked(bytes)) {
    // (the bodies waiting hold their text: as many bytes as the budget at most, or one body alone)
    if (!waiting_.empty() && waiting_bytes_ + bytes > cap_) refuse_locked(busy_status);
    const auto me = waiting_.insert(waiting_.end(), bytes);
    waiting_bytes_ += bytes;
    const bool room = cv_.wait_for(lk, std::chrono::milliseconds(wait_ms_),
                                   [&] { return me == waiting_.begin() && fits_locked(bytes); });
    waiting_.erase(me);
    waiting_bytes_ -= bytes;
    // The next body is first now: it may fit beside this one, or in the room this one leaves.
    if (!waiting_.empty()) cv_.notify_all();
    if (!room) refuse_locked(busy_status);
  }
  held_ += bytes;
  return Lease(this, bytes);
}

std::optional<ParseBudget::Lease> ParseBudget::try_acquire(size_t bytes) {
  std::lock_guard lk(mu_);
  if (!waiting_.empty() || !fits_locked(bytes)) return std::nullopt;
  held_ += bytes;
  return Lease(this, bytes);
}

ParseBudget::Stats ParseBudget::stats() const {
  std::lock_guard lk(mu_);
  return Stats{int64_t(held_), int64_t(waiting_.size()), int64_t(waiting_bytes_), refused_};
}

}  // namespace lilac::server
