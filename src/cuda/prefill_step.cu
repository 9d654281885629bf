#include "cuda/prefill_step.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "cuda/cuda_common.h"
#include "cuda/kernels/attention/attention.h"
#include "cuda/kernels/gdn/gdn.h"
#include "cuda/kernels/gemm/gemm.h"
#include "cuda/kernels/qdot.cuh"

namespace lilac::cuda {
namespace {
using namespace dev;

// One chunk's parameters.
struct PrefillCtx {
  const ModelConfig* cfg = nullptr;
  cudaStream_t stream = nullptr;
  int n = 0;
  int64_t start_pos = 0;
  const int32_t* tokens = nullptr;  // device [n]
  QMatrixDev embed;
  const float* inv_freq = nullptr;
  float* h_last = nullptr;  // receives the last row of the residual stream
};

// The per-layer state pointers of the sequence.
struct LayerState {
  __nv_bfloat16 *k_cache = nullptr, *v_cache = nullptr;
  float *gdn_state = nullptr, *conv_state = nullptr;
};


__global__ void embed_rows_kernel(QMatrixDev E, const int32_t* tokens, float* H) {
  const int i = blockIdx.y;
  const int64_t t = tokens[i];
  const int per = 32 / E.bits;
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < E.cols; c += int64_t(gridDim.x) * blockDim.x) {
    const uint32_t word = E.qweight[t * E.words_per_row() + c / per];
    const uint32_t q = (word >> ((c % per) * E.bits)) & ((1u << E.bits) - 1u);
    const int64_t g = t * E.groups_per_row() + c / E.group_size;
    H[int64_t(i) * E.cols + c] = bf2f(E.scales[g]) * float(q) + bf2f(E.biases[g]);
  }
}

__global__ void rmsnorm_rows_bf16_kernel(const float* H, int64_t cols, const float* w, float eps,
                                         __nv_bfloat16* X) {
  __shared__ float red[32];
  const float* x = H + int64_t(blockIdx.x) * cols;
  float ss = 0.f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) ss += x[c] * x[c];
  ss = block_sum(ss, red);
  const float r = rsqrtf(ss / float(cols) + eps);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    X[int64_t(blockIdx.x) * cols + c] = __float2bfloat16(x[c] * r * w[c]);
}

// One block per (token, head): q heads then kv heads.
__global__ void qk_rows_kernel(const float* P, int64_t ldp, int heads, int kv_heads, int hd, int rot, float eps,
                               const float* q_norm, const float* k_norm, const float* inv_freq, int64_t start_pos,
                               __nv_bfloat16* Qb, __nv_bfloat16* kc, __nv_bfloat16* vc) {
  __shared__ float xs[256];
  __shared__ float red[32];
  const int i = blockIdx.y, b = blockIdx.x;
  const bool is_q = b < heads;
  const int h = is_q ? b : b - heads;
  const float* row = P + int64_t(i) * ldp;
  const int64_t q_rows = int64_t(heads) * hd * 2;
  const float* src = is_q ? row + int64_t(h) * 2 * hd : row + q_rows + int64_t(h) * hd;
  const float* w = is_q ? q_norm : k_norm;
  const int64_t pos = start_pos + i;
  float ss = 0.f;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    xs[d] = src[d];
    ss += xs[d] * xs[d];
  }
  ss = block_sum(ss, red);
  const float r = rsqrtf(ss / float(hd) + eps);
  for (int d = threadIdx.x; d < hd; d += blockDim.x) xs[d] = xs[d] * r * w[d];
  __syncthreads();
  const int half = rot / 2;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float val = xs[d];
    if (d < half) {
      float sn, cs;
      sincosf(float(pos) * inv_freq[d], &sn, &cs);
      val = xs[d] * cs - xs[d + half] * sn;
    } else if (d < 2 * half) {
      float sn, cs;
      sincosf(float(pos) * inv_freq[d - half], &sn, &cs);
      val = xs[d] * cs + xs[d - half] * sn;
    }
    if (is_q) {
      Qb[(int64_t(i) * heads + h) * hd + d] = __float2bfloat16(val);
    } else {
      const int64_t o = (pos * kv_heads + h) * hd + d;
      kc[o] = __float2bfloat16(val);
      vc[o] = __float2bfloat16(row[q_rows + int64_t(kv_heads) * hd + int64_t(h) * hd + d]);
    }
  }
}

