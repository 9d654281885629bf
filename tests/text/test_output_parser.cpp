// OutputParser: reasoning / content / tool calls of the Qwen3.6 format, split invariance, bad markup.
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "text/output_parser.h"
#include "text/unicode.h"

using nlohmann::json;
using lilac::OutputDelta;
using lilac::OutputParser;

namespace {

struct Call {
  int index;
  std::string id, name, arguments;
  bool ended = false;
  int pieces = 1;
};

struct Result {
  std::string content, reasoning;
  std::vector<Call> calls;
  int n_deltas = 0;
  bool operator==(const Result& o) const {
    if (content != o.content || reasoning != o.reasoning || calls.size() != o.calls.size()) return false;
    for (size_t i = 0; i < calls.size(); ++i)
      if (calls[i].index != o.calls[i].index || calls[i].name != o.calls[i].name ||
          calls[i].arguments != o.calls[i].arguments)
        return false;
    return true;
  }
};

std::ostream& operator<<(std::ostream& os, const Result& r) {
  os << "content=" << json(r.content).dump() << " reasoning=" << json(r.reasoning).dump();
  for (auto& c : r.calls) os << " call[" << c.index << "]=" << c.name << " " << c.arguments;
  return os;
}

void collect(Result& r, const std::vector<OutputDelta>& ds) {
  for (const auto& d : ds) {
    ++r.n_deltas;
    switch (d.kind) {
      case OutputDelta::Content:
        EXPECT_FALSE(d.text.empty());
        EXPECT_TRUE(lilac::unicode::is_valid_utf8(d.text));
        r.content += d.text;
        break;
      case OutputDelta::Reasoning:
        EXPECT_FALSE(d.text.empty());
        EXPECT_TRUE(lilac::unicode::is_valid_utf8(d.text));
        r.reasoning += d.text;
        break;
      case OutputDelta::ToolCall:
        // A call's first delta names it (id and name); the others continue its arguments, the last is tool_end.
        EXPECT_TRUE(lilac::unicode::is_valid_utf8(d.arguments));
        if (d.tool_start()) {
          EXPECT_FALSE(d.tool_name.empty());
          EXPECT_EQ(d.tool_index, static_cast<int>(r.calls.size()));
          if (!r.calls.empty()) EXPECT_TRUE(r.calls.back().ended) << "a call started before the previous one ended";
          r.calls.push_back({d.tool_index, d.tool_id, d.tool_name, d.arguments, d.tool_end});
        } else {
          EXPECT_TRUE(d.tool_name.empty());
          ASSERT_FALSE(r.calls.empty());
          Call& c = r.calls.back();
          EXPECT_EQ(d.tool_index, c.index);
          EXPECT_FALSE(c.ended) << "a piece after the call's end";
          c.arguments += d.arguments;
          c.ended = d.tool_end;
          ++c.pieces;
        }
        break;
    }
  }
}

Result run(const std::vector<std::string>& chunks, bool in_reasoning, const json& tools = nullptr) {
  OutputParser p(in_reasoning, tools);
  Result r;
  for (const auto& c : chunks) collect(r, p.push(c));
  collect(r, p.finish());
  EXPECT_EQ(p.tool_calls(), static_cast<int>(r.calls.size()));
  for (const auto& c : r.calls) EXPECT_TRUE(c.ended) << "call " << c.index << " never ended";
  return r;
}

Result run1(const std::string& text, bool in_reasoning, const json& tools = nullptr) {
  return run({text}, in_reasoning, tools);
}

// Every split into two pieces, byte-by-byte, and random splits into many pieces give `want`.
void expect_split_invariant(const std::string& text, bool in_reasoning, const json& tools, const Result& want) {
  for (size_t i = 0; i <= text.size(); ++i) {
    Result r = run({text.substr(0, i), text.substr(i)}, in_reasoning, tools);
    ASSERT_EQ(r, want) << "split at " << i << " of " << json(text).dump();
  }
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  ASSERT_EQ(run(bytes, in_reasoning, tools), want) << "byte-by-byte: " << json(text).dump();
  std::mt19937 rng(7);
  for (int iter = 0; iter < 50; ++iter) {
    std::vector<std::string> chunks;
    size_t pos = 0;
    while (pos < text.size()) {
      size_t n = std::min<size_t>(text.size() - pos, rng() % 9);
      chunks.push_back(text.substr(pos, n));
      pos += n;
    }
    ASSERT_EQ(run(chunks, in_reasoning, tools), want) << "random split " << iter;
  }
}

json weather_tools() {
  return json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
      "location": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
      "ratio": {"type": "number"}, "options": {"type": "object"}, "tags": {"type": "array"},
      "zip": {"type": "string"}, "maybe": {"type": ["integer", "null"]},
      "either": {"anyOf": [{"type": "number"}, {"type": "string"}]}}}}},
    {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {
      "query": {"type": "string"}, "limit": {"type": "integer"}}}}}
  ])");
}

