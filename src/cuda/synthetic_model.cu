// Random weights generated on the GPU (synthetic_model.h) and the real model's shape for the CLI's
// `bench --synthetic` (cuda_backend.h: synthetic_config, decode_bytes_per_token).
#include "cuda/synthetic_model.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <map>
#include <string>
#include <tuple>
#include <utility>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_common.h"
#include "model/tensor_table.h"

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

// The tensors come from the checkpoint's tensor table (model/tensor_table.h: names, shapes, bits), as a
// real checkpoint's do; each is filled with random values of its shape on the device, and the matrices a
// decode step fuses (the mixer's input projections, router + shared_expert_gate) are generated fused,
// in upload_layer's order (device_model.cu), so the device model has the real one's layout.
std::unique_ptr<DevModel> synthetic_model(const ModelConfig& c, uint64_t seed) {
  auto m = std::make_unique<DevModel>();
  m->cfg = c;
  check_device_config(c);
  SynthGen g{m->mem, seed};
  TableOptions opts;
  opts.mtp_layers = c.mtp_num_hidden_layers;
  std::map<std::tuple<int, int, TensorRole>, TensorSpec> table;  // (block, layer, role) -> tensor
  for_each_tensor(c, [&](const TensorSpec& t) { table[{int(t.block), t.layer, t.role}] = t; }, opts);
  auto spec = [&](TensorBlock b, int layer, TensorRole r) -> const TensorSpec& {
    const auto it = table.find({int(b), layer, r});
    if (it == table.end())
      throw Error(std::string("synthetic model: the tensor table has no ") + role_name(r) + " in layer " +
                  std::to_string(layer));
    return it->second;
  };
  // One random matrix holding the rows of `parts` (fused: equal columns and bits, as upload_fused requires).
  auto matrix = [&](TensorBlock b, int layer, std::initializer_list<TensorRole> parts) {
    int64_t rows = 0, cols = -1;
    int bits = -1;
    for (TensorRole r : parts) {
      const TensorSpec& t = spec(b, layer, r);
      LILAC_CHECK((cols < 0 || t.cols == cols) && (bits < 0 || t.bits == bits),
                  "synthetic model: fused tensors differ in columns or bits");
      rows += t.rows;
      cols = t.cols;
      bits = t.bits;
    }
    return g.q(rows, cols, bits);
  };
  auto proj = [&](TensorBlock b, int layer, std::initializer_list<TensorRole> parts) {
    DevProj p;
    p.parts.push_back({matrix(b, layer, parts), 0});
    p.rows = p.parts[0].m.rows;
    return p;
  };
  auto norm = [&](const TensorSpec& t) { return g.vec(t.elements(), 0.9f, 1.1f); };
  auto experts = [&](const TensorSpec& t) {
    QExpertsDev e;
    e.n = t.count;
    e.first = g.q(t.rows * t.count, t.cols, t.bits);
    e.first.rows = t.rows;
    return e;
  };
  using R = TensorRole;
  auto layer = [&](TensorBlock b, int i, bool attn) {
    DevLayer L;
    L.attn = attn;
    L.input_norm = norm(spec(b, i, R::InputNorm));
    L.post_norm = norm(spec(b, i, R::PostNorm));
    if (L.attn) {
      L.in_proj = proj(b, i, {R::QProj, R::KProj, R::VProj});
      L.out_proj = matrix(b, i, {R::OProj});
      L.q_norm = norm(spec(b, i, R::QNorm));
      L.k_norm = norm(spec(b, i, R::KNorm));
    } else {
      L.in_proj = proj(b, i, {R::InProjQKV, R::InProjZ, R::InProjB, R::InProjA});
      L.out_proj = matrix(b, i, {R::OutProj});
      L.conv_w = g.vec(spec(b, i, R::Conv1d).elements(), -0.5f, 0.5f);
      L.A_log = g.vec(spec(b, i, R::ALog).elements(), -1.f, 1.f);
      L.dt_bias = g.vec(spec(b, i, R::DtBias).elements(), -0.5f, 0.5f);
      L.gdn_norm = norm(spec(b, i, R::GdnNorm));
    }
    L.router = proj(b, i, {R::Router, R::SharedExpertGate});
    L.moe.gate = experts(spec(b, i, R::ExpertsGate));
    L.moe.up = experts(spec(b, i, R::ExpertsUp));
    L.moe.down = experts(spec(b, i, R::ExpertsDown));
    L.moe.shared_gate = matrix(b, i, {R::SharedGate});
    L.moe.shared_up = matrix(b, i, {R::SharedUp});
    L.moe.shared_down = matrix(b, i, {R::SharedDown});
    return L;
  };
  const TensorBlock B = TensorBlock::Backbone;
  m->embed = matrix(B, -1, {R::Embed});
  m->lm_head = matrix(B, -1, {R::LmHead});
  m->final_norm = norm(spec(B, -1, R::FinalNorm));
  for (int i = 0; i < c.num_layers; ++i) m->layers.push_back(layer(B, i, c.full_attention[size_t(i)]));
  // The MTP head (random like the rest: its drafts are almost never right; bench --draft-accept forces them).
  if (c.mtp_num_hidden_layers > 0) {
    const TensorBlock M = TensorBlock::Mtp;
    m->mtp = std::make_unique<DevMtp>();
    m->mtp->pre_fc_norm_embedding = norm(spec(M, -1, R::MtpPreFcNormEmbedding));
    m->mtp->pre_fc_norm_hidden = norm(spec(M, -1, R::MtpPreFcNormHidden));
    m->mtp->norm = norm(spec(M, -1, R::MtpNorm));
    m->mtp->fc = matrix(M, -1, {R::MtpFc});
    m->mtp->layer = layer(M, 0, true);
  }
  finish_model(*m);
  LILAC_CUDA_CHECK(cudaDeviceSynchronize());
  return m;
}

ModelConfig synthetic_config(int layers) { return qwen36_shape(layers, 1); }

double decode_bytes_per_token(const ModelConfig& c, int64_t ctx) { return decode_step_bytes(c, ctx, 1); }

double decode_step_bytes(const ModelConfig& c, int64_t ctx, int64_t streams) {
  auto q = [](double rows, double cols, int bits) { return rows * cols * bits / 8.0 + rows * cols / 64.0 * 4.0; };
  const double B = double(streams);
  double b = 0;
  // The weights a step reads, from the tensor table: an embedding row per stream, every matrix once, the
  // experts the streams select (each once; norms and vectors are negligible).
  for_each_tensor(c, [&](const TensorSpec& t) {
    if (t.kind == WeightKind::Matrix)
      b += t.role == TensorRole::Embed ? B * q(1, double(t.cols), t.bits) : q(double(t.rows), double(t.cols), t.bits);
    if (t.kind == WeightKind::Experts) b += c.experts_touched(streams) * q(double(t.rows), double(t.cols), t.bits);
  });
  // The per-sequence state each stream reads (and writes).
  double s = 0;
  for (int i = 0; i < c.num_layers; ++i) {
    if (c.full_attention[size_t(i)]) {
      s += double(ctx) * double(c.kv_dim()) * 2 * 2;  // K and V rows, bf16
    } else {
      s += 2.0 * c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim * 4;  // state r+w
      s += 2.0 * c.gdn_conv_dim() * (c.linear_conv_kernel_dim - 1) * 4;
    }
  }
  return b + B * s;
}

}  // namespace lilac::cuda
