// Streaming detokenizer.
//
// Behaviour choices:
// - Bytes are decoded as they arrive; a valid but incomplete UTF-8 tail waits for the next token,
//   bytes that can never become valid UTF-8 are replaced by U+FFFD at once (maximal subparts).
// - Stop strings: after each token, the earliest-starting occurrence of any stop string in the
//   not-yet-emitted text stops generation; the text before it is returned, nothing after.
//   Text is held back from the earliest position whose suffix is a proper prefix of a stop string.
//   Empty stop strings are ignored; stop strings that are not valid UTF-8 are sanitized (U+FFFD),
//   so a match never ends inside a character and every chunk returned is valid UTF-8.
#include "text/detokenizer.h"

#include <algorithm>

#include "text/unicode.h"

namespace lilac {

StreamDetokenizer::StreamDetokenizer(const Tokenizer& tok, std::vector<std::string> stop_strings, bool skip_special)
    : tok_(tok), skip_special_(skip_special) {
  for (auto& s : stop_strings)
    if (!s.empty()) stops_.push_back(unicode::sanitize_utf8(s));
}

namespace {

// Moves the decodable part of `pending` into `out`: complete characters as-is, impossible
// sequences as U+FFFD; keeps a valid incomplete tail in `pending` (unless `flush`).
void drain_utf8(std::string& pending, std::string& out, bool flush) {
  size_t i = 0;
  while (i < pending.size()) {
    const auto d = unicode::decode_utf8(pending, i);
    if (d.status == unicode::Decoded::Ok) {
      out.append(pending, i, d.len);
    } else if (d.status == unicode::Decoded::Incomplete && !flush) {
      break;
    } else {
      out.append("\xEF\xBF\xBD");
    }
    i += d.len;
  }
  pending.erase(0, i);
}

}  // namespace

// Returns the text to emit now from held_, handling stop strings. `final`: nothing more will come.
static std::string release(std::string& held, const std::vector<std::string>& stops, bool final, bool& stopped,
                           std::string& matched) {
  // Earliest complete match.
  size_t best = std::string::npos;
  const std::string* best_stop = nullptr;
  for (const auto& s : stops) {
    const size_t p = held.find(s);
    if (p != std::string::npos && (p < best || (p == best && s.size() > best_stop->size()))) {
      best = p;
      best_stop = &s;
    }
  }
  if (best_stop) {
    std::string out = held.substr(0, best);
    stopped = true;
    matched = *best_stop;
    held.clear();
    return out;
  }
  if (final || stops.empty()) {
    std::string out;
    out.swap(held);
    return out;
  }
  // Hold back from the earliest position whose suffix is a proper prefix of some stop string.
  size_t keep_from = held.size();
  for (const auto& s : stops) {
    const size_t maxlen = std::min(s.size() - 1, held.size());
    for (size_t len = maxlen; len > 0; --len) {
      if (held.size() - len >= keep_from) break;  // cannot improve on what we already hold
      if (held.compare(held.size() - len, len, s, 0, len) == 0) {
        keep_from = held.size() - len;
        break;
      }
    }
  }
  std::string out = held.substr(0, keep_from);
  held.erase(0, keep_from);
  return out;
}

std::string StreamDetokenizer::push(int32_t id) {
  if (stopped_) return {};
  if (skip_special_ && tok_.is_special(id)) return {};
  pending_bytes_ += tok_.token_bytes(id);
  drain_utf8(pending_bytes_, held_, /*flush=*/false);
  return release(held_, stops_, /*final=*/false, stopped_, matched_);
}

std::string StreamDetokenizer::finish() {
  if (stopped_) return {};
  drain_utf8(pending_bytes_, held_, /*flush=*/true);
  return release(held_, stops_, /*final=*/true, stopped_, matched_);
}

}  // namespace lilac
