// Anthropic Message Batches (POST /v1/messages/batches) on the scripted backend (server_test_util.h).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "heap_count.h"
#include "server_test_util.h"
#include "text/chat_template.h"

using json = nlohmann::json;
using lilac::test::post_json;

// A batch sent while the model is still loading waits for it: every request errored at once with the 503 "still
// loading" (only a full queue was waited out).
TEST(MessageBatches, ABatchSentWhileTheModelLoadsWaitsForIt) {
  using namespace lilac;
  auto o = test::LocalServer::options();
  o.port = 0;
  o.log_requests = false;
  server::Server srv(o);
  const int port = srv.bind();
  srv.start();
  json reqs = json::array();
  for (const char* id : {"a", "b"})
    reqs.push_back({{"custom_id", id},
                    {"params", {{"max_tokens", 20}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}}}});
  const json batch = post_json(port, "/v1/messages/batches", {{"requests", reqs}});
  const std::string id = batch["id"];
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the batch's thread tries while the model loads
  auto tok = test::qwen3_tokenizer();
  auto tmpl = std::shared_ptr<const ChatTemplate>(ChatTemplate::from_source(
      read_text_file(std::string(LILAC_SHARED_DIR) + "/fixtures/qwen3.6-template/chat_template.jinja"), "qwen3.6"));
  srv.set_model(std::shared_ptr<Backend>(server::make_scripted_backend(test::default_script(), tok)), tok, tmpl);
  json b;
  for (int i = 0; i < 250; ++i) {
    auto r = httplib::Client("127.0.0.1", port).Get("/v1/messages/batches/" + id);
    ASSERT_TRUE(r);
    b = json::parse(r->body);
    if (b["processing_status"] == "ended") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(b["processing_status"], "ended") << b.dump();
  EXPECT_EQ(b["request_counts"]["succeeded"], 2) << b.dump();
  EXPECT_EQ(b["request_counts"]["errored"], 0) << b.dump();
  srv.stop();
}

