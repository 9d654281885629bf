#include "cuda/mtp_head.h"

#include <algorithm>
#include <cfloat>
#include <string>

#include "core/error.h"
#include "cuda/cuda_common.h"
#include "cuda/graph_capture.h"
#include "cuda/kernels/gemv/gemv.h"
#include "cuda/kernels/launch.cuh"
#include "cuda/kernels/qdot.cuh"
#include "cuda/kernels/rows/rows_mm.h"
#include "cuda/kernels/rows/rows_state.h"
#include "cuda/kernels/sampling/sampling.h"
#include "cuda/rows_step.h"

namespace lilac::cuda {
namespace {
using namespace dev;

// Where a row's inputs come from.
enum RowMode : int {
  kCatchUp = 0,  // the pair at *mpos: hidden and next token from the ring; *dpos = *mpos
  kPending = 1,  // the pending row: hidden from the ring at *mpos, token *pending; *dpos = *mpos
  kChain = 2,    // a chain row: hidden = the previous row's u (after mtp.norm), token = the previous draft; ++*dpos
};

struct InputArgs {
  QMatrixDev embed;
  int mode = 0;
  const float* ring_h = nullptr;
  const int32_t* ring_x = nullptr;
  const int32_t* mpos = nullptr;
  int32_t* dpos = nullptr;
  const int32_t* token = nullptr;  // kPending: the pending token; kChain: the previous draft
  const float* u_prev = nullptr;   // kChain
  const float *final_norm = nullptr, *mtp_norm = nullptr, *pre_e = nullptr, *pre_h = nullptr;
  float eps = 1e-6f;
  int H = 0;
  float* cat = nullptr;  // [2H]
};

constexpr int kInputThreads = 512;

// cat = [RMSNorm(embed[tok]; pre_fc_norm_embedding) | RMSNorm(RMSNorm(hid; w1); pre_fc_norm_hidden)] by one block
// (the same arithmetic in the one-row and the rows kernel). sm: [2H] floats of shared memory.
__device__ void input_row(const InputArgs& a, int64_t t, const float* hid, const float* w1, float* sm, float* red,
                          float* cat) {
  const int H = a.H;
  const QMatrixDev& E = a.embed;
  const int per = 32 / E.bits;
  float se = 0.f, sh = 0.f;
  for (int c = threadIdx.x; c < H; c += blockDim.x) {
    const uint32_t word = E.qweight[t * E.words_per_row() + c / per];
    const uint32_t q = (word >> ((c % per) * E.bits)) & ((1u << E.bits) - 1u);
    const int64_t g = t * E.groups_per_row() + c / E.group_size;
    const float e = bf2f(E.scales[g]) * float(q) + bf2f(E.biases[g]);
    sm[c] = e;
    se += e * e;
    const float h = hid[c];
    sm[H + c] = h;
    sh += h * h;
  }
  se = block_sum(se, red);
  sh = block_sum(sh, red);
  const float re = rsqrtf(se / float(H) + a.eps), rh = rsqrtf(sh / float(H) + a.eps);
  float s2 = 0.f;
  for (int c = threadIdx.x; c < H; c += blockDim.x) {
    cat[c] = sm[c] * re * a.pre_e[c];
    const float y = sm[H + c] * rh * w1[c];
    sm[H + c] = y;
    s2 += y * y;
  }
  s2 = block_sum(s2, red);
  const float r2 = rsqrtf(s2 / float(H) + a.eps);
  for (int c = threadIdx.x; c < H; c += blockDim.x) cat[H + c] = sm[H + c] * r2 * a.pre_h[c];
}

__device__ int32_t table_token(const InputArgs& a, int32_t tok) {
  return tok < 0 || tok >= a.embed.rows ? 0 : tok;  // never read outside the table (garbage in, a wrong draft out)
}

// One row: w1 the final norm for a main-model hidden (the ring holds the residual before it) or mtp.norm for a
// chain row. One block.
__global__ void __launch_bounds__(kInputThreads) mtp_input_kernel(InputArgs a) {
  extern __shared__ float sm[];  // [2H]: the embedding row, then the first norm of h
  __shared__ float red[32];
  __shared__ int tok_s;
  __shared__ const float* hid_s;
  pdl_wait();
  pdl_trigger();
  const int H = a.H;
  if (threadIdx.x == 0) {
    const float* hid;
    int32_t tok;
    if (a.mode == kChain) {
      hid = a.u_prev;
      tok = *a.token;
      *a.dpos = *a.dpos + 1;
    } else {
      const int32_t p = *a.mpos;
      hid = a.ring_h + int64_t(p % kMtpRing) * H;
      tok = a.mode == kPending ? *a.token : a.ring_x[(p + 1) % kMtpRing];
      *a.dpos = p;
    }
    tok_s = table_token(a, tok);
    hid_s = hid;
  }
  __syncthreads();
  input_row(a, tok_s, hid_s, a.mode == kChain ? a.mtp_norm : a.final_norm, sm, red, a.cat);
}

// Catch-up rows *mpos + r (block r): the pairs' fc inputs into cat [rows][2H], their positions into row_pos.
__global__ void __launch_bounds__(kInputThreads) mtp_input_rows_kernel(InputArgs a, int32_t* row_pos) {
  extern __shared__ float sm[];
  __shared__ float red[32];
  pdl_wait();
  pdl_trigger();
  const int H = a.H;
  const int32_t p = *a.mpos + int32_t(blockIdx.x);
  if (threadIdx.x == 0) row_pos[blockIdx.x] = p;
  const float* hid = a.ring_h + int64_t(p % kMtpRing) * H;
  input_row(a, table_token(a, a.ring_x[(p + 1) % kMtpRing]), hid, a.final_norm, sm, red,
            a.cat + int64_t(blockIdx.x) * 2 * H);
}

// Greedy argmax of the head's logits (ties to the lower id, NaN never wins) in one launch: block partials;
// the last block to finish (an arrival counter, reset by it for the next launch) merges them. The merge is an
// order-free maximum, so the choice does not depend on which block is last.
constexpr int kArgBlocks = 128, kArgThreads = 256;
struct ArgPart {
  float v;
  int i;
};
__device__ __forceinline__ bool better(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }
__device__ __forceinline__ void warp_best(float& v, int& i) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (better(ov, oi, v, i)) v = ov, i = oi;
  }
}
__device__ void block_best(float& v, int& i) {
  __shared__ ArgPart sp[32];
  warp_best(v, i);
  if ((threadIdx.x & 31) == 0) sp[threadIdx.x >> 5] = {v, i};
  __syncthreads();
  if (threadIdx.x < 32) {
    const int nw = (blockDim.x + 31) >> 5;
    v = threadIdx.x < nw ? sp[threadIdx.x].v : -INFINITY;
    i = threadIdx.x < nw ? sp[threadIdx.x].i : 0x7fffffff;
    warp_best(v, i);
  }
}

