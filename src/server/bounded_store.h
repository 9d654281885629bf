// Values kept by id in this process's memory, bounded by count and bytes, gone at restart: the store behind the
// Responses API's stored responses and OpenAI's Conversations. When a new value does not fit, the first entries of
// the order leave until it does. The order is insertion order (kTouchOnUse false), or use order (true: get() and
// update() move an entry to the end, so the least recently used leaves first). Thread-safe.
#pragma once
#include <cstddef>
#include <functional>
#include <iterator>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

namespace lilac::server {

template <class V, bool kTouchOnUse>
class BoundedStore {
 public:
  using BytesOf = size_t (*)(const std::string& id, const V& v);  // what an entry is counted as

  BoundedStore(size_t max_entries, size_t max_bytes, BytesOf bytes_of)
      : max_entries_(max_entries), max_bytes_(max_bytes), bytes_of_(bytes_of) {}

  // Keeps `v` under `id` (replacing what it held), dropping the first of the order as needed; false when `v` alone is
  // larger than the whole budget (then nothing is kept or dropped).
  bool put(const std::string& id, V v) {
    const size_t b = bytes_of_(id, v);
    if (b > max_bytes_ || max_entries_ == 0) return false;
    std::lock_guard lk(mu_);
    if (auto it = by_id_.find(id); it != by_id_.end()) drop_locked(it);
    while (!by_id_.empty() && (by_id_.size() >= max_entries_ || bytes_ + b > max_bytes_))
      drop_locked(by_id_.find(order_.front()));
    order_.push_back(id);
    by_id_.emplace(id, Held{std::move(v), b, std::prev(order_.end())});
    bytes_ += b;
    return true;
  }

  std::optional<V> get(const std::string& id) const {
    std::lock_guard lk(mu_);
    auto it = by_id_.find(id);
    if (it == by_id_.end()) return std::nullopt;
    touch_locked(it->second);
    return it->second.value;
  }

  bool contains(const std::string& id) const {
    std::lock_guard lk(mu_);
    return by_id_.count(id) != 0;
  }

  bool erase(const std::string& id) {
    std::lock_guard lk(mu_);
    auto it = by_id_.find(id);
    if (it == by_id_.end()) return false;
    drop_locked(it);
    return true;
  }

  // Applies `f` to a copy of the value under the store's lock and keeps the result, dropping others (first of the
  // order first) if it grew past the budget; false: `id` not held, or the result alone would not fit (then the value
  // is unchanged).
  bool update(const std::string& id, const std::function<void(V&)>& f) {
    std::lock_guard lk(mu_);
    auto it = by_id_.find(id);
    if (it == by_id_.end()) return false;
    V v = it->second.value;
    f(v);
    const size_t b = bytes_of_(id, v);
    if (b > max_bytes_) return false;
    bytes_ -= it->second.bytes;
    it->second.value = std::move(v);
    it->second.bytes = b;
    bytes_ += b;
    touch_locked(it->second);
    while (bytes_ > max_bytes_ && order_.front() != id) drop_locked(by_id_.find(order_.front()));
    return true;
  }

  size_t size() const {
    std::lock_guard lk(mu_);
    return by_id_.size();
  }
  size_t bytes() const {
    std::lock_guard lk(mu_);
    return bytes_;
  }

 private:
  using Order = std::list<std::string>;
  struct Held {
    V value;
    size_t bytes = 0;
    Order::iterator place;  // in order_
  };
  using Map = std::map<std::string, Held>;

  void drop_locked(typename Map::iterator it) {
    bytes_ -= it->second.bytes;
    order_.erase(it->second.place);
    by_id_.erase(it);
  }
  void touch_locked(const Held& h) const {
    if constexpr (kTouchOnUse) order_.splice(order_.end(), order_, h.place);
  }

  const size_t max_entries_, max_bytes_;
  const BytesOf bytes_of_;
  mutable std::mutex mu_;
  Map by_id_;
  mutable Order order_;  // the order entries leave in (get() may move one: bookkeeping, under mu_)
  size_t bytes_ = 0;
};

}  // namespace lilac::server
