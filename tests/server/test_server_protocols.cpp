// The server in-process (scripted backend, real Qwen3 tokenizer and Qwen3.6 template) with an httplib
// client: the chat page's embedded files, the API key through either header, the HTTP layer's and the
// route hook's errors in Anthropic's shape on /v1/messages, and lilac_route in every Messages /
// Responses event when a hook is set.
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>

#include "core/mapped_file.h"
#include "server/scripted_backend.h"
#include "server/server.h"
#include "server/web_assets.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

using json = nlohmann::json;

namespace {

struct Local {
  std::unique_ptr<lilac::server::Server> server;
  int port = 0;
  explicit Local(const std::string& api_key = "", lilac::server::RouteHook* hook = nullptr,
                 size_t responses_bytes = lilac::server::ServerOptions().responses_bytes) {
    const std::string shared = LILAC_SHARED_DIR;
    static auto tok =
        std::shared_ptr<const lilac::Tokenizer>(lilac::Tokenizer::load(shared + "/fixtures/qwen3-tokenizer"));
    auto tmpl = std::shared_ptr<const lilac::ChatTemplate>(lilac::ChatTemplate::from_source(
        lilac::read_text_file(shared + "/fixtures/qwen3.6-template/chat_template.jinja"), "qwen3.6"));
    json script = {{"default", {{"reply", "plain answer"}}}};
    auto backend = std::shared_ptr<lilac::Backend>(lilac::server::make_scripted_backend(script, tok));
    lilac::server::ServerOptions o;
    o.port = 0;
    o.model_id = "m";
    o.api_key = api_key;
    o.log_requests = false;
    o.responses_bytes = responses_bytes;
    server = std::make_unique<lilac::server::Server>(o);
    if (hook) server->set_route_hook(*hook);
    port = server->bind();
    server->start();
    server->set_model(backend, tok, tmpl);
  }
};

const std::string kMessages = R"({"max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]})";

// The data lines of an SSE body, parsed.
std::vector<json> sse_data(const std::string& body) {
  std::vector<json> out;
  size_t p = 0;
  while ((p = body.find("data: ", p)) != std::string::npos) {
    size_t e = body.find('\n', p);
    out.push_back(json::parse(body.substr(p + 6, e - p - 6)));
    p = e;
  }
  return out;
}

}  // namespace

TEST(ServerProtocols, ChatPageFilesAreEmbeddedAndServed) {
  const auto& assets = lilac::server::web_assets();
  ASSERT_GE(assets.size(), 4u);
  Local l("secret");  // the page needs no key
  httplib::Client cli("127.0.0.1", l.port);
  auto r = cli.Get("/");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/html; charset=utf-8");
  EXPECT_NE(r->body.find("<title>lilac</title>"), std::string::npos);
  EXPECT_NE(r->body.find("src=\"/app.js\""), std::string::npos);
  for (const auto& a : assets) {
    auto f = cli.Get(a.path);
    ASSERT_TRUE(f) << a.path;
    EXPECT_EQ(f->status, 200) << a.path;
    EXPECT_EQ(f->body, std::string(reinterpret_cast<const char*>(a.data), a.size)) << a.path;
  }
  EXPECT_EQ(cli.Get("/app.js")->get_header_value("Content-Type"), "text/javascript; charset=utf-8");
  EXPECT_EQ(cli.Get("/markdown.mjs")->get_header_value("Content-Type"), "text/javascript; charset=utf-8");
  EXPECT_EQ(cli.Get("/style.css")->get_header_value("Content-Type"), "text/css; charset=utf-8");
}

