// Hostile request bodies through the real HTTP path: each once crashed the server or got a wrong status (a 5xx for
// the client's own mistake). Each answer is checked for its status, its error's param and what was stored.
#include <gtest/gtest.h>
#include <httplib.h>

#include "server_test_util.h"

using nlohmann::json;
using namespace nlohmann::literals;
using lilac::test::post_json;

namespace {

json get_json(int port, const std::string& path) {
  httplib::Client cli("127.0.0.1", port);
  auto r = cli.Get(path);
  if (!r) {
    ADD_FAILURE() << "no response from GET " << path;
    return json();
  }
  EXPECT_EQ(r->status, 200) << path << ": " << r->body;
  return json::parse(r->body, nullptr, false);
}

// A conversation item whose "type" is null: null is "not given" for every request field, so the item is a message
// (what the Responses input reads it as). Storing it read the type with json::value(), which throws on null: a 500
// "type must be string, but is null" from POST /v1/conversations, POST .../items and a Responses request that goes on
// with a conversation. A type of the wrong kind is a 400 naming it.
TEST(HostileInput, AConversationItemWhoseTypeIsNullIsAMessage) {
  lilac::test::LocalServer srv(lilac::test::LocalServer::options());
  const json item = {{"type", nullptr}, {"role", "user"}, {"content", "hi"}};
  const json made = post_json(srv.port, "/v1/conversations", {{"items", {item}}});
  ASSERT_TRUE(made.contains("id")) << made.dump();
  const std::string conv = made["id"];
  const std::string items = "/v1/conversations/" + conv + "/items";
  json page = get_json(srv.port, items + "?order=asc");
  ASSERT_EQ(page["data"].size(), 1u) << page.dump();
  EXPECT_EQ(page["data"][0]["type"], "message");
  EXPECT_EQ(page["data"][0]["content"][0]["text"], "hi");

  const json added = post_json(srv.port, items, {{"items", {item}}});
  ASSERT_EQ(added["data"].size(), 1u) << added.dump();
  EXPECT_EQ(added["data"][0]["type"], "message");

  const json resp = post_json(srv.port, "/v1/responses",
                              {{"conversation", conv}, {"input", {item}}, {"reasoning", {{"effort", "none"}}}});
  EXPECT_EQ(resp["status"], "completed") << resp.dump();
  page = get_json(srv.port, items + "?order=asc");
  ASSERT_EQ(page["data"].size(), 4u) << page.dump();  // two items, then this response's input and its answer
  EXPECT_EQ(page["data"][2]["type"], "message");
  EXPECT_EQ(page["data"][2]["role"], "user");

  const json wrong = post_json(srv.port, "/v1/conversations",
                               {{"items", {{{"type", 5}, {"role", "user"}, {"content", "hi"}}}}}, 400);
  EXPECT_EQ(wrong["error"]["param"], "items[0].type") << wrong.dump();
}

// A chat field that is there but of the wrong type is "Invalid type ... expected a string, but got a number" (code
// invalid_type), as every other field's: a content part's type or text, a tool's function or its name, a tool call's
// function or its name and response_format's type were answered "Missing required parameter" (a client that sent the
// field was told it had not).
TEST(HostileInput, AChatFieldOfTheWrongTypeIsNotCalledMissing) {
  lilac::test::LocalServer srv(lilac::test::LocalServer::options());
  const json user = {{"role", "user"}, {"content", "hi"}};
  const json tool = {{"type", "function"}, {"function", {{"name", "f"}}}};
  const json call = {{"id", "c1"}, {"type", "function"}, {"function", {{"name", "f"}, {"arguments", "{}"}}}};
  auto with = [](json v, const json::json_pointer& at, json x) {
    v[at] = std::move(x);
    return v;
  };
  struct Case {
    json body;
    std::string param, got;
  };
  const std::vector<Case> cases = {
      {{{"messages", {{{"role", "user"}, {"content", {{{"type", 5}, {"text", "a"}}}}}}}},
       "messages[0].content[0].type", "a number"},
      {{{"messages", {{{"role", "user"}, {"content", {{{"type", "text"}, {"text", {"a"}}}}}}}}},
       "messages[0].content[0].text", "an array"},
      {{{"messages", {user}}, {"tools", {with(tool, "/function"_json_pointer, "f")}}}, "tools[0].function", "a string"},
      {{{"messages", {user}}, {"tools", {with(tool, "/function/name"_json_pointer, 7)}}}, "tools[0].function.name",
       "a number"},
      {{{"messages", {{{"role", "assistant"}, {"tool_calls", {with(call, "/function"_json_pointer, true)}}}, user}}},
       "messages[0].tool_calls[0].function", "a boolean"},
      {{{"messages", {{{"role", "assistant"}, {"tool_calls", {with(call, "/function/name"_json_pointer, 1)}}}, user}}},
       "messages[0].tool_calls[0].function.name", "a number"},
      {{{"messages", {user}}, {"response_format", {{"type", 1}}}}, "response_format.type", "a number"},
  };
  for (const Case& c : cases) {
    const json e = post_json(srv.port, "/v1/chat/completions", c.body, 400);
    EXPECT_EQ(e["error"]["param"], c.param) << e.dump();
    EXPECT_EQ(e["error"]["code"], "invalid_type") << e.dump();
    EXPECT_NE(e["error"]["message"].get<std::string>().find("but got " + c.got), std::string::npos) << e.dump();
  }
  // Absent is still missing.
  const json e = post_json(srv.port, "/v1/chat/completions",
                           {{"messages", {{{"role", "user"}, {"content", {{{"text", "a"}}}}}}}}, 400);
  EXPECT_EQ(e["error"]["param"], "messages[0].content[0].type") << e.dump();
  EXPECT_EQ(e["error"]["code"], "missing_required_parameter") << e.dump();
}

// A Responses reasoning item's content or summary element that is not an object was answered "Missing required
// parameter: 'input[0].summary[0].text'" (the element was read as an object that lacked its text): it is "Invalid
// type for 'input[0].summary[0]': expected an object, but got a number" (invalid_type), as a message's content part
// is. The same translation checks a conversation's items. A text of the wrong type was already invalid_type; an
// object without its text is still missing.
TEST(HostileInput, AReasoningItemsElementOfTheWrongTypeIsNotCalledMissing) {
  lilac::test::LocalServer srv(lilac::test::LocalServer::options());
  const json user = {{"role", "user"}, {"content", "hi"}};
  auto reasoning = [](const char* key, json elem) {
    return json{{"type", "reasoning"}, {key, json::array({std::move(elem)})}};
  };
  struct Case {
    json item;
    std::string param, want, got, code;
  };
  const std::vector<Case> cases = {
      {reasoning("summary", 5), "[0].summary[0]", "an object", "a number", "invalid_type"},
      {reasoning("summary", "why"), "[0].summary[0]", "an object", "a string", "invalid_type"},
      {reasoning("content", json::array({"a"})), "[0].content[0]", "an object", "an array", "invalid_type"},
      {reasoning("content", nullptr), "[0].content[0]", "an object", "null", "invalid_type"},
      {reasoning("summary", {{"type", "summary_text"}, {"text", 3}}), "[0].summary[0].text", "a string", "a number",
       "invalid_type"},
      {reasoning("summary", {{"type", "summary_text"}}), "[0].summary[0].text", "", "", "missing_required_parameter"},
  };
  for (const Case& c : cases) {
    for (const char* route : {"/v1/responses", "/v1/conversations"}) {
      const bool conv = std::string(route) == "/v1/conversations";
      const json body = conv ? json{{"items", {c.item, user}}} : json{{"input", {c.item, user}}};
      const std::string param = (conv ? "items" : "input") + c.param;
      const json e = post_json(srv.port, route, body, 400);
      EXPECT_EQ(e["error"]["param"], param) << e.dump();
      EXPECT_EQ(e["error"]["code"], c.code) << e.dump();
      const std::string msg = e["error"]["message"].is_string() ? e["error"]["message"].get<std::string>() : "";
      if (c.code == "invalid_type")
        EXPECT_EQ(msg, "Invalid type for '" + param + "': expected " + c.want + ", but got " + c.got + ".");
      else
        EXPECT_EQ(msg, "Missing required parameter: '" + param + "'.");
    }
  }
}

// The Anthropic Messages translation reads every block and field through an object check first: a field of the wrong
// type is "Invalid type ..." in Anthropic's error shape there already (this guards it; it passed before and after the
// Responses fix above), and an absent one is still "Missing required parameter".
TEST(HostileInput, AnAnthropicFieldOfTheWrongTypeIsNotCalledMissing) {
  lilac::test::LocalServer srv(lilac::test::LocalServer::options());
  const json user = {{"role", "user"}, {"content", "hi"}};
  const json tool = {{"name", "f"}, {"input_schema", {{"type", "object"}}}};
  // (Arrays of one element as json::array / std::vector: a braced list of one json is that json under clang, an array
  // of it under gcc.)
  auto body = [](std::vector<json> msgs, json extra = json::object()) {
    extra["max_tokens"] = 5;
    extra["messages"] = std::move(msgs);
    return extra;
  };
  auto blocks = [](const char* role, json block) {
    return json{{"role", role}, {"content", json::array({std::move(block)})}};
  };
  struct Case {
    json body;
    std::string message;
  };
  const std::vector<Case> cases = {
      {body({blocks("user", 5)}),
       "Invalid type for 'messages[0].content[0]': expected an object (a content block), but got a number."},
      {body({blocks("user", {{"type", "text"}, {"text", 5}})}),
       "Invalid type for 'messages[0].content[0].text': expected a string, but got a number."},
      {body({blocks("user", {{"type", "tool_result"}, {"tool_use_id", "t"}, {"content", json::array({"x"})}})}),
       "Invalid type for 'messages[0].content[0].content[0]': expected an object (a content block), but got a string."},
      {body({blocks("assistant", {{"type", "tool_use"}, {"id", "t"}, {"name", 5}}), user}),
       "Invalid type for 'messages[0].content[0].name': expected a string, but got a number."},
      {body({user}, {{"system", json::array({{{"type", "text"}, {"text", true}}})}}),
       "Invalid type for 'system[0].text': expected a string, but got a boolean."},
      {body({user}, {{"tools", json::array({{{"name", "f"}, {"input_schema", "x"}}})}}),
       "Invalid type for 'tools[0].input_schema': expected an object (a JSON schema), but got a string."},
      {body({user}, {{"tools", json::array({tool})}, {"tool_choice", {{"type", 1}}}}),
       "Invalid type for 'tool_choice.type': expected a string, but got a number."},
      {body({user}, {{"thinking", {{"type", "enabled"}, {"budget_tokens", "9"}}}}),
       "Invalid type for 'thinking.budget_tokens': expected an integer, but got a string."},
      {body({blocks("user", {{"type", "text"}})}), "Missing required parameter: 'messages[0].content[0].text'."},
  };
  for (const Case& c : cases) {
    for (const char* route : {"/v1/messages", "/v1/messages/count_tokens"}) {
      const json e = post_json(srv.port, route, c.body, 400);
      EXPECT_EQ(e["type"], "error") << e.dump();
      EXPECT_EQ(e["error"]["type"], "invalid_request_error") << e.dump();
      EXPECT_EQ(e["error"]["message"], c.message) << route;
    }
  }
}

// A stop string over kMaxStopBytes (4,096), or stops over 16,384 bytes in all, is a 400 naming the field, in each
// protocol's shape: the detokenizer compares its held-back text with every stop's prefixes at each token, and 16 stops
// of 400 KB were accepted (a worker's seconds per answer once the model repeats a stop's start). Stops of exactly the
// limits still generate.
TEST(HostileInput, AStopSequenceOverTheLimitIsA400) {
  lilac::test::LocalServer srv(lilac::test::LocalServer::options());
  const json user = {{"role", "user"}, {"content", "hi"}};
  const std::string at(4096, 'a'), over(4097, 'a');
  for (const json& stop : {json(over), json::array({"x", over})}) {
    const json e =
        post_json(srv.port, "/v1/chat/completions", {{"messages", {user}}, {"max_tokens", 3}, {"stop", stop}}, 400);
    EXPECT_EQ(e["error"]["param"], "stop") << e.dump();
    EXPECT_EQ(e["error"]["message"], "A stop sequence may be at most 4096 bytes long.") << e.dump();
  }
  const json c = post_json(srv.port, "/v1/completions", {{"prompt", "hi"}, {"max_tokens", 3}, {"stop", over}}, 400);
  EXPECT_EQ(c["error"]["param"], "stop") << c.dump();
  const json a = post_json(srv.port, "/v1/messages",
                           {{"messages", {user}}, {"max_tokens", 3}, {"stop_sequences", {"x", over}}}, 400);
  EXPECT_EQ(a["type"], "error") << a.dump();
  EXPECT_EQ(a["error"]["type"], "invalid_request_error") << a.dump();
  EXPECT_EQ(a["error"]["message"], "stop_sequences: A stop sequence may be at most 4096 bytes long.") << a.dump();
  // all of them together at most 16,384 bytes: 64 Anthropic stops of 4,096 bytes were still ~4,000 times the work
  const json four = json::array({at, at, at, at}), five = json::array({at, at, at, at, "x"});
  const json t =
      post_json(srv.port, "/v1/chat/completions", {{"messages", {user}}, {"max_tokens", 3}, {"stop", five}}, 400);
  EXPECT_EQ(t["error"]["message"], "The stop sequences may be at most 16384 bytes in all.") << t.dump();
  const json ta =
      post_json(srv.port, "/v1/messages", {{"messages", {user}}, {"max_tokens", 3}, {"stop_sequences", five}}, 400);
  EXPECT_EQ(ta["error"]["message"], "stop_sequences: The stop sequences may be at most 16384 bytes in all.")
      << ta.dump();
  post_json(srv.port, "/v1/chat/completions", {{"messages", {user}}, {"max_tokens", 3}, {"stop", four}});
  const json ok = post_json(srv.port, "/v1/chat/completions", {{"messages", {user}}, {"max_tokens", 3}, {"stop", at}});
  EXPECT_EQ(ok["object"], "chat.completion") << ok.dump();
  const json ok2 =
      post_json(srv.port, "/v1/messages", {{"messages", {user}}, {"max_tokens", 3}, {"stop_sequences", {at}}});
  EXPECT_EQ(ok2["type"], "message") << ok2.dump();
}

// OpenAI's metadata (Responses, chat completions): an object of at most 16 pairs, keys of at most 64 characters, values
// strings of at most 512. Both endpoints accepted anything there (a string, numbers, 17 pairs, 100 KB values) without
// a word, where OpenAI answers 400: a 400 naming `metadata` or `metadata.<key>`, in OpenAI's error shape, as the
// Conversations endpoints already answered. Chat's `store` is a boolean. Metadata within the limits (characters are
// code points) is accepted.
TEST(HostileInput, MetadataIsCheckedAsOpenAIChecksIt) {
  lilac::test::LocalServer srv(lilac::test::LocalServer::options());
  const json user = {{"role", "user"}, {"content", "hi"}};
  json seventeen = json::object();
  for (int i = 0; i < 17; ++i) seventeen["k" + std::to_string(i)] = "v";
  struct Case {
    json metadata;
    std::string param, code;
  };
  const std::vector<Case> cases = {
      {"tag", "metadata", "invalid_type"},
      {json::array({"a", "b"}), "metadata", "invalid_type"},
      {{{"n", 5}}, "metadata.n", "invalid_type"},
      {{{"ok", "x"}, {"nested", {{"a", "b"}}}}, "metadata.nested", "invalid_type"},
      {{{"flag", true}}, "metadata.flag", "invalid_type"},
      {{{"long", std::string(513, 'v')}}, "metadata.long", "string_above_max_length"},
      {{{std::string(65, 'k'), "v"}}, "metadata", "invalid_value"},
      {seventeen, "metadata", "invalid_value"},
  };
  auto responses = [](json md) {
    return json{{"input", "hi"}, {"reasoning", {{"effort", "none"}}}, {"metadata", std::move(md)}};
  };
  auto chat = [&](json md) { return json{{"messages", {user}}, {"max_tokens", 3}, {"metadata", std::move(md)}}; };
  for (const Case& c : cases) {
    for (const auto& [path, body] : {std::pair{"/v1/responses", responses(c.metadata)},
                                     std::pair{"/v1/chat/completions", chat(c.metadata)}}) {
      const json e = post_json(srv.port, path, body, 400);
      EXPECT_EQ(e["error"]["type"], "invalid_request_error") << path << ": " << e.dump();
      EXPECT_EQ(e["error"]["param"], c.param) << path << ": " << e.dump();
      EXPECT_EQ(e["error"]["code"], c.code) << path << ": " << e.dump();
    }
  }
  const json e = post_json(srv.port, "/v1/chat/completions", {{"messages", {user}}, {"store", "yes"}}, 400);
  EXPECT_EQ(e["error"]["param"], "store") << e.dump();
  EXPECT_EQ(e["error"]["code"], "invalid_type") << e.dump();

  // At the limits: 16 pairs, a key of 64 characters (two bytes each), a value of 512; null is "not given".
  json full = json::object();
  for (int i = 0; i < 15; ++i) full["k" + std::to_string(i)] = "v";
  std::string key;
  for (int i = 0; i < 64; ++i) key += "\xc3\xa9";
  full[key] = std::string(512, 'v');
  for (const json& md : {full, json(nullptr), json::object()}) {
    const json r = post_json(srv.port, "/v1/responses", responses(md));
    EXPECT_EQ(r["status"], "completed") << r.dump().substr(0, 300);
    json body = chat(md);
    body["store"] = true;
    const json c = post_json(srv.port, "/v1/chat/completions", body);
    EXPECT_EQ(c["object"], "chat.completion") << c.dump().substr(0, 300);
  }
}

// A forced call (tool_choice "required", Anthropic's "any") constrains every tool, and a tool that is not strict gets free
// arguments when its schema cannot be enforced. One whose schema passed the work bound (a pattern of a class of 5,000
// code points repeated 40 times) spent the request's whole budget, and the request was a 400 naming `tools`: it is
// answered, the call's arguments free. The same tool strict is still the 400 of its parameters.
TEST(HostileInput, AForcedCallOfALooseToolPastTheWorkBoundIsAnswered) {
  const std::string call = "<function=h>\n<parameter=y>\nv\n</parameter>\n</function>\n</tool_call>";
  const json script = {{"rules", {{{"match", "forced"}, {"reply", call}}}}, {"default", {{"reply", "</think>\n\nok"}}}};
  lilac::test::LocalServer srv(lilac::test::LocalServer::options(), nullptr, script);
  std::string cls = "[";
  for (uint32_t i = 0; i < 5000; ++i) {  // U+0100, U+0102, ...: two- and three-byte UTF-8
    const uint32_t c = 0x100 + 2 * i;
    if (c < 0x800) {
      cls += char(0xC0 | (c >> 6));
    } else {
      cls += char(0xE0 | (c >> 12));
      cls += char(0x80 | ((c >> 6) & 0x3F));
    }
    cls += char(0x80 | (c & 0x3F));
  }
  const json hostile = {{"type", "object"},
                        {"properties", {{"x", {{"type", "string"}, {"pattern", cls + "]{40}"}}}}},
                        {"required", {"x"}}};
  const json counted = json::parse(R"({"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]})");
  const json user = {{"role", "user"}, {"content", "forced call please"}};
  json chat = {{"messages", {user}},
               {"max_tokens", 100},
               {"tool_choice", "required"},
               {"tools",
                {{{"type", "function"}, {"function", {{"name", "h"}, {"parameters", hostile}}}},
                 {{"type", "function"}, {"function", {{"name", "ok"}, {"strict", true}, {"parameters", counted}}}}}}};
  const json c = post_json(srv.port, "/v1/chat/completions", chat);
  EXPECT_EQ(c["choices"][0]["finish_reason"], "tool_calls") << c.dump().substr(0, 400);
  EXPECT_EQ(c["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "h") << c.dump().substr(0, 400);
  EXPECT_EQ(c["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], R"({"y":"v"})")
      << c.dump().substr(0, 400);
  const json m = post_json(srv.port, "/v1/messages",
                           {{"max_tokens", 100},
                            {"messages", {user}},
                            {"tool_choice", {{"type", "any"}}},
                            {"tools", {{{"name", "h"}, {"input_schema", hostile}}, {{"name", "ok"}, {"input_schema", counted}}}}});
  EXPECT_EQ(m["stop_reason"], "tool_use") << m.dump().substr(0, 400);
  EXPECT_EQ(m["content"][0]["name"], "h") << m.dump().substr(0, 400);
  // Strict, its schema is the request's error.
  chat["tools"][0]["function"]["strict"] = true;
  const json e = post_json(srv.port, "/v1/chat/completions", chat, 400);
  EXPECT_EQ(e["error"]["param"], "tools[0].function.parameters") << e.dump().substr(0, 400);
  EXPECT_EQ(e["error"]["code"], "invalid_schema") << e.dump().substr(0, 400);
}

// Responses fields OpenAI types that lilac read no further than their presence: parallel_tool_calls (a boolean), user (a
// string), include (an array of strings) took any JSON value. They are type-checked as everywhere else, and
// parallel_tool_calls is kept as chat completions keeps it (false: at most one call where calls are constrained) and
// echoed: the response said "parallel_tool_calls": true whatever was sent.
TEST(HostileInput, ResponsesParallelToolCallsUserAndIncludeAreTyped) {
  const std::string call = "<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>";
  const json script = {{"rules", {{{"match", "a call"}, {"reply", call}}}}, {"default", {{"reply", "</think>\n\nok"}}}};
  lilac::test::LocalServer srv(lilac::test::LocalServer::options(), nullptr, script);
  auto body = [](json extra) {
    extra["input"] = "hi";
    extra["reasoning"] = {{"effort", "none"}};
    return extra;
  };
  struct Case {
    json extra;
    std::string param;
  };
  const std::vector<Case> cases = {
      {{{"parallel_tool_calls", "no"}}, "parallel_tool_calls"},
      {{{"parallel_tool_calls", 0}}, "parallel_tool_calls"},
      {{{"user", 5}}, "user"},
      {{{"include", "reasoning.encrypted_content"}}, "include"},
      {{{"include", {"message.output_text.logprobs", 5}}}, "include[1]"},
  };
  for (const Case& c : cases) {
    const json e = post_json(srv.port, "/v1/responses", body(c.extra), 400);
    EXPECT_EQ(e["error"]["type"], "invalid_request_error") << e.dump();
    EXPECT_EQ(e["error"]["param"], c.param) << e.dump();
    EXPECT_EQ(e["error"]["code"], "invalid_type") << e.dump();
  }
  const json ok = post_json(srv.port, "/v1/responses",
                            body({{"user", "u1"}, {"include", {"reasoning.encrypted_content"}}, {"parallel_tool_calls", nullptr}}));
  EXPECT_EQ(ok["status"], "completed") << ok.dump();
  EXPECT_EQ(ok["parallel_tool_calls"], true) << ok.dump();
  const json tools = json::array({{{"type", "function"}, {"name", "f"},
                                   {"parameters", {{"type", "object"}, {"properties", {{"a", {{"type", "integer"}}}}}}}}});
  for (const bool parallel : {true, false}) {
    const json r = post_json(srv.port, "/v1/responses",
                             {{"input", "a call please"}, {"tools", tools}, {"tool_choice", "required"},
                              {"parallel_tool_calls", parallel}});
    EXPECT_EQ(r["parallel_tool_calls"], parallel) << r.dump();
    ASSERT_EQ(r["output"].size(), 1u) << r.dump();
    EXPECT_EQ(r["output"][0]["type"], "function_call") << r.dump();
  }
}

// A tool's parameters as the chat template and the output parser read them: `properties` an object of schemas, `required`
// an array of strings. Chat completions refused anything else (invalid_function_parameters); Responses' `parameters` and
// Anthropic's `input_schema` took it (a tool that is not strict and not forced is never compiled), so the same tool was
// a 400 on one endpoint and rendered into the prompt as it came on the others. Each is the same 400 now.
TEST(HostileInput, AToolsParametersAreCheckedOnEveryEndpoint) {
  lilac::test::LocalServer srv(lilac::test::LocalServer::options());
  const json user = {{"role", "user"}, {"content", "hi"}};
  const std::vector<json> bad = {
      {{"type", "object"}, {"properties", "x"}},
      {{"type", "object"}, {"properties", {1, 2}}},
      {{"type", "object"}, {"properties", {{"a", 5}}}},
      {{"type", "object"}, {"properties", {{"a", {{"type", "string"}}}}}, {"required", "a"}},
      {{"type", "object"}, {"properties", {{"a", {{"type", "string"}}}}}, {"required", {1}}},
  };
  for (const json& ps : bad) {
    const json c = post_json(srv.port, "/v1/chat/completions",
                             {{"messages", {user}},
                              {"tools", {{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", ps}}}}}}},
                             400);
    EXPECT_EQ(c["error"]["param"], "tools[0].function.parameters") << c.dump();
    EXPECT_EQ(c["error"]["code"], "invalid_function_parameters") << c.dump();
    const json r = post_json(srv.port, "/v1/responses",
                             {{"input", "hi"}, {"tools", {{{"type", "function"}, {"name", "f"}, {"parameters", ps}}}}}, 400);
    EXPECT_EQ(r["error"]["type"], "invalid_request_error") << r.dump();
    EXPECT_EQ(r["error"]["param"], "tools[0].parameters") << r.dump();
    EXPECT_EQ(r["error"]["code"], "invalid_function_parameters") << r.dump();
    const json m = post_json(srv.port, "/v1/messages",
                             {{"max_tokens", 5}, {"messages", {user}}, {"tools", {{{"name", "f"}, {"input_schema", ps}}}}},
                             400);
    EXPECT_EQ(m["type"], "error") << m.dump();
    EXPECT_EQ(m["error"]["type"], "invalid_request_error") << m.dump();
    EXPECT_EQ(m["error"]["message"].get<std::string>().rfind("tools[0].input_schema: ", 0), 0u) << m.dump();
  }
  // Well-formed ones still pass (a property may be a boolean schema; no properties at all is fine).
  const json good = {{"type", "object"}, {"properties", {{"a", {{"type", "string"}}}, {"b", true}}}, {"required", {"a"}}};
  for (const json& ps : {good, json{{"type", "object"}}}) {
    post_json(srv.port, "/v1/responses", {{"input", "hi"}, {"tools", {{{"type", "function"}, {"name", "f"}, {"parameters", ps}}}}});
    post_json(srv.port, "/v1/messages",
              {{"max_tokens", 5}, {"messages", {user}}, {"tools", {{{"name", "f"}, {"input_schema", ps}}}}});
  }
}

// Anthropic's metadata is {"user_id": a string of at most 256 characters, or null}, and its API refuses other keys. lilac
// checked only that metadata is an object: a user_id of any type or length, and any other key, were accepted.
TEST(HostileInput, AnthropicMetadataIsAUserIdOnly) {
  lilac::test::LocalServer srv(lilac::test::LocalServer::options());
  const json user = {{"role", "user"}, {"content", "hi"}};
  struct Case {
    json metadata;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{{"user_id", 5}}, "Invalid type for 'metadata.user_id': expected a string, but got a number."},
      {{{"user_id", {{"id", "u"}}}}, "Invalid type for 'metadata.user_id': expected a string, but got an object."},
      {{{"user_id", std::string(257, 'u')}}, "Invalid 'metadata.user_id': at most 256 characters."},
      {{{"user_id", "u"}, {"session", "s"}}, "metadata.session: Extra inputs are not permitted."},
      {"u", "Invalid type for 'metadata': expected an object, but got a string."},
  };
  for (const Case& c : cases) {
    for (const char* route : {"/v1/messages", "/v1/messages/count_tokens"}) {
      const json e = post_json(srv.port, route, {{"max_tokens", 5}, {"messages", {user}}, {"metadata", c.metadata}}, 400);
      EXPECT_EQ(e["type"], "error") << e.dump();
      EXPECT_EQ(e["error"]["type"], "invalid_request_error") << e.dump();
      EXPECT_EQ(e["error"]["message"], c.message) << route;
    }
  }
  std::string id;
  for (int i = 0; i < 256; ++i) id += "\xc3\xa9";  // 256 characters
  for (const json& md : {json{{"user_id", id}}, json{{"user_id", nullptr}}, json::object()}) {
    const json m = post_json(srv.port, "/v1/messages", {{"max_tokens", 5}, {"messages", {user}}, {"metadata", md}});
    EXPECT_EQ(m["type"], "message") << m.dump().substr(0, 300);
  }
}

// Anthropic's tools have no "strict": a forced call (tool_choice any / tool) constrains the input to its input_schema
// where lilac can enforce it, and a schema it cannot (a keyword outside the subset) leaves the input free, as for any
// tool that is not strict; README said such a schema was a 400. Pinned here: the call is answered, its input free.
TEST(HostileInput, AnAnthropicForcedCallOfASchemaOutsideTheSubsetIsFree) {
  // (a call forced by name: the prompt has opened it, "<function=f>\n" included)
  const std::string args = "<parameter=b>\nfree\n</parameter>\n</function>\n</tool_call>";
  const json script = {{"rules", {{{"match", "named"}, {"reply", args}}, {{"match", "any"}, {"reply", "<function=f>\n" + args}}}},
                       {"default", {{"reply", "ok"}}}};
  lilac::test::LocalServer srv(lilac::test::LocalServer::options(), nullptr, script);
  const json schema = {{"type", "object"}, {"properties", {{"a", {{"type", "string"}, {"not", json::object()}}}}}};
  for (const json& choice : {json{{"type", "any"}}, json{{"type", "tool"}, {"name", "f"}}}) {
    const json m = post_json(srv.port, "/v1/messages",
                             {{"max_tokens", 50},
                              {"messages", {{{"role", "user"}, {"content", choice["type"] == "any" ? "any" : "named"}}}},
                              {"tool_choice", choice},
                              {"tools", {{{"name", "f"}, {"input_schema", schema}}}}});
    EXPECT_EQ(m["stop_reason"], "tool_use") << m.dump();
    EXPECT_EQ(m["content"][0]["input"], json({{"b", "free"}})) << m.dump();
  }
}

// A Responses request's metadata is the response's (OpenAI's response object carries it; retrieved, it is there too):
// the response said "metadata": {} whatever was sent.
TEST(HostileInput, ResponsesEchoTheirMetadata) {
  lilac::test::LocalServer srv(lilac::test::LocalServer::options());
  const json md = {{"topic", "demo"}, {"run", "7"}};
  const json r = post_json(srv.port, "/v1/responses", {{"input", "hi"}, {"reasoning", {{"effort", "none"}}}, {"metadata", md}});
  EXPECT_EQ(r["metadata"], md) << r.dump();
  ASSERT_TRUE(r["id"].is_string()) << r.dump();
  const json stored = get_json(srv.port, "/v1/responses/" + r["id"].get<std::string>());
  EXPECT_EQ(stored["metadata"], md) << stored.dump();
  httplib::Client cli("127.0.0.1", srv.port);
  const json body = {{"input", "hi"}, {"reasoning", {{"effort", "none"}}}, {"metadata", md}, {"stream", true}};
  auto s = cli.Post("/v1/responses", body.dump(), "application/json");
  ASSERT_TRUE(s);
  int seen = 0;
  for (const json& e : lilac::test::sse_events(s->body))
    if (e.value("type", "") == "response.created" || e.value("type", "") == "response.completed") {
      EXPECT_EQ(e["response"]["metadata"], md) << e.dump();
      ++seen;
    }
  EXPECT_EQ(seen, 2) << s->body;
  // None given: {} as before.
  EXPECT_EQ(post_json(srv.port, "/v1/responses", {{"input", "hi"}})["metadata"], json::object());
}

// An input item's id (a Responses input, a conversation's items) is a string: one of another type was ignored in an input
// and, stored in a conversation, silently replaced by a new id. It is a 400 naming it; null is "not given".
TEST(HostileInput, AnItemIdIsAString) {
  lilac::test::LocalServer srv(lilac::test::LocalServer::options());
  for (const json& id : {json(5), json::array({"msg_1"}), json{{"id", "msg_1"}}}) {
    const json item = {{"type", "message"}, {"role", "user"}, {"content", "hi"}, {"id", id}};
    const json r = post_json(srv.port, "/v1/responses", {{"input", {item}}}, 400);
    EXPECT_EQ(r["error"]["param"], "input[0].id") << r.dump();
    EXPECT_EQ(r["error"]["code"], "invalid_type") << r.dump();
    const json c = post_json(srv.port, "/v1/conversations", {{"items", {item}}}, 400);
    EXPECT_EQ(c["error"]["param"], "items[0].id") << c.dump();
    EXPECT_EQ(c["error"]["code"], "invalid_type") << c.dump();
  }
  for (const json& id : {json("msg_1"), json(nullptr)}) {
    const json item = {{"type", "message"}, {"role", "user"}, {"content", "hi"}, {"id", id}};
    EXPECT_EQ(post_json(srv.port, "/v1/responses", {{"input", {item}}})["status"], "completed");
    const json c = post_json(srv.port, "/v1/conversations", {{"items", {item}}});
    EXPECT_TRUE(c["id"].is_string()) << c.dump();
  }
}

// A response grammar past its total-states bound (SchemaLimits::max_states, 400,000) is refused as a whole, after every
// schema in it compiled within its own bounds, and so is one whose root matches nothing. Those errors named no field,
// and the server filled in the content schema's (response_format.json_schema.schema, text.format.schema) even for a
// request with tools only (on Anthropic's Messages, a field its API does not have). They name the field that holds the
// schema: `tools` for the tools' calls together, a tool's parameters when they alone are past the bound or match
// nothing (tests/grammar: SchemaHostile.AWholeGrammarsErrorNamesItsField for the content schema and the mixes).
TEST(HostileInput, AGrammarPastItsStatesBoundNamesTheFieldThatHoldsTheSchemas) {
  lilac::test::LocalServer srv(lilac::test::LocalServer::options());
  // Parameters of one array of strings of a pattern of 45,000 letters: 45,000 states of one rule (under the 50,000 of
  // one automaton); ten such patterns of different letters (a rule of the same pattern is shared) pass 400,000.
  auto params = [](char letter) {
    const json items = {{"type", "string"}, {"pattern", "^(" + std::string(1, letter) + "{900}){50}$"}};
    return json{{"type", "object"},
                {"properties", {{"x", {{"type", "array"}, {"items", items}}}}},
                {"required", {"x"}},
                {"additionalProperties", false}};
  };
  json chat_tools = json::array(), responses_tools = json::array();
  for (int i = 0; i < 10; ++i) {
    const std::string name = "f" + std::to_string(i);
    const json ps = params(char('a' + i));
    chat_tools.push_back({{"type", "function"}, {"function", {{"name", name}, {"strict", true}, {"parameters", ps}}}});
    responses_tools.push_back({{"type", "function"}, {"name", name}, {"strict", true}, {"parameters", ps}});
  }
  const json user = {{"role", "user"}, {"content", "hi"}};
  const json c = post_json(srv.port, "/v1/chat/completions", {{"messages", {user}}, {"tools", chat_tools}}, 400);
  EXPECT_EQ(c["error"]["param"], "tools") << c.dump();
  EXPECT_EQ(c["error"]["code"], "invalid_schema") << c.dump();
  EXPECT_EQ(c["error"]["message"], "Invalid schema for 'tools': schema too large: grammar exceeds 400000 states at #")
      << c.dump();
  const json r = post_json(srv.port, "/v1/responses", {{"input", "hi"}, {"tools", responses_tools}}, 400);
  EXPECT_EQ(r["error"]["param"], "tools") << r.dump();
  EXPECT_EQ(r["error"]["code"], "invalid_schema") << r.dump();
  // (Anthropic's tools are never strict: a forced call of them past the bound is answered,
  // AForcedCallOfToolsNotStrictPastTheStatesBoundIsAnswered.)
  // A forced call whose only tool's parameters match nothing (a pattern of one character, at least three): the tool's.
  const json never = {{"type", "object"},
                      {"properties", {{"x", {{"type", "string"}, {"pattern", "^a$"}, {"minLength", 3}}}}},
                      {"required", {"x"}},
                      {"additionalProperties", false}};
  const json n = post_json(srv.port, "/v1/chat/completions",
                           {{"messages", {user}},
                            {"tool_choice", "required"},
                            {"tools", {{{"type", "function"}, {"function", {{"name", "f"}, {"strict", true}, {"parameters", never}}}}}}},
                           400);
  EXPECT_EQ(n["error"]["param"], "tools[0].function.parameters") << n.dump();
}

// A forced call (tool_choice required / named; Responses' the same; Anthropic's any / tool) constrains a tool that is
// not strict too, and its schema falls back to free arguments when it cannot be enforced, as it is free when not forced
// (such a tool promises no conformance on any of the three APIs). Past the grammar's total-states bound
// (SchemaLimits::max_states, 400,000) it did not: a tool whose parameters hold 405,000 states (nine properties, each
// within its own bounds) was a 400 naming it on all three protocols, the same tool not forced answered. It is answered,
// its arguments free; strict, it is still the request's 400 naming it (tests/grammar:
// SchemaHostile.ANonStrictToolPastTheStatesBoundFallsBack for the tools together and a call that matches nothing).
TEST(HostileInput, AForcedCallOfToolsNotStrictPastTheStatesBoundIsAnswered) {
  const std::string args = "<parameter=y>\nv\n</parameter>\n</function>\n</tool_call>";
  const json script = {{"rules", {{{"match", "named"}, {"reply", args}}, {{"match", "any"}, {"reply", "<function=h>\n" + args}}}},
                       {"default", {{"reply", "</think>\n\nok"}}}};
  lilac::test::LocalServer srv(lilac::test::LocalServer::options(), nullptr, script);
  // Nine arrays of strings of a pattern of 45,000 letters (different letters: no rule shared): 45,000 states each.
  json big = {{"type", "object"}, {"properties", json::object()}, {"required", json::array()}};
  for (char c = 'a'; c < 'a' + 9; ++c) {
    const std::string k(1, c);
    big["properties"][k] = {{"type", "array"}, {"items", {{"type", "string"}, {"pattern", "^(" + k + "{900}){50}$"}}}};
    big["required"].push_back(k);
  }
  const json small = json::parse(R"({"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]})");
  auto user = [](const char* text) { return json::array({{{"role", "user"}, {"content", text}}}); };
  const json chat_tools = {{{"type", "function"}, {"function", {{"name", "h"}, {"parameters", big}}}},
                           {{"type", "function"}, {"function", {{"name", "ok"}, {"strict", true}, {"parameters", small}}}}};
  for (const json& choice : {json("required"), json{{"type", "function"}, {"function", {{"name", "h"}}}}}) {
    const json c = post_json(srv.port, "/v1/chat/completions",
                             {{"messages", user(choice.is_string() ? "any" : "named")},
                              {"max_tokens", 50},
                              {"tool_choice", choice},
                              {"tools", chat_tools}});
    EXPECT_EQ(c["choices"][0]["finish_reason"], "tool_calls") << c.dump().substr(0, 400);
    EXPECT_EQ(c["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "h") << c.dump().substr(0, 400);
    EXPECT_EQ(c["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], R"({"y":"v"})")
        << c.dump().substr(0, 400);
  }
  const json responses_tools = {{{"type", "function"}, {"name", "h"}, {"parameters", big}},
                                {{"type", "function"}, {"name", "ok"}, {"strict", true}, {"parameters", small}}};
  for (const json& choice : {json("required"), json{{"type", "function"}, {"name", "h"}}}) {
    const json r = post_json(srv.port, "/v1/responses",
                             {{"input", choice.is_string() ? "any" : "named"},
                              {"max_output_tokens", 50},
                              {"tool_choice", choice},
                              {"tools", responses_tools}});
    ASSERT_TRUE(r["output"].is_array() && !r["output"].empty()) << r.dump().substr(0, 400);
    const json& call = r["output"].back();
    EXPECT_EQ(call["type"], "function_call") << r.dump().substr(0, 400);
    EXPECT_EQ(call["name"], "h") << r.dump().substr(0, 400);
    EXPECT_EQ(call["arguments"], R"({"y":"v"})") << r.dump().substr(0, 400);
  }
  const json anthropic_tools = {{{"name", "h"}, {"input_schema", big}}, {{"name", "ok"}, {"input_schema", small}}};
  for (const json& choice : {json{{"type", "any"}}, json{{"type", "tool"}, {"name", "h"}}}) {
    const json m = post_json(srv.port, "/v1/messages",
                             {{"max_tokens", 50},
                              {"messages", user(choice["type"] == "any" ? "any" : "named")},
                              {"tool_choice", choice},
                              {"tools", anthropic_tools}});
    EXPECT_EQ(m["stop_reason"], "tool_use") << m.dump().substr(0, 400);
    EXPECT_EQ(m["content"].back()["name"], "h") << m.dump().substr(0, 400);
    EXPECT_EQ(m["content"].back()["input"], json({{"y", "v"}})) << m.dump().substr(0, 400);
  }
  // Strict, the tool is the request's error, naming it.
  json strict_chat = chat_tools;
  strict_chat[0]["function"]["strict"] = true;
  const json e = post_json(srv.port, "/v1/chat/completions",
                           {{"messages", user("any")}, {"tool_choice", "required"}, {"tools", strict_chat}}, 400);
  EXPECT_EQ(e["error"]["param"], "tools[0].function.parameters") << e.dump().substr(0, 400);
  EXPECT_EQ(e["error"]["code"], "invalid_schema") << e.dump().substr(0, 400);
  json strict_responses = responses_tools;
  strict_responses[0]["strict"] = true;
  const json re = post_json(srv.port, "/v1/responses",
                            {{"input", "any"}, {"tool_choice", "required"}, {"tools", strict_responses}}, 400);
  EXPECT_EQ(re["error"]["param"], "tools[0].parameters") << re.dump().substr(0, 400);
}


// A forced call by `required` / "any" of tools that are not strict, one of them with parameters that can never be
// satisfied (a required parameter of one character and at least three) beside one whose call can be written: that tool
// was silently left out of the grammar's choice, so a model calling it broke the constraint (here the scripted backend's
// token-mask error), though such a tool promises no conformance. It is offered with free arguments, on chat, Responses
// and Messages (tests/grammar: SchemaHostile.ANonStrictToolThatMatchesNothingIsFreeBesideOthers).
TEST(HostileInput, AForcedChoiceOffersANonStrictToolThatMatchesNothing) {
  const json script = {{"rules", {{{"match", "any"},
                                   {"reply", "<function=never>\n<parameter=y>\nv\n</parameter>\n</function>\n</tool_call>"}}}},
                       {"default", {{"reply", "</think>\n\nok"}}}};
  lilac::test::LocalServer srv(lilac::test::LocalServer::options(), nullptr, script);
  const json never = {{"type", "object"},
                      {"properties", {{"x", {{"type", "string"}, {"pattern", "^a$"}, {"minLength", 3}}}}},
                      {"required", {"x"}}};
  const json small = json::parse(R"({"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]})");
  const json user = json::array({{{"role", "user"}, {"content", "any"}}});
  const json c = post_json(srv.port, "/v1/chat/completions",
                           {{"messages", user},
                            {"max_tokens", 50},
                            {"tool_choice", "required"},
                            {"tools",
                             {{{"type", "function"}, {"function", {{"name", "ok"}, {"parameters", small}}}},
                              {{"type", "function"}, {"function", {{"name", "never"}, {"parameters", never}}}}}}});
  EXPECT_EQ(c["choices"][0]["finish_reason"], "tool_calls") << c.dump().substr(0, 400);
  EXPECT_EQ(c["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "never") << c.dump().substr(0, 400);
  EXPECT_EQ(c["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], R"({"y":"v"})")
      << c.dump().substr(0, 400);
  const json r = post_json(srv.port, "/v1/responses",
                           {{"input", "any"},
                            {"max_output_tokens", 50},
                            {"tool_choice", "required"},
                            {"tools",
                             {{{"type", "function"}, {"name", "ok"}, {"parameters", small}},
                              {{"type", "function"}, {"name", "never"}, {"parameters", never}}}}});
  ASSERT_TRUE(r["output"].is_array() && !r["output"].empty()) << r.dump().substr(0, 400);
  EXPECT_EQ(r["output"].back()["type"], "function_call") << r.dump().substr(0, 400);
  EXPECT_EQ(r["output"].back()["name"], "never") << r.dump().substr(0, 400);
  EXPECT_EQ(r["output"].back()["arguments"], R"({"y":"v"})") << r.dump().substr(0, 400);
  const json m = post_json(srv.port, "/v1/messages",
                           {{"max_tokens", 50},
                            {"messages", user},
                            {"tool_choice", {{"type", "any"}}},
                            {"tools", {{{"name", "ok"}, {"input_schema", small}}, {{"name", "never"}, {"input_schema", never}}}}});
  EXPECT_EQ(m["stop_reason"], "tool_use") << m.dump().substr(0, 400);
  EXPECT_EQ(m["content"].back()["name"], "never") << m.dump().substr(0, 400);
  EXPECT_EQ(m["content"].back()["input"], json({{"y", "v"}})) << m.dump().substr(0, 400);
}

// The same tool strict, beside a tool whose call can be written, was silently left out of the choice too (on chat
// completions and Responses; Anthropic's tools are never strict). `strict: true` promises arguments that conform and
// none can: the request is a 400 invalid_schema naming the tool's parameters, wherever its call is offered (a forced
// choice, auto), as a strict tool whose schema cannot be compiled is (tests/grammar:
// SchemaHostile.AStrictToolThatMatchesNothingIsTheRequestsError).
TEST(HostileInput, AStrictToolThatMatchesNothingIsTheRequestsError) {
  lilac::test::LocalServer srv(lilac::test::LocalServer::options());
  const json never = {{"type", "object"},
                      {"properties", {{"x", {{"type", "string"}, {"pattern", "^a$"}, {"minLength", 3}}}}},
                      {"required", {"x"}}};
  const json small = json::parse(R"({"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]})");
  const json user = json::array({{{"role", "user"}, {"content", "any"}}});
  const json chat_tools = {{{"type", "function"}, {"function", {{"name", "ok"}, {"parameters", small}}}},
                           {{"type", "function"}, {"function", {{"name", "never"}, {"strict", true}, {"parameters", never}}}}};
  for (const char* choice : {"required", "auto"}) {
    const json c = post_json(srv.port, "/v1/chat/completions",
                             {{"messages", user}, {"max_tokens", 50}, {"tool_choice", choice}, {"tools", chat_tools}}, 400);
    ASSERT_TRUE(c.contains("error")) << choice << ": " << c.dump();
    EXPECT_EQ(c["error"]["type"], "invalid_request_error") << choice << ": " << c.dump();
    EXPECT_EQ(c["error"]["param"], "tools[1].function.parameters") << choice << ": " << c.dump();
    EXPECT_EQ(c["error"]["code"], "invalid_schema") << choice << ": " << c.dump();
    EXPECT_EQ(c["error"]["message"],
              "Invalid schema for 'tools[1].function.parameters': the schema can never be satisfied (the string "
              "parameter at #/properties/x matches nothing) at #/properties/x")
        << c.dump();
  }
  const json responses_tools = {{{"type", "function"}, {"name", "ok"}, {"parameters", small}},
                                {{"type", "function"}, {"name", "never"}, {"strict", true}, {"parameters", never}}};
  for (const char* choice : {"required", "auto"}) {
    const json r = post_json(srv.port, "/v1/responses",
                             {{"input", "any"}, {"max_output_tokens", 50}, {"tool_choice", choice}, {"tools", responses_tools}},
                             400);
    ASSERT_TRUE(r.contains("error")) << choice << ": " << r.dump();
    EXPECT_EQ(r["error"]["type"], "invalid_request_error") << choice << ": " << r.dump();
    EXPECT_EQ(r["error"]["param"], "tools[1].parameters") << choice << ": " << r.dump();
    EXPECT_EQ(r["error"]["code"], "invalid_schema") << choice << ": " << r.dump();
  }
}

}  // namespace
