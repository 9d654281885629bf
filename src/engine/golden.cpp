#include "engine/golden.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <map>

#include <nlohmann/json.hpp>

#include "core/bf16.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "engine/sampler.h"
#include "model/safetensors.h"

namespace lilac {

namespace {

// Row-wise float reader for F32 / BF16 / F16 golden tensors (no copy of the whole tensor).
struct FloatRows {
  const TensorInfo* t = nullptr;
  int64_t rows = 0, cols = 0;
  void row(int64_t r, float* out) const {
    const uint8_t* p = t->data + static_cast<size_t>(r * cols) * dtype_size(t->dtype);
    if (t->dtype == DType::F32) {
      std::memcpy(out, p, static_cast<size_t>(cols) * 4);
    } else {
      for (int64_t c = 0; c < cols; ++c) {
        uint16_t h;
        std::memcpy(&h, p + 2 * c, 2);
        out[c] = t->dtype == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
      }
    }
  }
};

FloatRows float_rows(const TensorSet& ts, const std::string& name, int64_t rows, int64_t cols) {
  const TensorInfo& t = ts.get(name);
  if (t.dtype != DType::F32 && t.dtype != DType::BF16 && t.dtype != DType::F16)
    throw Error(ts.origin() + ": tensor " + name + " has dtype " + dtype_name(t.dtype) + ", expected F32/BF16/F16");
  if (t.shape.size() != 2 || t.shape[0] != rows || t.shape[1] != cols)
    throw Error(ts.origin() + ": tensor " + name + " has shape " + t.shape_str() + ", expected [" +
                std::to_string(rows) + ", " + std::to_string(cols) + "]");
  return FloatRows{&t, rows, cols};
}

std::vector<int32_t> int_vector(const TensorSet& ts, const std::string& name) {
  const TensorInfo& t = ts.get(name);
  if (t.dtype != DType::I32 || t.shape.size() != 1)
    throw Error(ts.origin() + ": tensor " + name + " must be I32 [n], is " + dtype_name(t.dtype) + " " + t.shape_str());
  std::vector<int32_t> v(static_cast<size_t>(t.numel()));
  std::memcpy(v.data(), t.data, v.size() * 4);
  return v;
}

std::vector<float> float_vector(const TensorSet& ts, const std::string& name) {
  const TensorInfo& t = ts.get(name);
  if (t.shape.size() != 1) throw Error(ts.origin() + ": tensor " + name + " must be 1-D, is " + t.shape_str());
  return tensor_to_floats(t);
}

// Half a unit in the last place of `x` rounded to bf16 (8 significant bits).
double half_ulp_bf16(float x) {
  if (x == 0.f || !std::isfinite(x)) return 0.0;
  int e;
  std::frexp(double(x), &e);  // |x| in [2^(e-1), 2^e)
  return std::ldexp(1.0, e - 9);
}

// The MTP rows of one sequence: the backend's head over the teacher-forced pairs, compared row by row with
// `name`.mtp_logits as they stream out (Session::set_draft_logits_sink). False: the backend cannot draft.
bool check_mtp_rows(Backend& backend, const TensorSet& ts, const std::vector<int32_t>& tokens, const GoldenOptions& opts,
                    GoldenSeqResult& r) {
  const int64_t V = backend.config().vocab_size, L = r.length;
  std::unique_ptr<Session> sess = backend.new_session(L + opts.extra_length);
  if (!sess->can_draft()) return false;
  const FloatRows ref = float_rows(ts, r.name + ".mtp_logits", L, V);
  const std::vector<int32_t> next_ids = int_vector(ts, r.name + ".mtp_next_ids");
  const std::vector<int32_t> top1 = int_vector(ts, r.name + ".mtp_top1");
  const std::vector<float> margin = float_vector(ts, r.name + ".mtp_margin");
  if (int64_t(next_ids.size()) != L || int64_t(top1.size()) != L || int64_t(margin.size()) != L)
    throw Error(ts.origin() + ": " + r.name + ".mtp_next_ids/.mtp_top1/.mtp_margin length differs from .tokens");
  r.mtp = true;
  double d2 = 0, r2 = 0;
  std::vector<float> row(static_cast<size_t>(V));
  sess->set_draft_logits_sink([&](int64_t first, int64_t n, const float* lg) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t pos = first + i;
      if (pos < 0 || pos >= L) throw Error("MTP row at position " + std::to_string(pos) + " outside the sequence");
      const float* e = lg + i * V;
      ref.row(pos, row.data());
      for (int64_t j = 0; j < V; ++j) {
        const double d = double(e[j]) - double(row[static_cast<size_t>(j)]);
        r.mtp_max_abs = std::max(r.mtp_max_abs, std::abs(d));
        d2 += d * d;
        r2 += double(row[static_cast<size_t>(j)]) * row[static_cast<size_t>(j)];
      }
      const bool agree = argmax(std::span<const float>(e, static_cast<size_t>(V))) == top1[static_cast<size_t>(pos)];
      r.mtp_top1_agree += agree;
      if (margin[static_cast<size_t>(pos)] >= opts.confident_margin) {
        r.mtp_confident++;
        r.mtp_confident_agree += agree;
      }
      ++r.mtp_rows;
    }
  });
  sess->enable_drafting(true);
  sess->prefill(tokens);
  sess->begin_generation(SamplingParams{}, tokens);
  r.mtp_next_token_agrees = sess->sample().token == next_ids.back();
  sess->draft(1);  // the last row: (h_{L-1}, the main model's greedy token)
  r.mtp_rel_l2 = r2 > 0 ? std::sqrt(d2 / r2) : 0;
  return true;
}

