#include "server/conversation_store.h"

namespace lilac::server {

size_t ConversationStore::bytes_of(const Conversation& c) {
  return c.id.size() + c.metadata.dump().size() + c.items.dump().size() + 64;
}

void ConversationStore::drop_lru_locked() {
  if (lru_.empty()) return;
  auto it = by_id_.find(lru_.front());
  lru_.pop_front();
  if (it == by_id_.end()) return;
  bytes_ -= it->second.bytes;
  by_id_.erase(it);
}

bool ConversationStore::put(Conversation c) {
  const size_t b = bytes_of(c);
  if (b > max_bytes_ || max_ == 0) return false;
  std::lock_guard lk(mu_);
  if (auto it = by_id_.find(c.id); it != by_id_.end()) {
    bytes_ -= it->second.bytes;
    lru_.erase(it->second.lru);
    by_id_.erase(it);
  }
  while (!by_id_.empty() && (by_id_.size() >= max_ || bytes_ + b > max_bytes_)) drop_lru_locked();
  const std::string id = c.id;
  lru_.push_back(id);
  by_id_[id] = Held{std::move(c), b, std::prev(lru_.end())};
  bytes_ += b;
  return true;
}

std::optional<ConversationStore::Conversation> ConversationStore::get(const std::string& id) {
  std::lock_guard lk(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return std::nullopt;
  lru_.splice(lru_.end(), lru_, it->second.lru);
  return it->second.c;
}

bool ConversationStore::contains(const std::string& id) const {
  std::lock_guard lk(mu_);
  return by_id_.count(id) != 0;
}

bool ConversationStore::erase(const std::string& id) {
  std::lock_guard lk(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return false;
  bytes_ -= it->second.bytes;
  lru_.erase(it->second.lru);
  by_id_.erase(it);
  return true;
}

bool ConversationStore::update(const std::string& id, const std::function<void(Conversation&)>& f) {
  std::lock_guard lk(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return false;
  Conversation c = it->second.c;
  f(c);
  const size_t b = bytes_of(c);
  if (b > max_bytes_) return false;
  bytes_ -= it->second.bytes;
  it->second.c = std::move(c);
  it->second.bytes = b;
  bytes_ += b;
  lru_.splice(lru_.end(), lru_, it->second.lru);
  while (bytes_ > max_bytes_ && lru_.front() != id) drop_lru_locked();
  return true;
}

size_t ConversationStore::size() const {
  std::lock_guard lk(mu_);
  return by_id_.size();
}

}  // namespace lilac::server