TEST(ServerProtocols, ApiKeyByEitherHeaderAndAnthropicShapedLayerErrors) {
  Local l("secret");
  httplib::Client cli("127.0.0.1", l.port);
  auto r = cli.Post("/v1/messages", kMessages, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  auto j = json::parse(r->body);
  EXPECT_EQ(j["type"], "error");
  EXPECT_EQ(j["error"]["type"], "authentication_error");
  r = cli.Post("/v1/responses", R"({"input": "hi"})", "application/json");
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "invalid_api_key");  // OpenAI's shape there
  r = cli.Post("/v1/messages", {{"x-api-key", "secret"}}, kMessages, "application/json");
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["content"][0]["text"], "plain answer");
  r = cli.Post("/v1/messages", {{"Authorization", "Bearer secret"}}, kMessages, "application/json");
  EXPECT_EQ(r->status, 200);
  r = cli.Post("/v1/chat/completions", {{"x-api-key", "secret"}}, R"({"messages": [{"role": "user", "content": "hi"}]})",
               "application/json");
  EXPECT_EQ(r->status, 200);
  r = cli.Post("/v1/messages", {{"x-api-key", "wrong"}}, kMessages, "application/json");
  EXPECT_EQ(r->status, 401);
  r = cli.Post("/v1/messages/count_tokens", R"({"messages": [{"role": "user", "content": "hi"}]})", "application/json");
  EXPECT_EQ(r->status, 401);  // the HTTP layer's answer, in the route's (Anthropic's) shape
  EXPECT_EQ(json::parse(r->body)["error"]["type"], "authentication_error");
}

TEST(ServerProtocols, RouteHookErrorsAreRewrittenAndLocalAnswersMarked) {
  lilac::server::RouteHook hook;
  using K = lilac::server::RouteDecisionKind;
  hook.maybe_forward = [](const httplib::Request&, httplib::Response& res, const nlohmann::ordered_json& body, bool) {
    if (!body.contains("refuse")) return K::Local;
    res.status = 403;
    res.set_content(R"({"error": {"message": "not allowed", "type": "permission_error", "param": "model", "code": "route_forbidden"}})",
                    "application/json");
    return K::Answered;
  };
  Local l("", &hook);
  httplib::Client cli("127.0.0.1", l.port);
  auto r = cli.Post("/v1/messages", R"({"refuse": 1, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 403);
  auto j = json::parse(r->body);
  EXPECT_EQ(j["type"], "error");
  EXPECT_EQ(j["error"]["type"], "permission_error");
  EXPECT_EQ(j["error"]["message"], "model: not allowed");
  r = cli.Post("/v1/responses", R"({"refuse": 1, "input": "hi"})", "application/json");
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "route_forbidden");  // OpenAI's shape kept
  // Served locally: every event says so.
  r = cli.Post("/v1/messages", R"({"stream": true, "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]})", "application/json");
  EXPECT_EQ(r->get_header_value("x-lilac-route"), "local");
  auto evs = sse_data(r->body);
  ASSERT_GE(evs.size(), 6u);
  for (const auto& e : evs) EXPECT_EQ(e["lilac_route"], "local") << e.dump();
  r = cli.Post("/v1/responses", R"({"stream": true, "input": "hi", "reasoning": {"effort": "none"}})", "application/json");
  evs = sse_data(r->body);
  ASSERT_GE(evs.size(), 8u);
  for (size_t i = 0; i < evs.size(); ++i) {
    EXPECT_EQ(evs[i]["lilac_route"], "local");
    EXPECT_EQ(evs[i]["sequence_number"], i);
  }
  EXPECT_EQ(evs.back()["type"], "response.completed");
  EXPECT_EQ(evs.back()["response"]["output"][0]["content"][0]["text"], "plain answer");
}

