#include "cuda/device_model.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>

#include "core/error.h"
#include "cuda/cuda_common.h"
#include "cuda/kernels/digits/moe_digits.h"
#include "model/rope.h"

namespace lilac::cuda {

DevAlloc::~DevAlloc() {
  for (void* p : ptrs) cudaFree(p);
}

void* DevAlloc::get(size_t n) {
  void* p = nullptr;
  LILAC_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 16)));
  ptrs.push_back(p);
  bytes += n;
  return p;
}

bool DevAlloc::release(const void* p, size_t n) {
  const auto it = std::find(ptrs.begin(), ptrs.end(), p);
  if (it == ptrs.end()) return false;
  LILAC_CUDA_CHECK(cudaFree(*it));
  ptrs.erase(it);
  bytes -= std::min(bytes, n);
  return true;
}

void DevAlloc::copy_to_device(void* dst, const void* src, size_t bytes) {
  LILAC_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}

namespace {

QMatrixDev upload_q(DevAlloc& mem, const QMatrix& q, const std::string& name) {
  LILAC_CHECK(q.quantized(), "cuda: " + name + " is not quantized (dense matrices are not supported on the GPU)");
  LILAC_CHECK(q.bits == 4 || q.bits == 8, "cuda: " + name + ": only 4- and 8-bit matrices are supported");
  QMatrixDev d;
  d.rows = q.rows;
  d.cols = q.cols;
  d.bits = q.bits;
  d.group_size = q.group_size;
  d.qweight = mem.upload(q.qweight, size_t(q.rows * q.words_per_row()));
  d.scales = reinterpret_cast<const __nv_bfloat16*>(mem.upload(q.scales, size_t(q.rows * q.groups_per_row())));
  d.biases = reinterpret_cast<const __nv_bfloat16*>(mem.upload(q.biases, size_t(q.rows * q.groups_per_row())));
  return d;
}

// Rows of several matrices in one allocation (fused where bits / group / cols agree).
DevProj upload_fused(DevAlloc& mem, const std::vector<std::pair<const QMatrix*, std::string>>& mats) {
  DevProj p;
  size_t i = 0;
  while (i < mats.size()) {
    size_t j = i + 1;
    const QMatrix& a = *mats[i].first;
    LILAC_CHECK(a.quantized(), "cuda: " + mats[i].second + " is not quantized (dense matrices are not supported)");
    while (j < mats.size() && mats[j].first->quantized() && mats[j].first->bits == a.bits &&
           mats[j].first->group_size == a.group_size && mats[j].first->cols == a.cols)
      ++j;
    int64_t rows = 0;
    for (size_t k = i; k < j; ++k) rows += mats[k].first->rows;
    QMatrixDev d;
    d.rows = rows;
    d.cols = a.cols;
    d.bits = a.bits;
    d.group_size = a.group_size;
    LILAC_CHECK(a.bits == 4 || a.bits == 8, "cuda: " + mats[i].second + ": only 4- and 8-bit supported");
    const int64_t wpr = a.words_per_row(), gpr = a.groups_per_row();
    auto* qw = static_cast<uint32_t*>(mem.get(size_t(rows * wpr) * 4));
    auto* sc = static_cast<uint16_t*>(mem.get(size_t(rows * gpr) * 2));
    auto* bi = static_cast<uint16_t*>(mem.get(size_t(rows * gpr) * 2));
    int64_t r0 = 0;
    for (size_t k = i; k < j; ++k) {
      const QMatrix& m = *mats[k].first;
      LILAC_CUDA_CHECK(cudaMemcpy(qw + r0 * wpr, m.qweight, size_t(m.rows * wpr) * 4, cudaMemcpyHostToDevice));
      LILAC_CUDA_CHECK(cudaMemcpy(sc + r0 * gpr, m.scales, size_t(m.rows * gpr) * 2, cudaMemcpyHostToDevice));
      LILAC_CUDA_CHECK(cudaMemcpy(bi + r0 * gpr, m.biases, size_t(m.rows * gpr) * 2, cudaMemcpyHostToDevice));
      r0 += m.rows;
    }
    d.qweight = qw;
    d.scales = reinterpret_cast<const __nv_bfloat16*>(sc);
    d.biases = reinterpret_cast<const __nv_bfloat16*>(bi);
    p.parts.push_back({d, p.rows});
    p.rows += rows;
    i = j;
  }
  return p;
}

QExpertsDev upload_experts(DevAlloc& mem, const QExperts& e, const std::string& name) {
  QExpertsDev d;
  d.n = e.n;
  QMatrix all = e.first;
  all.rows = e.first.rows * e.n;  // experts are contiguous
  d.first = upload_q(mem, all, name);
  d.first.rows = e.first.rows;
  return d;
}

// The MoE kernels' views of a layer whose router and expert matrices are in place.
void finish_moe(DevLayer& L, const ModelConfig& cfg) {
  L.moe.E = cfg.num_experts;
  L.moe.top_k = cfg.num_experts_per_tok;
  L.moe.renormalise = cfg.norm_topk_prob;
  // The digits MoE is opt-in (LILAC_DIGITS_MOE=1) until it is faster than the fp16 kernels it would replace
  // (bench/GPU_NOTES.md, "Fourteenth stop").
  const char* dm = std::getenv("LILAC_DIGITS_MOE");
  L.moe.digits = env_switch_on("LILAC_DIGITS") && dm && std::string(dm) == "1" && digits::moe_supported(L.moe);
  MoEPrefillWeights& p = L.moe_prefill;
  p.gate = L.moe.gate;
  p.up = L.moe.up;
  p.down = L.moe.down;
  p.shared_gate = L.moe.shared_gate;
  p.shared_up = L.moe.shared_up;
  p.shared_down = L.moe.shared_down;
  p.top_k = cfg.num_experts_per_tok;
  p.renormalise = cfg.norm_topk_prob;
  // router view(s): the prefill path takes the router and shared_expert_gate as separate matrices
  const DevPart& r0 = L.router.parts[0];
  if (L.router.parts.size() == 1) {
    p.router = r0.m;
    p.router.rows = cfg.num_experts;
    p.shared_expert_gate = r0.m;
    p.shared_expert_gate.rows = 1;
    p.shared_expert_gate.qweight += cfg.num_experts * r0.m.words_per_row();
    p.shared_expert_gate.scales += cfg.num_experts * r0.m.groups_per_row();
    p.shared_expert_gate.biases += cfg.num_experts * r0.m.groups_per_row();
  } else {
    p.router = r0.m;
    p.shared_expert_gate = L.router.parts[1].m;
  }
}

DevLayer upload_layer(DevAlloc& mem, const LayerWeights& lw, const std::string& pre) {
  DevLayer L;
  L.attn = lw.full_attention;
  L.input_norm = mem.upload(lw.input_norm);
  L.post_norm = mem.upload(lw.post_norm);
  if (L.attn) {
    L.in_proj = upload_fused(mem, {{&lw.attn.q_proj, pre + "q_proj"}, {&lw.attn.k_proj, pre + "k_proj"},
                                   {&lw.attn.v_proj, pre + "v_proj"}});
    L.out_proj = upload_q(mem, lw.attn.o_proj, pre + "o_proj");
    L.q_norm = mem.upload(lw.attn.q_norm);
    L.k_norm = mem.upload(lw.attn.k_norm);
  } else {
    L.in_proj = upload_fused(mem, {{&lw.gdn.in_proj_qkv, pre + "in_proj_qkv"},
                                   {&lw.gdn.in_proj_z, pre + "in_proj_z"},
                                   {&lw.gdn.in_proj_b, pre + "in_proj_b"},
                                   {&lw.gdn.in_proj_a, pre + "in_proj_a"}});
    L.out_proj = upload_q(mem, lw.gdn.out_proj, pre + "out_proj");
    L.conv_w = mem.upload(lw.gdn.conv1d);
    L.A_log = mem.upload(lw.gdn.A_log);
    L.dt_bias = mem.upload(lw.gdn.dt_bias);
    L.gdn_norm = mem.upload(lw.gdn.norm);
  }
  L.router = upload_fused(mem, {{&lw.moe.router, pre + "mlp.gate"},
                                {&lw.moe.shared_expert_gate, pre + "mlp.shared_expert_gate"}});
  L.moe.gate = upload_experts(mem, lw.moe.gate, pre + "switch_mlp.gate_proj");
  L.moe.up = upload_experts(mem, lw.moe.up, pre + "switch_mlp.up_proj");
  L.moe.down = upload_experts(mem, lw.moe.down, pre + "switch_mlp.down_proj");
  L.moe.shared_gate = upload_q(mem, lw.moe.shared_gate, pre + "shared_expert.gate_proj");
  L.moe.shared_up = upload_q(mem, lw.moe.shared_up, pre + "shared_expert.up_proj");
  L.moe.shared_down = upload_q(mem, lw.moe.shared_down, pre + "shared_expert.down_proj");
  return L;
}

}  // namespace

