#include "server/background_responses.h"

#include "core/log.h"
#include "server/api_error.h"
#include "server/responses_format.h"

namespace lilac::server {

using Clock = std::chrono::steady_clock;

nlohmann::json BackgroundResponses::start(const std::string& id, std::shared_ptr<Generation> gen,
                                          std::shared_ptr<ResponseFormatter> fmt, nlohmann::ordered_json items,
                                          bool stream) {
  std::lock_guard<std::mutex> lk(mu_);
  if (stopping_) {  // stop() began: no thread may start that it would not join
    gen->cancel();
    throw ApiError(503, "The server is shutting down.", "", "server_shutting_down");
  }
  reap_locked();
  auto t = std::make_shared<Task>();
  t->id = id;
  t->gen = std::move(gen);
  t->fmt = std::move(fmt);
  t->items = std::move(items);
  t->stream = stream;
  const nlohmann::json queued = responses_object(*t->fmt, "queued");
  store_.put(id, ResponseStore::Entry{t->items, queued});
  tasks_.push_back(t);
  t->thread = std::thread([this, t] { run(*t); });
  return queued;
}

void BackgroundResponses::store(Task& t, const std::string& status, const nlohmann::json& error) {
  const nlohmann::json r = responses_object(*t.fmt, status, error);
  ResponseStore::Entry e{t.items, r};
  if (status != "in_progress")  // an ended response's conversation continues after its output
    append_output_items(e.items, r);
  store_.put(t.id, std::move(e));
}

namespace {

// Whether an SSE event ("event: NAME\ndata: ...") ends a Responses stream.
bool terminal_event(const std::string& ev) {
  for (const char* name : {"response.completed", "response.incomplete", "response.failed", "response.cancelled"})
    if (ev.starts_with(std::string("event: ") + name + "\n")) return true;
  return false;
}

}  // namespace

void BackgroundResponses::publish(Task& t, const std::string& text) {
  if (text.empty()) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (size_t at = 0; at < text.size();) {  // each SSE event ends with a blank line
      size_t end = text.find("\n\n", at);
      end = end == std::string::npos ? text.size() : end + 2;
      std::string ev = text.substr(at, end - at);
      at = end;
      if (t.ended) {  // a stream ends once: what would follow its terminal event is dropped
        LILAC_LOG_ERROR("background response %s: an event after the stream's end dropped: %.80s", t.id.c_str(),
                        ev.c_str());
        continue;
      }
      t.ended = terminal_event(ev);
      t.events.push_back(std::move(ev));
    }
  }
  changed_.notify_all();
}

bool BackgroundResponses::stream_ended(const Task& t) const {
  std::lock_guard<std::mutex> lk(mu_);
  return t.ended;
}

void BackgroundResponses::fail(Task& t, const std::string& what) {
  LILAC_LOG_ERROR("background response %s: %s", t.id.c_str(), what.c_str());
  t.gen->cancel();
  const bool ended = t.stream && stream_ended(t);
  // A stream that ended with response.failed before this (the run's store of that failure threw, say) told its client
  // that failure: the stored one is the same, not what threw here (GET said the store's exception, the stream the
  // generation's error).
  const nlohmann::json error = ended && !t.stream_error.is_null() ? t.stream_error : responses_failure(500, what);
  t.failure = what;
  // Storing the failure and ending the stream are apart: a store that throws must not keep the stream from its
  // terminal event (in one try, it did: a client read to the end of a stream that had none).
  try {
    std::optional<ResponseStore::Entry> e = store_.get(t.id);
    if (!ended || !e || response_running(e->response)) store(t, "failed", error);
  } catch (const std::exception& x) {  // finish() still ends the stored object, saying why (or drops it)
    LILAC_LOG_ERROR("background response %s: storing its failure failed: %s", t.id.c_str(), x.what());
    t.unstored = x.what();
  }
  if (!t.stream || ended) return;
  try {
    publish(t, responses_failed_event(*t.fmt, error));  // the stream's one terminal event
    t.stream_error = error;
  } catch (const std::exception& x) {
    LILAC_LOG_ERROR("background response %s: publishing response.failed failed: %s", t.id.c_str(), x.what());
  }
}

void BackgroundResponses::finish(Task& t) {
  // The final object must replace "queued" / "in_progress" (clients poll until it does). One too large for the store
  // (--responses-mb) was not kept and the old status stayed forever: it ends as failed, without its output. So does
  // one whose store threw (fail()'s too), saying so (it said "too large" for that too), or, when its stream ended with
  // response.failed, with that event's error.
  // A store that throws here is logged: the throw left the response's thread (std::terminate), and the task must end
  // (done) for its stream's readers to stop waiting.
  try {
    if (std::optional<ResponseStore::Entry> e = store_.get(t.id)) {
      if (response_running(e->response)) {
        nlohmann::json r = e->response;
        r["status"] = "failed";
        r["output"] = nlohmann::json::array();
        // A stream that ended with response.failed told its client that error: GET shows the same (the reason its
        // store failed is logged).
        if (!t.stream_error.is_null()) {
          r["error"] = t.stream_error;
        } else {
          std::string message;
          if (t.unstored.empty())
            message = "The response is larger than this server's response store holds (--responses-mb): it was not kept.";
          else if (t.failure.empty() || t.failure == t.unstored)
            message = "The response could not be stored: " + t.unstored;
          else
            message = "The response could not be stored: " + t.unstored + " (it had failed: " + t.failure + ")";
          r["error"] = {{"code", "server_error"}, {"message", message}};
        }
        if (!store_.put(t.id, ResponseStore::Entry{t.items, r})) store_.erase(t.id);
      }
    }
  } catch (const std::exception& x) {
    // Left in the store, the object would say "queued" / "in_progress" forever (a poller never ends): it goes, and
    // GET answers 404 as for a response the store could not keep.
    LILAC_LOG_ERROR("background response %s: storing its end failed (%s): it is dropped", t.id.c_str(), x.what());
    try {
      store_.erase(t.id);
    } catch (const std::exception& y) {
      LILAC_LOG_ERROR("background response %s: dropping it failed too: %s", t.id.c_str(), y.what());
    }
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    t.done = true;
  }
  changed_.notify_all();
}