// A Responses request that continues a conversation stored here is answered here, whatever the route hook
// would decide: only this server holds that conversation (and what it holds stays here). One that names an
// id this server does not hold goes through the hook as any request.
TEST(ServerProtocols, ContinuingAStoredResponseStaysLocal) {
  lilac::server::RouteHook hook;
  using K = lilac::server::RouteDecisionKind;
  hook.maybe_forward = [](const httplib::Request&, httplib::Response& res, const nlohmann::ordered_json& body, bool) {
    if (!body.contains("previous_response_id")) return K::Local;
    res.status = 200;  // "the cloud" answers every follow-up it is given
    res.set_content(R"({"id": "resp_cloud", "object": "response"})", "application/json");
    return K::Answered;
  };
  Local l("", &hook);
  httplib::Client cli("127.0.0.1", l.port);
  auto r = cli.Post("/v1/responses", R"({"input": "hi", "reasoning": {"effort": "none"}})", "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const std::string id = json::parse(r->body)["id"];
  json follow = {{"input", "and?"}, {"previous_response_id", id}, {"reasoning", {{"effort", "none"}}}};
  r = cli.Post("/v1/responses", follow.dump(), "application/json");
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->get_header_value("x-lilac-route"), "local");
  EXPECT_EQ(json::parse(r->body)["previous_response_id"], id);
  EXPECT_EQ(cli.Get("/v1/responses/" + id)->status, 200);
  follow["previous_response_id"] = "resp_elsewhere";
  r = cli.Post("/v1/responses", follow.dump(), "application/json");
  EXPECT_EQ(json::parse(r->body)["id"], "resp_cloud");
  EXPECT_EQ(cli.Get("/v1/responses/resp_elsewhere")->status, 404);
  EXPECT_EQ(cli.Delete("/v1/responses/" + id)->status, 200);
  EXPECT_EQ(cli.Delete("/v1/responses/" + id)->status, 404);
}

// The same for a Responses request naming a conversation held here (by id or as {"id"}); one this server does not
// hold goes through the hook.
TEST(ServerProtocols, AResponseInAConversationHeldHereStaysLocal) {
  lilac::server::RouteHook hook;
  using K = lilac::server::RouteDecisionKind;
  hook.maybe_forward = [](const httplib::Request& req, httplib::Response& res, const nlohmann::ordered_json& body, bool) {
    if (req.path != "/v1/responses" || !body.contains("conversation")) return K::Local;
    res.status = 200;  // "the cloud" answers every request in a conversation it is given
    res.set_content(R"({"id": "resp_cloud", "object": "response"})", "application/json");
    return K::Answered;
  };
  Local l("", &hook);
  httplib::Client cli("127.0.0.1", l.port);
  auto r = cli.Post("/v1/conversations", R"({"items": [{"role": "user", "content": "earlier"}]})", "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const std::string conv = json::parse(r->body)["id"];
  for (const json& c : {json(conv), json{{"id", conv}}}) {
    json req = {{"input", "hi"}, {"conversation", c}, {"reasoning", {{"effort", "none"}}}};
    r = cli.Post("/v1/responses", req.dump(), "application/json");
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(r->get_header_value("x-lilac-route"), "local");
    EXPECT_EQ(json::parse(r->body)["conversation"]["id"], conv);
  }
  r = cli.Get("/v1/conversations/" + conv + "/items?order=asc&limit=100");
  ASSERT_EQ(r->status, 200);
  const json items = json::parse(r->body)["data"];
  ASSERT_GE(items.size(), 5u);  // earlier, then each turn's input and output
  EXPECT_EQ(items[0]["content"][0]["text"], "earlier");
  EXPECT_EQ(items[1]["content"][0]["text"], "hi");
  r = cli.Post("/v1/responses", json{{"input", "hi"}, {"conversation", "conv_elsewhere"}}.dump(), "application/json");
  EXPECT_EQ(json::parse(r->body)["id"], "resp_cloud");
}

// --responses-mb 0: nothing is kept, so nothing can be continued or retrieved.
TEST(ServerProtocols, AStoreOfNoBytesKeepsNoResponse) {
  Local srv("", nullptr, /*responses_bytes=*/0);
  httplib::Client cli("127.0.0.1", srv.port);
  auto r = cli.Post("/v1/responses", R"({"input": "hi", "reasoning": {"effort": "none"}})", "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  const std::string id = json::parse(r->body)["id"];
  EXPECT_EQ(cli.Get("/v1/responses/" + id)->status, 404);
  json follow = {{"input", "and?"}, {"previous_response_id", id}};
  r = cli.Post("/v1/responses", follow.dump(), "application/json");
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "previous_response_not_found");
}
