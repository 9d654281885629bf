// Gated DeltaNet for M rows (rows_state.h: gdn_step_rows, gdn_commit_rows): the causal depthwise
// conv + SiLU of the qkv channels, then the delta-rule step, the rows of one sequence in order with the
// state in registers.
//
// gdn_step_rows in Advance mode: two launches. gdn_conv_rows_kernel convolves every qkv channel of every
// run (a thread per channel, the run's rows in order; each channel's conv state and log entry have that
// one writer) into a [M][conv_dim] scratch; gdn_rows_kernel then reads its block's channels from there.
// In Log mode (a speculative verify) the conv state is only read, so gdn_rows_kernel convolves its own
// channels as the commit does (below, without the counter): one launch.
// gdn_commit_rows: one launch, gdn_rows_kernel with the conv inside (it replays logged raw rows of all
// layers at once): per row the conv of the channels the block needs — q and k of its key head (dk each)
// and v of its 16 columns — one channel per thread and 128-channel round, taps and the previous K-1
// inputs in registers (q/k channels recomputed by the blocks of every value head of the key head and
// every slice; the q/k conv state written by the last block of the key head to finish — counted on
// GdnLayer::conv_sync, since the others read it until they finish — and v's by the slice's block).
//
// Block of gdn_rows_kernel (value head h, 16-column slice y, run; grid x, y = h, y, or y, h in the Advance step at
// the model's shape: SLICE_MAJOR below): 128 threads, the thread layout of
// gdn_decode.cu (4 column groups of 4 columns × 32 row groups; a thread owns rows rg, rg+32, ... of its
// 4 columns). A run is the rows of one sequence: in gdn_step_rows the block of grid z = r works iff row
// r is the first row of its sequence (the blocks of the other rows exit at once); in gdn_commit_rows
// grid z = (layer, sequence) and the rows are the sequence's logged rows 0 .. keep-1. Per row
// gdn_decode.cu's step on the conv outputs, exactly its operations in its order (bitwise for one row).
// Conv arithmetic as the in_proj GEMV's conv epilogue (gemv_common.cuh / gemv_tc.cu), so M = 1 is
// bitwise today's path given the same raw in_proj values.
// Rows' inputs are requested one row ahead. The state and conv state are loaded before pdl_wait() in
// gdn_step_rows (see rows_state.h for the rule that allows it), after it in gdn_commit_rows.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "cuda/cuda_common.h"
#include "cuda/kernels/launch.cuh"
#include "cuda/kernels/qdot.cuh"
#include "cuda/kernels/rows/rows_plan.h"
#include "cuda/kernels/rows/rows_state.h"