// The sizes of a PrefillWorkspace's buffers for chunks of up to max_n tokens (bytes; prefill_begin allocates
// them, prefill_workspace_bytes sums them).
struct PrefillSizes {
  size_t H, Xb, P, conv_out, Qb, Ob, o_scratch, moe, gdn_work, split;
  size_t total() const { return H + Xb + P + conv_out + Qb + Ob + o_scratch + moe + gdn_work + split; }
};

PrefillSizes prefill_sizes(const DevModel& m, int max_n) {
  const ModelConfig& c = m.cfg;
  const size_t n = size_t(max_n);
  const int64_t attn_w = int64_t(c.num_heads) * c.head_dim;
  const int64_t ow = std::max<int64_t>(attn_w, c.gdn_value_dim());
  PrefillSizes z;
  z.H = n * c.hidden_size * 4;
  z.Xb = n * c.hidden_size * 2;
  z.P = n * size_t(m.max_in_rows) * 4;
  z.conv_out = n * size_t(c.gdn_conv_dim()) * 4;
  z.Qb = n * size_t(attn_w) * 2;
  z.Ob = n * size_t(ow) * 2;
  z.o_scratch = n * size_t(c.gdn_value_dim()) * 4;
  z.moe = moe_prefill_workspace_bytes(m.layers.front().moe_prefill, max_n);
  // the GDN layers' scratch, for either of gdn_prefill_chunked and gdn_prefill (LILAC_GDN_CHUNKED=0)
  z.gdn_work = m.n_gdn == 0 ? 0
                            : 4 * std::max(gdn_chunked_work_floats(max_n, c.linear_num_key_heads,
                                                                   c.linear_num_value_heads, c.linear_key_head_dim,
                                                                   c.linear_value_head_dim),
                                           gdn_prefill_work_floats(max_n, c.linear_num_key_heads,
                                                                   c.linear_num_value_heads, c.linear_key_head_dim));
  // the split-K partials of the in_proj parts and out_proj (one at a time, on the session's stream)
  size_t split = 0;
  for (const DevLayer& L : m.layers) {
    for (const DevPart& p : L.in_proj.parts) split = std::max(split, qgemm_split_floats(p.m, max_n, GemmOut::StoreF32));
    split = std::max(split, qgemm_split_floats(L.out_proj, max_n, GemmOut::AddF32));
  }
  z.split = split * 4;
  return z;
}

template <typename T>
T* dalloc(PrefillWorkspace& ws, size_t bytes) {
  void* p = nullptr;
  LILAC_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 256)));
  ws.owned.push_back(p);
  return static_cast<T*>(p);
}

void prefill_begin(PrefillWorkspace& ws, const PrefillCtx& ctx, const DevModel& m, int max_n) {
  if (ws.cap < max_n) {
    for (void* p : ws.owned) cudaFree(p);
    ws.owned.clear();
    ws.cap = 0;
    const PrefillSizes z = prefill_sizes(m, max_n);
    ws.H = dalloc<float>(ws, z.H);
    ws.Xb = dalloc<__nv_bfloat16>(ws, z.Xb);
    ws.P = dalloc<float>(ws, z.P);
    ws.conv_out = dalloc<float>(ws, z.conv_out);
    ws.Qb = dalloc<__nv_bfloat16>(ws, z.Qb);
    ws.Ob = dalloc<__nv_bfloat16>(ws, z.Ob);
    ws.o_scratch = dalloc<float>(ws, z.o_scratch);
    ws.moe_ws_bytes = z.moe;
    ws.moe_ws = dalloc<char>(ws, z.moe);
    ws.gdn_work = z.gdn_work ? dalloc<float>(ws, z.gdn_work) : nullptr;
    ws.split_floats = z.split / 4;
    ws.split = z.split ? dalloc<float>(ws, z.split) : nullptr;
    ws.cap = max_n;
  }
  const ModelConfig& c = *ctx.cfg;
  const dim3 grid(unsigned((c.hidden_size + 255) / 256), unsigned(ctx.n));
  embed_rows_kernel<<<grid, 256, 0, ctx.stream>>>(ctx.embed, ctx.tokens, ws.H);
  LILAC_CUDA_LAUNCH_CHECK();
}

