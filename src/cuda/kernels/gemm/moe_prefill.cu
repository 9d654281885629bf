// MoE prefill (gemm.h): routing, counting sort of (token, slot) pairs by expert, grouped
// gate+up+SwiGLU and down GEMMs over all experts in one launch each, shared expert, combine.
#include <algorithm>
#include <string>

#include "core/error.h"
#include "cuda/kernels/gemm/gemm.cuh"
#include "cuda/kernels/gemm/gemm.h"
#include "cuda/kernels/stream_scratch.h"

namespace lilac::cuda {
namespace {

constexpr int MAX_K = 16;

void check_launch(const char* what) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw Error(std::string(what) + ": launch failed: " + cudaGetErrorString(e));
}

// One warp per token: softmax over E logits, top-k by descending probability (ties to the lower
// id), renormalised weights. Lane l owns experts l, l + 32, ...; with E <= 32·kCached their probabilities stay in
// registers for the k rounds (the same expf(l - max)·inv each round computed once: the same choices and weights).
constexpr int kCached = 8;  // 256 experts
template <bool CACHED>
__global__ void route_kernel(const float* __restrict__ logits, int n, int E, int k, bool renorm,
                             int32_t* __restrict__ ids, float* __restrict__ weights) {
  const int lane = threadIdx.x & 31;
  const int t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (t >= n) return;
  const float* l = logits + int64_t(t) * E;
  float lv[kCached];
  if constexpr (CACHED) {
#pragma unroll
    for (int j = 0; j < kCached; ++j) lv[j] = lane + 32 * j < E ? l[lane + 32 * j] : -INFINITY;
  }
  auto logit = [&](int j) {
    if constexpr (CACHED) return lv[j];
    else return l[lane + 32 * j];
  };
  const int per_lane = (E - lane + 31) / 32;  // experts of this lane
  float mx = -INFINITY;
  for (int j = 0; j < (CACHED ? kCached : per_lane); ++j)
    if (j < per_lane) mx = fmaxf(mx, logit(j));
  for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float sum = 0.f;
  for (int j = 0; j < (CACHED ? kCached : per_lane); ++j)
    if (j < per_lane) sum += expf(logit(j) - mx);
  for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  const float inv = 1.f / sum;
  float pv[kCached];
  if constexpr (CACHED) {
#pragma unroll
    for (int j = 0; j < kCached; ++j) pv[j] = j < per_lane ? expf(lv[j] - mx) * inv : -1.f;
  }
  // k rounds of a warp arg-max over the not-yet-taken experts; `taken` as a per-lane bit mask of
  // the lane's experts (E <= 32 * 32).
  uint32_t taken = 0;
  float wsel[MAX_K];
  int isel[MAX_K];
  float wsum = 0.f;
  for (int r = 0; r < k; ++r) {
    float best = -1.f;
    int bid = 0x7fffffff;
    if constexpr (CACHED) {
#pragma unroll
      for (int j = 0; j < kCached; ++j)  // e = lane + 32j increases: strict > keeps the lower id
        if (!(taken >> j & 1u) && pv[j] > best) {
          best = pv[j];
          bid = lane + 32 * j;
        }
    } else {
      int j = 0;
      for (int e = lane; e < E; e += 32, ++j) {
        if (taken >> j & 1u) continue;
        float pe = expf(l[e] - mx) * inv;
        if (pe > best) { best = pe; bid = e; }  // e increases: strict > keeps the lower id
      }
    }
    for (int o = 16; o; o >>= 1) {
      float ob = __shfl_xor_sync(0xffffffffu, best, o);
      int oi = __shfl_xor_sync(0xffffffffu, bid, o);
      if (ob > best || (ob == best && oi < bid)) { best = ob; bid = oi; }
    }
    if ((bid & 31) == lane) taken |= 1u << (bid / 32);
    wsel[r] = best;
    isel[r] = bid;
    wsum += best;
  }
  if (lane == 0) {
    const float s = renorm ? 1.f / wsum : 1.f;
    for (int r = 0; r < k; ++r) {
      ids[int64_t(t) * k + r] = isel[r];
      weights[int64_t(t) * k + r] = wsel[r] * s;
    }
  }
}

__global__ void histogram_kernel(const int32_t* __restrict__ ids, int P, int E, int32_t* __restrict__ counts) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < P) {
    int e = ids[i];
    if (e >= 0 && e < E) atomicAdd(&counts[e], 1);
  }
}

