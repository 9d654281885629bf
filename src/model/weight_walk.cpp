#include "model/weight_walk.h"

#include "core/error.h"

namespace lilac {

namespace {

struct ConstSlot {
  const QMatrix* matrix = nullptr;
  const QExperts* experts = nullptr;
  const std::vector<float>* values = nullptr;
};

// One mapping for both constnesses: MW is ModelWeights or const ModelWeights.
template <class Slot, class MW>
Slot slot_of(MW& w, const TensorSpec& t) {
  Slot s;
  using R = TensorRole;
  switch (t.role) {
    case R::Embed: s.matrix = &w.embed; return s;
    case R::LmHead: s.matrix = &w.lm_head; return s;
    case R::FinalNorm: s.values = &w.final_norm; return s;
    case R::MtpPreFcNormEmbedding: s.values = &w.mtp.pre_fc_norm_embedding; return s;
    case R::MtpPreFcNormHidden: s.values = &w.mtp.pre_fc_norm_hidden; return s;
    case R::MtpFc: s.matrix = &w.mtp.fc; return s;
    case R::MtpNorm: s.values = &w.mtp.norm; return s;
    default: break;
  }
  auto& layers = t.block == TensorBlock::Mtp ? w.mtp.layers : w.layers;
  if (t.layer < 0 || size_t(t.layer) >= layers.size())
    throw Error("tensor '" + t.name + "': layer " + std::to_string(t.layer) + " is not in the model");
  auto& L = layers[size_t(t.layer)];
  switch (t.role) {
    case R::InputNorm: s.values = &L.input_norm; break;
    case R::PostNorm: s.values = &L.post_norm; break;
    case R::QProj: s.matrix = &L.attn.q_proj; break;
    case R::KProj: s.matrix = &L.attn.k_proj; break;
    case R::VProj: s.matrix = &L.attn.v_proj; break;
    case R::OProj: s.matrix = &L.attn.o_proj; break;
    case R::QNorm: s.values = &L.attn.q_norm; break;
    case R::KNorm: s.values = &L.attn.k_norm; break;
    case R::InProjQKV: s.matrix = &L.gdn.in_proj_qkv; break;
    case R::InProjZ: s.matrix = &L.gdn.in_proj_z; break;
    case R::InProjB: s.matrix = &L.gdn.in_proj_b; break;
    case R::InProjA: s.matrix = &L.gdn.in_proj_a; break;
    case R::OutProj: s.matrix = &L.gdn.out_proj; break;
    case R::Conv1d: s.values = &L.gdn.conv1d; break;
    case R::DtBias: s.values = &L.gdn.dt_bias; break;
    case R::ALog: s.values = &L.gdn.A_log; break;
    case R::GdnNorm: s.values = &L.gdn.norm; break;
    case R::Router: s.matrix = &L.moe.router; break;
    case R::SharedExpertGate: s.matrix = &L.moe.shared_expert_gate; break;
    case R::ExpertsGate: s.experts = &L.moe.gate; break;
    case R::ExpertsUp: s.experts = &L.moe.up; break;
    case R::ExpertsDown: s.experts = &L.moe.down; break;
    case R::SharedGate: s.matrix = &L.moe.shared_gate; break;
    case R::SharedUp: s.matrix = &L.moe.shared_up; break;
    case R::SharedDown: s.matrix = &L.moe.shared_down; break;
    case R::Embed:
    case R::LmHead:
    case R::FinalNorm:
    case R::MtpPreFcNormEmbedding:
    case R::MtpPreFcNormHidden:
    case R::MtpFc:
    case R::MtpNorm: break;
  }
  return s;
}

}  // namespace

WeightSlot weight_slot(ModelWeights& w, const TensorSpec& t) { return slot_of<WeightSlot>(w, t); }

TableOptions table_options(const ModelWeights& w) {
  TableOptions o;
  o.lm_head = !(w.lm_head.qweight == w.embed.qweight && w.lm_head.dense == w.embed.dense);
  o.mtp_layers = int(w.mtp.layers.size());
  return o;
}

void walk_weights(const ModelWeights& w, const std::function<void(const WeightRef&)>& fn) {
  for_each_tensor(
      w.config,
      [&](const TensorSpec& t) {
        const ConstSlot s = slot_of<ConstSlot>(w, t);
        fn(WeightRef{t.name, t.kind, s.matrix, s.experts, s.values, &t});
      },
      table_options(w));
}

}  // namespace lilac
