// The hybrid router's decision: rule order, sensitivity over every part of a request, stickiness,
// model naming, size and busy rules, model-rule vetoes.
#include <gtest/gtest.h>

#include <chrono>
#include <ctime>

#include "router/hybrid.h"

using namespace lilac::router;
using json = nlohmann::json;

namespace {

Router make_router(const char* policy_json = "{}", std::string upstream_model = "gpt-up") {
  return Router(parse_route_policy(json::parse(policy_json)), RouterConfig{"lilac", std::move(upstream_model)});
}

json chat(std::vector<json> messages, std::string model = "lilac") {
  return json{{"model", model}, {"messages", messages}};
}
json user(const std::string& s) { return json{{"role", "user"}, {"content", s}}; }
json sys(const std::string& s) { return json{{"role", "system"}, {"content", s}}; }
json assistant(const std::string& s) { return json{{"role", "assistant"}, {"content", s}}; }

}  // namespace

TEST(HybridRouter, DefaultCloudForPlainRequests) {
  Router r = make_router();
  auto d = r.decide(chat({user("What is the capital of France?")}), true, "", false);
  EXPECT_EQ(d.route, Route::cloud);
  EXPECT_EQ(d.reason, "default");
  EXPECT_EQ(d.upstream_model, "gpt-up");
  EXPECT_FALSE(d.sensitive);
}

TEST(HybridRouter, SensitiveDataAnywhereStaysLocal) {
  Router r = make_router();
  struct C {
    json body;
    bool chat;
    const char* kind;
  };
  json tool_call_msg = {{"role", "assistant"},
                        {"content", nullptr},
                        {"tool_calls", json::array({{{"id", "c1"},
                                                     {"type", "function"},
                                                     {"function", {{"name", "send"}, {"arguments", "{\"to\": \"ann@corp.example\"}"}}}}})}};
  json tool_call_obj = tool_call_msg;
  tool_call_obj["tool_calls"][0]["function"]["arguments"] = json{{"card", "4111 1111 1111 1111"}};
  std::vector<C> cases = {
      {chat({user("mail bob@example.com the report")}), true, "email"},
      {chat({sys("Admin SSN is 123-45-6789."), user("hello")}), true, "ssn"},
      {chat({user("hi"), json{{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "IBAN GB82WEST12345698765432"}}}), true, "iban"},
      {chat({user("send it"), tool_call_msg}), true, "email"},
      {chat({user("pay"), tool_call_obj}), true, "card"},
      {chat({json{{"role", "user"}, {"content", json::array({{{"type", "text"}, {"text", "ip is 10.1.2.3"}}})}}}), true, "ipv4"},
      {chat({json{{"role", "assistant"}, {"content", "ok"}, {"reasoning_content", "key sk-proj-4fJ9aQ2LmZx8TtR1vB6nW3yK"}}}), true, "api_key"},
      {json{{"model", "lilac"}, {"prompt", "call +44 20 7946 0958"}}, false, "phone"},
      {json{{"model", "lilac"}, {"prompt", json::array({"fine", "-----BEGIN PRIVATE KEY-----"})}}, false, "private_key"},
      {json{{"model", "lilac"}, {"prompt", "x"}, {"suffix", "fe80::1ff:fe23:4567:890a"}}, false, "ipv6"},
      {json{{"model", "lilac"}, {"prompt", json::array({151644, 872, 198})}}, false, "token_ids"},
      {json{{"model", "lilac"}, {"prompt", json::array({json::array({1, 2}), json::array({3})})}}, false, "token_ids"},
  };
  for (const auto& c : cases) {
    auto d = r.decide(c.body, c.chat, "", false);
    EXPECT_EQ(d.route, Route::local) << c.body.dump();
    EXPECT_EQ(d.reason, "sensitive") << c.body.dump();
    EXPECT_TRUE(d.sensitive);
    ASSERT_FALSE(d.matched.empty()) << c.body.dump();
    EXPECT_EQ(d.matched[0], c.kind) << c.body.dump();
  }
}

