// Incremental parser of Qwen3.6 output: reasoning, content and tool calls (markup: text/model_format.h).
//
// Behaviour choices (the result depends only on the whole text, never on how it was split):
// - Reasoning: opened by the prompt (in_reasoning) or by "<think>" at the very first byte of the
//   output; closed by "</think>". Inside reasoning no other tag is recognised. Unterminated
//   reasoning stays reasoning at finish().
// - Newlines next to markup are the format's, not the model's text: newlines right after
//   <think>, </think> and </tool_call> are dropped, and so are newlines right before </think> and
//   <tool_call>. (So trailing newlines of content/reasoning are held until the next non-newline
//   character shows whether markup follows; at finish() they are emitted.) A "<tool_call>" that turns
//   out to open no call is content with the newlines before it.
// - "<tool_call>" in content starts a tool call (only when tool calls are enabled: a request without tools
//   gets the text as content). Its body is either streamed or buffered:
//   * Streamed (the XML form): once the body holds <function=NAME> and, after it, a complete
//     <parameter=ARG> or </function>, the call is committed: its first ToolCall delta carries the id, the
//     name and the start of the arguments JSON, and the arguments follow as they are generated (string
//     values character by character, JSON-escaped; values typed by the schema as one piece when their
//     </parameter> arrives), the last delta marked tool_end. A call's argument deltas concatenate to the
//     compact JSON object the buffered parse gives ({"a":"x","n":3}); a repeated parameter name is
//     streamed twice (JSON.parse keeps the last). Several functions in one body are several calls. What
//     breaks the XML after a commit (text that is not a parameter, a function or whitespace) ends the open
//     call and the rest of the body, </tool_call> included, is content. A body cut off (</tool_call> never
//     came, or a missing </function> / </parameter>) still ends its call with valid JSON: the value so far.
//   * Buffered (anything else: Qwen3's JSON form {"name": ..., "arguments": {...}}, or markup that never
//     reaches a commit): kept until "</tool_call>", then parsed: the XML form (several functions allowed) or
//     the JSON form. A body that parses yields one complete ToolCall delta per function (start and end);
//     otherwise the raw markup is emitted as content. An unterminated body at finish() is accepted when it
//     is complete (all functions closed / valid JSON), else emitted as content.
//   * No call at all: before a commit, a body whose first text (after whitespace) is neither <function= nor
//     "{", or one where another "<tool_call>" comes first, makes the "<tool_call>" content at once (a tag
//     mentioned in prose must neither swallow a later real call nor stall the stream until </tool_call>):
//     the body is read again as content, so the block restarts at that other "<tool_call>".
// - Parameter values: one leading and one trailing newline are trimmed; typed by the tool's JSON
//   schema (parameters.properties.ARG.type, a string or list of types, or anyOf/oneOf types):
//   integer/number/boolean/object/array/null values are parsed as JSON when valid and of an
//   allowed type, else kept as strings. No schema for the argument: string.
// - Text is sanitized to valid UTF-8 (U+FFFD) and an incomplete UTF-8 tail is held back, so every
//   delta is valid UTF-8.
#include "text/output_parser.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>

#include "text/bounded_json.h"
#include "text/json_dump.h"
#include "text/unicode.h"

