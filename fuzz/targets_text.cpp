// Fuzz targets of the text layer: the tokenizer, the streaming detokenizer, the output parser.
#include <string>
#include <vector>

#include "server/server_test_util.h"
#include "fuzz/fuzz_target.h"
#include "text/detokenizer.h"
#include "text/output_parser.h"
#include "text/unicode.h"

namespace {

using lilac::fuzz::Input;
using lilac::fuzz::violated;

std::string show(const std::string& s) {
  std::string o;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      o += char(c);
    } else {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      o += b;
    }
  }
  return o;
}

}  // namespace

// Any bytes, special-token text included: encode then decode gives the text back (invalid UTF-8 as
// U+FFFD, NFC-normalized as the tokenizer's normalizer does), and every id is in the vocabulary.
LILAC_FUZZ_TARGET(tokenizer, "decode(encode(text)) == NFC(sanitized text); ids in range") {
  const auto tok = lilac::test::qwen3_tokenizer();
  Input in(data, size);
  const bool special = in.flag();
  const std::string text = in.rest();
  const std::vector<int32_t> ids = tok->encode(text, special);
  for (int32_t id : ids)
    if (id < 0 || id >= tok->vocab_size()) violated("tokenizer", "id " + std::to_string(id) + " out of range");
  const std::string clean = lilac::unicode::sanitize_utf8(text);
  const std::string want = lilac::unicode::nfc(clean);
  if (clean != want) return;  // normalization applies per piece, around special tokens: not a simple function
  const std::string back = tok->decode(ids);
  if (back != want) violated("tokenizer", "round trip of \"" + show(text) + "\" gave \"" + show(back) + "\"");
}

// Random ids (any, special included) streamed one by one: the chunks are valid UTF-8 and, without stop
// strings, add up to the whole decode sanitized; with stop strings, to a prefix of it that ends where
// the matched stop string begins.
LILAC_FUZZ_TARGET(detokenizer, "streamed chunks == sanitized whole decode, cut at the first stop string") {
  const auto tok = lilac::test::qwen3_tokenizer();
  Input in(data, size);
  const bool skip_special = in.flag();
  const int n_stops = int(in.below(3));
  std::vector<int32_t> ids;
  while (in.left() >= 3 && ids.size() < 64) ids.push_back(int32_t(((uint32_t(in.byte()) << 16) | (uint32_t(in.byte()) << 8) | in.byte()) % uint32_t(tok->vocab_size() + 8)));
  std::vector<int32_t> known;  // the detokenizer decodes unknown ids to nothing; decode() refuses them
  for (int32_t id : ids)
    if (id < tok->vocab_size()) known.push_back(id);
  const std::string whole = lilac::unicode::sanitize_utf8(tok->decode(known, skip_special));
  std::vector<std::string> stops;
  for (int i = 0; i < n_stops && !whole.empty(); ++i) {
    // a piece of the text (so that it occurs), cut on code-point boundaries
    size_t a = (size_t(i) * 7919 + ids.size()) % whole.size(), len = 1 + (size_t(i) * 31 + whole.size()) % 6;
    while (a > 0 && (whole[a] & 0xC0) == 0x80) --a;
    size_t b = std::min(whole.size(), a + len);
    while (b < whole.size() && (whole[b] & 0xC0) == 0x80) ++b;
    stops.push_back(whole.substr(a, b - a));
  }
  lilac::StreamDetokenizer d(*tok, stops, skip_special);
  std::string got;
  for (int32_t id : ids) {
    if (d.stopped()) break;
    std::string c = d.push(id);
    if (!lilac::unicode::is_valid_utf8(c)) violated("detokenizer", "chunk not valid UTF-8: " + show(c));
    got += c;
  }
  if (!d.stopped()) got += d.finish();
  if (!lilac::unicode::is_valid_utf8(got)) violated("detokenizer", "text not valid UTF-8");
  if (whole.compare(0, got.size(), got) != 0)
    violated("detokenizer", "streamed \"" + show(got) + "\" is not a prefix of \"" + show(whole) + "\"");
  if (d.stopped()) {
    if (whole.compare(got.size(), d.matched_stop().size(), d.matched_stop()) != 0)
      violated("detokenizer", "stopped on \"" + show(d.matched_stop()) + "\" which does not follow the text");
  } else {
    if (got != whole) violated("detokenizer", "streamed \"" + show(got) + "\" != \"" + show(whole) + "\"");
    for (const auto& s : stops)
      if (!s.empty() && whole.find(s) != std::string::npos)
        violated("detokenizer", "stop string \"" + show(s) + "\" occurs but the stream did not stop");
  }
}

