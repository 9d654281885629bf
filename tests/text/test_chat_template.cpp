// Chat templates: the shared goldens (Qwen3's tokenizer_config.json template and the official Qwen3.6
// template, rendered by Python jinja2 the way Hugging Face does) must match byte for byte.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/mapped_file.h"
#include "text/chat_template.h"

namespace fs = std::filesystem;
using nlohmann::ordered_json;

namespace {

const std::string kShared = LILAC_SHARED_DIR;

ordered_json read_json(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ordered_json::parse(ss.str());
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct TempDir {
  fs::path path;
  TempDir() {
    std::random_device rd;
    path = fs::temp_directory_path() / ("lilac_chat_template_" + std::to_string(rd()) + std::to_string(rd()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream f(path / name, std::ios::binary);
    f << text;
  }
};

void check_golden(const std::string& model_dir, const std::string& golden_path, size_t min_cases) {
  auto tmpl = lilac::ChatTemplate::load(model_dir);
  ordered_json golden = read_json(golden_path);
  const auto& cases = golden.at("cases");
  ASSERT_GE(cases.size(), min_cases);
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    std::string expected = c.at("rendered").get<std::string>();
    std::string got;
    ASSERT_NO_THROW(got = lilac::render_chat_request(*tmpl, c.at("request"))) << "case " << i;
    EXPECT_EQ(got, expected) << "case " << i << ": " << c.at("request").dump();
  }
}

TEST(ChatTemplateGolden, Qwen3TokenizerConfigTemplate) {
  check_golden(kShared + "/fixtures/qwen3-tokenizer", kShared + "/fixtures/qwen3-tokenizer/chat_golden.json", 12);
}

TEST(ChatTemplateGolden, Qwen36OfficialTemplate) {
  check_golden(kShared + "/fixtures/qwen3.6-template", kShared + "/fixtures/qwen3.6-template/chat_golden.json", 9);
}

// The same golden, with the template copied into a model folder that also has a tokenizer_config.json:
// chat_template.jinja wins over the config's template.
TEST(ChatTemplateGolden, Qwen36TemplateFileWinsOverTokenizerConfig) {
  TempDir d;
  d.write("chat_template.jinja", read_text(kShared + "/fixtures/qwen3.6-template/chat_template.jinja"));
  d.write("tokenizer_config.json", read_text(kShared + "/fixtures/qwen3-tokenizer/tokenizer_config.json"));
  check_golden(d.path.string(), kShared + "/fixtures/qwen3.6-template/chat_golden.json", 9);
}

ordered_json qwen36_case(size_t i) {
  return read_json(kShared + "/fixtures/qwen3.6-template/chat_golden.json").at("cases").at(i);
}

TEST(ChatTemplate, Qwen36ArgumentsAsJsonStringAreParsed) {
  ordered_json c = qwen36_case(6);
  ordered_json req = c.at("request");
  auto& fn = req["messages"][1]["tool_calls"][0]["function"];
  ASSERT_TRUE(fn["arguments"].is_object());
  fn["arguments"] = fn["arguments"].dump();  // compact JSON string: {"city":"Paris","days":3,"metric":true}
  auto tmpl = lilac::ChatTemplate::load(kShared + "/fixtures/qwen3.6-template");
  EXPECT_EQ(lilac::render_chat_request(*tmpl, req), c.at("rendered").get<std::string>());
}

TEST(ChatTemplate, InvalidJsonArgumentsStayAString) {
  // Qwen3's template prints string arguments as they are.
  auto qwen3 = lilac::ChatTemplate::load(kShared + "/fixtures/qwen3-tokenizer");
  ordered_json req = ordered_json::parse(R"({"messages": [
      {"role": "user", "content": "x"},
      {"role": "assistant", "content": null,
       "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "not {json"}}]}],
      "add_generation_prompt": false})");
  EXPECT_EQ(lilac::render_chat_request(*qwen3, req),
            "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n"
            "{\"name\": \"f\", \"arguments\": not {json}\n</tool_call><|im_end|>\n");
  // Qwen3.6's template iterates over the arguments with |items, which jinja2 refuses for a string.
  auto qwen36 = lilac::ChatTemplate::load(kShared + "/fixtures/qwen3.6-template");
  try {
    lilac::render_chat_request(*qwen36, req);
    FAIL() << "expected an error";
  } catch (const lilac::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("Can only get item pairs from a mapping"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("chat_template.jinja:"), std::string::npos) << e.what();
  }
}

TEST(ChatTemplate, Qwen35TemplateParsesAndRenders) {
  auto tmpl = lilac::ChatTemplate::load(kShared + "/fixtures/qwen3.5-template");
  ordered_json req = ordered_json::parse(R"({"messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Hi"},
      {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "f",
        "arguments": {"x": 1, "s": "a", "l": [1, 2], "b": false}}}]},
      {"role": "tool", "content": "ok"}]})");
  // Rendered by jinja2 3.1.6 (Hugging Face settings). Note `b`: the 3.5 template prints non-container
  // values with |string, so Python's "False".
  EXPECT_EQ(lilac::render_chat_request(*tmpl, req),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
            "<think>\n\n</think>\n\n<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n<parameter=s>\na\n"
            "</parameter>\n<parameter=l>\n[1, 2]\n</parameter>\n<parameter=b>\nFalse\n</parameter>\n</function>\n"
            "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n<think>\n");
}