namespace lilac {

namespace {

using ojson = nlohmann::ordered_json;

bool starts_with_at(std::string_view s, size_t pos, std::string_view p) {
  return s.size() >= pos + p.size() && s.compare(pos, p.size(), p) == 0;
}

// Longest k < tag.size() such that s ends with tag[0..k).
size_t partial_tag_suffix(std::string_view s, std::string_view tag) {
  const size_t maxk = std::min(tag.size() - 1, s.size());
  for (size_t k = maxk; k > 0; --k)
    if (s.compare(s.size() - k, k, tag.substr(0, k)) == 0) return k;
  return 0;
}

std::string_view rstrip_newlines(std::string_view s) {
  while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
}

bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string_view trim_ws(std::string_view s) {
  while (!s.empty() && is_ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ws(s.back())) s.remove_suffix(1);
  return s;
}

struct ParsedCall {
  std::string name;
  std::string arguments;  // JSON text
};

}  // namespace

struct OutputParser::Impl {
  enum State { Content, Reasoning, Tool } state = Content;
  bool at_start = true;  // nothing consumed yet: a leading "<think>" opens reasoning
  bool skip_nl = false;  // drop newlines at the start of what follows
  std::string raw;       // incomplete UTF-8 tail
  std::string buf;       // unprocessed text
  size_t tag_nl = 0;     // newlines dropped right before the tag scan_text found last (content again if the
                         // "<tool_call>" turns out to open no call)
  const FormatMarkup& mk;
  ojson tools;
  bool calls_enabled = true;
  int n_calls = 0;
  // The open tool block (state Tool): Pending until its body commits to a streamed call or proves not to.
  enum ToolMode { Pending, Buffered, Streaming, Degraded } tmode = Pending;
  enum ToolPart { Params, Value, AfterFunction } tpart = Params;
  struct OpenCall {
    int index = -1;
    std::string name;
    bool any_arg = false, open = false;
  } call;
  std::string arg;            // the parameter whose value streams
  bool value_string = true;   // its value streams as a JSON string (else typed by the schema at its end)
  bool value_fresh = true;    // nothing of its value seen yet (its one leading newline not yet dropped)
  std::string value;          // a typed value so far
  std::string nl_param, nl_fclose;  // "\n" + parameter_open / function_close: a value's tolerated ends
  std::mt19937_64 rng;
  std::vector<OutputDelta> out;

  Impl(bool in_reasoning, const ojson& t, const ModelFormat& format) : mk(format.markup()), tools(t) {
    nl_param.assign(1, '\n').append(mk.parameter_open);
    nl_fclose.assign(1, '\n').append(mk.function_close);
    static std::atomic<uint64_t> counter{0};
    std::random_device rd;
    rng.seed((static_cast<uint64_t>(rd()) << 32) ^ rd() ^
             static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
             (counter.fetch_add(1) * 0x9E3779B97F4A7C15ull));
    if (in_reasoning) {
      state = Reasoning;
      at_start = false;
      skip_nl = true;
    }
  }

  void emit(OutputDelta::Kind kind, std::string_view text) {
    if (text.empty()) return;
    if (!out.empty() && out.back().kind == kind && kind != OutputDelta::ToolCall) {
      out.back().text.append(text);
      return;
    }
    OutputDelta d;
    d.kind = kind;
    d.text = std::string(text);
    out.push_back(std::move(d));
  }

  std::string new_call_id() {
    static constexpr char kAlnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    std::string id = "call_";
    for (int i = 0; i < 24; ++i) id.push_back(kAlnum[rng() % 62]);
    return id;
  }

  // ---- schema typing ---------------------------------------------------------------------------
  const ojson* param_schema(const std::string& fn, const std::string& arg) const {
    if (!tools.is_array()) return nullptr;
    for (const auto& t : tools) {
      if (!t.is_object()) continue;
      const ojson* f = &t;
      if (auto it = t.find("function"); it != t.end() && it->is_object()) f = &*it;
      auto name = f->find("name");
      if (name == f->end() || !name->is_string() || name->get<std::string>() != fn) continue;
      auto params = f->find("parameters");
      if (params == f->end() || !params->is_object()) return nullptr;
      auto props = params->find("properties");
      if (props == params->end() || !props->is_object()) return nullptr;
      auto p = props->find(arg);
      return p == props->end() ? nullptr : &*p;
    }
    return nullptr;
  }

  static void collect_types(const ojson& s, std::vector<std::string>& types) {
    if (!s.is_object()) return;
    if (auto t = s.find("type"); t != s.end()) {
      if (t->is_string()) types.push_back(t->get<std::string>());
      if (t->is_array())
        for (const auto& x : *t)
          if (x.is_string()) types.push_back(x.get<std::string>());
    }
    for (const char* k : {"anyOf", "oneOf"})
      if (auto a = s.find(k); a != s.end() && a->is_array())
        for (const auto& sub : *a) collect_types(sub, types);
  }

