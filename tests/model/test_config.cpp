// config.json / generation_config.json parsing and validation.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/config.h"

namespace lilac {
namespace {

using json = nlohmann::json;

// A flat (text-only, older-style) config with top-level RoPE fields and no layer_types.
json flat() {
  return json{{"model_type", "qwen3_5_moe_text"},
              {"vocab_size", 1000},
              {"hidden_size", 128},
              {"num_hidden_layers", 8},
              {"num_attention_heads", 8},
              {"num_key_value_heads", 2},
              {"head_dim", 32},
              {"max_position_embeddings", 4096},
              {"linear_num_key_heads", 2},
              {"linear_num_value_heads", 6},
              {"linear_key_head_dim", 16},
              {"linear_value_head_dim", 24},
              {"linear_conv_kernel_dim", 3},
              {"num_experts", 10},
              {"num_experts_per_tok", 3},
              {"moe_intermediate_size", 64},
              {"shared_expert_intermediate_size", 96},
              {"rms_norm_eps", 1e-5},
              {"hidden_act", "silu"},
              {"attention_bias", false},
              {"rope_theta", 5000.0},
              {"partial_rotary_factor", 0.5},
              {"rope_scaling", nullptr},
              {"full_attention_interval", 4},
              {"eos_token_id", 7}};
}

ModelConfig parse(const json& j, const std::string& gen = "") { return parse_config(j.dump(), "/m/config.json", gen); }

std::string error_of(const json& j, const std::string& gen = "") {
  try {
    parse(j, gen);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Config, FlatOlderStyle) {
  ModelConfig c = parse(flat());
  EXPECT_EQ(c.model_type, "qwen3_5_moe_text");
  EXPECT_EQ(c.vocab_size, 1000);
  EXPECT_EQ(c.num_layers, 8);
  EXPECT_DOUBLE_EQ(c.rope_theta, 5000.0);
  EXPECT_DOUBLE_EQ(c.partial_rotary_factor, 0.5);
  EXPECT_EQ(c.rotary_dim, 16);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.linear_conv_kernel_dim, 3);
  // (i + 1) % 4 == 0 -> layers 3 and 7.
  EXPECT_EQ(c.full_attention, (std::vector<bool>{false, false, false, true, false, false, false, true}));
  EXPECT_EQ(c.num_attention_layers(), 2);
  EXPECT_EQ(c.q_proj_rows(), 8 * 32 * 2);
  EXPECT_EQ(c.gdn_conv_dim(), 2 * 2 * 16 + 6 * 24);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{7}));  // fallback: config's eos_token_id
  EXPECT_FALSE(c.quantized);
  EXPECT_EQ(c.default_temperature, -1);
}

TEST(Config, NestedWithRopeParametersAndLayerTypes) {
  json t = flat();
  t.erase("rope_theta");
  t.erase("partial_rotary_factor");
  t.erase("full_attention_interval");
  t["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e7}, {"partial_rotary_factor", 0.25},
                          {"mrope_section", {1, 1, 1}}, {"mrope_interleaved", true}};
  t["layer_types"] = {"full_attention", "linear_attention", "linear_attention", "linear_attention",
                      "linear_attention", "full_attention", "linear_attention", "linear_attention"};
  json top = {{"model_type", "qwen3_5_moe"}, {"text_config", t}, {"vision_config", {{"depth", 3}}},
              {"image_token_id", 5}, {"tie_word_embeddings", false}};
  ModelConfig c = parse(top);
  EXPECT_EQ(c.model_type, "qwen3_5_moe_text");
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e7);
  EXPECT_EQ(c.rotary_dim, 8);
  EXPECT_EQ(c.full_attention, (std::vector<bool>{true, false, false, false, false, true, false, false}));
}