TEST(HybridRouter, UserRulesKeywordsAndRegexes) {
  Router r = make_router(R"({"rules": [{"name": "falcon", "keywords": ["project falcon"]},
                                       {"name": "emp", "regex": ["EMP-[0-9]{6}"], "case_insensitive": false}]})");
  auto d = r.decide(chat({user("Status of PROJECT FALCON?")}), true, "", false);
  EXPECT_EQ(d.route, Route::local);
  ASSERT_EQ(d.matched.size(), 1u);
  EXPECT_EQ(d.matched[0], "rule:falcon");
  d = r.decide(chat({user("who is EMP-004211")}), true, "", false);
  EXPECT_EQ(d.route, Route::local);
  EXPECT_EQ(d.matched[0], "rule:emp");
  d = r.decide(chat({user("who is emp-004211")}), true, "", false);
  EXPECT_EQ(d.route, Route::cloud);
}

// A user regex that backtracks: on 3,000 "a." before the name, pcre2_match gives up with an error (the JIT stack
// limit, -46, as measured with Debian's libpcre2 10.42) instead of matching. That error counted as "no match" and the
// text went to the cloud; it is kept local now (a pattern that does finish matches it either way).
TEST(HybridRouter, AUserRegexThatErrorsKeepsTheTextLocal) {
  Router r = make_router(R"({"rules": [{"name": "corp", "regex": ["([a-z0-9-]+\\.)+corp\\.example\\.com"]}]})");
  std::string pad;
  for (int i = 0; i < 3000; ++i) pad += "a.";
  auto d = r.decide(chat({user(pad + " see db1.corp.example.com")}), true, "", false);
  EXPECT_EQ(d.route, Route::local);
  ASSERT_FALSE(d.matched.empty());
  EXPECT_EQ(d.matched[0], "rule:corp");
  // the control: without the padding it matches plainly; an unrelated text still goes to the cloud
  EXPECT_EQ(r.decide(chat({user("see db1.corp.example.com")}), true, "", false).route, Route::local);
  EXPECT_EQ(r.decide(chat({user("see the docs")}), true, "", false).route, Route::cloud);
}

TEST(HybridRouter, DisabledDetectorsDoNotTrigger) {
  Router r = make_router(R"({"detectors": {"ipv4": false}})");
  EXPECT_EQ(r.decide(chat({user("ping 10.0.0.1")}), true, "", false).route, Route::cloud);
  EXPECT_EQ(r.decide(chat({user("mail a@b.io")}), true, "", false).route, Route::local);
}

TEST(HybridRouter, ExplicitChoiceOrder) {
  Router r = make_router(R"({"default_route": "local"})");
  json plain = chat({user("hello")});
  json secret = chat({user("my card 4111111111111111")});
  // Body field.
  json b = plain;
  b["lilac"] = {{"route", "cloud"}};
  auto d = r.decide(b, true, "", false);
  EXPECT_EQ(d.route, Route::cloud);
  EXPECT_EQ(d.reason, "explicit");
  // Header.
  d = r.decide(plain, true, "cloud", false);
  EXPECT_EQ(d.route, Route::cloud);
  EXPECT_EQ(d.reason, "explicit");
  // Body wins over the header.
  b["lilac"] = {{"route", "local"}};
  d = r.decide(b, true, "cloud", false);
  EXPECT_EQ(d.route, Route::local);
  EXPECT_EQ(d.reason, "explicit");
  // auto = no explicit choice.
  d = r.decide(plain, true, "auto", false);
  EXPECT_EQ(d.route, Route::local);
  EXPECT_EQ(d.reason, "default");
  // Explicit cloud does not move sensitive data...
  d = r.decide(secret, true, "cloud", false);
  EXPECT_EQ(d.route, Route::local);
  EXPECT_EQ(d.reason, "sensitive");
  // ... unless the policy says so.
  Router lax = make_router(R"({"allow_explicit_cloud_for_sensitive": true})");
  d = lax.decide(secret, true, "cloud", false);
  EXPECT_EQ(d.route, Route::cloud);
  EXPECT_EQ(d.reason, "explicit");
  // Bad values.
  d = r.decide(plain, true, "sideways", false);
  EXPECT_EQ(d.error_status, 400);
  EXPECT_EQ(d.error_param, "x-lilac-route");
  b["lilac"] = {{"route", 3}};
  EXPECT_EQ(r.decide(b, true, "", false).error_status, 400);
  b["lilac"] = "local";
  EXPECT_EQ(r.decide(b, true, "", false).error_status, 400);
}

