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
#include <optional>
#include <regex>
#include <string>
#include <string_view>
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
#include "server/parse_budget.h"
#include "server/request_json.h"
#include "server/server_context.h"

namespace lilac::server {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

constexpr size_t kMaxRequests = 10000;
constexpr size_t kMaxBatches = 64;
constexpr size_t kInFlight = 8;  // a batch's requests on the generation core at once
// What a request counts against the batches' budget (--batches-mb) besides the text it holds: its three strings
// (custom_id, params, result line), and until its result comes, room for the result that always fits: the errored line
// saying that the real one did not fit (under 400 bytes with a 64-character custom_id), so an admitted batch can end.
constexpr size_t kSlots = 3 * sizeof(std::string);
constexpr size_t kResultRoom = 512;

std::string rfc3339(std::time_t t) {
  char b[32];
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return b;
}

struct Batch {
  std::string id;
  std::time_t created = 0, ended = 0, cancel_at = 0, archived = 0;  // archived: its results dropped (expired)
  size_t n = 0;                         // requests
  std::vector<std::string> custom_ids;  // dropped when the batch ends (each result line holds its own)
  std::vector<std::string> params;      // request i's params as JSON text, until its result comes
  std::vector<std::string> results;     // request i's JSON line {custom_id, result}; "" until it comes
  size_t bytes = 0;                     // what the batch counts against the budget (in Batches::bytes_)
  uint64_t end_order = 0;               // the order batches ended in: the results of the first to end go first
  size_t succeeded = 0, errored = 0, canceled = 0;
  bool cancel = false, done = false;
  std::thread thread;
};

// A result as its line of the results file: {custom_id, result} and a newline.
std::string result_line(const std::string& custom_id, json result) {
  return dump_json(json{{"custom_id", custom_id}, {"result", std::move(result)}}) + "\n";
}

// What request i counts while it has no result: its custom_id, its params and the room kept for its result.
size_t pending_bytes(const std::string& custom_id, const std::string& params) {
  return kSlots + custom_id.size() + params.size() + kResultRoom;
}

// The batches held, bounded by count (kMaxBatches) and by bytes (ServerOptions::batches_bytes, --batches-mb): the
// requests of the batches still running (their params as JSON text) and the results of all, counted as the sizes of
// the strings kept. A batch is admitted only when its requests fit beside what the running batches hold (the results of
// ended batches are dropped for it, those of the batch that ended first first: their GET says they expired); a result
// that does not fit even then is kept as an errored line that does. Everything is under mu_.
class Batches {
 public:
  explicit Batches(ServerContext& C) : C_(C), ep_(messages_endpoint(C)), budget_(C.opts.batches_bytes) {}
  ~Batches() { stop(); }

  std::shared_ptr<Batch> add(std::vector<std::string> ids, std::vector<std::string> params) {
    size_t need = 0;
    for (size_t i = 0; i < ids.size(); ++i) need += pending_bytes(ids[i], params[i]);
    if (need > budget_)
      throw ApiError(413, "The batch needs " + std::to_string(need) + " bytes of this server's memory for message "
                     "batches, more than all of it (--batches-mb: " + std::to_string(budget_) + " bytes).");
    std::lock_guard lk(mu_);
    if (stopping_) throw ApiError(503, "The server is shutting down.");
    size_t freeable = 0;  // what ended batches hold (their results can be dropped)
    bool any_ended = false;
    for (const auto& b : list_)
      if (b->done) {
        freeable += b->bytes;
        any_ended = true;
      }
    if (list_.size() >= kMaxBatches && !any_ended)
      throw ApiError(429, "Too many message batches are running; retry later.");
    if (bytes_ - freeable + need > budget_)
      throw ApiError(429, "The message batches still running hold " + std::to_string(bytes_ - freeable) + " of the " +
                     std::to_string(budget_) + " bytes of this server's memory for message batches (--batches-mb); "
                     "this one needs " + std::to_string(need) + ". Retry when one has ended.");
    while (list_.size() >= kMaxBatches) {  // drop the oldest ended batch
      auto it = list_.end();
      for (auto j = list_.begin(); j != list_.end(); ++j)
        if ((*j)->done) it = j;
      if (it == list_.end()) break;  // (none: any_ended said otherwise)
      if ((*it)->thread.joinable()) (*it)->thread.join();
      bytes_ -= (*it)->bytes;
      list_.erase(it);
    }
    make_room_locked(need);
    auto b = std::make_shared<Batch>();
    b->id = C_.new_id("msgbatch_");
    b->created = std::time(nullptr);
    b->n = ids.size();
    b->custom_ids = std::move(ids);
    b->params = std::move(params);
    b->results.assign(b->n, std::string());
    b->bytes = need;
    bytes_ += need;
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
    const size_t n = b.n;
    json o{{"id", b.id}, {"type", "message_batch"}};
    o["processing_status"] = b.done ? "ended" : b.cancel ? "canceling" : "in_progress";
    o["request_counts"] = json{{"processing", n - b.succeeded - b.errored - b.canceled}, {"succeeded", b.succeeded},
                               {"errored", b.errored}, {"canceled", b.canceled}, {"expired", 0}};
    o["ended_at"] = b.done ? json(rfc3339(b.ended)) : json(nullptr);
    o["created_at"] = rfc3339(b.created);
    o["expires_at"] = rfc3339(b.created + 24 * 3600);
    o["archived_at"] = b.archived ? json(rfc3339(b.archived)) : json(nullptr);
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
    if (b.archived)
      throw ApiError(404, "The results of message batch " + b.id + " have expired: they were dropped at " +
                     rfc3339(b.archived) + " to keep this server's memory for message batches under --batches-mb "
                     "(the results of the batches that ended first go first).", "", "not_found_error");
    std::string out;
    out.reserve(b.bytes);
    for (const std::string& line : b.results) out += line;
    return out;
  }