TEST(Config, GenerationConfigEosAndSampling) {
  ModelConfig c = parse(flat(), R"({"eos_token_id": [248046, 248044], "temperature": 0.6, "top_p": 0.95,
      "top_k": 20, "min_p": 0.0, "repetition_penalty": 1.05, "presence_penalty": 1.5, "do_sample": true})");
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{248046, 248044}));
  EXPECT_FLOAT_EQ(c.default_temperature, 0.6f);
  EXPECT_FLOAT_EQ(c.default_top_p, 0.95f);
  EXPECT_EQ(c.default_top_k, 20);
  EXPECT_FLOAT_EQ(c.default_min_p, 0.0f);
  EXPECT_FLOAT_EQ(c.default_repetition_penalty, 1.05f);
  EXPECT_FLOAT_EQ(c.default_presence_penalty, 1.5f);
  ModelConfig d = parse(flat(), R"({"eos_token_id": 42})");
  EXPECT_EQ(d.eos_token_ids, (std::vector<int32_t>{42}));
  EXPECT_NE(error_of(flat(), R"({"eos_token_id": "x"})").find("/m/generation_config.json: field 'eos_token_id'"),
            std::string::npos);
  EXPECT_NE(error_of(flat(), "{nope").find("/m/generation_config.json: invalid JSON"), std::string::npos);
}

TEST(Config, QuantizationOverrides) {
  json j = flat();
  j["quantization"] = {{"group_size", 64}, {"bits", 4}, {"mode", "affine"},
                       {"model.layers.0.mlp.gate", {{"group_size", 64}, {"bits", 8}}},
                       {"language_model.model.layers.1.mlp.gate", {{"bits", 8}}}};
  ModelConfig c = parse(j);
  EXPECT_TRUE(c.quantized);
  EXPECT_EQ(quant_spec_for(c, "language_model.model.layers.0.mlp.gate").bits, 8);
  EXPECT_EQ(quant_spec_for(c, "model.layers.0.mlp.gate").bits, 8);
  EXPECT_EQ(quant_spec_for(c, "model.layers.1.mlp.gate").bits, 8);
  EXPECT_EQ(quant_spec_for(c, "model.layers.1.mlp.gate").group_size, 64);
  EXPECT_EQ(quant_spec_for(c, "model.layers.2.mlp.gate").bits, 4);
  j["quantization"]["bits"] = 3;
  EXPECT_NE(error_of(j).find("field 'quantization'.bits = 3 is not supported"), std::string::npos) << error_of(j);
  j = flat();
  j["quantization_config"] = {{"quant_method", "gptq"}, {"group_size", 128}, {"bits", 4}};
  EXPECT_NE(error_of(j).find("field 'quantization_config.quant_method' = \"gptq\" is not supported"), std::string::npos)
      << error_of(j);
  j = flat();
  j["quantization_config"] = {{"group_size", 32}, {"bits", 8}};
  c = parse(j);
  EXPECT_EQ(c.quant.bits, 8);
  EXPECT_EQ(c.quant.group_size, 32);
}

struct BadCase {
  const char* what;
  std::function<void(json&)> edit;
  const char* message;
};

