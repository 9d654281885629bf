// A synthetic model whose hidden size (96) is not a multiple of the group size: written in the HF layout
// (config made from ModelConfig by config_to_json, since it has no source folder) and loaded back.
// Matrices 96 wide stay dense (exact fp32 values), 64/128-wide ones are quantized by the rule.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "model/hf_writer.h"
#include "model/quant.h"
#include "model/weight_walk.h"
#include "model/weights.h"

namespace lilac {
namespace {

namespace fs = std::filesystem;

ModelConfig small_config() {
  ModelConfig c;
  c.model_type = "qwen3_5_moe_text";
  c.vocab_size = 50;
  c.hidden_size = 96;
  c.num_layers = 2;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 32;  // o_proj is 64 wide
  c.rope_theta = 1e6;
  c.partial_rotary_factor = 0.5;
  c.rotary_dim = 16;
  c.max_position_embeddings = 1024;
  c.linear_num_key_heads = 1;
  c.linear_num_value_heads = 2;
  c.linear_key_head_dim = 16;
  c.linear_value_head_dim = 64;  // out_proj is 128 wide
  c.linear_conv_kernel_dim = 4;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 64;
  c.shared_expert_intermediate_size = 32;
  c.rms_norm_eps = 1e-6;
  c.full_attention = {false, true};
  c.eos_token_ids = {3};
  return c;
}

TEST(HfSynthetic, DenseWhereNotGroupAlignedAndConfigFromStruct) {
  auto w = std::make_shared<ModelWeights>();
  w->config = small_config();
  const ModelConfig& c = w->config;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 0.5f);
  auto dense = [&](int64_t n, int64_t rows, int64_t cols) {
    auto buf = std::make_shared<std::vector<float>>(size_t(n * rows * cols));
    for (float& x : *buf) x = nd(rng);
    w->storage.push_back(buf);
    QMatrix m;
    m.rows = rows;
    m.cols = cols;
    m.dense = buf->data();
    return m;
  };
  auto vec = [&](int64_t n, float base) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = base + 0.25f * std::round(4 * nd(rng));  // exact in bf16 and after -1
    return v;
  };
  const int64_t H = c.hidden_size;
  w->embed = dense(1, c.vocab_size, H);
  w->lm_head = dense(1, c.vocab_size, H);
  w->final_norm = vec(H, 1.0f);
  w->layers.resize(2);
  for (int i = 0; i < 2; ++i) {
    LayerWeights& L = w->layers[size_t(i)];
    L.full_attention = c.full_attention[size_t(i)];
    L.input_norm = vec(H, 1.0f);
    L.post_norm = vec(H, 1.0f);
    if (L.full_attention) {
      L.attn.q_proj = dense(1, c.q_proj_rows(), H);
      L.attn.k_proj = dense(1, c.kv_dim(), H);
      L.attn.v_proj = dense(1, c.kv_dim(), H);
      L.attn.o_proj = dense(1, H, c.num_heads * c.head_dim);
      L.attn.q_norm = vec(c.head_dim, 1.0f);
      L.attn.k_norm = vec(c.head_dim, 1.0f);
    } else {
      L.gdn.in_proj_qkv = dense(1, c.gdn_conv_dim(), H);
      L.gdn.in_proj_z = dense(1, c.gdn_value_dim(), H);
      L.gdn.in_proj_b = dense(1, c.linear_num_value_heads, H);
      L.gdn.in_proj_a = dense(1, c.linear_num_value_heads, H);
      L.gdn.out_proj = dense(1, H, c.gdn_value_dim());
      L.gdn.conv1d = vec(c.gdn_conv_dim() * c.linear_conv_kernel_dim, 0.0f);
      L.gdn.dt_bias = vec(c.linear_num_value_heads, 0.0f);
      L.gdn.A_log = vec(c.linear_num_value_heads, 1.0f);
      L.gdn.norm = vec(c.linear_value_head_dim, 1.0f);
    }
    L.moe.router = dense(1, c.num_experts, H);
    L.moe.shared_expert_gate = dense(1, 1, H);
    L.moe.shared_gate = dense(1, c.shared_expert_intermediate_size, H);
    L.moe.shared_up = dense(1, c.shared_expert_intermediate_size, H);
    L.moe.shared_down = dense(1, H, c.shared_expert_intermediate_size);
    L.moe.gate = {c.num_experts, dense(c.num_experts, c.moe_intermediate_size, H)};
    L.moe.up = {c.num_experts, dense(c.num_experts, c.moe_intermediate_size, H)};
    L.moe.down = {c.num_experts, dense(c.num_experts, H, c.moe_intermediate_size)};
  }