__global__ void __launch_bounds__(kArgThreads) argmax_kernel(const float* x, int64_t n, ArgPart* part,
                                                               unsigned* arrived, int32_t* out) {
  static_assert(kArgBlocks <= kArgThreads, "the last block merges a partial per thread");
  __shared__ bool last;
  pdl_wait();
  pdl_trigger();
  float v = -INFINITY;
  int idx = 0x7fffffff;
  for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < n; j += int64_t(gridDim.x) * blockDim.x) {
    const float y = x[j];
    if (better(y, int(j), v, idx)) v = y, idx = int(j);  // NaN: never better
  }
  block_best(v, idx);
  if (threadIdx.x == 0) {
    part[blockIdx.x] = {v, idx};
    __threadfence();
    last = atomicAdd(arrived, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  v = -INFINITY;
  idx = 0x7fffffff;
  if (threadIdx.x < gridDim.x) {  // the other blocks' partials, from L2 (not this SM's L1)
    const volatile ArgPart* q = part + threadIdx.x;
    v = q->v;
    idx = q->i;
  }
  block_best(v, idx);
  if (threadIdx.x == 0) {
    *out = idx == 0x7fffffff ? 0 : idx;
    *arrived = 0;
  }
}

void sync(cudaStream_t s) { LILAC_CUDA_CHECK(cudaStreamSynchronize(s)); }

}  // namespace