namespace lilac::cuda::rows {
namespace {
using namespace dev;
constexpr int kMaxDk = 256;
constexpr int kMaxConvK = 4;
constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kColGroups = 4;                      // float4 column groups per block
constexpr int kCols = 4 * kColGroups;              // state columns per block (plan::kGdnSliceCols)
constexpr int kRowGroups = kThreads / kColGroups;  // 32; a warp holds 8 consecutive row groups
constexpr int kRowsPerWarp = 32 / kColGroups;      // 8
static_assert(kCols == plan::kGdnSliceCols, "GDN slice width");

struct OneLayer {
  GdnLayer l[1];
};
struct LayerTable {
  GdnLayer l[kGdnMaxLayers];
};

struct GdnArgs {
  GdnRowsShape s;
  GdnPool pool;
  // gdn_step_rows
  int M = 0;
  const int32_t* row_slot = nullptr;
  const float* x = nullptr;  // in_proj rows
  int64_t x_stride = 0, b_off = 0, a_off = 0;
  float* cv = nullptr;  // conv + SiLU of the qkv channels, row r at cv + r * conv_dim (gdn_conv_rows_kernel)
  float* out = nullptr;
  int64_t out_stride = 0;
  int log = 0;  // GdnMode::Log
  // gdn_commit_rows
  int n_seq = 0;
  const int32_t* seq_slot = nullptr;
  const int32_t* seq_keep = nullptr;
};

// The rows of the run (a sequence's consecutive rows) that starts at row r, or 0 when row r is padding or not
// the first row of its run.
__device__ __forceinline__ int run_rows(const int32_t* row_slot, int M, int r) {
  const int slot = row_slot[r];
  if (slot < 0 || (r > 0 && row_slot[r - 1] == slot)) return 0;
  int n = 1;
  while (r + n < M && row_slot[r + n] == slot) ++n;
  return n;
}

// One conv step of a channel, the in_proj conv epilogue's arithmetic: the output (before the SiLU) of taps w
// over the previous S1 inputs st (oldest first) and of wl over the current input x; st then ends with x.
__device__ __forceinline__ float conv_step(const float (&w)[kMaxConvK - 1], float wl, float (&st)[kMaxConvK - 1],
                                           float x, int S1) {
  float acc = 0.f;
#pragma unroll
  for (int k = 0; k < kMaxConvK - 1; ++k)
    if (k < S1) acc += w[k] * st[k];
  acc += wl * x;
#pragma unroll
  for (int k = 0; k < kMaxConvK - 2; ++k)
    if (k + 1 < S1) st[k] = st[k + 1];
#pragma unroll
  for (int k = 0; k < kMaxConvK - 1; ++k)
    if (k == S1 - 1) st[k] = x;
  return acc;
}

// A thread's share of the state: rows rg, rg + 32, ... (< dk) of the 4 columns c0 .. c0 + 3 (< dv), streamed
// (read once, written once per run). A block reads 64 bytes of each 512-byte state row; the blocks of the head's
// other slices, in the same wave, read the rest: each miss fetches its whole 256-byte block into L2 (ld_cs_pf), so
// DRAM serves whole blocks and the neighbours hit L2 (+3 % at 64 streams, bench/BENCHMARKS.md "Stop 56").
// SP > 1 (gdn_rows_kernel's slices per block): the thread also holds the same 4 columns of the next SP - 1 slices,
// sr[r][4 p + j] = column c0 + 16 p + j.
template <int R, bool VEC, int SP = 1>
__device__ __forceinline__ void load_state(float (&sr)[R][4 * SP], const float* S, int rg, int c0, int dk, int dv) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int i = rg + r * kRowGroups;
#pragma unroll
    for (int p = 0; p < SP; ++p) {
      const int cp = c0 + kCols * p;
      if constexpr (VEC) {
        float4 v4 = make_float4(0.f, 0.f, 0.f, 0.f);
        if (i < dk && cp < dv) {
          const float4* sp = reinterpret_cast<const float4*>(S + int64_t(i) * dv + cp);
          v4 = dev::ld_cs_pf(sp);
        }
        sr[r][4 * p] = v4.x;
        sr[r][4 * p + 1] = v4.y;
        sr[r][4 * p + 2] = v4.z;
        sr[r][4 * p + 3] = v4.w;
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j)
          sr[r][4 * p + j] = (i < dk && cp + j < dv) ? __ldcs(S + int64_t(i) * dv + cp + j) : 0.f;
      }
    }
  }
}
template <int R, bool VEC, int SP = 1>
__device__ __forceinline__ void store_state(const float (&sr)[R][4 * SP], float* S, int rg, int c0, int dk, int dv) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int i = rg + r * kRowGroups;
    if (i < dk) {
#pragma unroll
      for (int p = 0; p < SP; ++p) {
        const int cp = c0 + kCols * p;
        if constexpr (VEC) {
          if (cp < dv)
            __stcs(reinterpret_cast<float4*>(S + int64_t(i) * dv + cp),
                   make_float4(sr[r][4 * p], sr[r][4 * p + 1], sr[r][4 * p + 2], sr[r][4 * p + 3]));
        } else {
#pragma unroll
          for (int jj = 0; jj < 4; ++jj)
            if (cp + jj < dv) __stcs(S + int64_t(i) * dv + cp + jj, sr[r][4 * p + jj]);
        }
      }
    }
  }
}

// Where a thread of gdn_rows_kernel sits: head h, slice y, its row group rg, column group cg and first column c0.
struct StepThread {
  int h, y, dk, dv, tid, lane, warp, cg, rg, c0;
};

// gdn_decode.cu's step for one row on (q, k, v) = xs (the conv outputs: q [dk], k [dk], then the slice's 16 v),
// exactly its operations in its order: gates from the raw b, a; the state decayed, Σ S k and the squared norms
// reduced over the block, the delta-rule update, o = Sᵀ q̂ reduced over the block and written to out[out_off + col]
// (out null: no output).
// SP > 1: the thread's 4 columns of SP consecutive slices (load_state), each column's operations as at SP = 1 (the
// same chains over the thread's rows and the same trees over the block), t.y the first slice.
template <int R, int SP = 1>
__device__ __forceinline__ void delta_step(float (&sr)[R][4 * SP], const float* xs,
                                           float (&part_u)[kWarps][kColGroups][4 * SP + 2],
                                           float (&part_o)[kWarps][kCols * SP], const StepThread& t, float bj, float aj,
                                           float negA, float dtb, float* out, int64_t out_off) {
  constexpr int NC = 4 * SP;  // the thread's columns
  float qv[R], kv[R], vv[NC];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int i = t.rg + r * kRowGroups;
    qv[r] = i < t.dk ? xs[i] : 0.f;
    kv[r] = i < t.dk ? xs[t.dk + i] : 0.f;
  }
