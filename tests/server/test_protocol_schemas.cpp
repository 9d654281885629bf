// The Anthropic Messages and OpenAI Responses adapters' request side: the chat conversation each
// request becomes (what the template renders), the generation settings, and errors naming the field.
#include <gtest/gtest.h>

#include "server/anthropic_schema.h"
#include "server/conversation_store.h"
#include "server/responses_schema.h"

using namespace lilac::server;

namespace {

lilac::ModelConfig cfg() {
  lilac::ModelConfig c;
  c.vocab_size = 1000;
  c.default_temperature = 0.6f;
  c.default_top_k = 20;
  return c;
}

template <class Fn>
ApiError error_of(Fn&& fn) {
  try {
    fn();
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "no error";
  return ApiError(0, "");
}

ApiError messages_error(const char* body) {
  return error_of([&] { parse_messages_request(ojson::parse(body), cfg(), 1); });
}
ApiError responses_error(const char* body) {
  return error_of([&] { parse_responses_request(ojson::parse(body), cfg(), 1); });
}

}  // namespace

TEST(AnthropicSchema, TranslatesBlocksIntoTheChatConversation) {
  auto p = parse_messages_request(ojson::parse(R"({
    "model": "m", "max_tokens": 100, "stream": true, "temperature": 0.2, "top_k": 5, "stop_sequences": ["END", ""],
    "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
    "messages": [
      {"role": "user", "content": "weather?"},
      {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                                        {"type": "redacted_thinking", "data": "x"},
                                        {"type": "text", "text": "Checking."},
                                        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "21C"}]},
                                   {"type": "tool_result", "tool_use_id": "toolu_2", "content": "boom", "is_error": true},
                                   {"type": "text", "text": "thanks"}]}],
    "tools": [{"name": "get_weather", "description": "d", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
    "tool_choice": {"type": "auto"},
    "thinking": {"type": "enabled", "budget_tokens": 40}})"), cfg(), 7);
  EXPECT_EQ(p.model, "m");
  EXPECT_TRUE(p.stream);
  EXPECT_EQ(*p.max_tokens, 100);
  EXPECT_FLOAT_EQ(p.sampling.temperature, 0.2f);
  EXPECT_EQ(p.sampling.top_k, 5);
  EXPECT_EQ(p.sampling.seed, 7u);
  EXPECT_EQ(p.stop, std::vector<std::string>{"END"});
  EXPECT_TRUE(p.thinking);
  EXPECT_EQ(*p.budget_tokens, 40);
  EXPECT_EQ(p.template_request["messages"], ojson::parse(R"([
    {"role": "system", "content": "Be brief.\nBe kind."},
    {"role": "user", "content": "weather?"},
    {"role": "assistant", "content": "Checking.", "reasoning_content": "hm",
     "tool_calls": [{"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "tool_call_id": "toolu_1", "content": "21C"},
    {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: boom"},
    {"role": "user", "content": "thanks"}])"));
  EXPECT_EQ(p.template_request["tools"], ojson::parse(R"([{"type": "function", "function": {"name": "get_weather",
    "description": "d", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])"));
  EXPECT_EQ(p.template_request["chat_template_kwargs"], ojson::parse(R"({"enable_thinking": true})"));
}

TEST(AnthropicSchema, ThinkingOffByDefaultToolChoiceForcesOrDrops) {
  auto p = parse_messages_request(ojson::parse(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})"), cfg(), 1);
  EXPECT_FALSE(p.thinking);
  EXPECT_EQ(p.template_request["chat_template_kwargs"]["enable_thinking"], false);
  EXPECT_FLOAT_EQ(p.sampling.temperature, 0.6f);  // generation_config.json's
  const char* tools = R"("tools": [{"name": "f", "input_schema": {"type": "object"}}])";
  auto any = parse_messages_request(ojson::parse(std::string(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], )") +
                                                  tools + R"(, "tool_choice": {"type": "any"}})"), cfg(), 1);
  EXPECT_EQ(any.tool_choice, ToolChoice::Required);
  auto named = parse_messages_request(ojson::parse(std::string(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], )") +
                                                    tools + R"(, "tool_choice": {"type": "tool", "name": "f"}})"), cfg(), 1);
  EXPECT_EQ(named.tool_choice, ToolChoice::Function);
  EXPECT_EQ(named.tool_choice_name, "f");
  EXPECT_TRUE(named.parallel_tool_calls);
  auto single = parse_messages_request(ojson::parse(std::string(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], )") +
                                                     tools + R"(, "tool_choice": {"type": "any", "disable_parallel_tool_use": true}})"), cfg(), 1);
  EXPECT_FALSE(single.parallel_tool_calls);  // enforced by the call grammar: at most one call
  auto none = parse_messages_request(ojson::parse(std::string(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], )") +
                                                   tools + R"(, "tool_choice": {"type": "none"}})"), cfg(), 1);
  EXPECT_FALSE(none.template_request.contains("tools"));
  EXPECT_TRUE(none.tools.is_null());
  // count_tokens needs no max_tokens
  EXPECT_NO_THROW(parse_messages_request(ojson::parse(R"({"messages": [{"role": "user", "content": "hi"}]})"), cfg(), 1, true));
}