struct MtpHead::Graphs {
  cudaGraphExec_t row = nullptr, row_logits = nullptr;  // one catch-up row (without / with its logits)
  cudaGraphExec_t rows[kCatchRows + 1] = {};           // rows[n]: n catch-up rows (n = 1..8, 16, 32, 64)
  cudaGraphExec_t draft[kMaxDrafts + 1] = {};          // draft[k]: the pending row + k - 1 chain rows
  const int32_t* pending = nullptr;                     // the token slot the draft graphs read
  ~Graphs() {
    if (row) cudaGraphExecDestroy(row);
    if (row_logits) cudaGraphExecDestroy(row_logits);
    for (cudaGraphExec_t g : rows)
      if (g) cudaGraphExecDestroy(g);
    for (cudaGraphExec_t g : draft)
      if (g) cudaGraphExecDestroy(g);
  }
};

// The catch-up rows' scratch on the multi-row kernels (kCatchRows rows): the fc inputs, the row arrays, and the
// fields of a rows step's scratch that RowsOps and the K/V append use (h, proj, q, the staged input, fc's partials).
struct MtpHead::Rows {
  float* cat = nullptr;                             // [rows][2H]
  int32_t *row_slot = nullptr, *row_pos = nullptr;  // [rows]: zeros (the head's one cache); *mpos + r
  RowsScratch sc;
};

// Whether the catch-up rows run on the multi-row kernels: where those are bit for bit the one-row kernels (the
// real model's shapes), unless LILAC_MTP_CATCHUP_ROWS=0 (one graph per row, as before; for measurement).
bool MtpHead::rows_wanted(const DevModel& m) {
  if (!env_switch_on("LILAC_MTP_CATCHUP_ROWS")) return false;
  const QMatrixDev& fc = m.mtp->fc;
  return rows_step_supported(m, kCatchRows) && rows_step_exact(m) && fc.group_size == 64 &&
         (fc.bits == 4 || fc.bits == 8) && fc.cols == 2 * m.cfg.hidden_size;
}

void MtpHead::alloc_rows(DevAlloc& mem) {
  const ModelConfig& c = m_.cfg;
  const size_t R = kCatchRows, H = size_t(c.hidden_size), K = 2 * H;
  auto f32 = [&](size_t n) { return static_cast<float*>(mem.get(n * 4)); };
  auto r = std::make_unique<Rows>();
  RowsScratch& sc = r->sc;
  sc.max_rows = kCatchRows;
  sc.kmax = int64_t(K);
  sc.proj_stride = (h_.layer.in_proj.rows + 3) / 4 * 4;
  r->cat = f32(R * K);
  sc.h = f32(R * H);
  sc.proj = f32(R * size_t(sc.proj_stride));
  sc.q = f32(R * size_t(c.num_heads) * size_t(c.head_dim));
  sc.frag4g = mem.get(R * rows::frag_row_bytes(int64_t(K)));
  sc.frag8 = mem.get(R * rows::frag_row_bytes(int64_t(K)));
  sc.meta = static_cast<float2*>(mem.get(R * rows::meta_row_count(int64_t(K)) * sizeof(float2)));
  sc.gemv_partial_floats = rows::gemv_rows_partial_floats(h_.fc, kCatchRows);  // fc only (the qkv parts: tiles kernel)
  sc.gemv_partials = f32(std::max<size_t>(sc.gemv_partial_floats, 4));
  r->row_slot = static_cast<int32_t*>(mem.get(R * 4));
  r->row_pos = static_cast<int32_t*>(mem.get(R * 4));
  LILAC_CUDA_CHECK(cudaMemset(r->row_slot, 0, R * 4));
  LILAC_CUDA_CHECK(cudaDeviceSynchronize());
  rows_ = std::move(r);
}

