// Issue 13, 3: the hybrid router scans everything that would leave the machine. Each case put a secret
// where the old scan did not look (tools, schemas, names, ids, user, metadata, stop, unknown fields,
// numbers, objects), split it across messages or text parts, or encoded it; each one went upstream.
// Negative controls keep ordinary requests (numbers, versions, random tool-call ids) routable to the
// cloud. Also: unscannable bodies stay local, stickiness survives whitespace-only edits, a completions
// prompt given as an object is answered locally.
#include <gtest/gtest.h>

#include <string>

#include "router/hybrid.h"
#include "router/normalize.h"
#include "router/scan.h"
#include "text/unicode.h"

using namespace lilac::router;
using json = nlohmann::ordered_json;

namespace {

Router make_router(const char* policy_json = "{}") {
  return Router(parse_route_policy(nlohmann::json::parse(policy_json)), RouterConfig{"lilac", "gpt-up"});
}

json base() {
  return json::parse(R"({"model": "lilac", "messages": [{"role": "user", "content": "Summarise the report."}]})");
}

const char* kEmail = "alice.smith@example.com";

}  // namespace

TEST(RouterScan, SecretsAnywhereInTheBodyStayLocal) {
  Router r = make_router();
  ASSERT_EQ(r.decide(base(), true, "", false).route, Route::cloud);  // control
  struct Case {
    const char* where;
    std::string patch;  // JSON merged into the base body
  };
  const std::string e = kEmail;
  const Case cases[] = {
      {"tool description", R"({"tools": [{"type": "function", "function": {"name": "f", "description": "mail )" + e + R"("}}]})"},
      {"parameter description", R"({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
          "properties": {"to": {"type": "string", "description": "default )" + e + R"("}}}}}]})"},
      {"enum", R"({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
          "properties": {"to": {"type": "string", "enum": ["x", ")" + e + R"("]}}}}}]})"},
      {"tool name", R"({"tools": [{"type": "function", "function": {"name": "ghp_aB3dE5gH7jK9mN1pQ3sT5vX7zA9cE1gI3kM5"}}]})"},
      {"message name", R"({"messages": [{"role": "user", "name": ")" + e + R"(", "content": "hi"}]})"},
      {"user", R"({"user": ")" + e + R"("})"},
      {"metadata value", R"({"metadata": {"owner": ")" + e + R"("}})"},
      {"metadata key", R"({"metadata": {")" + e + R"(": true}})"},
      {"stop", R"({"stop": ["END", ")" + e + R"("]})"},
      {"response_format schema", R"({"response_format": {"type": "json_schema", "json_schema": {"name": "r",
          "schema": {"type": "object", "properties": {"a": {"description": "4111 1111 1111 1111"}}}}}})"},
      {"tool-call id", R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": null,
          "tool_calls": [{"id": ")" + e + R"(", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
          {"role": "tool", "tool_call_id": "x", "content": "ok"}]})"},
      {"tool-call name", R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": null,
          "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "AKIAIOSFODNN7EXAMPLE", "arguments": "{}"}}]}]})"},
      {"unknown top-level field", R"({"x_notes": "SSN 123-45-6789"})"},
      {"unknown nested field", R"({"messages": [{"role": "user", "content": "hi", "extra": {"deep": [")" + e + R"("]}}]})"},
      {"number", R"({"metadata": {"n": 4111111111111111}})"},
      {"object as content", R"({"messages": [{"role": "user", "content": {"text": ")" + e + R"("}}]})"},
      {"number as content", R"({"messages": [{"role": "user", "content": 4111111111111111}]})"},
      {"escaped in arguments", R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": null,
          "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f",
          "arguments": "{\"to\": \"alice\\u0040example.com\"}"}}]}]})"},
  };
  for (const Case& c : cases) {
    json body = base();
    body.merge_patch(json::parse(c.patch));
    RouteDecision d = r.decide(body, true, "", false);
    EXPECT_EQ(d.route, Route::local) << c.where;
    EXPECT_EQ(d.reason, "sensitive") << c.where;
    EXPECT_FALSE(d.matched.empty()) << c.where;
  }
}

