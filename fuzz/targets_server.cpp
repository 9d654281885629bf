// Fuzz targets of the server: the HTTP request parser, the bounded JSON parser, and whole requests
// against an in-process `lilac serve` (the scripted backend, the real tokenizer and Qwen3.6 template).
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "core/log.h"
#include "fuzz/fuzz_target.h"
#include "fuzz/json_mutator.h"
#include "server/http_parser.h"
#include "server/server_test_util.h"
#include "text/bounded_json.h"

namespace {

using lilac::fuzz::Input;
using lilac::fuzz::violated;
using lilac::server::RequestParser;

struct ParseResult {
  RequestParser::State state;
  int status;
  size_t used;
  std::string method, target, body;
  std::multimap<std::string, std::string> headers;
  bool keep_alive, expect_continue;
  bool operator==(const ParseResult&) const = default;
};

ParseResult parse(const std::string& bytes, const lilac::server::HttpLimits& lim, uint32_t seed) {
  RequestParser p(lim);
  size_t used = 0;
  uint32_t r = seed;
  for (size_t i = 0; i < bytes.size();) {
    size_t n = bytes.size() - i;
    if (seed) {
      r = r * 1664525u + 1013904223u;
      n = std::min(n, size_t(1 + (r >> 24) % 17));
    }
    // In pieces, fed as the server feeds it (http_server.cpp): the headers alone (feed_headers) until they are in,
    // then the body.
    const bool headers_alone = seed && !p.headers_done();
    const size_t k = headers_alone ? p.feed_headers(std::string_view(bytes).substr(i, n))
                                   : p.feed(std::string_view(bytes).substr(i, n));
    used += k;
    if (k > n) violated("http", "consumed more than it was given");
    if (headers_alone && p.state() == RequestParser::State::Body && k < n) {  // the body's bytes in the next call
      i += k;
      continue;
    }
    if (k < n) {
      if (p.state() != RequestParser::State::Done && p.state() != RequestParser::State::Error)
        violated("http", "left bytes unconsumed while still reading the request");
      break;
    }
    if (p.state() == RequestParser::State::Done || p.state() == RequestParser::State::Error) break;
    i += n;
  }
  ParseResult out{p.state(), p.error_status(), used, {}, {}, {}, {}, p.keep_alive(), p.expect_continue()};
  if (p.state() == RequestParser::State::Done) {
    const auto& q = p.request();
    out.method = q.method;
    out.target = q.target;
    out.body = q.body;
    for (const auto& [k, v] : q.headers) out.headers.emplace(k, v);
  }
  return out;
}

}  // namespace

// Request bytes fed whole and in random pieces (the headers alone first, as the server feeds them): the same outcome
// (state, status, bytes consumed, method, target, headers, body), never more than the request consumed, errors only
// with 4xx / 5xx.
LILAC_FUZZ_TARGET(http, "the request parser's outcome never depends on how the bytes arrive") {
  Input in(data, size);
  lilac::server::HttpLimits lim;
  if (in.flag()) {  // small limits, so that every bound is reachable
    lim.max_line = 16 + in.below(200);
    lim.max_header_bytes = 32 + in.below(1000);
    lim.max_headers = 1 + in.below(8);
    lim.max_body_bytes = in.below(2000);
  }
  const uint32_t seed = 1 + in.below(65536);
  const std::string bytes = in.rest();
  ParseResult whole = parse(bytes, lim, 0), pieces = parse(bytes, lim, seed);
  if (whole.state == RequestParser::State::Error) whole.used = pieces.used = 0;  // the connection closes: bytes read don't matter
  if (!(whole == pieces))
    violated("http", "whole: state " + std::to_string(int(whole.state)) + " status " + std::to_string(whole.status) + " used " +
                         std::to_string(whole.used) + "; pieces: state " + std::to_string(int(pieces.state)) + " status " +
                         std::to_string(pieces.status) + " used " + std::to_string(pieces.used));
  if (whole.state == RequestParser::State::Error && (whole.status < 400 || whole.status > 599))
    violated("http", "error with status " + std::to_string(whole.status));
  if (whole.state == RequestParser::State::Done && whole.body.size() > lim.max_body_bytes)
    violated("http", "a body over the limit was accepted");
}

