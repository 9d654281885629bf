// The Responses API's stored responses (`store`, `previous_response_id`, GET / DELETE /v1/responses/{id}):
// in this process's memory only, bounded by count and bytes (the oldest dropped first), gone at restart.
// An entry is what a follow-up needs: the conversation's items (the input items of every turn so far, the
// earlier turns' outputs among them, then this response's output items) and the response object as answered.
#pragma once
#include <cstddef>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace lilac::server {

class ResponseStore {
 public:
  struct Entry {
    nlohmann::ordered_json items;  // input items of the whole conversation, this response's output last
    nlohmann::json response;       // the response object
  };

  explicit ResponseStore(size_t max_entries = 1000, size_t max_bytes = size_t(256) << 20)
      : max_entries_(max_entries), max_bytes_(max_bytes) {}

  // Keeps `e` under `id` (an entry larger than the whole budget is not kept), dropping the oldest as needed.
  void put(const std::string& id, Entry e);
  std::optional<Entry> get(const std::string& id) const;
  bool contains(const std::string& id) const;
  bool erase(const std::string& id);
  size_t size() const;
  size_t bytes() const;

 private:
  struct Held {
    Entry entry;
    size_t bytes = 0;
  };
  void drop_oldest_locked();

  const size_t max_entries_, max_bytes_;
  mutable std::mutex mu_;
  std::map<std::string, Held> by_id_;
  std::deque<std::string> order_;  // insertion order (ids erased from by_id_ are skipped when met)
  size_t bytes_ = 0;
};

}  // namespace lilac::server