  static bool type_ok(const ojson& v, const std::string& t) {
    if (t == "integer") return v.is_number_integer();
    if (t == "number") return v.is_number();
    if (t == "boolean") return v.is_boolean();
    if (t == "object") return v.is_object();
    if (t == "array") return v.is_array();
    if (t == "null") return v.is_null();
    return false;
  }

  // Whether the tool's schema types the argument as anything but a string (its types then in `types`).
  bool typed_param(const std::string& fn, const std::string& arg, std::vector<std::string>& types) const {
    const ojson* schema = param_schema(fn, arg);
    if (!schema) return false;
    collect_types(*schema, types);
    bool non_string = false;
    for (const auto& t : types) non_string |= (t != "string");
    return non_string;
  }

  ojson typed_value(const std::string& fn, const std::string& arg, const std::string& value) const {
    std::vector<std::string> types;
    if (!typed_param(fn, arg, types)) return ojson(value);
    std::string_view v = trim_ws(value);
    JsonParseResult pr = parse_bounded_json(v);
    ojson parsed = pr.ok() ? std::move(pr.value) : ojson(ojson::value_t::discarded);
    if (parsed.is_discarded()) {
      if (v == "True") parsed = true;
      else if (v == "False") parsed = false;
      else if (v == "None") parsed = nullptr;
    }
    if (!parsed.is_discarded())
      for (const auto& t : types)
        if (type_ok(parsed, t)) return parsed;
    return ojson(value);
  }

  // ---- tool call bodies --------------------------------------------------------------------------
  // A call's arguments (buffered, or streamed piece by piece) are compact JSON text: dump_json, invalid UTF-8 replaced.

  // XML form. `closed`: the </tool_call> was seen (a missing final </function> is then tolerated).
  bool parse_xml(std::string_view body, bool closed, std::vector<ParsedCall>& calls) const {
    size_t pos = 0;
    auto skip_ws = [&] {
      while (pos < body.size() && is_ws(body[pos])) ++pos;
    };
    skip_ws();
    if (!starts_with_at(body, pos, mk.function_open)) return false;
    while (pos < body.size()) {
      if (!starts_with_at(body, pos, mk.function_open)) return false;
      pos += mk.function_open.size();
      const size_t gt = body.find('>', pos);
      if (gt == std::string_view::npos) return false;
      const std::string name(trim_ws(body.substr(pos, gt - pos)));
      if (name.empty() || name.find('\n') != std::string::npos) return false;
      pos = gt + 1;
      ojson args = ojson::object();
      bool fn_closed = false;
      while (true) {
        skip_ws();
        if (pos >= body.size()) break;
        if (starts_with_at(body, pos, mk.function_close)) {
          pos += mk.function_close.size();
          fn_closed = true;
          break;
        }
        if (!starts_with_at(body, pos, mk.parameter_open)) return false;
        pos += mk.parameter_open.size();
        const size_t pgt = body.find('>', pos);
        if (pgt == std::string_view::npos) return false;
        const std::string arg(trim_ws(body.substr(pos, pgt - pos)));
        if (arg.empty()) return false;
        pos = pgt + 1;
        // The value ends at </parameter>; tolerate a missing one before the next tag.
        size_t end = body.find(mk.parameter_close, pos);
        size_t next = std::min(body.find(std::string("\n") + std::string(mk.parameter_open), pos),
                               body.find(std::string("\n") + std::string(mk.function_close), pos));
        size_t after;
        if (end != std::string_view::npos && end <= next) {
          after = end + mk.parameter_close.size();
        } else if (next != std::string_view::npos) {
          end = next;
          after = next;
        } else {
          if (!closed) return false;
          end = body.size();
          after = body.size();
        }
        std::string_view v = body.substr(pos, end - pos);
        if (!v.empty() && v.front() == '\n') v.remove_prefix(1);
        if (!v.empty() && v.back() == '\n') v.remove_suffix(1);
        args[arg] = typed_value(name, arg, std::string(v));
        pos = after;
      }
      if (!fn_closed && !closed) return false;
      calls.push_back({name, dump_json(args)});
      skip_ws();
    }
    return !calls.empty();
  }