MtpHead::MtpHead(const DevModel& m, DevAlloc& mem, int64_t max_len, int32_t* drafts)
    : m_(m), h_(*m.mtp), max_len_(max_len), drafts_(drafts), g_(std::make_unique<Graphs>()) {
  const ModelConfig& c = m.cfg;
  draft_vocab_ = c.vocab_size;
  const int64_t H = c.hidden_size, kv_row = c.kv_dim();
  LILAC_CHECK(H <= 6144, "cuda mtp: hidden_size above 6144 is not supported");  // the input kernel's 2H floats of shared memory
  k_ = static_cast<__nv_bfloat16*>(mem.get(size_t(max_len) * size_t(kv_row) * 2));
  v_ = static_cast<__nv_bfloat16*>(mem.get(size_t(max_len) * size_t(kv_row) * 2));
  ring_h_ = static_cast<float*>(mem.get(size_t(kMtpRing) * size_t(H) * 4));
  ring_x_ = static_cast<int32_t*>(mem.get(size_t(kMtpRing) * 4));
  mpos_ = static_cast<int32_t*>(mem.get(4));
  dpos_ = static_cast<int32_t*>(mem.get(4));
  cat_ = static_cast<float*>(mem.get(size_t(2 * H) * 4));
  logits_ = static_cast<float*>(mem.get(size_t(kMaxDrafts) * size_t(c.vocab_size) * 4));
  argmax_scratch_ = mem.get(sizeof(ArgPart) * kArgBlocks + sizeof(unsigned));
  LILAC_CUDA_CHECK(cudaMemset(static_cast<ArgPart*>(argmax_scratch_) + kArgBlocks, 0, sizeof(unsigned)));
  sc_ = alloc_decode_scratch(mem, m, max_len);
  if (rows_wanted(m)) alloc_rows(mem);
  LILAC_CUDA_CHECK(cudaMallocHost(&host_drafts_, sizeof(int32_t) * kMaxDrafts));
}

MtpHead::~MtpHead() {
  g_.reset();
  if (host_drafts_) cudaFreeHost(host_drafts_);
}

void MtpHead::launch(cudaGraphExec_t g, cudaStream_t s) { LILAC_CUDA_CHECK(cudaGraphLaunch(g, s)); }

namespace {
InputArgs input_args(const DevModel& m, const DevMtp& h, int mode, const float* ring_h, const int32_t* ring_x,
                     const int32_t* mpos, int32_t* dpos, const int32_t* token, const float* u_prev, float* cat) {
  InputArgs a;
  a.embed = m.embed;
  a.mode = mode;
  a.ring_h = ring_h;
  a.ring_x = ring_x;
  a.mpos = mpos;
  a.dpos = dpos;
  a.token = token;
  a.u_prev = u_prev;
  a.final_norm = m.final_norm;
  a.mtp_norm = h.norm;
  a.pre_e = h.pre_fc_norm_embedding;
  a.pre_h = h.pre_fc_norm_hidden;
  a.eps = float(m.cfg.rms_norm_eps);
  a.H = int(m.cfg.hidden_size);
  a.cat = cat;
  return a;
}
}  // namespace

// One row of the head (graph-capturable): inputs (mode) → fc → the attention layer on the head's cache at
// *dpos → its MoE → [LM head over RMSNorm(u; mtp.norm) into `logits` → argmax into *draft_out].
void MtpHead::enqueue_row(int mode, const int32_t* token, float* logits, int32_t* draft_out, cudaStream_t s) {
  const ModelConfig& c = m_.cfg;
  const int H = int(c.hidden_size);
  const InputArgs a = input_args(m_, h_, mode, ring_h_, ring_x_, mpos_, dpos_, token, sc_.h, cat_);
  launch_pdl(mtp_input_kernel, dim3(1), dim3(kInputThreads), size_t(2 * H) * 4, s, a);
  LILAC_CUDA_LAUNCH_CHECK();
  GemvArgs fc;
  fc.W = h_.fc;
  fc.x = cat_;
  fc.y = sc_.h;
  gemv(fc, s);
  if (mode == kCatchUp && !logits) {
    // A catch-up row leaves nothing behind but its K/V row in the head's cache (the next rows read the main
    // model's hiddens, not this row's residual): the attention, o_proj and MoE of the row are skipped. The
    // K/V row is the full row's bit for bit (the same kernels on the same input). ~4x cheaper per row.
    enqueue_attn_kv(m_, h_.layer, k_, v_, dpos_, sc_, s);
    return;
  }
  enqueue_attn_mixer(m_, h_.layer, k_, v_, dpos_, sc_, s);
  enqueue_moe(m_, h_.layer, sc_, s);
  // A draft row's LM head: the draft vocabulary's rows only, unless the sink takes its whole row.
  if (logits) enqueue_head_row(m_, h_.norm, logits, sc_, s, draft_out && !sink_ ? draft_vocab_ : 0);
  if (draft_out) {
    auto* part = static_cast<ArgPart*>(argmax_scratch_);
    launch_pdl(argmax_kernel, dim3(kArgBlocks), dim3(kArgThreads), 0, s, static_cast<const float*>(logits),
               draft_vocab_, part, reinterpret_cast<unsigned*>(part + kArgBlocks), draft_out);
    LILAC_CUDA_LAUNCH_CHECK();
  }
}