#pragma unroll
  for (int jj = 0; jj < NC; ++jj)
    vv[jj] = t.c0 + kCols * (jj / 4) + jj % 4 < t.dv ? xs[2 * t.dk + kCols * (jj / 4) + t.cg * 4 + jj % 4] : 0.f;
  const float beta = sigmoid_f(bj);
  const float xa = aj + dtb;
  const float sp = xa > 20.f ? xa : log1pf(expf(xa));
  const float g = negA * sp;
  const float eg = expf(g);

  // decay, then the partial column sums Σ S k and the squared norms
  float acc[NC + 2];
#pragma unroll
  for (int x = 0; x < NC + 2; ++x) acc[x] = 0.f;
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int jj = 0; jj < NC; ++jj) {
      sr[r][jj] *= eg;
      acc[jj] = fmaf(sr[r][jj], kv[r], acc[jj]);
    }
    acc[NC] = fmaf(kv[r], kv[r], acc[NC]);
    acc[NC + 1] = fmaf(qv[r], qv[r], acc[NC + 1]);
  }
  warp_partials<kColGroups>(acc, &part_u[t.warp][0][0], t.lane);
  __syncthreads();
  float tot[NC + 2];
#pragma unroll
  for (int x = 0; x < NC + 2; ++x) tot[x] = 0.f;
#pragma unroll
  for (int wi = 0; wi < kWarps; ++wi)
#pragma unroll
    for (int x = 0; x < NC + 2; ++x) tot[x] += part_u[wi][t.cg][x];
  const float rk = rsqrtf(tot[NC] + 1e-6f);
  const float rq = rsqrtf(tot[NC + 1] + 1e-6f) * rsqrtf(float(t.dk));
  float delta[NC];
#pragma unroll
  for (int jj = 0; jj < NC; ++jj) delta[jj] = beta * (vv[jj] - tot[jj] * rk);

  // S += k̂ deltaᵀ, o = Sᵀ q̂
  float o[NC];
#pragma unroll
  for (int jj = 0; jj < NC; ++jj) o[jj] = 0.f;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int i = t.rg + r * kRowGroups;
    if (i < t.dk) {
      const float kn = kv[r] * rk, qn = qv[r] * rq;
#pragma unroll
      for (int jj = 0; jj < NC; ++jj) {
        sr[r][jj] = fmaf(kn, delta[jj], sr[r][jj]);
        o[jj] = fmaf(sr[r][jj], qn, o[jj]);
      }
    }
  }
  warp_partials<kColGroups>(o, &part_o[t.warp][0], t.lane);
  __syncthreads();
  if (out && t.tid < kCols * SP) {
    const int col = t.y * kCols + t.tid;
    // where warp_partials put column tid's sum: column group cg's NC values at cg · NC, slice p's 4 at 4 p
    const int w = t.tid % kCols, idx = SP == 1 ? t.tid : (w / 4) * NC + 4 * (t.tid / kCols) + w % 4;
    if (col < t.dv) {
      float sum = 0.f;
#pragma unroll
      for (int wi = 0; wi < kWarps; ++wi) sum += part_o[wi][idx];
      out[out_off + col] = sum;
    }
  }
}

