// Multi-row MoE, first and last launches (rows_mm.h): the routing of M rows with their grouping by expert
// (one block: a warp per row runs moe_gate_up's routing, then a counting sort on the device), and the
// per-row combine of the experts' down sums in moe_down_tc's fixed order.
#include <algorithm>
#include <cstdlib>
#include <string>

#include "cuda/cuda_common.h"
#include "cuda/kernels/gemv/gemv_common.cuh"
#include "cuda/kernels/launch.cuh"
#include "cuda/kernels/rows/moe_rows.cuh"
#include "cuda/kernels/rows/rows_mm.h"
#include "cuda/kernels/rows/stage_row.cuh"

namespace lilac::cuda::rows {
namespace {

using namespace rows_dev;
using ::lilac::cuda::dev::pdl_trigger;
using ::lilac::cuda::dev::pdl_wait;

constexpr int kRouteThreads = 1024;
constexpr int kMaxE = 512, kMaxK = 31;

// Byte ranges the routing launch's extra blocks request into L2 (the shared expert's gate, up and down: weights,
// scales, biases) while the router runs and block 0 routes.
struct PrefetchSpans {
  static constexpr int kMax = 9;
  const char* p[kMax];
  int64_t bytes[kMax];
  int n = 0;
};

struct RouteArgs {
  PrefetchSpans pf;
  int route_blocks = 1;  // moe_route_kernel: 1, or 2 as a cluster (rank 1 routes rows 32..M-1)
  const float* logits;
  int64_t ld;
  int M;
  const int32_t* row_slot;
  int E, k, CH;
  bool renorm;
  int32_t* sel_ids;
  float* sel_w;
  MoEScratch sc;
};

// Exclusive prefix sum over the block's threads in thread order; *total: the sum. s_scan: 32 ints.
__device__ int block_excl_scan(int v, int* s_scan, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  int x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  __syncthreads();  // s_scan may still be read by a previous call
  if (lane == 31) s_scan[warp] = x;
  __syncthreads();
  if (warp == 0) {
    int w = lane < nw ? s_scan[lane] : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += y;
    }
    s_scan[lane] = w;
  }
  __syncthreads();
  *total = s_scan[nw - 1];
  return (warp > 0 ? s_scan[warp - 1] : 0) + x - v;
}

// Blocks 1.. of a routing launch: one 128-byte line of the spans per thread and round, then exit, before any wait (the
// bytes are weights, which no kernel writes). At one row gate/up's grid does this before its wait (moe_tc.cu, stop
// 60); the rows kernels sit at their register cap, so here the routing launch carries it on blocks of its own,
// resident while the router's few blocks run (stop 61: +0.3 % at 4 and 16 streams, neutral at 2, 64 and the verify).
__device__ __forceinline__ void prefetch_spans(const PrefetchSpans& pf, unsigned first = 1) {
  const int64_t t = int64_t(blockIdx.x - first) * blockDim.x + threadIdx.x,
                nt = int64_t(gridDim.x - first) * blockDim.x;
  for (int i = 0; i < pf.n; ++i) dev::prefetch_l2(pf.p[i], pf.bytes[i], t, nt);
}

// More than 32 rows: a cluster of two routing blocks, so that no warp routes two rows in a row (stop 63: the 64-row
// routing 14.6 us against 6.5 at 16). Rank 1 routes rows 32..M-1 — each row by a warp with route_warp as rank 0 does,
// so the same choices and weights — and hands their ids to rank 0's s_ids through distributed shared memory; rank 0
// waits for them at the cluster barrier and groups all the rows.
__global__ void __launch_bounds__(kRouteThreads) moe_route_kernel(RouteArgs a) {
  const unsigned nb = unsigned(a.route_blocks);
  if (blockIdx.x >= nb) {
    prefetch_spans(a.pf, nb);
    return;
  }
  __shared__ int s_ids[kMoEMaxRows * kMaxK];
  __shared__ float s_wtmp[kRouteThreads / 32][kMaxK + 2];
  __shared__ unsigned long long s_bits[kMaxE];
  __shared__ int s_off[kMaxE];
  __shared__ int s_scan[32];
  __shared__ unsigned s_active[2];
  const int tid = threadIdx.x, warp = tid >> 5, E = a.E, k = a.k, M = a.M, CH = a.CH;
  pdl_wait();
  pdl_trigger();
  for (int e = tid; e < E; e += blockDim.x) s_bits[e] = 0ull;
  if (warp < 2) {  // the active rows (M <= 64): one load per thread of the first two warps, not M in a row
    const bool on = tid < M && (a.row_slot == nullptr || a.row_slot[tid] >= 0);
    const unsigned b = __ballot_sync(0xffffffffu, on);
    if ((tid & 31) == 0) s_active[warp] = b;
  }
  __syncthreads();
  const unsigned long long active = s_active[0] | (static_cast<unsigned long long>(s_active[1]) << 32);
  if (blockIdx.x == 1) {  // rank 1 of the cluster (nb = 2, M > 32: a warp per row of 32..M-1)
    const int r = 32 + warp, lane = tid & 31;
    if (r < M && ((active >> r) & 1ull)) {
      // route_warp writes the global ids and weights from block 0 only: here they are copied from the scratch
      dev::route_warp(a.logits + r * a.ld, E, k, a.renorm, s_ids + r * k, s_wtmp[warp], nullptr, nullptr);
      __syncwarp();
      if (lane < k) {
        const int id = s_ids[r * k + lane];
        dev::cluster_map_generic(s_ids, 0)[r * k + lane] = id;
        a.sel_ids[r * k + lane] = id;
      }
      if (lane <= k) a.sel_w[r * (k + 1) + lane] = s_wtmp[warp][lane];
    }
    dev::cluster_sync();  // the ids in rank 0's s_ids; rank 0 reads nothing of this block's
    return;
  }
  for (int r = warp; r < (nb > 1 ? 32 : M); r += blockDim.x / 32) {
    if ((active >> r) & 1ull)
      dev::route_warp(a.logits + r * a.ld, E, k, a.renorm, s_ids + r * k, s_wtmp[warp], a.sel_ids + r * k,
                      a.sel_w + r * (k + 1));
    __syncwarp();
  }
  if (nb > 1) dev::cluster_sync();  // rank 1's rows in s_ids (and a barrier of this block)
  __syncthreads();
  for (int q = tid; q < M * k; q += blockDim.x)
    if ((active >> (q / k)) & 1ull) atomicOr(&s_bits[s_ids[q]], 1ull << (q / k));
  __syncthreads();
  // per expert: rows, chunks; prefix sums over the experts in id order
  int cnt = 0, nch = 0;
  if (tid < E) {
    cnt = __popcll(s_bits[tid]);
    nch = (cnt + CH - 1) / CH;
  }
  int tot_cnt = 0, tot_ch = 0;
  const int off = block_excl_scan(cnt, s_scan, &tot_cnt);
  const int coff = block_excl_scan(nch, s_scan, &tot_ch);
  if (tid < E) {
    s_off[tid] = off;
    for (int c = 0; c < nch; ++c) a.sc.chunks[coff + c] = make_int4(tid, off + c * CH, min(CH, cnt - c * CH), 0);
  }
  __syncthreads();
  // entries: an expert's rows in ascending order (rank = rows below r that chose it)
  for (int q = tid; q < M * k; q += blockDim.x) {
    const int r = q / k, j = q % k;
    if (!((active >> r) & 1ull)) continue;
    const int e = s_ids[q];
    a.sc.entries[s_off[e] + __popcll(s_bits[e] & ((1ull << r) - 1ull))] = (r << 8) | j;
  }
  // the shared expert: every active row, in order, after the routed entries and chunks
  const int nact = __popcll(active), sch = (nact + CH - 1) / CH;
  for (int r = tid; r < M; r += blockDim.x)
    if ((active >> r) & 1ull) a.sc.entries[tot_cnt + __popcll(active & ((1ull << r) - 1ull))] = (r << 8) | k;
  for (int c = tid; c < sch; c += blockDim.x)
    a.sc.chunks[tot_ch + c] = make_int4(E, tot_cnt + c * CH, min(CH, nact - c * CH), 0);
  if (tid == 0) {
    a.sc.hdr[0] = tot_ch;
    a.sc.hdr[1] = tot_ch + sch;
    a.sc.hdr[2] = tot_cnt + nact;
    a.sc.hdr[3] = nact;
  }
}

// The same routing and grouping for M·k <= 32 (pairs) without the block-wide counting sort: a warp per row
// routes (route_warp, as above), then one warp sorts the pairs by (expert, row) — a bitonic sort of one key per
// lane — and writes the chunks and entries from ballots. The order is the counting sort's (experts in id
// order, an expert's rows ascending), so the scratch holds the same values; only the chain is shorter (one
// barrier, no scans). The few-row steps take it: the speculative verify (K + 1 rows), small batches.
constexpr int kWarpSortPairs = 32;
__global__ void __launch_bounds__(kWarpSortPairs * 32) moe_route_small_kernel(RouteArgs a) {
  __shared__ int s_ids[kWarpSortPairs];
  __shared__ float s_wtmp[kWarpSortPairs][kMaxK + 2];
  if (blockIdx.x > 0) {
    prefetch_spans(a.pf);
    return;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, E = a.E, k = a.k, M = a.M, CH = a.CH;
  pdl_wait();
  pdl_trigger();
  const bool row_on = warp < M && (a.row_slot == nullptr || a.row_slot[warp] >= 0);
  if (row_on) dev::route_warp(a.logits + warp * a.ld, E, k, a.renorm, s_ids + warp * k, s_wtmp[warp],
                              a.sel_ids + warp * k, a.sel_w + warp * (k + 1));
  __syncthreads();
  if (warp != 0) return;
  const bool on = lane < M && (a.row_slot == nullptr || a.row_slot[lane] >= 0);
  const unsigned active = __ballot_sync(0xffffffffu, on);
  // the pair of this lane: key (expert, row, choice), or past every key when none
  constexpr int kNone = 0x7fffffff;
  const int q = lane, qr = k > 0 ? q / k : 0;
  int key = kNone;
  if (q < M * k && ((active >> qr) & 1u)) key = (s_ids[q] << 11) | (qr << 5) | (q % k);
  for (int size = 2; size <= 32; size <<= 1)
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      const int other = __shfl_xor_sync(0xffffffffu, key, stride);
      const bool low = (lane & stride) == 0, up = (lane & size) == 0;
      key = (low == up) ? min(key, other) : max(key, other);
    }
  const bool valid = key != kNone;  // a prefix of the lanes
  const int n = __popc(__ballot_sync(0xffffffffu, valid));
  const int e = key >> 11, r = (key >> 5) & 63, j = key & 31;
  const int e_prev = __shfl_up_sync(0xffffffffu, e, 1);
  const unsigned heads = __ballot_sync(0xffffffffu, valid && (lane == 0 || e_prev != e));
  const unsigned upto = 0xffffffffu >> (31 - lane);  // lanes 0..lane
  const int seg_start = 31 - __clz(heads & upto);
  const unsigned later = heads & ~upto;
  const int seg_end = later ? __ffs(later) - 1 : n;
  const bool cstart = valid && (lane - seg_start) % CH == 0;
  const unsigned cmask = __ballot_sync(0xffffffffu, cstart);
  if (valid) a.sc.entries[lane] = (r << 8) | j;
  if (cstart) a.sc.chunks[__popc(cmask & (upto >> 1))] = make_int4(e, lane, min(CH, seg_end - lane), 0);
  // the shared expert: every active row, in order, after the routed entries and chunks
  const int tot_ch = __popc(cmask), nact = __popc(active), sch = (nact + CH - 1) / CH;
  if (on) a.sc.entries[n + __popc(active & (upto >> 1))] = (lane << 8) | k;
  for (int c = lane; c < sch; c += 32) a.sc.chunks[tot_ch + c] = make_int4(E, n + c * CH, min(CH, nact - c * CH), 0);
  if (lane == 0) {
    a.sc.hdr[0] = tot_ch;
    a.sc.hdr[1] = tot_ch + sch;
    a.sc.hdr[2] = n + nact;
    a.sc.hdr[3] = nact;
  }
}

// Whether the routing launch requests the shared expert into L2 (LILAC_MOE_ROUTE_PREFETCH=0: not; measurement).
bool route_prefetch_on() {
  static const bool on = env_switch_on("LILAC_MOE_ROUTE_PREFETCH");
  return on;
}

// The shared expert's matrices as prefetch spans; returns how many extra blocks of `threads` request them (~4 lines a
// thread, at most one block per SM of an H100 / H200).
unsigned prefetch_blocks(const MoEDecodeWeights& w, int threads, PrefetchSpans& pf) {
  pf.n = 0;
  if (!route_prefetch_on()) return 0;
  int64_t lines = 0;
  dev::for_shared_expert_spans(w, [&](const void* p, int64_t bytes) {
    if (p == nullptr || bytes <= 0) return;
    pf.p[pf.n] = static_cast<const char*>(p);
    pf.bytes[pf.n++] = bytes;
    lines += (bytes + 127) / 128;
  });
  return unsigned(std::min<int64_t>(132, (lines + 4 * threads - 1) / (4 * threads)));
}

// Whether few-row routings take moe_route_small_kernel (LILAC_MOE_ROUTE_WARP=0: the block kernel; measurement).
bool route_small_on() {
  static const bool on = env_switch_on("LILAC_MOE_ROUTE_WARP");
  return on;
}

struct CombineArgs {
  int64_t H, ldy;
  int k;
  const float* sel_w;
  const int32_t* row_slot;
  const float* pe;
  float* y;
};

// y[r][n] += Σ_e w_e · P_e[r][n] over the row's k experts and the shared one (slot k), as the chain acc = fmaf(w_e,
// P_e, acc) from 0 in slot order, then y + acc: moe_down_tc's epilogue (rows_mm.h), so its bits. A thread per
// output (the k + 1 loads independent, all in flight), a block per 256 outputs of one row.
constexpr int kCombineThreads = 256, kCombineFast = 16;
__global__ void __launch_bounds__(kCombineThreads) moe_combine_kernel(CombineArgs a) {
  __shared__ float s_w[kMaxK + 1];
  const int r = blockIdx.y, k = a.k;
  const int64_t n = int64_t(blockIdx.x) * kCombineThreads + threadIdx.x;
  pdl_wait();
  pdl_trigger();
  if (a.row_slot != nullptr && a.row_slot[r] < 0) return;  // uniform in the block
  if (threadIdx.x <= k) s_w[threadIdx.x] = __ldcg(a.sel_w + int64_t(r) * (k + 1) + threadIdx.x);
  __syncthreads();
  if (n >= a.H) return;
  const float* pr = a.pe + int64_t(r) * (k + 1) * a.H + n;
  float acc = 0.f;
  if (k + 1 <= kCombineFast) {  // the model's 9 slots
    float x[kCombineFast];
#pragma unroll
    for (int e = 0; e < kCombineFast; ++e) x[e] = e <= k ? __ldcg(pr + int64_t(e) * a.H) : 0.f;
#pragma unroll
    for (int e = 0; e < kCombineFast; ++e)
      if (e <= k) acc = fmaf(s_w[e], x[e], acc);
  } else {
    for (int e = 0; e <= k; ++e) acc = fmaf(s_w[e], __ldcg(pr + int64_t(e) * a.H), acc);
  }
  float* yp = a.y + int64_t(r) * a.ldy + n;
  *yp = *yp + acc;
}

// The combine of a row followed by the staging of its result for the next layer (its input RMSNorm; rows_mm.h:
// moe_combine_stage_rows): a block of kThreads per row, thread t combining the outputs of its staging units t,
// t + 256, ... (8 columns each: the k + 1 slots' loads of both float4 halves in flight together), each output
// moe_combine_kernel's chain, written to y and into shared memory, where stage_row (stage_row.cuh) takes the row
// as the staging launch takes it from y. One launch instead of two; the same bits.
constexpr int kStageFast = 9;  // slots whose loads are all in flight at once (the model's top-8 + the shared expert)
__global__ void __launch_bounds__(kThreads) combine_stage_kernel(CombineArgs a, StageArgs st) {
  extern __shared__ float4 smem4[];
  __shared__ float red[32];
  __shared__ float s_w[kMaxK + 1];
  const int r = blockIdx.x, k = a.k;
  const StageSmem m = stage_smem(smem4, int(st.K), st.pro, st.head_dim);
  if (!stage_enter(st, r, m)) return;
  if (threadIdx.x <= k) s_w[threadIdx.x] = __ldcg(a.sel_w + int64_t(r) * (k + 1) + threadIdx.x);
  __syncthreads();
  const float* pr = a.pe + int64_t(r) * (k + 1) * a.H;
  float* yr = a.y + int64_t(r) * a.ldy;
  for (int u = threadIdx.x; u < a.H / 8; u += blockDim.x) {
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    auto add = [&](const float4 (&x)[2], float w) {
      const float v[8] = {x[0].x, x[0].y, x[0].z, x[0].w, x[1].x, x[1].y, x[1].z, x[1].w};
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] = fmaf(w, v[j], acc[j]);
    };
    auto load = [&](int e, float4 (&x)[2]) {
      const float4* p = reinterpret_cast<const float4*>(pr + int64_t(e) * a.H + 8 * u);
      x[0] = __ldcg(p);
      x[1] = __ldcg(p + 1);
    };
    if (k + 1 <= kStageFast) {
      float4 x[kStageFast][2];
#pragma unroll
      for (int e = 0; e < kStageFast; ++e)
        if (e <= k) load(e, x[e]);
#pragma unroll
      for (int e = 0; e < kStageFast; ++e)
        if (e <= k) add(x[e], s_w[e]);
    } else {
      for (int e = 0; e <= k; ++e) {
        float4 x[2];
        load(e, x);
        add(x, s_w[e]);
      }
    }
    float4* yp = reinterpret_cast<float4*>(yr + 8 * u);
    const float4 y0 = yp[0], y1 = yp[1];
    const float4 o0 = make_float4(y0.x + acc[0], y0.y + acc[1], y0.z + acc[2], y0.w + acc[3]);
    const float4 o1 = make_float4(y1.x + acc[4], y1.y + acc[5], y1.z + acc[6], y1.w + acc[7]);
    yp[0] = o0;
    yp[1] = o1;
    reinterpret_cast<float4*>(m.xs)[2 * u] = o0;
    reinterpret_cast<float4*>(m.xs)[2 * u + 1] = o1;
  }
  cp_async_wait_all();
  __syncthreads();
  stage_row(st, r, m, red);
}