TEST(Config, RejectsWhatTheEngineCannotHonour) {
  const BadCase cases[] = {
      {"model_type", [](json& j) { j["model_type"] = "qwen3_moe"; },
       "/m/config.json: field 'model_type' = 'qwen3_moe' is not supported"},
      {"hidden_act", [](json& j) { j["hidden_act"] = "gelu"; },
       "/m/config.json: field 'hidden_act' = \"gelu\" is not supported"},
      {"attention_bias", [](json& j) { j["attention_bias"] = true; },
       "/m/config.json: field 'attention_bias' = true is not supported"},
      {"rope_scaling", [](json& j) { j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}}; },
       "/m/config.json: field 'rope_scaling.type' = 'yarn' is not supported"},
      {"rope_parameters", [](json& j) { j["rope_parameters"] = {{"rope_type", "linear"}, {"rope_theta", 1e4}}; },
       "/m/config.json: field 'rope_parameters.rope_type' = 'linear' is not supported"},
      {"missing field", [](json& j) { j.erase("num_experts"); }, "/m/config.json: field 'num_experts' is missing"},
      {"zero size", [](json& j) { j["hidden_size"] = 0; }, "field 'hidden_size' must be positive"},
      {"kv heads", [](json& j) { j["num_key_value_heads"] = 3; },
       "field 'num_attention_heads' (8) is not a multiple of num_key_value_heads (3)"},
      {"value heads", [](json& j) { j["linear_num_value_heads"] = 5; },
       "field 'linear_num_value_heads' (5) is not a multiple of linear_num_key_heads (2)"},
      {"odd rotary", [](json& j) { j["partial_rotary_factor"] = 0.03125; }, "not an even rotary dimension"},
      {"rotary > head_dim", [](json& j) { j["partial_rotary_factor"] = 1.5; },
       "field 'partial_rotary_factor' must be in (0, 1]"},
      {"top-k > experts", [](json& j) { j["num_experts_per_tok"] = 11; }, "exceeds num_experts"},
      {"layer_types length", [](json& j) { j["layer_types"] = {"full_attention"}; },
       "field 'layer_types' must be a list of 8 layer types"},
      {"layer type", [](json& j) { j["layer_types"] = json::array(); for (int i = 0; i < 8; ++i) j["layer_types"].push_back("sliding_attention"); },
       "field 'layer_types'[0] = \"sliding_attention\" is not supported"},
      {"no layer pattern", [](json& j) { j.erase("full_attention_interval"); }, "'layer_types' (or 'full_attention_interval') is missing"},
      {"not an integer", [](json& j) { j["vocab_size"] = "1000"; }, "field 'vocab_size' must be an integer"},
  };
  for (const auto& bc : cases) {
    json j = flat();
    bc.edit(j);
    std::string e = error_of(j);
    EXPECT_NE(e.find(bc.message), std::string::npos) << bc.what << ": got \"" << e << "\"";
  }
  // Nested: the field is named with its text_config prefix.
  json top = {{"model_type", "qwen3_5_moe"}, {"text_config", flat()}};
  top["text_config"]["hidden_act"] = "relu";
  EXPECT_NE(error_of(top).find("field 'text_config.hidden_act'"), std::string::npos) << error_of(top);
  EXPECT_NE(std::string(error_of(json::parse("[1]"))).find("/m/config.json: not a JSON object"), std::string::npos);
  try {
    parse_config("{bad json", "/m/config.json");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("/m/config.json: invalid JSON"), std::string::npos);
  }
}

TEST(Config, LoadConfigFromFolder) {
  ModelConfig c = load_config(std::string(LILAC_SHARED_DIR) + "/fixtures/tiny2/mlx4");
  EXPECT_EQ(c.vocab_size, 777);
  EXPECT_EQ(c.linear_value_head_dim, 48);
  EXPECT_TRUE(c.eos_token_ids.empty());  // the fixture names none: left to the tokenizer
  try {
    load_config("/nonexistent/model");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/model/config.json"), std::string::npos);
  }
}

// Expected distinct routed experts per layer for B streams routing independently: the top-k for one stream,
// E (1 - (1 - k/E)^B) in general (the figures the issue names: ~100 of 256 at 16 streams), never above E.
TEST(Config, ExpertsTouchedByBStreams) {
  const ModelConfig c = qwen36_shape(40);
  EXPECT_EQ(c.experts_touched(1), 8.0);
  EXPECT_NEAR(c.experts_touched(2), 256.0 * (1 - (248.0 / 256) * (248.0 / 256)), 1e-9);  // 15.75
  EXPECT_NEAR(c.experts_touched(16), 101.96, 0.01);
  EXPECT_NEAR(c.experts_touched(64), 222.44, 0.01);
  double last = 0;
  for (int b = 1; b <= 512; b *= 2) {
    EXPECT_GT(c.experts_touched(b), last);
    EXPECT_LE(c.experts_touched(b), 256.0);
    last = c.experts_touched(b);
  }
  EXPECT_EQ(c.experts_touched(0), 0.0);
}

}  // namespace
}  // namespace lilac
