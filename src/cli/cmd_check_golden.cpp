// `lilac check-golden`: compare a backend with the oracle's golden outputs (teacher-forced logits,
// greedy generations, optionally per-layer hidden states) and print PASS / FAIL.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/backend_select.h"
#include "cli/command.h"
#include "cpu/cpu_backend.h"
#include "engine/golden.h"
#include "model/weights.h"

namespace lilac::cli {
namespace {

struct Args {
  std::string model, golden, backend = "auto";
  int threads = 0;
  bool activations = false;
};

int run(const Args& a) {
  auto weights = load_model(a.model);
  auto backend = make_backend(a.backend, weights, a.threads);
  std::printf("backend: %s\n", backend->describe().c_str());
  GoldenOptions opts;
  opts.activations = a.activations;
  opts.install_tap = [](Session& s, HiddenTap tap) {
    auto* c = dynamic_cast<cpu::CpuSession*>(&s);
    if (!c) return false;
    c->set_activation_tap(std::move(tap));
    return true;
  };
  GoldenReport rep = run_golden(*backend, a.golden, opts);
  std::fputs(format_golden_report(rep).c_str(), stdout);
  const GoldenThresholds th = GoldenThresholds::for_backend(backend->name());
  std::printf("%s\n", th.describe().c_str());
  const auto failures = golden_failures(rep, th);
  for (const auto& f : failures) std::printf("  failed: %s\n", f.c_str());
  const bool mtp_checked = rep.golden_has_mtp && rep.mtp_unchecked.empty();
  std::printf("%s (%zu sequences, %zu generations%s, backend %s)\n", failures.empty() ? "PASS" : "FAIL", rep.seqs.size(),
              rep.gens.size(), mtp_checked ? ", MTP head checked" : "", backend->name().c_str());
  std::fflush(stdout);
  return failures.empty() ? 0 : 1;
}

const bool registered = register_command(Command{
    "check-golden", "compare a backend with golden outputs of the oracle (logits, generations, activations)",
    [](CLI::App& sub) -> std::function<int()> {
      auto a = std::make_shared<Args>();
      sub.add_option("--model", a->model, "model folder (MLX 4-bit or Hugging Face layout)")->required();
      sub.add_option("--golden", a->golden, "golden.safetensors (golden.json beside it)")->required();
      add_backend_options(sub, a->backend, a->threads);
      sub.add_flag("--activations", a->activations,
                   "also report max |d| of the hidden state per layer for the sequence that has them");
      return [a] { return run(*a); };
    }});

}  // namespace
}  // namespace lilac::cli
