#include "server/message_batches.h"

#include <httplib.h>

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <set>
#include <list>
#include <memory>
#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "server/api_error.h"
#include "server/anthropic_api.h"
#include "server/anthropic_schema.h"
#include "server/endpoint.h"
#include "server/http_response.h"
#include "server/http_server.h"
#include "server/json_route.h"
#include "server/request_json.h"
#include "server/server_context.h"

namespace lilac::server {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

constexpr size_t kMaxRequests = 10000;
constexpr size_t kMaxBatches = 64;
constexpr size_t kInFlight = 8;  // a batch's requests on the generation core at once

std::string rfc3339(std::time_t t) {
  char b[32];
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return b;
}

struct Batch {
  std::string id;
  std::time_t created = 0, ended = 0, cancel_at = 0;
  std::vector<std::string> custom_ids;
  std::vector<ojson> params;
  std::vector<json> results;  // null while not ended
  size_t succeeded = 0, errored = 0, canceled = 0;
  bool cancel = false, done = false;
  std::thread thread;
};

class Batches {
 public:
  explicit Batches(ServerContext& C) : C_(C), ep_(messages_endpoint(C)) {}
  ~Batches() { stop(); }

  std::shared_ptr<Batch> add(std::vector<std::string> ids, std::vector<ojson> params) {
    std::lock_guard lk(mu_);
    if (stopping_) throw ApiError(503, "The server is shutting down.");
    while (list_.size() >= kMaxBatches) {  // drop the oldest ended batch
      auto it = list_.end();
      for (auto j = list_.begin(); j != list_.end(); ++j)
        if ((*j)->done) it = j;
      if (it == list_.end()) throw ApiError(429, "Too many message batches are running; retry later.", "", "rate_limit_error");
      if ((*it)->thread.joinable()) (*it)->thread.join();
      list_.erase(it);
    }
    auto b = std::make_shared<Batch>();
    b->id = C_.new_id("msgbatch_");
    b->created = std::time(nullptr);
    b->custom_ids = std::move(ids);
    b->params = std::move(params);
    b->results.assign(b->custom_ids.size(), json(nullptr));
    list_.push_front(b);
    b->thread = std::thread([this, b] { run(*b); });
    return b;
  }

  std::shared_ptr<Batch> find(const std::string& id) {
    std::lock_guard lk(mu_);
    for (auto& b : list_)
      if (b->id == id) return b;
    return nullptr;
  }

  json object(const Batch& b, const std::string& base) {
    std::lock_guard lk(mu_);
    const size_t n = b.custom_ids.size();
    json o{{"id", b.id}, {"type", "message_batch"}};
    o["processing_status"] = b.done ? "ended" : b.cancel ? "canceling" : "in_progress";
    o["request_counts"] = json{{"processing", n - b.succeeded - b.errored - b.canceled}, {"succeeded", b.succeeded},
                               {"errored", b.errored}, {"canceled", b.canceled}, {"expired", 0}};
    o["ended_at"] = b.done ? json(rfc3339(b.ended)) : json(nullptr);
    o["created_at"] = rfc3339(b.created);
    o["expires_at"] = rfc3339(b.created + 24 * 3600);
    o["archived_at"] = nullptr;
    o["cancel_initiated_at"] = b.cancel_at ? json(rfc3339(b.cancel_at)) : json(nullptr);
    o["results_url"] = b.done ? json(base + "/v1/messages/batches/" + b.id + "/results") : json(nullptr);
    return o;
  }

  bool ended(const Batch& b) {
    std::lock_guard lk(mu_);
    return b.done;
  }

  std::vector<std::shared_ptr<Batch>> all() {
    std::lock_guard lk(mu_);
    return {list_.begin(), list_.end()};
  }

  void cancel(Batch& b) {
    std::lock_guard lk(mu_);
    if (b.done || b.cancel) return;
    b.cancel = true;
    b.cancel_at = std::time(nullptr);
  }

  std::string results_jsonl(const Batch& b) {
    std::lock_guard lk(mu_);
    std::string out;
    for (size_t i = 0; i < b.results.size(); ++i)
      out += dump_json(json{{"custom_id", b.custom_ids[i]}, {"result", b.results[i]}}) + "\n";
    return out;
  }

  bool erase(const std::string& id) {
    std::lock_guard lk(mu_);
    for (auto it = list_.begin(); it != list_.end(); ++it)
      if ((*it)->id == id) {
        if (!(*it)->done) throw ApiError(400, "Message batch " + id + " is still processing: cancel it first.");
        if ((*it)->thread.joinable()) (*it)->thread.join();
        list_.erase(it);
        return true;
      }
    return false;
  }

  void stop() {
    std::vector<std::shared_ptr<Batch>> bs;
    {
      std::lock_guard lk(mu_);
      stopping_ = true;
      for (auto& b : list_) b->cancel = true;
      bs.assign(list_.begin(), list_.end());
    }
    for (auto& b : bs)
      if (b->thread.joinable()) b->thread.join();
  }

