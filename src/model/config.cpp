#include "model/config.h"

#include <cmath>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/mapped_file.h"

namespace lilac {

using json = nlohmann::json;

namespace {

struct Reader {
  const json& obj;
  std::string origin;  // file name
  std::string prefix;  // "text_config." or ""

  std::string where(const std::string& key) const { return origin + ": field '" + prefix + key + "'"; }
  bool has(const std::string& key) const { return obj.contains(key) && !obj[key].is_null(); }

  int64_t req_int(const std::string& key) const {
    if (!has(key)) throw InputError(where(key) + " is missing");
    auto& v = obj[key];
    if (!v.is_number_integer()) throw InputError(where(key) + " must be an integer, got " + v.dump());
    return v.get<int64_t>();
  }
  int64_t req_pos(const std::string& key) const {
    int64_t v = req_int(key);
    if (v <= 0) throw InputError(where(key) + " must be positive, got " + std::to_string(v));
    return v;
  }
  int req_pos_int(const std::string& key) const {
    int64_t v = req_pos(key);
    if (v > (int64_t(1) << 30)) throw InputError(where(key) + " is too large: " + std::to_string(v));
    return int(v);
  }
  double req_num(const std::string& key) const {
    if (!has(key)) throw InputError(where(key) + " is missing");
    auto& v = obj[key];
    if (!v.is_number()) throw InputError(where(key) + " must be a number, got " + v.dump());
    return v.get<double>();
  }
  bool opt_bool(const std::string& key, bool def) const {
    if (!has(key)) return def;
    auto& v = obj[key];
    if (!v.is_boolean()) throw InputError(where(key) + " must be true or false, got " + v.dump());
    return v.get<bool>();
  }
};

std::vector<int32_t> parse_eos(const json& v, const std::string& where) {
  std::vector<int32_t> ids;
  auto one = [&](const json& x) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > INT32_MAX)
      throw InputError(where + " must be a token id or a list of token ids, got " + v.dump());
    ids.push_back(int32_t(x.get<int64_t>()));
  };
  if (v.is_array()) {
    for (auto& x : v) one(x);
  } else {
    one(v);
  }
  return ids;
}

// `field` is the object's name as written in the file (e.g. "text_config.rope_scaling").
void check_rope_type(const json& obj, const std::string& origin, const std::string& field) {
  for (const char* key : {"rope_type", "type"}) {
    if (obj.contains(key) && !obj[key].is_null()) {
      std::string where = origin + ": field '" + field + "." + key + "'";
      if (!obj[key].is_string()) throw InputError(where + " must be a string");
      std::string t = obj[key].get<std::string>();
      if (t != "default" && t != "none" && t != "")
        throw InputError(where + " = '" + t + "' is not supported (lilac implements only plain RoPE: 'default')");
    }
  }
}

QuantSpec parse_quant_spec(const json& q, const std::string& where, const QuantSpec& def) {
  QuantSpec s = def;
  if (q.contains("bits")) {
    if (!q["bits"].is_number_integer()) throw InputError(where + ".bits must be an integer");
    s.bits = q["bits"].get<int>();
  }
  if (q.contains("group_size")) {
    if (!q["group_size"].is_number_integer()) throw InputError(where + ".group_size must be an integer");
    s.group_size = q["group_size"].get<int>();
  }
  if (q.contains("mode") && !q["mode"].is_null() && q["mode"] != "affine")
    throw InputError(where + ".mode = " + q["mode"].dump() + " is not supported (only 'affine')");
  if (s.bits != 4 && s.bits != 8)
    throw InputError(where + ".bits = " + std::to_string(s.bits) + " is not supported (4 or 8)");
  if (s.group_size <= 0 || s.group_size % 8 != 0)
    throw InputError(where + ".group_size = " + std::to_string(s.group_size) + " is not supported");
  return s;
}

}  // namespace

QuantSpec quant_spec_for(const ModelConfig& c, const std::string& base) {
  static const std::string lm = "language_model.";
  auto it = c.quant_overrides.find(base);
  if (it != c.quant_overrides.end()) return it->second;
  if (base.rfind(lm, 0) == 0) {
    it = c.quant_overrides.find(base.substr(lm.size()));
  } else {
    it = c.quant_overrides.find(lm + base);
  }
  if (it != c.quant_overrides.end()) return it->second;
  return c.quant;
}

