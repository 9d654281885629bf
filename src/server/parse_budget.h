// The request bodies being parsed and prepared at once, all requests together (`serve --parse-mb`).
//
// A request's body is read into JSON values (server/request_json.h), then its adapter copies what it needs into a
// GenerationSpec, the template renders it and the tokenizer encodes it: meanwhile it takes many times its size (~63
// times in the worst shape measured end to end: 392 MB of heap for a 6.2 MB Responses body of 200,000 one-letter input
// items until its 400; ~20 times for the JSON values alone), and up to --http-threads requests (96 by default) are
// answered at once, besides the Message Batches' runners (16 such bodies at once took `lilac serve` to 6.5 GB
// resident). Every JSON route takes a Lease for its body's bytes before it parses and keeps it until it no longer holds
// the body's values (a generation: until it is queued; other routes: until answered), so the bytes being parsed and
// prepared at once stay within the budget and the memory they take within ~63 times it. A body that does not fit waits
// for room (up to `wait_ms`); one larger than the whole budget gets it when nothing else holds any (so any body the
// HTTP layer takes can be answered).
//
// A body waiting for room holds its text meanwhile (its worker's request), and nothing else bounded those: up to every
// worker's, 8 MB each (~800 MB by default). The bodies waiting are bounded by the same number of bytes: one that would
// take them past it is refused at once, as one that found no room in time (unless none waits: a body larger than the
// budget can always wait its turn). So the text of the bodies parsed or waiting stays within twice the budget (one
// larger body counting alone), and what waits is text, not the ~63 times it takes while parsed.
//
// The bodies waiting are admitted in arrival order: a body gets its room once every body that came before it has got
// its own (or given up) and it fits; a later body, even one that would fit now, waits behind them (try_acquire: no
// room). A body that fitted used to go ahead of those waiting, so under a steady flow of small bodies a large one (one
// larger than the budget waits for nothing else to hold any) could wait until it was refused after its wait_ms. The
// price: the bodies behind a large one wait until it fits too (its wait_ms at most).
//
// While it is received, a body counts against another budget, not this one: `serve --receive-mb` (256 MiB by default;
// HttpServerOptions::max_buffered_body_bytes), where a Content-Length is reserved when the headers are in. How long a
// body is received is its client's choice (up to --body-timeout-s), so that budget must be larger than the bodies any
// few clients may declare: two connections declaring 8 MB and sending nothing would fill this one's 16 MiB for a
// minute.
//
// Before its parse, a request waits for a worker when every worker is busy (ServerOptions::max_pending of them at most,
// 32 by default, each up to --max-body-mb: ~256 MB of text): the HTTP layer bounds the bytes of their bodies by the
// same capacity (HttpServerOptions::max_pending_body_bytes, set from parse_bytes in server.cpp), a request that would
// take them past it refused at once with the full queue's server_busy (503; 529 on Anthropic's routes, from
// RouteOptions::busy_status; in the route's error shape, Retry-After 1), unless no waiting request holds any body.
//
// After its parse, a generation's text is freed (serve_generation takes the body out of its worker's request, which
// kept it until the answer was sent: a streamed generation held its up-to-8 MB body for as long as it ran), so a
// running generation holds neither its body's text nor its values. The other routes (count_tokens, the tokenizer's, the
// Conversations', the Message Batches create) keep their request until answered, right after their parse.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <utility>

namespace lilac::server {

class ParseBudget {
 public:
  ParseBudget(size_t bytes, int wait_ms) : cap_(bytes), wait_ms_(wait_ms) {}
  ParseBudget(const ParseBudget&) = delete;
  ParseBudget& operator=(const ParseBudget&) = delete;

  // A body's share of the budget, given back when the lease ends (or release()).
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& o) noexcept : b_(std::exchange(o.b_, nullptr)), n_(o.n_) {}
    Lease& operator=(Lease&& o) noexcept {
      if (this != &o) {
        release();
        b_ = std::exchange(o.b_, nullptr);
        n_ = o.n_;
      }
      return *this;
    }
    ~Lease() { release(); }
    void release();

   private:
    friend class ParseBudget;
    Lease(ParseBudget* b, size_t n) : b_(b), n_(n) {}
    ParseBudget* b_ = nullptr;
    size_t n_ = 0;
  };

  // Room for a body of `bytes`, waiting up to wait_ms for it. Throws ApiError `busy_status` (503 on OpenAI's routes,
  // 529 on Anthropic's: overloaded_error), code "server_busy", with Retry-After 1, when none came.
  Lease acquire(size_t bytes, int busy_status = 503);
  // The same without waiting: nullopt when there is no room now or a body waits for it (the Message Batches' runner
  // tries again later).
  std::optional<Lease> try_acquire(size_t bytes);

  struct Stats {
    int64_t held = 0;           // bytes of the bodies holding a lease
    int64_t waiting = 0;        // requests waiting for room
    int64_t waiting_bytes = 0;  // bytes of their bodies
    int64_t refused = 0;        // requests refused for lack of room (total)
  };
  Stats stats() const;
  size_t capacity() const { return cap_; }

 private:
  // A lease of at least this many bytes gives the memory freed back to the system as it ends (malloc_trim).
  static constexpr size_t kTrimBytes = size_t(1) << 20;

  bool fits_locked(size_t n) const { return held_ == 0 || held_ + n <= cap_; }
  void give_back(size_t n);
  // Counts the refusal and throws the busy error (see acquire).
  [[noreturn]] void refuse_locked(int busy_status);

  const size_t cap_;
  const int wait_ms_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  size_t held_ = 0, waiting_bytes_ = 0;
  std::list<size_t> waiting_;  // the sizes of the bodies waiting for room, first come first
  int64_t refused_ = 0;
};

}  // namespace lilac::server
