// MoE decode on the tensor cores (gemv_tc.h: moe_gate_up_tc / moe_down_tc): the routed experts' and the shared
// expert's gate/up with SwiGLU, and down with the weighted combine, for one token. The arithmetic and the device
// pieces are the dense kernel's (gemv_tc.cuh; gemv_tc.cu explains the scheme).
#include <algorithm>

#include "cuda/kernels/gemv/gemv_tc.cuh"
#include "cuda/kernels/gemv/gemv_tc.h"
#include "cuda/kernels/launch.cuh"

namespace lilac::cuda {
namespace {

// The shared expert's three matrices into L2, by the whole grid before gate/up's PDL wait: they need no routing, and
// the HBM idles behind the router and the routing, where down's shared segment and gate/up's shared groups would
// otherwise join the routed experts' burst (stop 60: +0.8-1.4 % at one row; the next layer's input projection
// requested the same way costs instead: bench/BENCHMARKS.md "MoE rows kernels through cp.async rings; an L2
// prefetch of the next layer").
__device__ __forceinline__ void prefetch_shared_expert(const MoEDecodeWeights& w) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, nt = int64_t(gridDim.x) * blockDim.x;
  dev::for_shared_expert_spans(w, [&](const void* p, int64_t bytes) { dev::prefetch_l2(p, bytes, t, nt); });
}

// The block's SM id into phase-trace slot k (the trace's readers: which blocks shared an SM; gemv_tc.h).
__device__ __forceinline__ void tc_smid(int k) {
  if (g_tc_trace != nullptr && threadIdx.x == 0) {
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    g_tc_trace[blockIdx.x * 8 + k] = sm;
  }
}

// The RMSNorm staging of gate/up's input by warps 1..7 while warp 0 routes: stage_issue + stage_compute's values in
// stage_compute's order (the same bits). stage_compute's thread v (0..255) is lane v % 32 of virtual warp v / 32;
// warp w >= 1 runs virtual warp w and warp 1 also virtual warp 0, so every per-thread sum, warp butterfly and the
// block's sum red[0] + ... + red[7] (block_sum's order) are the same operations on the same values. The norm
// weights were requested before the PDL wait (by these warps). Named barrier 1 over the 224 threads; the caller's
// __syncthreads publishes the fragments to warp 0. Routing and staging were one after the other before (stop 58's
// phase marks: 2.7 µs of one warp's routing, then the staging's 1.5-2 µs).
template <int BITS>
__device__ void stage_rms_beside_routing(const StageIn& in, const TcSmem& m, int K, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int KT = tc_kt(K), n8 = K / 8, n8t = KT * kTileCols / 8;
  constexpr int kStagers = kThreads - 32;
  for (int i = threadIdx.x - 32; i < K / 4; i += kStagers) cp_async16(m.xs + 4 * i, in.x + 4 * i);
  for (int i = threadIdx.x - 32; i < kZeroBytes / 16; i += kStagers)  // zero block + units past K
    reinterpret_cast<uint4*>(m.xf + KT * kTileXBytes)[i] = make_uint4(0, 0, 0, 0);
  auto bar = [] { asm volatile("bar.sync 1, %0;\n" ::"n"(kStagers) : "memory"); };
  cp_async_wait_all();
  bar();
  auto vsum = [&](int vw) {
    float ss = 0.f;
    for (int t = vw * 32 + lane; t < n8; t += kThreads) ss += unit_sumsq(m.xs, t);
    return warp_sum(ss);
  };
  const float own = vsum(warp);
  if (lane == 0) red[warp] = own;
  if (warp == 1) {
    const float w0 = vsum(0);
    if (lane == 0) red[0] = w0;
  }
  bar();
  float tot = 0.f;
  for (int i = 0; i < kWarps; ++i) tot += red[i];
  const float scale = rsqrtf(tot / float(K) + in.eps);
  for (int pass = 0; pass < (warp == 1 ? 2 : 1); ++pass) {
    const int vw = pass == 0 ? warp : 0;
    for (int t0 = 0; t0 < n8t; t0 += kThreads) stage_unit<BITS>(in, m, t0 + vw * 32 + lane, n8, n8t, scale);
  }
}

// ------------------------------------------------------------------------------------------------ MoE gate/up
// Routing (warp 0) beside the RMSNorm of x (warps 1..7), then per group (slot e in 0..k: the k routed experts and
// the shared one; 16 rows j): row block 0 = gate rows, row block 1 = up rows, 4 k-slices each; epilogue
// act[e·I + j] = silu(gate)·up. The first two tiles are requested after the routing and the staging (the barrier);
// before the PDL wait the grid requests the shared expert's matrices into L2 (prefetch_shared_expert).
// (Phase marks: 2 warp 0's routing done, 5 routing and staging done, 3 the first two tiles issued.)
template <int BITS>
__global__ void __launch_bounds__(kThreads, kMinBlocks<BITS>)
    moe_gate_up_tc_kernel(MoEDecodeWeights w, const float* logits, const float* x, const float* norm_w, float eps,
                          int32_t* sel_ids, float* sel_w, float* act) {
  constexpr int KS = 4;
  extern __shared__ float4 smem4[];
  __shared__ float red[32];
  __shared__ int s_ids[32];
  __shared__ float s_w[33];
  __shared__ float part[2][kWarps][16];
  const int K = int(w.gate.first.cols), KT = tc_kt(K), ngroups_k = K / kGroup;
  const TcSmem m = carve(reinterpret_cast<char*>(smem4), K, Prologue::RmsNorm, 0);
  const char* zero = m.xf + KT * kTileXBytes;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int rbw = warp / KS, ks = warp % KS;  // rbw 0: gate, 1: up
  const int iters = (KT + KS - 1) / KS;
  const int I = int(w.gate.first.rows), Is = int(w.shared_gate.rows);
  const int nbI = (I + 15) / 16, nbS = (Is + 15) / 16;
  const int64_t ngrp = int64_t(w.top_k) * nbI + nbS;
  const LaneB<BITS> lb(lane);
  StageIn in;
  in.x = x;
  in.norm_w = norm_w;
  in.pro = Prologue::RmsNorm;
  in.eps = eps;

  tc_mark(0);
  tc_smid(6);
  if (warp > 0)  // the norm weights (written by no kernel of the step) before the wait, by the staging warps
    for (int i = threadIdx.x - 32; i < K / 4; i += kThreads - 32) cp_async16(m.nws + 4 * i, norm_w + 4 * i);
  prefetch_shared_expert(w);  // weights: written by no kernel
  pdl_wait();
  tc_mark(1);
  if (warp == 0) {
    route_warp(logits, w.E, w.top_k, w.renormalise, s_ids, s_w, sel_ids, sel_w);
    tc_mark(2);
    if (blockIdx.x == 0) __threadfence();  // the ids are global before this block's trigger (MoE down reads them early)
  } else {
    stage_rms_beside_routing<BITS>(in, m, K, red);
  }
  __syncthreads();  // s_ids, the staged fragments
  pdl_trigger();
  tc_mark(5);

  // group → (slot, first row j0, rows of this slot's matrices)
  auto slot_of = [&](int64_t grp, int& slot, int& j0, int& nrows) {
    if (grp < int64_t(w.top_k) * nbI) {
      slot = int(grp / nbI);
      j0 = int(grp % nbI) * 16;
      nrows = I;
    } else {
      slot = w.top_k;
      j0 = int(grp - int64_t(w.top_k) * nbI) * 16;
      nrows = Is;
    }
  };
  auto next = [&](Step s2) { return next_step(s2, iters); };
  auto load = [&](TileRegs<BITS>& t, Step st) {
    if (st.grp < ngrp && ks + st.j * KS < KT) {
      int slot, j0, nrows;
      slot_of(st.grp, slot, j0, nrows);
      const QMatrixDev M = slot < w.top_k ? (rbw == 0 ? w.gate.expert(s_ids[slot]) : w.up.expert(s_ids[slot]))
                                          : (rbw == 0 ? w.shared_gate : w.shared_up);
      RowRef r[2];
      r[0] = row_ref(M, min(j0 + g, nrows - 1), BITS);
      r[1] = row_ref(M, min(j0 + g + 8, nrows - 1), BITS);
      load_tile<BITS>(t, r, ks + st.j * KS, c, ngroups_k);
    }
  };
  Step st{blockIdx.x, 0};
  TileRegs<BITS> t0, t1;  // swapping roles each step, as in the dense kernel
  load(t0, st);
  load(t1, next(st));
  bool nxt_loaded = true;
  tc_mark(3);

  float acc[2] = {0.f, 0.f};
  int par = 0;
  auto step = [&](const TileRegs<BITS>& cur, TileRegs<BITS>& nxt) {
    if (st.grp >= ngrp) return false;
    const Step ns = next(st);
    if (!nxt_loaded) load(nxt, ns);
    nxt_loaded = false;
    const int kt = ks + st.j * KS;
    if (kt < KT) tile_accumulate<BITS>(cur, m, zero, kt, c, ngroups_k, lb, acc);
    if (ns.j == 0) {
      write_partials(acc, part[par][warp], g, c);
      __syncthreads();
      if (threadIdx.x < 16) {
        int slot, j0, nrows;
        slot_of(st.grp, slot, j0, nrows);
        const int rr = threadIdx.x;
        if (j0 + rr < nrows) {
          float gv = 0.f, uv = 0.f;
#pragma unroll
          for (int s2 = 0; s2 < KS; ++s2) {
            gv += part[par][s2][rr];
            uv += part[par][KS + s2][rr];
          }
          act[int64_t(slot) * I + j0 + rr] = silu_f(gv) * uv;
        }
      }
      tc_mark(4);
      par ^= 1;
    }
    st = ns;
    return true;
  };
  while (step(t0, t1) && step(t1, t0)) {
  }
  tc_mark(7);
}

// ------------------------------------------------------------------------------------------------ MoE down
// y[r] += Σ_e sel_w[e] · down_e[r] · act_e over the k routed experts and the shared one, as one GEMV
// over the concatenated input act [k·I + Is]: each 64-group belongs to one segment (expert), whose
// matrix and row stride are looked up per group. 8 warps = 8 k-slices of one row block; each group value goes
// to shared memory, and at the end of the row block each expert's sum P_e (four chains a_σ over its own
// k-tiles, (a0 + a1) + (a2 + a3)) and the weighted chain over the experts give y (rows_mm.h): an order in which
// the multi-row kernels can hand over one sum per row, expert and output instead of every group value.
struct DownSeg {
  const char* q;
  const unsigned short* s;
  const unsigned short* b;
  int row_bytes, gpr;
  float wt;
};

template <int BITS>
__device__ __forceinline__ void load_tile_down(TileRegs<BITS>& t, const DownSeg* seg, int gI, int k, int64_t rg,
                                               int64_t rg8, int kt, int c, int ngroups) {
  using S = TcShape<BITS>;
#pragma unroll
  for (int i = 0; i < S::NCH; ++i) {
    const int G = kt * 4 + S::slot(i, c);
    const bool ok = G < ngroups;
    const int e = G < k * gI ? G / gI : k;
    const int Gl = G - e * gI;
    const DownSeg& sg = seg[ok ? e : 0];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t r = h == 0 ? rg : rg8;
      t.w[h][i] = ok ? ld_stream(reinterpret_cast<const uint4*>(sg.q + r * sg.row_bytes + Gl * S::GROUP_BYTES +
                                                                 S::off_in_group(c)))
                     : make_uint4(0, 0, 0, 0);
    }
  }
  const int G = kt * 4 + c;
  const int e = G < k * gI ? G / gI : k;
  const int Gl = G - e * gI;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t r = h == 0 ? rg : rg8;
    if (G < ngroups) {
      const DownSeg& sg = seg[e];
      t.s[h] = __ldg(sg.s + r * sg.gpr + Gl);
      t.b[h] = __ldg(sg.b + r * sg.gpr + Gl);
    } else {
      t.s[h] = t.b[h] = 0;
    }
  }
}