TEST(RouterScan, SecretsSplitAcrossMessagesOrPartsStayLocal) {
  Router r = make_router();
  const char* bodies[] = {
      R"({"messages": [{"role": "user", "content": "my card is 4111 1111"}, {"role": "user", "content": "1111 1111"}]})",
      R"({"messages": [{"role": "user", "content": "write to alice.smith@"}, {"role": "user", "content": "example.com"}]})",
      R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "alice.smith@exa"}, {"type": "text", "text": "mple.com"}]}]})",
      R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "SSN 123-45"}, {"type": "text", "text": "-6789"}]}]})",
      R"({"messages": [{"role": "system", "content": "token sk-proj-4fJ9aQ2L"}, {"role": "user", "content": "mZx8TtR1vB6nW3yK"}]})",
  };
  for (const char* b : bodies) {
    RouteDecision d = r.decide(json::parse(b), true, "", false);
    EXPECT_EQ(d.route, Route::local) << b;
  }
  // Long messages: the seams are still looked at.
  std::string pad(5000, 'x');
  json body = json::parse(R"({"messages": [{"role": "user", "content": ""}, {"role": "user", "content": ""}]})");
  body["messages"][0]["content"] = pad + " reach me at alice.smith@";
  body["messages"][1]["content"] = "example.com " + pad;
  EXPECT_EQ(r.decide(body, true, "", false).route, Route::local);
}

// A secret split across two text blocks with a setting between them: the blocks' values joined in document order put
// the ttl between the halves ("AKIAIOSF5mODNN7EXAMPLE"), and the request went to the cloud; the same blocks without
// the ttl stayed local. The content values are joined apart too.
TEST(RouterScan, ASecretSplitAcrossTextBlocksWithASettingBetweenStaysLocal) {
  Router r = make_router();
  const json body = json::parse(R"({"model": "lilac", "max_tokens": 64, "messages": [{"role": "user", "content": [
      {"type": "text", "text": "key AKIAIOSF", "cache_control": {"type": "ephemeral", "ttl": "5m"}},
      {"type": "text", "text": "ODNN7EXAMPLE"}]}]})");
  EXPECT_EQ(r.decide(body, Api::messages, "", false).route, Route::local);
  json plain = body;
  plain["messages"][0]["content"][1]["text"] = "thanks";
  EXPECT_EQ(r.decide(plain, Api::messages, "", false).route, Route::cloud);
}

TEST(RouterScan, EncodedAndObfuscatedSecretsStayLocal) {
  Router r = make_router();
  const char* texts[] = {
      "alice.smith%40example.com",                              // URL-encoded
      "alice.smith%2540example.com",                            // twice
      "contact: YWxpY2Uuc21pdGhAZXhhbXBsZS5jb20=",              // base64 of the address
      "YWxpY2Uuc21pdGglNDBleGFtcGxlLmNvbQ",                     // base64url of the URL-encoded address
      "ａｌｉｃｅ．ｓｍｉｔｈ＠ｅｘａｍｐｌｅ．ｃｏｍ",          // fullwidth
      "al\u200bice.sm\u200cith@exa\u200dmple.c\u2060om",        // zero-width characters
      "\u0430lice.smith@\u0435x\u0430mple.com",                 // Cyrillic a / e
      "alice.smith [at] example [dot] com",
      "alice.smith(at)example(dot)com",
      "alice dot smith at example dot com",
      "alice.smith&#64;example&#46;com",                        // HTML references
      "alice.smith\\u0040example.com",                          // a literal \u escape
      "card 4111_1111_1111_1111",
      "card 4111.1111.1111.1111",
      "card 4 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1",
      "card 4111 - 1111 - 1111 - 1111",
      "card \u0664\u0661\u0661\u0661\u0661\u0661\u0661\u0661\u0661\u0661\u0661\u0661\u0661\u0661\u0661\u0661",  // Arabic-Indic
      "card \uff14\uff11\uff11\uff11 \uff11\uff11\uff11\uff11 \uff11\uff11\uff11\uff11 \uff11\uff11\uff11\uff11",  // fullwidth
      "call 415_555_2671",
      "call 415/555/2671",
      // combining marks that compose with the letter before them (they were composed, then kept as letters)
      "key A\u0301KIAIOSFODNN7EXAMPLE",
      "alice.smith@exa\u0301mple.com",
      "D\u030CE89 3704 0044 0532 0130 00",
      // controls and blank fillers inside a word (kept before: not format characters; ASCII text was not looked at)
      "AKIAIOSF\u0085ODNN7EXAMPLE",
      "AKIAIOSF\u3164ODNN7EXAMPLE",
      "AKIAIOSF\u0001ODNN7EXAMPLE",
      "alice.smith@exa\uFFA0mple.com",
      "alice.smith\uFF05\uFF14\uFF10example.com",             // a URL escape in fullwidth (decoded after NFKC)
      "alice.smith\\\\u0040example.com",                       // a \u escape whose backslash is escaped
      "alice.smith\\u{40}example.com",                         // \u{...}
      "alice.smith\\x40example.com",                           // \x..
      "alice.smith&#0000000064;example.com",                    // a numeric reference with leading zeros
      "card 4111&lowbar;1111&lowbar;1111&lowbar;1111",              // named references
  };
  for (const char* t : texts) {
    json body = base();
    body["messages"][0]["content"] = std::string("Please note: ") + t + ".";
    RouteDecision d = r.decide(body, true, "", false);
    EXPECT_EQ(d.route, Route::local) << t;
  }
}

