// Loading the MLX 4-bit fixtures: config values, shapes, and exact tensor values (expected values
// computed independently from the fixture files with a few lines of Python, see comments).
#include <gtest/gtest.h>

#include <chrono>

#include "model/quant.h"
#include "model/weights.h"

namespace lilac {
namespace {

const std::string kShared = LILAC_SHARED_DIR;

struct Expect {
  const char* fixture;
  int64_t vocab, hidden;
  int heads, kv_heads, head_dim, hk, hv, dk, dv, experts, topk;
  int64_t moe_inter, shared_inter;
  // Exact values (dequantized = f32(f32(scale * q) + bias)).
  float embed_5_7, lm_head_100_130, router0_3_70, gate0_e5_2_130, down0_e3_7_65, q_proj3_9_33;
  float conv0_10_2, alog0_1, dtbias0_2, inorm0_1, qnorm3_1, fnorm_4, gdnnorm0_2, seg1_0_5;
};

const Expect kTiny{"tiny", 2048, 256, 4, 2, 64, 2, 4, 64, 64, 16, 4, 128, 128,
                   -1.45703125f, 0.06884765625f, -0.08050537109375f, -0.0684814453125f, 0.093505859375f,
                   0.108642578125f, -0.486328125f, 2.5015337467193604f, -0.27734375f, 0.84765625f, 0.87109375f,
                   1.1015625f, 1.2890625f, 0.08509063720703125f};
const Expect kTiny2{"tiny2", 777, 192, 8, 2, 32, 1, 4, 32, 48, 8, 2, 64, 128,
                    0.65625f, 0.0341796875f, -0.03537750244140625f, 0.052734375f, -0.05126953125f,
                    0.0556640625f, 0.0228271484375f, 1.5348362922668457f, -0.212890625f, 0.79296875f,
                    1.0703125f, 1.0625f, 1.0234375f, 0.0055389404296875f};

class MlxLoad : public ::testing::TestWithParam<Expect> {};

TEST_P(MlxLoad, ConfigAndTensors) {
  const Expect& x = GetParam();
  auto t0 = std::chrono::steady_clock::now();
  auto w = load_model(kShared + "/fixtures/" + x.fixture + "/mlx4");
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(secs, 0.5) << "loading a tiny fixture must be fast";
  const ModelConfig& c = w->config;
  EXPECT_EQ(c.model_type, "qwen3_5_moe_text");
  EXPECT_EQ(c.vocab_size, x.vocab);
  EXPECT_EQ(c.hidden_size, x.hidden);
  EXPECT_EQ(c.num_layers, 4);
  EXPECT_EQ(c.num_heads, x.heads);
  EXPECT_EQ(c.num_kv_heads, x.kv_heads);
  EXPECT_EQ(c.head_dim, x.head_dim);
  EXPECT_TRUE(c.attn_output_gate);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e7);
  EXPECT_DOUBLE_EQ(c.partial_rotary_factor, 0.25);
  EXPECT_EQ(c.rotary_dim, x.head_dim / 4);
  EXPECT_EQ(c.max_position_embeddings, 262144);
  EXPECT_EQ(c.linear_num_key_heads, x.hk);
  EXPECT_EQ(c.linear_num_value_heads, x.hv);
  EXPECT_EQ(c.linear_key_head_dim, x.dk);
  EXPECT_EQ(c.linear_value_head_dim, x.dv);
  EXPECT_EQ(c.linear_conv_kernel_dim, 4);
  EXPECT_EQ(c.num_experts, x.experts);
  EXPECT_EQ(c.num_experts_per_tok, x.topk);
  EXPECT_EQ(c.moe_intermediate_size, x.moe_inter);
  EXPECT_EQ(c.shared_expert_intermediate_size, x.shared_inter);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.full_attention, (std::vector<bool>{false, false, false, true}));
  EXPECT_TRUE(c.quantized);
  EXPECT_EQ(c.quant.bits, 4);
  EXPECT_EQ(c.quant.group_size, 64);
  EXPECT_EQ(quant_spec_for(c, "language_model.model.layers.2.mlp.gate").bits, 8);
  EXPECT_EQ(quant_spec_for(c, "model.layers.2.mlp.shared_expert_gate").bits, 8);
  EXPECT_EQ(quant_spec_for(c, "language_model.model.layers.2.mlp.shared_expert.up_proj").bits, 4);