// A final assistant message is continued (a prefill), as Anthropic's API does; what cannot be continued is a 400.
TEST(AnthropicSchema, FinalAssistantMessageIsAPrefill) {
  auto p = parse_messages_request(ojson::parse(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "a"},
      {"role": "assistant", "content": [{"type": "text", "text": "The answer"}, {"type": "text", "text": " is"}]}]})"), cfg(), 1);
  EXPECT_TRUE(p.continue_final);
  EXPECT_EQ(p.template_request["messages"].back()["content"], "The answer is");
  EXPECT_FALSE(parse_messages_request(ojson::parse(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "a"}]})"), cfg(), 1)
                   .continue_final);
  EXPECT_TRUE(parse_messages_request(ojson::parse(R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "{"}]})"),
                                     cfg(), 1, true).continue_final);
  // The request's last message decides: a last user turn of no blocks translates to nothing, and neither the
  // assistant turn before it becomes a prefill nor an empty conversation is read past its end (found by the
  // server fuzz target under UBSan: fuzz/corpus/server/regress-empty-user-turn).
  EXPECT_FALSE(parse_messages_request(ojson::parse(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "a"},
      {"role": "assistant", "content": "b"}, {"role": "user", "content": []}]})"), cfg(), 1).continue_final);
  EXPECT_FALSE(parse_messages_request(ojson::parse(R"({"messages": [{"role": "user", "content": []}]})"), cfg(), 1, true)
                   .continue_final);
  auto err = messages_error(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b "}]})");
  EXPECT_EQ(err.param, "messages");
  EXPECT_EQ(err.code, "invalid_last_message");
  EXPECT_EQ(messages_error(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b\n"}]})").code,
            "invalid_last_message");
  EXPECT_EQ(messages_error(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "a"},
      {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]})").code, "invalid_last_message");
  EXPECT_EQ(messages_error(R"({"max_tokens": 50, "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
      "thinking": {"type": "enabled", "budget_tokens": 10}})").param, "thinking");
  EXPECT_EQ(messages_error(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
      "tools": [{"name": "f", "input_schema": {"type": "object"}}], "tool_choice": {"type": "any"}})").param, "tool_choice");
}

TEST(AnthropicSchema, ErrorsNameTheField) {
  EXPECT_EQ(messages_error(R"({"messages": [{"role": "user", "content": "hi"}]})").param, "max_tokens");
  EXPECT_EQ(messages_error(R"({"max_tokens": 0, "messages": [{"role": "user", "content": "hi"}]})").param, "max_tokens");
  EXPECT_EQ(messages_error(R"({"max_tokens": 5, "messages": []})").param, "messages");
  EXPECT_EQ(messages_error(R"({"max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]})").param, "messages[0].role");
  EXPECT_EQ(messages_error(R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image"}]}]})").param,
            "messages[0].content[0].type");
  EXPECT_EQ(messages_error(R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "b"}]}]})").param,
            "messages[0].content[0].type");
  EXPECT_EQ(messages_error(R"({"max_tokens": 5, "temperature": 1.5, "messages": [{"role": "user", "content": "a"}]})").param, "temperature");
  EXPECT_EQ(messages_error(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "a"}], "thinking": {"type": "enabled", "budget_tokens": 5}})").param,
            "thinking.budget_tokens");
  EXPECT_EQ(messages_error(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "a"}], "thinking": {"type": "enabled"}})").param,
            "thinking.budget_tokens");
  EXPECT_EQ(messages_error(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "a"}], "tools": [{"name": "x"}]})").param,
            "tools[0].input_schema");
  EXPECT_EQ(messages_error(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "a"}], "tools": [{"type": "bash_20250124", "name": "bash"}]})").param,
            "tools[0].type");
  EXPECT_EQ(messages_error(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "a"}], "tool_choice": {"type": "any"}})").param,
            "tool_choice");
  // Anthropic's body: {"type": "error", "error": {"type", "message"}}, the message naming the field.
  auto b = anthropic_error_body(ApiError(400, "must be positive", "max_tokens"));
  EXPECT_EQ(b["type"], "error");
  EXPECT_EQ(b["error"]["type"], "invalid_request_error");
  EXPECT_EQ(b["error"]["message"], "max_tokens: must be positive");
  EXPECT_EQ(anthropic_error_type(401), "authentication_error");
  EXPECT_EQ(anthropic_error_type(404), "not_found_error");
  EXPECT_EQ(anthropic_error_type(429), "rate_limit_error");
  EXPECT_EQ(anthropic_error_type(503), "overloaded_error");
  EXPECT_EQ(anthropic_error_type(500), "api_error");
  EXPECT_EQ(anthropic_tool_id("call_abc"), "toolu_abc");
}

