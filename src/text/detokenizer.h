// Streaming detokenizer: turns ids into text as they arrive, never splitting a UTF-8 character,
// and holding back text that could be the start of a stop string until it is ruled out.
// Every returned chunk is valid UTF-8: bytes that can never complete a character become U+FFFD at
// once, an incomplete tail waits for the next token. Stop strings: after each token, the
// earliest-starting complete match in the text not yet emitted stops the stream (ties: the longest
// stop string). Empty stop strings are ignored. Unknown ids decode to nothing.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace lilac {

class StreamDetokenizer {
 public:
  StreamDetokenizer(const Tokenizer& tok, std::vector<std::string> stop_strings = {},
                    bool skip_special = false);
  // Feed one token; returns the text that is now safe to emit (possibly empty).
  std::string push(int32_t id);
  // True once a stop string was seen (the text before it has been emitted; nothing after).
  bool stopped() const { return stopped_; }
  // The stop string that matched (when stopped()).
  const std::string& matched_stop() const { return matched_; }
  // End of generation: emit whatever is held back (incomplete UTF-8 becomes U+FFFD).
  std::string finish();

 private:
  const Tokenizer& tok_;
  std::vector<std::string> stops_;
  bool skip_special_;
  std::string pending_bytes_;  // incomplete UTF-8 tail
  std::string held_;           // complete text held back for stop-string matching
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace lilac