const std::string kTwoCalls =
    "I will check.\n\n<tool_call>\n<function=get_weather>\n<parameter=location>\nParis, France\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n</function>\n</tool_call>\n"
    "<tool_call>\n<function=search>\n<parameter=query>\nweather\n\"today\"\n</parameter>\n"
    "<parameter=limit>\n10\n</parameter>\n</function>\n</tool_call>";

}  // namespace

TEST(OutputParser, PlainContent) {
  Result r = run1("Hello, world! 2 < 3 and <b>bold</b>.", false);
  EXPECT_EQ(r.content, "Hello, world! 2 < 3 and <b>bold</b>.");
  EXPECT_EQ(r.reasoning, "");
  EXPECT_TRUE(r.calls.empty());
}

TEST(OutputParser, ReasoningOpenedByPrompt) {
  const std::string text = "\nLet me think: 2+2.\n</think>\n\nThe answer is 4.";
  Result r = run1(text, true);
  EXPECT_EQ(r.reasoning, "Let me think: 2+2.");
  EXPECT_EQ(r.content, "The answer is 4.");
  expect_split_invariant(text, true, nullptr, r);
}

TEST(OutputParser, ThinkAtStartOpensReasoning) {
  const std::string text = "<think>\nhmm\n\n</think>\n\nok\nbye";
  Result r = run1(text, false);
  EXPECT_EQ(r.reasoning, "hmm");
  EXPECT_EQ(r.content, "ok\nbye");
  expect_split_invariant(text, false, nullptr, r);
}

TEST(OutputParser, ThinkNotAtStartIsContent) {
  Result r = run1("a <think>b</think> c", false);
  EXPECT_EQ(r.content, "a <think>b</think> c");
  EXPECT_EQ(r.reasoning, "");
}

TEST(OutputParser, UnterminatedReasoningStaysReasoning) {
  Result r = run1("thinking <tool_call> still thinking </thi", true);
  EXPECT_EQ(r.reasoning, "thinking <tool_call> still thinking </thi");
  EXPECT_EQ(r.content, "");
}

TEST(OutputParser, XmlToolCallsTypedBySchema) {
  const std::string text = "<think>\nNeed weather.\n</think>\n\n" + kTwoCalls;
  Result r = run1(text, false, weather_tools());
  EXPECT_EQ(r.reasoning, "Need weather.");
  EXPECT_EQ(r.content, "I will check.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].index, 0);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, R"({"location":"Paris, France","days":3,"metric":true})");
  EXPECT_EQ(r.calls[1].index, 1);
  EXPECT_EQ(r.calls[1].name, "search");
  EXPECT_EQ(r.calls[1].arguments, R"({"query":"weather\n\"today\"","limit":10})");
  for (const auto& c : r.calls) {
    ASSERT_EQ(c.id.rfind("call_", 0), 0u) << c.id;
    EXPECT_GE(c.id.size(), 5u + 16u);
    for (size_t i = 5; i < c.id.size(); ++i) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c.id[i]))) << c.id;
  }
  EXPECT_NE(r.calls[0].id, r.calls[1].id);
  expect_split_invariant(text, false, weather_tools(), r);
}

TEST(OutputParser, CallIdsUniqueAcrossParsers) {
  std::set<std::string> ids;
  for (int i = 0; i < 200; ++i) {
    Result r = run1(kTwoCalls, false, weather_tools());
    for (auto& c : r.calls) ids.insert(c.id);
  }
  EXPECT_EQ(ids.size(), 400u);
}