TEST(RouterScan, OrdinaryRequestsStillGoToTheCloud) {
  Router r = make_router();
  const char* texts[] = {
      "Version 1.2.3 ships on 2024-05-01; the meeting is at 10:30 in room 4.2 (see page 12).",
      "Compute 3.14159 * 2.71828 and 1/3 + 2/3, then list 10, 20, 30, 40.",
      "Look at example.com for the docs and meet me at the station.",
      "The function getUserAccountBalance2024 returns a number; call it at 9 am.",
      "SGVsbG8gd29ybGQ is not important, nor is the word abcdefghijklmnopqrstuvwxyz.",
      "Prices: $1,299.99 and $2,499.00; order #12345 ships in 3-5 days.",
  };
  for (const char* t : texts) {
    json body = base();
    body["messages"][0]["content"] = t;
    RouteDecision d = r.decide(body, true, "", false);
    EXPECT_EQ(d.route, Route::cloud) << t << " -> " << (d.matched.empty() ? "" : d.matched[0]);
  }
  // Random tool-call ids are not secrets.
  json body = json::parse(R"({"model": "lilac", "messages": [{"role": "user", "content": "weather?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_Ab3dEf9hIj2kLm5nOp8qRs1t", "type": "function",
       "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_Ab3dEf9hIj2kLm5nOp8qRs1t", "content": "sunny"}],
      "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
       "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]})");
  RouteDecision d = r.decide(body, true, "", false);
  EXPECT_EQ(d.route, Route::cloud) << (d.matched.empty() ? "" : d.matched[0]);
}

TEST(RouterScan, ABodyThatCannotBeShownCleanStaysLocal) {
  ScanOptions small;
  small.max_bytes = 1000;
  json body = base();
  body["messages"][0]["content"] = std::string(2000, 'a');
  ScanOutcome o = scan_body(body, [](std::string_view, bool, std::vector<std::string>*) { return false; }, small);
  EXPECT_TRUE(o.unscannable);
  EXPECT_EQ(o.matched, std::vector<std::string>{"unscannable"});
  small.max_bytes = 100000;
  EXPECT_FALSE(scan_body(body, [](std::string_view, bool, std::vector<std::string>*) { return false; }, small).unscannable);
}