// One block: exclusive scans of counts and of m-tiles per expert; zeroes the fill counters.
__global__ void scan_kernel(const int32_t* __restrict__ counts, int E, int bm, int32_t* __restrict__ expert_start,
                            int32_t* __restrict__ tile_start, int32_t* __restrict__ fill) {
  __shared__ int32_t sc[1024], st[1024];
  const int tid = threadIdx.x;
  // each thread sums a contiguous run of experts
  const int per = (E + blockDim.x - 1) / blockDim.x;
  int c = 0, tl = 0;
  for (int e = tid * per; e < min(E, (tid + 1) * per); ++e) {
    c += counts[e];
    tl += (counts[e] + bm - 1) / bm;
  }
  sc[tid] = c;
  st[tid] = tl;
  __syncthreads();
  for (int off = 1; off < blockDim.x; off <<= 1) {  // Hillis-Steele inclusive scan
    int a = tid >= off ? sc[tid - off] : 0, b = tid >= off ? st[tid - off] : 0;
    __syncthreads();
    sc[tid] += a;
    st[tid] += b;
    __syncthreads();
  }
  int run_c = sc[tid] - c, run_t = st[tid] - tl;
  for (int e = tid * per; e < min(E, (tid + 1) * per); ++e) {
    expert_start[e] = run_c;
    tile_start[e] = run_t;
    fill[e] = 0;
    run_c += counts[e];
    run_t += (counts[e] + bm - 1) / bm;
  }
  if (tid == blockDim.x - 1) {
    expert_start[E] = sc[tid];
    tile_start[E] = st[tid];
  }
}

__global__ void scatter_kernel(const int32_t* __restrict__ ids, const float* __restrict__ weights, int P, int k,
                               int E, const int32_t* __restrict__ expert_start, int32_t* __restrict__ fill,
                               int32_t* __restrict__ sorted_tok, float* __restrict__ sorted_w,
                               int32_t* __restrict__ pair_pos) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= P) return;
  int e = ids[i];
  if (e < 0 || e >= E) {
    pair_pos[i] = -1;
    return;
  }
  int pos = expert_start[e] + atomicAdd(&fill[e], 1);
  sorted_tok[pos] = i / k;
  sorted_w[pos] = weights[i];
  pair_pos[i] = pos;
}

// Y[t] (+)= Σ_slots Ysorted[pair_pos[t, s]] + sigmoid(sg[t]) · Ys[t]   (hidden % 4 == 0)
__global__ void combine_kernel(const float* __restrict__ ysorted, const int32_t* __restrict__ pair_pos, int k,
                               const float* __restrict__ ys, const float* __restrict__ sg, int n, int hidden,
                               float* __restrict__ Y, int64_t ldy, bool accumulate) {
  const int t = blockIdx.y;
  const int c = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
  if (t >= n || c >= hidden) return;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s = 0; s < k; ++s) {
    int pos = pair_pos[int64_t(t) * k + s];
    if (pos < 0) continue;
    float4 v = *reinterpret_cast<const float4*>(ysorted + int64_t(pos) * hidden + c);
    acc.x += v.x; acc.y += v.y; acc.z += v.z; acc.w += v.w;
  }
  if (ys) {
    float gsh = 1.f / (1.f + expf(-sg[t]));
    float4 v = *reinterpret_cast<const float4*>(ys + int64_t(t) * hidden + c);
    acc.x += gsh * v.x; acc.y += gsh * v.y; acc.z += gsh * v.z; acc.w += gsh * v.w;
  }
  float* yp = Y + int64_t(t) * ldy + c;
  if (accumulate) {
    yp[0] += acc.x; yp[1] += acc.y; yp[2] += acc.z; yp[3] += acc.w;
  } else {
    yp[0] = acc.x; yp[1] = acc.y; yp[2] = acc.z; yp[3] = acc.w;
  }
}

