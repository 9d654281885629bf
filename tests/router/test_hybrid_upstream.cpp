// The hybrid router over HTTP on loopback (fixtures: fake_upstream.h): a fake upstream records what it receives; a
// front server runs HybridRouter::maybe_forward like `lilac serve` does. Checks forwarding (model rewrite, `lilac`
// stripped, Bearer key), streaming passed through chunk by chunk with `lilac_route`, 4xx passthrough, 5xx and
// unreachable fallback or 502, and /v1/models merging. (The Responses routes for upstream ids:
// test_hybrid_upstream_responses.cpp.)
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <mutex>
#include <string>
#include <thread>

#include "router/fake_upstream.h"

using namespace lilac::router;
using namespace lilac::router::testing;


TEST(HybridUpstream, ParsesUpstreamUrls) {
  auto u = parse_upstream_url("http://127.0.0.1:9000");
  EXPECT_EQ(u.scheme, "http");
  EXPECT_EQ(u.host, "127.0.0.1");
  EXPECT_EQ(u.port, 9000);
  EXPECT_EQ(u.base, "/v1");
  u = parse_upstream_url("https://api.example.com/openai/v1/");
  EXPECT_EQ(u.port, 443);
  EXPECT_EQ(u.base, "/openai/v1");
  EXPECT_EQ(u.origin(), "https://api.example.com:443");
  u = parse_upstream_url("http://[::1]:8081/v1");
  EXPECT_EQ(u.host, "::1");
  EXPECT_EQ(u.port, 8081);
  EXPECT_EQ(u.origin(), "http://[::1]:8081");  // was "http://::1:8081": no client could connect
  EXPECT_THROW(parse_upstream_url("ftp://x"), lilac::InputError);
  EXPECT_THROW(parse_upstream_url("localhost:80"), lilac::InputError);
  EXPECT_THROW(parse_upstream_url("http://user:pw@host/v1"), lilac::InputError);
  EXPECT_THROW(parse_upstream_url("http://host:99999"), lilac::InputError);
  EXPECT_TRUE(upstream_https_supported());  // Debian's cpp-httplib is built with OpenSSL
}

// SSE's field syntax: "data:" and one optional space before the payload. A bare "data" line (an empty data field in
// SSE) carries no payload for lilac's readers (JSON events), so it is none here.
TEST(HybridUpstream, ReadsTheSseDataPayloadWithOrWithoutTheSpace) {
  EXPECT_EQ(sse_data_payload("data: {\"a\":1}"), "{\"a\":1}");
  EXPECT_EQ(sse_data_payload("data:{\"a\":1}"), "{\"a\":1}");
  EXPECT_EQ(sse_data_payload("data:  {}\n"), " {}\n");  // one space only is the separator
  EXPECT_EQ(sse_data_payload("data:"), "");
  EXPECT_EQ(sse_data_payload("data"), std::nullopt);
  EXPECT_EQ(sse_data_payload("event: data: {}"), std::nullopt);
  EXPECT_EQ(sse_data_payload(": data: {}"), std::nullopt);
}

TEST(HybridUpstream, InjectsRouteIntoSseDataLines) {
  std::string in = "data: {\"a\":1}\n\ndata: {}\n: comment\ndata: [DONE]\n\n";
  EXPECT_EQ(inject_route_into_sse_lines(in, "cloud"),
            "data: {\"lilac_route\":\"cloud\",\"a\":1}\n\ndata: {\"lilac_route\":\"cloud\"}\n: comment\ndata: [DONE]\n\n");
}

TEST(HybridUpstream, ForwardsNonStreamingWithKeyAndRewrittenModel) {
  FakeUpstream up;
  Front front("http://127.0.0.1:" + std::to_string(up.port), R"({"upstream": {"drop_fields": ["top_k"]}})");
  json b = chat_body("What is 2+2?");
  b["lilac"] = {{"route", "cloud"}};
  b["top_k"] = 20;
  auto r = front.post(b);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("x-lilac-route"), "cloud");
  json j = json::parse(r->body);
  EXPECT_EQ(j["lilac_route"], "cloud");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "from upstream");
  EXPECT_EQ(j["usage"]["total_tokens"], 9);
  ASSERT_EQ(up.count(), 1u);
  json sent = up.last();
  EXPECT_EQ(sent["model"], "up-model");
  EXPECT_FALSE(sent.contains("lilac"));
  EXPECT_FALSE(sent.contains("top_k"));
  EXPECT_EQ(sent["messages"][0]["content"], "What is 2+2?");
  EXPECT_EQ(up.last_auth(), "Bearer sk-test-NEVERLOGME-0123456789abcdef");
  // /v1/completions goes to the upstream's /v1/completions.
  r = front.post(json{{"model", "cloud/up-b"}, {"prompt", "Once upon a time"}}, "/v1/completions");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(json::parse(r->body)["choices"][0]["text"], "up text");
  EXPECT_EQ(up.last()["model"], "up-b");
}

