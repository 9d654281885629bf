// OpenAI's Conversations (POST /v1/conversations and its items; a Responses request's `conversation`): a
// conversation is an ordered list of items — messages, function calls and their outputs, reasoning — each with an
// id, plus string metadata. In this process's memory only, bounded by count and bytes (the conversation used least
// recently dropped first), gone at restart.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace lilac::server {

class ConversationStore {
 public:
  struct Conversation {
    std::string id;
    int64_t created_at = 0;
    nlohmann::ordered_json metadata = nlohmann::ordered_json::object();
    nlohmann::ordered_json items = nlohmann::ordered_json::array();  // oldest first, each with an "id"
  };

  explicit ConversationStore(size_t max_conversations = 1000, size_t max_bytes = size_t(256) << 20)
      : max_(max_conversations), max_bytes_(max_bytes) {}

  // Keeps `c` (replacing one of its id), dropping the least recently used as needed; false when it alone is larger
  // than the whole budget (nothing kept).
  bool put(Conversation c);
  std::optional<Conversation> get(const std::string& id);
  bool contains(const std::string& id) const;
  bool erase(const std::string& id);
  // Applies `f` to the conversation `id` under the store's lock (false: not held; or the result would not fit,
  // then the conversation is unchanged).
  bool update(const std::string& id, const std::function<void(Conversation&)>& f);
  size_t size() const;

 private:
  struct Held {
    Conversation c;
    size_t bytes = 0;
    std::list<std::string>::iterator lru;
  };
  static size_t bytes_of(const Conversation& c);
  void drop_lru_locked();

  const size_t max_, max_bytes_;
  mutable std::mutex mu_;
  std::map<std::string, Held> by_id_;
  std::list<std::string> lru_;  // least recently used first
  size_t bytes_ = 0;
};

}  // namespace lilac::server