namespace {

struct Parsed {
  std::string content, reasoning;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments (a call's pieces joined)
  bool open = false;                                       // the last call has not ended
};

void collect(Parsed& p, const std::vector<lilac::OutputDelta>& ds) {
  for (const auto& d : ds) {
    if (d.kind == lilac::OutputDelta::ToolCall) {
      if (!lilac::unicode::is_valid_utf8(d.arguments) || !lilac::unicode::is_valid_utf8(d.tool_name))
        violated("output_parser", "tool call not valid UTF-8");
      if (d.tool_start()) {
        if (p.open) violated("output_parser", "a call started before the previous one ended");
        if (d.tool_index != int(p.calls.size())) violated("output_parser", "tool-call indexes out of order");
        p.calls.emplace_back(d.tool_name, d.arguments);
      } else {
        if (!p.open || d.tool_index + 1 != int(p.calls.size()))
          violated("output_parser", "an argument piece of no open call");
        p.calls.back().second += d.arguments;
      }
      p.open = !d.tool_end;
      continue;
    }
    if (p.open) violated("output_parser", "text inside an open tool call");
    if (!lilac::unicode::is_valid_utf8(d.text)) violated("output_parser", "delta not valid UTF-8: " + show(d.text));
    (d.kind == lilac::OutputDelta::Reasoning ? p.reasoning : p.content) += d.text;
  }
}

const nlohmann::ordered_json& fuzz_tools() {
  static const auto t = nlohmann::ordered_json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
                     "tags": {"type": "array", "items": {"type": "string"}}}}}},
    {"type": "function", "function": {"name": "run", "parameters": {"type": "object",
      "properties": {"cmd": {"type": "string"}, "n": {"type": "number"}, "opts": {"type": "object"}}}}}])");
  return t;
}

}  // namespace

// Generated text (adversarial: the model can be prompted to write anything) parsed whole and in random
// pieces: the same content, reasoning and tool calls, all valid UTF-8, and never an exception.
LILAC_FUZZ_TARGET(output_parser, "the parse of generated text never depends on how it is split") {
  Input in(data, size);
  const bool reasoning = in.flag(), tools = in.flag(), calls_on = in.flag();
  const uint8_t cut_seed = in.byte();
  std::string text = in.rest();
  // Make the markup likely: bytes 0x01..0x06 stand for the tags.
  static const char* const tags[] = {"", "<think>", "</think>", "<tool_call>", "</tool_call>", "<function=", "<parameter="};
  std::string t;
  for (char c : text) {
    if (c >= 1 && c <= 6) t += tags[int(c)];
    else t += c;
  }
  const nlohmann::ordered_json none;
  lilac::OutputParser whole(reasoning, tools ? fuzz_tools() : none, lilac::qwen3_6_format(), calls_on);
  lilac::OutputParser split(reasoning, tools ? fuzz_tools() : none, lilac::qwen3_6_format(), calls_on);
  Parsed a, b;
  collect(a, whole.push(t));
  collect(a, whole.finish());
  uint32_t r = cut_seed * 2654435761u + 1;
  for (size_t i = 0; i < t.size();) {
    r = r * 1664525u + 1013904223u;
    const size_t n = 1 + (r >> 24) % 9;
    collect(b, split.push(std::string_view(t).substr(i, n)));
    i += n;
  }
  collect(b, split.finish());
  if (a.open || b.open) violated("output_parser", "a tool call never ended");
  if (a.content != b.content) violated("output_parser", "content differs: \"" + show(a.content) + "\" vs \"" + show(b.content) + "\"");
  if (a.reasoning != b.reasoning) violated("output_parser", "reasoning differs: \"" + show(a.reasoning) + "\" vs \"" + show(b.reasoning) + "\"");
  if (a.calls != b.calls) violated("output_parser", "tool calls differ (" + std::to_string(a.calls.size()) + " vs " + std::to_string(b.calls.size()) + ")");
  for (const auto& [name, args] : a.calls)
    if (!nlohmann::json::accept(args)) violated("output_parser", "tool-call arguments are not JSON: " + show(args));
}
