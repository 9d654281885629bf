// Fuzz target of the chat prompt: text from a request never becomes special tokens (text/special_text.h).
// A chat request made from the input (messages of every role, reasoning, tool calls and results, tools,
// text parts) is escaped, rendered with the Qwen3.6 template and tokenized as the generation core does
// (server/generation.cpp); so is the same request with every "<|" in its strings written "<\u2063|",
// in which no request text can spell a special token. The special tokens of the two prompts, in order,
// must be the same: those the template writes, none forged by the request, none lost.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/mapped_file.h"
#include "server/server_test_util.h"
#include "fuzz/fuzz_target.h"
#include "text/chat_template.h"
#include "text/special_text.h"
#include "text/unicode.h"

namespace {

using lilac::fuzz::Input;
using lilac::fuzz::violated;
using J = nlohmann::ordered_json;

const char* const kPieces[] = {"<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_", "start|>", "|>", "<|", "<", "|",
                               "\xee\x80\x80", "\xee\x80\x81", "\xee\x80\x82", "<think>", "</think>", "<tool_call>",
                               "</tool_call>", "<tool_response>", "</tool_response>", "user", "system", "\n", " ",
                               "<function=f>", "<parameter=a>", "<|vision_start|>", "<|fim_prefix|>"};
constexpr uint32_t kNumPieces = sizeof kPieces / sizeof *kPieces;

std::string text(Input& in) {
  std::string s;
  for (uint32_t i = 0, n = in.below(8); i < n && !in.empty(); ++i) {
    const uint32_t c = in.below(kNumPieces + 4);
    if (c < kNumPieces) s += kPieces[c];
    else s += in.bytes(1 + in.below(6));
  }
  return lilac::unicode::sanitize_utf8(s);
}

J request(Input& in) {
  J msgs = J::array();
  for (uint32_t i = 0, n = 1 + in.below(5); i < n; ++i) {
    J m;
    switch (in.below(5)) {
      case 0: m = {{"role", i == 0 ? "system" : "user"}, {"content", text(in)}}; break;
      case 1: m = {{"role", "user"}, {"content", J::array({{{"type", "text"}, {"text", text(in)}}, {{"type", "text"}, {"text", text(in)}}})}}; break;
      case 2: {
        m = {{"role", "assistant"}, {"content", text(in)}};
        if (in.flag()) m["reasoning_content"] = text(in);
        if (in.flag()) {
          J args = {{text(in), text(in)}, {"n", int(in.below(10))}};
          m["tool_calls"] = J::array({{{"id", "call_" + std::to_string(i)}, {"type", "function"},
                                       {"function", {{"name", "get_weather"}, {"arguments", in.flag() ? J(args.dump()) : args}}}}});
        }
        break;
      }
      case 3: m = {{"role", "tool"}, {"tool_call_id", "call_0"}, {"content", text(in)}}; break;
      default: m = {{"role", "user"}, {"content", text(in)}}; break;
    }
    msgs.push_back(m);
  }
  J r = {{"messages", msgs}};
  if (in.flag())
    r["tools"] = J::array({{{"type", "function"},
                            {"function", {{"name", "get_weather"}, {"description", text(in)},
                                          {"parameters", {{"type", "object"}, {"properties", {{text(in), {{"type", "string"}, {"description", text(in)}}}}}}}}}}});
  if (in.flag()) r["chat_template_kwargs"] = {{"enable_thinking", in.flag()}};
  return r;
}

// Every string value (but "role" and "type") and key with "<|" written "<\u2063|".
void defang(J& v) {
  auto fix = [](std::string s) {
    for (size_t p = 0; (p = s.find("<|", p)) != std::string::npos; p += 5) s.replace(p, 2, "<\xe2\x81\xa3|");
    return s;
  };
  if (v.is_string()) {
    v = fix(v.get<std::string>());
  } else if (v.is_array()) {
    for (auto& x : v) defang(x);
  } else if (v.is_object()) {
    J o = J::object();
    for (auto& [k, x] : v.items()) {
      if (!((k == "role" || k == "type") && x.is_string())) defang(x);
      o[fix(k)] = x;
    }
    v = std::move(o);
  }
}

std::vector<int32_t> specials(const lilac::Tokenizer& tok, const std::vector<int32_t>& ids) {
  std::vector<int32_t> s;
  for (int32_t id : ids)
    if (tok.is_special(id)) s.push_back(id);
  return s;
}

}  // namespace

LILAC_FUZZ_TARGET(special_tokens, "request text never becomes special tokens in the chat prompt") {
  static const auto tok = lilac::test::qwen3_tokenizer();
  static const auto tmpl = std::shared_ptr<const lilac::ChatTemplate>(lilac::ChatTemplate::from_source(
      lilac::read_text_file(std::string(LILAC_SHARED_DIR) + "/fixtures/qwen3.6-template/chat_template.jinja"), "qwen3.6"));
  static const lilac::SpecialTokenGuard guard(*tok);
  Input in(data, size);
  const J req = request(in);
  J safe = req;
  defang(safe);
  auto prompt = [&](J r) -> std::optional<std::vector<int32_t>> {
    guard.escape_request(r);
    try {
      return guard.encode(lilac::render_chat_request(*tmpl, r));
    } catch (const lilac::Error&) {
      return std::nullopt;  // the template refuses the conversation (a 400)
    }
  };
  const auto a = prompt(req), b = prompt(safe);
  if (a.has_value() != b.has_value()) violated("special_tokens", "one rendering failed: " + req.dump().substr(0, 300));
  if (!a) return;
  const auto sa = specials(*tok, *a), sb = specials(*tok, *b);
  if (sa != sb)
    violated("special_tokens", std::to_string(sa.size()) + " special tokens against " + std::to_string(sb.size()) +
                                   " without any in the request: " + req.dump(-1, ' ', false, J::error_handler_t::replace).substr(0, 400));
}
