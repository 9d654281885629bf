// Foreground Responses (store on) whose generation emits a byte that is not UTF-8 by itself: U+10FFFD's first token,
// the lone byte 0xF4, from the scripted backend's "astral" rule (server_test_util.h). A response cut right after that
// token is answered and stored with U+FFFD in its text, and GET /v1/responses/{id} gives it back as it was answered.
// (Background responses that fail on the same byte: test_background_responses.cpp.)
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server_test_util.h"

using json = nlohmann::json;

namespace {

json script() { return {{"rules", json::array({lilac::test::astral_rule(0)})}, {"default", {{"reply", "ok"}}}}; }

// The number of tokens of the astral reply up to its lone byte 0xF4, that token included (0: no such token).
size_t tokens_through_lone_byte() {
  auto tok = lilac::test::qwen3_tokenizer();
  const std::vector<int32_t> ids = tok->encode(lilac::test::kAstralReply, true);
  for (size_t i = 0; i < ids.size(); ++i)
    if (tok->token_bytes(ids[i]) == "\xf4") return i + 1;
  return 0;
}

// The text of a response object's message item ("" when it has none).
std::string message_text(const json& response) {
  for (const json& item : response.value("output", json::array()))
    if (item.value("type", "") == "message") return item["content"][0].value("text", "");
  return "";
}

}  // namespace

// Not streamed and streamed: 200, "incomplete" (max_output_tokens), the text with the lone byte as U+FFFD; GET answers
// the stored response, equal to the one answered.
TEST(ResponsesUtf8, AForegroundResponseCutAfterALoneByteIsAnsweredAndStoredWithUFFFD) {
  const size_t n = tokens_through_lone_byte();
  ASSERT_GT(n, 0u) << "the astral reply has no token that is the lone byte 0xF4";
  lilac::test::LocalServer srv(lilac::test::LocalServer::options(), nullptr, script());
  httplib::Client cli("127.0.0.1", srv.port);
  cli.set_read_timeout(10, 0);
  const std::string want = std::string("{\"answer\": \"ok\", ") + "\xEF\xBF\xBD";
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "streamed" : "not streamed");
    const json body = {{"input", "astral"}, {"store", true}, {"stream", stream}, {"max_output_tokens", n},
                       {"reasoning", {{"effort", "none"}}}};
    auto r = cli.Post("/v1/responses", body.dump(), "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    json answered;
    if (stream) {
      const std::vector<json> evs = lilac::test::sse_events(r->body);
      ASSERT_FALSE(evs.empty()) << r->body;
      EXPECT_EQ(evs.back()["type"], "response.incomplete") << r->body;
      answered = evs.back()["response"];
    } else {
      answered = json::parse(r->body, nullptr, false);
    }
    ASSERT_TRUE(answered.is_object()) << r->body;
    EXPECT_EQ(answered["status"], "incomplete") << r->body;
    EXPECT_EQ(message_text(answered), want) << r->body;
    auto got = cli.Get("/v1/responses/" + answered["id"].get<std::string>());
    ASSERT_TRUE(got);
    ASSERT_EQ(got->status, 200) << got->body;
    const json stored = json::parse(got->body, nullptr, false);
    EXPECT_EQ(message_text(stored), want) << got->body;
    EXPECT_EQ(stored, answered) << got->body;
  }
}
