// The server with speculative decoding (ServerOptions::spec_tokens, spec_policy) on the CPU backend and
// tiny-mtp: /v1/completions over token ids answers the same text, logprobs and usage with and without it,
// with either draft policy and with several requests at once; /metrics counts the drafts.
#include <gtest/gtest.h>
#include <httplib.h>

#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/mapped_file.h"
#include "cpu/cpu_backend.h"
#include "model/weights.h"
#include "server/server.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

using json = nlohmann::json;

namespace {

struct Answers {
  std::vector<json> bodies;  // one per request, in order
  std::string metrics;       // GET /metrics after them
};

// The requests sent at once (several sequences in the scheduler together) to a fresh server.
Answers complete(int spec_tokens, const std::vector<json>& bodies,
                 lilac::SpecPolicyKind policy = lilac::SpecPolicyKind::Adaptive,
                 int spec_max_batch = lilac::kDefaultSpecMaxBatch) {
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
  o.spec_policy = policy;
  o.spec_max_batch = spec_max_batch;
  o.max_batch = 4;
  lilac::server::Server server(o);
  const int port = server.bind();
  server.start();
  server.set_model(std::shared_ptr<lilac::Backend>(lilac::make_cpu_backend(weights, 1)), tok, tmpl);
  Answers a;
  a.bodies.resize(bodies.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < bodies.size(); ++i)
    threads.emplace_back([&, i] {
      httplib::Client cli("127.0.0.1", port);
      auto r = cli.Post("/v1/completions", bodies[i].dump(), "application/json");
      if (!r) {
        a.bodies[i] = json{{"error", "no response"}};
        return;
      }
      EXPECT_EQ(r->status, 200) << r->body;
      a.bodies[i] = json::parse(r->body);
    });
  for (auto& t : threads) t.join();
  httplib::Client cli("127.0.0.1", port);
  if (auto m = cli.Get("/metrics")) a.metrics = m->body;
  server.stop();
  return a;
}

double metric(const std::string& text, const std::string& name) {
  const auto at = text.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + name.size() + 2));
}

}  // namespace

TEST(ServerSpec, CompletionsAreTheSameWithSpeculation) {
  for (double temperature : {0.0, 0.8}) {
    json body = {{"prompt", {5, 6, 7, 8, 9, 10}}, {"max_tokens", 24}, {"temperature", temperature}, {"seed", 4},
                 {"logprobs", 2}};
    const json plain = complete(0, {body}).bodies[0];
    for (auto policy : {lilac::SpecPolicyKind::Fixed, lilac::SpecPolicyKind::Adaptive}) {
      const Answers spec = complete(3, {body}, policy);
      const json& s = spec.bodies[0];
      ASSERT_TRUE(plain.contains("choices")) << plain.dump();
      EXPECT_EQ(s["choices"][0]["text"], plain["choices"][0]["text"]);
      EXPECT_EQ(s["choices"][0]["logprobs"], plain["choices"][0]["logprobs"]);
      EXPECT_EQ(s["choices"][0]["finish_reason"], plain["choices"][0]["finish_reason"]);
      EXPECT_EQ(s["usage"], plain["usage"]);
      // /metrics: the speculation counters (the policy's depth)
      const double steps = metric(spec.metrics, "lilac_spec_decode_steps_total");
      const double rounds = metric(spec.metrics, "lilac_spec_rounds_total");
      const double drafts = metric(spec.metrics, "lilac_spec_drafts_total");
      EXPECT_EQ(steps + metric(spec.metrics, "lilac_spec_drafts_accepted_total"), 23);  // 24 tokens, the first sampled
      EXPECT_GT(rounds, 0);
      EXPECT_NEAR(metric(spec.metrics, "lilac_spec_drafts_per_round"), drafts / rounds, 1e-3);
      EXPECT_NEAR(metric(spec.metrics, "lilac_spec_drafts_per_step"), drafts / steps, 1e-3);
      if (policy == lilac::SpecPolicyKind::Fixed) EXPECT_EQ(rounds, steps - 1);  // the last step: max_tokens leaves no room
    }
  }
}

// Several requests at once, speculation allowed for up to 4 decoding streams (--spec-max-batch 4): sequences
// whose policy chose a plain step join the batched step, the others verify alone; every answer is the one
// each request gets alone without speculation.
TEST(ServerSpec, ConcurrentSpeculatingRequestsAnswerAsAlone) {
  std::vector<json> bodies;
  for (int i = 0; i < 3; ++i)
    bodies.push_back({{"prompt", {5 + i, 6, 7 + 2 * i, 8}}, {"max_tokens", 20}, {"temperature", i == 1 ? 0.7 : 0.0},
                      {"seed", 11 + i}, {"logprobs", 1}});
  const Answers spec = complete(3, bodies, lilac::SpecPolicyKind::Adaptive, 4);
  EXPECT_EQ(metric(spec.metrics, "lilac_spec_suppressed_steps_total"), 0);
  for (size_t i = 0; i < bodies.size(); ++i) {
    const json plain = complete(0, {bodies[i]}).bodies[0];
    EXPECT_EQ(spec.bodies[i]["choices"][0]["text"], plain["choices"][0]["text"]) << i;
    EXPECT_EQ(spec.bodies[i]["choices"][0]["logprobs"], plain["choices"][0]["logprobs"]) << i;
  }
  EXPECT_GT(metric(spec.metrics, "lilac_spec_rounds_total"), 0);
  // adaptive on the CPU reference (compute-bound: speculation does not pay): mostly plain steps
  EXPECT_LT(metric(spec.metrics, "lilac_spec_rounds_total"), metric(spec.metrics, "lilac_spec_decode_steps_total"));
}
