#include "cuda/rows_step.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "cuda/cuda_common.h"
#include "cuda/decode_step.h"
#include "cuda/kernels/digits/moe_digits.h"
#include "cuda/kernels/rows/gemv_rows_wg.h"
#include "cuda/kernels/gemv/gemv.h"

namespace lilac::cuda {

AttnDecodeShape rows_attn_shape(const ModelConfig& c) {
  AttnDecodeShape a;
  a.heads = c.num_heads;
  a.kv_heads = c.num_kv_heads;
  a.head_dim = c.head_dim;
  a.rotary_dim = c.rotary_dim;
  a.eps = float(c.rms_norm_eps);
  return a;
}

rows::GdnRowsShape rows_gdn_shape(const ModelConfig& c) {
  rows::GdnRowsShape g;
  g.Hk = c.linear_num_key_heads;
  g.Hv = c.linear_num_value_heads;
  g.dk = c.linear_key_head_dim;
  g.dv = c.linear_value_head_dim;
  g.conv_k = c.linear_conv_kernel_dim;
  return g;
}

namespace {

// The widest staged input: hidden (norms before projections), the attention output, the GDN output.
int64_t stage_kmax(const ModelConfig& c) {
  return std::max({int64_t(c.hidden_size), int64_t(c.num_heads) * c.head_dim, c.gdn_value_dim()});
}

int64_t act_width(const ModelConfig& c) {
  return int64_t(c.num_experts_per_tok) * c.moe_intermediate_size + c.shared_expert_intermediate_size;
}

size_t moe_scratch(const DevModel& m, int max_rows) {
  size_t b = 16;
  for (const DevLayer& L : m.layers) b = std::max(b, rows::moe_rows_scratch_bytes(L.moe, max_rows));
  return b;
}

// The most partial floats any 4-bit dense matrix of the step needs from the slice kernel at max_rows rows.
size_t gemv_partials(const DevModel& m, int max_rows) {
  size_t f = 0;
  auto take = [&](const QMatrixDev& W) { f = std::max(f, rows::gemv_rows_partial_floats(W, max_rows)); };
  if (!m.lm_tiles) take(m.lm_head);
  for (const DevLayer& L : m.layers) {
    take(L.out_proj);
    for (const DevProj* p : {&L.in_proj, &L.router})
      for (const DevPart& part : p->parts) take(part.m);
  }
  return f;
}

// Whether a layer's MoE runs on the digits kernels (the staged digits' scratch is needed).
bool moe_digits(const DevModel& m) {
  for (const DevLayer& L : m.layers)
    if (L.moe.digits) return true;
  return m.mtp && m.mtp->layer.moe.digits;
}

size_t align256(size_t n) { return (std::max<size_t>(n, 16) + 255) / 256 * 256; }

// Whether a scratch of max_rows rows holds frag4w (some step of up to max_rows rows may take the wgmma rows GEMV).
bool wg_scratch(int max_rows) { return rows::gemv_rows_wg_wanted(std::min(max_rows, 64)); }

// The staging of a layer's input: its input RMSNorm of the residual stream, for in_proj; in the frag4w layout too
// where a part of in_proj takes the wgmma rows GEMV (RowsOps::wg_input).
rows::StageArgs input_stage(const RowsOps& c, const DevLayer& L) {
  const int64_t H = c.m.cfg.hidden_size;
  rows::StageArgs st =
      c.stage_args(c.sc.h, H, H, Prologue::RmsNorm, L.input_norm, L.in_proj.has_bits(4), false, L.in_proj.has_bits(8));
  if (c.wg_input(L.in_proj)) st.frag4w = c.sc.frag4w;
  return st;
}

// Whether the MoE's combine stages the next layer's input in the same launch (LILAC_COMBINE_STAGE=0: two
// launches; measurement).
bool combine_stage_on() {
  static const bool on = env_switch_on("LILAC_COMBINE_STAGE");
  return on;
}

// staged: the layer's input was staged by the previous layer's MoE combine.
void attention_layer(const RowsOps& c, const RowsState& st, const DevLayer& L, int ai, bool staged) {
  const ModelConfig& cfg = c.m.cfg;
  const RowsScratch& sc = c.sc;
  const int64_t H = cfg.hidden_size, ps = sc.proj_stride;
  if (!staged) rows::stage(input_stage(c, L), c.s);
  c.proj(L.in_proj, sc.proj, ps, rows::RowsGemvKernel::Auto, c.wg_input(L.in_proj));
  const AttnDecodeShape as = rows_attn_shape(cfg);
  rows::attn_qk_norm_rope_append_rows(as, c.a.M, c.a.row_slot, c.a.row_pos, sc.proj, ps, L.q_norm, L.k_norm,
                                      c.m.inv_freq, sc.q, st.kv[size_t(ai)], c.s);
  rows::attention_rows(as, c.a.M, c.a.row_slot, c.a.row_pos, sc.q, sc.proj, ps, st.kv[size_t(ai)], st.n_split,
                       sc.partial, sc.attn_out, c.s);
  const int64_t width = int64_t(cfg.num_heads) * cfg.head_dim;
  c.stage(sc.attn_out, width, width, Prologue::None, nullptr, L.out_proj.bits == 4, false, L.out_proj.bits == 8);
  c.gemv(L.out_proj, sc.h, H, true);
}

void gdn_layer(const RowsOps& c, const RowsState& st, const DevLayer& L, int gi, bool staged) {
  const ModelConfig& cfg = c.m.cfg;
  const RowsScratch& sc = c.sc;
  const int64_t H = cfg.hidden_size, ps = sc.proj_stride, vd = cfg.gdn_value_dim();
  if (!staged) rows::stage(input_stage(c, L), c.s);
  c.proj(L.in_proj, sc.proj, ps, rows::RowsGemvKernel::Auto, c.wg_input(L.in_proj));
  rows::gdn_step_rows(rows_gdn_shape(cfg), st.gdn[size_t(gi)], st.gdn_pool, c.a.M, c.a.row_slot, sc.proj, ps, sc.gdn_o,
                      vd, c.a.gdn_mode, sc.gdn_conv, c.s);
  const float* z = sc.proj + cfg.gdn_conv_dim();
  c.stage(sc.gdn_o, vd, vd, Prologue::GatedHeadNorm, L.gdn_norm, L.out_proj.bits == 4, false, L.out_proj.bits == 8, z, ps,
          cfg.linear_value_head_dim);
  c.gemv(L.out_proj, sc.h, H, true);
}

// The layer's MoE; with next (the following layer), its combine may stage next's input too: returns whether it did.
bool moe_block(const RowsOps& c, const DevLayer& L, const DevLayer* next) {
  const ModelConfig& cfg = c.m.cfg;
  const RowsScratch& sc = c.sc;
  const int64_t H = cfg.hidden_size, ldr = cfg.num_experts + 1;
  const int eb = L.moe.gate.first.bits;
  if (L.moe.digits) {  // kernels/digits/moe_digits.h: act's digits staged in a launch of their own
    c.stage(sc.h, H, H, Prologue::RmsNorm, L.post_norm, L.router.has_bits(4), false, L.router.has_bits(8),
            nullptr, 0, 0, sc.moe_xdig);
    c.proj(L.router, sc.rlogits, ldr);
    rows::moe_route_rows(L.moe, sc.rlogits, ldr, c.a.M, c.a.row_slot, sc.sel_ids, sc.sel_w, sc.moe, c.s,
                         digits::kMoEChunk);
    digits::moe_gate_up_rows(L.moe, sc.moe_xdig, c.a.M, sc.moe, sc.act, c.s);
    c.stage(sc.act, sc.act_stride, act_width(cfg), Prologue::None, nullptr, false, false, false, nullptr, 0, 0,
            sc.moe_adig);
    digits::moe_down_rows(L.moe, sc.moe_adig, c.a.M, sc.moe, c.s);
    rows::moe_combine_rows(L.moe, sc.sel_w, c.a.M, c.a.row_slot, sc.moe, sc.h, H, c.s);
    return false;
  }
  c.stage(sc.h, H, H, Prologue::RmsNorm, L.post_norm, L.router.has_bits(4), eb == 4,
          eb == 8 || L.router.has_bits(8));
  c.proj(L.router, sc.rlogits, ldr);
  rows::moe_route_rows(L.moe, sc.rlogits, ldr, c.a.M, c.a.row_slot, sc.sel_ids, sc.sel_w, sc.moe, c.s);
  rows::moe_gate_up_rows(L.moe, eb == 4 ? sc.frag4 : sc.frag8, sc.meta, c.a.M, sc.moe, sc.act, c.s);
  rows::moe_down_rows(L.moe, sc.act, c.a.M, sc.moe, c.s);
  if (next != nullptr && combine_stage_on()) {
    const rows::StageArgs ns = input_stage(c, *next);
    if (rows::combine_stage_supported(L.moe, ns)) {
      rows::moe_combine_stage_rows(L.moe, sc.sel_w, c.a.M, c.a.row_slot, sc.moe, sc.h, H, ns, c.s);
      return true;
    }
  }
  rows::moe_combine_rows(L.moe, sc.sel_w, c.a.M, c.a.row_slot, sc.moe, sc.h, H, c.s);
  return false;
}

__global__ void finish_kernel(const float* logits, int64_t vocab, int M, const int32_t* row_slot,
                              const int32_t* row_pos, float* slot_logits, int32_t* slot_pos) {
  const int r = int(blockIdx.y);
  const int s = row_slot ? row_slot[r] : r;
  if (s < 0) return;
  if (slot_logits)
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < vocab; i += int64_t(gridDim.x) * blockDim.x)
      slot_logits[int64_t(s) * vocab + i] = logits[int64_t(r) * vocab + i];
  if (slot_pos && blockIdx.x == 0 && threadIdx.x == 0) {
    const int next = r + 1 < M ? (row_slot ? row_slot[r + 1] : r + 1) : -1;
    if (next != s) slot_pos[s] = row_pos[r] + 1;
  }
}

void check_rows(const RowsScratch& sc, const RowsArgs& a) {
  if (a.M < 1 || a.M > sc.max_rows)
    throw Error("cuda rows step: " + std::to_string(a.M) + " rows, the scratch holds " + std::to_string(sc.max_rows));
}

}  // namespace