bool shape_ok(const QMatrixDev& m, int bits) {
  return m.bits == bits && m.group_size == 64 && m.cols > 0 && m.cols % 64 == 0 && m.rows > 0 && m.qweight &&
         m.scales && m.biases;
}

}  // namespace

// Chunk rows: 8-bit experts hold 4 rows in one mma tile (one pass); 4-bit experts 2 per tile, and the tiles a
// chunk may need are the expert kernels' registers and instructions per k-tile. Measured on the H200
// (bench/BENCHMARKS.md, 2026-12-02): chunks of one tile (2 rows; an expert's further rows make further chunks,
// whose weights come from L2) are fastest up to M = 32 (an expert is chosen by ~M·k/E <= 1 row there), 4 rows
// above. LILAC_MOE_ROWS_CH = 2 / 4 / 8 forces the 4-bit size (measurement).
int moe_chunk_rows(int bits, int M) {
  if (bits != 4) return 4;
  static const int forced = [] {
    const char* v = std::getenv("LILAC_MOE_ROWS_CH");
    const int n = v ? std::atoi(v) : 0;
    return n == 2 || n == 4 || n == 8 ? n : 0;
  }();
  if (forced) return forced;
  return M <= kMoEOneTileM ? 2 : 4;
}

size_t moe_rows_scratch_bytes(const MoEDecodeWeights& w, int max_rows) { return moe_scratch_size(w, max_rows); }