void check_device_config(const ModelConfig& c) {
  LILAC_CHECK(c.attn_output_gate, "cuda: attn_output_gate false is not supported");
  LILAC_CHECK(c.linear_num_value_heads % c.linear_num_key_heads == 0, "cuda: bad linear head counts");
  LILAC_CHECK(c.hidden_size % 64 == 0, "cuda: hidden_size must be a multiple of 64");
}

std::unique_ptr<DevModel> upload_model(const ModelWeights& w) {
  auto m = std::make_unique<DevModel>();
  m->cfg = w.config;
  check_device_config(m->cfg);
  m->embed = upload_q(m->mem, w.embed, "embed_tokens");
  if (w.lm_head.qweight == w.embed.qweight)
    m->lm_head = m->embed;
  else
    m->lm_head = upload_q(m->mem, w.lm_head, "lm_head");
  m->final_norm = m->mem.upload(w.final_norm);
  for (size_t i = 0; i < w.layers.size(); ++i)
    m->layers.push_back(upload_layer(m->mem, w.layers[i], "layers." + std::to_string(i) + "."));
  if (w.has_mtp()) {
    LILAC_CHECK(w.mtp.layers.size() == 1 && w.mtp.layers[0].full_attention,
                "cuda: the MTP head must be one full-attention layer");
    m->mtp = std::make_unique<DevMtp>();
    DevMtp& d = *m->mtp;
    d.pre_fc_norm_embedding = m->mem.upload(w.mtp.pre_fc_norm_embedding);
    d.pre_fc_norm_hidden = m->mem.upload(w.mtp.pre_fc_norm_hidden);
    d.norm = m->mem.upload(w.mtp.norm);
    d.fc = upload_q(m->mem, w.mtp.fc, "mtp.fc");
    d.layer = upload_layer(m->mem, w.mtp.layers[0], "mtp.layers.0.");
  }
  finish_model(*m);
  return m;
}