// A text whose variants outgrow what is left of the budget: 300 x U+FDFA (3 bytes each, 33 in NFKC) before an
// address that only the canonical variant decodes. The canonical variant was cut to exactly the bytes left, the total
// landed on the budget, and the body was shown clean (cloud) with the address never seen.
TEST(RouterScan, AVariantCutByTheBudgetMakesTheBodyUnscannable) {
  std::string t;
  for (int i = 0; i < 300; ++i) t += "\uFDFA";
  t += " alice.smith%40example.com";
  json body = base();
  body["messages"][0]["content"] = t;
  auto sees_address = [](std::string_view s, bool, std::vector<std::string>*) {
    return s.find(kEmail) != std::string_view::npos;
  };
  ScanOptions small;
  small.max_bytes = 4096;
  ScanOutcome o = scan_body(body, sees_address, small);
  EXPECT_TRUE(o.sensitive || o.unscannable) << "shown clean with its decoded end unread";
  EXPECT_TRUE(o.unscannable);
  small.max_bytes = 1 << 20;  // room for every variant: the address is found
  o = scan_body(body, sees_address, small);
  EXPECT_TRUE(o.sensitive);
  EXPECT_FALSE(o.unscannable);
}

// Protocol ids are random by design and not checked for high entropy; a key called `id` in the user's data is not one.
// A random token under {"id": ...} in a tool call's input, in metadata or in a schema's examples went upstream (the
// exemption was by key name at any depth); the same token under "token" stayed local.
TEST(RouterScan, AnIdKeyInTheUsersDataIsNotAProtocolId) {
  Router r = make_router();
  const std::string tok = "q7Rz2Kx9Lm4Vb8Nw3Ty6Pc1Hd5";
  const json tool_use = json::parse(R"({"model": "lilac", "max_tokens": 64, "messages": [
      {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_01", "name": "login", "input": {}}]},
      {"role": "user", "content": "go"}]})");
  for (const char* key : {"token", "id"}) {
    json b = tool_use;
    b["messages"][0]["content"][0]["input"][key] = tok;
    EXPECT_EQ(r.decide(b, Api::messages, "", false).route, Route::local) << "input." << key;
  }
  json m = base();
  m["metadata"] = {{"id", tok}};
  EXPECT_EQ(r.decide(m, true, "", false).route, Route::local) << "metadata.id";
  json args = base();
  args["messages"].push_back({{"role", "assistant"}, {"content", nullptr},
                              {"tool_calls", {{{"id", "call_Ab3dEf9hIj2kLm5nOp8qRs1t"}, {"type", "function"},
                                               {"function", {{"name", "login"}, {"arguments", "{\"id\": \"" + tok + "\"}"}}}}}}});
  EXPECT_EQ(r.decide(args, true, "", false).route, Route::local) << "arguments' id";
  // the protocol's own ids (a tool_use block's; a Responses function call's and its item's) still go to the cloud
  json ids = tool_use;
  ids["messages"][0]["content"][0]["id"] = "toolu_" + tok;
  EXPECT_EQ(r.decide(ids, Api::messages, "", false).route, Route::cloud);
  const json responses = {{"model", "lilac"},
                          {"input", {{{"role", "user"}, {"content", "weather?"}},
                                     {{"type", "function_call"}, {"id", "fc_" + tok}, {"call_id", "call_" + tok},
                                      {"name", "get_weather"}, {"arguments", "{\"city\": \"Paris\"}"}},
                                     {{"type", "function_call_output"}, {"call_id", "call_" + tok}, {"output", "sunny"}}}}};
  EXPECT_EQ(r.decide(responses, Api::responses, "", false).route, Route::cloud);
}

