#include "server/background_responses.h"

#include <vector>

#include "core/log.h"
#include "server/api_error.h"
#include "server/responses_format.h"

namespace lilac::server {

using Clock = std::chrono::steady_clock;

nlohmann::json BackgroundResponses::start(const std::string& id, std::shared_ptr<Generation> gen,
                                          std::shared_ptr<ResponseFormatter> fmt, nlohmann::ordered_json items) {
  std::lock_guard<std::mutex> lk(mu_);
  if (stopping_) {  // stop() began: no thread may start that it would not join
    gen->cancel();
    throw ApiError(503, "The server is shutting down.", "", "server_shutting_down");
  }
  reap_locked();
  Task& t = tasks_.emplace_back();
  t.id = id;
  t.gen = std::move(gen);
  t.fmt = std::move(fmt);
  t.items = std::move(items);
  const nlohmann::json queued = responses_object(*t.fmt, "queued");
  store_.put(id, ResponseStore::Entry{t.items, queued});
  t.thread = std::thread([this, &t] { run(t); });
  return queued;
}

void BackgroundResponses::store(Task& t, const std::string& status, const nlohmann::json& error) {
  const nlohmann::json r = responses_object(*t.fmt, status, error);
  ResponseStore::Entry e{t.items, r};
  if (status != "in_progress")  // an ended response's conversation continues after its output
    for (const auto& o : r["output"]) e.items.push_back(nlohmann::ordered_json::parse(o.dump()));
  store_.put(t.id, std::move(e));
}

void BackgroundResponses::run(Task& t) {
  std::vector<OutputEvent> evs;
  bool in_progress = false, fresh = false;
  auto shown = Clock::now();
  try {
    while (!t.gen->finished()) {
      if (stopping_) t.gen->cancel();
      evs.clear();
      t.gen->poll(evs, std::chrono::milliseconds(50));
      for (const OutputEvent& ev : evs) {
        if (ev.kind == OutputEvent::Error) {
          const nlohmann::json err{{"code", ev.status >= 500 ? "server_error" : "invalid_prompt"},
                                   {"message", ev.message}};
          store(t, "failed", err);
          break;
        }
        t.fmt->add(ev);
        fresh = true;
        if (ev.kind != OutputEvent::Done) continue;
        if (ev.stats.finish == FinishReason::Cancelled)
          store(t, "cancelled");
        else
          (void)t.fmt->body();  // the formatter's on_done stores the completed (or incomplete) object
        break;
      }
      if (t.gen->finished()) break;
      const bool now_running = t.gen->started();
      if (now_running && (!in_progress || (fresh && Clock::now() - shown > std::chrono::milliseconds(200)))) {
        store(t, "in_progress");
        in_progress = true;
        fresh = false;
        shown = Clock::now();
      }
    }
  } catch (const std::exception& e) {
    LILAC_LOG_ERROR("background response %s: %s", t.id.c_str(), e.what());
    store(t, "failed", nlohmann::json{{"code", "server_error"}, {"message", e.what()}});
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    t.done = true;
  }
  ended_.notify_all();
}

bool BackgroundResponses::running(const std::string& id) const {
  std::lock_guard<std::mutex> lk(mu_);
  for (const Task& t : tasks_)
    if (t.id == id && !t.done) return true;
  return false;
}

bool BackgroundResponses::cancel(const std::string& id, std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> lk(mu_);
  Task* task = nullptr;
  for (Task& t : tasks_)
    if (t.id == id && !t.done) task = &t;
  if (!task) return false;
  task->gen->cancel();
  ended_.wait_for(lk, wait, [&] { return task->done.load(); });
  return true;
}

size_t BackgroundResponses::active() const {
  std::lock_guard<std::mutex> lk(mu_);
  size_t n = 0;
  for (const Task& t : tasks_) n += t.done ? 0 : 1;
  return n;
}

// Joins the threads of ended tasks (their Task is then dropped).
void BackgroundResponses::reap_locked() {
  for (auto it = tasks_.begin(); it != tasks_.end();) {
    if (it->done) {
      if (it->thread.joinable()) it->thread.join();
      it = tasks_.erase(it);
    } else {
      ++it;
    }
  }
}

void BackgroundResponses::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;  // under the lock: a start() after this refuses, one before it is in tasks_
    for (Task& t : tasks_) t.gen->cancel();
  }
  // The threads end at their next poll (at most 50 ms); join them outside the lock (they take it to finish).
  for (;;) {
    std::thread th;
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (Task& t : tasks_)
        if (t.thread.joinable()) {
          th = std::move(t.thread);
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