namespace {

// A batch of Messages requests, one per content, custom ids r0, r1, ...
json batch_of(const std::vector<std::string>& contents, int max_tokens = 1000) {
  json reqs = json::array();
  for (size_t i = 0; i < contents.size(); ++i)
    reqs.push_back({{"custom_id", "r" + std::to_string(i)},
                    {"params", {{"max_tokens", max_tokens}, {"messages", {{{"role", "user"}, {"content", contents[i]}}}}}}});
  return {{"requests", reqs}};
}

std::string repeated(const std::string& word, size_t times) {
  std::string s;
  for (size_t i = 0; i < times; ++i) s += word;
  return s;
}

// GET path: status and parsed body (null when not JSON).
std::pair<int, json> get(int port, const std::string& path) {
  auto r = httplib::Client("127.0.0.1", port).Get(path);
  if (!r) return {0, json()};
  return {r->status, json::parse(r->body, nullptr, false)};
}

// The batch once it has ended (polled: its requests run on the scripted backend within a few seconds).
json ended(int port, const std::string& id) {
  json b;
  for (int i = 0; i < 500; ++i) {
    b = get(port, "/v1/messages/batches/" + id).second;
    if (b.is_object() && b["processing_status"] == "ended") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(b["processing_status"], "ended") << b.dump();
  return b;
}

// The results of an ended batch: its JSON lines parsed.
std::vector<json> results(int port, const std::string& id) {
  auto r = httplib::Client("127.0.0.1", port).Get("/v1/messages/batches/" + id + "/results");
  std::vector<json> out;
  if (!r || r->status != 200) {
    ADD_FAILURE() << "results of " << id << ": " << (r ? r->body : "no answer");
    return out;
  }
  for (size_t at = 0, nl; (nl = r->body.find('\n', at)) != std::string::npos; at = nl + 1)
    out.push_back(json::parse(r->body.substr(at, nl - at)));
  return out;
}

}  // namespace

// Batches had no memory bound: 64 running batches each kept their parsed requests (an 8 MB body each), and ended ones
// kept all their results. They share --batches-mb now (ServerOptions::batches_bytes): a batch larger than all of it is
// Anthropic's 413 request_too_large (its batch size limit's answer), and one that does not fit beside the running
// batches' requests is 429 rate_limit_error (retry when one has ended); once the running batch ended, it fits.
TEST(MessageBatches, ABatchMustFitTheMemoryForBatches) {
  auto o = lilac::test::LocalServer::options();
  o.batches_bytes = 32 << 10;
  lilac::test::LocalServer srv(o);
  const json too_large = post_json(srv.port, "/v1/messages/batches", batch_of({std::string(40000, 'a')}), 413);
  EXPECT_EQ(too_large["type"], "error") << too_large.dump();
  EXPECT_EQ(too_large["error"]["type"], "request_too_large") << too_large.dump();
  EXPECT_NE(too_large["error"]["message"].get<std::string>().find("--batches-mb"), std::string::npos) << too_large.dump();
  // A batch running (a "slow" reply: a token every 20 ms, up to 1,000) holds its 20 KB of requests.
  const json running = post_json(srv.port, "/v1/messages/batches", batch_of({repeated("slow ", 4000)}));
  const std::string id = running["id"];
  const json b = batch_of({repeated("hi ", 6000)});
  const json busy = post_json(srv.port, "/v1/messages/batches", b, 429);
  EXPECT_EQ(busy["type"], "error") << busy.dump();
  EXPECT_EQ(busy["error"]["type"], "rate_limit_error") << busy.dump();
  EXPECT_NE(busy["error"]["message"].get<std::string>().find("--batches-mb"), std::string::npos) << busy.dump();
  EXPECT_EQ(post_json(srv.port, "/v1/messages/batches/" + id + "/cancel", json::object())["id"], id);
  const json canceled = ended(srv.port, id);
  EXPECT_EQ(canceled["request_counts"]["canceled"], 1) << canceled.dump();
  const json second = post_json(srv.port, "/v1/messages/batches", b);
  EXPECT_EQ(ended(srv.port, second["id"])["request_counts"]["succeeded"], 1);
  // Both fit: the first's results are still there.
  const std::vector<json> first = results(srv.port, id);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0]["result"]["type"], "canceled") << first[0].dump();
}

// When a new batch or a result does not fit, the results of ended batches make room, those of the batch that ended
// first first: its GET .../results is then a 404 saying they expired, and the batch has an archived_at (Anthropic's
// field for results no longer available); its counts stay. A later batch's results are kept while they fit.
TEST(MessageBatches, TheResultsOfTheFirstBatchToEndAreDroppedFirst) {
  const std::string reply = repeated("word ", 400);  // ~2 KB of text: a result line of ~2.3 KB
  const json script = {{"rules", {{{"match", "long"}, {"reply", reply}}}},
                       {"default", {{"reply", "local answer"}}}};
  auto o = lilac::test::LocalServer::options();
  o.batches_bytes = 38 << 10;  // (all three: ~43 KB; without the first batch's results: ~34 KB)
  lilac::test::LocalServer srv(o, nullptr, script);
  std::vector<std::string> ids;
  for (int k = 0; k < 2; ++k) {  // two batches of ~9.5 KB of results each, one after the other
    const json b = post_json(srv.port, "/v1/messages/batches", batch_of({"long 0", "long 1", "long 2", "long 3"}));
    ids.push_back(b["id"]);
    EXPECT_EQ(ended(srv.port, ids.back())["request_counts"]["succeeded"], 4);
    const std::vector<json> rs = results(srv.port, ids.back());
    ASSERT_EQ(rs.size(), 4u);
    EXPECT_EQ(rs[3]["custom_id"], "r3");
    EXPECT_EQ(rs[3]["result"]["message"]["content"][0]["text"], reply) << rs[3].dump().substr(0, 300);
  }
  // ~25 KB of requests: beside both batches' results it would not fit; beside the second's alone it does.
  const json third = post_json(srv.port, "/v1/messages/batches", batch_of({repeated("hi ", 8000)}));
  EXPECT_EQ(ended(srv.port, third["id"])["request_counts"]["succeeded"], 1);
  const auto [status, gone] = get(srv.port, "/v1/messages/batches/" + ids[0] + "/results");
  EXPECT_EQ(status, 404) << gone.dump();
  EXPECT_EQ(gone["type"], "error") << gone.dump();
  EXPECT_EQ(gone["error"]["type"], "not_found_error") << gone.dump();
  EXPECT_NE(gone["error"]["message"].get<std::string>().find("expired"), std::string::npos) << gone.dump();
  const json first = get(srv.port, "/v1/messages/batches/" + ids[0]).second;
  EXPECT_TRUE(first["archived_at"].is_string()) << first.dump();
  EXPECT_EQ(first["processing_status"], "ended") << first.dump();
  EXPECT_EQ(first["request_counts"]["succeeded"], 4) << first.dump();
  EXPECT_TRUE(get(srv.port, "/v1/messages/batches/" + ids[1]).second["archived_at"].is_null());
  EXPECT_EQ(results(srv.port, ids[1]).size(), 4u);
  EXPECT_EQ(results(srv.port, third["id"]).size(), 1u);
}