TEST(RouterScan, StickinessSurvivesWhitespaceOnlyEdits) {
  Router r = make_router();
  json turn1 = json::parse(R"({"messages": [{"role": "user", "content": "Tell me about my account."}], "lilac": {"route": "local"}})");
  ASSERT_EQ(r.decide(turn1, true, "", false).route, Route::local);
  r.remember_local(turn1);
  json turn2 = json::parse(R"({"messages": [{"role": "user", "content": "  Tell me about\n my account. "},
      {"role": "assistant", "content": "Sure."}, {"role": "user", "content": "Go on."}]})");
  RouteDecision d = r.decide(turn2, true, "", false);
  EXPECT_EQ(d.route, Route::local);
  EXPECT_EQ(d.reason, "sticky");
  // Text parts and tool-call arguments re-serialised with other spacing hash the same.
  json a = json::parse(R"([{"role": "user", "content": [{"type": "text", "text": "a b"}]},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]}])");
  json b = json::parse(R"([{"role": "user", "content": "a  b "},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{ \"x\":1 }"}}]}])");
  EXPECT_EQ(message_prefix_hashes(a), message_prefix_hashes(b));
  json c = b;
  c[0]["content"] = "a  c ";
  EXPECT_NE(message_prefix_hashes(a)[0], message_prefix_hashes(c)[0]);
}

TEST(RouterScan, ACompletionsPromptThatIsAnObjectIsAnsweredLocally) {
  Router r = make_router();
  for (const char* b : {R"({"model": "lilac", "prompt": {"text": "hello"}})", R"({"model": "lilac", "prompt": 42})",
                        R"({"model": "lilac", "prompt": [{"a": 1}]})"}) {
    RouteDecision d = r.decide(json::parse(b), false, "", false);
    EXPECT_EQ(d.route, Route::local) << b;
    EXPECT_EQ(d.reason, "invalid") << b;
  }
  RouteDecision d = r.decide(json::parse(R"({"model": "lilac", "prompt": "hello"})"), false, "", false);
  EXPECT_EQ(d.route, Route::cloud);
  d = r.decide(json::parse(R"({"model": "lilac", "messages": {"role": "user"}})"), true, "", false);
  EXPECT_EQ(d.route, Route::local);
}

TEST(RouterScan, NormalizeBuildingBlocks) {
  EXPECT_EQ(canonical_text("a%40b&#46;c\\u0040d"), "a@b.c@d");
  EXPECT_EQ(canonical_text("x [at] y (dot) z"), "x@y.z");
  EXPECT_EQ(canonical_text("look at this"), "look at this");  // " at " alone is English
  EXPECT_EQ(canonical_text("\u0661\u0662\u0663"), "123");
  EXPECT_EQ(decode_base64_runs("aGVsbG8gd29ybGQgaGVsbG8="), "hello world hello\n");
  EXPECT_EQ(decode_base64_runs("////////////////////////"), "");  // binary
  EXPECT_EQ(collapse_whitespace(" a \n\t b\u00a0c  "), "a b c");
}

// base64_digit's table and collapse_whitespace's ASCII path (both per byte of every routed prompt) against the
// definitions they replace: the alphabets' values for all 256 bytes; an ASCII byte is whitespace exactly where
// unicode::is_whitespace says so, also between non-ASCII text and at the ends.
TEST(RouterScan, PerByteFastPathsAgreeWithTheirDefinitions) {
  for (int c = 0; c < 256; ++c) {
    int want = -1;
    if (c >= 'A' && c <= 'Z') want = c - 'A';
    else if (c >= 'a' && c <= 'z') want = c - 'a' + 26;
    else if (c >= '0' && c <= '9') want = c - '0' + 52;
    else if (c == '+' || c == '-') want = 62;
    else if (c == '/' || c == '_') want = 63;
    EXPECT_EQ(base64_digit(static_cast<char>(c)), want) << c;
  }
  for (int c = 1; c < 0x80; ++c) {
    const std::string ch(1, static_cast<char>(c));
    const bool ws = lilac::unicode::is_whitespace(char32_t(c));
    EXPECT_EQ(collapse_whitespace("\u00e9" + ch + ch + "x" + ch), ws ? "\u00e9 x" : "\u00e9" + ch + ch + "x" + ch) << c;
    EXPECT_EQ(collapse_whitespace(ch + "a"), ws ? "a" : ch + "a") << c;
  }
  EXPECT_EQ(collapse_whitespace("a\u2003\u3000 b\xff\t c"), "a b\xff c");  // Unicode spaces; an invalid byte is text
}