  static bool parse_json_call(std::string_view body, std::vector<ParsedCall>& calls) {
    std::string_view b = trim_ws(body);
    if (b.empty() || b.front() != '{') return false;
    JsonParseResult pj = parse_bounded_json(b);
    if (!pj.ok() || !pj.value.is_object()) return false;
    const ojson& j = pj.value;
    auto name = j.find("name");
    if (name == j.end() || !name->is_string() || name->get<std::string>().empty()) return false;
    ojson args = ojson::object();
    auto a = j.find("arguments");
    if (a == j.end()) a = j.find("parameters");
    if (a != j.end()) {
      if (a->is_object()) {
        args = *a;
      } else if (a->is_string()) {
        const std::string s = a->get<std::string>();
        JsonParseResult p = parse_bounded_json(s);
        if (!p.ok() || !p.value.is_object()) return false;
        args = std::move(p.value);
      } else if (!a->is_null()) {
        return false;
      }
    }
    calls.push_back({name->get<std::string>(), dump_json(args)});
    return true;
  }

  void handle_tool(std::string_view body, bool closed) {
    std::vector<ParsedCall> calls;
    bool ok = parse_xml(body, closed, calls);
    if (!ok) {
      calls.clear();
      ok = parse_json_call(body, calls);
    }
    if (!ok) {
      std::string text(tag_nl, '\n');
      text.append(mk.tool_open);
      text.append(body);
      if (closed) text.append(mk.tool_close);
      emit(OutputDelta::Content, text);
      return;
    }
    for (auto& c : calls) {
      OutputDelta d;
      d.kind = OutputDelta::ToolCall;
      d.tool_index = n_calls++;
      d.tool_id = new_call_id();
      d.tool_name = std::move(c.name);
      d.arguments = std::move(c.arguments);
      d.tool_end = true;
      out.push_back(std::move(d));
    }
  }

  // ---- streamed calls ----------------------------------------------------------------------------

  // The next piece of the open call's arguments (merged into the previous delta when that is the same call's).
  void emit_call(std::string_view piece, bool start, bool end) {
    if (!start && !out.empty() && out.back().kind == OutputDelta::ToolCall && out.back().tool_index == call.index &&
        !out.back().tool_end) {
      out.back().arguments.append(piece);
      out.back().tool_end = end;
      return;
    }
    OutputDelta d;
    d.kind = OutputDelta::ToolCall;
    d.tool_index = call.index;
    if (start) {
      d.tool_id = new_call_id();
      d.tool_name = call.name;
    }
    d.arguments = std::string(piece);
    d.tool_end = end;
    out.push_back(std::move(d));
  }

  void open_call(std::string name) {
    call = OpenCall{n_calls++, std::move(name), false, true};
    tpart = Params;
    emit_call("{", true, false);
  }

  void close_call() {
    if (!call.open) return;
    call.open = false;
    emit_call("}", false, true);
  }

  void open_value(std::string a) {
    std::vector<std::string> types;
    value_string = !typed_param(call.name, a, types);
    std::string piece = call.any_arg ? "," : "";
    piece += dump_json(ojson(a)) + ":";
    if (value_string) piece += '"';
    call.any_arg = true;
    arg = std::move(a);
    value.clear();
    value_fresh = true;
    tpart = Value;
    emit_call(piece, false, false);
  }

  // Text of the open value: a string's escaped characters at once, a typed value's kept for its end.
  void value_text(std::string_view t) {
    if (t.empty()) return;
    if (!value_string) {
      value.append(t);
      return;
    }
    const std::string q = dump_json(ojson(std::string(t)));
    emit_call(std::string_view(q).substr(1, q.size() - 2), false, false);
  }