// A running batch's result larger than all the memory for batches (what ended batches hold dropped, and still not
// enough) is not kept: the request is errored, request_too_large, saying so; the batch ends, its other results kept.
TEST(MessageBatches, AResultThatDoesNotFitIsAnErroredResult) {
  const std::string reply = repeated("word ", 2000);  // ~10 KB
  const json script = {{"rules", {{{"match", "long"}, {"reply", reply}}}},
                       {"default", {{"reply", "local answer"}}}};
  auto o = lilac::test::LocalServer::options();
  o.batches_bytes = 8 << 10;
  lilac::test::LocalServer srv(o, nullptr, script);
  const json b = post_json(srv.port, "/v1/messages/batches", batch_of({"long", "short"}, 4000));
  const std::string id = b["id"];
  const json done = ended(srv.port, id);
  EXPECT_EQ(done["request_counts"]["errored"], 1) << done.dump();
  EXPECT_EQ(done["request_counts"]["succeeded"], 1) << done.dump();
  const std::vector<json> rs = results(srv.port, id);
  ASSERT_EQ(rs.size(), 2u);
  EXPECT_EQ(rs[0]["result"]["type"], "errored") << rs[0].dump();
  EXPECT_EQ(rs[0]["result"]["error"]["error"]["type"], "request_too_large") << rs[0].dump();
  EXPECT_NE(rs[0]["result"]["error"]["error"]["message"].get<std::string>().find("--batches-mb"), std::string::npos)
      << rs[0].dump();
  EXPECT_EQ(rs[1]["result"]["type"], "succeeded") << rs[1].dump();
  EXPECT_EQ(rs[1]["result"]["message"]["content"][0]["text"], "local answer") << rs[1].dump();
}