// ------------------------------------------------------------------------------------------------ RowsOps
void RowsOps::stage(const float* x, int64_t ldx, int64_t K, Prologue pro, const float* norm_w, bool need4g, bool need4,
                    bool need8, const float* z, int64_t ldz, int head_dim, void* digits) const {
  rows::stage(stage_args(x, ldx, K, pro, norm_w, need4g, need4, need8, z, ldz, head_dim, digits), s);
}

rows::StageArgs RowsOps::stage_args(const float* x, int64_t ldx, int64_t K, Prologue pro, const float* norm_w,
                                    bool need4g, bool need4, bool need8, const float* z, int64_t ldz, int head_dim,
                                    void* digits) const {
  rows::StageArgs st;
  st.x = x;
  st.ldx = ldx;
  st.K = K;
  st.M = a.M;
  st.row_slot = a.row_slot;
  st.pro = pro;
  st.norm_w = norm_w;
  st.z = z;
  st.ldz = ldz;
  st.head_dim = head_dim;
  st.eps = float(m.cfg.rms_norm_eps);
  st.frag4g = need4g ? sc.frag4g : nullptr;
  st.frag4 = need4 ? sc.frag4 : nullptr;
  st.frag8 = need8 ? sc.frag8 : nullptr;
  st.meta = need4g || need4 || need8 ? sc.meta : nullptr;
  st.digits = digits;
  return st;
}