TEST(OutputParser, ValueTyping) {
  const std::string text =
      "<tool_call>\n<function=get_weather>\n"
      "<parameter=ratio>\n0.25\n</parameter>\n"
      "<parameter=options>\n{\"unit\": \"C\", \"n\": [1, 2]}\n</parameter>\n"
      "<parameter=tags>\n[\"a\", \"b\"]\n</parameter>\n"
      "<parameter=zip>\n02134\n</parameter>\n"
      "<parameter=days>\nthree\n</parameter>\n"
      "<parameter=metric>\nFalse\n</parameter>\n"
      "<parameter=maybe>\nnull\n</parameter>\n"
      "<parameter=either>\n12.5\n</parameter>\n"
      "<parameter=unknown_arg>\n42\n</parameter>\n"
      "</function>\n</tool_call>";
  Result r = run1(text, false, weather_tools());
  ASSERT_EQ(r.calls.size(), 1u);
  const json args = json::parse(r.calls[0].arguments);
  EXPECT_EQ(args["ratio"], 0.25);
  EXPECT_EQ(args["options"], json::parse(R"({"unit": "C", "n": [1, 2]})"));
  EXPECT_EQ(args["tags"], json::parse(R"(["a", "b"])"));
  EXPECT_EQ(args["zip"], "02134");        // string schema: kept as written
  EXPECT_EQ(args["days"], "three");       // not a valid integer: kept as string
  EXPECT_EQ(args["metric"], false);       // Python-style boolean accepted
  EXPECT_TRUE(args["maybe"].is_null());
  EXPECT_EQ(args["either"], 12.5);
  EXPECT_EQ(args["unknown_arg"], "42");   // not in the schema: string
  expect_split_invariant(text, false, weather_tools(), r);
}

TEST(OutputParser, NoToolsMeansStrings) {
  Result r = run1(kTwoCalls, false);
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].arguments, R"({"location":"Paris, France","days":"3","metric":"true"})");
  EXPECT_EQ(r.calls[1].arguments, R"({"query":"weather\n\"today\"","limit":"10"})");
}

TEST(OutputParser, MultilineValueKeepsInnerNewlines) {
  const std::string text =
      "<tool_call>\n<function=write>\n<parameter=code>\n\ndef f():\n    return 1\n\n</parameter>\n</function>\n</tool_call>";
  Result r = run1(text, false);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(json::parse(r.calls[0].arguments)["code"], "\ndef f():\n    return 1\n");
}

TEST(OutputParser, Qwen3JsonToolCall) {
  const std::string text =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Oslo\", \"days\": 2}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"search\", \"arguments\": \"{\\\"query\\\": \\\"x\\\"}\"}\n</tool_call>";
  Result r = run1(text, false, weather_tools());
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, R"({"location":"Oslo","days":2})");
  EXPECT_EQ(r.calls[1].name, "search");
  EXPECT_EQ(r.calls[1].arguments, R"({"query":"x"})");
  EXPECT_EQ(r.content, "");
  expect_split_invariant(text, false, weather_tools(), r);
}

TEST(OutputParser, ContentAfterToolCall) {
  const std::string text =
      "<tool_call>\n<function=f>\n</function>\n</tool_call>\n\nDone.";
  Result r = run1(text, false);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "f");
  EXPECT_EQ(r.calls[0].arguments, "{}");
  EXPECT_EQ(r.content, "Done.");
}

TEST(OutputParser, MalformedToolCallDegradesToContent) {
  const std::vector<std::string> bad = {
      "<tool_call>\nnot a call at all\n</tool_call>",
      "<tool_call>\n{\"arguments\": {}}\n</tool_call>",
      "<tool_call>\n{broken json\n</tool_call>",
      "<tool_call>\n<function=>\n</function>\n</tool_call>",
      "<tool_call>\n<function=f>\n<param=x>1</param>\n</function>\n</tool_call>",
  };
  for (const auto& text : bad) {
    Result r = run1("pre " + text + " post", false);
    EXPECT_TRUE(r.calls.empty()) << text;
    EXPECT_EQ(r.content, "pre " + text + " post") << text;
    expect_split_invariant("pre " + text + " post", false, nullptr, r);
  }
}

