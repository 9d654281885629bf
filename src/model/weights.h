// The model's weights as the backends see them: views into memory-mapped checkpoint files (MLX
// layout) or into buffers owned by the ModelWeights (HF layout, quantized on load).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/config.h"

namespace lilac {

// A matrix [rows, cols] (y = W x uses row r as the weights of output r).
// Affine quantized (bits 4 or 8, groups of `group_size` along cols): element (r, c) is
//   bf16(scales[r, c/g]) * q(r, c) + bf16(biases[r, c/g]),
// q packed in uint32 words, element 0 in the low bits (MLX layout).
// bits == 0: dense fp32 values in `dense` (used where a checkpoint leaves a matrix unquantized).
struct QMatrix {
  int64_t rows = 0, cols = 0;
  int bits = 0;
  int group_size = 64;
  const uint32_t* qweight = nullptr;  // [rows, cols * bits / 32]
  const uint16_t* scales = nullptr;   // bf16 [rows, cols / group_size]
  const uint16_t* biases = nullptr;   // bf16 [rows, cols / group_size]
  const float* dense = nullptr;       // [rows, cols] when bits == 0

  bool quantized() const { return bits != 0; }
  int64_t words_per_row() const { return cols * bits / 32; }
  int64_t groups_per_row() const { return cols / group_size; }
};

// `n` matrices of one shape stored back to back ([n, rows, ...]); expert(e) is a view.
struct QExperts {
  int n = 0;
  QMatrix first;  // expert 0; the others follow contiguously in each of its arrays
  QMatrix expert(int e) const {
    QMatrix m = first;
    if (m.bits) {
      m.qweight += int64_t(e) * m.rows * m.words_per_row();
      m.scales += int64_t(e) * m.rows * m.groups_per_row();
      m.biases += int64_t(e) * m.rows * m.groups_per_row();
    } else {
      m.dense += int64_t(e) * m.rows * m.cols;
    }
    return m;
  }
};

struct AttentionWeights {
  QMatrix q_proj;  // [heads * head_dim * 2, hidden]: per head, query then output gate
  QMatrix k_proj, v_proj;  // [kv_heads * head_dim, hidden]
  QMatrix o_proj;          // [hidden, heads * head_dim]
  std::vector<float> q_norm, k_norm;  // [head_dim], effective multipliers (1 + w)
};

struct DeltaNetWeights {
  QMatrix in_proj_qkv;  // [2 * Hk * dk + Hv * dv, hidden], layout [q | k | v]
  QMatrix in_proj_z;    // [Hv * dv, hidden]
  QMatrix in_proj_b;    // [Hv, hidden]
  QMatrix in_proj_a;    // [Hv, hidden]
  QMatrix out_proj;     // [hidden, Hv * dv]
  std::vector<float> conv1d;   // [conv_dim, K] (tap k multiplies the input k - (K-1) steps back)
  std::vector<float> dt_bias;  // [Hv]
  std::vector<float> A_log;    // [Hv]
  std::vector<float> norm;     // [dv], plain multiplier (not zero-centred)
};

struct MoEWeights {
  QMatrix router;                      // [num_experts, hidden] (8-bit in MLX checkpoints)
  QExperts gate, up;                   // n = num_experts, each [moe_inter, hidden]
  QExperts down;                       // each [hidden, moe_inter]
  QMatrix shared_gate, shared_up;      // [shared_inter, hidden]
  QMatrix shared_down;                 // [hidden, shared_inter]
  QMatrix shared_expert_gate;          // [1, hidden]
};

struct LayerWeights {
  bool full_attention = false;
  std::vector<float> input_norm, post_norm;  // [hidden], effective multipliers (1 + w)
  AttentionWeights attn;                     // when full_attention
  DeltaNetWeights gdn;                       // otherwise
  MoEWeights moe;
};

// The multi-token-prediction head (../shared/MODEL_MTP.md §3): fc(concat(norm_e(embed[x]), norm_h(h))),
// one full-attention decoder layer with the MoE MLP, its own final norm; embed and lm_head are shared.
struct MtpWeights {
  std::vector<float> pre_fc_norm_embedding, pre_fc_norm_hidden;  // [hidden], effective multipliers (1 + w)
  QMatrix fc;                     // [hidden, 2 * hidden]: columns 0..H-1 the normed embedding, H..2H-1 the hidden
  std::vector<LayerWeights> layers;  // full attention; empty = the checkpoint has no MTP head
  std::vector<float> norm;        // [hidden], effective multipliers (mtp.norm, not the model's final norm)
};

struct ModelWeights {
  ModelConfig config;
  std::string dir;
  QMatrix embed;    // [vocab, hidden] (quantized rows: gather + dequantize)
  QMatrix lm_head;  // [vocab, hidden]
  std::vector<float> final_norm;  // [hidden], effective multipliers
  std::vector<LayerWeights> layers;
  MtpWeights mtp;
  std::string no_mtp_reason;  // why mtp.layers is empty (for the log of a request for speculation)
  bool has_mtp() const { return !mtp.layers.empty(); }
  // Owners of the memory the views point into (mmaps, buffers made by quantize-on-load).
  std::vector<std::shared_ptr<const void>> storage;
};

struct LoadOptions {
  bool progress = true;  // show bytes / rate / ETA on a terminal for large checkpoints
};

// Load a checkpoint folder: MLX 4-bit layout (config.json with `quantization`) or the original
// Hugging Face layout (quantized on load to the same 4/8-bit affine format). Validates every tensor's
// name, dtype and shape; unused tensors (other than vision_tower.*, model.visual.*) are errors. The MTP
// head (`mtp.*`, ../shared/MODEL_MTP.md §3, §8) is loaded when the checkpoint has one (a partial or
// misshapen head is an error naming the tensor); without it `no_mtp_reason` says why.
std::shared_ptr<const ModelWeights> load_model(const std::string& dir, const LoadOptions& opts = {});

}  // namespace lilac