TEST(ResponsesSchema, TranslatesItemsIntoTheChatConversation) {
  auto p = parse_responses_request(ojson::parse(R"({
    "model": "m", "instructions": "Be brief.", "max_output_tokens": 50, "temperature": 0.3, "top_p": 0.9, "store": false,
    "input": [
      {"role": "developer", "content": "Use metric units."},
      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
      {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "need tool"}]},
      {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
      {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": "{\"city\":\"Rome\"}"},
      {"type": "function_call_output", "call_id": "call_1", "output": "21C"},
      {"type": "function_call_output", "call_id": "call_2", "output": "25C"}],
    "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}, "strict": true}],
    "tool_choice": {"type": "function", "name": "get_weather"},
    "reasoning": {"effort": "low"}})"), cfg(), 3);
  EXPECT_EQ(*p.max_output_tokens, 50);
  EXPECT_FLOAT_EQ(p.sampling.temperature, 0.3f);
  EXPECT_FLOAT_EQ(p.sampling.top_p, 0.9f);
  EXPECT_TRUE(p.reasoning);
  EXPECT_EQ(p.effort, "low");
  EXPECT_EQ(p.tool_choice, ToolChoice::Function);
  EXPECT_EQ(p.template_request["messages"], ojson::parse(R"([
    {"role": "system", "content": "Be brief.\n\nUse metric units."},
    {"role": "user", "content": "weather?"},
    {"role": "assistant", "content": "", "reasoning_content": "need tool", "tool_calls": [
      {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
      {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "21C"},
    {"role": "tool", "tool_call_id": "call_2", "content": "25C"}])"));
  EXPECT_EQ(p.template_request["tools"][0]["function"]["name"], "get_weather");
  EXPECT_FALSE(p.template_request.contains("chat_template_kwargs"));
  auto off = parse_responses_request(ojson::parse(R"({"input": "hi", "reasoning": {"effort": "none"}})"), cfg(), 1);
  EXPECT_FALSE(off.reasoning);
  EXPECT_EQ(off.template_request["chat_template_kwargs"]["enable_thinking"], false);
  EXPECT_EQ(off.template_request["messages"], ojson::parse(R"([{"role": "user", "content": "hi"}])"));
}

// An input that ends with an assistant message is a prefill (continue_final); consecutive assistant message items
// are one turn (one message), so a stored prefill and its continuation come back as the text the model wrote.
TEST(ResponsesSchema, AFinalAssistantMessageIsContinued) {
  auto p = parse_responses_request(ojson::parse(R"({"input": [
    {"role": "user", "content": "Write about the sea."},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "The sea"}]},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": " is"}]}]})"), cfg(), 1);
  EXPECT_TRUE(p.continue_final);
  EXPECT_EQ(p.template_request["messages"], ojson::parse(R"([
    {"role": "user", "content": "Write about the sea."}, {"role": "assistant", "content": "The sea is"}])"));
  auto q = parse_responses_request(ojson::parse(R"({"input": [
    {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]})"), cfg(), 1);
  EXPECT_FALSE(q.continue_final);
  EXPECT_EQ(q.template_request["messages"].size(), 3u);
}

