// A conversation that ends with an assistant message is continued from that message (a prefill): through
// OpenAI chat completions, Anthropic Messages and the Responses API the prompt is the conversation rendered without a generation
// prompt and with that message's end of turn removed, and the answer is only what follows it. The scripted
// backend (server_test_util.h) answers by what the prompt holds, so these tests see the prompt's exact end;
// tests/e2e/protocols_demo.test.mjs checks the same on the real engine path with the official SDKs.
#include <gtest/gtest.h>
#include <httplib.h>

#include <string>

#include <nlohmann/json.hpp>

#include "server_test_util.h"

using json = nlohmann::json;

namespace {

// The prefill open at the prompt's end gets " wide and deep."; the prefill closed by an end of turn (the old
// rendering) or a fresh assistant turn gets a reply that names the mistake.
json prefill_script() {
  return {{"rules",
           {{{"match", "The sea is<|im_end|>"}, {"reply", "CLOSED TURN<|im_end|>"}},
            {{"match", "</think>\n\nThe sea is"}, {"reply", " wide and deep."}},
            {{"match", "The sea is"}, {"reply", "NOT AT THE END"}}}},
          {"default", {{"reply", "</think>\n\nno prefill"}}}};
}

const json kConversation = json::array({{{"role", "user"}, {"content", "Write one sentence about the sea."}},
                                         {{"role", "assistant"}, {"content", "The sea is"}}});

using lilac::test::post_json;

}  // namespace

TEST(ServerPrefill, ChatAndMessagesContinueTheFinalAssistantMessage) {
  lilac::test::LocalServer srv(lilac::test::LocalServer::options(), nullptr, json::parse(prefill_script().dump()));
  const json chat = post_json(srv.port, "/v1/chat/completions", {{"messages", kConversation}, {"max_tokens", 32}});
  EXPECT_EQ(chat["choices"][0]["message"]["content"], " wide and deep.");
  EXPECT_EQ(chat["choices"][0]["finish_reason"], "stop");

  json blocks = kConversation;
  blocks[1]["content"] = json::array({{{"type", "text"}, {"text", "The sea"}}, {{"type", "text"}, {"text", " is"}}});
  const json msg = post_json(srv.port, "/v1/messages", {{"messages", blocks}, {"max_tokens", 32}});
  ASSERT_EQ(msg["content"].size(), 1u) << msg.dump();
  EXPECT_EQ(msg["content"][0]["text"], " wide and deep.");
  EXPECT_EQ(msg["stop_reason"], "end_turn");
  EXPECT_EQ(msg["usage"]["input_tokens"], chat["usage"]["prompt_tokens"]);
  EXPECT_EQ(post_json(srv.port, "/v1/messages/count_tokens", {{"messages", blocks}})["input_tokens"],
            chat["usage"]["prompt_tokens"]);

  // Streamed, the chunks add up to the same continuation.
  httplib::Client cli("127.0.0.1", srv.port);
  json body = {{"messages", kConversation}, {"max_tokens", 32}, {"stream", true}};
  auto r = cli.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  std::string streamed;
  for (size_t at = 0; (at = r->body.find("data: {", at)) != std::string::npos;) {
    const size_t end = r->body.find('\n', at);
    const json ev = json::parse(r->body.substr(at + 6, end - at - 6));
    if (!ev["choices"].empty() && ev["choices"][0]["delta"].contains("content"))
      streamed += ev["choices"][0]["delta"]["content"].get<std::string>();
    at = end;
  }
  EXPECT_EQ(streamed, " wide and deep.");

  // The Responses API: an input that ends with an assistant message item (text or output_text parts).
  json items = kConversation;
  items[1]["content"] = json::array({{{"type", "output_text"}, {"text", "The sea is"}}});
  const json resp = post_json(srv.port, "/v1/responses", {{"input", items}, {"max_output_tokens", 32}});
  ASSERT_EQ(resp["output"].size(), 1u) << resp.dump();
  EXPECT_EQ(resp["output"][0]["content"][0]["text"], " wide and deep.");
  EXPECT_EQ(resp["status"], "completed");
  EXPECT_EQ(resp["usage"]["input_tokens"], chat["usage"]["prompt_tokens"]);
  // Stored, it can be followed up (its items: the prefill's message and the continuation's, which the translation
  // joins into one assistant turn: ResponsesSchema.AFinalAssistantMessageIsContinued).
  const json next = post_json(srv.port, "/v1/responses",
                              {{"previous_response_id", resp["id"]}, {"input", "And the sky?"}, {"max_output_tokens", 32}});
  EXPECT_EQ(next["output"].back()["content"][0]["text"], "no prefill") << next.dump();

  // Without the final assistant message: a fresh turn, as before.
  const json plain = post_json(srv.port, "/v1/chat/completions", {{"messages", {kConversation[0]}}, {"max_tokens", 32}});
  EXPECT_EQ(plain["choices"][0]["message"]["content"], "no prefill");
}

TEST(ServerPrefill, WhatCannotBeContinuedIsA400InEachProtocolsShape) {
  lilac::test::LocalServer srv(lilac::test::LocalServer::options(), nullptr, prefill_script());
  json trailing = kConversation;
  trailing[1]["content"] = "The sea is ";
  json e = post_json(srv.port, "/v1/chat/completions", {{"messages", trailing}, {"max_tokens", 4}}, 400);
  EXPECT_EQ(e["error"]["param"], "messages");
  EXPECT_EQ(e["error"]["code"], "invalid_last_message");
  e = post_json(srv.port, "/v1/messages", {{"messages", trailing}, {"max_tokens", 4}}, 400);
  EXPECT_EQ(e["type"], "error");
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  e = post_json(srv.port, "/v1/chat/completions",
           {{"messages", kConversation}, {"max_tokens", 4}, {"response_format", {{"type", "json_object"}}}}, 400);
  EXPECT_EQ(e["error"]["param"], "response_format");
  e = post_json(srv.port, "/v1/messages",
           {{"messages", kConversation}, {"max_tokens", 40}, {"thinking", {{"type", "enabled"}, {"budget_tokens", 10}}}}, 400);
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  e = post_json(srv.port, "/v1/responses", {{"input", trailing}, {"max_output_tokens", 4}}, 400);
  EXPECT_EQ(e["error"]["param"], "input");
  EXPECT_EQ(e["error"]["code"], "invalid_last_message");
  e = post_json(srv.port, "/v1/responses",
                {{"input", kConversation}, {"text", {{"format", {{"type", "json_object"}}}}}}, 400);
  EXPECT_EQ(e["error"]["param"], "text.format");
  const json call = {{"type", "function_call"}, {"call_id", "c1"}, {"name", "f"}, {"arguments", "{}"}};
  e = post_json(srv.port, "/v1/responses", {{"input", {kConversation[0], call}}}, 400);
  EXPECT_EQ(e["error"]["code"], "invalid_last_message");
  // The server keeps serving.
  EXPECT_EQ(post_json(srv.port, "/v1/chat/completions", {{"messages", kConversation}, {"max_tokens", 32}})["choices"][0]
                ["message"]["content"],
            " wide and deep.");
}
