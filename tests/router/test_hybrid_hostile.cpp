// Malformed client bodies through lilac's real routes behind the hybrid router (RoutedServer, fake_upstream.h): the
// routing decision reads every body before any adapter validates it, so what it reads must never throw.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <string>

#include "router/fake_upstream.h"

using namespace lilac::router;
using namespace lilac::router::testing;

// A conversation kept local (remembered for stickiness) goes on with a content part whose "type" is a number: the
// sticky check hashes the new body's messages, and reading that type with value("type", "") threw type_error out of
// the routing decision (a 500 "Internal server error: [json.exception.type_error.302]"). The conversation stays local
// (sticky), where the chat adapter answers 400 naming the part's type; the upstream sees nothing.
TEST(HybridHostile, AStickyConversationWithAPartWhoseTypeIsNotAStringIsA400) {
  FakeUpstream up;
  RoutedServer rs(up.port, R"({"default_route": "cloud"})");
  json messages = json::array({{{"role", "user"}, {"content", "hello"}}});
  auto r = rs.cli.Post("/v1/chat/completions", {{"x-lilac-route", "local"}},
                       json{{"messages", messages}}.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->get_header_value("x-lilac-route"), "local");
  ASSERT_EQ(rs.router->router().sticky_entries(), 1u);  // remembered: its next turn stays local
  const json answer = json::parse(r->body);
  messages.push_back({{"role", "assistant"}, {"content", answer["choices"][0]["message"]["content"]}});
  messages.push_back({{"role", "user"}, {"content", json::array({{{"type", 5}, {"text", "and then?"}}})}});

  r = rs.cli.Post("/v1/chat/completions", json{{"messages", messages}}.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_EQ(r->get_header_value("x-lilac-route-reason"), "sticky");
  const json e = json::parse(r->body, nullptr, false);
  EXPECT_EQ(e["error"]["param"], "messages[2].content[0].type") << r->body;
  EXPECT_EQ(up.count(), 0u);

  // A well-formed next turn of the same conversation is still served locally.
  messages.back()["content"] = json::array({{{"type", "text"}, {"text", "and then?"}}});
  r = rs.cli.Post("/v1/chat/completions", json{{"messages", messages}}.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->get_header_value("x-lilac-route-reason"), "sticky");
  EXPECT_EQ(up.count(), 0u);
}

// Two megabytes of '&' in one message: the scan's HTML-reference decoding looked for each '&''s ';' to the end of the
// text, so decoding took time quadratic in its size on the request's thread (1 MB: 5 s, 2 MB: 22 s, 4 MB: 86 s; the
// 8 MB body limit allows minutes). The answer now comes at once, from the cloud as for any plain text; references
// are still decoded (the e-mail spelled with them stays local).
TEST(HybridHostile, MegabytesOfAmpersandsAreScannedInLinearTime) {
  FakeUpstream up;
  RoutedServer rs(up.port, R"({"default_route": "cloud"})");
  const auto t0 = std::chrono::steady_clock::now();
  auto r = rs.cli.Post("/v1/chat/completions", chat_body(std::string(2 << 20, '&')).dump(), "application/json");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(r) << "no answer within the client's 10 s";
  EXPECT_EQ(r->status, 200) << r->body.substr(0, 300);
  EXPECT_EQ(r->get_header_value("x-lilac-route"), "cloud");
  EXPECT_LT(seconds, 3.0);
  EXPECT_EQ(up.count(), 1u);

  r = rs.cli.Post("/v1/chat/completions", chat_body(std::string(4096, '&') + " mail ann&commat;corp&period;example").dump(),
                  "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->get_header_value("x-lilac-route"), "local") << r->body.substr(0, 300);
  EXPECT_EQ(r->get_header_value("x-lilac-route-reason"), "sensitive: email");
  EXPECT_EQ(up.count(), 1u);
}
