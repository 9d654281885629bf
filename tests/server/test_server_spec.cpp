// The server with speculative decoding (ServerOptions::spec_tokens) on the CPU backend and tiny-mtp:
// /v1/completions over token ids answers the same text, logprobs and usage with and without it.
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>

#include "core/mapped_file.h"
#include "cpu/cpu_backend.h"
#include "model/weights.h"
#include "server/server.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

using json = nlohmann::json;

namespace {

json complete(int spec_tokens, const json& body) {
  const std::string shared = LILAC_SHARED_DIR;
  static auto tok = std::shared_ptr<const lilac::Tokenizer>(lilac::Tokenizer::load(shared + "/fixtures/qwen3-tokenizer"));
  static auto weights = lilac::load_model(shared + "/fixtures/tiny-mtp/mlx4", {.progress = false});
  auto tmpl = std::shared_ptr<const lilac::ChatTemplate>(lilac::ChatTemplate::from_source(
      lilac::read_text_file(shared + "/fixtures/qwen3.6-template/chat_template.jinja"), "qwen3.6"));
  lilac::server::ServerOptions o;
  o.port = 0;
  o.max_seq = 256;
  o.log_requests = false;
  o.spec_tokens = spec_tokens;
  lilac::server::Server server(o);
  const int port = server.bind();
  server.start();
  server.set_model(std::shared_ptr<lilac::Backend>(lilac::make_cpu_backend(weights, 1)), tok, tmpl);
  httplib::Client cli("127.0.0.1", port);
  auto r = cli.Post("/v1/completions", body.dump(), "application/json");
  server.stop();
  if (!r) return json{{"error", "no response"}};
  EXPECT_EQ(r->status, 200) << r->body;
  return json::parse(r->body);
}

}  // namespace

TEST(ServerSpec, CompletionsAreTheSameWithSpeculation) {
  for (double temperature : {0.0, 0.8}) {
    json body = {{"prompt", {5, 6, 7, 8, 9, 10}}, {"max_tokens", 24}, {"temperature", temperature}, {"seed", 4},
                 {"logprobs", 2}};
    const json plain = complete(0, body), spec = complete(3, body);
    ASSERT_TRUE(plain.contains("choices")) << plain.dump();
    EXPECT_EQ(spec["choices"][0]["text"], plain["choices"][0]["text"]);
    EXPECT_EQ(spec["choices"][0]["logprobs"], plain["choices"][0]["logprobs"]);
    EXPECT_EQ(spec["choices"][0]["finish_reason"], plain["choices"][0]["finish_reason"]);
    EXPECT_EQ(spec["usage"], plain["usage"]);
  }
}