template <int BITS>
__global__ void __launch_bounds__(kThreads, kMinBlocks<BITS>)
    moe_down_tc_kernel(MoEDecodeWeights w, const int32_t* sel_ids, const float* sel_w, const float* act, float* y) {
  constexpr int KS = kWarps;
  extern __shared__ float4 smem4[];
  __shared__ float red[32];
  __shared__ DownSeg seg[33];
  __shared__ float epi_y[16];
  const int I = int(w.down.first.cols), Is = int(w.shared_down.cols), k = w.top_k;
  const int K = k * I + Is, KT = tc_kt(K), ngroups_k = K / kGroup, gI = I / kGroup, gS = Is / kGroup;
  const TcSmem m = carve(reinterpret_cast<char*>(smem4), K, Prologue::None, 0);
  // After the staging the input floats are dead: their K floats hold the row block's group values [ngroups][16]
  // and the experts' sums [k + 1][16] (together at most K / 2 floats).
  float* gvs = m.xs;
  float* pes = m.xs + ngroups_k * 16;
  const char* zero = m.xf + KT * kTileXBytes;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int ks = warp;
  const int iters = (KT + KS - 1) / KS;
  const int64_t rows = w.down.first.rows, nrb = (rows + 15) / 16;
  const LaneB<BITS> lb(lane);
  StageIn in;
  in.x = act;

  // The segment table and the first two tiles are set up before the PDL wait from the expert ids that
  // MoE gate/up's block 0 publishes before its trigger (read past L1, clamped to a valid expert), and
  // checked again after the wait: if they changed (this kernel did not follow a gate/up that published
  // them, e.g. without PDL), the table and tiles are redone. Weights only are read before the wait.
  auto set_seg = [&](int t, int id, float wt) {
    const QMatrixDev M = t < k ? w.down.expert(min(max(id, 0), w.E - 1)) : w.shared_down;
    DownSeg sg;
    sg.q = reinterpret_cast<const char*>(M.qweight);
    sg.s = reinterpret_cast<const unsigned short*>(M.scales);
    sg.b = reinterpret_cast<const unsigned short*>(M.biases);
    sg.row_bytes = int(M.cols * BITS / 8);
    sg.gpr = int(M.cols / kGroup);
    sg.wt = wt;
    seg[t] = sg;
  };
  auto next = [&](Step s2) { return next_step(s2, iters); };
  auto load = [&](TileRegs<BITS>& t, Step s2) {
    if (s2.grp < nrb && ks + s2.j * KS < KT)
      load_tile_down<BITS>(t, seg, gI, k, min(s2.grp * 16 + g, rows - 1), min(s2.grp * 16 + g + 8, rows - 1),
                           ks + s2.j * KS, c, ngroups_k);
  };
  tc_mark(0);
  tc_smid(6);
  int early_id = 0;
  float early_w = 0.f;
  if (threadIdx.x <= k) {
    const int t = threadIdx.x;
    early_id = t < k ? __ldcg(sel_ids + t) : 0;
    early_w = __ldcg(sel_w + t);
    set_seg(t, early_id, early_w);
  }
  __syncthreads();  // seg
  Step st{blockIdx.x, 0};
  TileRegs<BITS> t0, t1;  // swapping roles each step, as in the dense kernel
  load(t0, st);
  load(t1, next(st));
  pdl_wait();
  pdl_trigger();
  tc_mark(1);
  stage_issue(in, m, K);
  auto y_fetch = [&](int64_t grp) {
    if (threadIdx.x < 16 && grp < nrb && grp * 16 + threadIdx.x < rows) cp_async4(&epi_y[threadIdx.x], y + grp * 16 + threadIdx.x);
  };
  y_fetch(st.grp);
  // the re-read of the ids is in flight while the input is staged
  int id = 0;
  float wt = 0.f;
  if (threadIdx.x <= k) {
    id = threadIdx.x < k ? __ldcg(sel_ids + threadIdx.x) : 0;
    wt = __ldcg(sel_w + threadIdx.x);
  }
  stage_compute<BITS>(in, m, K, red);  // (its barriers: every thread's pre-wait reads of seg are done)
  tc_mark(3);
  bool changed = false;
  if (threadIdx.x <= k && (id != early_id || __float_as_uint(wt) != __float_as_uint(early_w))) {
    seg[threadIdx.x].wt = wt;
    if (id != early_id) {
      set_seg(threadIdx.x, id, wt);
      changed = true;
    }
  }
  if (__syncthreads_or(changed)) {  // seg
    load(t0, st);
    load(t1, next(st));
  }
  tc_mark(5);
  bool nxt_loaded = true;

  auto step = [&](const TileRegs<BITS>& cur, TileRegs<BITS>& nxt) {
    if (st.grp >= nrb) return false;
    const Step ns = next(st);
    if (!nxt_loaded) load(nxt, ns);
    nxt_loaded = false;
    const int kt = ks + st.j * KS;
    if (kt < KT) tile_group_values<BITS>(cur, m, zero, kt, c, ngroups_k, lb, gvs, g);
    if (ns.j == 0) {
      cp_async_wait_all();
      __syncthreads();  // gvs complete
      tc_mark(2);
      for (int q = threadIdx.x; q < (k + 1) * 16; q += kThreads) {  // q = 16·e + row
        const int e = q / 16, r = q % 16, G0 = e * gI, ng = e < k ? gI : gS;
        // four chains over the groups l ≡ σ (mod 4), in l order; a tail of up to 3 groups guarded (an index
        // a4[l & 3] in a loop unrolled over a run-time count kept a4 on the stack: stop 67's SASS survey)
        const float* gv = gvs + G0 * 16 + r;
        float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
        int l = 0;
#pragma unroll 2
        for (; l + 4 <= ng; l += 4) {
          a0 = fmaf(1.f, gv[l * 16], a0);
          a1 = fmaf(1.f, gv[(l + 1) * 16], a1);
          a2 = fmaf(1.f, gv[(l + 2) * 16], a2);
          a3 = fmaf(1.f, gv[(l + 3) * 16], a3);
        }
        if (l < ng) a0 = fmaf(1.f, gv[l * 16], a0);
        if (l + 1 < ng) a1 = fmaf(1.f, gv[(l + 1) * 16], a1);
        if (l + 2 < ng) a2 = fmaf(1.f, gv[(l + 2) * 16], a2);
        pes[q] = (a0 + a1) + (a2 + a3);
      }
      __syncthreads();  // pes complete; gvs read no more
      tc_mark(4);
      if (threadIdx.x < 16) {
        const int64_t r = st.grp * 16 + threadIdx.x;
        if (r < rows) {
          float v = 0.f;
#pragma unroll 8
          for (int e = 0; e <= k; ++e) v = fmaf(seg[e].wt, pes[e * 16 + threadIdx.x], v);
          y[r] = epi_y[threadIdx.x] + v;
        }
      }
      y_fetch(ns.grp);
    }
    st = ns;
    return true;
  };
  while (step(t0, t1) && step(t1, t0)) {
  }
  tc_mark(7);
}

}  // namespace

