// `lilac generate`: one generation from the command line (ids, plain text or one chat message),
// printing the generated ids (and text when the model folder has a tokenizer) and the speed of
// prefill and decode separately. The generation is engine/generator.h's Generator::run, as the server's.
#include <chrono>
#include <cstdio>
#include <climits>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/backend_select.h"
#include "cli/command.h"
#include "cli/spec_options.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "engine/generator.h"
#include "model/weights.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace lilac::cli {
namespace {

struct Args {
  std::string model, prompt_ids, prompt, chat, backend = "auto";
  int threads = 0;
  int max_tokens = 32;
  int spec_tokens = 0;
  int64_t draft_vocab = 0;
  std::string spec_policy = "adaptive";
  bool ignore_eos = false;
  // Sampling: unset options take the model's generation_config.json defaults, else greedy.
  std::optional<float> temperature, top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty;
  std::optional<int> top_k;
  uint64_t seed = 0;
};

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    if (b == std::string::npos) throw InputError("--prompt-ids: empty item in '" + s + "'");
    item = item.substr(b, e - b + 1);
    try {
      size_t used = 0;
      long long v = std::stoll(item, &used);
      if (used != item.size() || v < INT32_MIN || v > INT32_MAX) throw std::invalid_argument(item);
      ids.push_back(int32_t(v));
    } catch (const std::logic_error&) {
      throw InputError("--prompt-ids: '" + item + "' is not an integer token id");
    }
  }
  return ids;
}

SamplingParams sampling_params(const Args& a, const ModelConfig& c) {
  SamplingParams p;
  p.temperature = a.temperature.value_or(c.default_temperature >= 0 ? c.default_temperature : 0.f);
  p.top_p = a.top_p.value_or(c.default_top_p > 0 ? c.default_top_p : 1.f);
  p.top_k = a.top_k.value_or(c.default_top_k > 0 ? c.default_top_k : 0);
  p.min_p = a.min_p.value_or(c.default_min_p >= 0 ? c.default_min_p : 0.f);
  p.repetition_penalty =
      a.repetition_penalty.value_or(c.default_repetition_penalty > 0 ? c.default_repetition_penalty : 1.f);
  p.presence_penalty = a.presence_penalty.value_or(c.default_presence_penalty >= 0 ? c.default_presence_penalty : 0.f);
  p.frequency_penalty = a.frequency_penalty.value_or(0.f);
  p.seed = a.seed;
  return p;
}

// For a model folder without tokenizer.json (--prompt-ids only): the Generator needs a tokenizer to
// detokenize; here ids have no text.
class NoTextTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view, bool) const override { throw InputError("no tokenizer"); }
  std::string decode(std::span<const int32_t>, bool) const override { return {}; }
  const std::string& token_bytes(int32_t) const override { return empty_; }
  std::optional<int32_t> token_id(std::string_view) const override { return std::nullopt; }
  bool is_special(int32_t) const override { return false; }
  bool is_added(int32_t) const override { return false; }
  int64_t vocab_size() const override { return 0; }
  std::string eos_token() const override { return {}; }
  std::string bos_token() const override { return {}; }

 private:
  const std::string empty_;
};