namespace {

size_t depth_of(const nlohmann::ordered_json& v) {
  size_t d = 0;
  if (v.is_structured())
    for (const auto& x : v) d = std::max(d, depth_of(x));
  return v.is_structured() ? d + 1 : 0;
}

size_t widest_object(const nlohmann::ordered_json& v) {  // the most keys in one object (repeated keys once)
  size_t w = v.is_object() ? v.size() : 0;
  if (v.is_structured())
    for (const auto& x : v) w = std::max(w, widest_object(x));
  return w;
}

// Values as the limit counts them: every value and every key in the text, a repeated key's too (the parsed document
// keeps one of them, so counting its values would undercount).
size_t values_in_text(const std::string& text) {
  struct Count : nlohmann::json_sax<nlohmann::ordered_json> {
    size_t n = 0;
    bool null() override { return ++n; }
    bool boolean(bool) override { return ++n; }
    bool number_integer(number_integer_t) override { return ++n; }
    bool number_unsigned(number_unsigned_t) override { return ++n; }
    bool number_float(number_float_t, const string_t&) override { return ++n; }
    bool string(string_t&) override { return ++n; }
    bool binary(binary_t&) override { return ++n; }
    bool start_object(std::size_t) override { return ++n; }
    bool key(string_t&) override { return ++n; }
    bool end_object() override { return true; }
    bool start_array(std::size_t) override { return ++n; }
    bool end_array() override { return true; }
    bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }
  } c;
  nlohmann::ordered_json::sax_parse(text, &c);
  return c.n;
}

// The JSON targets' limits: the defaults, or (the input's first flag set) small ones read from the next bytes.
lilac::JsonLimits limits_from(Input& in) {
  lilac::JsonLimits lim;
  if (in.flag()) {
    lim.max_depth = 1 + in.below(12);
    lim.max_values = 1 + in.below(200);
    lim.max_object_keys = 1 + in.below(20);
  }
  return lim;
}

}  // namespace

// JSON text against nlohmann's own parser: the same verdict and the same document (key order, repeated
// keys) within the limits, the limit's error beyond them.
LILAC_FUZZ_TARGET(json, "parse_bounded_json == nlohmann::ordered_json::parse within the limits") {
  Input in(data, size);
  const lilac::JsonLimits lim = limits_from(in);
  const std::string text = in.rest();
  const lilac::JsonParseResult got = lilac::parse_bounded_json(text, lim);
  nlohmann::ordered_json want;
  try {
    want = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception&) {
    if (got.ok()) violated("json", "accepted text nlohmann rejects: " + got.value.dump());
    return;
  }
  const bool deep = depth_of(want) > lim.max_depth, many = values_in_text(text) > lim.max_values,
             wide = widest_object(want) > lim.max_object_keys;
  if (!deep && !many && !wide) {
    if (!got.ok()) violated("json", "rejected text nlohmann accepts: " + got.message);
    if (got.value.dump() != want.dump()) violated("json", "different document: " + got.value.dump() + " vs " + want.dump());
  } else if (got.ok()) {
    violated("json", "accepted a document over the limits (depth " + std::to_string(depth_of(want)) + ", values " +
                         std::to_string(values_in_text(text)) + ", keys in one object " +
                         std::to_string(widest_object(want)) + ")");
  }
}