// An image or a PDF sent as base64 cannot be read by the scan. With high_entropy on its runs kept it local; with
// high_entropy off it went to the cloud unscanned. The opaque detector keeps it local (the policy can turn it off).
TEST(RouterScan, AnOpaquePayloadStaysLocalWithoutTheEntropyDetector) {
  std::string bytes = "%PDF-1.7\n%\xE2\xE3\xCF\xD3\n";
  uint32_t x = 12345;
  while (bytes.size() < 2000) {
    x = x * 1103515245u + 12345u;
    bytes += char((x >> 16) & 0xFF);
  }
  static const char* kAlpha = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string b64;
  for (size_t i = 0; i + 2 < bytes.size(); i += 3) {
    const uint32_t v = uint32_t(uint8_t(bytes[i])) << 16 | uint32_t(uint8_t(bytes[i + 1])) << 8 | uint8_t(bytes[i + 2]);
    for (int k = 0; k < 4; ++k) b64 += kAlpha[(v >> (18 - 6 * k)) & 63];
  }
  json messages = json::parse(R"({"model": "lilac", "max_tokens": 100, "messages": [{"role": "user", "content": [
      {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": ""}},
      {"type": "text", "text": "Summarise this contract."}]}]})");
  messages["messages"][0]["content"][0]["source"]["data"] = b64;
  json chat = base();
  chat["messages"][0]["content"] = json::array({{{"type", "text"}, {"text", "What is in this picture?"}},
                                                {{"type", "image_url"}, {"image_url", {{"url", "data:image/png;base64," + b64}}}}});
  for (const auto& [body, api] : {std::pair{messages, Api::messages}, std::pair{chat, Api::chat}}) {
    Router entropy_off = make_router(R"({"detectors": {"high_entropy": false}})");
    RouteDecision d = entropy_off.decide(body, api, "", false);
    EXPECT_EQ(d.route, Route::local);
    EXPECT_TRUE(std::find(d.matched.begin(), d.matched.end(), "opaque") != d.matched.end());
    Router both_off = make_router(R"({"detectors": {"high_entropy": false, "opaque": false}})");
    EXPECT_EQ(both_off.decide(body, api, "", false).route, Route::cloud);
  }
}

// A Responses conversation begun locally with a string input: its second turn sends that text back as its first item
// (as input_text) with the local answer (output_text). The string input was not remembered, so that turn went to the
// cloud with the local exchange; it stays local now. Function-call items hashed alike whatever their call, so two
// conversations that differ only in a call matched each other.
TEST(RouterScan, AResponsesConversationBegunWithAStringStaysLocal) {
  Router r = make_router();
  json turn1 = json::parse(R"({"model": "lilac", "input": "Tell me about my account.", "lilac": {"route": "local"}})");
  ASSERT_EQ(r.decide(turn1, Api::responses, "", false).route, Route::local);
  r.remember_local(turn1);
  json turn2 = json::parse(R"({"model": "lilac", "input": [
      {"role": "user", "content": [{"type": "input_text", "text": "Tell me about my account."}]},
      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sure."}]},
      {"role": "user", "content": "Go on."}]})");
  RouteDecision d = r.decide(turn2, Api::responses, "", false);
  EXPECT_EQ(d.route, Route::local);
  EXPECT_EQ(d.reason, "sticky");

  auto call = [](const char* name, const char* args) {
    return json{{"type", "function_call"}, {"call_id", "c1"}, {"name", name}, {"arguments", args}};
  };
  const json u = {{"role", "user"}, {"content", "weather?"}};
  const auto a = message_prefix_hashes(json::array({u, call("get_weather", "{\"city\": \"Rome\"}")}));
  const auto b = message_prefix_hashes(json::array({u, call("get_weather", "{\"city\":\"Rome\"}")}));
  const auto c = message_prefix_hashes(json::array({u, call("get_weather", "{\"city\": \"Oslo\"}")}));
  const auto e = message_prefix_hashes(json::array({u, call("send_mail", "{\"city\": \"Rome\"}")}));
  EXPECT_EQ(a, b);
  EXPECT_NE(a[1], c[1]);
  EXPECT_NE(a[1], e[1]);
}