// A "<tool_call>" merely mentioned in content swallowed the real call after it (the whole text came out as
// content at the end) and held back everything after it from a stream. The tag is content as soon as the
// text after it cannot start a call body (<function=... or {...}), and a second "<tool_call>" inside a body
// not yet a call makes the first content and the block start again there.
TEST(OutputParser, AMentionedTagIsContentAndTheRealCallStillParses) {
  const std::string text = "I will call it with the <tool_call> tag.\n\n<tool_call>\n<function=f>\n<parameter=s>\nx\n"
                           "</parameter>\n</function>\n</tool_call>";
  Result r = run1(text, false);
  EXPECT_EQ(r.content, "I will call it with the <tool_call> tag.");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "f");
  EXPECT_EQ(r.calls[0].arguments, R"({"s":"x"})");
  expect_split_invariant(text, false, nullptr, r);
}

TEST(OutputParser, ASecondTagInABodyNotYetACallRestartsTheBlock) {
  const std::vector<std::pair<std::string, std::string>> restarts = {  // {text, its content}
      {"<tool_call>{ oops\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"s\": \"x\"}}\n</tool_call>",
       "<tool_call>{ oops"},
      {"a <tool_call>\n<function=f\n<tool_call>\n<function=f>\n<parameter=s>\nx\n</parameter>\n</function>\n"
       "</tool_call>",
       "a <tool_call>\n<function=f"},
  };
  for (const auto& [t, content] : restarts) {
    Result rr = run1(t, false);
    EXPECT_EQ(rr.content, content) << t;
    ASSERT_EQ(rr.calls.size(), 1u) << t;
    EXPECT_EQ(rr.calls[0].arguments, R"({"s":"x"})") << t;
    expect_split_invariant(t, false, nullptr, rr);
  }
}

// A JSON-form call whose arguments mention the tag (inside a string, escaped quotes before it) is a call: the tag
// restarts a block only outside the JSON strings (it was demoted to content whole).
TEST(OutputParser, AJsonCallWhoseArgumentsMentionTheTagIsACall) {
  const json tools = json::parse(R"([{"type":"function","function":{"name":"write_file","parameters":{"type":"object",
      "properties":{"content":{"type":"string"}}}}}])");
  const std::string text = "<tool_call>\n{\"name\": \"write_file\", \"arguments\": {\"content\": "
                           "\"say \\\"hi\\\" and wrap calls in <tool_call> tags\"}}\n</tool_call>";
  Result r = run1(text, false, tools);
  ASSERT_EQ(r.calls.size(), 1u) << r.content;
  EXPECT_EQ(r.calls[0].name, "write_file");
  EXPECT_EQ(json::parse(r.calls[0].arguments)["content"], "say \"hi\" and wrap calls in <tool_call> tags");
  EXPECT_EQ(r.content, "");
  expect_split_invariant(text, false, tools, r);
}

// Streamed: the text after a mentioned tag leaves as soon as it shows the tag opens no call.
TEST(OutputParser, TextAfterAMentionedTagStreams) {
  OutputParser p(false);
  auto texts = [](const std::vector<OutputDelta>& ds) {
    std::string s;
    for (auto& d : ds) s += d.text;
    return s;
  };
  EXPECT_EQ(texts(p.push("Say <tool_call>")), "Say ");
  EXPECT_EQ(texts(p.push(" ")), "");  // whitespace may precede <function=
  EXPECT_EQ(texts(p.push("to call")), "<tool_call> to call");
  EXPECT_EQ(texts(p.push(" a tool.")), " a tool.");
  EXPECT_TRUE(p.finish().empty());
}

// Newlines right before a "<tool_call>" are the markup's, dropped when the tag is seen; when the block turned
// out to be no call they were lost from its content ("Line one<tool_call> is ...").
TEST(OutputParser, NewlinesBeforeATagThatIsNoCallStayContent) {
  for (const std::string text : {"Line one\n\n<tool_call> is the tag name.\nbye",
                                 "a\n\n<tool_call>\n{broken json\n</tool_call> b", "a\n<tool_call>\n<function=f",
                                 "a\n<tool_call>"}) {
    Result r = run1(text, false);
    EXPECT_TRUE(r.calls.empty()) << text;
    EXPECT_EQ(r.content, text);
    expect_split_invariant(text, false, nullptr, r);
  }
  // Those before the real call that follows stay dropped.
  const std::string two = "x\n\n<tool_call>\n\n<tool_call>\n<function=f>\n</function>\n</tool_call>";
  Result r = run1(two, false);
  EXPECT_EQ(r.content, "x\n\n<tool_call>");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, "{}");
  expect_split_invariant(two, false, nullptr, r);
}