// The rows a block of gdn_rows_kernel works on: gdn_commit_rows' grid z = (layer, sequence), its logged rows 0 ..
// keep - 1; gdn_step_rows' grid z = r, the run of row r's sequence if r is its first row. False when the block has
// none (after its PDL wait, as every block).
struct Run {
  int layer = 0, slot = 0, n = 0, log_n = 0;
  const float* src = nullptr;
  int64_t src_stride = 0, b_off = 0, a_off = 0;
  float* outp = nullptr;
};
template <bool COMMIT, class Tab>
__device__ __forceinline__ bool block_run(const GdnArgs& a, const Tab& tab, Run& run) {
  const int64_t conv_dim = a.s.conv_dim(), log_row = a.s.log_row_floats();
  if constexpr (COMMIT) {
    run.layer = blockIdx.z / a.n_seq;
    const int i = blockIdx.z % a.n_seq;
    pdl_wait();
    pdl_trigger();
    run.slot = a.seq_slot[i];
    run.n = min(a.seq_keep[i], a.pool.log_rows);
    if (run.slot < 0 || run.n <= 0) return false;
    run.src = tab.l[run.layer].log + run.slot * a.pool.log_stride;
    run.src_stride = log_row;
    run.b_off = conv_dim;
    run.a_off = conv_dim + a.s.Hv;
  } else {
    const int r = blockIdx.z;
    run.slot = a.row_slot[r];
    run.n = run_rows(a.row_slot, a.M, r);
    if (run.n == 0) {  // padding, or not the first row of its run
      pdl_wait();
      pdl_trigger();
      return false;
    }
    run.src = a.x + r * a.x_stride;
    run.src_stride = a.x_stride;
    run.b_off = a.b_off;
    run.a_off = a.a_off;
    run.outp = a.out + r * a.out_stride;
    if (a.log) run.log_n = min(run.n, a.pool.log_rows);
  }
  return true;
}

