// What evaluation harnesses and other OpenAI clients of the legacy API use, on the scripted backend: completions'
// `echo` (the prompt before the completion; with `logprobs`, an entry per prompt token scored by the model, the first
// null — the scripted logits are all zero, so every prompt token scores -log(vocab)) and several prompts per request
// (`echo`, `logprobs: 1`, `max_tokens: 1`, a batch of id prompts: lm-evaluation-harness's log-likelihood request);
// the tokenizer endpoints (/tokenizer_info, /tokenize, /detokenize); a backend without logit_bias refusing it.
#include <gtest/gtest.h>
#include <httplib.h>

#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server_test_util.h"
#include "text/unicode.h"

using json = nlohmann::json;
using lilac::test::post_json;

namespace {

std::vector<int32_t> encode(const std::string& s) { return lilac::test::qwen3_tokenizer()->encode(s, false); }

double uniform_logprob() { return -std::log(double(lilac::test::qwen3_tokenizer()->vocab_size())); }

// The echoed prompt's part of a choice's logprobs: tokens that spell `prompt`, the first entry null, every other
// -log(vocab) with one alternative, offsets where each token starts.
void expect_prompt_entries(const json& lp, const std::string& prompt, size_t n_prompt) {
  ASSERT_GE(lp["tokens"].size(), n_prompt) << lp.dump();
  std::string spelled;
  for (size_t i = 0; i < n_prompt; ++i) {
    EXPECT_EQ(lp["text_offset"][i], spelled.size()) << i;
    spelled += lp["tokens"][i].get<std::string>();
    if (i == 0) {
      EXPECT_TRUE(lp["token_logprobs"][0].is_null());
      EXPECT_TRUE(lp["top_logprobs"][0].is_null());
      continue;
    }
    EXPECT_NEAR(lp["token_logprobs"][i].get<double>(), uniform_logprob(), 1e-5) << i;
    ASSERT_TRUE(lp["top_logprobs"][i].is_object()) << i;
    EXPECT_EQ(lp["top_logprobs"][i].size(), 1u) << i;
  }
  EXPECT_EQ(spelled, prompt);
}

}  // namespace

