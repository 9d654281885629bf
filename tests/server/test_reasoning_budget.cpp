// A reasoning budget (Anthropic's thinking.budget_tokens) at the edge of the context: the continuation after the cut
// prompts with the closing markup too, which the request's own prompt + max_tokens did not count. The scripted
// backend (server_test_util.h) replies " tick" forever to "forever".
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "server_test_util.h"

using json = nlohmann::json;
using lilac::test::post_json;

// max_tokens that fills the context exactly is a valid request; with a budget it was refused with a 400 once the
// reasoning was cut (the continuation asked for the closing markup's tokens more than the sessions hold). It ends on
// its limit now, inside the context.
TEST(ReasoningBudget, AContinuationAtTheContextsEdgeEndsOnItsLimit) {
  auto o = lilac::test::LocalServer::options();
  o.max_seq = 512;
  const json script = {{"rules", {{{"match", "forever"}, {"reply", " tick"}, {"repeat", true}}}},
                       {"default", {{"reply", "</think>\n\nno"}}}};
  lilac::test::LocalServer srv(o, nullptr, script);
  const json messages = json::array({{{"role", "user"}, {"content", "forever"}}});
  const json thinking = {{"type", "enabled"}, {"budget_tokens", 5}};
  const int64_t input =
      post_json(srv.port, "/v1/messages/count_tokens", {{"messages", messages}, {"thinking", thinking}})["input_tokens"];
  ASSERT_GT(input, 0);
  const json m = post_json(srv.port, "/v1/messages",
                           {{"messages", messages}, {"max_tokens", 512 - input}, {"thinking", thinking}});
  EXPECT_EQ(m["stop_reason"], "max_tokens") << m.dump();
  ASSERT_EQ(m["content"].size(), 2u) << m.dump();
  EXPECT_EQ(m["content"][0]["thinking"], " tick tick tick tick tick");
  const int64_t out = m["usage"]["output_tokens"];
  EXPECT_GT(out, 5);
  EXPECT_LE(input + out, 512);
  // Within max_tokens that leaves room for the markup, the whole max_tokens is generated, as before.
  const json n = post_json(srv.port, "/v1/messages", {{"messages", messages}, {"max_tokens", 40}, {"thinking", thinking}});
  EXPECT_EQ(n["stop_reason"], "max_tokens");
  EXPECT_EQ(n["usage"]["output_tokens"], 40);
}