// Registers of the step kernels with R <= 4 are capped for 5 resident blocks per SM (96 per thread; the
// model's dk = 128 used 118 and fit 4 blocks): at M = 16 the grid is ~6 waves of short latency chains,
// so blocks per SM set the time (measured on the H200: 47 -> 42 us per layer at M = 16, bench --batch
// +1.6 % at 16 streams, +2 % at 64). With the conv in its own kernel the step needs 90 registers; caps
// for 6 or 8 blocks (78 / 64 registers, no spills) were no faster (bench --batch within noise at 16, −1 %
// at 64 for 8). 0: no cap.
// SP slices per block (below): 4 blocks per SM at 2, 3 at 4.
template <int R, bool CONV, int SP = 1>
constexpr int kMinBlocks = !CONV && R <= 4 ? (SP == 1 ? 5 : SP == 2 ? 4 : 3) : 0;
// Rows whose raw inputs the kernels with the conv inside (a speculative verify's rows, the commit's replay) keep in
// flight: a row's chain is shorter than the round trip of the next row's inputs. (The step without the conv, whose
// registers are capped, keeps one.)
constexpr int kRowsAhead = 3;
// R: rows of the state per thread (dk <= 32 R); CPT: conv channels per thread (2 dk + 16 channels).
// VEC: dv % 4 == 0 and every state 16-byte aligned. COMMIT: gdn_commit_rows (Tab = LayerTable).
// CONV: the conv inside (the commit; the step in Log mode, whose conv state is only read), else the step
// takes the qkv channels after the conv from gdn_conv_rows_kernel.
// SLICE_MAJOR (the Advance step at the model's shape): grid (slice, value head, row) instead of (value head, slice,
// row): the 8 blocks of a head's slices are dispatched one after the other, so the head's 64-KB state region is read
// by neighbouring blocks at about the same time rather than 32 blocks apart. The same blocks and bits; the batched
// step +0.5-0.8 % at 16-64 streams (H100, bench/BENCHMARKS.md "Stop 63"; why, not traced).
// SP (slices per block; the slice-major Advance step only): a block does SP consecutive slices, each thread the same
// 4 columns of each (delta_step), so every column's operations and order are SP = 1's (the same bits) while the
// block's fixed work (its run, channels, gates, barriers) is shared by SP times the state.
template <int R, bool VEC, bool COMMIT, bool CONV, class Tab, bool SLICE_MAJOR = false, int SP = 1>
__global__ void __launch_bounds__(kThreads, (kMinBlocks<R, CONV, SP>))
    gdn_rows_kernel(GdnArgs a, const __grid_constant__ Tab tab) {
  static_assert(!SLICE_MAJOR || !CONV, "the conv-state counter counts gridDim.y slices");
  static_assert(CONV || !COMMIT, "the commit replays raw rows through the conv");
  static_assert(SP == 1 || SLICE_MAJOR, "slices per block: the slice-major Advance step");
  constexpr int CPT = (64 * R + kCols * SP + kThreads - 1) / kThreads;
  __shared__ float xs[2 * kMaxDk + kCols * SP];           // the row's conv outputs: q [dk], k [dk], v [16 SP]
  __shared__ float part_u[kWarps][kColGroups][4 * SP + 2];  // Σ S k (4 SP columns), Σ k², Σ q² per warp
  __shared__ float part_o[kWarps][kCols * SP];
  const GdnRowsShape& s = a.s;
  const int h = SLICE_MAJOR ? blockIdx.y : blockIdx.x, y = SLICE_MAJOR ? blockIdx.x * SP : blockIdx.y;
  const int dk = s.dk, dv = s.dv, S1 = s.conv_k - 1;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int cg = lane & (kColGroups - 1);
  const int rg = warp * kRowsPerWarp + lane / kColGroups;
  const int c0 = y * kCols + cg * 4;
  const StepThread t{h, y, dk, dv, tid, lane, warp, cg, rg, c0};
  const int64_t conv_dim = s.conv_dim(), log_row = s.log_row_floats();

  // the run
  Run run;
  if (!block_run<COMMIT>(a, tab, run)) return;
  const int layer = run.layer, slot = run.slot, n = run.n, log_n = run.log_n;
  const float* const src = run.src;
  const int64_t src_stride = run.src_stride, b_off = run.b_off, a_off = run.a_off;
  float* const outp = run.outp;
  const bool write_state = COMMIT || !a.log;
  const GdnLayer& L = tab.l[layer];
  float* S = L.state + slot * a.pool.state_stride + int64_t(h) * dk * dv;
  float* cst = L.conv_state + slot * a.pool.conv_stride;
  float* logp = log_n > 0 ? L.log + slot * a.pool.log_stride : nullptr;

  // 1. state, conv taps and conv state, gate weights (before the wait in gdn_step_rows)
  float sr[R][4 * SP];
  load_state<R, VEC, SP>(sr, S, rg, c0, dk, dv);
  int ch[CPT];  // conv channel of this thread's block channel tid + 128 i (-1: none)
  bool own[CPT];
  float w[CPT][kMaxConvK - 1], wl[CPT], st[CPT][kMaxConvK - 1];
#pragma unroll
  for (int i = 0; i < CPT; ++i) {
    if constexpr (SP == 1) {
      ch[i] = plan::gdn_block_channel(s.Hk, s.Hv, dk, dv, h, y, tid + i * kThreads, &own[i]);
    } else {  // channel 2 dk + 16 p + j: slice y + p's v channel j
      const int c = tid + i * kThreads, j = c - 2 * dk;
      ch[i] = j < kCols * SP ? plan::gdn_block_channel(s.Hk, s.Hv, dk, dv, h, j < 0 ? y : y + j / kCols,
                                                       j < 0 ? c : 2 * dk + j % kCols, &own[i])
                             : -1;
    }
    if constexpr (!CONV) continue;
    const float* wc = L.conv_w + int64_t(ch[i] < 0 ? 0 : ch[i]) * (S1 + 1);
    const float* sc = cst + int64_t(ch[i] < 0 ? 0 : ch[i]) * S1;
#pragma unroll
    for (int k = 0; k < kMaxConvK - 1; ++k) {
      w[i][k] = ch[i] >= 0 && k < S1 ? wc[k] : 0.f;
      st[i][k] = ch[i] >= 0 && k < S1 ? sc[k] : 0.f;
    }
    wl[i] = ch[i] >= 0 ? wc[S1] : 0.f;
  }
  const float negA = -expf(L.A_log[h]);
  const float dtb = L.dt_bias[h];
  if constexpr (!COMMIT) {
    pdl_wait();
    pdl_trigger();
  }

  // 2. the rows, in order; raw inputs kAhead rows ahead, in a queue of register slots: row j's inputs are in slot
  // j % kAhead (the loop below is unrolled by kAhead, so a slot is always the same registers), refilled with row
  // j + kAhead's as soon as row j has taken them
  constexpr int kAhead = CONV ? kRowsAhead : 1;
  float qx[kAhead][CPT], qb[kAhead], qa[kAhead];
  auto fetch = [&](int j, float (&x)[CPT], float& b, float& av) {
    const float* sj = src + j * src_stride;
    const float* xj = CONV ? sj : a.cv + (int64_t(blockIdx.z) + j) * s.conv_dim();
#pragma unroll
    for (int i = 0; i < CPT; ++i) x[i] = ch[i] >= 0 ? xj[ch[i]] : 0.f;
    b = sj[b_off + h];
    av = sj[a_off + h];
  };
#pragma unroll
  for (int d = 0; d < kAhead; ++d)
    if (d < n) fetch(d, qx[d], qb[d], qa[d]);
  // the conv state arrival (see 3.): issued once the first row's conv has consumed the conv state, so its
  // round trip overlaps the rows' math instead of ending the block
  const int ratio = s.Hv / s.Hk;
  unsigned* const ctr = CONV && write_state ? L.conv_sync + int64_t(slot) * s.Hk + h / ratio : nullptr;
  unsigned seen = 0;
  auto row = [&](int j, float (&qxd)[CPT], float& qbd, float& qad) {
    float xr[CPT];
#pragma unroll
    for (int i = 0; i < CPT; ++i) xr[i] = qxd[i];
    const float bj = qbd, aj = qad;
    if (j + kAhead < n) fetch(j + kAhead, qxd, qbd, qad);

    // conv + SiLU (state oldest first), as the in_proj conv epilogue
#pragma unroll
    for (int i = 0; i < CPT; ++i) {
      if (ch[i] < 0) continue;
      if constexpr (!CONV) {
        xs[tid + i * kThreads] = xr[i];
        continue;
      }
      xs[tid + i * kThreads] = silu_f(conv_step(w[i], wl[i], st[i], xr[i], S1));
    }
    if (j < log_n) {  // Log mode: this row's raw inputs, one writer per value
      float* lj = logp + j * log_row;
      if constexpr (CONV)  // (the step's raw qkv inputs: logged by gdn_conv_rows_kernel)
#pragma unroll
        for (int i = 0; i < CPT; ++i)
          if (ch[i] >= 0 && own[i]) lj[ch[i]] = xr[i];
      if (y == 0 && tid == 0) {
        lj[conv_dim + h] = bj;
        lj[conv_dim + s.Hv + h] = aj;
      }
    }
    __syncthreads();  // xs
    if (CONV && write_state && j == 0 && tid == 0) {
      __threadfence();
      seen = atomicAdd(ctr, 1u) + 1u;
    }

    delta_step<R, SP>(sr, xs, part_u, part_o, t, bj, aj, negA, dtb, outp, j * a.out_stride + int64_t(h) * dv);
  };
  for (int j0 = 0; j0 < n; j0 += kAhead)
#pragma unroll
    for (int d = 0; d < kAhead; ++d)
      if (j0 + d < n) row(j0 + d, qx[d], qb[d], qa[d]);

  // 3. the state after the last row (Advance, commit)
  if (!write_state) return;
  store_state<R, VEC, SP>(sr, S, rg, c0, dk, dv);
  if constexpr (!CONV) return;
  // The conv state: a v channel is read by its own block only; a q/k channel is read by every block of
  // its key head (ratio value heads x the slices), so it is written by the last of them to arrive — after
  // every one of them has read it (a block arrives after its first row's conv, which consumed the conv
  // state of every thread: the barrier `xs`). The counter is left 0.
  __shared__ int s_last;
  if (tid == 0) {
    s_last = seen == unsigned(ratio) * gridDim.y;
    if (s_last) atomicExch(ctr, 0u);
    __threadfence();
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < CPT; ++i) {
    const bool qk = tid + i * kThreads < 2 * dk;
    if (ch[i] >= 0 && (qk ? s_last != 0 : own[i]))
#pragma unroll
      for (int k = 0; k < kMaxConvK - 1; ++k)
        if (k < S1) cst[int64_t(ch[i]) * S1 + k] = st[i][k];
  }
}