void prefill_layer(PrefillWorkspace& ws, const PrefillCtx& ctx, const DevLayer& L, const LayerState& ls) {
  const ModelConfig& c = *ctx.cfg;
  const int n = ctx.n;
  const int64_t H = c.hidden_size;
  const float eps = float(c.rms_norm_eps);
  cudaStream_t s = ctx.stream;
  const SplitScratch split{ws.split, ws.split_floats};
  rmsnorm_rows_bf16_kernel<<<n, 256, 0, s>>>(ws.H, H, L.input_norm, eps, ws.Xb);
  LILAC_CUDA_LAUNCH_CHECK();
  for (const DevPart& p : L.in_proj.parts)
    qgemm(p.m, ws.Xb, H, n, ws.P + p.offset, L.in_proj.rows, GemmOut::StoreF32, s, split);
  if (L.attn) {
    const int hd = c.head_dim;
    qk_rows_kernel<<<dim3(c.num_heads + c.num_kv_heads, n), 128, 0, s>>>(
        ws.P, L.in_proj.rows, c.num_heads, c.num_kv_heads, hd, c.rotary_dim, eps, L.q_norm, L.k_norm, ctx.inv_freq,
        ctx.start_pos, ws.Qb, ls.k_cache, ls.v_cache);
    LILAC_CUDA_LAUNCH_CHECK();
    AttentionPrefillArgs a;
    a.q = ws.Qb;
    a.q_stride = int64_t(c.num_heads) * hd;
    a.q_head_stride = hd;
    a.k_cache = ls.k_cache;
    a.v_cache = ls.v_cache;
    a.kv_stride = c.kv_dim();
    a.gate = ws.P + hd;
    a.gate_stride = L.in_proj.rows;
    a.gate_head_stride = 2 * hd;
    a.out = ws.Ob;
    a.out_stride = int64_t(c.num_heads) * hd;
    a.n_new = n;
    a.start_pos = ctx.start_pos;
    a.heads = c.num_heads;
    a.kv_heads = c.num_kv_heads;
    a.head_dim = hd;
    attention_prefill(a, s);
    qgemm(L.out_proj, ws.Ob, int64_t(c.num_heads) * hd, n, ws.H, H, GemmOut::AddF32, s, split);
  } else {
    const int64_t C = c.gdn_conv_dim(), vd = c.gdn_value_dim();
    gdn_conv_prefill(ws.P, L.in_proj.rows, L.conv_w, ls.conv_state, ws.conv_out, C, n, int(C), c.linear_conv_kernel_dim,
                     s);
    GdnPrefillArgs g;
    g.qkv = ws.conv_out;
    g.ld_qkv = C;
    g.z = ws.P + C;
    g.ld_z = L.in_proj.rows;
    g.b = ws.P + C + vd;
    g.ld_b = L.in_proj.rows;
    g.a = ws.P + C + vd + c.linear_num_value_heads;
    g.ld_a = L.in_proj.rows;
    g.A_log = L.A_log;
    g.dt_bias = L.dt_bias;
    g.norm_w = L.gdn_norm;
    g.eps = eps;
    g.state = ls.gdn_state;
    g.o_scratch = ws.o_scratch;
    g.work = ws.gdn_work;
    g.out = ws.Ob;
    g.ld_out = vd;
    g.n = n;
    g.Hk = c.linear_num_key_heads;
    g.Hv = c.linear_num_value_heads;
    g.dk = c.linear_key_head_dim;
    g.dv = c.linear_value_head_dim;
    // The chunked kernel (chunk 64, 3xTF32 state products: fp32-accurate) by default: 1.4x faster than the
    // column scan at 4096 tokens and exact to the oracle on real4 (bench/GPU_NOTES.md, "Chunked GDN").
    // LILAC_GDN_CHUNKED=0 selects the column scan, =tf32 the plain-TF32 chunked variant.
    static const char* gdn_chunked = std::getenv("LILAC_GDN_CHUNKED");
    if (gdn_chunked && *gdn_chunked == '0')
      gdn_prefill(g, s);
    else
      gdn_prefill_chunked(g, s, gdn_chunked && *gdn_chunked == 't' ? GdnChunkedMath::TF32 : GdnChunkedMath::Split3xTF32);
    qgemm(L.out_proj, ws.Ob, vd, n, ws.H, H, GemmOut::AddF32, s, split);
  }
  rmsnorm_rows_bf16_kernel<<<n, 256, 0, s>>>(ws.H, H, L.post_norm, eps, ws.Xb);
  LILAC_CUDA_LAUNCH_CHECK();
  moe_prefill(L.moe_prefill, ws.Xb, H, n, ws.H, H, true, ws.moe_ws, s);
}

