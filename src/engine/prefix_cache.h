// Prefix cache: session snapshots keyed by the exact token prefix they hold, LRU-evicted within a
// byte budget (SessionSnapshot::bytes()). The recurrent state cannot be rewound, so a request can only
// resume from a snapshot taken exactly at some prefix of its prompt; the generator takes them only where a later
// prompt holding that prefix may resume bit for bit (exact_resume_point, generator.h): after message boundaries
// and at the last piece boundary of a prompt. Thread-safe.
#pragma once
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "engine/backend.h"

namespace lilac {

class PrefixCache {
 public:
  explicit PrefixCache(size_t max_bytes) : max_bytes_(max_bytes) {}

  struct Hit {
    std::shared_ptr<const SessionSnapshot> snapshot;
    int64_t length = 0;  // tokens the snapshot holds (a prefix of the lookup's tokens)
  };
  // The longest cached prefix of `tokens` no longer than `max_length` tokens (marks it recently used).
  std::optional<Hit> lookup(std::span<const int32_t> tokens, int64_t max_length);
  // True when exactly this prefix is cached (marks it recently used).
  bool contains(std::span<const int32_t> prefix);
  // Store a snapshot of the session holding exactly `prefix`; evicts least recently used entries to
  // stay within the budget. A snapshot larger than the whole budget is not stored (returns false).
  bool insert(std::span<const int32_t> prefix, std::shared_ptr<const SessionSnapshot> snapshot);
  void clear();

  size_t bytes() const;
  size_t entries() const;
  size_t max_bytes() const { return max_bytes_; }

 private:
  struct Entry {
    std::vector<int32_t> tokens;
    uint64_t hash = 0;
    std::shared_ptr<const SessionSnapshot> snapshot;
    size_t bytes = 0;
  };
  static uint64_t hash_tokens(std::span<const int32_t> t);
  std::list<Entry>::iterator find_exact(std::span<const int32_t> prefix, uint64_t h);

  mutable std::mutex mu_;
  size_t max_bytes_;
  size_t bytes_ = 0;
  std::list<Entry> lru_;  // most recently used first
};

}  // namespace lilac