// The handing parse (a Message Batches create's requests, one at a time) against the whole parse: the same verdict and
// message, and once the handed elements of the last array under the root object's key are put back in their nulls'
// places, the same document. Elements come in order, each complete, indexes from 0 (again from 0 under a repeated key).
LILAC_FUZZ_TARGET(json_handing, "parse_bounded_json_handing == parse_bounded_json with the handed elements put back") {
  Input in(data, size);
  const lilac::JsonLimits lim = limits_from(in);
  const std::string key = in.flag() ? "requests" : "a";
  const std::string text = in.rest();
  const lilac::JsonParseResult whole = lilac::parse_bounded_json(text, lim);
  std::vector<nlohmann::ordered_json> run;  // the elements of the array being handed
  const lilac::JsonParseResult got =
      lilac::parse_bounded_json_handing(text, lim, key, [&](size_t index, nlohmann::ordered_json& e) {
        if (index == 0) run.clear();
        if (index != run.size())
          violated("json_handing", "element " + std::to_string(index) + " handed after " + std::to_string(run.size()));
        run.push_back(std::move(e));
      });
  if (got.status != whole.status || got.message != whole.message)
    violated("json_handing", "verdict '" + got.message + "' where the whole parse says '" + whole.message + "'");
  if (!got.ok()) return;
  nlohmann::ordered_json doc = got.value;
  // (an empty array last under a repeated key hands nothing: the run is an earlier array's)
  if (doc.is_object() && doc.contains(key) && doc[key].is_array() && !doc[key].empty()) {
    nlohmann::ordered_json& arr = doc[key];
    if (arr.size() != run.size())
      violated("json_handing", std::to_string(run.size()) + " elements handed for an array of " +
                                   std::to_string(arr.size()));
    for (size_t i = 0; i < arr.size(); ++i) {
      if (!arr[i].is_null()) violated("json_handing", "element " + std::to_string(i) + " left in the result");
      arr[i] = std::move(run[i]);
    }
  }
  if (doc.dump() != whole.value.dump())
    violated("json_handing", "different document: " + doc.dump() + " vs " + whole.value.dump());
}

namespace {

// The in-process server of the server tests (tests/server/server_test_util.h), with replies that exercise
// the output parser: reasoning, a tool call, plain text.
struct FuzzServer {
  std::unique_ptr<lilac::test::LocalServer> local;
  int port = 0;
  FuzzServer() {
    lilac::set_log_level(lilac::LogLevel::Off);  // 4xx are the point; the property checks the answers
    const nlohmann::json script = {
        {"rules",
         {{{"match", "weather"},
           {"reply", "I will check.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"}},
          {{"match", "json"}, {"reply", "</think>\n\n{\"a\": 1}"}}}},
        {"default", {{"reply", "</think>\n\nlocal answer"}}}};
    lilac::server::ServerOptions o = lilac::test::LocalServer::options(4);
    o.max_seq = 4096;
    local = std::make_unique<lilac::test::LocalServer>(o, nullptr, script);
    port = local->port;
  }
};

const char* const kPaths[] = {"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/messages/count_tokens",
                              "/v1/responses", "/tokenize", "/detokenize", "/v1/conversations",
                              "/v1/messages/batches"};

void check_error_shape(const std::string& path, const httplib::Result& r) {
  nlohmann::json b;
  try {
    b = nlohmann::json::parse(r->body);
  } catch (const std::exception&) {
    violated("server", path + " answered " + std::to_string(r->status) + " with a body that is not JSON: " + r->body.substr(0, 200));
  }
  const bool anthropic = path.rfind("/v1/messages", 0) == 0;
  const bool ok = anthropic ? (b.value("type", "") == "error" && b.contains("error") && b["error"].is_object() &&
                               b["error"].value("message", "") != "")
                            : (b.contains("error") && b["error"].is_object() && b["error"].value("message", "") != "");
  if (!ok) violated("server", path + " answered " + std::to_string(r->status) + " without the protocol's error shape: " + r->body.substr(0, 200));
}

// An SSE event that reports a server-side failure, in any protocol's shape: Responses' error event with code
// server_error, or an "error" object (top level, or the failed response's) whose code is internal_error or
// whose type is server_error / api_error. Its fields, not its text: a request's own strings, echoed back by
// the Responses API, may say "internal_error".
bool internal_error_event(const nlohmann::json& e) {
  if (!e.is_object()) return false;
  if (e.value("type", "") == "error" && e.value("code", "") == "server_error") return true;  // Responses' error event
  for (const nlohmann::json* x : {&e, e.contains("response") && e["response"].is_object() ? &e["response"] : nullptr}) {
    if (!x || !x->contains("error") || !(*x)["error"].is_object()) continue;
    const nlohmann::json& err = (*x)["error"];
    const auto field = [&](const char* k) { return err.contains(k) && err[k].is_string() ? err[k].get<std::string>() : ""; };
    if (field("code") == "internal_error" || field("type") == "server_error" || field("type") == "api_error") return true;
  }
  return false;
}

}  // namespace