// Reads the generation's events into the formatter (as a stream's events when t.stream, which then also become
// t's events) and keeps the stored object up to date, until the generation ends.
void BackgroundResponses::run(Task& t) {
  std::vector<OutputEvent> evs;
  bool in_progress = false, fresh = false;
  auto shown = Clock::now();
  try {
    if (t.stream) publish(t, t.fmt->stream_start());
    while (!t.gen->finished()) {
      if (stopping_) t.gen->cancel();
      evs.clear();
      t.gen->poll(evs, std::chrono::milliseconds(50));
      for (const OutputEvent& ev : evs) {
        if (t.stream)
          publish(t, t.fmt->stream_event(ev));  // at the end, the stream's formatter stores the completed object
        else if (ev.kind != OutputEvent::Error)
          t.fmt->add(ev);
        fresh = true;
        if (ev.kind == OutputEvent::Error) {  // a stream's events ended with response.failed (stream_event)
          const nlohmann::json error = responses_failure(ev.status, ev.message);
          if (t.stream) t.stream_error = error;  // that event's error (its store may throw: fail(), finish())
          store(t, "failed", error);
          break;
        }
        if (ev.kind != OutputEvent::Done) continue;
        if (ev.stats.finish == FinishReason::Cancelled) {
          store(t, "cancelled");  // first: a client that reads the stream's end finds it stored
          if (t.stream) publish(t, responses_cancelled_event(*t.fmt));  // the object just stored, as its terminal event
        } else if (!t.stream)
          (void)t.fmt->body();  // the formatter's on_done stores the completed (or incomplete) object
        break;
      }
      if (t.gen->finished()) break;
      if (t.gen->started() && (!in_progress || (fresh && Clock::now() - shown > std::chrono::milliseconds(200)))) {
        store(t, "in_progress");
        in_progress = true;
        fresh = false;
        shown = Clock::now();
      }
    }
  } catch (const std::exception& e) {
    fail(t, e.what());
  }
  finish(t);
}

std::shared_ptr<BackgroundResponses::Task> BackgroundResponses::find_locked(const std::string& id) const {
  for (auto it = tasks_.rbegin(); it != tasks_.rend(); ++it)
    if ((*it)->id == id) return *it;
  return nullptr;
}

bool BackgroundResponses::cancel(const std::string& id, std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> lk(mu_);
  std::shared_ptr<Task> t = find_locked(id);
  if (!t || t->done) return false;
  t->gen->cancel();
  changed_.wait_for(lk, wait, [&] { return t->done.load(); });
  return true;
}

bool BackgroundResponses::has_events(const std::string& id) const {
  std::lock_guard<std::mutex> lk(mu_);
  std::shared_ptr<Task> t = find_locked(id);
  return t && t->stream;
}

bool BackgroundResponses::events(const std::string& id, size_t from, std::chrono::milliseconds wait,
                                 std::vector<std::string>& out, bool& ended) const {
  std::unique_lock<std::mutex> lk(mu_);
  std::shared_ptr<Task> t = find_locked(id);
  if (!t || !t->stream) return false;
  changed_.wait_for(lk, wait, [&] { return t->events.size() > from || t->done.load(); });
  for (size_t i = from; i < t->events.size(); ++i) out.push_back(t->events[i]);
  ended = t->done.load();
  return true;
}

size_t BackgroundResponses::active() const {
  std::lock_guard<std::mutex> lk(mu_);
  size_t n = 0;
  for (const auto& t : tasks_) n += t->done ? 0 : 1;
  return n;
}

// Joins the threads of ended tasks and drops them, but for the kStreamsKept streamed ones that ended last.
void BackgroundResponses::reap_locked() {
  size_t streams = 0;
  for (auto it = tasks_.rbegin(); it != tasks_.rend();) {
    Task& t = **it;
    const bool keep = !t.done || (t.stream && streams++ < kStreamsKept);
    if (t.done && t.thread.joinable()) t.thread.join();
    it = keep ? std::next(it) : std::make_reverse_iterator(tasks_.erase(std::next(it).base()));
  }
}

void BackgroundResponses::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;  // under the lock: a start() after this refuses, one before it is in tasks_
    for (const auto& t : tasks_) t->gen->cancel();
  }
  // The threads end at their next poll (at most 50 ms); join them outside the lock (they take it to finish).
  for (;;) {
    std::thread th;
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (const auto& t : tasks_)
        if (t->thread.joinable()) {
          th = std::move(t->thread);
          break;
        }
    }
    if (!th.joinable()) break;
    th.join();
  }
  std::lock_guard<std::mutex> lk(mu_);
  tasks_.clear();
}

}  // namespace lilac::server