bool RowsOps::wg_input(const DevProj& p) const {
  if (sc.frag4w == nullptr) return false;
  for (const DevPart& part : p.parts)
    if (rows::gemv_rows_wg_auto(part.m, a.M)) return true;
  return false;
}

void RowsOps::gemv(const QMatrixDev& W, float* y, int64_t ldy, bool acc, rows::RowsGemvKernel kernel,
                   bool wg_in) const {
  rows::GemvRowsArgs g;
  g.W = W;
  g.frag = W.bits == 4 ? sc.frag4g : sc.frag8;
  g.frag_wg = W.bits == 4 && wg_in ? sc.frag4w : nullptr;
  g.meta = sc.meta;
  g.M = a.M;
  g.row_slot = a.row_slot;
  g.y = y;
  g.ldy = ldy;
  g.accumulate = acc;
  g.partials = sc.gemv_partials;
  g.partial_floats = sc.gemv_partial_floats;
  g.kernel = kernel;
  rows::gemv_rows(g, s);
}

void RowsOps::proj(const DevProj& p, float* y, int64_t ldy, rows::RowsGemvKernel kernel, bool wg_in) const {
  for (const DevPart& part : p.parts) gemv(part.m, y + part.offset, ldy, false, kernel, wg_in);
}

size_t rows_scratch_bytes(const DevModel& m, int max_rows, int n_split) {
  const ModelConfig& c = m.cfg;
  const size_t M = size_t(max_rows), kmax = size_t(stage_kmax(c));
  size_t f = M * (size_t(c.hidden_size) + size_t(m.max_in_rows) + 2 * size_t(c.num_heads) * c.head_dim +
                  size_t(c.gdn_value_dim()) + size_t(c.gdn_conv_dim()) + size_t(c.num_experts + 1) +
                  size_t(c.num_experts_per_tok + 1) +
                  size_t(act_width(c)) + size_t(c.vocab_size));
  f += rows::attention_rows_partial_floats(rows_attn_shape(c), n_split, max_rows);
  size_t b = f * 4 + M * 4 * size_t(c.num_experts_per_tok);
  b += (wg_scratch(max_rows) ? 4 : 3) * M * rows::frag_row_bytes(int64_t(kmax)) +
       M * rows::meta_row_count(int64_t(kmax)) * sizeof(float2);
  b += gemv_partials(m, max_rows) * 4;
  b += moe_scratch(m, max_rows) + rows::sample_rows_scratch_bytes(c.vocab_size, max_rows) + M * sizeof(SampleResult);
  if (m.lm_tiles) b += digits::stage_bytes(c.hidden_size, max_rows);
  if (moe_digits(m)) b += digits::moe_stage_bytes(c.hidden_size, max_rows) + digits::moe_stage_bytes(act_width(c), max_rows);
  return b;
}