  void close_value() {
    emit_call(value_string ? std::string("\"") : dump_json(typed_value(call.name, arg, value)), false, false);
    tpart = Params;
  }

  // Before a commit: 1 when the body v (complete when `end`) opens with <function=NAME> followed by a complete
  // <parameter=ARG> or </function> (hdr: where NAME's ">" ends), 0 when more text may decide, -1 when it never
  // will (the body is then buffered and parsed whole, as parse_xml / parse_json_call read it).
  int header(std::string_view v, bool end, size_t& hdr, std::string& name) const {
    size_t p = 0;
    while (p < v.size() && is_ws(v[p])) ++p;
    const std::string_view r = v.substr(p);
    if (!starts_with_at(r, 0, mk.function_open)) return !end && mk.function_open.substr(0, r.size()) == r ? 0 : -1;
    p += mk.function_open.size();
    const size_t gt = v.find('>', p);
    if (gt == std::string_view::npos) return end ? -1 : 0;
    name = std::string(trim_ws(v.substr(p, gt - p)));
    if (name.empty() || name.find('\n') != std::string::npos) return -1;
    size_t q = gt + 1;
    while (q < v.size() && is_ws(v[q])) ++q;
    const std::string_view rest = v.substr(q);
    hdr = gt + 1;
    if (starts_with_at(rest, 0, mk.function_close)) return 1;
    if (starts_with_at(rest, 0, mk.parameter_open)) {
      const size_t pgt = rest.find('>', mk.parameter_open.size());
      if (pgt == std::string_view::npos) return end ? -1 : 0;
      return trim_ws(rest.substr(mk.parameter_open.size(), pgt - mk.parameter_open.size())).empty() ? -1 : 1;
    }
    const bool may = mk.function_close.substr(0, std::min(rest.size(), mk.function_close.size())) == rest ||
                     mk.parameter_open.substr(0, std::min(rest.size(), mk.parameter_open.size())) == rest;
    return !end && may ? 0 : -1;
  }

  // Before a commit: whether the block is no call after all, its body v being one that cannot start a call
  // (after whitespace neither <function= nor "{"), or one holding another "<tool_call>" before the header
  // commits (the block then starts again there). Each reads only the text up to where it decides, so every
  // split of the text decides alike.
  bool no_call(std::string_view v) const {
    size_t w = 0;
    while (w < v.size() && is_ws(v[w])) ++w;
    // The JSON form: its strings may hold anything, the tag included (a call whose arguments mentioned it was
    // demoted to content); a tag outside them restarts the block.
    if (w < v.size() && v[w] == '{') {
      bool in_str = false, esc = false;
      for (size_t i = w; i < v.size(); ++i) {
        if (in_str) {
          if (esc) esc = false;
          else if (v[i] == '\\') esc = true;
          else if (v[i] == '"') in_str = false;
        } else if (v[i] == '"') {
          in_str = true;
          esc = false;
        } else if (starts_with_at(v, i, mk.tool_open)) {
          return true;
        }
      }
      return false;
    }
    if (const size_t t = v.find(mk.tool_open); t != std::string_view::npos) {
      size_t hdr = 0;
      std::string name;
      if (header(v.substr(0, t + mk.tool_open.size()), false, hdr, name) != 1) return true;
    }
    const std::string_view r = v.substr(w, mk.function_open.size());
    return !r.empty() && mk.function_open.substr(0, r.size()) != r;
  }

  // The open block is no call (no_call): its "<tool_call>" (and the newlines before it) is content and its body
  // is read again as content, where a later "<tool_call>" opens the next block.
  bool demote() {
    emit(OutputDelta::Content, std::string(tag_nl, '\n').append(mk.tool_open));
    state = Content;
    tmode = Pending;
    return true;
  }

  // The markup that breaks a streamed body: the open call ends, the rest of the body is content.
  void degrade() {
    close_call();
    tmode = Degraded;
  }