  bool erase(const std::string& id) {
    std::lock_guard lk(mu_);
    for (auto it = list_.begin(); it != list_.end(); ++it)
      if ((*it)->id == id) {
        if (!(*it)->done) throw ApiError(400, "Message batch " + id + " is still processing: cancel it first.");
        if ((*it)->thread.joinable()) (*it)->thread.join();
        bytes_ -= (*it)->bytes;
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

  // Drops the results of ended batches, the first to end first, until `more` bytes fit the budget (or none is left).
  void make_room_locked(size_t more) {
    while (bytes_ + more > budget_) {
      Batch* first = nullptr;
      for (auto& b : list_)
        if (b->done && !b->archived && (!first || b->end_order < first->end_order)) first = b.get();
      if (!first) return;
      bytes_ -= first->bytes;
      first->bytes = 0;
      std::vector<std::string>().swap(first->results);
      first->archived = std::max<std::time_t>(std::time(nullptr), 1);
    }
  }

  // Keeps `line` as request i's result (its params dropped), or, when it does not fit even after the results of ended
  // batches were dropped, an errored line that does (within the room the request kept).
  void put_locked(Batch& b, size_t i, std::string line, size_t Batch::*count) {
    const std::string& cid = b.custom_ids[i];
    const size_t before = pending_bytes(cid, b.params[i]), kept = kSlots + cid.size() + line.size();
    if (kept > before) make_room_locked(kept - before);
    if (bytes_ + kept > budget_ + before) {
      line = result_line(cid, errored(ApiError(413, "The result (" + std::to_string(line.size()) + " bytes) did not fit "
                                               "this server's memory for message batches (--batches-mb): it was not kept.")));
      count = &Batch::errored;
    }
    b.results[i] = std::move(line);
    std::string().swap(b.params[i]);
    const size_t after = kSlots + cid.size() + b.results[i].size();
    b.bytes = b.bytes - before + after;
    bytes_ = bytes_ - before + after;
    ++(b.*count);
  }

  void set(Batch& b, size_t i, json result, size_t Batch::*count) {
    // (custom_ids and params change only on this batch's own thread, the caller's)
    std::string line = result_line(b.custom_ids[i], std::move(result));
    std::lock_guard lk(mu_);
    put_locked(b, i, std::move(line), count);
  }

  static json errored(const ApiError& e) {
    return json{{"type", "errored"}, {"error", anthropic_error_body(e)}};
  }

  // Starts request i; false when the queue is full (retry later).
  bool start_one(Batch& b, size_t i, std::vector<Running>& fl) {
    try {
      require_ready(C_);
      // (its share of the bodies parsed at once; none now: not yet, as a full queue)
      std::optional<ParseBudget::Lease> lease = C_.parse.try_acquire(b.params[i].size());
      if (!lease) return false;
      PreparedRequest r = ep_.prepare(parse_request_body(b.params[i]), C_.core->config(), C_.random_u64());
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
    const size_t n = b.n;
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
      if (b.results[i].empty())
        put_locked(b, i, result_line(b.custom_ids[i], errored(ApiError(500, "The request ended without a result."))),
                   &Batch::errored);
    b.done = true;
    b.ended = std::time(nullptr);
    b.end_order = ++ended_;
    // An ended batch keeps its results only: each line holds its custom_id, and every params string was dropped.
    for (const std::string& cid : b.custom_ids) {
      b.bytes -= cid.size();
      bytes_ -= cid.size();
    }
    std::vector<std::string>().swap(b.custom_ids);
    std::vector<std::string>().swap(b.params);
  }

  ServerContext& C_;
  Endpoint ep_;
  const size_t budget_;  // bytes (--batches-mb)
  std::mutex mu_;
  std::list<std::shared_ptr<Batch>> list_;  // newest first
  size_t bytes_ = 0;     // what the batches count, all together (at most budget_)
  uint64_t ended_ = 0;   // batches ended so far (Batch::end_order)
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

// A create's requests: each custom_id, and each params as its JSON text (what it counts against --batches-mb).
struct BatchRequests {
  std::vector<std::string> ids, params;
};

// The create's body {"requests": [{custom_id, params}, ...]}, read request by request (parse_request_body_handing): each
// params becomes its text as soon as it is read and its JSON values are freed, so that an 8 MB body of 10,000 requests
// is never held as JSON values all at once (~56 MB for 3.6 MB of small values), nor copied (the create copied every
// params before making it text: ~47 MB more). The errors are those of the whole, in the same order: the body, requests
// (an array of 1 to kMaxRequests), then the first bad request.
BatchRequests read_batch_requests(std::string_view text) {
  static const std::regex id_re("^[a-zA-Z0-9_-]{1,64}$");
  BatchRequests out;
  std::set<std::string> seen;
  std::optional<ApiError> bad;  // the first bad request
  auto take = [&](size_t i, ojson& r) {
    if (i == 0) {  // (a repeated "requests" key: the last one's requests are the batch's)
      out = {};
      seen.clear();
      bad.reset();
    }
    if (bad || i >= kMaxRequests) return;  // (an error already: the batch is refused)
    const std::string p = "requests." + std::to_string(i);
    if (!r.is_object() || !r.contains("custom_id") || !r["custom_id"].is_string() ||
        !std::regex_match(r["custom_id"].get<std::string>(), id_re)) {
      bad = ApiError(400, p + ".custom_id: 1 to 64 characters of a-z, A-Z, 0-9, '_' and '-' are required.", p + ".custom_id");
      return;
    }
    if (!r.contains("params") || !r["params"].is_object()) {
      bad = ApiError(400, p + ".params: a Messages request object is required.", p + ".params");
      return;
    }
    std::string id = r["custom_id"];
    if (!seen.insert(id).second) {
      bad = ApiError(400, p + ".custom_id: '" + id + "' is used twice in this batch.", p + ".custom_id");
      return;
    }
    out.params.push_back(dump_json(r["params"]));
    out.ids.push_back(std::move(id));
  };
  const ojson body = parse_request_body_handing(text, "requests", take);
  const auto it = body.find("requests");
  if (it == body.end() || !it->is_array()) throw ApiError(400, "requests: an array of {custom_id, params} is required.", "requests");
  if (it->empty() || it->size() > kMaxRequests)
    throw ApiError(400, "requests: 1 to " + std::to_string(kMaxRequests) + " requests per batch.", "requests");
  if (bad) throw *bad;
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
  auto not_held = [](const std::string& id) {
    return ApiError(404, "No message batch with id '" + quoted_id(id) + "' is held here.", "", "not_found_error");
  };
  auto held = [B, not_held](const std::string& id) {
    std::shared_ptr<Batch> b = B->find(id);
    if (!b) throw not_held(id);
    return b;
  };
  http.Post("/v1/messages/batches", [C, B](const httplib::Request& req, httplib::Response& res) {
    answer(*C, "/v1/messages/batches", res, [&] {
      const ParseBudget::Lease lease = C->parse.acquire(req.body.size(), kAnthropicOverloaded);
      BatchRequests rs = read_batch_requests(req.body);
      return dump_json(B->object(*B->add(std::move(rs.ids), std::move(rs.params)), base_url(req)));
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
  http.route("DELETE", one, [C, B, not_held](const httplib::Request& req, httplib::Response& res) {
    answer(*C, "/v1/messages/batches/{id}", res, [&] {
      const std::string id = req.matches[1];
      if (!B->erase(id)) throw not_held(id);
      return dump_json(json{{"id", id}, {"type", "message_batch_deleted"}});
    });
  }, ro);
}

}  // namespace lilac::server
