#include "model/weight_walk.h"

namespace lilac {

void walk_weights(const ModelWeights& w, const std::function<void(const WeightRef&)>& fn) {
  auto mat = [&](const std::string& n, const QMatrix& m) { fn({n, WeightKind::Matrix, &m, nullptr, nullptr}); };
  auto exp = [&](const std::string& n, const QExperts& e) { fn({n, WeightKind::Experts, nullptr, &e, nullptr}); };
  auto vec = [&](const std::string& n, WeightKind k, const std::vector<float>& v) {
    fn({n, k, nullptr, nullptr, &v});
  };
  mat("embed_tokens", w.embed);
  bool tied = w.lm_head.qweight == w.embed.qweight && w.lm_head.dense == w.embed.dense;
  if (!tied) mat("lm_head", w.lm_head);
  vec("norm.weight", WeightKind::NormCentred, w.final_norm);
  auto layer = [&](const std::string& p, const LayerWeights& L) {
    vec(p + "input_layernorm.weight", WeightKind::NormCentred, L.input_norm);
    vec(p + "post_attention_layernorm.weight", WeightKind::NormCentred, L.post_norm);
    if (L.full_attention) {
      const std::string q = p + "self_attn.";
      mat(q + "q_proj", L.attn.q_proj);
      mat(q + "k_proj", L.attn.k_proj);
      mat(q + "v_proj", L.attn.v_proj);
      mat(q + "o_proj", L.attn.o_proj);
      vec(q + "q_norm.weight", WeightKind::NormCentred, L.attn.q_norm);
      vec(q + "k_norm.weight", WeightKind::NormCentred, L.attn.k_norm);
    } else {
      const std::string q = p + "linear_attn.";
      mat(q + "in_proj_qkv", L.gdn.in_proj_qkv);
      mat(q + "in_proj_z", L.gdn.in_proj_z);
      mat(q + "in_proj_b", L.gdn.in_proj_b);
      mat(q + "in_proj_a", L.gdn.in_proj_a);
      mat(q + "out_proj", L.gdn.out_proj);
      vec(q + "conv1d.weight", WeightKind::Conv1d, L.gdn.conv1d);
      vec(q + "dt_bias", WeightKind::Vector, L.gdn.dt_bias);
      vec(q + "A_log", WeightKind::Vector, L.gdn.A_log);
      vec(q + "norm.weight", WeightKind::Vector, L.gdn.norm);
    }
    const std::string q = p + "mlp.";
    mat(q + "gate", L.moe.router);
    exp(q + "experts.gate", L.moe.gate);
    exp(q + "experts.up", L.moe.up);
    exp(q + "experts.down", L.moe.down);
    mat(q + "shared_expert.gate_proj", L.moe.shared_gate);
    mat(q + "shared_expert.up_proj", L.moe.shared_up);
    mat(q + "shared_expert.down_proj", L.moe.shared_down);
    mat(q + "shared_expert_gate", L.moe.shared_expert_gate);
  };
  for (size_t i = 0; i < w.layers.size(); ++i) layer("layers." + std::to_string(i) + ".", w.layers[i]);
  if (w.has_mtp()) {
    const MtpWeights& m = w.mtp;
    vec("mtp.pre_fc_norm_embedding.weight", WeightKind::NormCentred, m.pre_fc_norm_embedding);
    vec("mtp.pre_fc_norm_hidden.weight", WeightKind::NormCentred, m.pre_fc_norm_hidden);
    mat("mtp.fc", m.fc);
    for (size_t i = 0; i < m.layers.size(); ++i) layer("mtp.layers." + std::to_string(i) + ".", m.layers[i]);
    vec("mtp.norm.weight", WeightKind::NormCentred, m.norm);
  }
}

}  // namespace lilac
