// `lilac bench --synthetic [--layers N] [--prompt-lens 512,4096,16384] [--json FILE]` or
// `lilac bench --model DIR [--backend cuda|cpu|cpu-ref]` (--synthetic also with --backend cpu): time to
// first token (prefill tok/s) and decode tok/s for each prompt length, GPU memory in use, and the
// fraction of the bandwidth floor achieved (bytes that must move per decode token / measured time /
// --peak-tbs: 4.3 TB/s for the H200; for the CPU give the copy benchmark's figure).
//
// With `--batch 1,2,4,...` it measures batched decoding instead (Backend::decode_batch): for each
// prompt length and batch size B, B sessions at that context length (one prefill of the shared part,
// restored into every session, then 8 random tokens of its own, so the greedy streams and their expert
// choices differ) decode together; it reports the step time,
// the aggregate and per-stream decode tok/s, the memory in use (GPU memory on CUDA, the process's
// resident memory on the CPU) and the step's floor: the bytes it must move (the weights and the routed
// experts the B streams are expected to touch, each once, plus every stream's own state) at --peak-tbs,
// and the step time's share of it. One untimed step per batch size comes first (CUDA graph capture).
// `--follow-mtp` turns drafting on in every session (Session::enable_drafting, as `serve --spec-tokens K` does
// for every stream): the batched steps then also feed each stream's MTP head (its catch-up rows), which is what
// speculation costs a server while several streams decode together and none drafts.
//
// Decode tok/s = 64 / (time from the 1st to the 65th token), measured after one untimed decode step
// (that step captures the session's CUDA graph; its time is reported separately as first_step_ms).
//
// `--spec-tokens K --draft-accept P,... [--spec-policy adaptive|fixed|both]`: speculative decoding at known
// acceptances, with the draft policy fixed at K and adaptive side by side (cli/bench_spec.h).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <fstream>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "cli/backend_select.h"
#include "cli/bench_spec.h"
#include "cli/command.h"
#include "cli/spec_options.h"
#include "core/error.h"
#include "cpufast/synthetic.h"
#include "model/weights.h"
#include "text/json_dump.h"

#if defined(LILAC_HAVE_CUDA) && __has_include("cuda/cuda_backend.h")
#include "cuda/cuda_backend.h"
#define LILAC_BENCH_CUDA 1
#else
#define LILAC_BENCH_CUDA 0
#endif

