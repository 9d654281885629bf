// The checkpoint's tensors, in one table: every tensor of a configuration with its layout-neutral name,
// the role it plays, its form and shape, and the bits it is quantized to (on load of an HF checkpoint,
// by `lilac convert`, for synthetic weights). The loader, the weight walk (checkpoint writers),
// `lilac make-demo` and the synthetic CUDA model all iterate this table; the names each layout gives a
// tensor (MLX 4-bit, Hugging Face original) come from LayoutNames below.
//
// Blocks: the backbone, and the optional MTP head (`mtp.*`, ../shared/MODEL_MTP.md §3): entries with
// block == TensorBlock::Mtp, layout-neutral names starting "mtp." (which every layout keeps as is: no
// model prefix; MLX experts as "mtp.layers.0.mlp.switch_mlp.*", HF as "mtp.layers.0.mlp.experts.*"), roles
// of their own for the head's fc, pre-fc norms and final norm, the backbone's roles for its decoder layer
// (full attention + MoE; `layer` counts the head's layers). TableOptions::mtp_layers includes it.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "model/config.h"

namespace lilac {

// How a tensor is stored and used.
enum class WeightKind {
  Matrix,       // [rows, cols] (QMatrix); quantized in the MLX layout
  Experts,      // `count` matrices [rows, cols] (QExperts); name ends in "mlp.experts.gate" / ".up" / ".down"
  NormCentred,  // effective multiplier of a zero-centred RMSNorm (HF stores it minus 1; MLX with the +1)
  Vector,       // plain float vector (linear_attn.norm.weight, dt_bias, A_log)
  Conv1d,       // [conv_dim, K] (MLX stores [C, K, 1], HF [C, 1, K])
};

enum class TensorRole : uint8_t {
  Embed, LmHead, FinalNorm,
  InputNorm, PostNorm,                                       // every layer
  QProj, KProj, VProj, OProj, QNorm, KNorm,                  // gated attention layers
  InProjQKV, InProjZ, InProjB, InProjA, OutProj, Conv1d,     // Gated DeltaNet layers
  DtBias, ALog, GdnNorm,
  Router, SharedExpertGate, ExpertsGate, ExpertsUp, ExpertsDown, SharedGate, SharedUp, SharedDown,  // MoE
  MtpPreFcNormEmbedding, MtpPreFcNormHidden, MtpFc, MtpNorm,  // the MTP head's own tensors
};
const char* role_name(TensorRole r);  // "q_proj", "experts.gate", ...

enum class TensorBlock : uint8_t { Backbone, Mtp };

struct TensorSpec {
  std::string name;  // layout-neutral: "embed_tokens", "lm_head", "norm.weight", "layers.3.self_attn.q_proj",
                     // "layers.0.mlp.experts.gate" (matrices without ".weight"; vectors with it, as checkpoints)
  TensorRole role;
  WeightKind kind;
  TensorBlock block = TensorBlock::Backbone;
  int layer = -1;    // the decoder layer (-1: none); in the MTP block, the head's layer
  int64_t count = 0;           // Experts: how many
  int64_t rows = 0, cols = 0;  // Matrix / Experts: each matrix [rows, cols]; Conv1d [C, K]; vectors [rows]
  int bits = 0;                // Matrix / Experts: quantization bits (4; 8 for the router and shared_expert_gate)
  int group_size = 64;         // Matrix / Experts: quantization group

  // The logical shape: [rows, cols], [count, rows, cols], [C, K] or [n].
  std::vector<int64_t> shape() const;
  int64_t elements() const;
};

struct TableOptions {
  bool lm_head = true;  // false: the head is tied to embed_tokens (no lm_head entry)
  int mtp_layers = 0;   // decoder layers of the MTP head (0: no head)
};

// Every tensor of a model with config `c`, in a fixed order: embed_tokens, lm_head, norm, then per layer
// its norms, attention or Gated DeltaNet, and MoE tensors; then the MTP head's (pre-fc norms, fc, its
// layers, its norm) when opts.mtp_layers > 0.
std::vector<TensorSpec> tensor_table(const ModelConfig& c, const TableOptions& opts = {});
void for_each_tensor(const ModelConfig& c, const std::function<void(const TensorSpec&)>& fn,
                     const TableOptions& opts = {});

// The names (and stored shapes) one checkpoint layout gives the table's tensors. Matrices get a base name
// (+ ".weight", or ".weight" / ".scales" / ".biases" when quantized); vectors their full name.
struct LayoutNames {
  enum Layout { MLX, HF } layout = MLX;
  std::string model_prefix;  // backbone tensors: "language_model.model." (MLX), "model.language_model." (HF);
                             // the MTP block's names have none
  std::string head;          // lm_head's base name: "language_model.lm_head" (MLX), "lm_head" (HF)

  // MLX: "language_model.model.layers.0.mlp.switch_mlp.gate_proj" (experts stacked [count, rows, cols]);
  // HF: the experts' gate and up both live in "model.language_model.layers.0.mlp.experts.gate_up_proj"
  // ([count, 2 rows, cols], gate rows first) and down in ".experts.down_proj" (no ".weight").
  std::string name(const TensorSpec& t) const;
  // HF's other expert form, one tensor per expert: "...mlp.experts.{e}.gate_proj.weight".
  std::string expert_name(const TensorSpec& t, int64_t e) const;
  // The shape stored for a dense (unquantized) tensor: conv1d [C, K, 1] (MLX) / [C, 1, K] (HF); HF's
  // fused gate_up [count, 2 rows, cols]; otherwise shape().
  std::vector<int64_t> stored_shape(const TensorSpec& t) const;
};

LayoutNames mlx_names(bool language_model_prefix = true);  // false: "model.", "lm_head" (text-only conversions)
LayoutNames hf_names(bool language_model_prefix = true);   // false: "model.", "lm_head"

}  // namespace lilac
