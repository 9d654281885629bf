// Random weights generated on the GPU (synthetic_model.h) and the real model's shape for the CLI's
// `bench --synthetic` (cuda_backend.h: synthetic_config, decode_bytes_per_token).
#include "cuda/synthetic_model.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <utility>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_common.h"

namespace lilac::cuda {
namespace {

__device__ __forceinline__ uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
__global__ void fill_words_kernel(uint32_t* p, int64_t n, uint64_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = uint32_t(mix64(seed ^ uint64_t(i) * 0xD1B54A32D192ED03ull));
}
// scales ~ base·(0.75 + 0.5u), biases = −center·scale (+ small noise): values ~ zero-mean, std ≈ base·sd(q)
__global__ void fill_sb_kernel(__nv_bfloat16* s, __nv_bfloat16* b, int64_t n, float base, float center,
                               uint64_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t r = mix64(seed ^ uint64_t(i) * 0x9E3779B97F4A7C15ull);
    const float u1 = float(r & 0xffffff) / 16777216.f, u2 = float((r >> 24) & 0xffffff) / 16777216.f;
    const float sc = base * (0.75f + 0.5f * u1);
    s[i] = __float2bfloat16(sc);
    b[i] = __float2bfloat16(-center * sc + (u2 - 0.5f) * sc);
  }
}
__global__ void fill_uniform_kernel(float* p, int64_t n, float lo, float hi, uint64_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t r = mix64(seed ^ uint64_t(i) * 0x9E3779B97F4A7C15ull);
    p[i] = lo + (hi - lo) * float(r & 0xffffff) / 16777216.f;
  }
}

struct SynthGen {
  DevAlloc& mem;
  uint64_t seed;
  uint64_t next() { return seed = seed * 6364136223846793005ull + 1442695040888963407ull; }
  QMatrixDev q(int64_t rows, int64_t cols, int bits) {
    QMatrixDev d;
    d.rows = rows;
    d.cols = cols;
    d.bits = bits;
    d.group_size = 64;
    const int64_t nw = rows * d.words_per_row(), ng = rows * d.groups_per_row();
    auto* qw = static_cast<uint32_t*>(mem.get(size_t(nw) * 4));
    auto* sc = static_cast<__nv_bfloat16*>(mem.get(size_t(ng) * 2));
    auto* bi = static_cast<__nv_bfloat16*>(mem.get(size_t(ng) * 2));
    fill_words_kernel<<<1024, 256>>>(qw, nw, next());
    const float levels = float((1 << bits) - 1);
    const float sd_q = levels / std::sqrt(12.f);  // std of a uniform integer in [0, levels]
    fill_sb_kernel<<<1024, 256>>>(sc, bi, ng, 1.f / (std::sqrt(float(cols)) * sd_q), levels / 2, next());
    LILAC_CUDA_LAUNCH_CHECK();
    d.qweight = qw;
    d.scales = sc;
    d.biases = bi;
    return d;
  }
  float* vec(int64_t n, float lo, float hi) {
    auto* p = static_cast<float*>(mem.get(size_t(n) * 4));
    fill_uniform_kernel<<<256, 256>>>(p, n, lo, hi, next());
    LILAC_CUDA_LAUNCH_CHECK();
    return p;
  }
};

}  // namespace