// n catch-up rows (1 <= n <= kCatchRows) at *mpos .. *mpos + n - 1 on the multi-row kernels, each row bit for bit
// the one-row catch-up (rows_step.h's contract): their fc inputs → fc → RMSNorm + the attention layer's qkv →
// K/V rows into the head's cache; *mpos += n.
void MtpHead::enqueue_catchup_rows(int n, cudaStream_t s) {
  const ModelConfig& c = m_.cfg;
  const Rows& r = *rows_;
  const RowsScratch& sc = r.sc;
  const int64_t H = c.hidden_size;
  const InputArgs in = input_args(m_, h_, kCatchUp, ring_h_, ring_x_, mpos_, dpos_, nullptr, nullptr, r.cat);
  launch_pdl(mtp_input_rows_kernel, dim3(unsigned(n)), dim3(kInputThreads), size_t(2 * H) * 4, s, in, r.row_pos);
  LILAC_CUDA_LAUNCH_CHECK();
  RowsArgs a;
  a.M = n;
  a.row_slot = r.row_slot;
  a.row_pos = r.row_pos;
  const RowsOps ops{m_, sc, a, s};
  ops.stage(r.cat, 2 * H, 2 * H, Prologue::None, nullptr, h_.fc.bits == 4, false, h_.fc.bits == 8);
  ops.gemv(h_.fc, sc.h, H, false);
  const DevLayer& L = h_.layer;
  ops.stage(sc.h, H, H, Prologue::RmsNorm, L.input_norm, L.in_proj.has_bits(4), false, L.in_proj.has_bits(8));
  // the qkv parts on the tiles kernel, Auto's choice for them (one k-tile per slice), without partials' room
  ops.proj(L.in_proj, sc.proj, sc.proj_stride, rows::RowsGemvKernel::Tiles);
  rows::attn_qk_norm_rope_append_rows(rows_attn_shape(c), n, r.row_slot, r.row_pos, sc.proj, sc.proj_stride, L.q_norm,
                                      L.k_norm, m_.inv_freq, sc.q, rows::KvPool{k_, v_, max_len_ * c.kv_dim()}, s);
  increment_i32(mpos_, s, n);
  LILAC_CUDA_LAUNCH_CHECK();
}

// ------------------------------------------------------------------------------------------------ state
void MtpHead::reset(bool valid, cudaStream_t s) {
  valid_ = valid;
  staged_ = false;
  len_ = committed_ = 0;
  LILAC_CUDA_CHECK(cudaMemsetAsync(mpos_, 0, 4, s));
  sync(s);
}

void MtpHead::stage_token(int64_t pos, const int32_t* token, cudaStream_t s) {
  staged_ = false;
  if (!valid_) return;
  if (pos != len_) {
    valid_ = false;
    return;
  }
  if (len_ - committed_ >= kMtpRing) run_pending(s);
  LILAC_CUDA_CHECK(cudaMemcpyAsync(ring_x_ + len_ % kMtpRing, token, 4, cudaMemcpyDeviceToDevice, s));
  staged_ = true;
}

