#include "cpufast/packed_model.h"

#include "core/thread_pool.h"

namespace lilac::cpufast {

std::unique_ptr<PackedModel> pack_model(const ModelWeights& w, const KernelSet& kernels, int threads) {
  auto pm = std::make_unique<PackedModel>();
  pm->kernels = &kernels;
  ThreadPool pool(threads);
  const int R = kernels.rows_per_tile;
  auto pack = [&](std::vector<QMatrix> parts, const std::string& what) {
    PackedMatrix m = pack_matrix(parts, R, what.c_str(), pm->owners, &pool);
    pm->bytes += packed_bytes(m);
    return m;
  };
  const ModelConfig& c = w.config;
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const LayerWeights& lw = w.layers[l];
    const std::string pre = "layer " + std::to_string(l) + " ";
    PackedLayer pl;
    if (lw.full_attention) {
      pl.in = pack({lw.attn.q_proj, lw.attn.k_proj, lw.attn.v_proj}, pre + "q/k/v_proj");
      pl.out = pack({lw.attn.o_proj}, pre + "o_proj");
    } else {
      pl.in = pack({lw.gdn.in_proj_qkv, lw.gdn.in_proj_z, lw.gdn.in_proj_b, lw.gdn.in_proj_a}, pre + "in_proj");
      pl.out = pack({lw.gdn.out_proj}, pre + "out_proj");
    }
    const MoEWeights& m = lw.moe;
    pl.router = pack({m.router, m.shared_expert_gate}, pre + "mlp.gate");
    pl.shared_gate = pack({m.shared_gate}, pre + "shared_expert.gate_proj");
    pl.shared_up = pack({m.shared_up}, pre + "shared_expert.up_proj");
    pl.shared_down = pack({m.shared_down}, pre + "shared_expert.down_proj");
    for (int e = 0; e < c.num_experts; ++e) {
      pl.expert_gate.push_back(pack({m.gate.expert(e)}, pre + "experts.gate_proj"));
      pl.expert_up.push_back(pack({m.up.expert(e)}, pre + "experts.up_proj"));
      pl.expert_down.push_back(pack({m.down.expert(e)}, pre + "experts.down_proj"));
    }
    pm->layers.push_back(std::move(pl));
  }
  pm->lm_head = pack({w.lm_head}, "lm_head");
  return pm;
}

}  // namespace lilac::cpufast