 private:
  struct Running {
    size_t index;
    std::shared_ptr<Generation> gen;
    std::shared_ptr<ResponseFormatter> fmt;
  };

  void set(Batch& b, size_t i, json result, size_t Batch::*count) {
    std::lock_guard lk(mu_);
    b.results[i] = std::move(result);
    ++(b.*count);
  }

  static json errored(const ApiError& e) {
    return json{{"type", "errored"}, {"error", anthropic_error_body(e)}};
  }

  // Starts request i; false when the queue is full (retry later).
  bool start_one(Batch& b, size_t i, std::vector<Running>& fl) {
    try {
      require_ready(C_);
      PreparedRequest r = ep_.prepare(b.params[i], C_.core->config(), C_.random_u64());
      require_served_model(C_, r.model);
      if (r.stream) throw ApiError(400, "A batch request cannot stream: 'stream' must be false.", "stream");
      std::shared_ptr<Generation> g = C_.core->start(r.spec);
      fl.push_back(Running{i, g, r.formatter(*g, false)});
    } catch (const ApiError& e) {
      // Not yet: the queue is full, or the model is still loading (a batch sent at start-up waits for it; every
      // request of it errored at once before).
      if (e.status == 429 || e.code == "model_not_loaded") return false;
      set(b, i, errored(e), &Batch::errored);
    } catch (const InputError& e) {
      set(b, i, errored(ApiError(400, e.what())), &Batch::errored);
    } catch (const std::exception& e) {
      set(b, i, errored(ApiError(500, std::string("Internal server error: ") + e.what())), &Batch::errored);
    }
    return true;
  }

  // Reads f's events; true once it ended (its result set).
  bool step(Batch& b, Running& f) {
    std::vector<OutputEvent> evs;
    f.gen->poll(evs, std::chrono::milliseconds(5));
    for (const OutputEvent& ev : evs) {
      if (ev.kind == OutputEvent::Error) {
        set(b, f.index, errored(ApiError(ev.status ? ev.status : 500, ev.message)), &Batch::errored);
        return true;
      }
      f.fmt->add(ev);
      if (ev.kind != OutputEvent::Done) continue;
      if (ev.stats.finish == FinishReason::Cancelled)
        set(b, f.index, json{{"type", "canceled"}}, &Batch::canceled);
      else
        set(b, f.index, json{{"type", "succeeded"}, {"message", json::parse(f.fmt->body())}}, &Batch::succeeded);
      return true;
    }
    return f.gen->finished();
  }

  void run(Batch& b) {
    const size_t n = b.custom_ids.size();
    size_t next = 0;
    std::vector<Running> fl;
    auto canceling = [&] {
      std::lock_guard lk(mu_);
      return b.cancel;
    };
    try {
      for (;;) {
        const bool stop_now = canceling();
        if (stop_now) {
          for (Running& f : fl) f.gen->cancel();
          for (; next < n; ++next) set(b, next, json{{"type", "canceled"}}, &Batch::canceled);
        }
        while (!stop_now && fl.size() < kInFlight && next < n)
          if (start_one(b, next, fl))
            ++next;
          else
            break;
        if (fl.empty()) {
          if (next >= n) break;
          std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the queue was full (or the model loading)
          continue;
        }
        for (size_t k = 0; k < fl.size();)
          if (step(b, fl[k])) {
            fl.erase(fl.begin() + std::ptrdiff_t(k));
          } else {
            ++k;
          }
      }
    } catch (const std::exception& e) {
      LILAC_LOG_ERROR("message batch %s: %s", b.id.c_str(), e.what());
      for (Running& f : fl) f.gen->cancel();
    }
    std::lock_guard lk(mu_);
    for (size_t i = 0; i < n; ++i)
      if (b.results[i].is_null()) {
        b.results[i] = errored(ApiError(500, "The request ended without a result."));
        ++b.errored;
      }
    b.done = true;
    b.ended = std::time(nullptr);
    std::vector<ojson>().swap(b.params);  // read by start_one only: an ended batch keeps its results, not its requests
  }