bool moe_rows_supported(const MoEDecodeWeights& w, int max_rows) {
  const int b = w.gate.first.bits;
  if (b != 4 && b != 8) return false;
  if (!shape_ok(w.gate.first, b) || !shape_ok(w.up.first, b) || !shape_ok(w.down.first, b) ||
      !shape_ok(w.shared_gate, b) || !shape_ok(w.shared_up, b) || !shape_ok(w.shared_down, b))
    return false;
  const int64_t H = w.gate.first.cols, I = w.gate.first.rows, Is = w.shared_gate.rows;
  if (w.up.first.cols != H || w.up.first.rows != I || w.down.first.rows != H || w.down.first.cols != I ||
      w.shared_up.cols != H || w.shared_up.rows != Is || w.shared_gate.cols != H || w.shared_down.rows != H ||
      w.shared_down.cols != Is)
    return false;
  if (H > 8192 || I > 8192 || Is > 8192) return false;  // staged fragments of a chunk within shared memory
  if (int64_t(max_rows) * (w.top_k + 1) * H >= (int64_t(1) << 31)) return false;  // down's 32-bit offsets into pe
  return w.E >= 1 && w.E <= kMaxE && w.top_k >= 1 && w.top_k <= kMaxK && w.top_k <= w.E && max_rows >= 1 &&
         max_rows <= kMoEMaxRows;
}

