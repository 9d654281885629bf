#include "server/response_store.h"

namespace lilac::server {

void ResponseStore::put(const std::string& id, Entry e) {
  const size_t bytes = e.items.dump().size() + e.response.dump().size() + id.size();
  if (bytes > max_bytes_ || max_entries_ == 0) return;
  std::lock_guard lk(mu_);
  if (auto it = by_id_.find(id); it != by_id_.end()) {  // a replaced entry leaves the order too
    bytes_ -= it->second.bytes;
    by_id_.erase(it);
    std::erase(order_, id);
  }
  while (!by_id_.empty() && (by_id_.size() >= max_entries_ || bytes_ + bytes > max_bytes_)) drop_oldest_locked();
  by_id_[id] = Held{std::move(e), bytes};
  bytes_ += bytes;
  order_.push_back(id);
}

void ResponseStore::drop_oldest_locked() {
  while (!order_.empty()) {
    const std::string id = std::move(order_.front());
    order_.pop_front();
    auto it = by_id_.find(id);
    if (it == by_id_.end()) continue;  // erased already
    bytes_ -= it->second.bytes;
    by_id_.erase(it);
    return;
  }
}

std::optional<ResponseStore::Entry> ResponseStore::get(const std::string& id) const {
  std::lock_guard lk(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return std::nullopt;
  return it->second.entry;
}

bool ResponseStore::contains(const std::string& id) const {
  std::lock_guard lk(mu_);
  return by_id_.count(id) != 0;
}

bool ResponseStore::erase(const std::string& id) {
  std::lock_guard lk(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return false;
  bytes_ -= it->second.bytes;
  by_id_.erase(it);
  return true;
}

size_t ResponseStore::size() const {
  std::lock_guard lk(mu_);
  return by_id_.size();
}

size_t ResponseStore::bytes() const {
  std::lock_guard lk(mu_);
  return bytes_;
}

}  // namespace lilac::server
