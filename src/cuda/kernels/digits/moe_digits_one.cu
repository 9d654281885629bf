// The digits MoE for one row (moe_digits.h): gate/up with the routing and the input's RMSNorm and digits in the
// kernel, down with act's digits and the weighted combine in the kernel; and the shape check. bench/GPU_NOTES.md
// ("Fourteenth stop") has the measurements.
#include "cuda/kernels/digits/moe_digits.h"

#include <algorithm>

#include "core/error.h"
#include "cuda/cuda_common.h"
#include "cuda/kernels/digits/moe_digits.cuh"
#include "cuda/kernels/gemv/gemv_common.cuh"
#include "cuda/kernels/qdot.cuh"
#include "cuda/kernels/tc_common.cuh"

namespace lilac::cuda::digits {
namespace {

using namespace moe_dev;

// The row in xs (K floats, its copies landed and a barrier passed) → RMSNorm with nws → its digits and meta in
// shared memory (stage_rows.cu's arithmetic for t(x): the same 256-thread partial sums and block reduction).
__device__ __forceinline__ void stage_rmsnorm_digits(const float* xs, const float* nws, int K, float eps, float* red,
                                                     char* dig, float2* meta) {
  const int G = K / 64;
  const int n8 = K / 8;
  float ss = 0.f;
  for (int t = threadIdx.x; t < n8; t += kThreads) {
    const float4 p = reinterpret_cast<const float4*>(xs)[2 * t], q = reinterpret_cast<const float4*>(xs)[2 * t + 1];
    ss += p.x * p.x + p.y * p.y + p.z * p.z + p.w * p.w + q.x * q.x + q.y * q.y + q.z * q.z + q.w * q.w;
  }
  ss = block_sum(ss, red);
  const float scale = rsqrtf(ss / float(K) + eps);
  for (int t0 = 0; t0 < n8; t0 += kThreads) {
    const int t = t0 + threadIdx.x;
    float v[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (t < n8) {
      float w8[8];
      row8(xs, t, v);
      row8(nws, t, w8);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = v[j] * scale * w8[j];
    }
    tile::put_digits(v, t < n8, t, G, dig, meta);
  }
}

// ------------------------------------------------------------------------------------------------ one row
// gate/up: the routing (warp 0) and the RMSNorm'd input's digits in shared memory, then per item (slot, 16-row
// block): warps 0-3 the gate rows' 8-group slices 0-3, warps 4-7 the up rows'; each warp's 8 tiles of the next
// item are requested while it computes the current one. VEC (whole 8-group slices, G % 8 == 0): a slice's
// scales and biases of a row as one 16-byte load each instead of 8 two-byte loads.
template <bool VEC>
__global__ void __launch_bounds__(kThreads, 2)
    gate_up_one_kernel(MoEDecodeWeights w, const float* logits, const float* x, const float* norm_w, float eps,
                       int32_t* sel_ids, float* sel_w, float* act) {
  extern __shared__ uint4 sm4[];
  __shared__ float red[32];
  __shared__ int s_ids[kMaxSlots];
  __shared__ float s_w[kMaxSlots + 1];
  __shared__ float part[2][kWarps][16];
  const int K = int(w.gate.first.cols), G = K / 64, nsl = (G + kSlice - 1) / kSlice;
  float* xs = reinterpret_cast<float*>(sm4);
  float* nws = xs + K;
  char* dig = reinterpret_cast<char*>(nws + K);
  float2* meta = reinterpret_cast<float2*>(dig + kL * G * 64);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g8 = lane >> 2, c = lane & 3;
  const int half = warp >> 2, ks = warp & 3;
  const int gbeg = ks * kSlice, ng = ks < nsl ? min(kSlice, G - gbeg) : 0;
  const int k = w.top_k, I = int(w.gate.first.rows), Is = int(w.shared_gate.rows);
  const int nbI = (I + 15) / 16, nbS = (Is + 15) / 16, ngrp = k * nbI + nbS;

  for (int i = threadIdx.x; i < K / 4; i += kThreads) cp_async16(nws + 4 * i, norm_w + 4 * i);
  pdl_wait();
  for (int i = threadIdx.x; i < K / 4; i += kThreads) cp_async16(xs + 4 * i, x + 4 * i);
  if (warp == 0) {
    ::lilac::cuda::dev::route_warp(logits, w.E, k, w.renormalise, s_ids, s_w, sel_ids, sel_w);
    if (blockIdx.x == 0) __threadfence();  // the ids are global before this block's trigger (down reads them early)
  }
  __syncthreads();  // s_ids
  pdl_trigger();

  auto slot_of = [&](int grp, int& slot, int& j0, int& nrows) {
    if (grp < k * nbI) {
      slot = grp / nbI;
      j0 = (grp % nbI) * 16;
      nrows = I;
    } else {
      slot = k;
      j0 = (grp - k * nbI) * 16;
      nrows = Is;
    }
  };
  auto src = [&](int grp) {
    int slot, j0, nrows;
    slot_of(grp, slot, j0, nrows);
    const QMatrixDev m = slot < k ? (half == 0 ? w.gate.expert(s_ids[slot]) : w.up.expert(s_ids[slot]))
                                  : (half == 0 ? w.shared_gate : w.shared_up);
    return src_of(m, j0, g8, c);
  };
  Tile T[VEC ? 1 : kSlice];
  uint2 Q0[kSlice], Q1[kSlice];
  uint4 SV[4];
  auto fetch_slice = [&](const Src& s) {
#pragma unroll
    for (int i = 0; i < kSlice; ++i) {
      Q0[i] = ld_stream8(s.q0 + (gbeg + i) * 32);
      Q1[i] = ld_stream8(s.q1 + (gbeg + i) * 32);
    }
    SV[0] = __ldg(reinterpret_cast<const uint4*>(s.s0 + gbeg));
    SV[1] = __ldg(reinterpret_cast<const uint4*>(s.b0 + gbeg));
    SV[2] = __ldg(reinterpret_cast<const uint4*>(s.s1 + gbeg));
    SV[3] = __ldg(reinterpret_cast<const uint4*>(s.b1 + gbeg));
  };
  int grp = blockIdx.x;
  if (grp < ngrp && ng > 0) {
    const Src s0 = src(grp);
    if constexpr (VEC) {
      fetch_slice(s0);
    } else {
#pragma unroll
      for (int i = 0; i < kSlice; ++i)
        if (i < ng) T[i] = fetch(s0, gbeg + i);
    }
  }

  // the RMSNorm and the digits
  cp_async_wait_all();
  __syncthreads();
  stage_rmsnorm_digits(xs, nws, K, eps, red, dig, meta);
  __syncthreads();

  const uint32_t xb = smem_u32(dig) + uint32_t(min(g8, 2) * G * 64 + c * 16);
  int par = 0;
  for (; grp < ngrp; grp += gridDim.x) {
    const int nxt = grp + int(gridDim.x);
    float a0 = 0.f, a1 = 0.f;
    if (VEC && ng > 0) {
      const uint4 cs0 = SV[0], cb0 = SV[1], cs1 = SV[2], cb1 = SV[3];
      Src ns{};
      if (nxt < ngrp) {
        ns = src(nxt);
        SV[0] = __ldg(reinterpret_cast<const uint4*>(ns.s0 + gbeg));
        SV[1] = __ldg(reinterpret_cast<const uint4*>(ns.b0 + gbeg));
        SV[2] = __ldg(reinterpret_cast<const uint4*>(ns.s1 + gbeg));
        SV[3] = __ldg(reinterpret_cast<const uint4*>(ns.b1 + gbeg));
      }
#pragma unroll
      for (int i = 0; i < kSlice; ++i) {
        const int g = gbeg + i;
        const uint2 c0 = Q0[i], c1 = Q1[i];
        if (nxt < ngrp) {
          Q0[i] = ld_stream8(ns.q0 + g * 32);
          Q1[i] = ld_stream8(ns.q1 + g * 32);
        }
        const uint4 b = g8 < kL ? lds128(xb + g * 64) : make_uint4(0u, 0u, 0u, 0u);
        int S0, S1;
        tile::tile_dots_one(make_uint4(c0.x, c1.x, c0.y, c1.y), b, S0, S1);
        const float2 mt = meta[g];
        a0 = tile::fold(a0, bf_half(cs0, i), bf_half(cb0, i), S0, mt.x, mt.y);
        a1 = tile::fold(a1, bf_half(cs1, i), bf_half(cb1, i), S1, mt.x, mt.y);
      }
      if (c == 0) {
        part[par][warp][g8] = a0;
        part[par][warp][g8 + 8] = a1;
      }
    } else if (!VEC && ng > 0) {
      Src ns{};
      if (nxt < ngrp) ns = src(nxt);
#pragma unroll
      for (int i = 0; i < kSlice; ++i)
        if (i < ng) {
          const Tile t = T[i];
          if (nxt < ngrp) T[i] = fetch(ns, gbeg + i);
          const int g = gbeg + i;
          const uint4 b = g8 < kL ? lds128(xb + g * 64) : make_uint4(0u, 0u, 0u, 0u);
          int S0, S1;
          tile::tile_dots_one(wq(t), b, S0, S1);
          const float2 mt = meta[g];
          a0 = tile::fold(a0, bf_lo(t.s0), bf_lo(t.b0), S0, mt.x, mt.y);
          a1 = tile::fold(a1, bf_lo(t.s1), bf_lo(t.b1), S1, mt.x, mt.y);
        }
      if (c == 0) {
        part[par][warp][g8] = a0;
        part[par][warp][g8 + 8] = a1;
      }
    }
    __syncthreads();  // part[par]
    if (threadIdx.x < 16) {
      int slot, j0, nrows;
      slot_of(grp, slot, j0, nrows);
      const int rr = threadIdx.x;
      if (j0 + rr < nrows) {
        float gv = 0.f, uv = 0.f;
        for (int s = 0; s < nsl; ++s) {
          gv += part[par][s][rr];
          uv += part[par][4 + s][rr];
        }
        act[int64_t(slot) * I + j0 + rr] = silu_f(gv) * uv;
      }
    }
    par ^= 1;
  }
}

// down: act's digits in shared memory, then per item (a 16-row block of H) the concatenated input's groups
// spread over the warps (group g to warp g % 8), each group's value per output row into shared memory, the
// experts' sums P_e in group order and the weighted sum in slot order (moe_combine_rows's).
struct DSeg {
  const char* q;
  const unsigned short* s;
  const unsigned short* b;
  int row_bytes, gpr;
  float wt;
};

// (One block per SM suffices: H / 16 items. 160 registers hold 9 tiles in flight without spilling and leave a
// third of the register file to the kernels PDL launches beside it.)
template <int NT>
__global__ void __maxnreg__(160)
    down_one_kernel(MoEDecodeWeights w, const int32_t* sel_ids, const float* sel_w, const float* act, float* y) {
  extern __shared__ uint4 sm4[];
  __shared__ DSeg seg[kMaxSlots + 1];
  __shared__ float epi_y[16];
  const int I = int(w.down.first.cols), Is = int(w.shared_down.cols), k = w.top_k;
  const int H = int(w.down.first.rows), nrb = (H + 15) / 16;
  const int K = k * I + Is, G = K / 64, gI = I / 64, gS = Is / 64;
  float* xs = reinterpret_cast<float*>(sm4);
  char* dig = reinterpret_cast<char*>(xs + K);
  float2* meta = reinterpret_cast<float2*>(dig + kL * G * 64);
  float* gvs = reinterpret_cast<float*>(meta + G);
  float* pes = gvs + G * 16;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g8 = lane >> 2, c = lane & 3;

  // The segment table and the first tiles from the expert ids gate/up's block 0 publishes before its trigger
  // (clamped to a valid expert), checked again after the wait (moe_down_tc's scheme); weights only before it.
  auto set_seg = [&](int t, int id, float wt) {
    const QMatrixDev m = t < k ? w.down.expert(min(max(id, 0), w.E - 1)) : w.shared_down;
    DSeg sg;
    sg.q = reinterpret_cast<const char*>(m.qweight);
    sg.s = reinterpret_cast<const unsigned short*>(m.scales);
    sg.b = reinterpret_cast<const unsigned short*>(m.biases);
    sg.row_bytes = int(m.cols / 2);
    sg.gpr = int(m.cols / 64);
    sg.wt = wt;
    seg[t] = sg;
  };
  auto fetch_g = [&](int rb, int g) {
    const int e = g < k * gI ? g / gI : k, gl = g - e * gI;
    const DSeg& sg = seg[e];
    const int64_t r0 = min(rb * 16 + g8, H - 1), r1 = min(rb * 16 + g8 + 8, H - 1);
    const char* q = sg.q + c * 8;
    Src s{q + r0 * sg.row_bytes, q + r1 * sg.row_bytes, sg.s + r0 * sg.gpr, sg.s + r1 * sg.gpr, sg.b + r0 * sg.gpr,
          sg.b + r1 * sg.gpr};
    return fetch(s, gl);
  };
  int early_id = 0;
  float early_w = 0.f;
  if (threadIdx.x <= k) {
    early_id = threadIdx.x < k ? __ldcg(sel_ids + threadIdx.x) : 0;
    early_w = __ldcg(sel_w + threadIdx.x);
    set_seg(threadIdx.x, early_id, early_w);
  }
  __syncthreads();  // seg
  Tile T[NT];
  int rb = blockIdx.x;
  auto fetch_item = [&](int r) {
#pragma unroll
    for (int i = 0; i < NT; ++i)
      if (warp + 8 * i < G) T[i] = fetch_g(r, warp + 8 * i);
  };
  if (rb < nrb) fetch_item(rb);
  pdl_wait();
  pdl_trigger();
  for (int i = threadIdx.x; i < K / 4; i += kThreads) cp_async16(xs + 4 * i, act + 4 * i);
  auto y_fetch = [&](int r) {
    if (threadIdx.x < 16 && r < nrb && r * 16 + int(threadIdx.x) < H) cp_async4(&epi_y[threadIdx.x], y + r * 16 + threadIdx.x);
  };
  y_fetch(rb);
  int id = 0;
  float wt = 0.f;
  if (threadIdx.x <= k) {
    id = threadIdx.x < k ? __ldcg(sel_ids + threadIdx.x) : 0;
    wt = __ldcg(sel_w + threadIdx.x);
  }
  cp_async_wait_all();
  __syncthreads();  // xs; every thread's pre-wait reads of seg are done
  const int n8 = K / 8;
  for (int t0 = 0; t0 < n8; t0 += kThreads) {
    const int t = t0 + threadIdx.x;
    float v[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (t < n8) row8(xs, t, v);
    tile::put_digits(v, t < n8, t, G, dig, meta);
  }
  bool changed = false;
  if (threadIdx.x <= k && (id != early_id || __float_as_uint(wt) != __float_as_uint(early_w))) {
    seg[threadIdx.x].wt = wt;
    if (id != early_id) {
      set_seg(threadIdx.x, id, wt);
      changed = true;
    }
  }
  if (__syncthreads_or(changed) && rb < nrb) fetch_item(rb);  // (also the barrier for the digits)

  const uint32_t xb = smem_u32(dig) + uint32_t(min(g8, 2) * G * 64 + c * 16);
  for (; rb < nrb; rb += gridDim.x) {
    const int nxt = rb + int(gridDim.x);
#pragma unroll
    for (int i = 0; i < NT; ++i) {
      const int g = warp + 8 * i;
      if (g < G) {
        const Tile t = T[i];
        if (nxt < nrb) T[i] = fetch_g(nxt, g);
        const uint4 b = g8 < kL ? lds128(xb + g * 64) : make_uint4(0u, 0u, 0u, 0u);
        int S0, S1;
        tile::tile_dots_one(wq(t), b, S0, S1);
        const float2 mt = meta[g];
        if (c == 0) {
          gvs[g * 16 + g8] = tile::group_value(bf_lo(t.s0), bf_lo(t.b0), S0, mt.x, mt.y);
          gvs[g * 16 + g8 + 8] = tile::group_value(bf_lo(t.s1), bf_lo(t.b1), S1, mt.x, mt.y);
        }
      }
    }
    cp_async_wait_all();  // epi_y
    __syncthreads();      // gvs complete
    for (int q = threadIdx.x; q < (k + 1) * 16; q += kThreads) {  // q = 16·e + row
      const int e = q / 16, r = q % 16, G0 = e * gI, ngr = e < k ? gI : gS;
      float p = 0.f;
      for (int l = 0; l < ngr; ++l) p += gvs[(G0 + l) * 16 + r];
      pes[q] = p;
    }
    __syncthreads();  // pes complete
    if (threadIdx.x < 16) {
      const int n = rb * 16 + threadIdx.x;
      if (n < H) {
        float v = 0.f;
        for (int e = 0; e <= k; ++e) v = fmaf(seg[e].wt, pes[e * 16 + threadIdx.x], v);
        y[n] = epi_y[threadIdx.x] + v;
      }
    }
    y_fetch(nxt);
  }
}

bool q4(const QMatrixDev& m) {
  return m.bits == 4 && m.group_size == 64 && m.cols % 64 == 0 && m.cols > 0 && m.rows > 0 && m.qweight &&
         m.scales && m.biases;
}

}  // namespace

bool moe_supported(const MoEDecodeWeights& w) {
  if (!q4(w.gate.first) || !q4(w.up.first) || !q4(w.down.first) || !q4(w.shared_gate) || !q4(w.shared_up) ||
      !q4(w.shared_down))
    return false;
  const int64_t H = w.gate.first.cols, I = w.gate.first.rows, Is = w.shared_gate.rows;
  return H <= kMaxH && w.up.first.cols == H && w.up.first.rows == I && w.down.first.rows == H &&
         w.down.first.cols == I && w.shared_up.cols == H && w.shared_up.rows == Is && w.shared_down.rows == H &&
         w.shared_down.cols == Is && I % 64 == 0 && Is % 64 == 0 && w.top_k >= 1 && w.top_k + 1 <= kMaxSlots &&
         (w.top_k * I + Is) / 64 <= 8 * 12 && w.E >= 1;
}

size_t moe_stage_bytes(int64_t K, int M) { return size_t(M) * size_t(K / 64) * (kL * 64 + sizeof(float2)); }

void moe_gate_up_one(const MoEDecodeWeights& w, const float* logits, const float* x, const float* norm_w, float eps,
                     int32_t* sel_ids, float* sel_w, float* act, cudaStream_t stream) {
  const int K = int(w.gate.first.cols), G = K / 64;
  const size_t smem = size_t(K) * 8 + size_t(G) * (kL * 64 + 8);
  const int64_t groups = int64_t(w.top_k) * ((w.gate.first.rows + 15) / 16) + (w.shared_gate.rows + 15) / 16;
  auto go = [&](auto kernel) {
    launch_pdl(kernel, dim3(grid_for(kernel, smem, groups)), dim3(kThreads), smem, stream, w, logits, x, norm_w, eps,
               sel_ids, sel_w, act);
  };
  if (G % kSlice == 0)
    go(gate_up_one_kernel<true>);
  else
    go(gate_up_one_kernel<false>);
}

void moe_down_one(const MoEDecodeWeights& w, const int32_t* sel_ids, const float* sel_w, const float* act, float* y,
                  cudaStream_t stream) {
  const int K = int(w.top_k * w.down.first.cols + w.shared_down.cols), G = K / 64;
  const size_t smem = size_t(K) * 4 + size_t(G) * (kL * 64 + 8 + 16 * 4) + size_t(w.top_k + 1) * 16 * 4;
  const int64_t nrb = (w.down.first.rows + 15) / 16;
  auto go = [&](auto kernel) {
    launch_pdl(kernel, dim3(grid_for(kernel, smem, nrb)), dim3(kThreads), smem, stream, w, sel_ids, sel_w, act, y);
  };
  const int nt = (G + 7) / 8;
  if (nt <= 2)
    go(down_one_kernel<2>);
  else if (nt <= 4)
    go(down_one_kernel<4>);
  else if (nt <= 8)
    go(down_one_kernel<8>);
  else if (nt == 9)  // the model's: 8 routed experts and the shared one of 512 columns
    go(down_one_kernel<9>);
  else
    go(down_one_kernel<12>);
}

}  // namespace lilac::cuda::digits