bool moe_route_cluster_ok() {
  static const bool ok = [] {
    if (!env_switch_on("LILAC_MOE_ROUTE_CLUSTER") || !sm90_or_later()) return false;
    cudaFuncAttributes fa{};
    if (cudaFuncGetAttributes(&fa, moe_route_kernel) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return fa.ptxVersion >= 90;  // the code's virtual architecture (a compute_80 PTX JIT-compiled on sm_90 has none)
  }();
  return ok;
}

void moe_route_rows(const MoEDecodeWeights& w, const float* logits, int64_t ld_logits, int M, const int32_t* row_slot,
                    int32_t* sel_ids, float* sel_w, void* scratch, cudaStream_t stream, int chunk_rows) {
  if (!moe_rows_supported(w, std::max(M, 1))) throw Error("rows::moe_route_rows: unsupported MoE shape or M");
  if (M == 0) return;
  RouteArgs a;
  a.logits = logits;
  a.ld = ld_logits > 0 ? ld_logits : w.E + 1;
  a.M = M;
  a.row_slot = row_slot;
  a.E = w.E;
  a.k = w.top_k;
  a.CH = chunk_rows > 0 ? chunk_rows : moe_chunk_rows(w.gate.first.bits, M);
  a.renorm = w.renormalise;
  a.sel_ids = sel_ids;
  a.sel_w = sel_w;
  a.sc = moe_carve(scratch, w, M);
  if (M * w.top_k <= kWarpSortPairs && route_small_on()) {
    const unsigned extra = prefetch_blocks(w, 32 * M, a.pf);
    launch_pdl(moe_route_small_kernel, dim3(1 + extra), dim3(unsigned(32 * M)), 0, stream, a);
    return;
  }
  // A warp per row up to 32 rows, and at least a thread per expert (the counts and scans): fewer warps for
  // few rows make the kernel's barriers cheaper (the same work and results at any block size).
  const int threads = std::min(kRouteThreads, std::max({(w.E + 31) / 32, std::min(M, 32), 2}) * 32);  // 2: the active-row ballots
  a.route_blocks = M > 32 && moe_route_cluster_ok() ? 2 : 1;
  unsigned extra = prefetch_blocks(w, threads, a.pf);
  if (a.route_blocks == 2) {
    extra += extra % 2;  // a whole number of clusters
    launch_pdl_cluster(moe_route_kernel, dim3(2 + extra), dim3(threads), 0, stream, 2u, a);
    return;
  }
  launch_pdl(moe_route_kernel, dim3(1 + extra), dim3(threads), 0, stream, a);
}

CombineArgs combine_args(const MoEDecodeWeights& w, const float* sel_w, int M, const int32_t* row_slot,
                         const void* scratch, float* y, int64_t ldy) {
  CombineArgs a;
  a.H = w.down.first.rows;
  a.ldy = ldy > 0 ? ldy : a.H;
  a.k = w.top_k;
  a.sel_w = sel_w;
  a.row_slot = row_slot;
  a.pe = moe_carve(const_cast<void*>(scratch), w, M).pe;
  a.y = y;
  return a;
}

void moe_combine_rows(const MoEDecodeWeights& w, const float* sel_w, int M, const int32_t* row_slot,
                      const void* scratch, float* y, int64_t ldy, cudaStream_t stream) {
  if (M == 0) return;
  const CombineArgs a = combine_args(w, sel_w, M, row_slot, scratch, y, ldy);
  launch_pdl(moe_combine_kernel, dim3(unsigned((a.H + kCombineThreads - 1) / kCombineThreads), unsigned(M)),
             dim3(kCombineThreads), 0, stream, a);
}

bool combine_stage_supported(const MoEDecodeWeights& w, const StageArgs& st) {
  const int64_t H = w.down.first.rows;
  // stage_supported also bounds the row's shared memory, which the fused kernel uses as the staging launch does
  return st.pro == Prologue::RmsNorm && st.K == H && st.digits == nullptr && stage_supported(st);
}

void moe_combine_stage_rows(const MoEDecodeWeights& w, const float* sel_w, int M, const int32_t* row_slot,
                            const void* scratch, float* y, int64_t ldy, const StageArgs& st, cudaStream_t stream) {
  if (!combine_stage_supported(w, st) || st.M != M || st.row_slot != row_slot || st.x != y ||
      (st.ldx > 0 ? st.ldx : st.K) != (ldy > 0 ? ldy : st.K))
    throw Error("rows::moe_combine_stage_rows: unsupported arguments");
  if (M == 0) return;
  const CombineArgs a = combine_args(w, sel_w, M, row_slot, scratch, y, ldy);
  const size_t smem = size_t(stage_smem_bytes(int(a.H), st.pro, st.head_dim));
  if (smem > 48 * 1024)
    LILAC_CUDA_CHECK(cudaFuncSetAttribute(combine_stage_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  launch_pdl(combine_stage_kernel, dim3(unsigned(M)), dim3(kThreads), smem, stream, a, st);
}

}  // namespace lilac::cuda::rows