struct Workspace {
  float* logits;
  int32_t* ids;
  float* weights;
  int32_t *counts, *fill, *expert_start, *tile_start;
  int32_t* sorted_tok;
  float* sorted_w;
  int32_t* pair_pos;
  __nv_bfloat16* hsorted;
  float* ysorted;
  __nv_bfloat16* hs;
  float* ys;
  float* sg;
  SplitScratch split_main, split_side;  // split-K partials: the router (stream), the shared expert (side stream)
  size_t bytes;
};

Workspace carve(const MoEPrefillWeights& w, int n, void* base) {
  const int E = w.gate.n, k = w.top_k;
  const int64_t P = int64_t(n) * k, inter = w.gate.first.rows, hidden = w.down.first.rows;
  const int64_t sinter = w.shared_gate.rows;
  size_t off = 0;
  auto take = [&](size_t bytes) {
    size_t o = off;
    off += (bytes + 255) / 256 * 256;
    return static_cast<char*>(base) + o;
  };
  Workspace ws;
  ws.logits = reinterpret_cast<float*>(take(sizeof(float) * n * E));
  ws.ids = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * P));
  ws.weights = reinterpret_cast<float*>(take(sizeof(float) * P));
  ws.counts = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * E));
  ws.fill = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * E));
  ws.expert_start = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * (E + 1)));
  ws.tile_start = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * (E + 1)));
  ws.sorted_tok = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * P));
  ws.sorted_w = reinterpret_cast<float*>(take(sizeof(float) * P));
  ws.pair_pos = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * P));
  ws.hsorted = reinterpret_cast<__nv_bfloat16*>(take(sizeof(__nv_bfloat16) * P * inter));
  ws.ysorted = reinterpret_cast<float*>(take(sizeof(float) * P * hidden));
  ws.hs = reinterpret_cast<__nv_bfloat16*>(take(sizeof(__nv_bfloat16) * n * sinter));
  ws.ys = reinterpret_cast<float*>(take(sizeof(float) * n * hidden));
  ws.sg = reinterpret_cast<float*>(take(sizeof(float) * n));
  auto split = [&](size_t floats) { return SplitScratch{reinterpret_cast<float*>(take(sizeof(float) * floats)), floats}; };
  ws.split_main = split(qgemm_split_floats(w.router, n, GemmOut::StoreF32));
  ws.split_side = split(w.shared_gate.qweight == nullptr
                            ? 0
                            : std::max(qgemm_split_floats(w.shared_down, n, GemmOut::StoreF32),
                                       qgemm_split_floats(w.shared_expert_gate, n, GemmOut::StoreF32)));
  ws.bytes = off;
  return ws;
}

void validate(const MoEPrefillWeights& w) {
  if (w.top_k < 1 || w.top_k > MAX_K) throw Error("moe_prefill: top_k must be in 1..16");
  if (w.gate.n < w.top_k || w.gate.n > 1024) throw Error("moe_prefill: number of experts must be top_k..1024");
  if (w.up.n != w.gate.n || w.down.n != w.gate.n) throw Error("moe_prefill: gate/up/down expert counts differ");
  if (w.down.first.rows % 4) throw Error("moe_prefill: hidden size must be a multiple of 4");
  if (w.down.first.cols != w.gate.first.rows) throw Error("moe_prefill: down.cols != gate.rows");
}