// Greedy generation with speculative decoding (k = 3 drafts per round, the oracle's loop: every round
// drafts 3, whatever is left). False: the backend cannot draft.
bool spec_generation(Backend& backend, const std::vector<int32_t>& prompt, const GoldenOptions& opts, GoldenGenResult& r) {
  const int k = 3;
  const int64_t n = int64_t(r.expected.size());
  std::unique_ptr<Session> sess = backend.new_session(int64_t(prompt.size()) + n + k + opts.extra_length);
  if (!sess->can_draft()) return false;
  r.spec = true;
  sess->enable_drafting(true);
  sess->prefill(prompt);
  sess->begin_generation(SamplingParams{}, prompt);
  std::vector<int32_t> got{sess->sample().token};
  while (int64_t(got.size()) < n) {
    const std::vector<int32_t> drafts = sess->draft(k);
    const std::vector<TokenChoice> ch = sess->verify(drafts);
    rethrow_choice_error(ch);  // a row with no choice: as the decode step that throws there
    r.accepted_got.push_back(int32_t(ch.size()) - 1);
    for (const TokenChoice& c : ch) got.push_back(c.token);
  }
  got.resize(static_cast<size_t>(n));
  r.spec_got = got;
  for (int64_t i = 0; i < n && r.spec_first_mismatch < 0; ++i)
    if (got[static_cast<size_t>(i)] != r.expected[static_cast<size_t>(i)]) r.spec_first_mismatch = i;
  return true;
}

std::string dir_of(const std::string& path) {
  const size_t p = path.find_last_of('/');
  return p == std::string::npos ? "." : path.substr(0, p);
}

}  // namespace

