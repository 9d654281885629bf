// The HTTP server in-process (scripted backend, real Qwen3 tokenizer and Qwen3.6 template) with an
// httplib client: the RouteHook contract used by the hybrid router, and error bodies.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>

#include <nlohmann/json.hpp>

#include "server/server.h"
#include "server_test_util.h"

using json = nlohmann::json;

namespace {

struct Local : lilac::test::LocalServer {
  explicit Local(lilac::server::RouteHook* hook = nullptr, int max_queue = 8)
      : LocalServer(options(max_queue), hook) {}
};

json chat_body(const std::string& text, const std::string& model = "") {
  json b = {{"messages", {{{"role", "user"}, {"content", text}}}}};
  if (!model.empty()) b["model"] = model;
  return b;
}

}  // namespace

TEST(ServerHttp, WithoutHookNoRouteMarkers) {
  Local l;
  httplib::Client cli("127.0.0.1", l.port);
  auto r = cli.Post("/v1/chat/completions", chat_body("hi").dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  auto j = json::parse(r->body);
  EXPECT_EQ(j["choices"][0]["message"]["content"], "local answer");
  EXPECT_FALSE(j.contains("lilac_route"));
  EXPECT_FALSE(r->has_header("x-lilac-route"));
  // Error body shape.
  r = cli.Post("/v1/chat/completions", "{oops", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  j = json::parse(r->body);
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["code"], "invalid_json");
  EXPECT_TRUE(j["error"]["param"].is_null());
  r = cli.Get("/nope");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_TRUE(json::parse(r->body).contains("error"));
}

TEST(ServerHttp, RouteHookForwardsOrMarksLocal) {
  std::atomic<int> forwarded{0}, local{0};
  std::atomic<bool> saw_busy{false};
  lilac::server::RouteHook hook;
  using K = lilac::server::RouteDecisionKind;
  hook.maybe_forward = [&](const httplib::Request& req, httplib::Response& res, const json& body, bool busy) {
    if (busy) saw_busy = true;
    if (body.value("model", "") != "cloud-model") return K::Local;
    ++forwarded;
    res.set_header("x-lilac-route", "cloud");
    res.set_content(json{{"forwarded", true}, {"path", req.path}}.dump(), "application/json");
    return K::Answered;
  };
  hook.on_local = [&](const json& body) {
    EXPECT_TRUE(body.contains("messages"));
    ++local;
  };
  hook.extra_models = [] { return json::array({{{"id", "cloud/cloud-model"}, {"object", "model"}, {"owned_by", "upstream"}}}); };
  Local l(&hook, 1);
  httplib::Client cli("127.0.0.1", l.port);

  auto r = cli.Post("/v1/chat/completions", chat_body("hi", "cloud-model").dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("x-lilac-route"), "cloud");
  EXPECT_EQ(json::parse(r->body)["path"], "/v1/chat/completions");
  EXPECT_EQ(forwarded, 1);
  EXPECT_EQ(local, 0);

  r = cli.Post("/v1/chat/completions", chat_body("hi").dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("x-lilac-route"), "local");
  auto j = json::parse(r->body);
  EXPECT_EQ(j["lilac_route"], "local");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "local answer");
  EXPECT_EQ(local, 1);

  // Streaming chunks carry the field too.
  json sb = chat_body("hi");
  sb["stream"] = true;
  r = cli.Post("/v1/chat/completions", sb.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->get_header_value("x-lilac-route"), "local");
  size_t chunks = 0, marked = 0;
  for (size_t p = r->body.find("data: {"); p != std::string::npos; p = r->body.find("data: {", p + 1)) {
    ++chunks;
    size_t e = r->body.find("\n\n", p);
    marked += r->body.substr(p, e - p).find("\"lilac_route\":\"local\"") != std::string::npos;
  }
  EXPECT_GE(chunks, 3u);
  EXPECT_EQ(marked, chunks);

  r = cli.Get("/v1/models");
  ASSERT_TRUE(r);
  j = json::parse(r->body);
  ASSERT_EQ(j["data"].size(), 2u);
  EXPECT_EQ(j["data"][0]["id"], "local-model");
  EXPECT_EQ(j["data"][1]["id"], "cloud/cloud-model");

  // local_busy is true while the queue (max 1) is full.
  httplib::Client slow("127.0.0.1", l.port);
  json slow_body = chat_body("slow");
  slow_body["stream"] = true;
  slow_body["max_tokens"] = 40;
  std::thread t([&] { slow.Post("/v1/chat/completions", slow_body.dump(), "application/json"); });
  for (int i = 0; i < 100 && !saw_busy; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    auto b = cli.Post("/v1/chat/completions", chat_body("hi").dump(), "application/json");
    ASSERT_TRUE(b);
    if (saw_busy) EXPECT_EQ(b->status, 429);
  }
  t.join();
  EXPECT_TRUE(saw_busy);
}
