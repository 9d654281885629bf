// The model on the device: the one representation of the weights that every step consumes (the decode
// graph, the batched prefill, and later the batched and speculative steps). Built once per backend by
// upload_model (a checkpoint) or synthetic_model (random weights, synthetic_model.h) and read-only
// afterwards.
//
// Layout choices made at upload: projections that read the same input are fused row-wise into one
// matrix where their quantization agrees (attention q|k|v, Gated DeltaNet qkv|z|b|a, router +
// shared_expert_gate), so one GEMV / GEMM covers them; experts are stored back to back (QExpertsDev).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "cuda/kernels/digits/digits.h"
#include "cuda/kernels/gemm/gemm.h"
#include "cuda/kernels/gemv/gemv.h"
#include "model/config.h"
#include "model/weights.h"

namespace lilac::cuda {

// Device allocations freed together (a model's weights, a session's buffers, a snapshot).
struct DevAlloc {
  std::vector<void*> ptrs;
  size_t bytes = 0;
  DevAlloc() = default;
  DevAlloc(const DevAlloc&) = delete;
  DevAlloc& operator=(const DevAlloc&) = delete;
  ~DevAlloc();
  void* get(size_t n);  // cudaMalloc'd (256-byte aligned), at least 16 bytes; throws lilac::Error
  // Frees one allocation of get() of n bytes (false, and nothing freed, when p is not one).
  bool release(const void* p, size_t n);
  template <typename T>
  T* upload(const T* host, size_t count) {
    T* d = static_cast<T*>(get(count * sizeof(T)));
    copy_to_device(d, host, count * sizeof(T));
    return d;
  }
  float* upload(const std::vector<float>& v) { return upload(v.data(), v.size()); }

 private:
  static void copy_to_device(void* dst, const void* src, size_t bytes);
};

// A projection: one or more quantized matrices that read the same input, their outputs written back to
// back (part p's rows start at parts[p].offset of the output).
struct DevPart {
  QMatrixDev m;
  int64_t offset = 0;
};
struct DevProj {
  std::vector<DevPart> parts;
  int64_t rows = 0;
  // Whether a part has `bits`-bit weights (the inputs a multi-row step stages for it).
  bool has_bits(int bits) const {
    for (const DevPart& part : parts)
      if (part.m.bits == bits) return true;
    return false;
  }
};

// One decoder layer.
struct DevLayer {
  bool attn = false;  // full (gated) attention; else Gated DeltaNet
  const float *input_norm = nullptr, *post_norm = nullptr;
  // The mixer's input projection, fused. Attention: [q_proj (per head: query | gate) | k_proj | v_proj];
  // Gated DeltaNet: [in_proj_qkv (the conv channels q | k | v) | in_proj_z | in_proj_b | in_proj_a].
  DevProj in_proj;
  // The mixer's output projection (o_proj / out_proj); its result is added to the residual stream.
  QMatrixDev out_proj;
  // attention
  const float *q_norm = nullptr, *k_norm = nullptr;
  // Gated DeltaNet
  const float *conv_w = nullptr, *A_log = nullptr, *dt_bias = nullptr, *gdn_norm = nullptr;
  // MoE. router = [router E rows | shared_expert_gate 1 row] (one GEMV in the decode step); `moe` and
  // `moe_prefill` are the decode and prefill kernels' views of the same device matrices (made once, by
  // finish_model).
  DevProj router;
  MoEDecodeWeights moe;
  MoEPrefillWeights moe_prefill;
};

// The MTP head (../shared/MODEL_MTP.md §3-4): fc over [RMSNorm(embed x; pre_fc_norm_embedding) |
// RMSNorm(h; pre_fc_norm_hidden)], one full-attention decoder layer with its MoE, its own final norm; the
// embedding and the LM head are the model's. Norms are effective multipliers (1 + w), as the layers'.
struct DevMtp {
  const float *pre_fc_norm_embedding = nullptr, *pre_fc_norm_hidden = nullptr, *norm = nullptr;  // [hidden]
  QMatrixDev fc;  // [hidden, 2 * hidden]: columns 0..H-1 the normed embedding, H..2H-1 the normed hidden
  DevLayer layer;  // attn = true
};

struct DevModel {
  ModelConfig cfg;
  DevAlloc mem;
  QMatrixDev embed, lm_head;
  // The LM head in the digits kernels' tile order (kernels/digits/digits.h), made by finish_model when the head
  // can take it (4-bit, 64-groups, K <= 2048) unless LILAC_DIGITS=0; then every LM head product (decode, the
  // rows step, the MTP head) goes through it, and lm_head's own buffers are freed unless the embedding shares them
  // (lm_head keeps its shape; its pointers are null).
  digits::TilesDev lm_tiles;
  const float* final_norm = nullptr;
  const float* inv_freq = nullptr;  // RoPE inverse frequencies [rotary_dim / 2]
  std::vector<DevLayer> layers;
  std::unique_ptr<DevMtp> mtp;  // null: the checkpoint has no MTP head
  // Derived by finish_model:
  int n_attn = 0, n_gdn = 0;  // layers of each kind (attention layer i owns KV cache i, GDN layer j state j)
  int64_t max_in_rows = 0;    // the widest in_proj (width of the projection scratch)
  size_t weight_bytes() const { return mem.bytes; }
};

// Throws lilac::Error for a configuration the CUDA kernels do not support.
void check_device_config(const ModelConfig& c);

// Uploads a checkpoint (quantized 4- / 8-bit matrices only; throws lilac::Error naming the tensor
// otherwise) to the current device, its MTP head too when it has one. The host weights are not needed
// afterwards.
std::unique_ptr<DevModel> upload_model(const ModelWeights& w);

// The last step of building a model whose matrices and vectors are in place (upload_model,
// synthetic_model): the RoPE table, the MoE kernel views (the MTP layer's too), the derived counts.
void finish_model(DevModel& m);

}  // namespace lilac::cuda