namespace lilac::cli {
namespace {

struct BenchOptions {
  bool synthetic = false;
  std::string model;
  std::string backend = "auto";
  int threads = 0;
  int layers = 40;
  std::string prompt_lens = "512,4096,16384";
  int decode_tokens = 64;
  std::string json;
  std::string batch;  // batch sizes: batched-decode mode
  bool follow_mtp = false;  // batched mode: every session keeps its MTP head in step (as serve --spec-tokens K)
  uint64_t seed = 1;
  double peak_tbs = 4.3;
  int spec_tokens = 0;
  int64_t draft_vocab = 0;   // --draft-vocab (Session::set_draft_vocab)
  std::string draft_accept;  // comma-separated probabilities; empty: the head's own drafts
  std::string spec_policy = "both";
  double token_mask = -1;    // > 0: also decode with a token mask allowing this fraction of the vocabulary
};

using Clock = std::chrono::steady_clock;
double secs(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

std::vector<int64_t> parse_lens(const std::string& s, const char* flag) {
  std::vector<int64_t> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    try {
      const long long n = std::stoll(item);
      if (n < 1) throw InputError(std::string(flag) + ": values must be >= 1");
      v.push_back(n);
    } catch (const std::logic_error&) {
      throw InputError(std::string(flag) + ": '" + item + "' is not a number");
    }
  }
  if (v.empty()) throw InputError(std::string(flag) + ": no values given");
  return v;
}

void write_json(const BenchOptions& o, const nlohmann::json& out) {
  if (o.json.empty()) return;
  std::ofstream f(o.json);
  if (!f) throw InputError("--json: cannot write " + o.json);
  f << dump_json(out, 2) << "\n";
}

// Resident memory of this process (the CPU backend's weights and sessions), 0 when unknown.
double process_rss_gb() {
  std::ifstream f("/proc/self/statm");
  long long pages = 0, resident = 0;
  if (!(f >> pages >> resident)) return 0;
  return double(resident) * double(sysconf(_SC_PAGESIZE)) / 1e9;
}

double memory_used_gb(Backend& backend) {
#if LILAC_BENCH_CUDA
  if (backend.name() == "cuda") return double(cuda::memory_info(backend).used) / 1e9;
#endif
  (void)backend;
  return process_rss_gb();
}

// Bytes a batched step of B streams at context ctx must move, for the backends with a byte model (the fast CPU
// backend and CUDA: their quantized layouts); 0 otherwise.
double step_bytes(const Backend& backend, const ModelConfig& cfg, int64_t ctx, int64_t B) {
  if (backend.name() == "cpu") return cpufast::decode_step_bytes(cfg, ctx, B);
#if LILAC_BENCH_CUDA
  if (backend.name() == "cuda") return cuda::decode_step_bytes(cfg, ctx, B);
#endif
  return 0;
}

// One decode_batch step; a session's failed step (its row's error) ends the bench, as its own decode_step would.
void step_batch(Backend& backend, std::span<Session* const> sessions) {
  rethrow_choice_error(backend.decode_batch(sessions));
}

// B sessions at context P decoding together: step time, aggregate and per-stream tok/s, memory, the floor.
void bench_batches(Backend& backend, const BenchOptions& o, std::mt19937_64& rng, int64_t real_vocab,
                   nlohmann::json& out) {
  const ModelConfig& cfg = backend.config();
  const std::vector<int64_t> batches = parse_lens(o.batch, "--batch");
  out["batch_results"] = nlohmann::json::array();
  std::printf("%8s %6s %10s %12s %14s %10s %10s %10s %8s\n", "context", "batch", "step ms", "agg tok/s",
              "stream tok/s", "x first", "mem GB", "floor ms", "floor %");
  for (int64_t P : parse_lens(o.prompt_lens, "--prompt-lens")) {
    const int64_t own = std::min<int64_t>(8, P), shared_len = P - own;
    const int64_t cap = P + o.decode_tokens + 16;
    std::vector<int32_t> shared(static_cast<size_t>(shared_len));
    for (auto& t : shared) t = int32_t(rng() % uint64_t(real_vocab));
    std::shared_ptr<const SessionSnapshot> base;
    if (shared_len > 0) {
      auto s = backend.new_session(cap);
      s->enable_drafting(o.follow_mtp);
      s->prefill(shared);
      base = s->snapshot();
    }
    double agg1 = 0;
    for (int64_t B : batches) {
      std::vector<std::unique_ptr<Session>> ss;
      std::vector<Session*> ptrs;
      for (int64_t b = 0; b < B; ++b) {
        auto s = backend.new_session(cap);
        s->enable_drafting(o.follow_mtp);
        if (base) s->restore(*base);
        std::vector<int32_t> mine(static_cast<size_t>(own));
        for (auto& t : mine) t = int32_t(rng() % uint64_t(real_vocab));
        s->prefill(mine);
        s->begin_generation(SamplingParams{}, mine);  // greedy: each context differs, so do the streams
        s->sample();
        ptrs.push_back(s.get());
        ss.push_back(std::move(s));
      }
      step_batch(backend, ptrs);  // untimed: graph capture for this batch size
      const auto t0 = Clock::now();
      for (int i = 0; i < o.decode_tokens; ++i) step_batch(backend, ptrs);
      const double dt = secs(t0, Clock::now());
      const double step_ms = dt / o.decode_tokens * 1e3, agg = double(B) * o.decode_tokens / dt;
      if (agg1 == 0) agg1 = agg;  // the first batch size's aggregate: the speedup's reference
      const double mem = memory_used_gb(backend);
      nlohmann::json r;
      r["context"] = P;
      r["batch"] = B;
      r["step_ms"] = step_ms;
      r["aggregate_tok_s"] = agg;
      r["per_stream_tok_s"] = 1e3 / step_ms;
      r["aggregate_vs_first"] = agg / agg1;
      r["memory_gb"] = mem;
      r["session_gb"] = double(backend.session_bytes(cap)) * double(B) / 1e9;
      // the step's floor: the bytes it must move (weights and the expected routed experts once, each stream's
      // state) at --peak-tbs; 0 where the backend has no byte model
      const double bytes = step_bytes(backend, cfg, P + o.decode_tokens / 2, B);
      const double floor_ms = bytes > 0 ? bytes / (o.peak_tbs * 1e12) * 1e3 : 0.0;
      if (bytes > 0) {
        r["step_bytes"] = bytes;
        r["floor_ms"] = floor_ms;
        r["floor_fraction"] = floor_ms / step_ms;
      }
      out["batch_results"].push_back(r);
      std::printf("%8lld %6lld %10.3f %12.1f %14.1f %10.2f %10.2f %10.3f %8.1f\n", (long long)P, (long long)B, step_ms,
                  agg, 1e3 / step_ms, agg1 > 0 ? agg / agg1 : 0.0, mem, floor_ms, floor_ms / step_ms * 100);
      std::fflush(stdout);
    }
  }
}

// Warm-up: module loading, first launches (a 16-token prompt runs on the CUDA rows step, 100 tokens on the
// prefill kernels: both paths).
void warm_up(Backend& backend, std::mt19937_64& rng, int64_t real_vocab) {
  auto s = backend.new_session(128);
  std::vector<int32_t> p(16), q(100);
  for (auto& t : p) t = int32_t(rng() % uint64_t(real_vocab));
  for (auto& t : q) t = int32_t(rng() % uint64_t(real_vocab));
  s->prefill(q);
  s->reset();
  s->prefill(p);
  s->begin_generation(SamplingParams{}, p);
  s->sample();
  s->decode_step();
}

// One session per prompt length: prefill, time to first token (split), decode tok/s, the floor; with
// --token-mask the masked decode speed next to it.
void bench_prompts(Backend& backend, const BenchOptions& o, std::mt19937_64& rng, int64_t real_vocab,
                   nlohmann::json& out) {
  const ModelConfig& cfg = backend.config();
  std::printf("%8s %12s %10s %12s %12s %10s %12s %10s\n", "prompt", "prefill t/s", "ttft s", "decode t/s",
              "ms/token", "1st ms", "MB/token", "floor %");
  for (int64_t P : parse_lens(o.prompt_lens, "--prompt-lens")) {
    // room for the timed steps, and for the masked ones after them with --token-mask
    auto s = backend.new_session(P + (o.token_mask > 0 ? 2 : 1) * (o.decode_tokens + 8));
    std::vector<int32_t> prompt(static_cast<size_t>(P));
    for (auto& t : prompt) t = int32_t(rng() % uint64_t(real_vocab));
    if (P <= 64) {  // short prompts: an untimed first prefill captures the rows step's graph for this length
      s->prefill(prompt);  // (CUDA: once per length and pool, as a server's sessions do once)
      s->reset();
    }
    const auto t0 = Clock::now();
    s->prefill(prompt);
    const auto tp = Clock::now();
    s->begin_generation(SamplingParams{}, prompt);
    const auto tb = Clock::now();
    s->sample();  // the first token
    const auto t1 = Clock::now();
    s->decode_step();  // untimed: captures the decode graph
    const auto t2 = Clock::now();
    for (int i = 0; i < o.decode_tokens; ++i) s->decode_step();
    const auto t3 = Clock::now();
    const double ttft = secs(t0, t1), first_ms = secs(t1, t2) * 1e3, dec = secs(t2, t3);
    const double tok_s = o.decode_tokens / dec, ms_tok = dec / o.decode_tokens * 1e3;
    nlohmann::json r;
    r["prompt_len"] = P;
    r["ttft_s"] = ttft;
    r["ttft_split_ms"] = {{"prefill", secs(t0, tp) * 1e3}, {"begin_generation", secs(tp, tb) * 1e3},
                          {"sample", secs(tb, t1) * 1e3}};
    r["prefill_tok_s"] = double(P) / ttft;
    r["decode_tok_s"] = tok_s;
    r["decode_ms_per_token"] = ms_tok;
    r["first_step_ms"] = first_ms;
    // peak: --peak-tbs (on the CPU e.g. a copy benchmark's figure, bench/bench_membw)
    const double bytes = step_bytes(backend, cfg, P + o.decode_tokens / 2, 1);
    double mb = 0, frac = 0;
    if (bytes > 0) {
      mb = bytes / 1e6;
      frac = bytes / (dec / o.decode_tokens) / (o.peak_tbs * 1e12);
      r["bytes_per_token"] = bytes;
      r["floor_fraction"] = frac;
    }
#if LILAC_BENCH_CUDA
    if (backend.name() == "cuda") {
      const auto mi = cuda::memory_info(backend);
      r["gpu_mem_used_gb"] = double(mi.used) / 1e9;
      r["gpu_mem_total_gb"] = double(mi.total) / 1e9;
      r["weights_gb"] = double(mi.weights) / 1e9;
      r["floor_tok_s"] = o.peak_tbs * 1e12 / bytes;
    }
#endif
    std::printf("%8lld %12.0f %10.3f %12.1f %12.3f %10.1f %12.0f %10.1f\n", (long long)P, double(P) / ttft, ttft,
                tok_s, ms_tok, first_ms, mb, frac * 100);
    if (o.token_mask > 0) {
      // Constrained decoding's cost on the backend: a different mask before every step (as a grammar
      // gives), each allowing a random fraction of the real vocabulary; the host's mask computation is
      // bench_grammar's (not included here).
      const size_t words = size_t((cfg.vocab_size + 31) / 32);
      std::vector<std::vector<uint32_t>> masks(8, std::vector<uint32_t>(words, 0u));
      for (auto& m : masks) {
        for (int64_t t = 0; t < real_vocab; ++t)
          if (double(rng() % 1000000) < o.token_mask * 1e6) m[size_t(t / 32)] |= 1u << (t % 32);
        m[0] |= 1u;  // never empty
      }
      s->set_token_mask(masks[7].data());
      s->decode_step();  // untimed: a masked step's graph
      const auto m0 = Clock::now();
      for (int i = 0; i < o.decode_tokens; ++i) {
        s->set_token_mask(masks[size_t(i % 8)].data());
        s->decode_step();
      }
      const double mdec = secs(m0, Clock::now());
      const double mtok_s = o.decode_tokens / mdec;
      r["masked_decode_tok_s"] = mtok_s;
      r["token_mask_fraction"] = o.token_mask;
      std::printf("%8s with a token mask before every step (%.0f%% of the vocabulary allowed): %.1f t/s = %.3fx\n", "",
                  o.token_mask * 100, mtok_s, mtok_s / tok_s);
    }
    out["results"].push_back(r);
    std::fflush(stdout);
  }
}

int run_bench(const BenchOptions& o) {
  if (o.synthetic == !o.model.empty()) throw InputError("bench: give exactly one of --synthetic or --model DIR");
  if (o.decode_tokens < 1) throw InputError("--decode-tokens must be >= 1");
  if (o.spec_tokens < 0) throw InputError("--spec-tokens must be >= 0");
  SpecBenchOptions so;
  so.spec_tokens = o.spec_tokens;
  so.decode_tokens = o.decode_tokens;
  so.seed = o.seed;
  if (!o.draft_accept.empty()) so.accept = parse_accept_list(o.draft_accept);
  if (!so.accept.empty() && o.spec_tokens == 0) throw InputError("--draft-accept needs --spec-tokens K > 0");
  so.policies = parse_bench_policies(o.spec_policy);
  if (o.spec_tokens > 0) so.prompt_lens = parse_lens(o.prompt_lens, "--prompt-lens");
  if (o.token_mask > 1) throw InputError("--token-mask must be a fraction in (0, 1]");
  if (!o.batch.empty()) parse_lens(o.batch, "--batch");  // bad values fail before the model loads
  if (o.follow_mtp && o.batch.empty()) throw InputError("--follow-mtp measures batched decoding: give --batch");
  std::unique_ptr<Backend> backend;
  std::string what;
  auto t_load0 = Clock::now();
  if (o.synthetic) {
    backend = make_synthetic_backend(o.backend, o.layers, o.seed, o.threads);
    what = "synthetic Qwen3.6-35B-A3B shape, " + std::to_string(o.layers) + " layers, random 4-bit weights";
  } else {
    backend = make_backend(o.backend, load_model(o.model), o.threads);
    what = o.model;
  }
  backend->set_draft_vocab(o.draft_vocab);
  const double load_s = secs(t_load0, Clock::now());
  const ModelConfig& cfg = backend->config();
  std::printf("lilac bench: %s\nbackend: %s (%s), load %.1f s\n", what.c_str(), backend->name().c_str(),
              backend->describe().c_str(), load_s);
  nlohmann::json out;
  out["model"] = what;
  out["backend"] = backend->name();
  out["device"] = backend->describe();
  out["layers"] = cfg.num_layers;
  out["decode_tokens"] = o.decode_tokens;
  out["peak_tb_s"] = o.peak_tbs;
  out["spec_tokens"] = o.spec_tokens;
  if (o.draft_vocab > 0) out["draft_vocab"] = o.draft_vocab;
  if (!so.accept.empty()) out["draft_accept"] = so.accept;
  out["results"] = nlohmann::json::array();
  std::mt19937_64 rng(o.seed);
  const int64_t real_vocab = std::min<int64_t>(cfg.vocab_size, 248077);
  warm_up(*backend, rng, real_vocab);
  if (o.spec_tokens > 0) {
    run_spec_bench(so, *backend, out);
    write_json(o, out);
    return 0;
  }
  if (!o.batch.empty()) {
    if (o.follow_mtp && !backend->new_session(8)->can_draft())
      throw InputError("--follow-mtp: this backend or model has no MTP head to follow");
    out["follow_mtp"] = o.follow_mtp;
    bench_batches(*backend, o, rng, real_vocab, out);
    write_json(o, out);
    return 0;
  }
  bench_prompts(*backend, o, rng, real_vocab, out);
#if LILAC_BENCH_CUDA
  if (backend->name() == "cuda") {
    const auto mi = cuda::memory_info(*backend);
    std::printf("GPU memory: %.2f GB used of %.2f GB, weights %.2f GB\n", mi.used / 1e9, mi.total / 1e9,
                mi.weights / 1e9);
  }
#endif
  write_json(o, out);
  return 0;
}

const bool registered = register_command(Command{
    "bench", "Time prefill and decode (synthetic full-size model on the GPU, or a checkpoint)",
    [](CLI::App& sub) -> std::function<int()> {
      auto o = std::make_shared<BenchOptions>();
      sub.add_flag("--synthetic", o->synthetic,
                   "Random weights of the real model's shape (on the GPU; in memory for --backend cpu)");
      sub.add_option("--model", o->model, "Checkpoint directory to benchmark instead");
      add_backend_options(sub, o->backend, o->threads);
      sub.add_option("--layers", o->layers, "Layers of the synthetic model (default 40)");
      sub.add_option("--prompt-lens", o->prompt_lens, "Comma-separated prompt lengths (default 512,4096,16384)");
      sub.add_option("--decode-tokens", o->decode_tokens, "Timed decode steps (default 64)");
      sub.add_option("--json", o->json, "Also write the results as JSON to this file");
      sub.add_option("--batch", o->batch,
                     "Comma-separated batch sizes: measure batched decoding (decode_batch) at each prompt length "
                     "instead (e.g. 1,2,4,8,16,32,64)");
      sub.add_flag("--follow-mtp", o->follow_mtp,
                   "With --batch: every stream keeps its MTP head in step (what serve --spec-tokens K costs while "
                   "several streams decode together)");
      sub.add_option("--seed", o->seed, "Seed of the random weights and prompts");
      sub.add_option("--peak-tbs", o->peak_tbs, "Memory bandwidth (TB/s) of the floor (default 4.3, H200 copy)");
      sub.add_option("--spec-tokens", o->spec_tokens,
                     "Speculative decoding with at most K drafts per step, next to plain decoding (default 0: off)");
      add_spec_policy_option(sub, o->spec_policy, /*allow_both=*/true);
      add_draft_vocab_option(sub, o->draft_vocab);
      sub.add_option("--token-mask", o->token_mask,
                     "Also decode with a token mask (constrained decoding) before every step allowing this fraction "
                     "of the vocabulary (0..1), and report the masked decode speed next to the plain one");
      sub.add_option("--draft-accept", o->draft_accept,
                     "Force each draft right with this probability (0..1; comma-separated: one run each; default: "
                     "the MTP head's own drafts)");
      return [o] { return run_bench(*o); };
    }});

}  // namespace
}  // namespace lilac::cli