TEST(HybridUpstream, SensitiveRequestsNeverReachTheUpstream) {
  FakeUpstream up;
  Front front("http://127.0.0.1:" + std::to_string(up.port), "{}");
  for (bool stream : {false, true}) {
    for (const char* text : {"email me at jane.roe@example.org", "card 4111 1111 1111 1111", "ssn 123-45-6789"}) {
      json b = chat_body(text, stream);
      auto r = front.post(b);
      ASSERT_TRUE(r);
      EXPECT_EQ(r->status, 200);
      EXPECT_EQ(r->get_header_value("x-lilac-route"), "local");
      b["lilac"] = {{"route", "cloud"}};  // asking does not help
      r = front.post(b);
      EXPECT_EQ(r->get_header_value("x-lilac-route"), "local");
      r = front.post(chat_body(text, stream), "/v1/chat/completions", {{"x-lilac-route", "cloud"}});
      EXPECT_EQ(r->get_header_value("x-lilac-route"), "local");
    }
  }
  EXPECT_EQ(up.count(), 0u);
  EXPECT_EQ(front.local_served.load(), 18);
}

TEST(HybridUpstream, StreamsChunkByChunkWithRouteField) {
  FakeUpstream up;
  up.chunk_delay_ms = 150;
  Front front("http://127.0.0.1:" + std::to_string(up.port), "{}");
  httplib::Client c("127.0.0.1", front.port);
  c.set_read_timeout(10s);
  std::vector<std::pair<std::chrono::steady_clock::time_point, std::string>> pieces;
  std::string status_route;
  int status = 0;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/chat/completions";
  req.body = chat_body("tell me a story", true).dump();
  req.set_header("Content-Type", "application/json");
  req.response_handler = [&](const httplib::Response& r) {
    status = r.status;
    status_route = r.get_header_value("x-lilac-route");
    return true;
  };
  req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
    pieces.emplace_back(std::chrono::steady_clock::now(), std::string(d, n));
    return true;
  };
  auto t0 = std::chrono::steady_clock::now();
  httplib::Response res;
  httplib::Error err;
  ASSERT_TRUE(c.send(req, res, err)) << httplib::to_string(err);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(status_route, "cloud");
  std::string all;
  for (auto& p : pieces) all += p.second;
  // Passed through as it arrived: the first piece came long before the upstream finished (4 x 150 ms).
  ASSERT_GE(pieces.size(), 3u);
  EXPECT_LT(pieces.front().first - t0, 450ms);
  EXPECT_GT(pieces.back().first - pieces.front().first, 250ms);
  // Every data chunk carries lilac_route; the content and usage are intact.
  std::string content;
  int data_lines = 0;
  bool usage = false, done = false;
  size_t pos = 0;
  while ((pos = all.find("data: ", pos)) != std::string::npos) {
    size_t end = all.find('\n', pos);
    std::string payload = all.substr(pos + 6, end - pos - 6);
    pos = end;
    if (payload == "[DONE]") {
      done = true;
      continue;
    }
    json j = json::parse(payload);
    ++data_lines;
    EXPECT_EQ(j["lilac_route"], "cloud");
    if (!j["choices"].empty()) content += j["choices"][0]["delta"]["content"].get<std::string>();
    if (j.contains("usage")) usage = j["usage"]["total_tokens"] == 10;
  }
  EXPECT_EQ(data_lines, 4);
  EXPECT_EQ(content, "w0w1w2");
  EXPECT_TRUE(usage);
  EXPECT_TRUE(done);
  EXPECT_TRUE(up.last()["stream"].get<bool>());
}

TEST(HybridUpstream, ClientErrorsPassThrough) {
  FakeUpstream up;
  up.mode = 2;
  Front front("http://127.0.0.1:" + std::to_string(up.port), "{}");
  for (bool stream : {false, true}) {
    auto r = front.post(chat_body("hello", stream));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400);
    EXPECT_EQ(r->get_header_value("x-lilac-route"), "cloud");
    json j = json::parse(r->body);
    EXPECT_EQ(j["error"]["message"], "bad temperature");
    EXPECT_EQ(j["error"]["param"], "temperature");
  }
  EXPECT_EQ(front.local_served.load(), 0);
}