  // One step of a streamed body v (all of it when `end`) from p; false when it waits for more text or is done.
  bool stream_step(std::string_view v, size_t& p, bool end) {
    const size_t lim = v.size();
    auto is_prefix = [](std::string_view s, std::string_view tag) {
      return s.size() < tag.size() && tag.substr(0, s.size()) == s;
    };
    if (tpart == Value) {
      const size_t t1 = v.find(mk.parameter_close, p), t2 = v.find(nl_param, p), t3 = v.find(nl_fclose, p);
      const size_t e = std::min({t1, t2, t3});
      size_t stop = e;
      if (e == std::string_view::npos) {
        stop = lim;
        if (!end) {  // hold back what may start an end of the value, and a newline before it (trimmed then)
          const std::string_view rest = v.substr(p);
          size_t hold = std::max({partial_tag_suffix(rest, mk.parameter_close), partial_tag_suffix(rest, nl_param),
                                  partial_tag_suffix(rest, nl_fclose)});
          if (hold < rest.size() && rest[rest.size() - hold - 1] == '\n') ++hold;
          stop = lim - hold;
        }
      }
      std::string_view chunk = v.substr(p, stop - p);
      p = stop;
      if (value_fresh && !chunk.empty()) {
        if (chunk.front() == '\n') chunk.remove_prefix(1);
        value_fresh = false;
      }
      const bool last = e != std::string_view::npos || end;
      if (last && !chunk.empty() && chunk.back() == '\n') chunk.remove_suffix(1);
      value_text(chunk);
      if (!last) return false;
      close_value();
      if (e != std::string_view::npos && e == t1) p = e + mk.parameter_close.size();
      return true;
    }
    while (p < lim && is_ws(v[p])) ++p;
    if (p == lim) {
      if (end && tpart == Params) close_call();
      return false;
    }
    const std::string_view rest = v.substr(p);
    const std::string_view open = tpart == Params ? mk.parameter_open : mk.function_open;
    if (starts_with_at(rest, 0, open)) {
      const size_t gt = rest.find('>', open.size());
      if (gt == std::string_view::npos) {
        if (end) degrade();
        return end;
      }
      std::string name(trim_ws(rest.substr(open.size(), gt - open.size())));
      if (name.empty() || (tpart == AfterFunction && name.find('\n') != std::string::npos)) {
        degrade();
        return true;
      }
      p += gt + 1;
      if (tpart == Params) open_value(std::move(name));
      else open_call(std::move(name));
      return true;
    }
    if (tpart == Params && starts_with_at(rest, 0, mk.function_close)) {
      p += mk.function_close.size();
      close_call();
      tpart = AfterFunction;
      return true;
    }
    if (!end && (is_prefix(rest, open) || (tpart == Params && is_prefix(rest, mk.function_close)))) return false;
    degrade();
    return true;
  }

  // The end of the tool block at buf[lim] (its </tool_call> when closed).
  bool end_block(bool closed, size_t lim) {
    if (closed) {
      buf.erase(0, lim + mk.tool_close.size());
      skip_nl = true;
    } else {
      buf.clear();
    }
    state = Content;
    tmode = Pending;
    return true;
  }

  // The open tool block: streams or buffers its body; true when the block ended (state is Content again).
  bool step_tool(bool final) {
    const size_t close = buf.find(mk.tool_close);
    const bool closed = close != std::string::npos, end = closed || final;
    const size_t lim = closed ? close : final ? buf.size() : buf.size() - partial_tag_suffix(buf, mk.tool_close);
    const std::string_view v(buf.data(), lim);
    size_t p = 0;
    if ((tmode == Pending || tmode == Buffered) && no_call(v)) return demote();
    if (tmode == Pending) {
      std::string name;
      const int h = header(v, end, p, name);
      if (h == 0) return false;
      if (h < 0) {
        tmode = Buffered;
        p = 0;
      } else {
        tmode = Streaming;
        open_call(std::move(name));
      }
    }
    if (tmode == Buffered) {
      if (!end) return false;
      handle_tool(v, closed);
      return end_block(closed, lim);
    }
    while (tmode == Streaming && stream_step(v, p, end)) {
    }
    if (tmode == Degraded) {
      emit(OutputDelta::Content, v.substr(p));
      p = lim;
    }
    if (end) {
      close_call();
      if (closed && tmode == Degraded) emit(OutputDelta::Content, mk.tool_close);
      return end_block(closed, lim);
    }
    buf.erase(0, p);
    return false;
  }