TEST(ChatTemplate, RaiseExceptionFromTemplate) {
  auto tmpl = lilac::ChatTemplate::load(kShared + "/fixtures/qwen3.6-template");
  auto expect_raise = [&](const char* request, const char* msg) {
    try {
      lilac::render_chat_request(*tmpl, ordered_json::parse(request));
      ADD_FAILURE() << "expected raise_exception: " << msg;
    } catch (const lilac::InputError& e) {  // the request is at fault
      EXPECT_NE(std::string(e.what()).find(msg), std::string::npos) << e.what();
    }
  };
  expect_raise(R"({"messages": []})", "No messages provided.");
  expect_raise(R"({"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]})",
               "System message must be at the beginning.");
  expect_raise(R"({"messages": [{"role": "robot", "content": "a"}, {"role": "user", "content": "b"}]})",
               "Unexpected message role.");
  expect_raise(R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
                                {"role": "system", "content": [{"type": "image", "image": "x"}]}]})",
               "System message must be at the beginning.");
}

TEST(ChatTemplate, DirectRenderErrorsAreTemplateErrors) {
  auto tmpl = lilac::ChatTemplate::from_source("a\n{{ raise_exception('nope') }}", "inline.jinja");
  try {
    tmpl->render(ordered_json::object());
    FAIL() << "expected an error";
  } catch (const lilac::InputError&) {
    FAIL() << "ChatTemplate::render reports template errors as lilac::Error";
  } catch (const lilac::Error& e) {
    EXPECT_EQ(std::string(e.what()), "inline.jinja:2:4: nope");
  }
}

TEST(ChatTemplate, KwargsBecomeVariablesAndGenerationPromptDefaultsOn) {
  auto tmpl = lilac::ChatTemplate::from_source(
      "{{ messages|length }}|{{ add_generation_prompt }}|{{ custom }}|{{ tools is none }}|{{ messages[0].content }}|"
      "{{ bos_token is defined }}",
      "inline");
  EXPECT_EQ(lilac::render_chat_request(
                *tmpl, ordered_json::parse(R"({"messages": [{"role": "user", "content": null}],
                                              "chat_template_kwargs": {"custom": [1, "x"]}})")),
            "1|True|[1, 'x']|True||False");
  EXPECT_EQ(lilac::render_chat_request(*tmpl, ordered_json::parse(R"({"messages": [{"role": "user"}],
                                              "add_generation_prompt": false, "tools": [{"type": "function"}]})")),
            "1|False||False||False");
}

// Issue 13, 7: an array of text parts failed on templates that expect a string. Text parts are flattened
// (concatenated, as templates that render parts do) before rendering.
TEST(ChatTemplate, TextPartsAreFlattenedToAString) {
  auto tmpl = lilac::ChatTemplate::from_source("{% for m in messages %}{{ m.content + '|' }}{% endfor %}", "inline");
  EXPECT_EQ(lilac::render_chat_request(*tmpl, ordered_json::parse(R"({"messages": [{"role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "c"}]}]})")),
            "ab|c|");
  // The official Qwen3.6 template renders parts and the flattened string alike.
  auto qwen = lilac::ChatTemplate::from_source(
      lilac::read_text_file(std::string(LILAC_SHARED_DIR) + "/fixtures/qwen3.6-template/chat_template.jinja"), "qwen3.6");
  EXPECT_EQ(lilac::render_chat_request(*qwen, ordered_json::parse(R"({"messages": [{"role": "user",
                "content": [{"type": "text", "text": "Hello, "}, {"type": "text", "text": "world"}]}]})")),
            lilac::render_chat_request(*qwen, ordered_json::parse(R"({"messages": [{"role": "user",
                "content": "Hello, world"}]})")));
}