GoldenReport run_golden(Backend& backend, const std::string& golden_path, const GoldenOptions& opts) {
  GoldenReport rep;
  rep.golden_path = golden_path;
  rep.activations_requested = opts.activations;
  const std::string json_path = path_join(dir_of(golden_path), "golden.json");
  nlohmann::json meta;
  try {
    meta = nlohmann::json::parse(read_text_file(json_path));
  } catch (const nlohmann::json::exception& e) {
    throw Error(json_path + ": " + e.what());
  }
  rep.preset = meta.value("preset", "");
  TensorSet ts = TensorSet::open_file(golden_path);
  const ModelConfig& cfg = backend.config();
  const int64_t V = cfg.vocab_size, H = cfg.hidden_size;
  if (!meta.contains("sequences") || !meta["sequences"].is_array())
    throw Error(json_path + ": field 'sequences' missing or not an array");

  for (const auto& s : meta["sequences"]) {
    GoldenSeqResult r;
    r.name = s.at("name").get<std::string>();
    const std::vector<int32_t> tokens = int_vector(ts, r.name + ".tokens");
    r.length = int64_t(tokens.size());
    const FloatRows ref = float_rows(ts, r.name + ".logits", r.length, V);
    r.ref_bf16 = ref.t->dtype == DType::BF16;
    const std::vector<int32_t> top1 = int_vector(ts, r.name + ".top1");
    const std::vector<float> margin = float_vector(ts, r.name + ".margin");
    if (int64_t(top1.size()) != r.length || int64_t(margin.size()) != r.length)
      throw Error(golden_path + ": " + r.name + ".top1/.margin length differs from .tokens");

    // Activations of this sequence, compared as they stream out of the backend.
    std::map<std::string, FloatRows> act_ref;
    std::map<std::string, GoldenActivation> act_res;
    std::unique_ptr<Session> sess = backend.new_session(r.length + opts.extra_length);
    if (opts.activations && s.contains("activations")) {
      for (const auto& a : s["activations"]) {
        const std::string nm = a.get<std::string>();
        act_ref[nm] = float_rows(ts, r.name + "." + nm, r.length, H);
        act_res[nm] = GoldenActivation{r.name, nm, 0, 0};
      }
      if (opts.install_tap) {
        rep.activations_available = opts.install_tap(*sess, [&](const std::string& nm, int64_t first, int64_t n,
                                                                 const float* data) {
          auto it = act_ref.find(nm);
          if (it == act_ref.end()) return;
          std::vector<float> row(static_cast<size_t>(H));
          GoldenActivation& res = act_res[nm];
          for (int64_t i = 0; i < n; ++i) {
            it->second.row(first + i, row.data());
            for (int64_t d = 0; d < H; ++d) {
              res.max_abs = std::max(res.max_abs, double(std::abs(data[i * H + d] - row[static_cast<size_t>(d)])));
              res.ref_max_abs = std::max(res.ref_max_abs, double(std::abs(row[static_cast<size_t>(d)])));
            }
          }
        });
      }
    }

    double d2 = 0, r2 = 0, nll_e = 0, nll_o = 0;
    std::vector<float> row(static_cast<size_t>(V));
    LogitsSink sink = [&](int64_t first, int64_t n, const float* lg) {
      for (int64_t i = 0; i < n; ++i) {
        const int64_t pos = first + i;
        const float* e = lg + i * V;
        ref.row(pos, row.data());
        for (int64_t j = 0; j < V; ++j) {
          const double d = double(e[j]) - double(row[static_cast<size_t>(j)]);
          r.max_abs = std::max(r.max_abs, std::abs(d));
          const double beyond = r.ref_bf16 ? std::abs(d) - half_ulp_bf16(row[static_cast<size_t>(j)]) : std::abs(d);
          r.max_abs_beyond_rounding = std::max(r.max_abs_beyond_rounding, beyond);
          d2 += d * d;
          r2 += double(row[static_cast<size_t>(j)]) * row[static_cast<size_t>(j)];
        }
        const bool agree = argmax(std::span<const float>(e, static_cast<size_t>(V))) == top1[static_cast<size_t>(pos)];
        r.top1_agree += agree;
        if (margin[static_cast<size_t>(pos)] >= opts.confident_margin) {
          r.confident++;
          r.confident_agree += agree;
        }
        if (pos + 1 < r.length) {
          const int32_t next = tokens[static_cast<size_t>(pos + 1)];
          nll_e -= token_logprob(std::span<const float>(e, static_cast<size_t>(V)), next);
          nll_o -= token_logprob(row, next);
        }
      }
    };
    sess->prefill(tokens, &sink);
    r.rel_l2 = r2 > 0 ? std::sqrt(d2 / r2) : 0;
    if (ts.has(r.name + ".mtp_logits")) {
      rep.golden_has_mtp = true;
      if (!check_mtp_rows(backend, ts, tokens, opts, r) && rep.mtp_unchecked.empty())
        rep.mtp_unchecked = "the " + backend.name() + " backend cannot draft with this model";
    }
    if (r.length >= 2) {
      r.ppl_engine = std::exp(nll_e / double(r.length - 1));
      r.ppl_oracle = std::exp(nll_o / double(r.length - 1));
    }
    // In forward order: embed, layer.0, layer.1, ..., final_norm.
    auto rank = [](const std::string& nm) -> int64_t {
      if (nm == "embed") return -1;
      if (nm.rfind("layer.", 0) == 0) return std::atoll(nm.c_str() + 6);
      return std::numeric_limits<int64_t>::max();
    };
    std::vector<GoldenActivation> acts;
    for (auto& [nm, a] : act_res) acts.push_back(a);
    std::stable_sort(acts.begin(), acts.end(),
                     [&](const GoldenActivation& x, const GoldenActivation& y) { return rank(x.name) < rank(y.name); });
    rep.activations.insert(rep.activations.end(), acts.begin(), acts.end());
    rep.seqs.push_back(r);
  }

  if (meta.contains("generations")) {
    for (const auto& g : meta["generations"]) {
      GoldenGenResult r;
      r.name = g.at("name").get<std::string>();
      const std::vector<int32_t> prompt = int_vector(ts, r.name + ".prompt");
      r.expected = int_vector(ts, r.name + ".output");
      r.margin = float_vector(ts, r.name + ".margin");
      r.prompt_length = int64_t(prompt.size());
      const int64_t n = int64_t(r.expected.size());
      if (int64_t(r.margin.size()) != n) throw Error(golden_path + ": " + r.name + ".margin length differs from .output");
      std::unique_ptr<Session> sess = backend.new_session(r.prompt_length + n + opts.extra_length);
      sess->prefill(prompt);
      SamplingParams greedy;
      sess->begin_generation(greedy, prompt);
      for (int64_t i = 0; i < n; ++i) r.got.push_back((i == 0 ? sess->sample() : sess->decode_step()).token);
      for (int64_t i = 0; i < n; ++i) {
        if (r.first_mismatch < 0 && r.got[static_cast<size_t>(i)] != r.expected[static_cast<size_t>(i)]) r.first_mismatch = i;
        if (r.first_low_margin < 0 && r.margin[static_cast<size_t>(i)] < opts.confident_margin) r.first_low_margin = i;
      }
      if (ts.has(r.name + ".mtp_accepted")) {
        rep.golden_has_mtp = true;
        r.accepted_expected = int_vector(ts, r.name + ".mtp_accepted");
        if (!spec_generation(backend, prompt, opts, r) && rep.mtp_unchecked.empty())
          rep.mtp_unchecked = "the " + backend.name() + " backend cannot draft with this model";
      }
      rep.gens.push_back(r);
    }
  }
  return rep;
}