TEST(OutputParser, UnterminatedToolCall) {
  // A call cut off by the end of generation (max_tokens) after it committed: the call with the value so far,
  // as valid JSON; before the commit (no complete first parameter yet): plain content.
  const std::string cut = "ok <tool_call>\n<function=f>\n<parameter=x>\n1";
  Result r = run1(cut, false);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"x":"1"})");
  EXPECT_EQ(r.content, "ok ");
  expect_split_invariant(cut, false, nullptr, r);
  const std::string early = "ok <tool_call>\n<function=f>\n<parame";
  Result r0 = run1(early, false);
  EXPECT_TRUE(r0.calls.empty());
  EXPECT_EQ(r0.content, early);
  expect_split_invariant(early, false, nullptr, r0);
  // A complete function whose </tool_call> never came: still a call.
  const std::string almost = "<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</function>\n";
  Result r2 = run1(almost, false);
  ASSERT_EQ(r2.calls.size(), 1u);
  EXPECT_EQ(r2.calls[0].arguments, R"({"x":"1"})");
  // Partial opening tag at the end: content.
  EXPECT_EQ(run1("abc <tool_ca", false).content, "abc <tool_ca");
  EXPECT_EQ(run1("<thi", false).content, "<thi");
}

// Arguments leave the parser while the model writes them: string values character by character (escaped),
// typed values at their </parameter>, the call's first delta naming it.
TEST(OutputParser, StreamsArgumentsWhileGenerated) {
  OutputParser p(false, weather_tools());
  auto one = [](const std::vector<OutputDelta>& ds) {
    EXPECT_EQ(ds.size(), 1u);
    return ds.empty() ? OutputDelta{} : ds[0];
  };
  EXPECT_TRUE(p.push("<tool_call>\n<function=get_weather>\n<parameter=loc").empty());  // not a call yet
  const OutputDelta d1 = one(p.push("ation>\nPar"));
  EXPECT_EQ(d1.kind, OutputDelta::ToolCall);
  EXPECT_TRUE(d1.tool_start());
  EXPECT_EQ(d1.tool_name, "get_weather");
  EXPECT_EQ(d1.tool_index, 0);
  EXPECT_EQ(d1.arguments, R"({"location":"Par)");
  EXPECT_FALSE(d1.tool_end);
  EXPECT_EQ(p.tool_calls(), 1);
  const OutputDelta d2 = one(p.push("is \"centre\"\n"));  // the newline may be the value's trimmed last: held
  EXPECT_FALSE(d2.tool_start());
  EXPECT_EQ(d2.arguments, R"(is \"centre\")");
  // an integer: whole at its end
  EXPECT_EQ(one(p.push("</parameter>\n<parameter=days>\n3")).arguments, R"(","days":)");
  const auto d4 = p.push("\n</parameter>\n</function>\n</tool_call>\nDone");
  ASSERT_EQ(d4.size(), 2u);
  EXPECT_EQ(d4[0].arguments, "3}");
  EXPECT_TRUE(d4[0].tool_end);
  EXPECT_EQ(d4[1].kind, OutputDelta::Content);
  EXPECT_EQ(d4[1].text, "Done");
  EXPECT_TRUE(p.finish().empty());
  const std::string all = std::string(R"({"location":"Par)") + R"(is \"centre\")" + R"(","days":)" + "3}";
  EXPECT_EQ(json::parse(all), json::parse(R"({"location": "Paris \"centre\"", "days": 3})"));
}