  const std::string dir = (fs::temp_directory_path() / ("lilac_synth_" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  WriteOptions o;
  o.progress = false;
  write_hf_checkpoint(*w, dir, o);
  auto back = load_model(dir);
  const ModelConfig& b = back->config;
  EXPECT_EQ(b.hidden_size, 96);
  EXPECT_EQ(b.full_attention, c.full_attention);
  EXPECT_EQ(b.rotary_dim, 16);
  EXPECT_DOUBLE_EQ(b.rope_theta, 1e6);
  EXPECT_EQ(b.eos_token_ids, c.eos_token_ids);
  EXPECT_EQ(b.linear_value_head_dim, 64);

  std::vector<WeightRef> ra, rb;
  walk_weights(*w, [&](const WeightRef& r) { ra.push_back(r); });
  walk_weights(*back, [&](const WeightRef& r) { rb.push_back(r); });
  ASSERT_EQ(ra.size(), rb.size());
  int dense_count = 0, quant_count = 0;
  for (size_t i = 0; i < ra.size(); ++i) {
    ASSERT_EQ(ra[i].name, rb[i].name);
    if (ra[i].values) {
      EXPECT_EQ(*ra[i].values, *rb[i].values) << ra[i].name;
      continue;
    }
    const QMatrix& src = ra[i].matrix ? *ra[i].matrix : ra[i].experts->first;
    const QMatrix& got = rb[i].matrix ? *rb[i].matrix : rb[i].experts->first;
    const int64_t n = ra[i].experts ? ra[i].experts->n : 1;
    if (src.cols % 64 != 0) {
      ASSERT_EQ(got.bits, 0) << ra[i].name;
      EXPECT_EQ(0, std::memcmp(src.dense, got.dense, size_t(n * src.rows * src.cols) * 4)) << ra[i].name;
      ++dense_count;
    } else {
      const bool eight = ra[i].name.ends_with("mlp.gate") || ra[i].name.ends_with("shared_expert_gate");
      ASSERT_EQ(got.bits, eight ? 8 : 4) << ra[i].name;
      QBuffer buf;
      QMatrix want = quantize_rows(n * src.rows, src.cols, got.bits, 64, buf, [&](int64_t r, float* out) {
        std::memcpy(out, src.dense + r * src.cols, size_t(src.cols) * 4);
      });
      EXPECT_EQ(0, std::memcmp(want.qweight, got.qweight, size_t(n * src.rows * got.words_per_row()) * 4)) << ra[i].name;
      EXPECT_EQ(0, std::memcmp(want.scales, got.scales, size_t(n * src.rows * got.groups_per_row()) * 2)) << ra[i].name;
      EXPECT_EQ(0, std::memcmp(want.biases, got.biases, size_t(n * src.rows * got.groups_per_row()) * 2)) << ra[i].name;
      ++quant_count;
    }
  }
  // 27 matrices: embed, lm_head; GDN layer 5 + 8 MoE, attention layer 4 + 8 MoE. Quantized (64 / 128
  // wide): out_proj, o_proj and the experts' down in both layers. shared_down is 32 wide: dense.
  EXPECT_EQ(quant_count, 4);
  EXPECT_EQ(dense_count, 27 - 4);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace lilac