// The causal depthwise conv + SiLU of the qkv channels of gdn_step_rows' rows, one thread per channel and
// run (a sequence's consecutive rows, in order), into cv [M][conv_dim]: the arithmetic of the step kernel's
// conv before it moved here (the in_proj conv epilogue's), so the values are the same bits. Each channel's
// conv state has one writer (Advance: after the run's last row; Log: untouched) and each logged raw input
// too, so the step kernel's blocks no longer meet on a counter, and the q/k channels are convolved once
// instead of once per value head and column slice (16 times at the model's shape). The weights and the conv
// state are read before pdl_wait() (the rule of gdn_step_rows).
constexpr int kConvThreads = 256;
__global__ void __launch_bounds__(kConvThreads)
    gdn_conv_rows_kernel(GdnArgs a, const __grid_constant__ OneLayer tab) {
  const GdnRowsShape& s = a.s;
  const GdnLayer& L = tab.l[0];
  const int r = blockIdx.y, S1 = s.conv_k - 1;
  const int64_t c = int64_t(blockIdx.x) * kConvThreads + threadIdx.x, conv_dim = s.conv_dim();
  const int slot = a.row_slot[r], n = run_rows(a.row_slot, a.M, r);
  if (n == 0 || c >= conv_dim) {  // padding, or not the first row of its run
    pdl_wait();
    pdl_trigger();
    return;
  }
  float* cst = L.conv_state + slot * a.pool.conv_stride + c * S1;
  const float* wc = L.conv_w + c * (S1 + 1);
  float w[kMaxConvK - 1], st[kMaxConvK - 1];
#pragma unroll
  for (int k = 0; k < kMaxConvK - 1; ++k) {
    w[k] = k < S1 ? wc[k] : 0.f;
    st[k] = k < S1 ? cst[k] : 0.f;
  }
  const float wl = wc[S1];
  pdl_wait();
  pdl_trigger();
  const int log_n = a.log ? min(n, a.pool.log_rows) : 0;
  float* logp = log_n > 0 ? L.log + slot * a.pool.log_stride + c : nullptr;
  const float* src = a.x + int64_t(r) * a.x_stride + c;
  float* dst = a.cv + int64_t(r) * conv_dim + c;
  float nx = src[0];
  for (int j = 0; j < n; ++j) {
    const float x = nx;
    if (j + 1 < n) nx = src[(j + 1) * a.x_stride];
    dst[int64_t(j) * conv_dim] = silu_f(conv_step(w, wl, st, x, S1));
    if (j < log_n) logp[int64_t(j) * s.log_row_floats()] = x;
  }
  if (a.log) return;
#pragma unroll
  for (int k = 0; k < kMaxConvK - 1; ++k)
    if (k < S1) cst[k] = st[k];
}