  // ---- the state machine -------------------------------------------------------------------------
  // Emits text (content or reasoning) up to a closing tag `tag`, holding back what may be its start.
  // Returns true when the tag was found (and consumed).
  bool scan_text(OutputDelta::Kind kind, std::string_view tag, bool final) {
    const size_t p = buf.find(tag);
    if (p != std::string::npos) {
      const std::string_view text = rstrip_newlines(std::string_view(buf).substr(0, p));
      tag_nl = p - text.size();
      emit(kind, text);
      buf.erase(0, p + tag.size());
      return true;
    }
    if (final) {
      emit(kind, buf);
      buf.clear();
      return false;
    }
    size_t cut = buf.size() - partial_tag_suffix(buf, tag);
    while (cut > 0 && buf[cut - 1] == '\n') --cut;
    emit(kind, std::string_view(buf).substr(0, cut));
    buf.erase(0, cut);
    return false;
  }

  void process(bool final) {
    while (true) {
      if (state == Content && at_start) {
        if (buf.empty()) return;
        if (starts_with_at(buf, 0, mk.think_open)) {
          buf.erase(0, mk.think_open.size());
          state = Reasoning;
          at_start = false;
          skip_nl = true;
          continue;
        }
        if (!final && buf.size() < mk.think_open.size() && mk.think_open.substr(0, buf.size()) == buf) return;
        at_start = false;
      }
      if (skip_nl && state != Tool) {
        size_t k = 0;
        while (k < buf.size() && buf[k] == '\n') ++k;
        buf.erase(0, k);
        if (buf.empty()) return;
        skip_nl = false;
      }
      switch (state) {
        case Content:
          if (!calls_enabled) {  // no tools: everything is content
            emit(OutputDelta::Content, buf);
            buf.clear();
            return;
          }
          if (scan_text(OutputDelta::Content, mk.tool_open, final)) {
            state = Tool;
            continue;
          }
          return;
        case Reasoning:
          if (scan_text(OutputDelta::Reasoning, mk.think_close, final)) {
            state = Content;
            skip_nl = true;
            continue;
          }
          return;
        case Tool:
          if (step_tool(final)) continue;
          return;
      }
    }
  }

  std::vector<OutputDelta> take() {
    std::vector<OutputDelta> r;
    r.swap(out);
    return r;
  }
};

OutputParser::OutputParser(bool in_reasoning, const nlohmann::ordered_json& tools, const ModelFormat& format,
                           bool tool_calls)
    : impl_(std::make_shared<Impl>(in_reasoning, tools, format)) {
  impl_->calls_enabled = tool_calls;
}

std::vector<OutputDelta> OutputParser::push(std::string_view text) {
  Impl& m = *impl_;
  m.raw.append(text);
  const size_t tail = unicode::incomplete_utf8_tail(m.raw);
  const std::string_view ready = std::string_view(m.raw).substr(0, m.raw.size() - tail);
  if (unicode::is_valid_utf8(ready))
    m.buf.append(ready);
  else
    m.buf.append(unicode::sanitize_utf8(ready));
  m.raw.erase(0, m.raw.size() - tail);
  m.process(/*final=*/false);
  n_tool_calls_ = m.n_calls;
  return m.take();
}

bool OutputParser::in_reasoning() const { return impl_->state == Impl::Reasoning; }

std::vector<OutputDelta> OutputParser::finish() {
  Impl& m = *impl_;
  m.buf.append(unicode::sanitize_utf8(m.raw));
  m.raw.clear();
  m.process(/*final=*/true);
  n_tool_calls_ = m.n_calls;
  return m.take();
}

}  // namespace lilac