// Request bodies (any JSON, or not) POSTed to every generation endpoint and the tokenizer's: never a 5xx, a 4xx in the
// protocol's error shape, a 200 with JSON (or SSE events of JSON), and the server keeps answering.
LILAC_FUZZ_TARGET_MUTATED(server, "no request body gets a 5xx or a malformed answer", lilac::fuzz::mutate_json_body) {
  static FuzzServer srv;
  Input in(data, size);
  const std::string path = kPaths[in.below(uint32_t(std::size(kPaths)))];
  const int stream = int(in.below(3));  // 0: as sent, 1: "stream": false, 2: "stream": true
  std::string body = in.rest();
  if (stream) {
    lilac::JsonParseResult j = lilac::parse_bounded_json(body);
    if (j.ok() && j.value.is_object()) {
      j.value["stream"] = stream == 2;
      body = j.value.dump();
    }
  }
  httplib::Client cli("127.0.0.1", srv.port);
  cli.set_read_timeout(20, 0);
  auto r = cli.Post(path, body, "application/json");
  if (!r) violated("server", path + ": no answer (" + httplib::to_string(r.error()) + ")");
  // The scripted backend replies with its script whatever the request, and refuses (500) when the script breaks
  // the request's grammar (response_format, tool_choice): a limit of the test backend, not of the server.
  if (r->status == 500 && r->body.find("is not allowed by the token mask") != std::string::npos) return;
  if (r->status >= 500) violated("server", path + " answered " + std::to_string(r->status) + ": " + r->body.substr(0, 300));
  if (r->status >= 400) return check_error_shape(path, r);
  if (r->status != 200) violated("server", path + " answered " + std::to_string(r->status));
  if (r->get_header_value("Content-Type").find("text/event-stream") != std::string::npos) {
    size_t pos = 0;
    while (pos < r->body.size()) {
      size_t e = r->body.find('\n', pos);
      if (e == std::string::npos) e = r->body.size();
      const std::string line = r->body.substr(pos, e - pos);
      pos = e + 1;
      if (line.rfind("data: ", 0) != 0) continue;
      const std::string payload = line.substr(6);
      if (payload == "[DONE]") continue;
      if (!nlohmann::json::accept(payload)) violated("server", path + ": an event that is not JSON: " + payload.substr(0, 200));
      if (payload.find("is not allowed by the token mask") != std::string::npos) continue;  // as above
      if (internal_error_event(nlohmann::json::parse(payload)))
        violated("server", path + ": an internal error in the stream: " + payload.substr(0, 300));
    }
  } else if (!nlohmann::json::accept(r->body)) {
    violated("server", path + " answered 200 with a body that is not JSON: " + r->body.substr(0, 200));
  }
}