void check_shape(const GdnRowsShape& s) {
  LILAC_CHECK(
      s.dk > 0 && s.dk <= kMaxDk && s.dv > 0 && s.Hk > 0 && s.Hv % s.Hk == 0 && s.conv_k >= 1 && s.conv_k <= kMaxConvK,
      "rows gdn: unsupported shape (dk " + std::to_string(s.dk) + ", conv kernel " + std::to_string(s.conv_k) + ")");
}

template <bool COMMIT, bool CONV, class Tab>
void launch(bool vec, const dim3& grid, const GdnArgs& a, const Tab& t, cudaStream_t stream) {
  const int rows = (a.s.dk + kRowGroups - 1) / kRowGroups;  // state rows per thread, 1..8
  auto go = [&](auto kernel) { launch_pdl(kernel, grid, dim3(kThreads), 0, stream, a, t); };
  if (rows <= 1)
    vec ? go(gdn_rows_kernel<1, true, COMMIT, CONV, Tab>) : go(gdn_rows_kernel<1, false, COMMIT, CONV, Tab>);
  else if (rows <= 2)
    vec ? go(gdn_rows_kernel<2, true, COMMIT, CONV, Tab>) : go(gdn_rows_kernel<2, false, COMMIT, CONV, Tab>);
  else if (rows <= 4)
    vec ? go(gdn_rows_kernel<4, true, COMMIT, CONV, Tab>) : go(gdn_rows_kernel<4, false, COMMIT, CONV, Tab>);
  else
    vec ? go(gdn_rows_kernel<8, true, COMMIT, CONV, Tab>) : go(gdn_rows_kernel<8, false, COMMIT, CONV, Tab>);
}

// Whether gdn_step_rows in Log mode convolves inside the step kernel (LILAC_GDN_LOG_CONV=0: in its own
// launch, as in Advance mode; for measurement).
bool log_conv_inside() {
  static const bool on = env_switch_on("LILAC_GDN_LOG_CONV");
  return on;
}
// Whether the Advance step takes the slice-major grid (LILAC_GDN_SLICE_MAJOR=0: the head-major one; measurement).
bool slice_major_on() {
  static const bool on = env_switch_on("LILAC_GDN_SLICE_MAJOR");
  return on;
}

