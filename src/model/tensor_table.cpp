#include "model/tensor_table.h"

namespace lilac {

const char* role_name(TensorRole r) {
  switch (r) {
    case TensorRole::Embed: return "embed_tokens";
    case TensorRole::LmHead: return "lm_head";
    case TensorRole::FinalNorm: return "norm";
    case TensorRole::InputNorm: return "input_layernorm";
    case TensorRole::PostNorm: return "post_attention_layernorm";
    case TensorRole::QProj: return "q_proj";
    case TensorRole::KProj: return "k_proj";
    case TensorRole::VProj: return "v_proj";
    case TensorRole::OProj: return "o_proj";
    case TensorRole::QNorm: return "q_norm";
    case TensorRole::KNorm: return "k_norm";
    case TensorRole::InProjQKV: return "in_proj_qkv";
    case TensorRole::InProjZ: return "in_proj_z";
    case TensorRole::InProjB: return "in_proj_b";
    case TensorRole::InProjA: return "in_proj_a";
    case TensorRole::OutProj: return "out_proj";
    case TensorRole::Conv1d: return "conv1d";
    case TensorRole::DtBias: return "dt_bias";
    case TensorRole::ALog: return "A_log";
    case TensorRole::GdnNorm: return "linear_attn.norm";
    case TensorRole::Router: return "router";
    case TensorRole::SharedExpertGate: return "shared_expert_gate";
    case TensorRole::ExpertsGate: return "experts.gate";
    case TensorRole::ExpertsUp: return "experts.up";
    case TensorRole::ExpertsDown: return "experts.down";
    case TensorRole::SharedGate: return "shared_expert.gate_proj";
    case TensorRole::SharedUp: return "shared_expert.up_proj";
    case TensorRole::SharedDown: return "shared_expert.down_proj";
    case TensorRole::MtpPreFcNormEmbedding: return "mtp.pre_fc_norm_embedding";
    case TensorRole::MtpPreFcNormHidden: return "mtp.pre_fc_norm_hidden";
    case TensorRole::MtpFc: return "mtp.fc";
    case TensorRole::MtpNorm: return "mtp.norm";
  }
  return "?";
}

std::vector<int64_t> TensorSpec::shape() const {
  switch (kind) {
    case WeightKind::Matrix:
    case WeightKind::Conv1d: return {rows, cols};
    case WeightKind::Experts: return {count, rows, cols};
    case WeightKind::NormCentred:
    case WeightKind::Vector: break;
  }
  return {rows};
}

int64_t TensorSpec::elements() const {
  int64_t n = 1;
  for (int64_t d : shape()) n *= d;
  return n;
}

void for_each_tensor(const ModelConfig& c, const std::function<void(const TensorSpec&)>& fn, const TableOptions& opts) {
  const int64_t H = c.hidden_size;
  TensorBlock block = TensorBlock::Backbone;
  auto emit = [&](std::string name, TensorRole role, WeightKind kind, int layer, int64_t rows, int64_t cols = 0,
                  int bits = 0, int64_t count = 0) {
    TensorSpec t;
    t.name = std::move(name);
    t.role = role;
    t.kind = kind;
    t.block = block;
    t.layer = layer;
    t.rows = rows;
    t.cols = cols;
    t.bits = bits;
    t.count = count;
    fn(t);
  };
  using K = WeightKind;
  using R = TensorRole;
  emit("embed_tokens", R::Embed, K::Matrix, -1, c.vocab_size, H, 4);
  if (opts.lm_head) emit("lm_head", R::LmHead, K::Matrix, -1, c.vocab_size, H, 4);
  emit("norm.weight", R::FinalNorm, K::NormCentred, -1, H);
  // One decoder layer named p + "input_layernorm.weight", ...
  auto layer = [&](const std::string& p, int i, bool full_attention) {
    emit(p + "input_layernorm.weight", R::InputNorm, K::NormCentred, i, H);
    emit(p + "post_attention_layernorm.weight", R::PostNorm, K::NormCentred, i, H);
    if (full_attention) {
      const std::string a = p + "self_attn.";
      emit(a + "q_proj", R::QProj, K::Matrix, i, c.q_proj_rows(), H, 4);
      emit(a + "k_proj", R::KProj, K::Matrix, i, c.kv_dim(), H, 4);
      emit(a + "v_proj", R::VProj, K::Matrix, i, c.kv_dim(), H, 4);
      emit(a + "o_proj", R::OProj, K::Matrix, i, H, int64_t(c.num_heads) * c.head_dim, 4);
      emit(a + "q_norm.weight", R::QNorm, K::NormCentred, i, c.head_dim);
      emit(a + "k_norm.weight", R::KNorm, K::NormCentred, i, c.head_dim);
    } else {
      const std::string g = p + "linear_attn.";
      const int64_t Hv = c.linear_num_value_heads;
      emit(g + "in_proj_qkv", R::InProjQKV, K::Matrix, i, c.gdn_conv_dim(), H, 4);
      emit(g + "in_proj_z", R::InProjZ, K::Matrix, i, c.gdn_value_dim(), H, 4);
      emit(g + "in_proj_b", R::InProjB, K::Matrix, i, Hv, H, 4);
      emit(g + "in_proj_a", R::InProjA, K::Matrix, i, Hv, H, 4);
      emit(g + "out_proj", R::OutProj, K::Matrix, i, H, c.gdn_value_dim(), 4);
      emit(g + "conv1d.weight", R::Conv1d, K::Conv1d, i, c.gdn_conv_dim(), c.linear_conv_kernel_dim);
      emit(g + "dt_bias", R::DtBias, K::Vector, i, Hv);
      emit(g + "A_log", R::ALog, K::Vector, i, Hv);
      emit(g + "norm.weight", R::GdnNorm, K::Vector, i, c.linear_value_head_dim);
    }
    const std::string m = p + "mlp.";
    const int64_t E = c.num_experts, I = c.moe_intermediate_size, S = c.shared_expert_intermediate_size;
    emit(m + "gate", R::Router, K::Matrix, i, E, H, 8);
    emit(m + "shared_expert_gate", R::SharedExpertGate, K::Matrix, i, 1, H, 8);
    emit(m + "experts.gate", R::ExpertsGate, K::Experts, i, I, H, 4, E);
    emit(m + "experts.up", R::ExpertsUp, K::Experts, i, I, H, 4, E);
    emit(m + "experts.down", R::ExpertsDown, K::Experts, i, H, I, 4, E);
    emit(m + "shared_expert.gate_proj", R::SharedGate, K::Matrix, i, S, H, 4);
    emit(m + "shared_expert.up_proj", R::SharedUp, K::Matrix, i, S, H, 4);
    emit(m + "shared_expert.down_proj", R::SharedDown, K::Matrix, i, H, S, 4);
  };
  for (int i = 0; i < c.num_layers; ++i) layer("layers." + std::to_string(i) + ".", i, c.full_attention[size_t(i)]);
  if (opts.mtp_layers > 0) {
    block = TensorBlock::Mtp;
    emit("mtp.pre_fc_norm_embedding.weight", R::MtpPreFcNormEmbedding, K::NormCentred, -1, H);
    emit("mtp.pre_fc_norm_hidden.weight", R::MtpPreFcNormHidden, K::NormCentred, -1, H);
    emit("mtp.fc", R::MtpFc, K::Matrix, -1, H, 2 * H, 4);
    for (int i = 0; i < opts.mtp_layers; ++i) layer("mtp.layers." + std::to_string(i) + ".", i, true);
    emit("mtp.norm.weight", R::MtpNorm, K::NormCentred, -1, H);
  }
}

std::vector<TensorSpec> tensor_table(const ModelConfig& c, const TableOptions& opts) {
  std::vector<TensorSpec> out;
  for_each_tensor(c, [&](const TensorSpec& t) { out.push_back(t); }, opts);
  return out;
}

namespace {

// "layers.3.mlp" of "layers.3.mlp.experts.gate", and "gate".
std::string experts_parent(const TensorSpec& t) { return t.name.substr(0, t.name.rfind(".experts.")); }
std::string experts_which(const TensorSpec& t) { return t.name.substr(t.name.rfind('.') + 1); }

}  // namespace

std::string LayoutNames::name(const TensorSpec& t) const {
  if (t.role == TensorRole::LmHead) return head;
  // The MTP block keeps its own names: only backbone tensors get model_prefix.
  const std::string prefix = t.block == TensorBlock::Mtp ? std::string() : model_prefix;
  if (t.kind != WeightKind::Experts) return prefix + t.name;
  const std::string which = experts_which(t);
  if (layout == MLX) return prefix + experts_parent(t) + ".switch_mlp." + which + "_proj";
  return prefix + experts_parent(t) + (which == "down" ? ".experts.down_proj" : ".experts.gate_up_proj");
}

std::string LayoutNames::expert_name(const TensorSpec& t, int64_t e) const {
  const std::string prefix = t.block == TensorBlock::Mtp ? std::string() : model_prefix;
  return prefix + experts_parent(t) + ".experts." + std::to_string(e) + "." + experts_which(t) + "_proj.weight";
}

std::vector<int64_t> LayoutNames::stored_shape(const TensorSpec& t) const {
  if (t.kind == WeightKind::Conv1d)
    return layout == MLX ? std::vector<int64_t>{t.rows, t.cols, 1} : std::vector<int64_t>{t.rows, 1, t.cols};
  if (t.kind == WeightKind::Experts && layout == HF && t.role != TensorRole::ExpertsDown)
    return {t.count, 2 * t.rows, t.cols};
  return t.shape();
}

LayoutNames mlx_names(bool language_model_prefix) {
  LayoutNames n;
  n.layout = LayoutNames::MLX;
  n.model_prefix = language_model_prefix ? "language_model.model." : "model.";
  n.head = language_model_prefix ? "language_model.lm_head" : "lm_head";
  return n;
}

LayoutNames hf_names(bool language_model_prefix) {
  LayoutNames n;
  n.layout = LayoutNames::HF;
  n.model_prefix = language_model_prefix ? "model.language_model." : "model.";
  n.head = "lm_head";
  return n;
}

}  // namespace lilac
