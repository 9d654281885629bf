#include "grammar/vocabulary.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "text/tokenizer.h"

namespace lilac::grammar {

Vocabulary::Vocabulary(std::vector<std::string> tokens, std::vector<uint8_t> excluded, int64_t mask_size)
    : tokens_(std::move(tokens)), excluded_(std::move(excluded)) {
  excluded_.resize(tokens_.size(), 0);
  mask_size_ = mask_size > 0 ? mask_size : int64_t(tokens_.size());
  if (mask_size_ < int64_t(tokens_.size()))
    throw Error("vocabulary: mask size " + std::to_string(mask_size_) + " is smaller than the tokenizer's " +
                std::to_string(tokens_.size()) + " tokens");
  std::vector<int32_t> ids;
  for (size_t i = 0; i < tokens_.size(); ++i) {
    if (tokens_[i].empty()) excluded_[i] = 1;
    if (!excluded_[i]) ids.push_back(int32_t(i));
  }
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    return tokens_[size_t(a)] < tokens_[size_t(b)] || (tokens_[size_t(a)] == tokens_[size_t(b)] && a < b);
  });
  // Build the preorder trie from the sorted strings: each string shares its longest common prefix
  // with the path of the previous one.
  std::vector<uint8_t> byte_{0};
  std::vector<uint32_t> end_{0};
  std::vector<uint32_t> node_of;  // node of each id in `ids` order
  std::vector<uint32_t> path{0};  // path[d] = node at depth d of the current string
  const std::string* prev = nullptr;
  for (int32_t id : ids) {
    const std::string& s = tokens_[size_t(id)];
    size_t lcp = 0;
    if (prev)
      while (lcp < prev->size() && lcp < s.size() && (*prev)[lcp] == s[lcp]) ++lcp;
    while (path.size() > lcp + 1) {
      end_[path.back()] = uint32_t(byte_.size());
      path.pop_back();
    }
    for (size_t d = lcp; d < s.size(); ++d) {
      path.push_back(uint32_t(byte_.size()));
      byte_.push_back(uint8_t(s[d]));
      end_.push_back(0);
    }
    node_of.push_back(path.back());
    prev = &s;
  }
  while (!path.empty()) {
    end_[path.back()] = uint32_t(byte_.size());
    path.pop_back();
  }
  // Children lists (the children of n are n + 1, end(n + 1), ... up to end(n)).
  child_off_.assign(byte_.size() + 1, 0);
  children_.reserve(byte_.size());
  for (uint32_t n = 0; n < byte_.size(); ++n) {
    child_off_[n] = uint32_t(children_.size());
    for (uint32_t c = n + 1; c < end_[n]; c = end_[c]) children_.push_back({c, byte_[c]});
  }
  child_off_[byte_.size()] = uint32_t(children_.size());
  // Tokens per node (node_of is nondecreasing: sorted order creates nodes in preorder).
  tok_off_.assign(byte_.size() + 1, 0);
  for (uint32_t n : node_of) ++tok_off_[n + 1];
  std::partial_sum(tok_off_.begin(), tok_off_.end(), tok_off_.begin());
  node_tokens_ = ids;
}

std::shared_ptr<const Vocabulary> Vocabulary::from_tokenizer(const Tokenizer& tok, int64_t mask_size) {
  const int64_t n = tok.vocab_size();
  std::vector<std::string> tokens(static_cast<size_t>(n));
  std::vector<uint8_t> excluded(static_cast<size_t>(n), 0);
  for (int64_t i = 0; i < n; ++i) {
    tokens[size_t(i)] = tok.token_bytes(int32_t(i));
    excluded[size_t(i)] = tok.is_special(int32_t(i)) || tok.is_added(int32_t(i));
  }
  return std::make_shared<const Vocabulary>(std::move(tokens), std::move(excluded), mask_size);
}

}  // namespace lilac::grammar