void moe_tc_trace(unsigned long long* buf) {
  LILAC_CUDA_CHECK(cudaMemcpyToSymbol(g_tc_trace, &buf, sizeof(buf)));
}

bool moe_tc_supported(const MoEDecodeWeights& w, const float* x, const float* norm_w, const float* act) {
  const int64_t n_act = w.top_k * w.down.first.cols + w.shared_down.cols;
  return shape_ok(w.gate.first) && shape_ok(w.up.first) && shape_ok(w.shared_gate) && shape_ok(w.shared_up) &&
         shape_ok(w.down.first) && shape_ok(w.shared_down) && w.gate.first.bits == w.down.first.bits &&
         aligned16(x) && aligned16(norm_w) && aligned16(act) &&
         size_t(tc_smem_bytes(int(w.gate.first.cols), Prologue::RmsNorm, 0)) <= kMaxSmem &&
         size_t(tc_smem_bytes(int(n_act), Prologue::None, 0)) <= kMaxSmem;
}

void moe_gate_up_tc(const MoEDecodeWeights& w, const float* logits, const float* x, const float* norm_w, float eps,
                    int32_t* sel_ids, float* sel_w, float* act, cudaStream_t stream) {
  const int K = int(w.gate.first.cols);
  const size_t smem = size_t(tc_smem_bytes(K, Prologue::RmsNorm, 0));
  const int64_t groups = int64_t(w.top_k) * ((w.gate.first.rows + 15) / 16) + (w.shared_gate.rows + 15) / 16;
  auto go = [&](auto kernel) {
    launch_pdl(kernel, dim3(grid_of(groups, resident_blocks(kernel, smem))), dim3(kThreads), smem, stream, w, logits,
               x, norm_w, eps, sel_ids, sel_w, act);
  };
  if (w.gate.first.bits == 4)
    go(moe_gate_up_tc_kernel<4>);
  else
    go(moe_gate_up_tc_kernel<8>);
}

void moe_down_tc(const MoEDecodeWeights& w, const int32_t* sel_ids, const float* sel_w, const float* act, float* y,
                 cudaStream_t stream) {
  const int K = int(w.top_k * w.down.first.cols + w.shared_down.cols);
  const size_t smem = size_t(tc_smem_bytes(K, Prologue::None, 0));
  const int64_t groups = (w.down.first.rows + 15) / 16;
  auto go = [&](auto kernel) {
    launch_pdl(kernel, dim3(grid_of(groups, resident_blocks(kernel, smem))), dim3(kThreads), smem, stream, w, sel_ids,
               sel_w, act, y);
  };
  if (w.down.first.bits == 4)
    go(moe_down_tc_kernel<4>);
  else
    go(moe_down_tc_kernel<8>);
}

}  // namespace lilac::cuda