// After a commit, markup that is not a parameter, a function or whitespace ends the open call; the rest of the
// body is content. Before a commit a malformed body is content whole (MalformedToolCallDegradesToContent).
TEST(OutputParser, BrokenMarkupAfterACommitEndsTheCall) {
  const std::string t1 = "pre <tool_call>\n<function=f>\n<parameter=a>\nx\n</parameter>\ngarbage\n</tool_call>\npost";
  Result r1 = run1(t1, false);
  ASSERT_EQ(r1.calls.size(), 1u);
  EXPECT_EQ(r1.calls[0].arguments, R"({"a":"x"})");
  EXPECT_EQ(r1.content, "pre garbage\n</tool_call>post");
  expect_split_invariant(t1, false, nullptr, r1);
  const std::string t2 = "<tool_call>\n<function=f>\n</function>\n<function=>\n</function>\n</tool_call>";
  Result r2 = run1(t2, false);
  ASSERT_EQ(r2.calls.size(), 1u);
  EXPECT_EQ(r2.calls[0].arguments, "{}");
  EXPECT_EQ(r2.content, "<function=>\n</function>\n</tool_call>");
  expect_split_invariant(t2, false, nullptr, r2);
  // A value's end tolerated as before: the next parameter, or </function> on a line of its own, or the block's end.
  const std::string t3 = "<tool_call>\n<function=f>\n<parameter=a>\nx\n<parameter=b>\ny\n</function>\n"
                         "<function=g>\n<parameter=c>\n\nz\n\n</tool_call>";
  Result r3 = run1(t3, false);
  ASSERT_EQ(r3.calls.size(), 2u);
  EXPECT_EQ(r3.calls[0].arguments, R"({"a":"x","b":"y"})");
  EXPECT_EQ(r3.calls[1].arguments, R"({"c":"\nz\n"})");
  EXPECT_EQ(r3.content, "");
  expect_split_invariant(t3, false, nullptr, r3);
}

// Every character a string value can hold comes out JSON-escaped, whatever the pieces.
TEST(OutputParser, StreamedStringsEscapeEveryCharacter) {
  const std::string v = "a\"b\\c\td\x01e/f\r\u00e9\u6f22\xf0\x9f\x98\x80 </param> \n\n<parameter x";
  const std::string text =
      "<tool_call>\n<function=run>\n<parameter=cmd>\n" + v + "\n</parameter>\n</function>\n</tool_call>";
  Result r = run1(text, false);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(json::parse(r.calls[0].arguments)["cmd"], v);
  EXPECT_GT(run({text.substr(0, 60), text.substr(60, 7), text.substr(67)}, false).calls[0].pieces, 1);
  expect_split_invariant(text, false, nullptr, r);
}

TEST(OutputParser, HoldsBackOnlyWhatMayBeATag) {
  OutputParser p(false);
  auto texts = [](const std::vector<OutputDelta>& ds) {
    std::string s;
    for (auto& d : ds) s += d.text;
    return s;
  };
  EXPECT_EQ(texts(p.push("Hello <")), "Hello ");
  EXPECT_EQ(texts(p.push("tool")), "");
  EXPECT_EQ(texts(p.push("box> x")), "<toolbox> x");
  EXPECT_EQ(texts(p.push("\n")), "");  // a newline may precede <tool_call>
  EXPECT_EQ(texts(p.push("y")), "\ny");
  EXPECT_EQ(texts(p.finish()), "");

  OutputParser q(true);
  auto d1 = q.push("abc</thi");
  ASSERT_EQ(d1.size(), 1u);
  EXPECT_EQ(d1[0].kind, OutputDelta::Reasoning);
  EXPECT_EQ(d1[0].text, "abc");
  auto d2 = q.push("nk>def");
  ASSERT_EQ(d2.size(), 1u);
  EXPECT_EQ(d2[0].kind, OutputDelta::Content);
  EXPECT_EQ(d2[0].text, "def");
}

TEST(OutputParser, Utf8SplitAcrossPushes) {
  OutputParser p(false);
  EXPECT_TRUE(p.push("\xE4\xBD").empty());
  auto d = p.push("\xA0!");
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].text, "\xE4\xBD\xA0!");
  // An incomplete character at the very end becomes U+FFFD.
  EXPECT_TRUE(p.push("\xF0\x9F").empty());
  auto f = p.finish();
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].text, "\xEF\xBF\xBD");
}

TEST(OutputParser, Utf8InsideToolCallsAndSplitEverywhere) {
  const std::string text =
      "<think>\n考虑一下 🤔\n</think>\n\n好的。\n<tool_call>\n<function=search>\n<parameter=query>\n東京の天気 ☀️\n</parameter>\n"
      "</function>\n</tool_call>";
  Result r = run1(text, false, weather_tools());
  EXPECT_EQ(r.reasoning, "考虑一下 🤔");
  EXPECT_EQ(r.content, "好的。");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(json::parse(r.calls[0].arguments)["query"], "東京の天気 ☀️");
  expect_split_invariant(text, false, weather_tools(), r);
}

