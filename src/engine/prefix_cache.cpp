#include "engine/prefix_cache.h"

#include <algorithm>

namespace lilac {

uint64_t PrefixCache::hash_tokens(std::span<const int32_t> t) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the ids
  for (int32_t v : t) {
    h ^= uint32_t(v);
    h *= 1099511628211ull;
  }
  return h;
}

std::list<PrefixCache::Entry>::iterator PrefixCache::find_exact(std::span<const int32_t> prefix, uint64_t h) {
  for (auto it = lru_.begin(); it != lru_.end(); ++it)
    if (it->hash == h && it->tokens.size() == prefix.size() &&
        std::equal(prefix.begin(), prefix.end(), it->tokens.begin()))
      return it;
  return lru_.end();
}

std::optional<PrefixCache::Hit> PrefixCache::lookup(std::span<const int32_t> tokens, int64_t max_length) {
  std::lock_guard lk(mu_);
  auto best = lru_.end();
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    const auto& t = it->tokens;
    if (int64_t(t.size()) > max_length || t.size() > tokens.size()) continue;
    if (best != lru_.end() && t.size() <= best->tokens.size()) continue;
    if (std::equal(t.begin(), t.end(), tokens.begin())) best = it;
  }
  if (best == lru_.end()) return std::nullopt;
  lru_.splice(lru_.begin(), lru_, best);
  return Hit{best->snapshot, int64_t(best->tokens.size())};
}

bool PrefixCache::contains(std::span<const int32_t> prefix) {
  std::lock_guard lk(mu_);
  auto it = find_exact(prefix, hash_tokens(prefix));
  if (it == lru_.end()) return false;
  lru_.splice(lru_.begin(), lru_, it);
  return true;
}

bool PrefixCache::insert(std::span<const int32_t> prefix, std::shared_ptr<const SessionSnapshot> snapshot) {
  if (!snapshot) return false;
  size_t b = snapshot->bytes() + prefix.size() * sizeof(int32_t);
  std::lock_guard lk(mu_);
  uint64_t h = hash_tokens(prefix);
  auto it = find_exact(prefix, h);
  if (it != lru_.end()) {  // replace
    bytes_ -= it->bytes;
    lru_.erase(it);
  }
  if (b > max_bytes_) return false;
  while (!lru_.empty() && bytes_ + b > max_bytes_) {
    bytes_ -= lru_.back().bytes;
    lru_.pop_back();
  }
  lru_.push_front(Entry{std::vector<int32_t>(prefix.begin(), prefix.end()), h, std::move(snapshot), b});
  bytes_ += b;
  return true;
}

void PrefixCache::clear() {
  std::lock_guard lk(mu_);
  lru_.clear();
  bytes_ = 0;
}

size_t PrefixCache::bytes() const {
  std::lock_guard lk(mu_);
  return bytes_;
}

size_t PrefixCache::entries() const {
  std::lock_guard lk(mu_);
  return lru_.size();
}

}  // namespace lilac
