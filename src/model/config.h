// The model's hyper-parameters, read from config.json (+ generation_config.json) and validated.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace lilac {

struct QuantSpec {
  int bits = 4;
  int group_size = 64;
};

struct ModelConfig {
  std::string model_type;  // "qwen3_5_moe" (text part "qwen3_5_moe_text")
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int num_layers = 0;
  // Gated attention
  int num_heads = 0, num_kv_heads = 0, head_dim = 0;
  bool attn_output_gate = true;
  double rope_theta = 10000.0;
  double partial_rotary_factor = 1.0;
  int rotary_dim = 0;  // head_dim * partial_rotary_factor (even)
  int64_t max_position_embeddings = 0;
  // Gated DeltaNet
  int linear_num_key_heads = 0, linear_num_value_heads = 0;
  int linear_key_head_dim = 0, linear_value_head_dim = 0;
  int linear_conv_kernel_dim = 4;
  // MoE
  int num_experts = 0, num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0, shared_expert_intermediate_size = 0;
  bool norm_topk_prob = true;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  std::vector<bool> full_attention;  // per layer: true = gated attention, false = Gated DeltaNet
  // Multi-token-prediction head (../shared/MODEL_MTP.md): -1 = not given (count the checkpoint's
  // mtp.layers.N), 0 = none.
  int mtp_num_hidden_layers = -1;

  // Checkpoint quantization (MLX layout): default spec + per-tensor overrides keyed by the
  // tensor base name as written in config.json (e.g. "language_model.model.layers.0.mlp.gate").
  bool quantized = false;
  QuantSpec quant;
  std::map<std::string, QuantSpec> quant_overrides;

  // From generation_config.json (else config.json, else the tokenizer): end-of-turn ids and
  // default sampling parameters (negative / empty = not given).
  std::vector<int32_t> eos_token_ids;
  float default_temperature = -1, default_top_p = -1, default_min_p = -1;
  int default_top_k = -1;
  float default_repetition_penalty = -1, default_presence_penalty = -1;

  // Derived sizes.
  int64_t q_proj_rows() const { return int64_t(num_heads) * head_dim * (attn_output_gate ? 2 : 1); }
  int64_t kv_dim() const { return int64_t(num_kv_heads) * head_dim; }
  int64_t gdn_key_dim() const { return int64_t(linear_num_key_heads) * linear_key_head_dim; }
  int64_t gdn_value_dim() const { return int64_t(linear_num_value_heads) * linear_value_head_dim; }
  int64_t gdn_conv_dim() const { return 2 * gdn_key_dim() + gdn_value_dim(); }
  // Expected distinct routed experts per layer when `streams` rows each choose num_experts_per_tok of
  // num_experts independently and uniformly: E (1 - (1 - k/E)^streams); k for one stream, ~102 of 256 for 16.
  double experts_touched(int64_t streams) const;
  int num_attention_layers() const {
    int n = 0;
    for (bool b : full_attention) n += b;
    return n;
  }
};

// Parse `dir/config.json` (multimodal wrapper with text_config, or flat) and
// `dir/generation_config.json` if present. Throws lilac::Error naming the file and field.
ModelConfig load_config(const std::string& dir);

// The served model's own shape, Qwen3.6-35B-A3B (hidden 2048, 256 experts top-8 of width 512 plus a shared
// expert, 3 Gated DeltaNet layers then one gated attention layer, vocabulary 248,320, MLX 4-bit), with
// `layers` decoder layers and `mtp_layers` MTP layers: what `lilac bench --synthetic` fills with random
// weights on every backend.
ModelConfig qwen36_shape(int layers = 40, int mtp_layers = 0);
// Same, from JSON text (for tests); `origin` is used in error messages.
ModelConfig parse_config(const std::string& config_json, const std::string& origin,
                         const std::string& generation_config_json = "");

// The quantization of the tensor with base name `base` (e.g. "language_model.model.layers.0.mlp.gate"
// or "model.layers.0.mlp.gate"): its override in config.json (looked up with and without the
// "language_model." prefix), else the default spec.
QuantSpec quant_spec_for(const ModelConfig& config, const std::string& base);

}  // namespace lilac