// The grouped GEMM path needs 4-bit experts (the small path takes 4 or 8 bits).
void validate_grouped(const MoEPrefillWeights& w) {
  if (w.gate.first.bits != 4 || w.down.first.bits != 4 || w.up.first.bits != 4)
    throw Error("moe_prefill: the grouped expert GEMMs need 4-bit experts");
}

// The shared expert and its gate need only X: they run on a side stream, concurrently with the
// routing and the grouped expert GEMMs (their small grids would leave most SMs idle on their own);
// run_experts joins before the combine. Their outputs ws.hs / ws.ys / ws.sg are read only there.
SideStream g_side;

void launch_shared(const MoEPrefillWeights& w, const __nv_bfloat16* X, int64_t ldx, int n, const Workspace& ws,
                   cudaStream_t stream) {
  if (w.shared_gate.qweight == nullptr) return;
  const cudaStream_t side = g_side.fork(stream);
  const int sinter = int(w.shared_gate.rows), hidden = int(w.down.first.rows);
  qgemm_swiglu(w.shared_gate, w.shared_up, X, ldx, n, ws.hs, sinter, side);
  qgemm(w.shared_down, ws.hs, sinter, n, ws.ys, hidden, GemmOut::StoreF32, side, ws.split_side);
  qgemm(w.shared_expert_gate, X, ldx, n, ws.sg, 1, GemmOut::StoreF32, side, ws.split_side);
}

// The grouped gate+up+SwiGLU and down GEMMs (gemm.cuh): 128-token tiles per expert.
void grouped_experts(const MoEPrefillWeights& w, const __nv_bfloat16* X, int64_t ldx, int P, const Workspace& ws,
                     cudaStream_t stream) {
  const int E = w.gate.n;
  const int inter = int(w.gate.first.rows), hidden = int(w.down.first.rows);
  const int grid_y = P / gemm::BM + E;  // >= Σ_e ceil(count_e / BM)
  {
    gemm::Params p;
    p.X = X;
    p.ldx = ldx;
    p.a_rows = ws.sorted_tok;
    p.N = inter;
    p.Y = ws.hsorted;
    p.ldy = inter;
    p.expert_start = ws.expert_start;
    p.tile_start = ws.tile_start;
    p.E = E;
    p.W0s = w.gate;
    p.W1s = w.up;
    gemm::launch(p, 4, true, gemm::EPI_SWIGLU_BF16, grid_y, stream);
  }
  {
    gemm::Params p;
    p.X = ws.hsorted;
    p.ldx = inter;
    p.a_rows = nullptr;
    p.N = hidden;
    p.Y = ws.ysorted;
    p.ldy = hidden;
    p.row_scale = ws.sorted_w;
    p.expert_start = ws.expert_start;
    p.tile_start = ws.tile_start;
    p.E = E;
    p.W0s = w.down;
    gemm::launch(p, 4, true, gemm::EPI_SCALED_F32, grid_y, stream);
  }
}

