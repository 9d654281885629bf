#include "engine/generator.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "engine/validate.h"
#include "text/detokenizer.h"
#include "text/tokenizer.h"

namespace lilac {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Cancelled: return "cancelled";
  }
  return "stop";
}

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}
}  // namespace

Generator::Generator(Session& session, const Tokenizer& tokenizer, PrefixCache* cache)
    : s_(session), tok_(tokenizer), cache_(cache) {}

// Restore the best starting point and return how many prompt tokens it already holds.
int64_t Generator::prepare(const GenerationRequest& req, GenerationStats& st) {
  const auto& p = req.prompt;
  const int64_t max_reuse = int64_t(p.size()) - 1;  // the last prompt token is always recomputed (logits)
  int64_t start = 0;
  if (context_valid_ && !context_.empty() && int64_t(context_.size()) <= max_reuse &&
      s_.length() == int64_t(context_.size()) && std::equal(context_.begin(), context_.end(), p.begin()))
    start = int64_t(context_.size());
  if (cache_ && req.use_cache) {
    auto hit = cache_->lookup(p, max_reuse);
    if (hit && hit->length > start) {
      try {
        s_.restore(*hit->snapshot);
        start = hit->length;
        st.cache_hit = true;
        context_.assign(p.begin(), p.begin() + start);
        context_valid_ = true;
        return start;
      } catch (const std::exception&) {
        // Unusable snapshot: fall through to a fresh prefill.
        start = 0;
      }
    }
  }
  if (start == 0) {
    s_.reset();
    context_.clear();
  } else {
    st.cache_hit = true;  // continued from the session's own context
  }
  context_valid_ = true;
  return start;
}

GenerationStats Generator::run(const GenerationRequest& req, const TokenCallback& on_token,
                               const std::atomic<bool>* cancel) {
  GenerationStats st;
  const auto& p = req.prompt;
  require(check_context(int64_t(p.size()), req.max_tokens, s_.max_length()));
  st.prompt_tokens = int64_t(p.size());
  auto is_cancelled = [&] { return cancel && cancel->load(std::memory_order_relaxed); };
  const auto t0 = Clock::now();
  try {
    int64_t pos = prepare(req, st);
    st.cached_tokens = pos;
    // Segment ends: message boundaries after the cached part, and the end of the prompt.
    std::vector<int64_t> ends;
    if (req.boundary_token >= 0)
      for (int64_t i = pos; i + 1 < int64_t(p.size()); ++i)
        if (p[i] == req.boundary_token) ends.push_back(i + 1);
    ends.push_back(int64_t(p.size()));
    const int64_t chunk = std::max<int64_t>(1, req.prefill_chunk);
    for (int64_t end : ends) {
      while (pos < end) {
        if (is_cancelled()) {
          context_valid_ = false;
          st.finish = FinishReason::Cancelled;
          st.prefill_seconds = seconds_since(t0);
          return st;
        }
        int64_t n = std::min(chunk, end - pos);
        context_valid_ = false;  // in case prefill throws half-way
        s_.prefill(std::span<const int32_t>(p.data() + pos, size_t(n)));
        context_.insert(context_.end(), p.begin() + pos, p.begin() + pos + n);
        context_valid_ = true;
        pos += n;
      }
      if (cache_ && req.use_cache) {
        std::span<const int32_t> prefix(p.data(), size_t(end));
        if (!cache_->contains(prefix)) {
          cache_->insert(prefix, s_.snapshot());
          ++st.snapshots_taken;
        }
      }
    }
    st.prefill_seconds = seconds_since(t0);

    const auto t1 = Clock::now();
    s_.begin_generation(req.sampling, p);
    StreamDetokenizer detok(tok_, req.stop_strings, false);
    TokenChoice t = s_.sample();
    st.ttft_seconds = seconds_since(t0);
    st.completion_tokens = 1;
    for (;;) {
      if (is_cancelled()) {
        st.finish = FinishReason::Cancelled;
        break;
      }
      if (std::find(req.stop_ids.begin(), req.stop_ids.end(), t.token) != req.stop_ids.end()) {
        st.finish = FinishReason::Stop;
        st.stopped_by_eos = true;
        break;
      }
      GeneratedToken g;
      g.id = t.token;
      g.text = detok.push(t.token);
      g.choice = std::move(t);
      if (!on_token(g)) {
        st.finish = FinishReason::Cancelled;
        break;
      }
      if (detok.stopped()) {
        st.finish = FinishReason::Stop;
        st.stop_string = detok.matched_stop();
        break;
      }
      if (st.completion_tokens >= req.max_tokens) {
        st.finish = FinishReason::Length;
        break;
      }
      context_valid_ = false;
      int32_t fed = g.id;
      t = s_.decode_step();
      context_.push_back(fed);
      context_valid_ = true;
      ++st.completion_tokens;
    }
    if (st.finish != FinishReason::Cancelled && !detok.stopped()) {
      GeneratedToken g;
      g.text = detok.finish();
      if (!g.text.empty()) on_token(g);
    }
    st.decode_seconds = seconds_since(t1);
  } catch (...) {
    context_valid_ = false;
    context_.clear();
    try {
      s_.reset();
    } catch (...) {
    }
    throw;
  }
  return st;
}

}  // namespace lilac