// Clients at once: several create batches (a small --batches-mb: some creates get 429, ended batches' results are
// dropped to make room), cancel some at once, poll them, read their results and delete some, while another lists the
// batches; the server then stops with a batch still running. Every batch ends with its three requests counted once,
// its results (when kept) in request order. Run under ThreadSanitizer by scripts/test-tsan.sh: the store's lock, the
// batches' threads and their joins (cancel, delete, the oldest dropped, stop) all meet here.
TEST(MessageBatches, ClientsAtOnceCreateCancelReadDeleteAndList) {
  const json script = {{"rules", {{{"match", "slow"}, {"reply", " x"}, {"repeat", true}, {"delay_ms", 5}}}},
                       {"default", {{"reply", "local answer"}, {"delay_ms", 1}}}};
  auto o = lilac::test::LocalServer::options();
  o.batches_bytes = 5 << 10;
  auto srv = std::make_unique<lilac::test::LocalServer>(o, nullptr, script);
  const int port = srv->port;
  std::atomic<bool> done{false};
  std::atomic<int> created{0};
  auto client = [&](int who) {
    httplib::Client cli("127.0.0.1", port);
    for (int k = 0; k < 6; ++k) {
      const json body = batch_of({"slow " + std::to_string(who), "hi", "slow"}, 8);
      std::string id;
      for (int tries = 0; id.empty(); ++tries) {
        auto r = cli.Post("/v1/messages/batches", body.dump(), "application/json");
        ASSERT_TRUE(r);
        if (r->status == 429 && tries < 200) {  // the others' running batches hold the budget
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
          continue;
        }
        ASSERT_EQ(r->status, 200) << r->body;
        id = json::parse(r->body)["id"];
      }
      ++created;
      if (k % 2 == 0) {
        auto c = cli.Post("/v1/messages/batches/" + id + "/cancel", "{}", "application/json");
        ASSERT_TRUE(c);
        EXPECT_EQ(c->status, 200) << c->body;
      }
      const json b = ended(port, id);
      const json& n = b["request_counts"];
      EXPECT_EQ(n["succeeded"].get<int>() + n["errored"].get<int>() + n["canceled"].get<int>(), 3) << b.dump();
      EXPECT_EQ(n["processing"], 0) << b.dump();
      std::this_thread::sleep_for(std::chrono::milliseconds(30));  // (the others' batches may need its results' room)
      auto res = cli.Get("/v1/messages/batches/" + id + "/results");
      ASSERT_TRUE(res);
      if (res->status == 404) {  // dropped for another batch's room: the batch says so
        EXPECT_TRUE(get(port, "/v1/messages/batches/" + id).second["archived_at"].is_string());
      } else {
        EXPECT_EQ(res->status, 200) << res->body.substr(0, 300);
        size_t lines = 0;
        for (size_t at = 0, nl; (nl = res->body.find('\n', at)) != std::string::npos; at = nl + 1, ++lines)
          EXPECT_EQ(json::parse(res->body.substr(at, nl - at))["custom_id"], "r" + std::to_string(lines));
        EXPECT_EQ(lines, 3u);
      }
      if (k % 3 == 1) {
        auto d = cli.Delete("/v1/messages/batches/" + id);
        ASSERT_TRUE(d);
        EXPECT_EQ(d->status, 200) << d->body;
        EXPECT_EQ(get(port, "/v1/messages/batches/" + id).first, 404);
      }
    }
  };
  std::thread lister([&] {
    httplib::Client cli("127.0.0.1", port);
    while (!done.load()) {
      auto r = cli.Get("/v1/messages/batches?limit=100");
      ASSERT_TRUE(r);
      ASSERT_EQ(r->status, 200) << r->body;
      const json page = json::parse(r->body);
      for (const json& b : page["data"]) {
        const std::string st = b["processing_status"];
        EXPECT_TRUE(st == "in_progress" || st == "canceling" || st == "ended") << b.dump();
      }
    }
  });
  std::vector<std::thread> clients;
  for (int who = 0; who < 4; ++who) clients.emplace_back(client, who);
  for (auto& t : clients) t.join();
  done = true;
  lister.join();
  EXPECT_EQ(created.load(), 24);
  // A batch still running when the server stops: its thread is ended and joined (the generations are aborted).
  post_json(port, "/v1/messages/batches", batch_of({"slow", "slow"}, 1000));
  srv.reset();
}

