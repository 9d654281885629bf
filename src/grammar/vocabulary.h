// The tokens a constrained decoder chooses from, as a prefix tree of their bytes.
//
// Nodes are numbered in depth-first preorder; node 0 is the root (the empty prefix). Each node's
// children (byte, node) are stored contiguously, so walking the trie with an automaton reads one
// short array per visited node; each shared prefix is visited once, and a dead state prunes a
// whole subtree. Tokens that may never appear inside constrained text (special and
// other added tokens such as <|im_end|>, <tool_call>, <think>, and ids without bytes) are left
// out of the trie; the masks still cover the model's whole vocabulary.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace lilac {
class Tokenizer;
}

namespace lilac::grammar {

class Vocabulary {
 public:
  // tokens[i] = bytes of token i; excluded[i] = never allowed in constrained text. `mask_size` =
  // the number of token ids masks cover (>= tokens.size(); the model's vocabulary may be larger
  // than the tokenizer's), 0 = tokens.size().
  Vocabulary(std::vector<std::string> tokens, std::vector<uint8_t> excluded, int64_t mask_size = 0);
  // Every token of `tok` except the added ones (special or not).
  static std::shared_ptr<const Vocabulary> from_tokenizer(const Tokenizer& tok, int64_t mask_size = 0);

  int64_t mask_size() const { return mask_size_; }
  size_t mask_words() const { return size_t((mask_size_ + 31) / 32); }
  int64_t n_tokens() const { return int64_t(tokens_.size()); }  // ids with bytes (tokenizer vocab)
  size_t token_words() const { return (tokens_.size() + 31) / 32; }
  const std::string& bytes(int32_t t) const { return tokens_[size_t(t)]; }
  bool usable(int32_t t) const { return t >= 0 && size_t(t) < tokens_.size() && !excluded_[size_t(t)]; }

  // Trie.
  struct Child {
    uint32_t node;
    uint8_t byte;
  };
  uint32_t n_nodes() const { return uint32_t(child_off_.size() - 1); }
  std::span<const Child> children(uint32_t n) const {
    return {children_.data() + child_off_[n], children_.data() + child_off_[n + 1]};
  }
  bool has_children(uint32_t n) const { return child_off_[n + 1] > child_off_[n]; }
  // Tokens whose bytes are exactly the path to node n (usually zero or one).
  std::span<const int32_t> tokens_at(uint32_t n) const {
    return {node_tokens_.data() + tok_off_[n], node_tokens_.data() + tok_off_[n + 1]};
  }

 private:
  std::vector<std::string> tokens_;
  std::vector<uint8_t> excluded_;
  int64_t mask_size_;
  std::vector<uint32_t> child_off_;
  std::vector<Child> children_;
  std::vector<uint32_t> tok_off_;
  std::vector<int32_t> node_tokens_;
};

}  // namespace lilac::grammar