GoldenThresholds GoldenThresholds::for_backend(const std::string& name) {
  GoldenThresholds t;
  t.exact = name == "cpu-ref";  // the fp32 reference; every other backend is reduced precision
  return t;
}

std::string GoldenThresholds::describe() const {
  char buf[512];
  if (exact)
    std::snprintf(buf, sizeof buf,
                  "thresholds (fp32 reference): max |dlogit| <= %.1e on every sequence (beyond half a bf16 ulp of "
                  "the reference where its logits are BF16); every generation identical",
                  max_abs);
  else
    std::snprintf(buf, sizeof buf,
                  "thresholds (reduced precision): top-1 agreement >= %.0f%% where oracle margin >= %.2g; "
                  "|d|/|ref| <= %.1e; perplexity within %.1f%%; generations identical up to the first step with "
                  "oracle margin < %.2g",
                  100 * min_confident_top1, confident_margin, max_rel_l2, max_ppl_rel_pct, confident_margin);
  return buf;
}

std::vector<std::string> golden_failures(const GoldenReport& r, const GoldenThresholds& t) {
  std::vector<std::string> f;
  char buf[256];
  for (const auto& s : r.seqs) {
    if (t.exact) {
      if (!s.ref_bf16 && !(s.max_abs <= t.max_abs)) {
        std::snprintf(buf, sizeof buf, "%s: max |dlogit| %.3e > %.1e", s.name.c_str(), s.max_abs, t.max_abs);
        f.push_back(buf);
      }
      if (s.ref_bf16 && !(s.max_abs_beyond_rounding <= t.max_abs)) {
        std::snprintf(buf, sizeof buf, "%s: max |dlogit| beyond the BF16 reference's rounding %.3e > %.1e",
                      s.name.c_str(), s.max_abs_beyond_rounding, t.max_abs);
        f.push_back(buf);
      }
    } else {
      const double agree = s.confident ? double(s.confident_agree) / double(s.confident) : 1.0;
      if (!(agree >= t.min_confident_top1)) {
        std::snprintf(buf, sizeof buf, "%s: confident top-1 agreement %.2f%% < %.0f%%", s.name.c_str(), 100 * agree,
                      100 * t.min_confident_top1);
        f.push_back(buf);
      }
      if (!(s.rel_l2 <= t.max_rel_l2)) {
        std::snprintf(buf, sizeof buf, "%s: |d|/|ref| %.3e > %.1e", s.name.c_str(), s.rel_l2, t.max_rel_l2);
        f.push_back(buf);
      }
      if (s.length >= 2 && !(std::abs(s.ppl_rel_pct()) <= t.max_ppl_rel_pct)) {
        std::snprintf(buf, sizeof buf, "%s: perplexity differs by %.3f%% > %.1f%%", s.name.c_str(), s.ppl_rel_pct(),
                      t.max_ppl_rel_pct);
        f.push_back(buf);
      }
    }
  }
  for (const auto& s : r.seqs) {
    if (!s.mtp) continue;
    if (s.mtp_rows != s.length) {
      std::snprintf(buf, sizeof buf, "%s: the MTP head delivered %lld rows, expected %lld", s.name.c_str(),
                    (long long)s.mtp_rows, (long long)s.length);
      f.push_back(buf);
    }
    if (!s.mtp_next_token_agrees) f.push_back(s.name + ": the greedy token after the sequence differs (MTP input)");
    if (t.exact && !(s.mtp_max_abs <= t.max_abs)) {
      std::snprintf(buf, sizeof buf, "%s: MTP max |dlogit| %.3e > %.1e", s.name.c_str(), s.mtp_max_abs, t.max_abs);
      f.push_back(buf);
    }
    if (!t.exact) {
      const double agree = s.mtp_confident ? double(s.mtp_confident_agree) / double(s.mtp_confident) : 1.0;
      if (!(agree >= t.min_confident_top1)) {
        std::snprintf(buf, sizeof buf, "%s: MTP confident top-1 agreement %.2f%% < %.0f%%", s.name.c_str(), 100 * agree,
                      100 * t.min_confident_top1);
        f.push_back(buf);
      }
      if (!(s.mtp_rel_l2 <= t.max_rel_l2)) {
        std::snprintf(buf, sizeof buf, "%s: MTP |d|/|ref| %.3e > %.1e", s.name.c_str(), s.mtp_rel_l2, t.max_rel_l2);
        f.push_back(buf);
      }
    }
  }
  for (const auto& g : r.gens) {
    if (!g.spec) continue;
    // Lossless: the speculative output is the backend's own greedy output, whatever the precision.
    if (g.spec_got != g.got) f.push_back(g.name + ": speculative greedy output differs from plain greedy decoding");
    if (t.exact && g.accepted_got != g.accepted_expected)
      f.push_back(g.name + ": drafts accepted per round differ from the oracle's");
  }
  for (const auto& g : r.gens) {
    if (g.first_mismatch < 0) continue;
    const bool ok = !t.exact && g.first_low_margin >= 0 && g.first_mismatch >= g.first_low_margin;
    if (!ok) {
      std::snprintf(buf, sizeof buf, "%s: differs at step %lld (oracle margin %.4f)", g.name.c_str(),
                    (long long)g.first_mismatch, double(g.margin[static_cast<size_t>(g.first_mismatch)]));
      f.push_back(buf);
    }
  }
  return f;
}