  // Shapes.
  EXPECT_EQ(w->embed.rows, x.vocab);
  EXPECT_EQ(w->embed.cols, x.hidden);
  EXPECT_EQ(w->embed.bits, 4);
  EXPECT_EQ(w->lm_head.rows, x.vocab);
  ASSERT_EQ(w->layers.size(), 4u);
  ASSERT_EQ(w->final_norm.size(), size_t(x.hidden));
  const LayerWeights& l0 = w->layers[0];
  const LayerWeights& l3 = w->layers[3];
  EXPECT_FALSE(l0.full_attention);
  EXPECT_TRUE(l3.full_attention);
  EXPECT_EQ(l3.attn.q_proj.rows, 2 * x.heads * x.head_dim);
  EXPECT_EQ(l3.attn.k_proj.rows, x.kv_heads * x.head_dim);
  EXPECT_EQ(l3.attn.o_proj.cols, x.heads * x.head_dim);
  EXPECT_EQ(l3.attn.q_norm.size(), size_t(x.head_dim));
  EXPECT_EQ(l0.gdn.in_proj_qkv.rows, 2 * x.hk * x.dk + x.hv * x.dv);
  EXPECT_EQ(l0.gdn.in_proj_z.rows, x.hv * x.dv);
  EXPECT_EQ(l0.gdn.in_proj_b.rows, x.hv);
  EXPECT_EQ(l0.gdn.out_proj.cols, x.hv * x.dv);
  EXPECT_EQ(l0.gdn.conv1d.size(), size_t((2 * x.hk * x.dk + x.hv * x.dv) * 4));
  EXPECT_EQ(l0.gdn.norm.size(), size_t(x.dv));
  EXPECT_EQ(l0.moe.router.rows, x.experts);
  EXPECT_EQ(l0.moe.router.bits, 8);
  EXPECT_EQ(l0.moe.shared_expert_gate.rows, 1);
  EXPECT_EQ(l0.moe.shared_expert_gate.bits, 8);
  EXPECT_EQ(l0.moe.gate.n, x.experts);
  EXPECT_EQ(l0.moe.gate.first.rows, x.moe_inter);
  EXPECT_EQ(l0.moe.down.first.rows, x.hidden);
  EXPECT_EQ(l0.moe.down.first.cols, x.moe_inter);
  EXPECT_EQ(l0.moe.shared_down.cols, x.shared_inter);

  // Values.
  EXPECT_EQ(dequantize_at(w->embed, 5, 7), x.embed_5_7);
  EXPECT_EQ(dequantize_at(w->lm_head, 100, 130), x.lm_head_100_130);
  EXPECT_EQ(dequantize_at(l0.moe.router, 3, 70), x.router0_3_70);
  EXPECT_EQ(dequantize_at(l0.moe.gate.expert(5), 2, 130), x.gate0_e5_2_130);
  EXPECT_EQ(dequantize_at(l0.moe.down.expert(3), 7, 65), x.down0_e3_7_65);
  EXPECT_EQ(dequantize_at(l3.attn.q_proj, 9, 33), x.q_proj3_9_33);
  EXPECT_EQ(dequantize_at(w->layers[1].moe.shared_expert_gate, 0, 5), x.seg1_0_5);
  EXPECT_EQ(l0.gdn.conv1d[10 * 4 + 2], x.conv0_10_2);
  EXPECT_EQ(l0.gdn.A_log[1], x.alog0_1);
  EXPECT_EQ(l0.gdn.dt_bias[2], x.dtbias0_2);
  EXPECT_EQ(l0.input_norm[1], x.inorm0_1);  // MLX has the +1 baked in: used as is
  EXPECT_EQ(l3.attn.q_norm[1], x.qnorm3_1);
  EXPECT_EQ(w->final_norm[4], x.fnorm_4);
  EXPECT_EQ(l0.gdn.norm[2], x.gdnnorm0_2);
  std::vector<float> row(size_t(x.hidden));
  dequantize_row(w->embed, 5, row.data());
  EXPECT_EQ(row[7], x.embed_5_7);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MlxLoad, ::testing::Values(kTiny, kTiny2),
                         [](const auto& info) { return std::string(info.param.fixture); });

}  // namespace
}  // namespace lilac
