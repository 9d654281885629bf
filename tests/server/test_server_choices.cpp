// OpenAI's `n` (several choices per request) on the scripted backend: each choice is a generation of the same
// prompt, answered as one body (choices in order, the prompt counted once in usage) or one stream (each
// chunk names its choice, one usage chunk and one [DONE] after the last choice ends); a request whose
// choices do not all fit the queue runs none of them.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <map>
#include <thread>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server_test_util.h"

using json = nlohmann::json;

namespace {

const json kHello = json::array({{{"role", "user"}, {"content", "Hello"}}});

using lilac::test::post_json;

}  // namespace

TEST(ServerChoices, ChatBodyHasEveryChoiceAndUsageCountsThePromptOnce) {
  lilac::test::LocalServer srv(lilac::test::LocalServer::options());
  const json one = post_json(srv.port, "/v1/chat/completions", {{"messages", kHello}});
  const json three = post_json(srv.port, "/v1/chat/completions", {{"messages", kHello}, {"n", 3}});
  ASSERT_EQ(three["choices"].size(), 3u) << three.dump();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(three["choices"][i]["index"], i);
    EXPECT_EQ(three["choices"][i]["message"], one["choices"][0]["message"]);
    EXPECT_EQ(three["choices"][i]["finish_reason"], "stop");
  }
  EXPECT_EQ(three["usage"]["prompt_tokens"], one["usage"]["prompt_tokens"]);
  EXPECT_EQ(three["usage"]["completion_tokens"], 3 * one["usage"]["completion_tokens"].get<int>());
  EXPECT_EQ(three["usage"]["total_tokens"],
            one["usage"]["prompt_tokens"].get<int>() + 3 * one["usage"]["completion_tokens"].get<int>());
  EXPECT_EQ(three["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);

  const json text = post_json(srv.port, "/v1/completions", {{"prompt", "Hello"}, {"n", 2}, {"max_tokens", 3}});
  ASSERT_EQ(text["choices"].size(), 2u);
  EXPECT_EQ(text["choices"][1]["index"], 1);
  EXPECT_EQ(text["choices"][0]["text"], text["choices"][1]["text"]);
  EXPECT_EQ(text["usage"]["completion_tokens"], 6);
}

TEST(ServerChoices, StreamNamesEachChoiceThenOneUsageChunkAndOneDone) {
  lilac::test::LocalServer srv(lilac::test::LocalServer::options());
  const json one = post_json(srv.port, "/v1/chat/completions", {{"messages", kHello}});
  httplib::Client cli("127.0.0.1", srv.port);
  const json body = {{"messages", kHello}, {"n", 3}, {"stream", true}, {"stream_options", {{"include_usage", true}}}};
  auto r = cli.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  const std::vector<json> evs = lilac::test::sse_events(r->body);
  ASSERT_FALSE(evs.empty());
  EXPECT_EQ(evs.back(), "[DONE]");
  std::map<int, std::string> content;
  std::map<int, int> roles, finishes;
  int usage_chunks = 0, dones = 0;
  for (const json& e : evs) {
    if (e == "[DONE]") {
      ++dones;
      continue;
    }
    if (e["choices"].empty()) {
      ++usage_chunks;
      EXPECT_EQ(e["usage"]["completion_tokens"], 3 * one["usage"]["completion_tokens"].get<int>()) << e.dump();
      continue;
    }
    const json& c = e["choices"][0];
    const int i = c["index"];
    if (c["delta"].contains("role")) ++roles[i];
    if (c["delta"].contains("content")) content[i] += c["delta"]["content"].get<std::string>();
    if (!c["finish_reason"].is_null()) ++finishes[i];
  }
  EXPECT_EQ(dones, 1);
  EXPECT_EQ(usage_chunks, 1);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(content[i], "local answer") << i;
    EXPECT_EQ(roles[i], 1) << i;
    EXPECT_EQ(finishes[i], 1) << i;
  }
  EXPECT_EQ(content.size(), 3u);
}

// More choices than --max-queue can never run: a 400 naming n (it was a 429 "retry later", forever), and naming the
// prompts for a completions request whose prompts × n are too many.
TEST(ServerChoices, ChoicesThatDoNotFitTheQueueRunNone) {
  lilac::test::LocalServer srv(lilac::test::LocalServer::options(/*max_queue=*/2));
  const json e = post_json(srv.port, "/v1/chat/completions", {{"messages", kHello}, {"n", 3}}, 400);
  EXPECT_EQ(e["error"]["code"], "invalid_value");
  EXPECT_EQ(e["error"]["param"], "n");
  EXPECT_NE(e["error"]["message"].get<std::string>().find("--max-queue"), std::string::npos) << e.dump();
  const json p = post_json(srv.port, "/v1/completions", {{"prompt", {"a", "b"}}, {"n", 2}, {"max_tokens", 2}}, 400);
  EXPECT_EQ(p["error"]["param"], "prompt");
  EXPECT_EQ(post_json(srv.port, "/v1/chat/completions", {{"messages", kHello}, {"n", 17}}, 400)["error"]["param"], "n");
  // Nothing of it is left running: two choices fit.
  EXPECT_EQ(post_json(srv.port, "/v1/chat/completions", {{"messages", kHello}, {"n", 2}})["choices"].size(), 2u);
}

// A client that goes away mid-stream stops every choice.
TEST(ServerChoices, AClientGoneStopsEveryChoice) {
  lilac::test::LocalServer srv(lilac::test::LocalServer::options());
  const json body = {{"messages", json::array({{{"role", "user"}, {"content", "slow"}}})},
                     {"n", 2}, {"stream", true}, {"max_tokens", 1000}};
  httplib::Client cli("127.0.0.1", srv.port);
  std::string got;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/chat/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    got.append(data, n);
    return got.find("\" x\"") == std::string::npos;  // hang up after the first generated text
  };
  cli.send(req);
  ASSERT_NE(got.find("\" x\""), std::string::npos) << got;
  auto metric = [&](const std::string& name) {
    auto m = httplib::Client("127.0.0.1", srv.port).Get("/metrics");
    const size_t at = m ? m->body.find("\n" + name + " ") : std::string::npos;
    return at == std::string::npos ? -1.0 : std::stod(m->body.substr(at + name.size() + 2));
  };
  double depth = -1, cancelled = -1;
  for (int i = 0; i < 200 && (depth != 0 || cancelled != 2); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    depth = metric("lilac_queue_depth");
    cancelled = metric("lilac_cancelled_total");
  }
  EXPECT_EQ(depth, 0);
  EXPECT_EQ(cancelled, 2);
}