int run(const Args& a) {
  const SpecPolicyKind spec_policy = parse_spec_policy(a.spec_policy);
  const int given = int(!a.prompt_ids.empty()) + int(!a.prompt.empty()) + int(!a.chat.empty());
  if (given != 1) throw InputError("give exactly one of --prompt-ids, --prompt, --chat");
  if (a.max_tokens < 0) throw InputError("--max-tokens must be >= 0");

  std::unique_ptr<Tokenizer> tok;
  const bool has_tokenizer = file_exists(path_join(a.model, "tokenizer.json"));
  if (has_tokenizer) tok = Tokenizer::load(a.model);
  else if (a.prompt_ids.empty())
    throw InputError(a.model + ": no tokenizer.json, so --prompt / --chat cannot be used (give --prompt-ids)");

  std::vector<int32_t> prompt;
  if (!a.prompt_ids.empty()) {
    prompt = parse_ids(a.prompt_ids);
  } else if (!a.prompt.empty()) {
    prompt = tok->encode(a.prompt);
  } else {
    auto tmpl = ChatTemplate::load(a.model);
    nlohmann::ordered_json req = {{"messages", {{{"role", "user"}, {"content", a.chat}}}}};
    prompt = tok->encode(render_chat_request(*tmpl, req));
  }
  if (prompt.empty()) throw InputError("the prompt is empty");

  auto weights = load_model(a.model);
  auto backend = make_backend(a.backend, weights, a.threads);
  backend->set_draft_vocab(a.draft_vocab);
  const ModelConfig& cfg = backend->config();
  const SamplingParams sp = sampling_params(a, cfg);
  std::fprintf(stderr, "backend: %s; prompt %zu tokens; temperature %g top_p %g top_k %d min_p %g seed %llu\n",
               backend->describe().c_str(), prompt.size(), double(sp.temperature), double(sp.top_p), sp.top_k,
               double(sp.min_p), (unsigned long long)sp.seed);

  const int spec = effective_spec_tokens(a.spec_tokens, *backend, *weights);
  auto session = backend->new_session(int64_t(prompt.size()) + a.max_tokens + 1);
  GenerationStats st;
  std::vector<int32_t> out;
  auto is_eos = [&](int32_t t) {
    if (a.ignore_eos) return false;
    for (int32_t e : cfg.eos_token_ids)
      if (e == t) return true;
    return false;
  };
  double prefill_s = 0, decode_s = 0;
  if (a.max_tokens > 0) {
    NoTextTokenizer no_text;
    Generator gen(*session, tok ? *tok : static_cast<const Tokenizer&>(no_text), nullptr);
    GenerationRequest req;
    req.prompt = prompt;
    req.sampling = sp;
    req.max_tokens = a.max_tokens;
    req.prefill_chunk = int64_t(prompt.size());  // one prefill call
    req.draft_tokens = spec;
    req.spec_policy = spec_policy;
    // End-of-turn ids are handled here (not as the request's stop_ids) so that the one that ends the
    // generation is reported with the others.
    auto print = [&](const std::string& text) {
      if (!tok || text.empty()) return;
      std::fputs(text.c_str(), stdout);
      std::fflush(stdout);
    };
    st = gen.run(req, [&](const GeneratedToken& g) {
      if (g.id < 0) {  // the final flush
        print(g.text);
        return true;
      }
      out.push_back(g.id);
      if (!is_eos(g.id)) {
        print(g.text);
        return true;
      }
      // The end-of-turn token's own text is not shown (what it releases before it is).
      const std::string& eos_text = tok ? tok->token_bytes(g.id) : std::string();
      std::string text = g.text;
      if (text.size() >= eos_text.size() && text.compare(text.size() - eos_text.size(), eos_text.size(), eos_text) == 0)
        text.resize(text.size() - eos_text.size());
      print(text);
      return false;
    });
    if (tok) std::fputs("\n", stdout);
    prefill_s = st.ttft_seconds;  // prefill and the first token's sampling
    decode_s = st.decode_seconds - (st.ttft_seconds - st.prefill_seconds);
  } else {
    const auto t0 = std::chrono::steady_clock::now();
    session->prefill(prompt);
    prefill_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  std::printf("generated ids:");
  for (size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? "," : " ", out[i]);
  std::printf("\n");
  const double n_decode = out.size() > 1 ? double(out.size() - 1) : 0.0;
  std::printf("prefill: %zu tokens in %.3f s (%.1f tokens/s); decode: %.0f tokens in %.3f s (%.1f tokens/s)\n",
              prompt.size(), prefill_s, prefill_s > 0 ? double(prompt.size()) / prefill_s : 0.0, n_decode, decode_s,
              decode_s > 0 ? n_decode / decode_s : 0.0);
  if (!out.empty() && is_eos(out.back())) std::printf("stopped at end-of-turn token %d\n", out.back());
  if (spec > 0)
    std::printf("speculative (%s): %lld of %lld steps with drafts, %lld of %lld drafts accepted, %.2f drafts per step\n",
                a.spec_policy.c_str(), (long long)st.spec_rounds, (long long)st.decode_steps,
                (long long)st.spec_accepted, (long long)st.spec_drafted,
                st.decode_steps ? double(st.spec_drafted) / double(st.decode_steps) : 0.0);
  return 0;
}

const bool registered = register_command(Command{
    "generate", "generate tokens from a prompt (ids, text or one chat message) and report the speed",
    [](CLI::App& sub) -> std::function<int()> {
      auto a = std::make_shared<Args>();
      sub.add_option("--model", a->model, "model folder (MLX 4-bit or Hugging Face layout)")->required();
      sub.add_option("--prompt-ids", a->prompt_ids, "prompt as comma-separated token ids, e.g. 1,2,3");
      sub.add_option("--prompt", a->prompt, "prompt text (tokenized with the model folder's tokenizer)");
      sub.add_option("--chat", a->chat, "one user message, rendered through the model folder's chat template");
      sub.add_option("--max-tokens", a->max_tokens, "maximum number of tokens to generate")->capture_default_str();
      add_backend_options(sub, a->backend, a->threads);
      add_spec_option(sub, a->spec_tokens);
      add_draft_vocab_option(sub, a->draft_vocab);
      add_spec_policy_option(sub, a->spec_policy);
      sub.add_option("--temperature", a->temperature, "0 = greedy (default: generation_config.json, else 0)");
      sub.add_option("--top-p", a->top_p, "nucleus sampling");
      sub.add_option("--top-k", a->top_k, "keep the k most likely tokens (0 = off)");
      sub.add_option("--min-p", a->min_p, "drop tokens below min_p x the most likely one's probability");
      sub.add_option("--repetition-penalty", a->repetition_penalty, "HF-style repetition penalty (1 = off)");
      sub.add_option("--presence-penalty", a->presence_penalty, "OpenAI-style presence penalty");
      sub.add_option("--frequency-penalty", a->frequency_penalty, "OpenAI-style frequency penalty");
      sub.add_option("--seed", a->seed, "random seed for sampling")->capture_default_str();
      sub.add_flag("--ignore-eos", a->ignore_eos, "do not stop at the model's end-of-turn tokens");
      return [a] { return run(*a); };
    }});

}  // namespace
}  // namespace lilac::cli