namespace {

// A Messages request for `prompt` with thinking on and `budget` (< 0: no budget).
json thinking_request(const std::string& prompt, int64_t budget, int64_t max_tokens, const json& stops = json::array()) {
  json body = {{"messages", json::array({{{"role", "user"}, {"content", prompt}}})}, {"max_tokens", max_tokens}};
  body["thinking"] = {{"type", "enabled"}, {"budget_tokens", budget < 0 ? max_tokens - 1 : budget}};
  if (!stops.empty()) body["stop_sequences"] = stops;
  return body;
}

// Whether `b` is valid UTF-8 (whole characters only).
bool whole_characters(const std::string& b) {
  for (size_t i = 0; i < b.size();) {
    const auto c = static_cast<unsigned char>(b[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > b.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(b[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

std::string metric(int port, const std::string& name) {
  httplib::Client cli("127.0.0.1", port);
  auto r = cli.Get("/metrics");
  if (!r) return "";
  const size_t at = r->body.find("\n" + name + " ");
  if (at == std::string::npos) return "";
  const size_t from = at + name.size() + 2;
  return r->body.substr(from, r->body.find('\n', from) - from);
}

}  // namespace

// A budget the reasoning does not use up changes nothing, wherever it falls: the generation is one (it was a job cut
// at the budget and a continuation job, so a stop string spanning the cut was missed, a character whose bytes span
// it came out as two U+FFFD, and the sampler started over).
TEST(ReasoningBudget, ABudgetTheReasoningDoesNotUseUpChangesNothing) {
  const std::string reply = "Think.</think>\n\nOne two \xF0\x93\x80\x80\xF0\x93\x80\x81 three four five six.";
  const json script = {{"rules", {{{"match", "resume"}, {"reply", reply}}}}};
  lilac::test::LocalServer srv(lilac::test::LocalServer::options(), nullptr, script);
  // The reply's tokens: some are not whole characters, so some budget cuts a character.
  const auto& tok = *lilac::test::qwen3_tokenizer();
  const std::vector<int32_t> ids = tok.encode(reply, true);
  bool split = false;
  for (int32_t t : ids) split |= !whole_characters(tok.token_bytes(t));
  ASSERT_TRUE(split) << "no token of the reply is part of a character";
  for (const json& stops : {json::array(), json::array({"One two"}), json::array({"\xF0\x93\x80\x81 th"})}) {
    const json free = post_json(srv.port, "/v1/messages", thinking_request("resume", -1, 60, stops));
    ASSERT_EQ(free["content"][0]["thinking"], "Think.") << free.dump();
    for (int64_t budget = 3; budget < int64_t(ids.size()) + 2; ++budget) {
      const json cut = post_json(srv.port, "/v1/messages", thinking_request("resume", budget, 60, stops));
      EXPECT_EQ(cut["content"], free["content"]) << "budget " << budget << " stops " << stops.dump();
      EXPECT_EQ(cut["stop_reason"], free["stop_reason"]) << "budget " << budget << " stops " << stops.dump();
      EXPECT_EQ(cut["stop_sequence"], free["stop_sequence"]) << "budget " << budget << " stops " << stops.dump();
      EXPECT_EQ(cut["usage"]["input_tokens"], free["usage"]["input_tokens"]);
      EXPECT_EQ(cut["usage"]["output_tokens"], free["usage"]["output_tokens"]) << "budget " << budget << " stops " << stops.dump();
    }
  }
}

// The budget cuts the reasoning inside the one generation: the closing markup is forced as its next tokens (they
// count), and the server's metrics see one generation with the request's own prompt (they counted two, the second
// with the first's prompt and output as its prompt).
TEST(ReasoningBudget, TheCutIsOneGenerationAndTheClosingMarkupCounts) {
  const json script = {{"rules", {{{"match", "forever"}, {"reply", " tick"}, {"repeat", true}}}}};
  lilac::test::LocalServer srv(lilac::test::LocalServer::options(), nullptr, script);
  const json m = post_json(srv.port, "/v1/messages", thinking_request("forever", 5, 12));
  ASSERT_EQ(m["content"].size(), 2u) << m.dump();
  EXPECT_EQ(m["content"][0]["thinking"], " tick tick tick tick tick");
  const auto& tok = *lilac::test::qwen3_tokenizer();
  const int64_t markup = int64_t(tok.encode("\n</think>\n\n", true).size());
  std::string text;
  for (int64_t i = 0; i < 12 - 5 - markup; ++i) text += " tick";
  EXPECT_EQ(m["content"][1]["text"], text);
  EXPECT_EQ(m["usage"]["output_tokens"], 12);
  EXPECT_EQ(m["stop_reason"], "max_tokens");
  EXPECT_EQ(metric(srv.port, "lilac_generations_total"), "1");
  EXPECT_EQ(metric(srv.port, "lilac_generated_tokens_total"), "12");
  EXPECT_EQ(metric(srv.port, "lilac_prompt_tokens_total"), std::to_string(int64_t(m["usage"]["input_tokens"])));
}

// A template that does not open "<think>" in the generation prompt (Qwen3's, the demo model's): the model opens the
// block itself, and the budget applied only to a block the prompt opened: this reasoning ran its whole length.
TEST(ReasoningBudget, ABlockTheModelOpensItselfIsCutToo) {
  std::string reply = "<think>\n";
  for (int i = 0; i < 40; ++i) reply += " hmm";
  reply += "</think>\n\nanswer";
  const json script = {{"rules", {{{"match", "selfthink"}, {"reply", reply}}}}};
  const json cfg = json::parse(lilac::read_text_file(std::string(LILAC_SHARED_DIR) + "/fixtures/qwen3-tokenizer/tokenizer_config.json"));
  const std::string qwen3_template = cfg["chat_template"];
  ASSERT_EQ(qwen3_template.find("'<think>\\n' }}"), std::string::npos) << "the template opens the block itself";
  lilac::test::LocalServer srv(lilac::test::LocalServer::options(), nullptr, script, qwen3_template);
  const json m = post_json(srv.port, "/v1/messages", thinking_request("selfthink", 5, 20));
  ASSERT_GE(m["content"].size(), 1u) << m.dump();
  EXPECT_EQ(m["content"][0]["type"], "thinking") << m.dump();
  EXPECT_EQ(m["content"][0]["thinking"], " hmm hmm hmm") << m.dump();  // "<think>", "\n" and 3 tokens: 5
  EXPECT_EQ(m["usage"]["output_tokens"], 20);
  // Without a budget, the same generation thinks its whole length.
  const json free = post_json(srv.port, "/v1/messages", thinking_request("selfthink", -1, 200));
  EXPECT_EQ(free["content"][0]["thinking"].get<std::string>().size(), 40u * 4) << free.dump();
}

// A budget that leaves the closing markup less room than it has tokens before max_tokens (max_tokens - 1, the most
// thinking.budget_tokens may be): the markup was forced from the budget on and cut by max_tokens, and the thinking
// block never closed (its "\n" went into the thinking). The markup is forced early enough to end on the last token
// now: the block closes, the thinking is what came before the markup.
TEST(ReasoningBudget, ABudgetNextToMaxTokensStillClosesTheBlock) {
  const json script = {{"rules", {{{"match", "forever"}, {"reply", " tick"}, {"repeat", true}}}}};
  lilac::test::LocalServer srv(lilac::test::LocalServer::options(), nullptr, script);
  const auto& tok = *lilac::test::qwen3_tokenizer();
  const int64_t markup = int64_t(tok.encode("\n</think>\n\n", true).size());
  for (int64_t max_tokens : {12, 20}) {
    for (int64_t budget : {max_tokens - 1, max_tokens - markup + 1}) {
      const json m = post_json(srv.port, "/v1/messages", thinking_request("forever", budget, max_tokens));
      ASSERT_EQ(m["content"].size(), 1u) << m.dump();
      std::string thinking;
      for (int64_t i = 0; i < max_tokens - markup; ++i) thinking += " tick";
      EXPECT_EQ(m["content"][0]["thinking"], thinking) << "budget " << budget << ": " << m.dump();
      EXPECT_EQ(m["usage"]["output_tokens"], max_tokens);
      EXPECT_EQ(m["stop_reason"], "max_tokens");
    }
  }
}
