// The Responses API's background mode (`"background": true`): the generation runs on without the connection, on
// a thread of its own that reads its events into the Responses formatter. The stored entry (server/
// response_store.h) follows it: "queued", then "in_progress" with the output so far (refreshed at most every
// 200 ms), then the final object — "completed" / "incomplete" as a foreground response stores it, "cancelled"
// (POST /v1/responses/{id}/cancel, a DELETE, the server stopping it before it began) with what was generated, or
// "failed" with the error. GET /v1/responses/{id} polls it.
// Created with `stream: true`, it also keeps its stream's events (the Responses SSE events, event i with
// sequence_number i) while it runs and for the kStreamsKept streamed responses that ended last: the request that
// created it reads them as they come, and GET /v1/responses/{id}?stream=true&starting_after=N reads them again from
// N + 1 (a client that lost its connection resumes); a client that goes away never stops the generation. The stream
// ends with one terminal event: response.completed / .incomplete as a foreground stream's, response.failed, or
// response.cancelled (carrying the "cancelled" object GET shows).
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/generation.h"
#include "server/http_response.h"
#include "server/response_store.h"

namespace lilac::server {

class BackgroundResponses {
 public:
  static constexpr size_t kStreamsKept = 16;  // ended streamed responses whose events are still held

  explicit BackgroundResponses(ResponseStore& store) : store_(store) {}
  ~BackgroundResponses() { stop(); }
  BackgroundResponses(const BackgroundResponses&) = delete;
  BackgroundResponses& operator=(const BackgroundResponses&) = delete;

  // Runs `gen` in the background as response `id`: stores the "queued" object and returns it. `fmt` is the
  // Responses formatter made for it (its on_done stores the completed object); `items` the conversation's
  // input items the stored entry holds (its output follows them once it ends); `stream`: keep its stream's
  // events. Once stop() began: cancels `gen` and throws ApiError 503.
  nlohmann::json start(const std::string& id, std::shared_ptr<Generation> gen, std::shared_ptr<ResponseFormatter> fmt,
                       nlohmann::ordered_json items, bool stream);
  // Cancels a running `id` and waits (up to `wait`) until its "cancelled" object is stored; false when `id`
  // is not running here (finished, or never a background response of this server).
  bool cancel(const std::string& id, std::chrono::milliseconds wait = std::chrono::seconds(10));
  // Whether the events of `id`'s stream are held here.
  bool has_events(const std::string& id) const;
  // Appends the events of `id`'s stream from index `from` to `out`, waiting up to `wait` for one when there is
  // none yet; `ended`: no more will come. False when they are not held here.
  bool events(const std::string& id, size_t from, std::chrono::milliseconds wait, std::vector<std::string>& out,
              bool& ended) const;
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
    bool stream = false;
    std::vector<std::string> events;  // stream: SSE events, index = sequence_number (guarded by mu_)
    bool ended = false;               // stream: its terminal event is among them; no event follows it (mu_)
    std::atomic<bool> done{false};
    std::thread thread;
    // The task's thread only: why fail() failed it, and why storing that failure threw (finish()'s message).
    std::string failure, unstored;
    // The task's thread only: the error of the response.failed its stream ended with (null: none). The stored object
    // says the same once the stream ended so (fail(), finish()): GET and the stream show one failure alike.
    nlohmann::json stream_error;
  };
  void run(Task& t);
  void run_stream(Task& t);
  // Stores t's object in `status` ("in_progress", "cancelled", "failed") with its output so far.
  void store(Task& t, const std::string& status, const nlohmann::json& error = nullptr);
  // Adds the SSE events in `text` (one or more) to t's stream, up to its terminal event (response.completed,
  // .incomplete, .failed, .cancelled): a stream has one, and nothing is added after it.
  void publish(Task& t, const std::string& text);
  // Whether t's stream holds its terminal event.
  bool stream_ended(const Task& t) const;
  // What run() does when reading the generation threw: the generation is cancelled, the stored object becomes
  // "failed" and the stream ends with response.failed, unless the stream had ended already (then the stored object
  // stays as that end stored it, if it did; if that end was a response.failed whose store did not happen, "failed"
  // is stored with that event's error, not with what threw). Storing "failed" may throw too: that is logged, and the stream still
  // gets its response.failed.
  void fail(Task& t, const std::string& what);
  // The task's end: a stored object still "queued" / "in_progress" becomes "failed" (a store that throws is logged),
  // its error saying why its end was not kept (too large for the store, or the store threw: why) or, when its stream
  // ended with response.failed, that event's error; then the task is done (its stream's readers stop waiting).
  void finish(Task& t);
  std::shared_ptr<Task> find_locked(const std::string& id) const;
  void reap_locked();

  ResponseStore& store_;
  mutable std::mutex mu_;
  mutable std::condition_variable changed_;  // a task ended or its stream grew
  std::list<std::shared_ptr<Task>> tasks_;
  std::atomic<bool> stopping_{false};  // set under mu_
};

}  // namespace lilac::server