  ServerContext& C_;
  Endpoint ep_;
  std::mutex mu_;
  std::list<std::shared_ptr<Batch>> list_;  // newest first
  bool stopping_ = false;
};

// Answers with the text `f` returns or the ApiError it throws (Anthropic's shape), counted under `route`.
template <typename F>
void answer(ServerContext& C, const char* route, httplib::Response& res, F f, const char* type = "application/json") {
  answer_json(C.metrics, route, res, send_anthropic_error, f, type);
}

// Where results_url points: this server as the client reached it.
std::string base_url(const httplib::Request& req) {
  const std::string host = req.get_header_value("Host");
  return host.empty() ? "" : "http://" + host;
}

std::vector<std::pair<std::string, ojson>> checked_requests(const ojson& body) {
  if (!body.is_object()) throw ApiError(400, "The body must be a JSON object.");
  const auto it = body.find("requests");
  if (it == body.end() || !it->is_array()) throw ApiError(400, "requests: an array of {custom_id, params} is required.", "requests");
  if (it->empty() || it->size() > kMaxRequests)
    throw ApiError(400, "requests: 1 to " + std::to_string(kMaxRequests) + " requests per batch.", "requests");
  static const std::regex id_re("^[a-zA-Z0-9_-]{1,64}$");
  std::vector<std::pair<std::string, ojson>> out;
  std::set<std::string> seen;
  for (size_t i = 0; i < it->size(); ++i) {
    const ojson& r = (*it)[i];
    const std::string p = "requests." + std::to_string(i);
    if (!r.is_object() || !r.contains("custom_id") || !r["custom_id"].is_string() ||
        !std::regex_match(r["custom_id"].get<std::string>(), id_re))
      throw ApiError(400, p + ".custom_id: 1 to 64 characters of a-z, A-Z, 0-9, '_' and '-' are required.", p + ".custom_id");
    if (!r.contains("params") || !r["params"].is_object())
      throw ApiError(400, p + ".params: a Messages request object is required.", p + ".params");
    const std::string id = r["custom_id"];
    if (!seen.insert(id).second) throw ApiError(400, p + ".custom_id: '" + id + "' is used twice in this batch.", p + ".custom_id");
    out.emplace_back(id, r["params"]);
  }
  return out;
}

// GET /v1/messages/batches: newest first, `limit` (1..1000, 20) after the batch `after_id`.
json batches_page(Batches& B, const httplib::Request& req) {
  const int64_t limit = query_int(req, "limit", 1, 1000).value_or(20);
  const std::string after = req.get_param_value("after_id");
  json data = json::array();
  bool started = after.empty(), more = false;
  for (const auto& b : B.all()) {
    if (!started) {
      started = b->id == after;
      continue;
    }
    if (int64_t(data.size()) == limit) {
      more = true;
      break;
    }
    data.push_back(B.object(*b, base_url(req)));
  }
  json page{{"data", data}, {"has_more", more}};
  page["first_id"] = data.empty() ? json(nullptr) : data.front()["id"];
  page["last_id"] = data.empty() ? json(nullptr) : data.back()["id"];
  return page;
}

}  // namespace

void add_message_batch_routes(HttpServer& http, ServerContext& ctx) {
  ServerContext* C = &ctx;
  auto B = std::make_shared<Batches>(ctx);
  ctx.on_stop.push_back([B] { B->stop(); });
  const RouteOptions ro = anthropic_route_options();
  const std::string one = "/v1/messages/batches/(msgbatch_[A-Za-z0-9]{1,64})";
  auto held = [B](const std::string& id) {
    std::shared_ptr<Batch> b = B->find(id);
    if (!b)
      throw ApiError(404, "No message batch with id '" + quoted_id(id) + "' is held here.", "", "not_found_error");
    return b;
  };
  http.Post("/v1/messages/batches", [C, B](const httplib::Request& req, httplib::Response& res) {
    answer(*C, "/v1/messages/batches", res, [&] {
      std::vector<std::string> ids;
      std::vector<ojson> params;
      for (auto& [id, p] : checked_requests(parse_request_body(req.body))) {
        ids.push_back(id);
        params.push_back(std::move(p));
      }
      return dump_json(B->object(*B->add(std::move(ids), std::move(params)), base_url(req)));
    });
  }, ro);
  http.Get("/v1/messages/batches", [C, B](const httplib::Request& req, httplib::Response& res) {
    answer(*C, "/v1/messages/batches", res, [&] { return dump_json(batches_page(*B, req)); });
  }, ro);
  http.Get(one, [C, B, held](const httplib::Request& req, httplib::Response& res) {
    answer(*C, "/v1/messages/batches/{id}", res,
           [&] { return dump_json(B->object(*held(req.matches[1]), base_url(req))); });
  }, ro);
  http.Post(one + "/cancel", [C, B, held](const httplib::Request& req, httplib::Response& res) {
    answer(*C, "/v1/messages/batches/{id}/cancel", res, [&] {
      std::shared_ptr<Batch> b = held(req.matches[1]);
      B->cancel(*b);
      return dump_json(B->object(*b, base_url(req)));
    });
  }, ro);
  http.Get(one + "/results", [C, B, held](const httplib::Request& req, httplib::Response& res) {
    answer(*C, "/v1/messages/batches/{id}/results", res, [&] {
      std::shared_ptr<Batch> b = held(req.matches[1]);
      if (!B->ended(*b)) throw ApiError(400, "Message batch " + b->id + " has not ended yet: its results come once it has.");
      return B->results_jsonl(*b);
    }, "application/binary");
  }, ro);
  http.route("DELETE", one, [C, B](const httplib::Request& req, httplib::Response& res) {
    answer(*C, "/v1/messages/batches/{id}", res, [&] {
      const std::string id = req.matches[1];
      if (!B->erase(id))
        throw ApiError(404, "No message batch with id '" + quoted_id(id) + "' is held here.", "", "not_found_error");
      return dump_json(json{{"id", id}, {"type", "message_batch_deleted"}});
    });
  }, ro);
}

}  // namespace lilac::server