std::string format_golden_report(const GoldenReport& r) {
  std::string out;
  char buf[512];
  std::snprintf(buf, sizeof buf, "golden: %s%s%s\n", r.golden_path.c_str(), r.preset.empty() ? "" : " preset ",
                r.preset.c_str());
  out += buf;
  std::snprintf(buf, sizeof buf, "%-8s %6s %12s %12s %9s %16s %12s %12s %9s\n", "seq", "len", "max|dlogit|",
                "|d|/|ref|", "top1", "top1(margin>=.1)", "ppl engine", "ppl oracle", "ppl d%");
  out += buf;
  for (const auto& s : r.seqs) {
    const double agree = 100.0 * double(s.top1_agree) / double(std::max<int64_t>(1, s.length));
    const double cagree = s.confident ? 100.0 * double(s.confident_agree) / double(s.confident) : 100.0;
    char conf[64];
    std::snprintf(conf, sizeof conf, "%.2f%% (%lld)", cagree, (long long)s.confident);
    std::snprintf(buf, sizeof buf, "%-8s %6lld %12.3e %12.3e %8.2f%% %16s %12.5g %12.5g %9.4f\n", s.name.c_str(),
                  (long long)s.length, s.max_abs, s.rel_l2, agree, conf, s.ppl_engine, s.ppl_oracle,
                  s.length >= 2 ? s.ppl_rel_pct() : 0.0);
    out += buf;
  }
  for (const auto& s : r.seqs)
    if (s.ref_bf16) {
      std::snprintf(buf, sizeof buf, "%-8s reference logits are BF16: max |dlogit| beyond their rounding %.3e\n",
                    s.name.c_str(), std::max(0.0, s.max_abs_beyond_rounding));
      out += buf;
    }
  for (const auto& g : r.gens) {
    if (g.first_mismatch < 0) {
      std::snprintf(buf, sizeof buf, "%-8s prompt %lld: %zu/%zu tokens identical\n", g.name.c_str(),
                    (long long)g.prompt_length, g.got.size(), g.expected.size());
    } else {
      std::snprintf(buf, sizeof buf,
                    "%-8s prompt %lld: first mismatch at step %lld (got %d, oracle %d, oracle margin %.4f)\n",
                    g.name.c_str(), (long long)g.prompt_length, (long long)g.first_mismatch,
                    g.got[static_cast<size_t>(g.first_mismatch)], g.expected[static_cast<size_t>(g.first_mismatch)],
                    double(g.margin[static_cast<size_t>(g.first_mismatch)]));
    }
    out += buf;
  }
  for (const auto& s : r.seqs) {
    if (!s.mtp) continue;
    const double agree = 100.0 * double(s.mtp_top1_agree) / double(std::max<int64_t>(1, s.length));
    const double cagree = s.mtp_confident ? 100.0 * double(s.mtp_confident_agree) / double(s.mtp_confident) : 100.0;
    std::snprintf(buf, sizeof buf, "%-8s MTP rows %lld/%lld: max|dlogit| %.3e |d|/|ref| %.3e top1 %.2f%% (margin>=.1: %.2f%% of %lld)\n",
                  s.name.c_str(), (long long)s.mtp_rows, (long long)s.length, s.mtp_max_abs, s.mtp_rel_l2, agree, cagree,
                  (long long)s.mtp_confident);
    out += buf;
  }
  for (const auto& g : r.gens) {
    if (!g.spec) continue;
    int64_t acc = 0, acc_exp = 0;
    for (int32_t a : g.accepted_got) acc += a;
    for (int32_t a : g.accepted_expected) acc_exp += a;
    std::snprintf(buf, sizeof buf,
                  "%-8s speculative (k=3): %s plain greedy; %zu rounds, %lld drafts accepted (oracle: %zu rounds, %lld)%s\n",
                  g.name.c_str(), g.spec_got == g.got ? "identical to" : "DIFFERS from", g.accepted_got.size(),
                  (long long)acc, g.accepted_expected.size(), (long long)acc_exp,
                  g.accepted_got == g.accepted_expected ? "" : " -- per-round acceptance differs");
    out += buf;
  }
  if (r.golden_has_mtp && !r.mtp_unchecked.empty()) out += "MTP rows not checked: " + r.mtp_unchecked + "\n";
  if (r.activations_requested) {
    if (!r.activations_available) {
      out += "activations: this backend has no hidden-state taps\n";
    } else {
      for (const auto& a : r.activations) {
        std::snprintf(buf, sizeof buf, "activation %s.%-12s max|d| %.3e (max|ref| %.3g)\n", a.seq.c_str(),
                      a.name.c_str(), a.max_abs, a.ref_max_abs);
        out += buf;
      }
    }
  }
  return out;
}

}  // namespace lilac