std::unique_ptr<DevModel> synthetic_model(const ModelConfig& c, uint64_t seed) {
  auto m = std::make_unique<DevModel>();
  m->cfg = c;
  check_device_config(c);
  SynthGen g{m->mem, seed};
  const int64_t H = c.hidden_size;
  m->embed = g.q(c.vocab_size, H, 4);
  m->lm_head = g.q(c.vocab_size, H, 4);
  m->final_norm = g.vec(H, 0.9f, 1.1f);
  for (int i = 0; i < c.num_layers; ++i) {
    DevLayer L;
    L.attn = c.full_attention[i];
    L.input_norm = g.vec(H, 0.9f, 1.1f);
    L.post_norm = g.vec(H, 0.9f, 1.1f);
    if (L.attn) {
      const int64_t rows = c.q_proj_rows() + 2 * c.kv_dim();
      L.in_proj.parts.push_back({g.q(rows, H, 4), 0});
      L.in_proj.rows = rows;
      L.out_proj = g.q(H, int64_t(c.num_heads) * c.head_dim, 4);
      L.q_norm = g.vec(c.head_dim, 0.9f, 1.1f);
      L.k_norm = g.vec(c.head_dim, 0.9f, 1.1f);
    } else {
      const int64_t rows = c.gdn_conv_dim() + c.gdn_value_dim() + 2 * c.linear_num_value_heads;
      L.in_proj.parts.push_back({g.q(rows, H, 4), 0});
      L.in_proj.rows = rows;
      L.out_proj = g.q(H, c.gdn_value_dim(), 4);
      L.conv_w = g.vec(c.gdn_conv_dim() * c.linear_conv_kernel_dim, -0.5f, 0.5f);
      L.A_log = g.vec(c.linear_num_value_heads, -1.f, 1.f);
      L.dt_bias = g.vec(c.linear_num_value_heads, -0.5f, 0.5f);
      L.gdn_norm = g.vec(c.linear_value_head_dim, 0.9f, 1.1f);
    }
    L.router.parts.push_back({g.q(c.num_experts + 1, H, 8), 0});
    L.router.rows = c.num_experts + 1;
    auto experts = [&](int64_t rows, int64_t cols) {
      QExpertsDev e;
      e.n = c.num_experts;
      e.first = g.q(rows * c.num_experts, cols, 4);
      e.first.rows = rows;
      return e;
    };
    L.moe.gate = experts(c.moe_intermediate_size, H);
    L.moe.up = experts(c.moe_intermediate_size, H);
    L.moe.down = experts(H, c.moe_intermediate_size);
    L.moe.shared_gate = g.q(c.shared_expert_intermediate_size, H, 4);
    L.moe.shared_up = g.q(c.shared_expert_intermediate_size, H, 4);
    L.moe.shared_down = g.q(H, c.shared_expert_intermediate_size, 4);
    m->layers.push_back(std::move(L));
  }
  finish_model(*m);
  LILAC_CUDA_CHECK(cudaDeviceSynchronize());
  return m;
}

ModelConfig synthetic_config(int layers) {
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
  return c;
}

double decode_bytes_per_token(const ModelConfig& c, int64_t ctx) {
  auto q = [](double rows, double cols, int bits) { return rows * cols * bits / 8.0 + rows * cols / 64.0 * 4.0; };
  const double H = double(c.hidden_size);
  double b = 0;
  b += q(1, H, 4);                          // embedding row
  b += q(double(c.vocab_size), H, 4);       // LM head
  for (int i = 0; i < c.num_layers; ++i) {
    if (c.full_attention[size_t(i)]) {
      b += q(double(c.q_proj_rows() + 2 * c.kv_dim()), H, 4);
      b += q(H, double(c.num_heads) * c.head_dim, 4);
      b += double(ctx) * double(c.kv_dim()) * 2 * 2;  // K and V rows, bf16
    } else {
      b += q(double(c.gdn_conv_dim() + c.gdn_value_dim() + 2 * c.linear_num_value_heads), H, 4);
      b += q(H, double(c.gdn_value_dim()), 4);
      b += 2.0 * c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim * 4;  // state r+w
      b += 2.0 * c.gdn_conv_dim() * (c.linear_conv_kernel_dim - 1) * 4;
    }
    b += q(double(c.num_experts + 1), H, 8);  // router + shared_expert_gate
    const double experts = c.num_experts_per_tok;
    b += experts * 3 * q(double(c.moe_intermediate_size), H, 4);
    b += 3 * q(double(c.shared_expert_intermediate_size), H, 4);
  }
  return b;
}

}  // namespace lilac::cuda
