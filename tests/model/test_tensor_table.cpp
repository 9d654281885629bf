// The tensor table (model/tensor_table.h) against the fixtures' real checkpoints: every tensor of an
// MLX fixture is named by the table with the shape its layout stores (quantized as the fixture's
// config.json says), and nothing is left over; HF names and shapes of the fused experts; roles and bits.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "model/config.h"
#include "model/safetensors.h"
#include "model/tensor_table.h"

namespace lilac {
namespace {

const std::string kShared = LILAC_SHARED_DIR;

class TensorTableFixture : public ::testing::TestWithParam<const char*> {};

TEST_P(TensorTableFixture, NamesEveryMlxTensorWithItsShape) {
  const std::string dir = kShared + "/fixtures/" + GetParam() + "/mlx4";
  const ModelConfig c = load_config(dir);
  TensorSet ts = TensorSet::open_dir(dir);
  const LayoutNames names = mlx_names(ts.has("language_model.model.embed_tokens.weight"));
  std::set<std::string> named;
  int entries = 0;
  for_each_tensor(c, [&](const TensorSpec& t) {
    ++entries;
    const std::string base = names.name(t);
    if (t.kind == WeightKind::Matrix || t.kind == WeightKind::Experts) {
      const QuantSpec q = quant_spec_for(c, base);
      EXPECT_EQ(q.bits, t.bits) << base;  // the table's bits are the checkpoint's
      std::vector<int64_t> lead;
      if (t.kind == WeightKind::Experts) lead.push_back(t.count);
      auto with = [&](int64_t last) {
        std::vector<int64_t> s = lead;
        s.push_back(t.rows);
        s.push_back(last);
        return s;
      };
      ASSERT_TRUE(ts.has(base + ".weight")) << base;
      EXPECT_EQ(ts.get(base + ".weight").shape, with(t.cols * t.bits / 32)) << base;
      EXPECT_EQ(ts.get(base + ".scales").shape, with(t.cols / t.group_size)) << base;
      EXPECT_EQ(ts.get(base + ".biases").shape, with(t.cols / t.group_size)) << base;
      for (const char* s : {".weight", ".scales", ".biases"}) named.insert(base + s);
    } else {
      ASSERT_TRUE(ts.has(base)) << base;
      EXPECT_EQ(ts.get(base).shape, names.stored_shape(t)) << base;
      named.insert(base);
    }
  });
  for (auto& [name, t] : ts.tensors()) EXPECT_TRUE(named.count(name)) << "not in the table: " << name;
  EXPECT_EQ(named.size(), ts.tensors().size());
  // embed, lm_head, norm; per layer 2 norms + 8 MoE + 6 attention or 9 Gated DeltaNet.
  EXPECT_EQ(entries, 3 + c.num_layers * 10 + c.num_attention_layers() * 6 + (c.num_layers - c.num_attention_layers()) * 9);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TensorTableFixture, ::testing::Values("tiny", "tiny2"));

ModelConfig two_layer_config() {
  ModelConfig c;
  c.vocab_size = 100;
  c.hidden_size = 64;
  c.num_layers = 2;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 32;
  c.linear_num_key_heads = 1;
  c.linear_num_value_heads = 2;
  c.linear_key_head_dim = 16;
  c.linear_value_head_dim = 32;
  c.linear_conv_kernel_dim = 4;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 128;
  c.shared_expert_intermediate_size = 64;
  c.full_attention = {false, true};
  return c;
}

TEST(TensorTable, RolesShapesAndBits) {
  const ModelConfig c = two_layer_config();
  std::map<std::string, TensorSpec> by_name;
  for (auto& t : tensor_table(c)) by_name.emplace(t.name, t);
  const TensorSpec& q = by_name.at("layers.1.self_attn.q_proj");
  EXPECT_EQ(q.role, TensorRole::QProj);
  EXPECT_EQ(q.layer, 1);
  EXPECT_EQ(q.shape(), (std::vector<int64_t>{2 * 2 * 32, 64}));  // query + gate per head
  EXPECT_EQ(q.bits, 4);
  const TensorSpec& router = by_name.at("layers.0.mlp.gate");
  EXPECT_EQ(router.role, TensorRole::Router);
  EXPECT_EQ(router.bits, 8);
  EXPECT_EQ(by_name.at("layers.0.mlp.shared_expert_gate").bits, 8);
  const TensorSpec& down = by_name.at("layers.0.mlp.experts.down");
  EXPECT_EQ(down.kind, WeightKind::Experts);
  EXPECT_EQ(down.shape(), (std::vector<int64_t>{4, 64, 128}));
  const TensorSpec& conv = by_name.at("layers.0.linear_attn.conv1d.weight");
  EXPECT_EQ(conv.shape(), (std::vector<int64_t>{2 * 16 + 32 * 2, 4}));  // 2 Hk dk + Hv dv
  EXPECT_EQ(by_name.at("layers.0.linear_attn.A_log").kind, WeightKind::Vector);
  EXPECT_EQ(by_name.at("layers.1.self_attn.k_norm.weight").kind, WeightKind::NormCentred);
  EXPECT_FALSE(by_name.count("layers.0.self_attn.q_proj"));  // layer 0 is Gated DeltaNet
  EXPECT_TRUE(by_name.count("lm_head"));
  TableOptions tied;
  tied.lm_head = false;
  for (auto& t : tensor_table(c, tied)) EXPECT_NE(t.role, TensorRole::LmHead);
}

TEST(TensorTable, LayoutNames) {
  const ModelConfig c = two_layer_config();
  std::map<std::string, TensorSpec> t;
  for (auto& s : tensor_table(c)) t.emplace(s.name, s);
  const LayoutNames mlx = mlx_names(), hf = hf_names(), mlx_text = mlx_names(false);
  EXPECT_EQ(mlx.name(t.at("embed_tokens")), "language_model.model.embed_tokens");
  EXPECT_EQ(mlx.name(t.at("lm_head")), "language_model.lm_head");
  EXPECT_EQ(mlx_text.name(t.at("lm_head")), "lm_head");
  EXPECT_EQ(mlx_text.name(t.at("norm.weight")), "model.norm.weight");
  EXPECT_EQ(hf.name(t.at("lm_head")), "lm_head");
  EXPECT_EQ(hf.name(t.at("layers.1.self_attn.o_proj")), "model.language_model.layers.1.self_attn.o_proj");
  EXPECT_EQ(mlx.name(t.at("layers.0.mlp.experts.up")), "language_model.model.layers.0.mlp.switch_mlp.up_proj");
  EXPECT_EQ(hf.name(t.at("layers.0.mlp.experts.gate")), "model.language_model.layers.0.mlp.experts.gate_up_proj");
  EXPECT_EQ(hf.name(t.at("layers.0.mlp.experts.up")), "model.language_model.layers.0.mlp.experts.gate_up_proj");
  EXPECT_EQ(hf.name(t.at("layers.0.mlp.experts.down")), "model.language_model.layers.0.mlp.experts.down_proj");
  EXPECT_EQ(hf.expert_name(t.at("layers.0.mlp.experts.down"), 3),
            "model.language_model.layers.0.mlp.experts.3.down_proj.weight");
  EXPECT_EQ(hf.stored_shape(t.at("layers.0.mlp.experts.up")), (std::vector<int64_t>{4, 256, 64}));
  EXPECT_EQ(hf.stored_shape(t.at("layers.0.mlp.experts.down")), (std::vector<int64_t>{4, 64, 128}));
  EXPECT_EQ(mlx.stored_shape(t.at("layers.0.linear_attn.conv1d.weight")), (std::vector<int64_t>{96, 4, 1}));
  EXPECT_EQ(hf.stored_shape(t.at("layers.0.linear_attn.conv1d.weight")), (std::vector<int64_t>{96, 1, 4}));
}

}  // namespace
}  // namespace lilac