void prefill_finish(PrefillWorkspace& ws, const PrefillCtx& ctx) {
  const int64_t H = ctx.cfg->hidden_size;
  LILAC_CUDA_CHECK(cudaMemcpyAsync(ctx.h_last, ws.H + int64_t(ctx.n - 1) * H, size_t(H) * 4,
                                   cudaMemcpyDeviceToDevice, ctx.stream));
}

}  // namespace

PrefillWorkspace::~PrefillWorkspace() {
  for (void* p : owned) cudaFree(p);
}

int prefill_chunk_tokens() {
  static const int n = [] {
    const char* e = std::getenv("LILAC_PREFILL_CHUNK");
    const int v = e ? std::atoi(e) : 4096;
    return std::clamp(v, 16, 16384);
  }();
  return n;
}

size_t prefill_workspace_bytes(const DevModel& m, int max_n) { return prefill_sizes(m, max_n).total(); }

bool prefill_batched_ok(const DevModel& m) {
  const ModelConfig& c = m.cfg;
  const char* e = std::getenv("LILAC_CUDA_TOKEN_PREFILL");
  const bool forced_off = e && std::string(e) == "1";
  const bool gdn_ok = m.n_gdn == 0 || (c.linear_key_head_dim == 128 && c.linear_value_head_dim == 128);
  const bool attn_ok = m.n_attn == 0 || c.head_dim == 64 || c.head_dim == 128 || c.head_dim == 256;
  return !forced_off && gdn_ok && attn_ok && c.hidden_size % 64 == 0;
}

void prefill_chunk(const DevModel& m, const SeqState& st, PrefillWorkspace& ws, const int32_t* tokens, int n,
                   float* h_last, cudaStream_t s) {
  PrefillCtx ctx;
  ctx.cfg = &m.cfg;
  ctx.stream = s;
  ctx.n = n;
  ctx.start_pos = st.len;
  ctx.tokens = tokens;
  ctx.embed = m.embed;
  ctx.inv_freq = m.inv_freq;
  ctx.h_last = h_last;
  prefill_begin(ws, ctx, m, prefill_chunk_tokens());
  int ai = 0, gi = 0;
  for (const DevLayer& L : m.layers) {
    LayerState ls;
    if (L.attn) {
      ls.k_cache = st.k_cache[ai];
      ls.v_cache = st.v_cache[ai];
      ++ai;
    } else {
      ls.gdn_state = st.gdn(gi);
      ls.conv_state = st.conv(gi);
      ++gi;
    }
    prefill_layer(ws, ctx, L, ls);
  }
  prefill_finish(ws, ctx);
}

}  // namespace lilac::cuda