ModelConfig parse_config(const std::string& config_json, const std::string& origin,
                         const std::string& generation_config_json) {
  json top;
  try {
    top = json::parse(config_json);
  } catch (const json::exception& e) {
    throw InputError(origin + ": invalid JSON: " + e.what());
  }
  if (!top.is_object()) throw InputError(origin + ": not a JSON object");

  ModelConfig c;
  const bool nested = top.contains("text_config") && top["text_config"].is_object();
  const json& tj = nested ? top["text_config"] : top;
  Reader r{tj, origin, nested ? "text_config." : ""};
  Reader rt{top, origin, ""};

  // model_type: the text part's, else the top level's.
  std::string mt;
  if (r.has("model_type") && tj["model_type"].is_string()) mt = tj["model_type"].get<std::string>();
  else if (rt.has("model_type") && top["model_type"].is_string()) mt = top["model_type"].get<std::string>();
  else throw InputError(origin + ": field 'model_type' is missing");
  if (mt != "qwen3_5_moe" && mt != "qwen3_5_moe_text") {
    std::string field = (r.has("model_type") ? r.prefix : std::string()) + "model_type";
    throw InputError(origin + ": field '" + field + "' = '" + mt +
                     "' is not supported (lilac runs qwen3_5_moe / qwen3_5_moe_text models)");
  }
  if (nested && rt.has("model_type")) {
    std::string t = top["model_type"].is_string() ? top["model_type"].get<std::string>() : "";
    if (t != "qwen3_5_moe" && t != "qwen3_5_moe_text")
      throw InputError(origin + ": field 'model_type' = " + top["model_type"].dump() +
                       " is not supported (lilac runs qwen3_5_moe models)");
  }
  c.model_type = mt;

  // Things the engine cannot honour.
  if (r.has("hidden_act")) {
    if (!tj["hidden_act"].is_string() || tj["hidden_act"] != "silu")
      throw InputError(r.where("hidden_act") + " = " + tj["hidden_act"].dump() + " is not supported (only 'silu')");
  }
  if (r.opt_bool("attention_bias", false))
    throw InputError(r.where("attention_bias") + " = true is not supported");

  c.vocab_size = r.req_pos("vocab_size");
  c.hidden_size = r.req_pos("hidden_size");
  c.num_layers = r.req_pos_int("num_hidden_layers");
  c.num_heads = r.req_pos_int("num_attention_heads");
  c.num_kv_heads = r.req_pos_int("num_key_value_heads");
  c.head_dim = r.req_pos_int("head_dim");
  c.attn_output_gate = r.opt_bool("attn_output_gate", true);
  c.max_position_embeddings = r.req_pos("max_position_embeddings");
  c.linear_num_key_heads = r.req_pos_int("linear_num_key_heads");
  c.linear_num_value_heads = r.req_pos_int("linear_num_value_heads");
  c.linear_key_head_dim = r.req_pos_int("linear_key_head_dim");
  c.linear_value_head_dim = r.req_pos_int("linear_value_head_dim");
  c.linear_conv_kernel_dim = r.req_pos_int("linear_conv_kernel_dim");
  c.num_experts = r.req_pos_int("num_experts");
  c.num_experts_per_tok = r.req_pos_int("num_experts_per_tok");
  c.moe_intermediate_size = r.req_pos("moe_intermediate_size");
  c.shared_expert_intermediate_size = r.req_pos("shared_expert_intermediate_size");
  c.norm_topk_prob = r.opt_bool("norm_topk_prob", true);
  c.rms_norm_eps = r.req_num("rms_norm_eps");
  if (!(c.rms_norm_eps > 0) || !std::isfinite(c.rms_norm_eps))
    throw InputError(r.where("rms_norm_eps") + " must be positive");
  // tie_word_embeddings: the text part's, else the top level's (default false).
  if (r.has("tie_word_embeddings")) c.tie_word_embeddings = r.opt_bool("tie_word_embeddings", false);
  else c.tie_word_embeddings = rt.opt_bool("tie_word_embeddings", false);

  // RoPE: rope_parameters (transformers >= 5) or top-level rope_theta / partial_rotary_factor / rope_scaling.
  bool have_theta = false, have_prf = false;
  if (r.has("rope_parameters")) {
    const json& rp = tj["rope_parameters"];
    std::string w = origin + ": field '" + r.prefix + "rope_parameters";
    if (!rp.is_object()) throw InputError(w + "' must be an object");
    check_rope_type(rp, origin, r.prefix + "rope_parameters");
    Reader rr{rp, origin, r.prefix + "rope_parameters."};
    if (rr.has("rope_theta")) {
      c.rope_theta = rr.req_num("rope_theta");
      have_theta = true;
    }
    if (rr.has("partial_rotary_factor")) {
      c.partial_rotary_factor = rr.req_num("partial_rotary_factor");
      have_prf = true;
    }
  }
  if (r.has("rope_scaling")) {
    const json& rs = tj["rope_scaling"];
    if (!rs.is_object()) throw InputError(r.where("rope_scaling") + " must be an object or null");
    check_rope_type(rs, origin, r.prefix + "rope_scaling");
  }
  if (!have_theta) {
    if (!r.has("rope_theta"))
      throw InputError(origin + ": field '" + r.prefix + "rope_parameters.rope_theta' (or '" + r.prefix +
                       "rope_theta') is missing");
    c.rope_theta = r.req_num("rope_theta");
  }
  if (!have_prf && r.has("partial_rotary_factor")) c.partial_rotary_factor = r.req_num("partial_rotary_factor");
  if (!(c.rope_theta > 0)) throw InputError(r.where("rope_theta") + " must be positive");
  if (!(c.partial_rotary_factor > 0 && c.partial_rotary_factor <= 1))
    throw InputError(r.where("partial_rotary_factor") + " must be in (0, 1]");
  double rd = c.head_dim * c.partial_rotary_factor;
  c.rotary_dim = int(std::lround(rd));
  if (std::fabs(rd - c.rotary_dim) > 1e-6 || c.rotary_dim % 2 != 0 || c.rotary_dim <= 0 || c.rotary_dim > c.head_dim)
    throw InputError(r.where("partial_rotary_factor") + ": head_dim " + std::to_string(c.head_dim) + " x " +
                     std::to_string(c.partial_rotary_factor) + " is not an even rotary dimension <= head_dim");

  if (r.has("mtp_num_hidden_layers")) {
    const int64_t n = r.req_int("mtp_num_hidden_layers");
    if (n < 0 || n > 64) throw InputError(r.where("mtp_num_hidden_layers") + " must be in [0, 64], got " + std::to_string(n));
    c.mtp_num_hidden_layers = int(n);
  }

  // Layer types.
  if (r.has("layer_types")) {
    const json& lt = tj["layer_types"];
    if (!lt.is_array() || int64_t(lt.size()) != c.num_layers)
      throw InputError(r.where("layer_types") + " must be a list of " + std::to_string(c.num_layers) + " layer types");
    for (size_t i = 0; i < lt.size(); ++i) {
      if (lt[i] == "full_attention") c.full_attention.push_back(true);
      else if (lt[i] == "linear_attention") c.full_attention.push_back(false);
      else
        throw InputError(r.where("layer_types") + "[" + std::to_string(i) + "] = " + lt[i].dump() +
                         " is not supported (full_attention or linear_attention)");
    }
  } else if (r.has("full_attention_interval")) {
    int64_t iv = r.req_pos("full_attention_interval");
    for (int i = 0; i < c.num_layers; ++i) c.full_attention.push_back((i + 1) % iv == 0);
  } else {
    throw InputError(origin + ": field '" + r.prefix + "layer_types' (or 'full_attention_interval') is missing");
  }

  // Consistency.
  if (c.num_heads % c.num_kv_heads != 0)
    throw InputError(r.where("num_attention_heads") + " (" + std::to_string(c.num_heads) +
                     ") is not a multiple of num_key_value_heads (" + std::to_string(c.num_kv_heads) + ")");
  if (c.linear_num_value_heads % c.linear_num_key_heads != 0)
    throw InputError(r.where("linear_num_value_heads") + " (" + std::to_string(c.linear_num_value_heads) +
                     ") is not a multiple of linear_num_key_heads (" + std::to_string(c.linear_num_key_heads) + ")");
  if (c.num_experts_per_tok > c.num_experts)
    throw InputError(r.where("num_experts_per_tok") + " (" + std::to_string(c.num_experts_per_tok) +
                     ") exceeds num_experts (" + std::to_string(c.num_experts) + ")");

  // Quantization (MLX layout).
  const char* qkey = top.contains("quantization") ? "quantization"
                     : top.contains("quantization_config") ? "quantization_config" : nullptr;
  if (qkey && !top[qkey].is_null()) {
    const json& q = top[qkey];
    std::string w = origin + ": field '" + std::string(qkey) + "'";
    if (!q.is_object()) throw InputError(w + " must be an object");
    // MLX writes no quant_method; transformers-style blocks (gptq, awq, fp8, ...) do.
    if (q.contains("quant_method"))
      throw InputError(origin + ": field '" + std::string(qkey) + ".quant_method' = " + q["quant_method"].dump() +
                       " is not supported (lilac reads MLX affine 4/8-bit checkpoints or unquantized ones)");
    c.quantized = true;
    c.quant = parse_quant_spec(q, origin + ": field '" + qkey + "'", QuantSpec{});
    if (!q.contains("bits") || !q.contains("group_size"))
      throw InputError(w + " needs 'bits' and 'group_size'");
    for (auto& [k, v] : q.items()) {
      if (!v.is_object()) continue;  // bits, group_size, mode, ...
      c.quant_overrides[k] = parse_quant_spec(v, origin + ": field '" + std::string(qkey) + "." + k + "'", c.quant);
    }
  }

  // End-of-turn ids and default sampling.
  if (r.has("eos_token_id")) c.eos_token_ids = parse_eos(tj["eos_token_id"], r.where("eos_token_id"));
  else if (rt.has("eos_token_id")) c.eos_token_ids = parse_eos(top["eos_token_id"], rt.where("eos_token_id"));
  if (!generation_config_json.empty()) {
    std::string gorigin = "generation_config.json";
    auto slash = origin.rfind('/');
    if (slash != std::string::npos) gorigin = origin.substr(0, slash + 1) + gorigin;
    json g;
    try {
      g = json::parse(generation_config_json);
    } catch (const json::exception& e) {
      throw InputError(gorigin + ": invalid JSON: " + e.what());
    }
    if (!g.is_object()) throw InputError(gorigin + ": not a JSON object");
    Reader rg{g, gorigin, ""};
    if (rg.has("eos_token_id")) c.eos_token_ids = parse_eos(g["eos_token_id"], rg.where("eos_token_id"));
    auto num = [&](const char* k, float* out) {
      if (rg.has(k)) *out = float(rg.req_num(k));
    };
    num("temperature", &c.default_temperature);
    num("top_p", &c.default_top_p);
    num("min_p", &c.default_min_p);
    num("repetition_penalty", &c.default_repetition_penalty);
    num("presence_penalty", &c.default_presence_penalty);
    if (rg.has("top_k")) c.default_top_k = int(rg.req_int("top_k"));
  }
  return c;
}