TEST(HybridRouter, StickinessKeepsALocalConversationLocal) {
  Router r = make_router();
  json turn1 = chat({sys("You are helpful."), user("Draft a note to my doctor.")});
  EXPECT_EQ(r.decide(turn1, true, "", false).route, Route::cloud);
  r.remember_local(turn1);  // e.g. it was sent local explicitly
  EXPECT_EQ(r.sticky_entries(), 1u);
  // The same request again and its continuation stay local.
  auto d = r.decide(turn1, true, "", false);
  EXPECT_EQ(d.route, Route::local);
  EXPECT_EQ(d.reason, "sticky");
  json turn2 = turn1;
  turn2["messages"].push_back(assistant("Sure, here is a draft."));
  turn2["messages"].push_back(user("Make it shorter."));
  d = r.decide(turn2, true, "", false);
  EXPECT_EQ(d.route, Route::local);
  EXPECT_EQ(d.reason, "sticky");
  // The same system prompt with another first user message is a different conversation.
  json other = chat({sys("You are helpful."), user("Tell me a joke.")});
  EXPECT_EQ(r.decide(other, true, "", false).route, Route::cloud);
  // A prefix of the remembered conversation is not sticky (only what was actually sent local counts).
  json shorter = chat({sys("You are helpful.")});
  EXPECT_EQ(r.decide(shorter, true, "", false).route, Route::cloud);
  // Text parts and a plain string are the same message.
  json parts = chat({sys("You are helpful."),
                     json{{"role", "user"}, {"content", json::array({{{"type", "text"}, {"text", "Draft a note to my doctor."}}})}}});
  EXPECT_EQ(r.decide(parts, true, "", false).reason, "sticky");
  // Explicit cloud beats stickiness (the caller asked), sensitivity still wins over both.
  EXPECT_EQ(r.decide(turn2, true, "cloud", false).route, Route::cloud);
  // Sticky beats the upstream model name.
  json named = turn2;
  named["model"] = "cloud/gpt-up";
  EXPECT_EQ(r.decide(named, true, "", false).reason, "sticky");
}

TEST(HybridRouter, StickinessIsBoundedAndCanBeOff) {
  Router r = make_router(R"({"sticky": {"max_entries": 2}})");
  json a = chat({user("a")}), b = chat({user("b")}), c = chat({user("c")});
  r.remember_local(a);
  r.remember_local(b);
  r.remember_local(c);
  EXPECT_EQ(r.sticky_entries(), 2u);
  EXPECT_FALSE(r.is_sticky(a));  // evicted first
  EXPECT_TRUE(r.is_sticky(b));
  EXPECT_TRUE(r.is_sticky(c));
  Router off = make_router(R"({"sticky": false})");
  off.remember_local(a);
  EXPECT_FALSE(off.is_sticky(a));
}

TEST(HybridRouter, PrefixHashes) {
  json m1 = json::array({user("a"), assistant("b")});
  json m2 = json::array({user("a"), assistant("b"), user("c")});
  auto h1 = message_prefix_hashes(m1), h2 = message_prefix_hashes(m2);
  ASSERT_EQ(h1.size(), 2u);
  ASSERT_EQ(h2.size(), 3u);
  EXPECT_EQ(h1[0], h2[0]);
  EXPECT_EQ(h1[1], h2[1]);
  EXPECT_NE(h2[1], h2[2]);
  // Field boundaries matter; content null == "" (the server normalises null to "").
  EXPECT_NE(message_prefix_hashes(json::array({user("ab")}))[0],
            message_prefix_hashes(json::array({json{{"role", "usera"}, {"content", "b"}}}))[0]);
  EXPECT_EQ(message_prefix_hashes(json::array({json{{"role", "assistant"}, {"content", nullptr}}}))[0],
            message_prefix_hashes(json::array({json{{"role", "assistant"}, {"content", ""}}}))[0]);
  EXPECT_NE(message_prefix_hashes(json::array({user("a"), user("b")}))[1],
            message_prefix_hashes(json::array({user("b"), user("a")}))[1]);
}

