// An in-process `lilac serve` for the server tests: the scripted backend (server/scripted_backend.h),
// the real Qwen3 tokenizer and the Qwen3.6 template, on a free port.
#pragma once
#include <gtest/gtest.h>
#include <httplib.h>

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/mapped_file.h"
#include "server/scripted_backend.h"
#include "server/server.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace lilac::test {

inline std::shared_ptr<const Tokenizer> qwen3_tokenizer() {
  static auto tok = std::shared_ptr<const Tokenizer>(Tokenizer::load(std::string(LILAC_SHARED_DIR) + "/fixtures/qwen3-tokenizer"));
  return tok;
}

// Replies: "slow" -> " x" forever, 20 ms per token; else "</think>\n\nlocal answer".
inline nlohmann::json default_script() {
  return {{"rules", {{{"match", "slow"}, {"reply", " x"}, {"repeat", true}, {"delay_ms", 20}}}},
          {"default", {{"reply", "</think>\n\nlocal answer"}}}};
}

// The "astral" rule's reply: JSON whose last member is cut by U+10FFFD, a character whose first token is the lone byte
// 0xF4 (not UTF-8 by itself). Under a json_object format that token breaks the grammar, and the backend's error quotes
// it; cut by max tokens right after it, the text ends in U+FFFD.
inline constexpr char kAstralReply[] = "{\"answer\": \"ok\", \xf4\x8f\xbf\xbd}";
inline nlohmann::json astral_rule(int delay_ms = 10) {
  return {{"match", "astral"}, {"reply", kAstralReply}, {"delay_ms", delay_ms}};
}

struct LocalServer {
  std::unique_ptr<server::Server> server;
  int port = 0;
  // `template_source`: the chat template (default: Qwen3.6's, which opens "<think>" in the generation prompt).
  explicit LocalServer(server::ServerOptions o, const server::RouteHook* hook = nullptr,
                       const nlohmann::json& script = default_script(), const std::string& template_source = "") {
    auto tok = qwen3_tokenizer();
    auto tmpl = std::shared_ptr<const ChatTemplate>(ChatTemplate::from_source(
        template_source.empty()
            ? read_text_file(std::string(LILAC_SHARED_DIR) + "/fixtures/qwen3.6-template/chat_template.jinja")
            : template_source,
        "qwen3.6"));
    auto backend = std::shared_ptr<Backend>(server::make_scripted_backend(script, tok));
    o.port = 0;
    o.log_requests = false;
    server = std::make_unique<server::Server>(o);
    if (hook) server->set_route_hook(*hook);
    port = server->bind();
    server->start();
    server->set_model(backend, tok, tmpl);
  }
  static server::ServerOptions options(int max_queue = 8) {
    server::ServerOptions o;
    o.model_id = "local-model";
    o.max_queue = max_queue;
    return o;
  }
};

// POSTs `body` to the server on `port` and returns its answer parsed (discarded JSON when it is not JSON); a
// test failure when there is no answer or its status is not `want`.
inline nlohmann::json post_json(int port, const std::string& path, const nlohmann::json& body, int want = 200) {
  httplib::Client cli("127.0.0.1", port);
  auto r = cli.Post(path, body.dump(), "application/json");
  if (!r) {
    ADD_FAILURE() << "no response from " << path;
    return nlohmann::json();
  }
  EXPECT_EQ(r->status, want) << path << ": " << r->body;
  return nlohmann::json::parse(r->body, nullptr, false);
}

// The data of an SSE body's events, in order, each parsed ("[DONE]" as the string "[DONE]").
inline std::vector<nlohmann::json> sse_events(const std::string& body) {
  std::vector<nlohmann::json> out;
  for (size_t at = 0; (at = body.find("data: ", at)) != std::string::npos;) {
    const size_t end = body.find("\n\n", at);
    const std::string data = body.substr(at + 6, end - at - 6);
    out.push_back(data == "[DONE]" ? nlohmann::json("[DONE]") : nlohmann::json::parse(data));
    at = end;
  }
  return out;
}

}  // namespace lilac::test