RowsScratch alloc_rows_scratch(DevAlloc& mem, const DevModel& m, int max_rows, int n_split) {
  const ModelConfig& c = m.cfg;
  LILAC_CHECK(max_rows >= 1 && max_rows <= rows::kMaxRows, "cuda rows step: max_rows out of range");
  RowsScratch sc;
  sc.max_rows = max_rows;
  const size_t M = size_t(max_rows);
  auto f32 = [&](size_t per_row) { return static_cast<float*>(mem.get(align256(M * per_row * 4))); };
  sc.kmax = stage_kmax(c);
  sc.proj_stride = (m.max_in_rows + 3) / 4 * 4;  // 16-byte aligned rows
  sc.act_stride = act_width(c);
  sc.h = f32(size_t(c.hidden_size));
  sc.proj = f32(size_t(sc.proj_stride));
  sc.q = f32(size_t(c.num_heads) * c.head_dim);
  sc.attn_out = f32(size_t(c.num_heads) * c.head_dim);
  sc.gdn_o = f32(size_t(std::max<int64_t>(c.gdn_value_dim(), 4)));
  sc.gdn_conv = f32(size_t(std::max<int64_t>(c.gdn_conv_dim(), 4)));
  sc.frag4g = mem.get(align256(M * rows::frag_row_bytes(sc.kmax)));
  sc.frag4 = mem.get(align256(M * rows::frag_row_bytes(sc.kmax)));
  sc.frag8 = mem.get(align256(M * rows::frag_row_bytes(sc.kmax)));
  if (wg_scratch(max_rows)) sc.frag4w = mem.get(align256(M * rows::frag_row_bytes(sc.kmax)));
  sc.meta = static_cast<float2*>(mem.get(align256(M * rows::meta_row_count(sc.kmax) * sizeof(float2))));
  sc.partial = static_cast<float*>(mem.get(align256(rows::attention_rows_partial_floats(rows_attn_shape(c), n_split, max_rows) * 4)));
  sc.gemv_partial_floats = gemv_partials(m, max_rows);
  sc.gemv_partials = static_cast<float*>(mem.get(align256(sc.gemv_partial_floats * 4)));
  sc.rlogits = f32(size_t(c.num_experts + 1));
  sc.sel_ids = static_cast<int32_t*>(mem.get(align256(M * size_t(c.num_experts_per_tok) * 4)));
  sc.sel_w = f32(size_t(c.num_experts_per_tok + 1));
  sc.act = f32(size_t(sc.act_stride));
  sc.moe = mem.get(align256(moe_scratch(m, max_rows)));
  sc.logits = f32(size_t(c.vocab_size));
  sc.sample = mem.get(align256(rows::sample_rows_scratch_bytes(c.vocab_size, max_rows)));
  sc.results = static_cast<SampleResult*>(mem.get(align256(M * sizeof(SampleResult))));
  if (m.lm_tiles) sc.digits = mem.get(digits::stage_bytes(c.hidden_size, max_rows));
  if (moe_digits(m)) {
    sc.moe_xdig = mem.get(align256(digits::moe_stage_bytes(c.hidden_size, max_rows)));
    sc.moe_adig = mem.get(align256(digits::moe_stage_bytes(act_width(c), max_rows)));
  }
  return sc;
}