TEST(ServerEcho, TextComesBeforeTheCompletion) {
  lilac::test::LocalServer srv(lilac::test::LocalServer::options());
  const json plain = post_json(srv.port, "/v1/completions", {{"prompt", "Hello world"}, {"max_tokens", 3}});
  const json echo = post_json(srv.port, "/v1/completions", {{"prompt", "Hello world"}, {"max_tokens", 3}, {"echo", true}});
  EXPECT_EQ(echo["choices"][0]["text"], "Hello world" + plain["choices"][0]["text"].get<std::string>());
  EXPECT_TRUE(echo["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(echo["usage"], plain["usage"]);
  // Token ids are echoed as their text.
  const json ids = post_json(srv.port, "/v1/completions", {{"prompt", encode("Hi there")}, {"max_tokens", 1}, {"echo", true}});
  EXPECT_EQ(ids["choices"][0]["text"].get<std::string>().rfind("Hi there", 0), 0u) << ids.dump();
}

// What lm-evaluation-harness's local-completions model sends for a log-likelihood: the scores of the prompt's
// tokens, then one generated token.
TEST(ServerEcho, LogprobsScoreEveryPromptToken) {
  lilac::test::LocalServer srv(lilac::test::LocalServer::options());
  const std::string prompt = "The capital of France is";
  const size_t n = encode(prompt).size();
  const json r = post_json(srv.port, "/v1/completions",
                           {{"prompt", encode(prompt)}, {"max_tokens", 1}, {"echo", true}, {"logprobs", 1}, {"temperature", 0}});
  const json& c = r["choices"][0];
  const json& lp = c["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), n + 1) << r.dump();
  ASSERT_EQ(lp["token_logprobs"].size(), n + 1);
  ASSERT_EQ(lp["top_logprobs"].size(), n + 1);
  ASSERT_EQ(lp["text_offset"].size(), n + 1);
  expect_prompt_entries(lp, prompt, n);
  EXPECT_EQ(lp["text_offset"][n], prompt.size());  // the completion's token starts after the prompt
  EXPECT_EQ(c["text"].get<std::string>().rfind(prompt, 0), 0u);
  EXPECT_EQ(r["usage"]["prompt_tokens"], n);
  EXPECT_EQ(r["usage"]["completion_tokens"], 1);
}

TEST(ServerEcho, MaxTokensZeroScoresThePromptOnly) {
  lilac::test::LocalServer srv(lilac::test::LocalServer::options());
  const std::string prompt = "one two three four";
  const json r = post_json(srv.port, "/v1/completions",
                           {{"prompt", prompt}, {"max_tokens", 0}, {"echo", true}, {"logprobs", 1}});
  const json& c = r["choices"][0];
  EXPECT_EQ(c["text"], prompt);
  EXPECT_EQ(c["finish_reason"], "length");
  EXPECT_EQ(c["logprobs"]["tokens"].size(), encode(prompt).size());
  expect_prompt_entries(c["logprobs"], prompt, encode(prompt).size());
  EXPECT_EQ(r["usage"]["completion_tokens"], 0);
  // Without logprobs: the prompt alone. Without echo: refused.
  const json bare = post_json(srv.port, "/v1/completions", {{"prompt", prompt}, {"max_tokens", 0}, {"echo", true}});
  EXPECT_EQ(bare["choices"][0]["text"], prompt);
  const json bad = post_json(srv.port, "/v1/completions", {{"prompt", prompt}, {"max_tokens", 0}}, 400);
  EXPECT_EQ(bad["error"]["param"], "max_tokens");
}

// Several prompts: choice k·n + i is prompt k's choice i; usage counts every prompt once.
TEST(ServerEcho, SeveralPromptsAreOneResponse) {
  lilac::test::LocalServer srv(lilac::test::LocalServer::options());
  const std::vector<std::string> prompts = {"Hello", "Good morning to you", "Bye"};
  const json r = post_json(srv.port, "/v1/completions",
                           {{"prompt", prompts}, {"n", 2}, {"max_tokens", 2}, {"echo", true}, {"logprobs", 1}});
  ASSERT_EQ(r["choices"].size(), 6u) << r.dump();
  int64_t prompt_tokens = 0;
  for (size_t k = 0; k < prompts.size(); ++k) {
    prompt_tokens += int64_t(encode(prompts[k]).size());
    for (size_t i = 0; i < 2; ++i) {
      const json& c = r["choices"][k * 2 + i];
      EXPECT_EQ(c["index"], k * 2 + i);
      EXPECT_EQ(c["text"].get<std::string>().rfind(prompts[k], 0), 0u) << c.dump();
      expect_prompt_entries(c["logprobs"], prompts[k], encode(prompts[k]).size());
    }
  }
  EXPECT_EQ(r["usage"]["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(r["usage"]["completion_tokens"], 12);
  // Id prompts, the shape harnesses batch.
  const json ids = post_json(srv.port, "/v1/completions", {{"prompt", {encode("a b"), encode("c d e")}}, {"max_tokens", 1}});
  ASSERT_EQ(ids["choices"].size(), 2u);
  EXPECT_EQ(ids["usage"]["prompt_tokens"], encode("a b").size() + encode("c d e").size());
}

TEST(ServerEcho, StreamEchoesFirst) {
  lilac::test::LocalServer srv(lilac::test::LocalServer::options());
  httplib::Client cli("127.0.0.1", srv.port);
  const std::string prompt = "Stream this prompt";
  const json body = {{"prompt", prompt}, {"max_tokens", 2}, {"echo", true}, {"logprobs", 1}, {"stream", true}};
  auto res = cli.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200);
  const std::vector<json> evs = lilac::test::sse_events(res->body);
  ASSERT_GE(evs.size(), 3u);
  const json& first = evs[0]["choices"][0];
  EXPECT_EQ(first["text"], prompt);
  expect_prompt_entries(first["logprobs"], prompt, encode(prompt).size());
  EXPECT_EQ(first["logprobs"]["tokens"].size(), encode(prompt).size());
  std::string text;
  for (const json& e : evs)
    if (e.is_object()) text += e["choices"][0]["text"].get<std::string>();
  const json whole = post_json(srv.port, "/v1/completions", {{"prompt", prompt}, {"max_tokens", 2}, {"echo", true}});
  EXPECT_EQ(text, whole["choices"][0]["text"]);
  EXPECT_EQ(evs.back(), "[DONE]");
}

// The tokenizer endpoints an evaluation harness probes (lm-evaluation-harness's remote tokenizer).
TEST(ServerTokenizer, TokenizeDetokenizeAndInfo) {
  lilac::test::LocalServer srv(lilac::test::LocalServer::options());
  httplib::Client cli("127.0.0.1", srv.port);
  auto info = cli.Get("/tokenizer_info");
  ASSERT_TRUE(info);
  ASSERT_EQ(info->status, 200);
  const json i = json::parse(info->body);
  EXPECT_TRUE(i.contains("eos_token"));
  EXPECT_EQ(i["vocab_size"], lilac::test::qwen3_tokenizer()->vocab_size());
  const json t = post_json(srv.port, "/tokenize", {{"prompt", "Hello world"}, {"add_special_tokens", false}});
  EXPECT_EQ(t["tokens"], json(encode("Hello world")));
  EXPECT_EQ(t["count"], encode("Hello world").size());
  // Special-token text is those tokens here (as Hugging Face tokenizers read it).
  const json sp = post_json(srv.port, "/tokenize", {{"prompt", "<|im_start|>user"}});
  EXPECT_EQ(sp["tokens"][0], *lilac::test::qwen3_tokenizer()->token_id("<|im_start|>"));
  const json d = post_json(srv.port, "/detokenize", {{"tokens", t["tokens"]}});
  EXPECT_EQ(d["prompt"], "Hello world");
  // Bad input: OpenAI error bodies naming the field.
  EXPECT_EQ(post_json(srv.port, "/tokenize", json::object(), 400)["error"]["param"], "prompt");
  EXPECT_EQ(post_json(srv.port, "/tokenize", {{"prompt", 5}}, 400)["error"]["param"], "prompt");
  EXPECT_EQ(post_json(srv.port, "/detokenize", {{"tokens", {1, -1}}}, 400)["error"]["param"], "tokens");
  EXPECT_EQ(post_json(srv.port, "/detokenize", {{"tokens", {10000000}}}, 400)["error"]["param"], "tokens");
  EXPECT_EQ(post_json(srv.port, "/detokenize", {{"tokens", "x"}}, 400)["error"]["param"], "tokens");
  auto junk = cli.Post("/tokenize", "{not json", "application/json");
  ASSERT_TRUE(junk);
  EXPECT_EQ(junk->status, 400);
}

// /tokenize with a chat body gives the prompt /v1/chat/completions feeds for it (its usage counts it); the template
// is in /tokenizer_info for clients that render it themselves.
TEST(ServerTokenizer, ChatMessagesTokenizeAsTheChatEndpointRendersThem) {
  lilac::test::LocalServer srv(lilac::test::LocalServer::options());
  const json messages = json::array({{{"role", "user"}, {"content", "What is <|im_end|> here?"}}});
  const json t = post_json(srv.port, "/tokenize", {{"messages", messages}});
  const json c = post_json(srv.port, "/v1/chat/completions", {{"messages", messages}, {"max_tokens", 1}});
  EXPECT_EQ(t["count"], c["usage"]["prompt_tokens"]);
  // The user's control-token text stays text (as in the chat endpoint): one <|im_end|> token per turn end only.
  const int32_t im_end = *lilac::test::qwen3_tokenizer()->token_id("<|im_end|>");
  int ends = 0;
  for (const auto& id : t["tokens"]) ends += id.get<int32_t>() == im_end;
  EXPECT_EQ(ends, 1);  // the user turn's (the assistant's is still open)
  EXPECT_EQ(post_json(srv.port, "/tokenize", {{"messages", messages}, {"prompt", "x"}}, 400)["error"]["param"], "prompt");
  EXPECT_EQ(post_json(srv.port, "/tokenize", {{"messages", "hi"}}, 400)["error"]["param"], "messages");
  httplib::Client cli("127.0.0.1", srv.port);
  auto info = cli.Get("/tokenizer_info");
  ASSERT_TRUE(info);
  EXPECT_NE(json::parse(info->body)["chat_template"].get<std::string>().find("<|im_start|>"), std::string::npos);
}

// A backend that does not apply logit_bias refuses it up front (400 naming the field), never silently ignores it.
TEST(ServerLogitBias, ABackendWithoutItAnswers400) {
  nlohmann::json script = lilac::test::default_script();
  script["logit_bias"] = false;
  lilac::test::LocalServer srv(lilac::test::LocalServer::options(), nullptr, script);
  const json msgs = json::array({{{"role", "user"}, {"content", "hi"}}});
  const json r = post_json(srv.port, "/v1/chat/completions", {{"messages", msgs}, {"logit_bias", {{"5", -100}}}}, 400);
  EXPECT_EQ(r["error"]["param"], "logit_bias");
  EXPECT_EQ(r["error"]["code"], "unsupported_value");
  post_json(srv.port, "/v1/chat/completions", {{"messages", msgs}, {"logit_bias", json::object()}});  // empty: fine
  lilac::test::LocalServer ok(lilac::test::LocalServer::options());
  post_json(ok.port, "/v1/completions", {{"prompt", "hi"}, {"logit_bias", {{"5", -100}}}});
}

// Scores held and answered per prompt token, alternative and choice are bounded per request (a clear 400, nothing
// queued); a request under the bound is served.
TEST(ServerEcho, ScoredEntriesAreBounded) {
  lilac::server::ServerOptions o = lilac::test::LocalServer::options(64);
  o.max_seq = 1 << 16;
  lilac::test::LocalServer srv(o);
  std::vector<int32_t> ids(40000, encode("x")[0]);
  // 4 prompts × 40,000 tokens × (1 + 20) = 3.36M entries: served would be ~130 MB of JSON; 2 × that is refused.
  const json big = {{"prompt", {ids, ids, ids, ids, ids, ids, ids, ids}}, {"echo", true}, {"logprobs", 20}, {"max_tokens", 0}};
  const json r = post_json(srv.port, "/v1/completions", big, 400);
  EXPECT_EQ(r["error"]["param"], "prompt");
  EXPECT_NE(r["error"]["message"].get<std::string>().find("6720000 entries"), std::string::npos) << r.dump();
  ids.resize(500);
  const json small = {{"prompt", {ids, ids}}, {"echo", true}, {"logprobs", 20}, {"max_tokens", 0}};
  const json ok = post_json(srv.port, "/v1/completions", small);
  EXPECT_EQ(ok["choices"][1]["logprobs"]["tokens"].size(), ids.size());
}

// Completions logprobs where text is held back (a stop string's possible start, a character split across tokens):
// text_offset is where each token's first character is (it was the length of the text emitted so far, which lags
// behind: " E" of "END"'s possible start, the halves of a 4-byte character, counted in bytes), and a token that is
// not whole characters is named "bytes:\x.." in tokens and in top_logprobs' keys (as text every such alternative was
// the key "\ufffd": one key for three alternatives).
TEST(ServerEcho, LogprobsOffsetsAndNamesFollowTheTokens) {
  const std::string reply = "Hi Ex\xF0\x93\x80\x80y done";
  const json script = {{"rules", {{{"match", "glyph"}, {"reply", reply}}}}};
  lilac::test::LocalServer srv(lilac::test::LocalServer::options(), nullptr, script);
  const json r = post_json(srv.port, "/v1/completions",
                           {{"prompt", "glyph"}, {"max_tokens", 40}, {"logprobs", 3}, {"stop", {"END"}}});
  const json& lp = r["choices"][0]["logprobs"];
  EXPECT_EQ(r["choices"][0]["text"], reply);
  const auto& tok = *lilac::test::qwen3_tokenizer();
  const std::vector<int32_t> ids = tok.encode(reply, true);
  ASSERT_EQ(lp["tokens"].size(), ids.size()) << lp.dump();
  size_t chars = 0;
  bool partial = false;
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string b = tok.token_bytes(ids[i]);
    const bool continues = (static_cast<unsigned char>(b[0]) & 0xC0) == 0x80;
    EXPECT_EQ(lp["text_offset"][i], continues ? chars - 1 : chars) << i;
    for (unsigned char c : b) chars += (c & 0xC0) != 0x80;
    const std::string name = lp["tokens"][i];
    if (lilac::unicode::is_valid_utf8(b)) {
      EXPECT_EQ(name, b) << i;
    } else {
      partial = true;
      EXPECT_EQ(name.rfind("bytes:\\x", 0), 0u) << name;
    }
    EXPECT_EQ(lp["top_logprobs"][i].size(), 3u) << lp["top_logprobs"][i].dump();
  }
  EXPECT_TRUE(partial) << "the reply has no token that is part of a character";
}