// A content part whose "type" is not a string hashes as any other part that is not text (by value): reading it with
// nlohmann's value("type", "") threw type_error out of the routing decision for a client's malformed part.
TEST(HybridRouter, APartWhoseTypeIsNotAStringHashesByValue) {
  const json odd = json::array({json{{"role", "user"}, {"content", json::array({json{{"type", 5}, {"text", "a"}}})}}});
  std::vector<uint64_t> h;
  ASSERT_NO_THROW(h = message_prefix_hashes(odd));
  ASSERT_EQ(h.size(), 1u);
  EXPECT_NE(h[0], message_prefix_hashes(json::array({user("a")}))[0]);
  EXPECT_EQ(h, message_prefix_hashes(odd));
}

TEST(HybridRouter, ModelNamesAndModelRules) {
  Router r = make_router(R"({"default_route": "local",
                             "models": [{"match": "cloud/forbidden", "routes": ["local"]},
                                        {"match": "cloud/only-up", "routes": ["cloud"]},
                                        {"match": "lilac", "routes": ["local"]}]})");
  auto d = r.decide(chat({user("hi")}, "cloud/gpt-4o"), true, "", false);
  EXPECT_EQ(d.route, Route::cloud);
  EXPECT_EQ(d.reason, "model");
  EXPECT_EQ(d.upstream_model, "gpt-4o");
  // The configured upstream model name without the prefix.
  d = r.decide(chat({user("hi")}, "gpt-up"), true, "", false);
  EXPECT_EQ(d.route, Route::cloud);
  EXPECT_EQ(d.upstream_model, "gpt-up");
  // Ids the upstream listed.
  r.set_upstream_model_ids({"listed-model"});
  d = r.decide(chat({user("hi")}, "listed-model"), true, "", false);
  EXPECT_EQ(d.route, Route::cloud);
  EXPECT_EQ(d.upstream_model, "listed-model");
  // A forbidden upstream model is served locally.
  d = r.decide(chat({user("hi")}, "cloud/forbidden"), true, "", false);
  EXPECT_EQ(d.route, Route::local);
  EXPECT_EQ(d.reason, "model_rule");
  // The local model may not go upstream even when asked.
  d = r.decide(chat({user("hi")}, "lilac"), true, "cloud", false);
  EXPECT_EQ(d.route, Route::local);
  EXPECT_EQ(d.reason, "model_rule");
  // An upstream-only model with sensitive data: refused, never sent.
  d = r.decide(chat({user("mail a@b.io")}, "cloud/only-up"), true, "", false);
  EXPECT_EQ(d.error_status, 403);
  EXPECT_EQ(d.error_code, "route_forbidden");
  EXPECT_EQ(d.error_message.find("a@b.io"), std::string::npos);
  // A sensitive request naming an ordinary upstream model stays local (the router renames the model).
  d = r.decide(chat({user("mail a@b.io")}, "cloud/gpt-4o"), true, "", false);
  EXPECT_EQ(d.route, Route::local);
  EXPECT_TRUE(d.model_is_upstream);
}

TEST(HybridRouter, SizeAndBusyRules) {
  Router r = make_router(R"({"default_route": "local", "max_local_prompt_bytes": 100})");
  EXPECT_EQ(r.decide(chat({user(std::string(50, 'a'))}), true, "", false).route, Route::local);
  auto d = r.decide(chat({user(std::string(150, 'a'))}), true, "", false);
  EXPECT_EQ(d.route, Route::cloud);
  EXPECT_EQ(d.reason, "size");
  // Large but sensitive: local.
  d = r.decide(chat({user(std::string(150, 'a') + " bob@example.com")}), true, "", false);
  EXPECT_EQ(d.route, Route::local);
  Router t = make_router(R"({"default_route": "local", "max_local_prompt_tokens": 10})");
  EXPECT_EQ(t.decide(chat({user(std::string(40, 'a'))}), true, "", false).route, Route::local);
  EXPECT_EQ(t.decide(chat({user(std::string(44, 'a'))}), true, "", false).reason, "size");
  // Busy.
  d = r.decide(chat({user("hello")}), true, "", true);
  EXPECT_EQ(d.route, Route::cloud);
  EXPECT_EQ(d.reason, "busy");
  EXPECT_EQ(r.decide(chat({user("hello a@b.io")}), true, "", true).route, Route::local);
  Router nobusy = make_router(R"({"default_route": "local", "fallback": {"local_busy_to_cloud": false}})");
  EXPECT_EQ(nobusy.decide(chat({user("hello")}), true, "", true).route, Route::local);
  // auto = local unless size / busy sent it.
  Router aut = make_router(R"({"default_route": "auto"})");
  EXPECT_EQ(aut.decide(chat({user("hello")}), true, "", false).route, Route::local);
  EXPECT_EQ(aut.decide(chat({user("hello")}), true, "", true).route, Route::cloud);
}