TEST(HybridUpstream, ServerErrorsFallBackToLocalOr502) {
  FakeUpstream up;
  up.mode = 1;
  {
    Front front("http://127.0.0.1:" + std::to_string(up.port), "{}");
    for (bool stream : {false, true}) {
      auto r = front.post(chat_body("hello", stream));
      ASSERT_TRUE(r);
      EXPECT_EQ(r->status, 200);
      EXPECT_EQ(r->get_header_value("x-lilac-route"), "local");
      EXPECT_EQ(r->get_header_value_count("x-lilac-route"), 1u);
      EXPECT_EQ(r->get_header_value_count("x-lilac-route-reason"), 1u);  // was two: the reason and the fallback's
      if (!stream) {  // (the second request is sticky: the first was served here)
        EXPECT_EQ(r->get_header_value("x-lilac-route-reason"), "fallback: default");
      }
    }
    EXPECT_EQ(front.local_served.load(), 2);
  }
  {  // a 2xx that is not JSON (a proxy's page): served locally, labelled local only (it also said "cloud")
    up.mode = 4;
    Front front("http://127.0.0.1:" + std::to_string(up.port), "{}");
    auto r = front.post(chat_body("hello"));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->get_header_value_count("x-lilac-route"), 1u);
    EXPECT_EQ(r->get_header_value("x-lilac-route"), "local");
    up.mode = 1;
  }
  {
    Front strict("http://127.0.0.1:" + std::to_string(up.port), R"({"fallback": {"upstream_failure_to_local": false}})");
    for (bool stream : {false, true}) {
      auto r = strict.post(chat_body("hello", stream));
      ASSERT_TRUE(r);
      EXPECT_EQ(r->status, 502);
      json j = json::parse(r->body);
      EXPECT_NE(j["error"]["message"].get<std::string>().find("HTTP 500: boom"), std::string::npos) << r->body;
      EXPECT_EQ(j["error"]["code"], "upstream_unavailable");
      EXPECT_EQ(r->body.find("NEVERLOGME"), std::string::npos);
    }
    EXPECT_EQ(strict.local_served.load(), 0);
  }
}

TEST(HybridUpstream, UnreachableUpstreamFallsBack) {
  DeadPort dead;
  ASSERT_GT(dead.port, 0);
  const int port = dead.port;
  Front front("http://127.0.0.1:" + std::to_string(port), R"({"upstream": {"connect_timeout_ms": 500}})");
  auto t0 = std::chrono::steady_clock::now();
  for (bool stream : {false, true}) {
    auto r = front.post(chat_body("hello", stream));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->get_header_value("x-lilac-route"), "local");
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  Front strict("http://127.0.0.1:" + std::to_string(port),
               R"({"fallback": {"upstream_failure_to_local": false}, "upstream": {"connect_timeout_ms": 500}})");
  auto r = strict.post(chat_body("hello"));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 502);
  EXPECT_NE(json::parse(r->body)["error"]["message"].get<std::string>().find("cannot reach the upstream"), std::string::npos);
}

TEST(HybridUpstream, ModelsListedWithPrefixAndFallbackToConfiguredModel) {
  FakeUpstream up;
  Front front("http://127.0.0.1:" + std::to_string(up.port), R"({"upstream": {"models_cache_s": 0}})");
  json m = front.router->extra_models();
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0]["id"], "cloud/up-a");
  EXPECT_EQ(m[1]["id"], "cloud/up-b");
  EXPECT_EQ(m[0]["owned_by"], "upstream");
  // Listed ids are upstream models now.
  EXPECT_TRUE(front.router->router().is_upstream_model("up-a"));
  DeadPort dead;
  Front down("http://127.0.0.1:" + std::to_string(dead.port), R"({"upstream": {"models_timeout_ms": 300}})");
  m = down.router->extra_models();
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0]["id"], "cloud/up-model");
  // Without --upstream-model the first listed id is used for requests naming the local model.
  Front noname("http://127.0.0.1:" + std::to_string(up.port), "{}", "");
  auto r = noname.post(chat_body("hello"));
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(up.last()["model"], "up-a");
}

