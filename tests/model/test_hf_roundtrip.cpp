// HF layout: write an HF copy of the MLX fixtures (dequantized F32, fused experts, zero-centred norms),
// load it back (quantize-on-load) and check every quantized tensor re-quantizes bit for bit to the
// fixture's; then `convert` the HF copy to MLX and check the result equals the fixture too.
//
// This holds at 8 bits too (router, shared_expert_gate), where the plain rule alone would not give every
// group back (see quantize_group in model/quant.h: groups already on a bf16 grid keep it).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/mapped_file.h"
#include "model/hf_writer.h"
#include "model/quant.h"
#include "model/safetensors.h"
#include "model/weight_walk.h"
#include "model/weights.h"
#include "support/model_files.h"

namespace lilac {
namespace {

namespace fs = std::filesystem;
const std::string kShared = LILAC_SHARED_DIR;

std::string temp_dir(const std::string& tag) { return testutil::temp_dir("lilac_model_", tag); }

void expect_same_matrix(const QMatrix& a, const QMatrix& b, int n, const std::string& name) {
  ASSERT_EQ(a.rows, b.rows) << name;
  ASSERT_EQ(a.cols, b.cols) << name;
  ASSERT_EQ(a.bits, b.bits) << name;
  ASSERT_EQ(a.group_size, b.group_size) << name;
  const int64_t cnt = n ? n : 1;
  if (!a.bits) {
    ASSERT_EQ(0, std::memcmp(a.dense, b.dense, size_t(cnt * a.rows * a.cols) * 4)) << name;
    return;
  }
  ASSERT_EQ(0, std::memcmp(a.qweight, b.qweight, size_t(cnt * a.rows * a.words_per_row()) * 4)) << name << " (q)";
  ASSERT_EQ(0, std::memcmp(a.scales, b.scales, size_t(cnt * a.rows * a.groups_per_row()) * 2)) << name << " (scales)";
  ASSERT_EQ(0, std::memcmp(a.biases, b.biases, size_t(cnt * a.rows * a.groups_per_row()) * 2)) << name << " (biases)";
}

// Every tensor of `a` equals the one of `b` (quantized words, scales, biases bit for bit; vectors exactly).
int expect_same_weights(const ModelWeights& a, const ModelWeights& b) {
  std::vector<WeightRef> ra, rb;
  walk_weights(a, [&](const WeightRef& r) { ra.push_back(r); });
  walk_weights(b, [&](const WeightRef& r) { rb.push_back(r); });
  EXPECT_EQ(ra.size(), rb.size());
  int quantized = 0;
  for (size_t i = 0; i < std::min(ra.size(), rb.size()); ++i) {
    EXPECT_EQ(ra[i].name, rb[i].name);
    if (ra[i].matrix) {
      expect_same_matrix(*ra[i].matrix, *rb[i].matrix, 0, ra[i].name);
      quantized += ra[i].matrix->bits != 0;
    } else if (ra[i].experts) {
      EXPECT_EQ(ra[i].experts->n, rb[i].experts->n);
      expect_same_matrix(ra[i].experts->first, rb[i].experts->first, ra[i].experts->n, ra[i].name);
      quantized += ra[i].experts->first.bits != 0;
    } else {
      EXPECT_EQ(*ra[i].values, *rb[i].values) << ra[i].name;
    }
  }
  return quantized;
}

class HfRoundTrip : public ::testing::TestWithParam<const char*> {};

TEST_P(HfRoundTrip, RequantizesBitForBitAndConvertsBack) {
  const std::string fixture = GetParam();
  auto mlx = load_model(kShared + "/fixtures/" + fixture + "/mlx4");
  const std::string hf_dir = temp_dir(fixture + "_hf");
  write_hf_checkpoint(*mlx, hf_dir);

  // The HF copy looks like the original layout.
  TensorSet ts = TensorSet::open_dir(hf_dir);
  const auto& gu = ts.get("model.language_model.layers.0.mlp.experts.gate_up_proj");
  EXPECT_EQ(gu.dtype, DType::F32);
  EXPECT_EQ(gu.shape, (std::vector<int64_t>{mlx->config.num_experts, 2 * mlx->config.moe_intermediate_size,
                                           mlx->config.hidden_size}));
  const auto& conv = ts.get("model.language_model.layers.0.linear_attn.conv1d.weight");
  EXPECT_EQ(conv.shape, (std::vector<int64_t>{mlx->config.gdn_conv_dim(), 1, 4}));
  EXPECT_TRUE(ts.has("lm_head.weight"));
  // Zero-centred norm stored without the +1.
  const auto& n0 = ts.get("model.language_model.layers.0.input_layernorm.weight");
  EXPECT_EQ(tensor_float_at(n0, 1) + 1.0f, mlx->layers[0].input_norm[1]);
  auto cfg = nlohmann::json::parse(read_text_file(hf_dir + "/config.json"));
  EXPECT_FALSE(cfg.contains("quantization"));
  EXPECT_FALSE(cfg.contains("quantization_config"));

  auto hf = load_model(hf_dir);
  EXPECT_FALSE(hf->config.quantized);
  EXPECT_EQ(hf->layers[0].moe.router.bits, 8);
  EXPECT_EQ(hf->layers[0].moe.shared_expert_gate.bits, 8);
  EXPECT_EQ(hf->layers[0].moe.gate.first.bits, 4);
  int q = expect_same_weights(*mlx, *hf);
  EXPECT_EQ(q, 2 + 4 * 8 + 3 * 5 + 1 * 4);  // embed, lm_head; per layer 8 MoE + 5 GDN or 4 attention

  // convert: HF copy -> MLX layout, identical to the fixture; tokenizer / template files come along.
  write_text_file(hf_dir + "/tokenizer.json", "{\"model\": {}}");
  write_text_file(hf_dir + "/chat_template.jinja", "{{ messages }}");
  write_text_file(hf_dir + "/generation_config.json", "{\"eos_token_id\": [5, 6], \"top_k\": 20}");
  const std::string out = temp_dir(fixture + "_mlx");
  convert_checkpoint(hf_dir, out);
  EXPECT_EQ(read_text_file(out + "/tokenizer.json"), "{\"model\": {}}");
  EXPECT_EQ(read_text_file(out + "/chat_template.jinja"), "{{ messages }}");
  EXPECT_FALSE(file_exists(out + "/tokenizer_config.json"));  // absent in the source: not made up
  auto back = load_model(out);
  EXPECT_TRUE(back->config.quantized);
  EXPECT_EQ(back->config.eos_token_ids, (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(back->config.default_top_k, 20);
  EXPECT_EQ(quant_spec_for(back->config, "language_model.model.layers.1.mlp.gate").bits, 8);
  expect_same_weights(*mlx, *back);
  // The written file stores the same bytes as the fixture for every tensor of the fixture.
  TensorSet a = TensorSet::open_dir(kShared + "/fixtures/" + fixture + "/mlx4");
  TensorSet b = TensorSet::open_dir(out);
  EXPECT_EQ(a.tensors().size(), b.tensors().size());
  int compared = 0;
  for (auto& [name, t] : a.tensors()) {
    const TensorInfo* u = b.find(name);
    ASSERT_NE(u, nullptr) << name;
    EXPECT_EQ(t.dtype, u->dtype) << name;
    EXPECT_EQ(t.shape, u->shape) << name;
    ASSERT_EQ(t.nbytes, u->nbytes) << name;
    EXPECT_EQ(0, std::memcmp(t.data, u->data, t.nbytes)) << name;
    ++compared;
  }
  EXPECT_EQ(compared, int(a.tensors().size()));
  fs::remove_all(hf_dir);
  fs::remove_all(out);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfRoundTrip, ::testing::Values("tiny", "tiny2"));

TEST(HfRoundTrip, ShardedWriteAndLoad) {
  auto mlx = load_model(kShared + "/fixtures/tiny2/mlx4");
  const std::string out = temp_dir("sharded");
  WriteOptions o;
  o.shard_bytes = 400 * 1000;  // tiny2 is 1.3 MB: several shards + index
  o.progress = false;
  write_mlx_checkpoint(*mlx, out, o);
  EXPECT_TRUE(file_exists(out + "/model.safetensors.index.json"));
  EXPECT_FALSE(file_exists(out + "/model.safetensors"));
  int shards = 0;
  for (auto& e : fs::directory_iterator(out)) shards += e.path().extension() == ".safetensors";
  EXPECT_GE(shards, 3);
  auto back = load_model(out);
  expect_same_weights(*mlx, *back);
  // And an HF copy in shards loads (quantize-on-load) to the same weights.
  const std::string hf = temp_dir("sharded_hf");
  o.shard_bytes = 2 * 1000 * 1000;
  write_hf_checkpoint(*mlx, hf, o);
  EXPECT_TRUE(file_exists(hf + "/model.safetensors.index.json"));
  auto hfw = load_model(hf);
  expect_same_weights(*mlx, *hfw);
  fs::remove_all(out);
  fs::remove_all(hf);
}

}  // namespace
}  // namespace lilac