bool rows_step_supported(const DevModel& m, int max_rows) {
  const ModelConfig& c = m.cfg;
  if (max_rows < 1 || max_rows > rows::kMaxRows) return false;
  if (c.hidden_size % 64 != 0 || c.gdn_value_dim() % 64 != 0 || (int64_t(c.num_heads) * c.head_dim) % 64 != 0)
    return false;
  if (m.n_gdn > 0 && (c.linear_key_head_dim > 256 || c.linear_num_value_heads % c.linear_num_key_heads != 0 ||
                      c.linear_conv_kernel_dim < 1 || c.linear_conv_kernel_dim > 4))
    return false;
  if (m.n_attn > 0 && (c.head_dim != 32 && c.head_dim != 64 && c.head_dim != 128 && c.head_dim != 256)) return false;
  auto mat_ok = [](const QMatrixDev& W) { return (W.bits == 4 || W.bits == 8) && W.group_size == 64; };
  if (!mat_ok(m.lm_head) || !mat_ok(m.embed)) return false;
  for (const DevLayer& L : m.layers) {
    if (!rows::moe_rows_supported(L.moe, max_rows) || !mat_ok(L.out_proj)) return false;
    for (const DevProj* p : {&L.in_proj, &L.router})
      for (const DevPart& part : p->parts)
        if (!mat_ok(part.m)) return false;
  }
  return true;
}

bool rows_step_exact(const DevModel& m) {
  if (gemv_impl_from_env() != GemvImpl::Tensor) return false;
  for (const DevLayer& L : m.layers)
    if (L.moe.gate.first.rows % 256 != 0) return false;
  return true;
}