// An upstream's text in an error the router answers was dumped as strict JSON, which throws on bytes that are not UTF-8.
// A 4xx whose body is not UTF-8 (Latin-1 here) is passed on as the error's message: the front answered 500 instead of
// the upstream's 400. The bytes are U+FFFD now.
TEST(HybridUpstream, AClientErrorWhoseTextIsNotUtf8IsPassedOnWithUFFFD) {
  FakeUpstream up;
  up.mode = 8;
  Front front("http://127.0.0.1:" + std::to_string(up.port), "{}");
  for (bool stream : {false, true}) {
    auto r = front.post(chat_body("hello", stream));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << r->body;
    const json j = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r->body;
    EXPECT_EQ(j["error"]["message"], "The upstream answered HTTP 400: caf\xEF\xBF\xBD au lait is not a model") << r->body;
    EXPECT_EQ(j["error"]["code"], "upstream_error") << r->body;
  }
  EXPECT_EQ(front.local_served.load(), 0);
}

// A 5xx's message is quoted in the 502 (fallback off) cut at 300 bytes, which can end inside a character: the front
// answered 500 instead of the 502 saying why. The cut character is U+FFFD now.
TEST(HybridUpstream, AServerErrorMessageCutInsideACharacterIsA502WithUFFFD) {
  FakeUpstream up;
  up.mode = 9;
  Front strict("http://127.0.0.1:" + std::to_string(up.port), R"({"fallback": {"upstream_failure_to_local": false}})");
  for (bool stream : {false, true}) {
    auto r = strict.post(chat_body("hello", stream));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 502) << r->body;
    const json j = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r->body;
    const std::string m = j["error"].value("message", "");
    EXPECT_NE(m.find("HTTP 500: " + std::string(299, 'x') + "\xEF\xBF\xBD)"), std::string::npos) << m;
    EXPECT_EQ(j["error"]["code"], "upstream_unavailable") << r->body;
  }
  EXPECT_EQ(strict.local_served.load(), 0);
}

// Found by review: nothing bounded what the router held of an upstream's answer (a 65 MiB answer was read whole; an SSE
// "line" with no end grew forever), and a stream that broke off ended with an unnamed chat-shaped error glued to the
// partial line (Anthropic clients skipped it: a silently cut message).
TEST(HybridUpstream, UpstreamAnswersAreBoundedAndBrokenStreamsEndInTheirProtocol) {
  FakeUpstream up;
  Front front("http://127.0.0.1:" + std::to_string(up.port), R"({"sticky": false})");
  up.mode = 5;  // 65 MiB: not forwarded; served locally (the fallback)
  auto r = front.post(chat_body("hello"));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->get_header_value("x-lilac-route"), "local");
  EXPECT_EQ(r->get_header_value("x-lilac-route-reason"), "fallback: default");
  up.mode = 6;  // a stream whose first line has no end for 5 MiB: ends with an error event
  r = front.post(chat_body("hello", true));
  ASSERT_TRUE(r);
  EXPECT_LT(r->body.size(), size_t(1) << 20);
  EXPECT_NE(r->body.find("longer than 4 MiB"), std::string::npos) << r->body.substr(0, 300);
  EXPECT_NE(r->body.find("data: [DONE]"), std::string::npos);
  up.mode = 7;  // chat: the partial line is dropped, a blank line, the error, [DONE]
  r = front.post(chat_body("hello", true));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->body.find("{\"choi\n"), std::string::npos) << r->body;
  EXPECT_NE(r->body.find("\n\ndata: {\"error\""), std::string::npos) << r->body;
  EXPECT_NE(r->body.find("broke off"), std::string::npos) << r->body;
  // Messages: Anthropic's named error event
  json m = {{"model", "lilac"}, {"max_tokens", 10}, {"stream", true},
            {"messages", json::array({{{"role", "user"}, {"content", "hello"}}})}};
  r = front.post(m, "/v1/messages");
  ASSERT_TRUE(r);
  const size_t ev = r->body.find("\n\nevent: error\ndata: {");
  ASSERT_NE(ev, std::string::npos) << r->body;
  EXPECT_EQ(json::parse(r->body.substr(ev + 21))["type"], "error") << r->body;
  EXPECT_EQ(r->body.find("content_bl\n"), std::string::npos) << r->body;
}