void MtpHead::stage_hidden(const float* hidden, cudaStream_t s) {
  if (!valid_ || !staged_) return;
  const int64_t H = m_.cfg.hidden_size;
  LILAC_CUDA_CHECK(cudaMemcpyAsync(ring_h_ + (len_ % kMtpRing) * H, hidden, size_t(H) * 4, cudaMemcpyDeviceToDevice, s));
  ++len_;
  staged_ = false;
}

void MtpHead::on_fed(int64_t pos0, int64_t n, const int32_t* tokens, const float* hidden, int64_t ld, cudaStream_t s) {
  if (!valid_ || n <= 0) return;
  if (pos0 != len_) {  // not the context it follows: give up until reset
    valid_ = false;
    return;
  }
  const int64_t H = m_.cfg.hidden_size;
  int64_t done = 0;
  while (done < n) {
    if (len_ - committed_ >= kMtpRing) run_pending(s);
    const int64_t p = len_, at = p % kMtpRing;
    const int64_t cnt = std::min({n - done, kMtpRing - (len_ - committed_), kMtpRing - at});  // no wrap inside
    LILAC_CUDA_CHECK(cudaMemcpy2DAsync(ring_h_ + at * H, size_t(H) * 4, hidden + done * ld, size_t(ld) * 4,
                                       size_t(H) * 4, size_t(cnt), cudaMemcpyDeviceToDevice, s));
    LILAC_CUDA_CHECK(cudaMemcpyAsync(ring_x_ + at, tokens + done, size_t(cnt) * 4, cudaMemcpyDeviceToDevice, s));
    len_ += cnt;
    done += cnt;
  }
}

void MtpHead::run_pending(cudaStream_t s) {
  if (!valid_) return;
  const int64_t n = len_ - 1 - committed_;
  if (n <= 0) return;
  if (!sink_ && rows_) {
    // Graphs for 1..8 rows and 16, 32, 64, all captured at the first burst (a capture inside a later, timed
    // draft would look like a slow draft to the draft policy); a burst runs as the largest of them first.
    if (!g_->rows[1])
      for (int cnt = 1; cnt <= kCatchRows; cnt = cnt < 8 ? cnt + 1 : 2 * cnt)
        g_->rows[cnt] = capture_graph(s, [&] { enqueue_catchup_rows(cnt, s); });
    for (int64_t left = n; left > 0;) {
      int cnt = int(std::min<int64_t>(left, kCatchRows));
      if (cnt > 8) cnt = 1 << (31 - __builtin_clz(unsigned(cnt)));  // 9..64 → 8, 16, 32, 64
      launch(g_->rows[cnt], s);
      left -= cnt;
      rows_catchups_ += cnt;
    }
  } else if (!sink_) {
    if (!g_->row) g_->row = capture_graph(s, [&] {
        enqueue_row(kCatchUp, nullptr, nullptr, nullptr, s);
        increment_i32(mpos_, s);
      });
    for (int64_t i = 0; i < n; ++i) launch(g_->row, s);
  } else {
    if (!g_->row_logits) g_->row_logits = capture_graph(s, [&] {
        enqueue_row(kCatchUp, nullptr, logits_, nullptr, s);
        increment_i32(mpos_, s);
      });
    const int64_t V = m_.cfg.vocab_size;
    std::vector<float> row(static_cast<size_t>(V));
    for (int64_t i = 0; i < n; ++i) {
      launch(g_->row_logits, s);
      LILAC_CUDA_CHECK(cudaMemcpyAsync(row.data(), logits_, size_t(V) * 4, cudaMemcpyDeviceToHost, s));
      sync(s);
      sink_(committed_ + i, 1, row.data());
    }
  }
  committed_ += n;
}

void MtpHead::drop_draft_graphs() {
  for (cudaGraphExec_t& g : g_->draft)
    if (g) cudaGraphExecDestroy(g), g = nullptr;
}

void MtpHead::set_sink(LogitsSink sink) {
  if (bool(sink) != bool(sink_)) drop_draft_graphs();  // their head rows depend on it
  sink_ = std::move(sink);
}

void MtpHead::set_draft_vocab(int64_t n) {
  const int64_t v = Session::draft_rows(n, m_.cfg.vocab_size);
  if (v != draft_vocab_) drop_draft_graphs();
  draft_vocab_ = v;
}