TEST(HybridRouter, NoUpstreamModelKnownLeavesItEmpty) {
  Router r = make_router("{}", "");
  auto d = r.decide(chat({user("hi")}), true, "", false);
  EXPECT_EQ(d.route, Route::cloud);
  EXPECT_EQ(d.upstream_model, "");
  r.set_upstream_model_ids({"m1", "m2"});
  EXPECT_EQ(r.decide(chat({user("hi")}), true, "", false).upstream_model, "m1");
}

TEST(HybridRouter, DecisionFor100KBPromptIsUnderOneMillisecond) {
  // The benchmark (bench/bench_router.cpp) is the measurement; this guards against a gross regression
  // with a generous bound (CI machines are shared).
  std::string text;
  const char* words[] = {"the ", "quick ", "brown ", "fox ", "jumps ", "over ", "lazy ", "dog ", "2024 ", "v1.2.3 ",
                         "meeting ", "at ", "10:30, ", "room ", "4.2; ", "getUserAccount2 ", "(see ", "note) "};
  for (size_t i = 0; text.size() < 100000; ++i) text += words[(i * 7) % 18];
  Router r = make_router(R"({"rules": [{"name": "k", "keywords": ["project falcon", "internal only"]}]})");
  json body = chat({sys("You are helpful."), user(text)});
  body["model"] = "lilac";
  auto d = r.decide(body, true, "", false);
  EXPECT_EQ(d.route, Route::cloud) << (d.matched.empty() ? "" : d.matched[0]);
  // Thread CPU time, so other processes on a shared machine do not count.
  auto cpu_ms = [] {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
  };
  double t0 = cpu_ms();
  for (int i = 0; i < 20; ++i) d = r.decide(body, true, "", false);
  double ms = (cpu_ms() - t0) / 20;
  EXPECT_LT(ms, 4.0);
}

// Bodies arrive as ordered JSON (key order as the client wrote it): an object-valued tool-call argument or
// an odd content part must hash the same whatever its key order, and differently when a value differs.
TEST(HybridRouter, PrefixHashesIgnoreObjectKeyOrder) {
  using ojson = nlohmann::ordered_json;
  auto call = [](const char* args) {
    return ojson::array({ojson{{"role", "assistant"},
                               {"content", nullptr},
                               {"tool_calls", ojson::array({{{"type", "function"},
                                                             {"function", {{"name", "f"}, {"arguments", ojson::parse(args)}}}}})}}});
  };
  EXPECT_EQ(message_prefix_hashes(call(R"({"a": 1, "b": {"x": [1, 2], "y": "z"}})"))[0],
            message_prefix_hashes(call(R"({"b": {"y": "z", "x": [1, 2]}, "a": 1})"))[0]);
  EXPECT_NE(message_prefix_hashes(call(R"({"a": 1, "b": {"x": [1, 2], "y": "z"}})"))[0],
            message_prefix_hashes(call(R"({"a": 1, "b": {"x": [2, 1], "y": "z"}})"))[0]);
  EXPECT_NE(message_prefix_hashes(call(R"({"a": "1"})"))[0], message_prefix_hashes(call(R"({"a": 1})"))[0]);
  auto part = [](const char* p) {
    return ojson::array({ojson{{"role", "user"}, {"content", ojson::array({ojson::parse(p)})}}});
  };
  EXPECT_EQ(message_prefix_hashes(part(R"({"type": "image_url", "image_url": {"url": "u", "detail": "low"}})"))[0],
            message_prefix_hashes(part(R"({"image_url": {"detail": "low", "url": "u"}, "type": "image_url"})"))[0]);
}

