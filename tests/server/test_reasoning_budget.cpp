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