namespace {

// The LM head in tile order (DevModel::lm_tiles); its checkpoint-layout buffers freed when nothing else reads them.
void repack_lm_head(DevModel& m) {
  QMatrixDev& W = m.lm_head;
  if (!env_switch_on("LILAC_DIGITS") || !digits::tiles_supported(W)) return;
  void* q = m.mem.get(digits::tiles_q_bytes(W));
  void* sb = m.mem.get(digits::tiles_sb_bytes(W));
  digits::tiles_repack(W, q, sb, nullptr);
  LILAC_CUDA_CHECK(cudaDeviceSynchronize());
  m.lm_tiles.rows = W.rows;
  m.lm_tiles.K = W.cols;
  m.lm_tiles.q = static_cast<const uint4*>(q);
  m.lm_tiles.sb = static_cast<const uint32_t*>(sb);
  if (W.qweight == m.embed.qweight) return;  // tied: the embedding gather reads them
  const size_t groups = size_t(W.rows) * size_t(W.groups_per_row());
  m.mem.release(W.qweight, size_t(W.rows * W.words_per_row()) * 4);
  m.mem.release(W.scales, groups * 2);
  m.mem.release(W.biases, groups * 2);
  W.qweight = nullptr;
  W.scales = W.biases = nullptr;
}

}  // namespace

void finish_model(DevModel& m) {
  const ModelConfig& c = m.cfg;
  repack_lm_head(m);
  m.inv_freq = m.mem.upload(rope_inv_freq(c.rotary_dim, c.rope_theta));
  m.n_attn = m.n_gdn = 0;
  m.max_in_rows = 0;
  for (DevLayer& L : m.layers) {
    finish_moe(L, c);
    (L.attn ? m.n_attn : m.n_gdn)++;
    m.max_in_rows = std::max(m.max_in_rows, L.in_proj.rows);
  }
  if (m.mtp) {
    finish_moe(m.mtp->layer, c);
    m.max_in_rows = std::max(m.max_in_rows, m.mtp->layer.in_proj.rows);
  }
}

}  // namespace lilac::cuda