// text.format json_object / json_schema (constrained decoding) and strict tools reach the generation
// spec's inputs; the format is echoed as given.
TEST(ResponsesSchema, TextFormatAndStrictTools) {
  const lilac::ModelConfig c = cfg();
  auto parse = [&](const char* body) { return parse_responses_request(ojson::parse(body), c, 1); };
  EXPECT_EQ(parse(R"({"input": "x"})").response_format, ResponseFormat::Text);
  EXPECT_EQ(parse(R"({"input": "x", "text": {"format": {"type": "json_object"}}})").response_format, ResponseFormat::JsonObject);
  const ResponsesParams p = parse(
      R"({"input": "x", "text": {"format": {"type": "json_schema", "name": "s", "strict": true, "schema": {"type": "object", "properties": {"b": {}, "a": {}}}}}})");
  EXPECT_EQ(p.response_format, ResponseFormat::JsonSchema);
  EXPECT_EQ(p.json_schema.dump(), R"({"type":"object","properties":{"b":{},"a":{}}})");  // order kept
  EXPECT_EQ(p.echo_text_format["name"], "s");
  const ResponsesParams t = parse(
      R"({"input": "x", "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": true},
                                   {"type": "function", "name": "g", "parameters": {"type": "object"}}]})");
  EXPECT_EQ(t.tools[0]["function"]["strict"], true);
  EXPECT_FALSE(t.tools[1]["function"].contains("strict"));
}

// previous_response_id: the stored conversation's items come first, then this input; the instructions are
// this request's only; the entry-to-be's items are the whole conversation's input.
TEST(ResponsesSchema, PreviousResponseContinuesTheStoredConversation) {
  ResponseStore store;
  ResponseStore::Entry e;
  e.items = ojson::parse(R"([{"role": "user", "content": "My name is Ada."},
      {"type": "reasoning", "id": "rs_1", "content": [{"type": "reasoning_text", "text": "A name."}]},
      {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
       "content": [{"type": "output_text", "text": "Hello Ada.", "annotations": []}]}])");
  e.response = {{"id", "resp_a"}};
  store.put("resp_a", e);
  const auto p = parse_responses_request(
      ojson::parse(R"({"input": "What is my name?", "instructions": "Be brief.", "previous_response_id": "resp_a"})"), cfg(),
      1, &store);
  EXPECT_TRUE(p.store);
  EXPECT_EQ(p.previous_response_id, "resp_a");
  const ojson want = ojson::parse(R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "My name is Ada."},
      {"role": "assistant", "content": "Hello Ada.", "reasoning_content": "A name."}, {"role": "user", "content": "What is my name?"}])");
  EXPECT_EQ(p.template_request["messages"], want) << p.template_request["messages"].dump();
  ASSERT_EQ(p.input_items.size(), 4u);
  EXPECT_EQ(p.input_items[3], ojson::parse(R"({"role": "user", "content": "What is my name?"})"));
  EXPECT_FALSE(parse_responses_request(ojson::parse(R"({"input": "x", "store": false})"), cfg(), 1).store);
}

TEST(ResponsesSchema, StoreKeepsTheNewestWithinItsBounds) {
  ResponseStore store(/*max_entries=*/2, /*max_bytes=*/4096);
  auto entry = [](size_t pad) {
    ResponseStore::Entry e;
    e.items = ojson::array({std::string(pad, 'x')});
    e.response = {{"ok", true}};
    return e;
  };
  store.put("a", entry(10));
  store.put("b", entry(10));
  store.put("c", entry(10));  // the oldest ("a") leaves: two at most
  EXPECT_FALSE(store.contains("a"));
  EXPECT_TRUE(store.contains("b") && store.contains("c"));
  store.put("d", entry(3000));  // bytes: "b" leaves too
  EXPECT_FALSE(store.contains("b"));
  EXPECT_TRUE(store.contains("c") && store.contains("d"));
  EXPECT_LE(store.bytes(), 4096u);
  store.put("huge", entry(5000));  // larger than the whole budget: not kept, nothing dropped
  EXPECT_FALSE(store.contains("huge"));
  EXPECT_EQ(store.size(), 2u);
  EXPECT_TRUE(store.erase("c"));
  EXPECT_FALSE(store.erase("c"));
  store.put("e", entry(10));
  store.put("f", entry(10));  // "c"'s stale place in the order is skipped: "d" leaves, not "e"
  EXPECT_TRUE(store.contains("e") && store.contains("f"));
  EXPECT_FALSE(store.contains("d"));
}