TEST(OutputParser, RandomMarkupSoupNeverThrowsAndIsSplitInvariant) {
  const std::vector<std::string> parts = {"<think>", "</think>", "<tool_call>", "</tool_call>", "<function=f>",
                                          "</function>", "<parameter=a>", "</parameter>", "\n", "x", "{",
                                          "\"name\"", "<", "/", ">", "é", "1", "<tool", "_call>"};
  std::mt19937 rng(99);
  for (int iter = 0; iter < 60; ++iter) {
    std::string text;
    const int n = 1 + static_cast<int>(rng() % 14);
    for (int i = 0; i < n; ++i) text += parts[rng() % parts.size()];
    const bool in_reasoning = rng() % 2;
    Result want;
    ASSERT_NO_THROW(want = run1(text, in_reasoning)) << json(text).dump();
    expect_split_invariant(text, in_reasoning, nullptr, want);
  }
}

TEST(OutputParser, ParsesToolCallsRenderedByTheOfficialTemplate) {
  // chat_golden.json: assistant turns with tool_calls rendered by the Qwen3.6 template (jinja2).
  // Parsing the rendered assistant text must give back the request's calls.
  std::ifstream f(std::string(LILAC_SHARED_DIR) + "/fixtures/qwen3.6-template/chat_golden.json");
  ASSERT_TRUE(f.good());
  const json golden = json::parse(f);
  int checked = 0;
  for (const auto& c : golden["cases"]) {
    const json& req = c["request"];
    const std::string rendered = c["rendered"];
    size_t search = 0;
    for (const auto& m : req["messages"]) {
      if (m["role"] != "assistant") continue;
      const std::string open = "<|im_start|>assistant\n";
      const size_t b = rendered.find(open, search);
      ASSERT_NE(b, std::string::npos);
      const size_t e = rendered.find("<|im_end|>", b);
      ASSERT_NE(e, std::string::npos);
      search = e;
      if (!m.contains("tool_calls")) continue;
      const std::string text = rendered.substr(b + open.size(), e - b - open.size());
      const json tools = req.value("tools", json(nullptr));
      Result r = run1(text, false, tools);
      ASSERT_EQ(r.calls.size(), m["tool_calls"].size()) << text;
      for (size_t i = 0; i < r.calls.size(); ++i) {
        const json& want = m["tool_calls"][i]["function"];
        EXPECT_EQ(r.calls[i].name, want["name"]);
        json want_args = want["arguments"].is_string() ? json::parse(want["arguments"].get<std::string>())
                                                      : want["arguments"];
        EXPECT_EQ(json::parse(r.calls[i].arguments), want_args) << r.calls[i].arguments;
      }
      EXPECT_EQ(r.content, m["content"].is_string() ? m["content"].get<std::string>() : "");
      expect_split_invariant(text, false, tools, r);
      ++checked;
    }
  }
  EXPECT_GE(checked, 1);
}

// Issue 13, 7: a request without tools (or with tool_choice "none") got tool_calls when the text
// looked like a call. With tool calls off the markup is content, whatever the split.
TEST(OutputParser, ToolCallsOffKeepsMarkupAsContent) {
  const std::string text =
      "</think>\n\nSure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
      "</tool_call>\nDone.";
  for (size_t cut = 0; cut <= text.size(); cut += 7) {
    OutputParser p(/*in_reasoning=*/true, nullptr, lilac::qwen3_6_format(), /*tool_calls=*/false);
    Result r;
    collect(r, p.push(text.substr(0, cut)));
    collect(r, p.push(text.substr(cut)));
    collect(r, p.finish());
    EXPECT_TRUE(r.calls.empty()) << cut;
    EXPECT_EQ(p.tool_calls(), 0);
    EXPECT_EQ(r.content, text.substr(std::string("</think>\n\n").size())) << cut;
  }
  // The same text with tool calls on: one call (the control).
  Result on = run1(text, true);
  EXPECT_EQ(on.calls.size(), 1u);
}