// A create's body was parsed whole into JSON values (~56 MB for this 3.6 MB body of small values), then every request's
// params was copied out of it (~47 MB more) before becoming text: ~97 MB of heap at once over the body (~110 MB
// resident), outside --batches-mb, and as many times that as creates were read at once. The requests are read one at a
// time now (parse_request_body_handing), each params made text at once: ~18 MB, about the body's copies and the text.
TEST(MessageBatches, ACreateIsNotHeldAsJsonValuesAllAtOnce) {
  lilac::test::LocalServer srv(lilac::test::LocalServer::options());
  // 10,000 requests of 85 empty objects each: ~960,000 values (the limit is 1,048,576) in 3.6 MB.
  std::string content = "[";
  for (int i = 0; i < 85; ++i) content += i ? ",{}" : "{}";
  content += "]";
  std::string body = "{\"requests\":[";
  for (int i = 0; i < 10000; ++i)
    body += std::string(i ? "," : "") + "{\"custom_id\":\"r" + std::to_string(i) +
            "\",\"params\":{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":" + content + "}]}}";
  body += "]}";
  httplib::Client cli("127.0.0.1", srv.port);
  ASSERT_TRUE(lilac::test::heap_counted()) << "the sanitizer's malloc hooks could not be installed";
  const int64_t before = lilac::test::heap_live();
  lilac::test::heap_peak_reset();
  auto r = cli.Post("/v1/messages/batches", body, "application/json");
  const int64_t peak = lilac::test::heap_peak();
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body.substr(0, 300);
  const std::string id = json::parse(r->body)["id"];
  // The body's copies (the client's request, the server's), the requests' text (~3.4 MB) and their ids: ~18 MB.
  EXPECT_LT(peak - before, int64_t(40) << 20) << "bytes over the " << before << " held before the create";
  post_json(srv.port, "/v1/messages/batches/" + id + "/cancel", json::object());
  EXPECT_EQ(ended(srv.port, id)["request_counts"]["processing"], 0);
}

// The create reads its requests one at a time now (above); its errors are still those of the whole body, in the same
// order: the JSON, then requests (an array of 1 to 10,000), then the first bad request. A guard of that reading: it
// passes before and after.
TEST(MessageBatches, ACreatesErrorsAreTheWholeBodys) {
  lilac::test::LocalServer srv(lilac::test::LocalServer::options());
  auto create = [&](const std::string& body, int want) {
    auto r = httplib::Client("127.0.0.1", srv.port).Post("/v1/messages/batches", body, "application/json");
    EXPECT_TRUE(r);
    if (!r) return json();
    EXPECT_EQ(r->status, want) << r->body.substr(0, 300);
    return json::parse(r->body, nullptr, false);
  };
  const std::string good = R"({"custom_id":"a","params":{"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}})";
  const std::string bad = R"({"custom_id":"a b","params":{}})";
  // A bad request, then JSON that breaks: the JSON's error.
  json e = create(R"({"requests":[)" + bad + "," + good, 400);
  EXPECT_EQ(e["error"]["type"], "invalid_request_error") << e.dump();
  EXPECT_NE(e["error"]["message"].get<std::string>().find("parse the JSON"), std::string::npos) << e.dump();
  // 10,001 requests, the second bad: the count's error.
  std::string many = R"({"requests":[)" + good + "," + bad;
  for (int i = 2; i < 10001; ++i) many += ",{}";
  e = create(many + "]}", 400);
  EXPECT_EQ(e["error"]["message"], "requests: 1 to 10000 requests per batch.") << e.dump();
  // The first bad request of several.
  e = create(R"({"requests":[)" + good + R"(,{"custom_id":"b"},)" + bad + "]}", 400);
  EXPECT_EQ(e["error"]["message"], "requests.1.params: a Messages request object is required.") << e.dump();
  e = create(R"({"requests":[)" + good + "," + good + "]}", 400);
  EXPECT_EQ(e["error"]["message"], "requests.1.custom_id: 'a' is used twice in this batch.") << e.dump();
  // A repeated "requests": the last one's requests are the batch (as the JSON's last value is the key's).
  e = create(R"({"requests":[)" + bad + R"(],"requests":[)" + good + "]}", 200);
  EXPECT_EQ(ended(srv.port, e["id"])["request_counts"]["succeeded"], 1) << e.dump();
  e = create(R"({"requests":[)" + good + R"(],"requests":[]})", 400);
  EXPECT_EQ(e["error"]["message"], "requests: 1 to 10000 requests per batch.") << e.dump();
  e = create(R"({"requests":[)" + good + R"(],"requests":{}})", 400);
  EXPECT_EQ(e["error"]["message"], "requests: an array of {custom_id, params} is required.") << e.dump();
}