// Slices per block of the slice-major Advance step: 4 (LILAC_GDN_SLICES=1 for one, the measurement's switch). At 64
// rows the step 115 -> 103 us and the batched step +3.6 % at 64 streams, +1.9 % at 32, +0.3 % at 16; 2 slices got
// about half of that (H100, bench/BENCHMARKS.md "Stop 65").
int slices_per_block() {
  static const int sp = [] {
    const char* e = std::getenv("LILAC_GDN_SLICES");
    return e && std::atoi(e) == 1 ? 1 : 4;
  }();
  return sp;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

void gdn_step_rows(const GdnRowsShape& s, const GdnLayer& layer, const GdnPool& pool, int M, const int32_t* row_slot,
                   const float* proj, int64_t proj_stride, float* out, int64_t out_stride, GdnMode mode,
                   float* conv_out, cudaStream_t stream) {
  check_shape(s);
  LILAC_CHECK(M >= 1 && M <= kMaxRows, "rows gdn: M must be 1.." + std::to_string(kMaxRows));
  LILAC_CHECK(mode == GdnMode::Advance || (layer.log != nullptr && pool.log_rows > 0),
              "rows gdn: Log mode needs a log (GdnLayer::log, GdnPool::log_rows)");
  GdnArgs a;
  a.s = s;
  a.pool = pool;
  a.M = M;
  a.row_slot = row_slot;
  a.x = proj;
  a.x_stride = proj_stride;
  a.b_off = s.conv_dim() + int64_t(s.Hv) * s.dv;
  a.a_off = a.b_off + s.Hv;
  a.out = out;
  a.out_stride = out_stride;
  a.log = mode == GdnMode::Log ? 1 : 0;
  LILAC_CHECK(conv_out != nullptr, "rows gdn: conv_out ([M][conv_dim] floats of scratch) is required");
  a.cv = conv_out;
  OneLayer t;
  t.l[0] = layer;
  const bool vec = s.dv % 4 == 0 && aligned16(layer.state) && pool.state_stride % 4 == 0;
  const dim3 grid(unsigned(s.Hv), unsigned((s.dv + kCols - 1) / kCols), unsigned(M));
  if (a.log && log_conv_inside()) {
    // Log mode leaves the conv state as it is, so the step's blocks need no counter to convolve their own
    // channels (q/k recomputed per value head and slice): one launch, one dependency fewer per layer.
    launch<false, true>(vec, grid, a, t, stream);
    return;
  }
  launch_pdl(gdn_conv_rows_kernel, dim3(unsigned((s.conv_dim() + kConvThreads - 1) / kConvThreads), unsigned(M)),
             dim3(kConvThreads), 0, stream, a, t);
  if (vec && (s.dk + kRowGroups - 1) / kRowGroups == 4 && slice_major_on()) {  // R = 4: dk 97..128 (the model's 128)
    const int sp = slices_per_block();
    const dim3 g((grid.y + sp - 1) / sp, grid.x, grid.z);
    if (sp == 4)
      launch_pdl(gdn_rows_kernel<4, true, false, false, OneLayer, true, 4>, g, dim3(kThreads), 0, stream, a, t);
    else
      launch_pdl(gdn_rows_kernel<4, true, false, false, OneLayer, true>, g, dim3(kThreads), 0, stream, a, t);
    return;
  }
  launch<false, false>(vec, grid, a, t, stream);
}

void gdn_commit_rows(const GdnRowsShape& s, const GdnLayer* layers, int n_layers, const GdnPool& pool, int n_seq,
                     const int32_t* seq_slot, const int32_t* seq_keep, cudaStream_t stream) {
  check_shape(s);
  LILAC_CHECK(n_layers >= 1 && n_layers <= kGdnMaxLayers,
              "rows gdn commit: 1.." + std::to_string(kGdnMaxLayers) + " layers");
  LILAC_CHECK(n_seq >= 1 && n_seq <= kMaxRows, "rows gdn commit: 1.." + std::to_string(kMaxRows) + " sequences");
  LILAC_CHECK(pool.log_rows > 0, "rows gdn commit: no log rows");
  GdnArgs a;
  a.s = s;
  a.pool = pool;
  a.n_seq = n_seq;
  a.seq_slot = seq_slot;
  a.seq_keep = seq_keep;
  LayerTable t;
  bool vec = s.dv % 4 == 0 && pool.state_stride % 4 == 0;
  for (int i = 0; i < n_layers; ++i) {
    LILAC_CHECK(layers[i].log != nullptr, "rows gdn commit: layer " + std::to_string(i) + " has no log");
    LILAC_CHECK(layers[i].conv_sync != nullptr, "rows gdn commit: layer " + std::to_string(i) + " has no conv_sync");
    t.l[i] = layers[i];
    vec = vec && aligned16(layers[i].state);
  }
  launch<true, true>(vec, dim3(unsigned(s.Hv), unsigned((s.dv + kCols - 1) / kCols), unsigned(n_layers * n_seq)), a,
                     t, stream);
}

}  // namespace lilac::cuda::rows
