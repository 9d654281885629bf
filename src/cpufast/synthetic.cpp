#include "cpufast/synthetic.h"

#include <cmath>
#include <string>

#include "core/bf16.h"
#include "model/quant.h"

namespace lilac::cpufast {

ModelConfig synthetic_config(int layers) { return qwen36_shape(layers, 0); }

namespace {

uint64_t mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct Builder {
  ModelWeights& w;
  uint64_t seed;
  int threads;
  uint64_t counter = 0;

  // n matrices [rows, cols] back to back; values ~ scale * (q - 2^(bits-1)) with scale ~ 1/sqrt(cols).
  QMatrix matrix(int64_t n, int64_t rows, int64_t cols, int bits) {
    auto buf = std::make_shared<QBuffer>();
    const int64_t R = n * rows, wpr = cols * bits / 32, gpr = cols / 64;
    buf->qweight.resize(size_t(R * wpr));
    buf->scales.resize(size_t(R * gpr));
    buf->biases.resize(size_t(R * gpr));
    const uint64_t s0 = mix(seed ^ (++counter * 0x51ed27ull));
    const float scale = 2.f / float((1 << bits) - 1) / std::sqrt(float(cols)) * 1.7f;
    parallel_ranges(R, 256, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        uint64_t x = mix(s0 + uint64_t(r));
        for (int64_t i = 0; i < wpr; ++i) {
          x = mix(x);
          buf->qweight[size_t(r * wpr + i)] = uint32_t(x);
        }
        for (int64_t g = 0; g < gpr; ++g) {
          x = mix(x);
          const float s = scale * (0.75f + 0.5f * float(x & 0xffff) / 65535.f);
          buf->scales[size_t(r * gpr + g)] = f32_to_bf16(s);
          buf->biases[size_t(r * gpr + g)] = f32_to_bf16(-s * float(1 << (bits - 1)));
        }
      }
    }, threads);
    QMatrix m;
    m.rows = rows;
    m.cols = cols;
    m.bits = bits;
    m.group_size = 64;
    m.qweight = buf->qweight.data();
    m.scales = buf->scales.data();
    m.biases = buf->biases.data();
    w.storage.push_back(buf);
    return m;
  }
  QExperts experts(int n, int64_t rows, int64_t cols) { return QExperts{n, matrix(n, rows, cols, 4)}; }
};

}  // namespace

std::shared_ptr<const ModelWeights> synthetic_weights(const ModelConfig& c, uint64_t seed, int threads) {
  auto w = std::make_shared<ModelWeights>();
  w->config = c;
  w->dir = "(synthetic)";
  Builder b{*w, seed, threads};
  const int64_t H = c.hidden_size;
  w->embed = b.matrix(1, c.vocab_size, H, 4);
  w->lm_head = b.matrix(1, c.vocab_size, H, 4);
  w->final_norm.assign(size_t(H), 1.f);
  for (int l = 0; l < c.num_layers; ++l) {
    LayerWeights lw;
    lw.full_attention = c.full_attention[size_t(l)];
    lw.input_norm.assign(size_t(H), 1.f);
    lw.post_norm.assign(size_t(H), 1.f);
    if (lw.full_attention) {
      lw.attn.q_proj = b.matrix(1, c.q_proj_rows(), H, 4);
      lw.attn.k_proj = b.matrix(1, c.kv_dim(), H, 4);
      lw.attn.v_proj = b.matrix(1, c.kv_dim(), H, 4);
      lw.attn.o_proj = b.matrix(1, H, int64_t(c.num_heads) * c.head_dim, 4);
      lw.attn.q_norm.assign(size_t(c.head_dim), 1.f);
      lw.attn.k_norm.assign(size_t(c.head_dim), 1.f);
    } else {
      const int Hv = c.linear_num_value_heads;
      lw.gdn.in_proj_qkv = b.matrix(1, c.gdn_conv_dim(), H, 4);
      lw.gdn.in_proj_z = b.matrix(1, c.gdn_value_dim(), H, 4);
      lw.gdn.in_proj_b = b.matrix(1, Hv, H, 4);
      lw.gdn.in_proj_a = b.matrix(1, Hv, H, 4);
      lw.gdn.out_proj = b.matrix(1, H, c.gdn_value_dim(), 4);
      lw.gdn.conv1d.assign(size_t(c.gdn_conv_dim() * c.linear_conv_kernel_dim), 0.25f);
      lw.gdn.dt_bias.assign(size_t(Hv), 0.f);
      lw.gdn.A_log.assign(size_t(Hv), -1.f);
      lw.gdn.norm.assign(size_t(c.linear_value_head_dim), 1.f);
    }
    const int E = c.num_experts;
    lw.moe.router = b.matrix(1, E, H, 8);
    lw.moe.gate = b.experts(E, c.moe_intermediate_size, H);
    lw.moe.up = b.experts(E, c.moe_intermediate_size, H);
    lw.moe.down = b.experts(E, H, c.moe_intermediate_size);
    lw.moe.shared_gate = b.matrix(1, c.shared_expert_intermediate_size, H, 4);
    lw.moe.shared_up = b.matrix(1, c.shared_expert_intermediate_size, H, 4);
    lw.moe.shared_down = b.matrix(1, H, c.shared_expert_intermediate_size, 4);
    lw.moe.shared_expert_gate = b.matrix(1, 1, H, 8);
    w->layers.push_back(std::move(lw));
  }
  return w;
}

double decode_bytes_per_token(const ModelConfig& c, int64_t ctx) { return decode_step_bytes(c, ctx, 1); }

double decode_step_bytes(const ModelConfig& c, int64_t ctx, int64_t streams) {
  // Packed bytes of a [rows, cols] matrix: the quants plus a bf16 scale and bias per 64.
  auto q = [](double rows, double cols, int bits) { return rows * cols * bits / 8.0 + rows * cols / 64.0 * 4.0; };
  const double H = double(c.hidden_size), B = double(streams);
  double b = B * q(1, H, 4) + q(double(c.vocab_size), H, 4), s = 0;  // weights once; s: one stream's state
  for (int i = 0; i < c.num_layers; ++i) {
    if (c.full_attention[size_t(i)]) {
      b += q(double(c.q_proj_rows() + 2 * c.kv_dim()), H, 4) + q(H, double(c.num_heads) * c.head_dim, 4);
      s += 2.0 * double(ctx) * double(c.kv_dim()) * 2.0;  // bf16 K and V
    } else {
      const double Hv = c.linear_num_value_heads;
      b += q(double(c.gdn_conv_dim() + c.gdn_value_dim()) + 2 * Hv, H, 4) + q(H, double(c.gdn_value_dim()), 4);
      s += 2.0 * Hv * c.linear_key_head_dim * c.linear_value_head_dim * 4.0;  // state read + written
    }
    b += q(double(c.num_experts) + 1, H, 8);
    b += 3 * q(double(c.moe_intermediate_size), H, 4) * c.experts_touched(streams);
    b += 3 * q(double(c.shared_expert_intermediate_size), H, 4);
  }
  return b + B * s;
}

}  // namespace lilac::cpufast