namespace {

// What an answer says, assembled the same way from a JSON answer and from its SSE events.
struct Said {
  std::string text, reasoning;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments (compact JSON)
  bool operator==(const Said&) const = default;
};

std::string compact(const std::string& json_text) {
  const lilac::JsonParseResult j = lilac::parse_bounded_json(json_text);
  return j.ok() ? j.value.dump() : "<not JSON: " + json_text + ">";
}

std::vector<nlohmann::ordered_json> events(const std::string& body) {
  std::vector<nlohmann::ordered_json> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t e = body.find('\n', pos);
    if (e == std::string::npos) e = body.size();
    const std::string line = body.substr(pos, e - pos);
    pos = e + 1;
    if (line.rfind("data: ", 0) != 0 || line == "data: [DONE]") continue;
    const lilac::JsonParseResult j = lilac::parse_bounded_json(line.substr(6));
    if (j.ok()) out.push_back(j.value);
  }
  return out;
}

// One Said per choice (chat completions' `n`; one for the other protocols), in choice order.
std::vector<Said> said_json(int path, const nlohmann::ordered_json& b) {
  if (path == 0) {
    std::vector<Said> all;
    for (const auto& choice : b["choices"]) {
      Said s;
      const auto& m = choice["message"];
      if (m.contains("content") && m["content"].is_string()) s.text = m["content"];
      if (m.contains("reasoning_content")) s.reasoning = m["reasoning_content"];
      if (m.contains("tool_calls"))
        for (const auto& c : m["tool_calls"]) s.calls.emplace_back(c["function"]["name"], compact(c["function"]["arguments"]));
      all.push_back(std::move(s));
    }
    return all;
  }
  Said s;
  if (path == 2) {
    for (const auto& c : b["content"]) {
      if (c["type"] == "text") s.text += c["text"].get<std::string>();
      else if (c["type"] == "thinking") s.reasoning += c["thinking"].get<std::string>();
      else if (c["type"] == "tool_use") s.calls.emplace_back(c["name"], c["input"].dump());
    }
  } else {
    for (const auto& o : b["output"]) {
      if (o["type"] == "message")
        for (const auto& c : o["content"]) s.text += c.value("text", "");
      else if (o["type"] == "reasoning")
        for (const auto& c : o.value("content", nlohmann::ordered_json::array())) s.reasoning += c.value("text", "");
      else if (o["type"] == "function_call")
        s.calls.emplace_back(o["name"], compact(o["arguments"]));
    }
  }
  return {s};
}

std::vector<Said> said_stream(int path, const std::string& body) {
  std::map<int64_t, Said> choices;  // chat completions: by the chunk's choice index
  std::map<std::pair<int64_t, int64_t>, std::pair<std::string, std::string>> calls;  // by (choice, index / block / item)
  Said& s = choices[0];
  for (const auto& e : events(body)) {
    if (path == 0) {
      if (!e.contains("choices") || e["choices"].empty()) continue;
      const int64_t ci = e["choices"][0]["index"].get<int64_t>();
      Said& sc = choices[ci];
      const auto& d = e["choices"][0]["delta"];
      if (d.contains("content") && d["content"].is_string()) sc.text += d["content"].get<std::string>();
      if (d.contains("reasoning_content") && d["reasoning_content"].is_string()) sc.reasoning += d["reasoning_content"].get<std::string>();
      if (d.contains("tool_calls"))
        for (const auto& c : d["tool_calls"]) {
          auto& [name, args] = calls[{ci, c["index"].get<int64_t>()}];
          if (c["function"].contains("name")) name += c["function"]["name"].get<std::string>();
          if (c["function"].contains("arguments")) args += c["function"]["arguments"].get<std::string>();
        }
    } else if (path == 2) {
      const std::string type = e.value("type", "");
      if (type == "content_block_start" && e["content_block"]["type"] == "tool_use")
        calls[{0, e["index"].get<int64_t>()}].first = e["content_block"]["name"];
      if (type != "content_block_delta") continue;
      const auto& d = e["delta"];
      if (d["type"] == "text_delta") s.text += d["text"].get<std::string>();
      else if (d["type"] == "thinking_delta") s.reasoning += d["thinking"].get<std::string>();
      else if (d["type"] == "input_json_delta") calls[{0, e["index"].get<int64_t>()}].second += d["partial_json"].get<std::string>();
    } else {
      const std::string type = e.value("type", "");
      if (type == "response.output_text.delta") s.text += e["delta"].get<std::string>();
      else if (type == "response.reasoning_text.delta") s.reasoning += e["delta"].get<std::string>();
      else if (type == "response.output_item.added" && e["item"]["type"] == "function_call")
        calls[{0, e["output_index"].get<int64_t>()}].first = e["item"]["name"];
      else if (type == "response.function_call_arguments.delta") calls[{0, e["output_index"].get<int64_t>()}].second += e["delta"].get<std::string>();
    }
  }
  for (auto& [at, c] : calls) choices[at.first].calls.emplace_back(c.first, compact(c.second.empty() ? "{}" : c.second));
  std::vector<Said> all;
  for (auto& [i, sc] : choices) all.push_back(std::move(sc));
  return all;
}