// Found by review: a 3xx or a 401 / 403 from the upstream was passed to the client as it was: a redirect (whose
// Location would point the client at the cloud provider), or "your key is wrong" about lilac's configured cloud key.
// They are the upstream failing now: served locally (the fallback), or a 502 saying what the upstream answered; no
// upstream header or body is passed on.
TEST(HybridUpstream, RedirectsAndRefusedCredentialsAreUpstreamFailures) {
  FakeUpstream up;
  const std::string url = "http://127.0.0.1:" + std::to_string(up.port);
  Front strict(url, R"({"fallback": {"upstream_failure_to_local": false}})");
  Front lenient(url, R"({"sticky": false})");
  for (int status : {302, 307, 401, 403}) {
    up.refuse_status = status;
    for (bool stream : {false, true}) {
      const std::string what = "HTTP " + std::to_string(status) + (stream ? " streamed" : "");
      auto r = strict.post(chat_body("hello", stream));
      ASSERT_TRUE(r) << what;
      EXPECT_EQ(r->status, 502) << what << ": " << r->body;
      EXPECT_FALSE(r->has_header("Location")) << what;
      EXPECT_FALSE(r->has_header("WWW-Authenticate")) << what;
      EXPECT_EQ(r->get_header_value("x-lilac-route"), "cloud") << what;
      const json j = json::parse(r->body, nullptr, false);
      ASSERT_TRUE(j.is_object() && j.contains("error")) << what << ": " << r->body;
      EXPECT_EQ(j["error"]["code"], "upstream_unavailable") << what;
      const std::string msg = j["error"]["message"];
      EXPECT_NE(msg.find("the cloud upstream answered HTTP " + std::to_string(status)), std::string::npos) << msg;
      EXPECT_EQ(msg.find("lilac's upstream credentials were refused") != std::string::npos, status >= 400) << msg;
      EXPECT_EQ(r->body.find("Incorrect API key"), std::string::npos) << r->body;
      EXPECT_EQ(r->body.find("provider.example"), std::string::npos) << r->body;
      // With the fallback on (the default): served locally, saying so.
      r = lenient.post(chat_body("hello", stream));
      ASSERT_TRUE(r) << what;
      EXPECT_EQ(r->status, 200) << what << ": " << r->body;
      EXPECT_EQ(r->get_header_value("x-lilac-route"), "local") << what;
      EXPECT_EQ(r->get_header_value("x-lilac-route-reason"), "fallback: default") << what;
      EXPECT_FALSE(r->has_header("Location")) << what;
    }
  }
  EXPECT_EQ(strict.local_served.load(), 0);
  // A 4xx about the request itself still passes through.
  up.refuse_status = 0;
  up.mode = 2;
  auto r = strict.post(chat_body("hello"));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
}

// The same through lilac's server, whose endpoints answer the router's 502 in their protocol's error shape: OpenAI's
// on chat/completions and Responses, Anthropic's on Messages (the 401 reached a Messages client as its own key's
// authentication_error).
TEST(HybridUpstream, RefusedUpstreamAnswersAre502InTheEndpointsShape) {
  FakeUpstream up;
  up.refuse_status = 401;
  RoutedServer rs(up.port, R"({"fallback": {"upstream_failure_to_local": false}})", "sk-test-NEVERLOGME-0123456789abcdef");
  httplib::Client& cli = rs.cli;
  const json user = json::array({{{"role", "user"}, {"content", "hello"}}});
  for (bool stream : {false, true}) {
    auto r = cli.Post("/v1/chat/completions", json{{"messages", user}, {"stream", stream}}.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 502) << r->body;
    EXPECT_FALSE(r->has_header("WWW-Authenticate"));
    json j = json::parse(r->body, nullptr, false);
    EXPECT_EQ(j["error"]["code"], "upstream_unavailable") << r->body;
    EXPECT_NE(j["error"]["message"].get<std::string>().find("HTTP 401: lilac's upstream credentials were refused"),
              std::string::npos) << r->body;
    r = cli.Post("/v1/messages", json{{"messages", user}, {"max_tokens", 20}, {"stream", stream}}.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 502) << r->body;
    j = json::parse(r->body, nullptr, false);
    EXPECT_EQ(j["type"], "error") << r->body;
    EXPECT_EQ(j["error"]["type"], "api_error") << r->body;  // not authentication_error: the client's key is fine
    EXPECT_NE(j["error"]["message"].get<std::string>().find("HTTP 401: lilac's upstream credentials were refused"),
              std::string::npos) << r->body;
    r = cli.Post("/v1/responses", json{{"input", "hello"}, {"stream", stream}}.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 502) << r->body;
    EXPECT_EQ(json::parse(r->body, nullptr, false)["error"]["code"], "upstream_unavailable") << r->body;
  }
  EXPECT_EQ(up.count(), 2u);  // the chat requests reached it (the only path that records bodies)
}
