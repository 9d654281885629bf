// The Responses API's background mode (`"background": true`): the request is answered at once with the
// response object in status "queued", and the generation runs on without the connection, on a thread of its
// own that reads its events into the Responses formatter. The stored entry (server/response_store.h) follows
// it: "queued", then "in_progress" with the output so far (refreshed at most every 200 ms), then the final
// object — "completed" / "incomplete" as a foreground response stores it, "cancelled" (POST
// /v1/responses/{id}/cancel, a DELETE, the server stopping it before it began) with what was generated, or
// "failed" with the error. GET /v1/responses/{id} polls it.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "server/generation.h"
#include "server/http_response.h"
#include "server/response_store.h"

namespace lilac::server {

class BackgroundResponses {
 public:
  explicit BackgroundResponses(ResponseStore& store) : store_(store) {}
  ~BackgroundResponses() { stop(); }
  BackgroundResponses(const BackgroundResponses&) = delete;
  BackgroundResponses& operator=(const BackgroundResponses&) = delete;

  // Runs `gen` in the background as response `id`: stores the "queued" object and returns it. `fmt` is the
  // Responses formatter made for it (its on_done stores the completed object); `items` the conversation's
  // input items the stored entry holds (its output follows them once it ends). Once stop() began: cancels `gen`
  // and throws ApiError 503.
  nlohmann::json start(const std::string& id, std::shared_ptr<Generation> gen, std::shared_ptr<ResponseFormatter> fmt,
                       nlohmann::ordered_json items);
  // Whether `id` is still running here.
  bool running(const std::string& id) const;
  // Cancels a running `id` and waits (up to `wait`) until its "cancelled" object is stored; false when `id`
  // is not running here (finished, or never a background response of this server).
  bool cancel(const std::string& id, std::chrono::milliseconds wait = std::chrono::seconds(10));
  // Background generations still running.
  size_t active() const;
  // Cancels every running generation and joins the threads (the server stops).
  void stop();

 private:
  struct Task {
    std::string id;
    std::shared_ptr<Generation> gen;
    std::shared_ptr<ResponseFormatter> fmt;
    nlohmann::ordered_json items;
    std::atomic<bool> done{false};
    std::thread thread;
  };
  void run(Task& t);
  // Stores t's object in `status` ("in_progress", "cancelled", "failed") with its output so far.
  void store(Task& t, const std::string& status, const nlohmann::json& error = nullptr);
  void reap_locked();

  ResponseStore& store_;
  mutable std::mutex mu_;
  std::condition_variable ended_;
  std::list<Task> tasks_;
  std::atomic<bool> stopping_{false};
};

}  // namespace lilac::server
