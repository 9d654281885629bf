// Deep nesting the request body's depth limit (64 levels, text/bounded_json.h) cannot see, through the real HTTP
// path: JSON inside a string (a tool call's "arguments") and schemas whose $refs chain through $defs. Each once
// crashed the server (stack overflow on its request thread); each is now a 400 naming the field, and the server
// goes on answering. And a schema too wide to follow (an anyOf of thousands of alike branches): a 500, now a 400.
#include <gtest/gtest.h>
#include <httplib.h>

#include "server_test_util.h"

using nlohmann::json;
using lilac::test::post_json;

namespace {

// A schema of type object whose property x is d0, d_i an object whose property x is d_{i+1}, ...: 6 levels of
// JSON, n levels of nesting for the compiler.
json ref_chain_schema(int n) {
  json defs = json::object();
  for (int i = 0; i < n; ++i)
    defs["d" + std::to_string(i)] = {{"type", "object"},
                                     {"properties", {{"x", {{"$ref", "#/$defs/d" + std::to_string(i + 1)}}}}}};
  defs["d" + std::to_string(n)] = {{"type", "string"}};
  return {{"type", "object"}, {"properties", {{"x", {{"$ref", "#/$defs/d0"}}}}}, {"$defs", defs}};
}

// A JSON object, as text, holding `depth` nested arrays.
std::string deep_object_text(int depth) { return "{\"a\":" + std::string(depth, '[') + std::string(depth, ']') + "}"; }

void expect_still_serving(int port) {
  const json ok = post_json(port, "/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "hi"}}}}});
  EXPECT_EQ(ok["choices"][0]["message"]["content"], "local answer") << ok.dump();
}

// 6,000 $defs chained through "properties" (a 400 KB body): the compiler recursed once per subschema and overflowed
// the 8 MB stack at ~3,000. Chat's response_format and Responses' text.format compile on the request thread.
TEST(HostileDepth, ASchemaWhoseRefsChainDeepIsA400NotACrash) {
  const json script = {{"rules", {{{"match", "chain"}, {"reply", "</think>\n\n{\"x\": {\"x\": {\"x\": \"s\"}}}"}}}},
                       {"default", {{"reply", "</think>\n\nlocal answer"}}}};
  lilac::test::LocalServer srv(lilac::test::LocalServer::options(), nullptr, script);
  const json schema = ref_chain_schema(6000);
  const json chat = post_json(
      srv.port, "/v1/chat/completions",
      {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
       {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", schema}}}}}},
      400);
  EXPECT_EQ(chat["error"]["code"], "invalid_schema") << chat.dump();
  EXPECT_EQ(chat["error"]["param"], "response_format.json_schema.schema") << chat.dump();
  EXPECT_NE(chat["error"]["message"].get<std::string>().find("nested deeper than 256 levels through $ref"),
            std::string::npos)
      << chat.dump();
  const json resp = post_json(
      srv.port, "/v1/responses",
      {{"input", "hi"}, {"text", {{"format", {{"type", "json_schema"}, {"name", "x"}, {"schema", schema}}}}}}, 400);
  EXPECT_EQ(resp["error"]["code"], "invalid_schema") << resp.dump();
  EXPECT_EQ(resp["error"]["param"], "text.format.schema") << resp.dump();
  expect_still_serving(srv.port);

  // A chain within the limit compiles and constrains the answer as before.
  const json fine = post_json(
      srv.port, "/v1/chat/completions",
      {{"messages", {{{"role", "user"}, {"content", "chain"}}}},
       {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", ref_chain_schema(2)}}}}}});
  EXPECT_EQ(fine["choices"][0]["message"]["content"], "{\"x\": {\"x\": {\"x\": \"s\"}}}") << fine.dump();
}

// A tool call's arguments are JSON in a string, so the body's depth limit never saw them. A Responses function_call
// item's were parsed unbounded and copied into the conversation: 300,000 nested arrays (a 600 KB body) crashed the
// server (recursive copy). Chat's assistant tool_calls got a 400 only by luck (the template failed on the
// unparsed string: "Can only get item pairs from a mapping", param "messages"); now both name the field.
TEST(HostileDepth, ToolCallArgumentsNestedTooDeeplyAreA400NotACrash) {
  lilac::test::LocalServer srv(lilac::test::LocalServer::options());
  const std::string deep = deep_object_text(300000);
  const json call = {{"type", "function_call"}, {"call_id", "c1"}, {"name", "f"}, {"arguments", deep}};
  const json output = {{"type", "function_call_output"}, {"call_id", "c1"}, {"output", "ok"}};
  const json resp = post_json(srv.port, "/v1/responses", {{"input", {call, output}}}, 400);
  EXPECT_EQ(resp["error"]["code"], "json_too_deep") << resp.dump().substr(0, 500);
  EXPECT_EQ(resp["error"]["param"], "input[0].arguments") << resp.dump().substr(0, 500);

  // Conversation items are read by the same translator when stored.
  const json conv = post_json(srv.port, "/v1/conversations", {{"items", {call, output}}}, 400);
  EXPECT_EQ(conv["error"]["code"], "json_too_deep") << conv.dump().substr(0, 500);
  EXPECT_EQ(conv["error"]["param"], "items[0].arguments") << conv.dump().substr(0, 500);

  const json chat = post_json(
      srv.port, "/v1/chat/completions",
      {{"messages",
        {{{"role", "user"}, {"content", "hi"}},
         {{"role", "assistant"},
          {"content", nullptr},
          {"tool_calls", {{{"id", "c1"}, {"type", "function"}, {"function", {{"name", "f"}, {"arguments", deep}}}}}}},
         {{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "ok"}}}}},
      400);
  EXPECT_EQ(chat["error"]["code"], "json_too_deep") << chat.dump().substr(0, 500);
  EXPECT_EQ(chat["error"]["param"], "messages[1].tool_calls[0].function.arguments") << chat.dump().substr(0, 500);

  // Arguments within the bounds are read as before; arguments that are not an object are still refused.
  const json ok = post_json(srv.port, "/v1/responses",
                            {{"input", {{{"role", "user"}, {"content", "hi"}},
                                        {{"type", "function_call"}, {"call_id", "c1"}, {"name", "f"},
                                         {"arguments", deep_object_text(10)}},
                                        output}}});
  EXPECT_EQ(ok["status"], "completed") << ok.dump();
  const json not_object = post_json(
      srv.port, "/v1/responses",
      {{"input", {{{"type", "function_call"}, {"call_id", "c1"}, {"name", "f"}, {"arguments", "[1]"}}, output}}}, 400);
  EXPECT_EQ(not_object["error"]["param"], "input[0].arguments") << not_object.dump();
  EXPECT_EQ(not_object["error"]["code"], "invalid_value") << not_object.dump();
  expect_still_serving(srv.port);
}

// An anyOf of 4,200 string branches (a 200 KB schema): every branch is a parse of the answer's first '"', and the
// grammar's bound on parses at once (4,096) threw lilac::Error from the first mask, which the scheduler answers as a
// 500 "internal error". The schema is the client's: a 400 saying it is too ambiguous, streamed or not.
TEST(HostileDepth, ASchemaTooAmbiguousToFollowIsA400NotA500) {
  const json script = {{"rules", {{{"match", "amb"}, {"reply", "</think>\n\n\"aaaa\""}}}},
                       {"default", {{"reply", "</think>\n\nlocal answer"}}}};
  lilac::test::LocalServer srv(lilac::test::LocalServer::options(), nullptr, script);
  auto body = [](int branches, bool stream) {
    json any = json::array();
    for (int i = 0; i < branches; ++i) any.push_back({{"type", "string"}, {"minLength", i % 2000}, {"maxLength", 2000 + i}});
    return json{{"messages", {{{"role", "user"}, {"content", "amb"}}}},
                {"stream", stream},
                {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", {{"anyOf", any}}}}}}}};
  };
  const json e = post_json(srv.port, "/v1/chat/completions", body(4200, false), 400);
  EXPECT_EQ(e["error"]["type"], "invalid_request_error") << e.dump();
  EXPECT_NE(e["error"]["message"].get<std::string>().find("schema too ambiguous"), std::string::npos) << e.dump();
  // Streamed, the error comes before the first event (a 400) or as the stream's error event, as it happens.
  httplib::Client cli("127.0.0.1", srv.port);
  auto r = cli.Post("/v1/chat/completions", body(4200, true).dump(), "application/json");
  ASSERT_TRUE(r);
  json se;
  if (r->status == 400) {
    se = json::parse(r->body, nullptr, false);
  } else {
    EXPECT_EQ(r->status, 200) << r->body;
    for (const json& ev : lilac::test::sse_events(r->body))
      if (ev.is_object() && ev.contains("error")) se = ev;
  }
  ASSERT_TRUE(se.is_object()) << r->body;
  EXPECT_EQ(se["error"]["type"], "invalid_request_error") << r->body;
  EXPECT_NE(se["error"]["message"].get<std::string>().find("schema too ambiguous"), std::string::npos) << r->body;
  // 100 such branches are followed as before.
  const json ok = post_json(srv.port, "/v1/chat/completions", body(100, false));
  EXPECT_EQ(ok["choices"][0]["message"]["content"], "\"aaaa\"") << ok.dump();
  expect_still_serving(srv.port);
}

}  // namespace