std::string show_said(const std::vector<Said>& all) {
  std::string o;
  for (const Said& s : all) {
    o += o.empty() ? "" : " | ";
    o += "text \"" + s.text + "\" reasoning \"" + s.reasoning + "\" calls";
    for (const auto& [n, a] : s.calls) o += " " + n + a;
  }
  return o;
}

}  // namespace

// The same request body answered whole and streamed (chat completions, Messages, Responses): the text,
// the reasoning and the tool calls the stream's events add up to are those of the whole answer, for every
// choice (chat completions' `n`).
LILAC_FUZZ_TARGET_MUTATED(server_stream, "a streamed answer adds up to the whole answer", lilac::fuzz::mutate_json_body) {
  static FuzzServer srv;
  Input in(data, size);
  static const int kStreamPaths[] = {0, 2, 4};  // indexes into kPaths
  const int path = kStreamPaths[in.below(3)];
  (void)in.byte();
  lilac::JsonParseResult j = lilac::parse_bounded_json(in.rest());
  if (!j.ok() || !j.value.is_object()) return;
  httplib::Client cli("127.0.0.1", srv.port);
  cli.set_read_timeout(20, 0);
  j.value.erase("background");  // a background request's whole answer is the queued object, not its output
  j.value["stream"] = false;
  auto whole = cli.Post(kPaths[path], j.value.dump(), "application/json");
  j.value["stream"] = true;
  auto streamed = cli.Post(kPaths[path], j.value.dump(), "application/json");
  if (!whole || !streamed) violated("server_stream", std::string(kPaths[path]) + ": no answer");
  // 5xx are the server target's business (here: the scripted backend refusing to break a grammar, which a
  // stream reports after its 200 as an error event).
  if (whole->status >= 500 || streamed->status >= 500 ||
      streamed->body.find("is not allowed by the token mask") != std::string::npos)
    return;
  if (whole->status != streamed->status) {
    if (whole->status == 400 || streamed->status == 400) return;  // "stream" itself may be refused with other fields
    violated("server_stream", std::string(kPaths[path]) + ": " + std::to_string(whole->status) + " whole, " +
                                  std::to_string(streamed->status) + " streamed");
  }
  if (whole->status != 200) return;
  const lilac::JsonParseResult b = lilac::parse_bounded_json(whole->body);
  if (!b.ok()) violated("server_stream", "whole answer not JSON");
  const std::vector<Said> a = said_json(path, b.value), s = said_stream(path, streamed->body);
  if (std::getenv("LILAC_FUZZ_SHOW")) std::fprintf(stderr, "%s: %s\n", kPaths[path], show_said(a).c_str());
  if (!(a == s))
    violated("server_stream", std::string(kPaths[path]) + ": whole " + show_said(a) + "\n  streamed " + show_said(s) +
                                  "\n  body " + j.value.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace).substr(0, 400));
}
