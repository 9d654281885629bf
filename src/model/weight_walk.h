// Where each tensor of the table (model/tensor_table.h) lives in a ModelWeights, and a walk over all of
// them with their layout-neutral names ("embed_tokens", "lm_head", "norm.weight",
// "layers.3.self_attn.q_proj", "layers.0.mlp.experts.gate", ...) — used by the loader to fill a
// ModelWeights and by the checkpoint writers (HF copy, MLX convert) to name tensors in their layout.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "model/tensor_table.h"
#include "model/weights.h"

namespace lilac {

struct WeightRef {
  std::string name;  // e.g. "layers.0.linear_attn.in_proj_qkv" (matrices: no ".weight")
  WeightKind kind;
  const QMatrix* matrix = nullptr;
  const QExperts* experts = nullptr;
  const std::vector<float>* values = nullptr;
  const TensorSpec* spec = nullptr;  // the table's entry (role, shape, bits)
};

// The field of `w` that holds tensor `t` (exactly one pointer is set, by t.kind). `w.layers` must have
// config.num_layers entries (and `w.mtp.layers` the MTP block's layers).
struct WeightSlot {
  QMatrix* matrix = nullptr;
  QExperts* experts = nullptr;
  std::vector<float>* values = nullptr;
};
WeightSlot weight_slot(ModelWeights& w, const TensorSpec& t);

// The table options that describe `w` (lm_head absent when it is tied to embed: the same storage; the MTP
// block when `w` has a head).
TableOptions table_options(const ModelWeights& w);

// Calls fn for each tensor in the table's order. lm_head is skipped when tied to embed (same storage);
// the MTP head's tensors come last (names "mtp.fc", "mtp.layers.0.mlp.gate", ...) when `w` has one.
void walk_weights(const ModelWeights& w, const std::function<void(const WeightRef&)>& fn);
inline bool is_mtp_name(const std::string& name) { return name.rfind("mtp.", 0) == 0; }

}  // namespace lilac