TEST(ChatTemplate, BadRequestsAreInputErrors) {
  auto tmpl = lilac::ChatTemplate::from_source("{{ messages }}", "inline");
  const char* bad[] = {
      R"([])",
      R"({})",
      R"({"messages": {"role": "user"}})",
      R"({"messages": ["hi"]})",
      R"({"messages": [{"content": "no role"}]})",
      R"({"messages": [{"role": 3, "content": "x"}]})",
      R"({"messages": [{"role": "user", "content": 42}]})",
      R"({"messages": [{"role": "user", "content": {"text": "x"}}]})",
      R"({"messages": [{"role": "user", "content": ["x"]}]})",
      R"({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]})",
      R"({"messages": [{"role": "assistant", "content": "", "tool_calls": {"a": 1}}]})",
      R"({"messages": [{"role": "user", "content": "x"}], "tools": {"a": 1}})",
      R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": [1]})",
      R"({"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": "yes"})",
  };
  for (const char* b : bad) EXPECT_THROW(lilac::render_chat_request(*tmpl, ordered_json::parse(b)), lilac::InputError) << b;
}

TEST(ChatTemplate, DeeplyNestedRequestsAreRejected) {
  auto tmpl = lilac::ChatTemplate::from_source("{{ messages[0].extra|tojson }}", "inline");
  auto request = [](int depth) {
    std::string args;
    for (int k = 0; k < depth; ++k) args += "[";
    for (int k = 0; k < depth; ++k) args += "]";
    return ordered_json::parse(R"({"messages": [{"role": "user", "content": "", "extra": )" + args + "}]}");
  };
  EXPECT_EQ(lilac::render_chat_request(*tmpl, request(3)), "[[[]]]");
  EXPECT_THROW(lilac::render_chat_request(*tmpl, request(100000)), lilac::InputError);
}

TEST(ChatTemplateLoad, TokenizerConfigVariants) {
  {
    TempDir d;
    d.write("tokenizer_config.json", R"({"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>",
        "chat_template": [{"name": "tool_use", "template": "tool"},
                          {"name": "default", "template": "{{ bos_token }}|{{ eos_token }}|{{ messages[0].content }}\n"}]})");
    auto t = lilac::ChatTemplate::load(d.path.string());
    EXPECT_EQ(t->render(ordered_json::parse(R"({"messages": [{"role": "user", "content": "hi"}]})")), "<s>|</s>|hi");
  }
  {
    TempDir d;
    d.write("tokenizer_config.json", R"({"bos_token": null, "eos_token": "<|im_end|>", "chat_template": "[{{ bos_token }}][{{ eos_token }}]"})");
    d.write("chat_template.jinja", "file:{{ eos_token }}");
    auto t = lilac::ChatTemplate::load(d.path.string());
    EXPECT_EQ(t->render(ordered_json::object()), "file:<|im_end|>");
    fs::remove(d.path / "chat_template.jinja");
    EXPECT_EQ(lilac::ChatTemplate::load(d.path.string())->render(ordered_json::object()), "[][<|im_end|>]");
  }
  {
    TempDir d;
    EXPECT_THROW(lilac::ChatTemplate::load(d.path.string()), lilac::Error);
    d.write("tokenizer_config.json", R"({"eos_token": "x"})");
    EXPECT_THROW(lilac::ChatTemplate::load(d.path.string()), lilac::Error);
    d.write("tokenizer_config.json", R"({"chat_template": [{"name": "other", "template": "x"}]})");
    EXPECT_THROW(lilac::ChatTemplate::load(d.path.string()), lilac::Error);
    d.write("tokenizer_config.json", R"({"chat_template": "{% if %}"})");
    EXPECT_THROW(lilac::ChatTemplate::load(d.path.string()), lilac::Error);
  }
}

}  // namespace