// Anthropic Messages and OpenAI Responses bodies: every string is scanned (blocks, tool inputs, tool
// results, instructions, input items), stickiness follows the conversation (messages, or input items).
TEST(HybridRouter, MessagesAndResponsesBodiesAreScannedAndSticky) {
  Router r = make_router();
  EXPECT_EQ(api_for_path("/v1/messages"), Api::messages);
  EXPECT_EQ(api_for_path("/v1/responses"), Api::responses);
  EXPECT_EQ(api_for_path("/v1/chat/completions"), Api::chat);
  EXPECT_EQ(api_for_path("/v1/completions"), Api::completions);
  EXPECT_STREQ(upstream_path(Api::messages), "/messages");
  EXPECT_STREQ(upstream_path(Api::responses), "/responses");
  json plain_msg = json::parse(R"({"model": "lilac", "max_tokens": 9, "system": "be nice",
    "messages": [{"role": "user", "content": [{"type": "text", "text": "capital of France?"}]}]})");
  auto d = r.decide(plain_msg, Api::messages, "", false);
  EXPECT_EQ(d.route, Route::cloud);
  struct C {
    const char* body;
    Api api;
    const char* kind;
  };
  std::vector<C> cases = {
      {R"({"system": [{"type": "text", "text": "ssn 123-45-6789"}], "messages": [{"role": "user", "content": "hi"}]})", Api::messages, "ssn"},
      {R"({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": "bob@example.com"}]}]}]})",
       Api::messages, "email"},
      {R"({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "pay", "input": {"card": "4111 1111 1111 1111"}}]}]})",
       Api::messages, "card"},
      {R"({"instructions": "call +44 20 7946 0958", "input": "hi"})", Api::responses, "phone"},
      {R"({"input": [{"type": "function_call_output", "call_id": "c", "output": "IBAN GB82WEST12345698765432"}]})", Api::responses, "iban"},
      {R"({"input": [{"role": "user", "content": [{"type": "input_text", "text": "ip 10.1.2.3"}]}]})", Api::responses, "ipv4"},
  };
  for (const auto& c : cases) {
    auto dd = r.decide(json::parse(c.body), c.api, "", false);
    EXPECT_EQ(dd.route, Route::local) << c.body;
    EXPECT_EQ(dd.reason, "sensitive") << c.body;
    ASSERT_FALSE(dd.matched.empty()) << c.body;
    EXPECT_EQ(dd.matched[0], c.kind) << c.body;
  }
  // Stickiness over Responses input items.
  json turn1 = json::parse(R"({"input": [{"role": "user", "content": "hello there"}]})");
  r.remember_local(turn1);
  json turn2 = turn1;
  turn2["input"].push_back(json::parse(R"({"role": "assistant", "content": "hi"})"));
  turn2["input"].push_back(json::parse(R"({"role": "user", "content": "more"})"));
  auto s = r.decide(turn2, Api::responses, "", false);
  EXPECT_EQ(s.route, Route::local);
  EXPECT_EQ(s.reason, "sticky");
}

// The forwarded body is built without copying the parsed request; it must be the bytes the copy would dump.
TEST(HybridRouter, UpstreamBodyIsTheCopyWithFieldsDroppedAndModelSet) {
  using ojson = nlohmann::ordered_json;
  auto via_copy = [](const ojson& body, const std::vector<std::string>& drop, const std::string& model) {
    ojson fwd = body;
    fwd.erase("lilac");
    for (const auto& f : drop) fwd.erase(f);
    fwd["model"] = model;
    return fwd.dump();
  };
  const std::vector<ojson> bodies = {
      ojson::parse(R"({"model":"lilac","messages":[{"role":"user","content":"hi"}],"stream":true})"),
      ojson::parse(R"({"messages":[{"role":"user","content":"h\u00e9 \"q\" \n"}],"lilac":{"route":"cloud"},"user":"u1"})"),
      ojson::parse(R"({"user":"u","model":"x","metadata":{"k\u00fc":[1,2.5,null,true]},"lilac":1,"temperature":0.7})"),
      ojson::parse(R"({})"),
  };
  const std::vector<std::vector<std::string>> drops = {{}, {"user"}, {"user", "model"}, {"metadata", "absent"}};
  for (const auto& b : bodies)
    for (const auto& d : drops) EXPECT_EQ(upstream_body(b, d, "gpt-up"), via_copy(b, d, "gpt-up")) << b.dump();
  EXPECT_EQ(upstream_body(bodies[0], {}, "gpt-up"),
            R"({"model":"gpt-up","messages":[{"role":"user","content":"hi"}],"stream":true})");
}