// Conversations leave least recently used first: a get() or an update() keeps one; an update that grows one past the
// budget drops the others, one that alone would not fit changes nothing.
TEST(ResponsesSchema, ConversationStoreDropsTheLeastRecentlyUsed) {
  ConversationStore store(/*max_conversations=*/2, /*max_bytes=*/4096);
  auto conv = [](const char* id, size_t pad) {
    ConversationStore::Conversation c;
    c.id = id;
    c.items = ojson::array({std::string(pad, 'x')});
    return c;
  };
  EXPECT_TRUE(store.put(conv("a", 10)));
  EXPECT_TRUE(store.put(conv("b", 10)));
  ASSERT_TRUE(store.get("a"));  // "a" used last: "b" leaves for "c"
  EXPECT_TRUE(store.put(conv("c", 10)));
  EXPECT_TRUE(store.contains("a") && store.contains("c"));
  EXPECT_FALSE(store.contains("b"));
  EXPECT_FALSE(store.put(conv("huge", 5000)));  // larger than the whole budget: not kept, nothing dropped
  EXPECT_EQ(store.size(), 2u);
  auto grow = [](size_t pad) { return [pad](ConversationStore::Conversation& c) { c.items.push_back(std::string(pad, 'y')); }; };
  EXPECT_FALSE(store.update("a", grow(5000)));  // would not fit alone: unchanged
  EXPECT_EQ(store.get("a")->items.size(), 1u);
  EXPECT_TRUE(store.update("c", grow(3990)));  // "c" fits alone (4,074 bytes), not with "a": "a" leaves
  EXPECT_FALSE(store.contains("a"));
  EXPECT_EQ(store.get("c")->items.size(), 2u);
  EXPECT_LE(store.bytes(), 4096u);
  EXPECT_FALSE(store.update("a", grow(1)));
  EXPECT_TRUE(store.erase("c"));
  EXPECT_FALSE(store.erase("c"));
  EXPECT_EQ(store.size(), 0u);
}

// An unknown previous_response_id is the client's own string: its error quotes at most 128 bytes of it (a 100 KB id
// gave a 100 KB message, echoed into the log), as the conversation's does.
TEST(ResponsesSchema, AnUnknownLongPreviousIdIsQuotedShort) {
  const std::string id(100000, 'r');
  const std::string body = R"({"input": "x", "previous_response_id": ")" + id + R"("})";
  const ApiError e = responses_error(body.c_str());
  EXPECT_EQ(e.code, "previous_response_not_found");
  EXPECT_EQ(e.param, "previous_response_id");
  EXPECT_LT(e.message.size(), 400u) << e.message.size();
  EXPECT_NE(e.message.find(std::string(128, 'r')), std::string::npos);
}

TEST(ResponsesSchema, ErrorsNameTheField) {
  EXPECT_EQ(responses_error(R"({"input": "x", "store": "yes"})").param, "store");
  const ApiError prev = responses_error(R"({"input": "x", "previous_response_id": "resp_1"})");
  EXPECT_EQ(prev.param, "previous_response_id");
  EXPECT_EQ(prev.code, "previous_response_not_found");
  EXPECT_EQ(responses_error(R"({"input": "x", "text": {"format": {"type": "json_schema"}}})").param, "text.format.name");
  EXPECT_EQ(responses_error(R"({"input": "x", "text": {"format": {"type": "json_schema", "name": "s", "schema": 3}}})").param,
            "text.format.schema");
  EXPECT_EQ(responses_error(R"({"input": "x", "text": {"format": {"type": "yaml"}}})").param, "text.format.type");
  EXPECT_EQ(responses_error(R"({})").param, "input");
  EXPECT_EQ(responses_error(R"({"input": []})").param, "input");
  EXPECT_EQ(responses_error(R"({"input": [{"type": "item_reference", "id": "x"}]})").param, "input[0].type");
  EXPECT_EQ(responses_error(R"({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "nope"}, {"role": "user", "content": "x"}]})").param,
            "input[0].arguments");
  EXPECT_EQ(responses_error(R"({"input": [{"role": "user", "content": [{"type": "input_file"}]}]})").param, "input[0].content[0].type");
  // a final assistant message is continued (a prefill) unless its text ends with whitespace
  EXPECT_EQ(responses_error(R"({"input": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y "}]})").param, "input");
  EXPECT_EQ(responses_error(R"({"input": "x", "tools": [{"type": "file_search"}]})").param, "tools[0].type");
  EXPECT_EQ(responses_error(R"({"input": "x", "tool_choice": "required"})").param, "tool_choice");
  EXPECT_EQ(responses_error(R"({"input": "x", "reasoning": {"effort": "max"}})").param, "reasoning.effort");
  EXPECT_EQ(responses_error(R"({"input": "x", "max_output_tokens": 0})").param, "max_output_tokens");
  EXPECT_EQ(responses_error(R"({"input": "x", "temperature": 2.5})").param, "temperature");
}