// Experts (sorted; grouped or small-M GEMMs, moe_use_small) + combine with the shared expert (started by
// launch_shared), from ws.ids / ws.weights.
void run_experts(const MoEPrefillWeights& w, const __nv_bfloat16* X, int64_t ldx, int n, const int32_t* ids,
                 const float* weights, float* Y, int64_t ldy, bool accumulate, const Workspace& ws,
                 cudaStream_t stream) {
  const int E = w.gate.n, k = w.top_k;
  const int P = n * k;
  const int inter = int(w.gate.first.rows), hidden = int(w.down.first.rows);
  cudaMemsetAsync(ws.counts, 0, sizeof(int32_t) * E, stream);
  histogram_kernel<<<(P + 255) / 256, 256, 0, stream>>>(ids, P, E, ws.counts);
  check_launch("moe histogram");
  scan_kernel<<<1, 1024, 0, stream>>>(ws.counts, E, gemm::BM, ws.expert_start, ws.tile_start, ws.fill);
  check_launch("moe scan");
  scatter_kernel<<<(P + 255) / 256, 256, 0, stream>>>(ids, weights, P, k, E, ws.expert_start, ws.fill, ws.sorted_tok,
                                                       ws.sorted_w, ws.pair_pos);
  check_launch("moe scatter");
  if (moe_use_small(w, n)) {
    moe_small_gate_up(w.gate, w.up, X, ldx, ws.sorted_tok, ws.expert_start, P, ws.hsorted, inter, stream);
    moe_small_down(w.down, ws.hsorted, inter, ws.expert_start, P, ws.sorted_w, ws.ysorted, hidden, stream);
  } else {
    grouped_experts(w, X, ldx, P, ws, stream);
  }
  const bool shared = w.shared_gate.qweight != nullptr;
  if (shared) g_side.join(stream);  // the shared expert (launch_shared) is done
  dim3 grid((hidden / 4 + 127) / 128, n);
  combine_kernel<<<grid, 128, 0, stream>>>(ws.ysorted, ws.pair_pos, k, shared ? ws.ys : nullptr, ws.sg, n, hidden, Y,
                                           ldy, accumulate);
  check_launch("moe combine");
}

}  // namespace

size_t moe_prefill_workspace_bytes(const MoEPrefillWeights& w, int n) { return carve(w, n, nullptr).bytes; }

void moe_route_prefill(const float* logits, int n, int E, int k, bool renormalise, int32_t* ids, float* weights,
                       cudaStream_t stream) {
  if (n <= 0) return;
  if (k < 1 || k > MAX_K || E < k || E > 1024) throw Error("moe_route_prefill: need 1 <= k <= 16, k <= E <= 1024");
  if (E <= 32 * kCached)
    route_kernel<true><<<(n + 3) / 4, 128, 0, stream>>>(logits, n, E, k, renormalise, ids, weights);
  else
    route_kernel<false><<<(n + 3) / 4, 128, 0, stream>>>(logits, n, E, k, renormalise, ids, weights);
  check_launch("moe route");
}

void moe_prefill(const MoEPrefillWeights& w, const __nv_bfloat16* X, int64_t ldx, int n, float* Y, int64_t ldy,
                 bool accumulate, void* workspace, cudaStream_t stream, int32_t* ids_out, float* weights_out) {
  if (n <= 0) return;
  validate(w);
  if (!moe_use_small(w, n)) validate_grouped(w);
  Workspace ws = carve(w, n, workspace);
  const int E = w.gate.n;
  launch_shared(w, X, ldx, n, ws, stream);
  qgemm(w.router, X, ldx, n, ws.logits, E, GemmOut::StoreF32, stream, ws.split_main);
  moe_route_prefill(ws.logits, n, E, w.top_k, w.renormalise, ws.ids, ws.weights, stream);
  if (ids_out) cudaMemcpyAsync(ids_out, ws.ids, sizeof(int32_t) * n * w.top_k, cudaMemcpyDeviceToDevice, stream);
  if (weights_out)
    cudaMemcpyAsync(weights_out, ws.weights, sizeof(float) * n * w.top_k, cudaMemcpyDeviceToDevice, stream);
  run_experts(w, X, ldx, n, ws.ids, ws.weights, Y, ldy, accumulate, ws, stream);
}

void moe_prefill_routed(const MoEPrefillWeights& w, const __nv_bfloat16* X, int64_t ldx, int n, const int32_t* ids,
                        const float* weights, float* Y, int64_t ldy, bool accumulate, void* workspace,
                        cudaStream_t stream) {
  if (n <= 0) return;
  validate(w);
  if (!moe_use_small(w, n)) validate_grouped(w);
  Workspace ws = carve(w, n, workspace);
  launch_shared(w, X, ldx, n, ws, stream);
  run_experts(w, X, ldx, n, ids, weights, Y, ldy, accumulate, ws, stream);
}

}  // namespace lilac::cuda
