// `lilac perplexity`: the perplexity of a text under the model, windowed as llama.cpp's
// llama-perplexity does (engine/perplexity.h), so the numbers of the two engines on one text can be compared: a
// check that the served model computes the function its checkpoint defines.
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/backend_select.h"
#include "cli/command.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "engine/perplexity.h"
#include "model/weights.h"
#include "text/tokenizer.h"

namespace lilac::cli {
namespace {

struct Args {
  std::string model, file, text, backend = "auto";
  int threads = 0;
  int64_t ctx = 512, first = -1, max_windows = 0;
};

int run(const Args& a) {
  if (a.file.empty() == a.text.empty()) throw InputError("give exactly one of --file, --text");
  if (!file_exists(path_join(a.model, "tokenizer.json"))) throw InputError(a.model + ": no tokenizer.json");
  const auto tok = Tokenizer::load(a.model);
  const std::vector<int32_t> ids = tok->encode(a.file.empty() ? a.text : read_text_file(a.file), /*parse_special=*/false);
  auto weights = load_model(a.model);
  auto backend = make_backend(a.backend, weights, a.threads);
  PerplexityOptions o;
  o.ctx = a.ctx;
  o.first = a.first;
  o.max_windows = a.max_windows;
  std::fprintf(stderr, "backend: %s; %zu tokens; windows of %lld tokens, scored from position %lld\n",
               backend->describe().c_str(), ids.size(), (long long)o.ctx, (long long)o.first_scored());
  const PerplexityResult r = perplexity(*backend, *tok, ids, o, [](const PerplexityWindow& w, const PerplexityResult& s) {
    std::printf("window at token %lld: %lld tokens scored, ppl %.4f (running %.4f), %.2f s\n", (long long)w.start,
                (long long)w.scored, std::exp(w.nll / double(w.scored)), s.ppl(), w.seconds);
    std::fflush(stdout);
  });
  std::printf("perplexity: %.4f +/- %.4f over %lld tokens in %zu windows (%lld tokens computed, %.1f tokens/s)\n",
              r.ppl(), r.stderr_ppl, (long long)r.scored, r.windows.size(), (long long)r.tokens,
              r.seconds > 0 ? double(r.tokens) / r.seconds : 0.0);
  return 0;
}

const bool registered = register_command(Command{
    "perplexity", "perplexity of a text under the model (windows as llama.cpp's llama-perplexity)",
    [](CLI::App& sub) -> std::function<int()> {
      auto a = std::make_shared<Args>();
      sub.add_option("--model", a->model, "model folder (with tokenizer.json)")->required();
      sub.add_option("--file", a->file, "text file to score (read as plain text: no special tokens)");
      sub.add_option("--text", a->text, "text to score");
      sub.add_option("--ctx", a->ctx, "tokens per window, each computed from a fresh state")->capture_default_str();
      sub.add_option("--first", a->first, "first scored position of a window (default: ctx / 2, as llama.cpp)");
      sub.add_option("--max-windows", a->max_windows, "score at most this many windows (0: all)")->capture_default_str();
      add_backend_options(sub, a->backend, a->threads);
      return [a] { return run(*a); };
    }});

}  // namespace
}  // namespace lilac::cli