std::vector<int32_t> MtpHead::draft(int k, const int32_t* pending, cudaStream_t s) {
  if (!valid_ || len_ < 1 || k < 1) return {};
  k = std::min(k, kMaxDrafts);
  run_pending(s);
  if (g_->pending != pending) {  // the draft graphs read this token slot
    drop_draft_graphs();
    g_->pending = pending;
  }
  const int64_t V = m_.cfg.vocab_size;
  if (!g_->draft[k]) g_->draft[k] = capture_graph(s, [&] {
      enqueue_row(kPending, pending, logits_, drafts_, s);
      for (int j = 1; j < k; ++j) enqueue_row(kChain, drafts_ + j - 1, logits_ + int64_t(j) * V, drafts_ + j, s);
    });
  launch(g_->draft[k], s);
  LILAC_CUDA_CHECK(cudaMemcpyAsync(host_drafts_, drafts_, size_t(k) * 4, cudaMemcpyDeviceToHost, s));
  std::vector<float> row;
  if (sink_) {
    row.resize(size_t(V));
    LILAC_CUDA_CHECK(cudaMemcpyAsync(row.data(), logits_, size_t(V) * 4, cudaMemcpyDeviceToHost, s));
  }
  sync(s);
  if (sink_) sink_(len_ - 1, 1, row.data());
  return std::vector<int32_t>(host_drafts_, host_drafts_ + k);
}

MtpSnapshotData MtpHead::snapshot(cudaStream_t s) {
  MtpSnapshotData d;
  if (!valid_) return d;
  run_pending(s);
  const int64_t H = m_.cfg.hidden_size, kv_row = m_.cfg.kv_dim();
  d.valid = true;
  d.committed = committed_;
  d.mem = std::make_shared<DevAlloc>();
  const size_t kvb = size_t(committed_) * size_t(kv_row) * 2;
  void* kv = d.mem->get(2 * kvb);
  if (kvb) {
    LILAC_CUDA_CHECK(cudaMemcpyAsync(kv, k_, kvb, cudaMemcpyDeviceToDevice, s));
    LILAC_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(kv) + kvb, v_, kvb, cudaMemcpyDeviceToDevice, s));
  }
  d.kv = kv;
  if (len_ > 0) {
    auto* h = static_cast<float*>(d.mem->get(size_t(H) * 4));
    LILAC_CUDA_CHECK(cudaMemcpyAsync(h, ring_h_ + ((len_ - 1) % kMtpRing) * H, size_t(H) * 4,
                                     cudaMemcpyDeviceToDevice, s));
    d.hidden = h;
  }
  d.bytes = d.mem->bytes;
  sync(s);
  return d;
}

void MtpHead::restore(const MtpSnapshotData& d, cudaStream_t s) {
  if (!d.valid || d.committed + 1 > max_len_) {
    valid_ = false;
    return;
  }
  const int64_t H = m_.cfg.hidden_size, kv_row = m_.cfg.kv_dim();
  const size_t kvb = size_t(d.committed) * size_t(kv_row) * 2;
  if (kvb) {
    LILAC_CUDA_CHECK(cudaMemcpyAsync(k_, d.kv, kvb, cudaMemcpyDeviceToDevice, s));
    LILAC_CUDA_CHECK(cudaMemcpyAsync(v_, static_cast<const char*>(d.kv) + kvb, kvb, cudaMemcpyDeviceToDevice, s));
  }
  committed_ = d.committed;
  len_ = d.hidden ? committed_ + 1 : 0;
  if (d.hidden)
    LILAC_CUDA_CHECK(cudaMemcpyAsync(ring_h_ + ((len_ - 1) % kMtpRing) * H, d.hidden, size_t(H) * 4,
                                     cudaMemcpyDeviceToDevice, s));
  const int32_t p = int32_t(committed_);
  LILAC_CUDA_CHECK(cudaMemcpyAsync(mpos_, &p, 4, cudaMemcpyHostToDevice, s));
  sync(s);
  valid_ = true;
}

}  // namespace lilac::cuda
