// The Responses API's stored responses (`store`, `previous_response_id`, GET / DELETE /v1/responses/{id}):
// in this process's memory only, bounded by count and bytes (the oldest dropped first), gone at restart.
// An entry is what a follow-up needs: the conversation's items (the input items of every turn so far, the
// earlier turns' outputs among them, then this response's output items) and the response object as answered.
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "server/bounded_store.h"
#include "text/json_dump.h"

namespace lilac::server {

struct ResponseEntry {
  nlohmann::ordered_json items;  // input items of the whole conversation, this response's output last
  nlohmann::json response;       // the response object
};

// Whether a stored response has not ended yet (a background one, "queued" or "in_progress"): its items hold its input
// only, its output so far is in the response object.
inline bool response_running(const nlohmann::json& response) {
  const std::string st = response.value("status", "");
  return st == "queued" || st == "in_progress";
}

// Appends a response's output items to a conversation's items (what a follow-up to it continues from).
inline void append_output_items(nlohmann::ordered_json& items, const nlohmann::json& response) {
  for (const auto& o : response["output"]) items.push_back(nlohmann::ordered_json(o));
}

// Insertion order: the oldest response leaves first (put() returns false for one larger than the whole budget).
class ResponseStore : public BoundedStore<ResponseEntry, false> {
 public:
  using Entry = ResponseEntry;
  // A test seam (ServerOptions::response_store_put_fault), empty in production: called first by every put() with the
  // id and the response object to be stored; a test throws from it to reach the paths of a put that throws, which
  // only an allocation failure reaches otherwise. Called on the threads that store (requests', background
  // responses'), so it must be thread-safe.
  using PutFault = std::function<void(const std::string& id, const nlohmann::json& response)>;

  explicit ResponseStore(size_t max_entries = 1000, size_t max_bytes = size_t(256) << 20, PutFault put_fault = nullptr)
      : BoundedStore(max_entries, max_bytes, &bytes_of), put_fault_(std::move(put_fault)) {}

  // BoundedStore::put, after the test seam's call (when one is set).
  bool put(const std::string& id, Entry e) {
    if (put_fault_) put_fault_(id, e.response);
    return BoundedStore::put(id, std::move(e));
  }

 private:
  // dump_json, not a strict dump: an entry may hold bytes that are not UTF-8 (a backend's error quoting a token that
  // is part of a character); a strict dump threw on them, and the entry was not stored.
  static size_t bytes_of(const std::string& id, const Entry& e) {
    return dump_json(e.items).size() + dump_json(e.response).size() + id.size();
  }

  const PutFault put_fault_;
};

}  // namespace lilac::server