double ModelConfig::experts_touched(int64_t streams) const {
  if (num_experts <= 0 || streams <= 0) return 0;
  const double E = double(num_experts), k = double(std::min<int64_t>(num_experts_per_tok, num_experts));
  return E * (1.0 - std::pow(1.0 - k / E, double(streams)));
}

ModelConfig load_config(const std::string& dir) {
  std::string path = path_join(dir, "config.json");
  if (!file_exists(path)) throw InputError("missing " + path + " (not a model folder?)");
  std::string gen;
  std::string gpath = path_join(dir, "generation_config.json");
  if (file_exists(gpath)) gen = read_text_file(gpath);
  return parse_config(read_text_file(path), path, gen);
}

ModelConfig qwen36_shape(int layers, int mtp_layers) {
  ModelConfig c;
  c.model_type = "qwen3_5_moe";
  c.vocab_size = 248320;
  c.hidden_size = 2048;
  c.num_layers = layers;
  c.num_heads = 16;
  c.num_kv_heads = 2;
  c.head_dim = 256;
  c.attn_output_gate = true;
  c.rope_theta = 10000000.0;
  c.partial_rotary_factor = 0.25;
  c.rotary_dim = 64;
  c.max_position_embeddings = 262144;
  c.linear_num_key_heads = 16;
  c.linear_num_value_heads = 32;
  c.linear_key_head_dim = 128;
  c.linear_value_head_dim = 128;
  c.linear_conv_kernel_dim = 4;
  c.num_experts = 256;
  c.num_experts_per_tok = 8;
  c.moe_intermediate_size = 512;
  c.shared_expert_intermediate_size = 512;
  c.norm_topk_prob = true;
  c.rms_norm_eps = 1e-6;
  c.full_attention.resize(size_t(layers));
  for (int i = 0; i < layers; ++i) c.full_attention[size_t(i)] = (i % 4 == 3);
  c.quantized = true;
  c.quant = {4, 64};
  c.eos_token_ids = {248046, 248044};
  c.mtp_num_hidden_layers = mtp_layers;
  return c;
}

}  // namespace lilac
