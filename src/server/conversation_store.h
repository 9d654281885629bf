// OpenAI's Conversations (POST /v1/conversations and its items; a Responses request's `conversation`): a
// conversation is an ordered list of items — messages, function calls and their outputs, reasoning — each with an
// id, plus string metadata. In this process's memory only, bounded by count and bytes (the conversation used least
// recently dropped first), gone at restart.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "server/bounded_store.h"
#include "text/json_dump.h"

namespace lilac::server {

struct Conversation {
  std::string id;
  int64_t created_at = 0;
  nlohmann::ordered_json metadata = nlohmann::ordered_json::object();
  nlohmann::ordered_json items = nlohmann::ordered_json::array();  // oldest first, each with an "id"

  bool holds(const nlohmann::ordered_json& item_id) const {
    for (const auto& it : items)
      if (it["id"] == item_id) return true;
    return false;
  }
};

// Use order: get() and update() make a conversation the most recently used.
class ConversationStore : public BoundedStore<Conversation, true> {
 public:
  using Conversation = server::Conversation;
  explicit ConversationStore(size_t max_conversations = 1000, size_t max_bytes = size_t(256) << 20)
      : BoundedStore(max_conversations, max_bytes, &bytes_of) {}

  // Keeps `c` under its id (false: larger than the whole budget, nothing kept).
  bool put(Conversation c) {
    const std::string id = c.id;
    return BoundedStore::put(id, std::move(c));
  }

 private:
  static size_t bytes_of(const std::string& id, const Conversation& c) {
    return id.size() + dump_json(c.metadata).size() + dump_json(c.items).size() + 64;  // never throws on bytes
  }
};

}  // namespace lilac::server