void enqueue_rows_body(const DevModel& m, const RowsState& st, const RowsScratch& sc, const RowsArgs& a,
                       cudaStream_t s) {
  check_rows(sc, a);
  const RowsOps c{m, sc, a, s};
  rows::embed_rows(m.embed, a.M, a.row_slot, a.tokens, a.tok_idx, sc.h, m.cfg.hidden_size, s);
  int ai = 0, gi = 0;
  bool staged = false;  // the layer's input staged by the previous layer's combine
  for (size_t i = 0; i < m.layers.size(); ++i) {
    const DevLayer& L = m.layers[i];
    if (L.attn)
      attention_layer(c, st, L, ai++, staged);
    else
      gdn_layer(c, st, L, gi++, staged);
    staged = moe_block(c, L, i + 1 < m.layers.size() ? &m.layers[i + 1] : nullptr);
  }
}

void enqueue_rows_head(const DevModel& m, const RowsScratch& sc, const RowsArgs& a, cudaStream_t s) {
  check_rows(sc, a);
  const RowsOps c{m, sc, a, s};
  const int64_t H = m.cfg.hidden_size;
  if (m.lm_tiles) {
    enqueue_lm_head(m, sc.h, H, a.M, a.row_slot, m.final_norm, sc.logits, m.cfg.vocab_size, sc.digits, s);
    return;
  }
  c.stage(sc.h, H, H, Prologue::RmsNorm, m.final_norm, m.lm_head.bits == 4, false, m.lm_head.bits == 8);
  c.gemv(m.lm_head, sc.logits, m.cfg.vocab_size, false);
}

void enqueue_rows_sample(const DevModel& m, const RowsState& st, const RowsScratch& sc, const RowsArgs& a,
                         cudaStream_t s) {
  check_rows(sc, a);
  rows::SampleRowsArgs r;
  r.logits = sc.logits;
  r.ld_logits = m.cfg.vocab_size;
  r.vocab = m.cfg.vocab_size;
  r.M = a.M;
  r.row_slot = a.row_slot;
  r.params = st.params;
  r.counts = st.counts;
  r.prompt_mask = st.prompt_mask;
  r.allowed = st.allowed;
  r.allowed_on = st.allowed_on;
  r.token_by_slot = st.token;
  r.results = sc.results;
  r.scratch = sc.sample;
  rows::sample_rows(r, s);
}

void enqueue_rows_finish(const DevModel& m, const RowsState& st, const RowsScratch& sc, const RowsArgs& a,
                         cudaStream_t s) {
  check_rows(sc, a);
  if (!st.logits && !st.pos) return;
  const int64_t V = m.cfg.vocab_size;
  const dim3 grid(unsigned(std::min<int64_t>((V + 255) / 256, 32)), unsigned(a.M));
  finish_kernel<<<grid, 256, 0, s>>>(sc.logits, V, a.M, a.row_slot, a.row_pos, st.logits, st.pos);
  LILAC_CUDA_LAUNCH_CHECK();
}

void enqueue_rows_step(const DevModel& m, const RowsState& st, const RowsScratch& sc, const RowsArgs& a,
                       cudaStream_t s) {
  enqueue_rows_body(m, st, sc, a, s);
  enqueue_rows_head(m, sc, a, s);
  if (a.sample) enqueue_rows_sample(m, st, sc, a, s);
  if (a.finish) enqueue_rows_finish(m, st, sc, a, s);
}

void enqueue_rows_commit(const DevModel& m, const RowsState& st, int n_seq, const int32_t* seq_slot,
                         const int32_t* seq_keep, cudaStream_t s) {
  if (st.gdn.empty()) return;
  rows::gdn_commit_rows(rows_gdn_shape(m.cfg), st.gdn.data(), int(st.gdn.size()), st.gdn_pool, n_seq, seq_slot,
                        seq_keep, s);
}

}  // namespace lilac::cuda
