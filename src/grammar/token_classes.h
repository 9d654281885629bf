// What the vocabulary's tokens do when read from one grammar position, computed once per
// (rule, state) and reused for every stack that position appears on.
//
// From a ready frame (rule R at state S) a token either
//  - is read entirely inside R (and the rules R calls): accepted whatever lies below R on the
//    stack ("accepted"; also when R ends exactly at the token's last byte), or
//  - makes R end after some of its bytes, the rest to be read by whatever called R: that depends
//    on the stack, so the class records the trie nodes where R may end (their children are
//    walked from the caller's configuration at mask time: "escapes"), or
//  - is rejected.
// For the huge permissive positions (inside a JSON string almost every token is accepted) the
// accepted set is a bitmask; the few tokens that close the string are escapes. Classes of rules
// with a share key (strings, numbers, whitespace, ...) are shared by every grammar.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "grammar/config_space.h"
#include "grammar/vocabulary.h"

namespace lilac::grammar {

struct TokenClass {
  std::vector<uint32_t> bits;    // accepted tokens as a bitmask (Vocabulary::token_words()), or empty
  std::vector<int32_t> tokens;   // more accepted tokens (a list)
  // Children of the trie nodes after which the rule may have ended, grouped by their byte.
  std::vector<std::pair<Sym, std::vector<uint32_t>>> escapes;

  size_t memory() const;
  void apply(uint32_t* mask) const;  // OR the accepted tokens into a mask
};

// Strings: how every token reads from one substate of the JSON string body (json_string.h).
struct StringProfile {
  std::vector<uint32_t> inside_bits;                  // tokens that stay inside the string
  std::vector<std::pair<int32_t, int32_t>> inside;     // (characters needed, token), by need
  std::vector<std::pair<int32_t, int32_t>> close_end;  // (characters before '"', token) ending at '"'
  std::vector<std::pair<int32_t, uint32_t>> close_nodes;  // (characters before '"', node) with children
};

// `no_lt`: a raw '<' ends the string body as an invalid byte (String rules with no_lt).
std::shared_ptr<const StringProfile> make_string_profile(const Vocabulary& v, jstr::Sub start, bool no_lt = false);

// Class of a String rule body state (k characters so far at substate `sub`), from the profile.
std::shared_ptr<const TokenClass> classify_string(const StringProfile& p, const Vocabulary& v, int64_t min_chars,
                                                  int64_t max_chars, int64_t k);

// Class of (rule, state) by walking the trie with the configuration space (any rule kind).
std::shared_ptr<const TokenClass> classify_walk(ConfigSpace& space, const Vocabulary& v, int32_t rule,
                                                int32_t state);

// A thread-safe store of classes (and string profiles), bounded by memory: when full, it is
// emptied (holders keep their shared_ptrs).
class TokenClassCache {
 public:
  explicit TokenClassCache(size_t budget_bytes) : budget_(budget_bytes) {}
  std::shared_ptr<const TokenClass> find(const std::string& key) const;
  void put(const std::string& key, std::shared_ptr<const TokenClass> c);
  std::shared_ptr<const StringProfile> profile(const Vocabulary& v, jstr::Sub sub, bool no_lt = false);
  size_t memory() const;

 private:
  mutable std::mutex mu_;
  size_t budget_, used_ = 0;
  std::unordered_map<std::string, std::shared_ptr<const TokenClass>> classes_;
  std::shared_ptr<const StringProfile> profiles_[2][jstr::kSubStates];
};

}  // namespace lilac::grammar
