// Walks every tensor of a ModelWeights with its layout-neutral name ("embed_tokens", "lm_head",
// "norm", "layers.3.self_attn.q_proj", "layers.0.mlp.experts.gate", ...) — used by the checkpoint
// writers (HF copy, MLX convert) to name tensors in their own layout.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "model/weights.h"

namespace lilac {

enum class WeightKind {
  Matrix,       // QMatrix
  Experts,      // QExperts; name ends in "mlp.experts.gate" / ".up" / ".down"
  NormCentred,  // effective multiplier of a zero-centred RMSNorm (checkpoints store it minus 1 in HF)
  Vector,       // plain float vector (linear_attn.norm.weight, dt_bias, A_log)
  Conv1d,       // [conv_dim, K]
};

struct WeightRef {
  std::string name;  // e.g. "layers.0.linear_attn.in_proj_qkv" (matrices: no ".weight")
  WeightKind kind;
  const QMatrix* matrix = nullptr;
  const QExperts* experts = nullptr;
  const std::vector<float>* values = nullptr;
};

// Calls fn for each tensor in a fixed order. lm_head is skipped when tied to embed (same storage).
// The MTP head's tensors come last, named as in the checkpoint ("mtp.fc", "mtp.layers.0.mlp.gate", ...):
// is_mtp_name() tells the writers not to put the model prefix in front of them.
void walk_weights(const ModelWeights& w, const std::function<void(const WeightRef&)>& fn);
inline bool is_mtp_name(const std::string& name) { return name.rfind("mtp.", 0) == 0; }

}  // namespace lilac
