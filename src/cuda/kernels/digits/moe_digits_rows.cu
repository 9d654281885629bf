// The digits MoE for the rows step (moe_digits.h): gate/up and down over the routing's chunks of up to 8 rows per
// expert, their input digits staged by rows::stage. bench/GPU_NOTES.md ("Fourteenth stop") has the measurements;
// the routed prototype they started from is bench/proto_int8_moe.cu.
#include "cuda/kernels/digits/moe_digits.h"

#include <algorithm>

#include "core/error.h"
#include "cuda/cuda_common.h"
#include "cuda/kernels/digits/moe_digits.cuh"
#include "cuda/kernels/qdot.cuh"
#include "cuda/kernels/rows/moe_rows.cuh"

namespace lilac::cuda::digits {
namespace {

using namespace moe_dev;

// ------------------------------------------------------------------------------------------------ rows
// Work items are (chunk, a block of row blocks): the routed chunks' items, then the shared expert's. A block
// takes items b, b + grid, ...; it gathers the next item's rows' digits (by entry) into its second buffer by
// cp.async while its warps compute the current one, each warp one row block over the whole K with D tiles in
// flight across items.
struct RowsArgs {
  MoEDecodeWeights w;
  const char* dig;     // staged rows: [M][3][Gt][64]
  const float2* meta;  // [M][Gt]
  int Gt;              // groups per staged row
  rows_dev::MoEScratch sc;
  float* act;  // gate/up output
  int64_t lda;
  int H;
};

__device__ __forceinline__ void item_chunk(int item, int nR, int ipcR, int ipcS, int& chunk, int& q) {
  if (item < nR * ipcR) {
    chunk = item / ipcR;
    q = item % ipcR;
  } else {
    const int j = item - nR * ipcR;
    chunk = nR + j / ipcS;
    q = j % ipcS;
  }
}

// Gathers the chunk's entries' digits of groups [gs, gs + ng) of their staged rows (gs: the entry's slot times
// slot_groups for down, 0 for gate/up) into buf ([3][ngmax][8][64], then meta [ngmax][8]); entries past the
// chunk's rows as zeros. Each thread copies for one entry throughout (its column is fixed by its index), so it
// reads that entry once. s_ent / s_ch: the entries and the chunk, for the item's epilogue.
__device__ __forceinline__ void gather(const RowsArgs& a, int4 ch, int slot_groups, int ng, int ngmax, uint32_t buf,
                                       int* s_ent, int4* s_ch, bool down) {
  const int k = a.w.top_k;
  if (threadIdx.x == 0) *s_ch = ch;
  auto src_of_entry = [&](int col, bool on) {
    const int ent = on ? a.sc.entries[ch.y + col] : 0;
    const int row = ent >> 8, slot = ent & 255;
    const int gs = down ? (slot < k ? slot : k) * slot_groups : 0;
    return make_int2(row, gs);  // the entry's staged row and its first group there
  };
  {
    const int q = threadIdx.x & 3, col = (threadIdx.x >> 2) & 7;
    const bool on = col < ch.z;
    const int2 rg = src_of_entry(col, on);
    if (threadIdx.x < 32 && q == 0) s_ent[col] = on ? a.sc.entries[ch.y + col] : -1;
    const char* src = a.dig + ((int64_t(rg.x) * kL) * a.Gt + rg.y) * 64 + q * 16;
    for (int lg = threadIdx.x >> 5; lg < kL * ng; lg += kThreads / 32) {
      const int l = lg / ng, g = lg % ng;
      cp_async16_zfill(buf + uint32_t(((l * ngmax + g) * 8 + col) * 64 + q * 16), src + (int64_t(l) * a.Gt + g) * 64,
                       on ? 16 : 0);
    }
  }
  {
    const int col = threadIdx.x & 7;
    const bool on = col < ch.z;
    const int2 rg = src_of_entry(col, on);
    const float2* src = a.meta + int64_t(rg.x) * a.Gt + rg.y;
    const uint32_t mbuf = buf + uint32_t(kL * ngmax * 8 * 64);
    for (int g = threadIdx.x >> 3; g < ng; g += kThreads / 8)
      asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(mbuf + uint32_t((g * 8 + col) * 8)),
                   "l"(src + g), "r"(on ? 8 : 0)
                   : "memory");
  }
}

// gate/up: items of 4 row blocks; warps 0-3 the gate rows, 4-7 the up rows of the same blocks; act = silu·up
// through shared memory.
template <int D>
__global__ void __launch_bounds__(kThreads, 2) gate_up_rows_kernel(RowsArgs a) {
  extern __shared__ uint4 sm4[];
  __shared__ int s_ent[2][8];
  __shared__ int4 s_ch[2];
  __shared__ float xch[4][32][4];
  const MoEDecodeWeights& w = a.w;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g8 = lane >> 2, c = lane & 3;
  const int half = warp >> 2, rq = warp & 3;
  const int G = a.Gt, E = w.E;
  const int I = int(w.gate.first.rows), Is = int(w.shared_gate.rows);
  const int ipcR = ((I + 15) / 16 + 3) / 4, ipcS = ((Is + 15) / 16 + 3) / 4;
  const uint32_t buf_bytes = uint32_t(kL * G * 8 * 64 + G * 8 * 8);
  const uint32_t sbase = smem_u32(sm4);
  const char* sgen = reinterpret_cast<const char*>(sm4);
  pdl_wait();
  pdl_trigger();
  const int nR = a.sc.hdr[0], nC = a.sc.hdr[1];
  const int items = nR * ipcR + (nC - nR) * ipcS;

  Tile T[D];
  Src ls{};
  bool lvalid = false;
  int litem = blockIdx.x, lg = 0;
  auto lstart = [&]() {
    lvalid = false;
    if (litem < items) {
      int chunk, q;
      item_chunk(litem, nR, ipcR, ipcS, chunk, q);
      const int e = a.sc.chunks[chunk].x, rb = q * 4 + rq, nrows = e == E ? Is : I;
      if (rb * 16 < nrows) {
        const QMatrixDev m = e == E ? (half == 0 ? w.shared_gate : w.shared_up)
                                    : (half == 0 ? w.gate.expert(e) : w.up.expert(e));
        ls = src_of(m, rb * 16, g8, c);
        lvalid = true;
      }
    }
  };
  lstart();
  auto load = [&](int i) {
    if (lvalid) T[i] = fetch(ls, lg);
    if (++lg == G) {
      lg = 0;
      litem += gridDim.x;
      lstart();
    }
  };
#pragma unroll
  for (int i = 0; i < D; ++i) load(i);
  auto stage = [&](int it, int b) {
    int chunk, q;
    item_chunk(it, nR, ipcR, ipcS, chunk, q);
    gather(a, a.sc.chunks[chunk], 0, G, G, sbase + b * buf_bytes, s_ent[b], &s_ch[b], false);
  };
  int item = blockIdx.x;
  if (item < items) stage(item, 0);
  cp_async_commit();
  for (int n = 0; item < items; ++n, item += gridDim.x) {
    int chunk, q;
    item_chunk(item, nR, ipcR, ipcS, chunk, q);
    if (item + int(gridDim.x) < items) stage(item + gridDim.x, (n + 1) & 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const int4 ch = s_ch[n & 1];
    const int rb = q * 4 + rq, nrows = ch.x == E ? Is : I;
    const bool on = rb * 16 < nrows;
    const uint32_t xb = sbase + (n & 1) * buf_bytes + g8 * 64 + c * 16;
    const float2* mp = reinterpret_cast<const float2*>(sgen + (n & 1) * buf_bytes + kL * G * 8 * 64) + 2 * c;
    float acc[4] = {0.f, 0.f, 0.f, 0.f}, tot[4] = {0.f, 0.f, 0.f, 0.f};
    for (int g0 = 0; g0 < G; g0 += D) {
#pragma unroll
      for (int i = 0; i < D; ++i) {
        const int gl = g0 + i;
        const Tile t = T[i];
        load(i);
        if (on) {
          int S[1][4];
          tile::tile_dots<kL, 1>(wq(t), xb + gl * 512, uint32_t(G * 512), S);
          const float4 mm = *reinterpret_cast<const float4*>(mp + gl * 8);
#pragma unroll
          for (int v = 0; v < 4; ++v) {
            const uint32_t sw = (v >> 1) ? t.s1 : t.s0, bw = (v >> 1) ? t.b1 : t.b0;
            acc[v] = tile::fold(acc[v], bf_lo(sw), bf_lo(bw), S[0][v], (v & 1) ? mm.z : mm.x, (v & 1) ? mm.w : mm.y);
          }
          if (((gl + 1) & (kSlice - 1)) == 0 || gl + 1 == G)
#pragma unroll
            for (int v = 0; v < 4; ++v) {
              tot[v] += acc[v];
              acc[v] = 0.f;
            }
        }
      }
    }
    if (half == 1 && on)
#pragma unroll
      for (int v = 0; v < 4; ++v) xch[rq][lane][v] = tot[v];
    __syncthreads();  // xch
    if (half == 0 && on)
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        const int m = 2 * c + (v & 1), nrow = rb * 16 + g8 + 8 * (v >> 1);
        const int ent = s_ent[n & 1][m];
        if (m < ch.z && nrow < nrows) {
          const int row = ent >> 8, slot = ent & 255;
          a.act[int64_t(row) * a.lda + int64_t(slot) * I + nrow] = silu_f(tot[v]) * xch[rq][lane][v];
        }
      }
    __syncthreads();  // this buffer is restaged at item n + 2; xch rewritten
  }
}

// gate/up, sliced: items (chunk, 16-row block), warps 0-3 the gate rows' 8-group slices, 4-7 the up rows' (the
// one-row kernel's split, so a warp has its 8 tiles in flight at once); each block takes a contiguous range of
// items and gathers a chunk's digits only when the chunk changes; the next item's tiles are requested while the
// current one computes. For whole slices (G % 8 == 0, G <= 32); other widths take the kernel above.
__global__ void __launch_bounds__(kThreads, 2) gate_up_sliced_kernel(RowsArgs a) {
  extern __shared__ uint4 sm4[];
  __shared__ int s_ent[8];
  __shared__ int4 s_ch;
  __shared__ float part[2][kWarps][32][4];
  const MoEDecodeWeights& w = a.w;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g8 = lane >> 2, c = lane & 3;
  const int half = warp >> 2, ks = warp & 3, gbeg = ks * kSlice;
  const int G = a.Gt, nsl = G / kSlice, E = w.E;
  const int I = int(w.gate.first.rows), Is = int(w.shared_gate.rows), nbI = (I + 15) / 16, nbS = (Is + 15) / 16;
  const uint32_t sbase = smem_u32(sm4);
  const char* sgen = reinterpret_cast<const char*>(sm4);
  pdl_wait();
  pdl_trigger();
  const int nR = a.sc.hdr[0], nC = a.sc.hdr[1];
  const int items = nR * nbI + (nC - nR) * nbS;
  const int per = (items + int(gridDim.x) - 1) / int(gridDim.x);
  const int first = int(blockIdx.x) * per, last = min(items, first + per);
  auto item_of = [&](int it, int& chunk, int& rb) {
    if (it < nR * nbI) {
      chunk = it / nbI;
      rb = it % nbI;
    } else {
      const int j = it - nR * nbI;
      chunk = nR + j / nbS;
      rb = j % nbS;
    }
  };
  const bool active = ks < nsl;
  uint2 Q0[kSlice], Q1[kSlice];
  uint4 SV[4];
  auto src_item = [&](int it) {  // this warp's rows of item it
    int chunk, rb;
    item_of(it, chunk, rb);
    const int e = a.sc.chunks[chunk].x;
    const QMatrixDev m = e == E ? (half == 0 ? w.shared_gate : w.shared_up)
                                : (half == 0 ? w.gate.expert(e) : w.up.expert(e));
    return src_of(m, rb * 16, g8, c);
  };
  auto issue_sv = [&](const Src& s) {
    SV[0] = __ldg(reinterpret_cast<const uint4*>(s.s0 + gbeg));
    SV[1] = __ldg(reinterpret_cast<const uint4*>(s.b0 + gbeg));
    SV[2] = __ldg(reinterpret_cast<const uint4*>(s.s1 + gbeg));
    SV[3] = __ldg(reinterpret_cast<const uint4*>(s.b1 + gbeg));
  };
  auto issue = [&](int it) {
    const Src s = src_item(it);
    issue_sv(s);
#pragma unroll
    for (int i = 0; i < kSlice; ++i) {
      Q0[i] = ld_stream8(s.q0 + (gbeg + i) * 32);
      Q1[i] = ld_stream8(s.q1 + (gbeg + i) * 32);
    }
  };
  if (first < last && active) issue(first);
  int staged = -1, par = 0;
  const uint32_t xb = sbase + g8 * 64 + c * 16;
  const float2* mp = reinterpret_cast<const float2*>(sgen + kL * G * 8 * 64) + 2 * c;
  for (int it = first; it < last; ++it) {
    int chunk, rb;
    item_of(it, chunk, rb);
    if (chunk != staged) {
      __syncthreads();  // the previous chunk's digits are read no more
      gather(a, a.sc.chunks[chunk], 0, G, G, sbase, s_ent, &s_ch, false);
      cp_async_wait_all();
      __syncthreads();
      staged = chunk;
    }
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    if (active) {
      const uint4 cs0 = SV[0], cb0 = SV[1], cs1 = SV[2], cb1 = SV[3];
      const bool more = it + 1 < last;
      Src ns{};
      if (more) {
        ns = src_item(it + 1);
        issue_sv(ns);
      }
#pragma unroll
      for (int i = 0; i < kSlice; ++i) {
        const int g = gbeg + i;
        const uint2 c0 = Q0[i], c1 = Q1[i];
        if (more) {
          Q0[i] = ld_stream8(ns.q0 + g * 32);
          Q1[i] = ld_stream8(ns.q1 + g * 32);
        }
        int S[1][4];
        tile::tile_dots<kL, 1>(make_uint4(c0.x, c1.x, c0.y, c1.y), xb + g * 512, uint32_t(G * 512), S);
        const float4 mm = *reinterpret_cast<const float4*>(mp + g * 8);
        const float ws0 = bf_half(cs0, i), wb0 = bf_half(cb0, i), ws1 = bf_half(cs1, i), wb1 = bf_half(cb1, i);
#pragma unroll
        for (int v = 0; v < 4; ++v)
          acc[v] = tile::fold(acc[v], (v >> 1) ? ws1 : ws0, (v >> 1) ? wb1 : wb0, S[0][v], (v & 1) ? mm.z : mm.x,
                              (v & 1) ? mm.w : mm.y);
      }
#pragma unroll
      for (int v = 0; v < 4; ++v) part[par][warp][lane][v] = acc[v];
    }
    __syncthreads();  // part[par]
    if (threadIdx.x < 128) {
      const int r = threadIdx.x >> 3, m = threadIdx.x & 7;  // output row r of the block, entry m
      const int ln = (r & 7) * 4 + (m >> 1), v = (r >> 3) * 2 + (m & 1);
      const int4 ch = s_ch;
      const int nrows = ch.x == E ? Is : I, nrow = rb * 16 + r;
      if (m < ch.z && nrow < nrows) {
        float gv = 0.f, uv = 0.f;
        for (int q = 0; q < nsl; ++q) {
          gv += part[par][q][ln][v];
          uv += part[par][4 + q][ln][v];
        }
        const int ent = s_ent[m], row = ent >> 8, slot = ent & 255;
        a.act[int64_t(row) * a.lda + int64_t(slot) * I + nrow] = silu_f(gv) * uv;
      }
    }
    par ^= 1;
  }
}

// down: items of 32 row blocks of H (warp w: blocks w, w + 8, w + 16, w + 24 of the item); an entry's input is
// its own slot's groups of its row's act digits; the expert's sum P_e per (entry, output) into the scratch's pe
// (moe_combine_rows weighs and adds them).
constexpr int kDownRpw = 4;  // row blocks per warp and item (1: +4 % at 4 rows, -1 % at 64; the same at 16)
template <int D>
__global__ void __launch_bounds__(kThreads, 2) down_rows_kernel(RowsArgs a) {
  extern __shared__ uint4 sm4[];
  __shared__ int s_ent[2][8];
  __shared__ int4 s_ch[2];
  const MoEDecodeWeights& w = a.w;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g8 = lane >> 2, c = lane & 3;
  const int k = w.top_k, E = w.E, H = a.H;
  const int gI = int(w.down.first.cols / 64), gS = int(w.shared_down.cols / 64), gmax = max(gI, gS);
  const int ipc = ((H + 15) / 16 + 8 * kDownRpw - 1) / (8 * kDownRpw);
  const uint32_t buf_bytes = uint32_t(kL * gmax * 8 * 64 + gmax * 8 * 8);
  const uint32_t sbase = smem_u32(sm4);
  const char* sgen = reinterpret_cast<const char*>(sm4);
  pdl_wait();
  pdl_trigger();
  const int items = a.sc.hdr[1] * ipc;

  Tile T[D];
  Src ls{};
  bool lvalid = false;
  int litem = blockIdx.x, lj = 0, lg = 0, lG = 1, le = 0;
  auto lstart = [&]() {
    lvalid = false;
    if (litem < items) {
      if (lj == 0) le = a.sc.chunks[litem / ipc].x;
      lG = le == E ? gS : gI;
      const int rb = (litem % ipc) * 8 * kDownRpw + lj * 8 + warp;
      if (rb * 16 < H) {
        ls = src_of(le == E ? w.shared_down : w.down.expert(le), rb * 16, g8, c);
        lvalid = true;
      }
    }
  };
  lstart();
  auto load = [&](int i) {
    if (lvalid) T[i] = fetch(ls, lg);
    if (++lg == lG) {
      lg = 0;
      if (++lj == kDownRpw) {
        lj = 0;
        litem += gridDim.x;
      }
      lstart();
    }
  };
#pragma unroll
  for (int i = 0; i < D; ++i) load(i);
  auto stage = [&](int it, int b) {
    const int4 ch = a.sc.chunks[it / ipc];
    gather(a, ch, gI, ch.x == E ? gS : gI, gmax, sbase + b * buf_bytes, s_ent[b], &s_ch[b], true);
  };
  int item = blockIdx.x;
  if (item < items) stage(item, 0);
  cp_async_commit();
  for (int n = 0; item < items; ++n, item += gridDim.x) {
    if (item + int(gridDim.x) < items) stage(item + gridDim.x, (n + 1) & 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const int4 ch = s_ch[n & 1];
    const int G = ch.x == E ? gS : gI;
    const uint32_t xb = sbase + (n & 1) * buf_bytes + g8 * 64 + c * 16;
    const float2* mp = reinterpret_cast<const float2*>(sgen + (n & 1) * buf_bytes + kL * gmax * 8 * 64) + 2 * c;
    for (int j = 0; j < kDownRpw; ++j) {
      const int rb = (item % ipc) * 8 * kDownRpw + j * 8 + warp;
      const bool on = rb * 16 < H;
      float p[4] = {0.f, 0.f, 0.f, 0.f};
      for (int g0 = 0; g0 < G; g0 += D) {
#pragma unroll
        for (int i = 0; i < D; ++i) {
          const int gl = g0 + i;
          const Tile t = T[i];
          load(i);
          if (on) {
            int S[1][4];
            tile::tile_dots<kL, 1>(wq(t), xb + gl * 512, uint32_t(gmax * 512), S);
            const float4 mm = *reinterpret_cast<const float4*>(mp + gl * 8);
#pragma unroll
            for (int v = 0; v < 4; ++v) {
              const uint32_t sw = (v >> 1) ? t.s1 : t.s0, bw = (v >> 1) ? t.b1 : t.b0;
              p[v] += tile::group_value(bf_lo(sw), bf_lo(bw), S[0][v], (v & 1) ? mm.z : mm.x, (v & 1) ? mm.w : mm.y);
            }
          }
        }
      }
      if (on)
#pragma unroll
        for (int v = 0; v < 4; ++v) {
          const int m = 2 * c + (v & 1), nrow = rb * 16 + g8 + 8 * (v >> 1);
          if (m < ch.z && nrow < H) {
            const int ent = s_ent[n & 1][m], row = ent >> 8, slot = ent & 255;
            a.sc.pe[(int64_t(row) * (k + 1) + slot) * H + nrow] = p[v];
          }
        }
    }
    __syncthreads();  // this buffer is restaged at item n + 2
  }
}

int pow2_divisor(int a, int b) {  // the ring depth: 4, 2 or 1, dividing both group counts
  for (int d = 4; d > 1; d /= 2)
    if (a % d == 0 && b % d == 0) return d;
  return 1;
}

// Persistent grids: the blocks that fit at once.
RowsArgs rows_args(const MoEDecodeWeights& w, const void* dig, int M, int64_t K, const void* scratch) {
  RowsArgs a;
  a.w = w;
  a.Gt = int(K / 64);
  a.dig = static_cast<const char*>(dig);
  a.meta = reinterpret_cast<const float2*>(a.dig + size_t(M) * kL * a.Gt * 64);
  a.sc = rows_dev::moe_carve(const_cast<void*>(scratch), w, M);
  a.act = nullptr;
  a.lda = w.top_k * w.down.first.cols + w.shared_down.cols;
  a.H = int(w.down.first.rows);
  return a;
}

}  // namespace

void moe_gate_up_rows(const MoEDecodeWeights& w, const void* xdig, int M, const void* scratch, float* act,
                      cudaStream_t stream) {
  if (M == 0) return;
  RowsArgs a = rows_args(w, xdig, M, w.gate.first.cols, scratch);
  a.act = act;
  const int G = a.Gt;
  const size_t smem = 2 * (size_t(kL) * G * 8 * 64 + size_t(G) * 8 * 8);
  const int ipc = int(((std::max(w.gate.first.rows, w.shared_gate.rows) + 15) / 16 + 3) / 4);
  const int64_t max_items = (int64_t(M) * w.top_k + (M + kMoEChunk - 1) / kMoEChunk) * ipc;
  auto go = [&](auto kernel) {
    launch_pdl(kernel, dim3(grid_for(kernel, smem, max_items)), dim3(kThreads), smem, stream, a);
  };
  if (G % kSlice == 0 && G / kSlice <= 4) {
    const size_t ssmem = size_t(kL) * G * 8 * 64 + size_t(G) * 8 * 8;
    const int64_t nb = std::max(w.gate.first.rows, w.shared_gate.rows) / 16 + 1;
    const int64_t sitems = (int64_t(M) * w.top_k + (M + kMoEChunk - 1) / kMoEChunk) * nb;
    launch_pdl(gate_up_sliced_kernel, dim3(grid_for(gate_up_sliced_kernel, ssmem, sitems)), dim3(kThreads), ssmem,
               stream, a);
    return;
  }
  switch (pow2_divisor(G, G)) {
    case 4: go(gate_up_rows_kernel<4>); break;
    case 2: go(gate_up_rows_kernel<2>); break;
    default: go(gate_up_rows_kernel<1>); break;
  }
}

void moe_down_rows(const MoEDecodeWeights& w, const void* adig, int M, void* scratch, cudaStream_t stream) {
  if (M == 0) return;
  const int64_t K = w.top_k * w.down.first.cols + w.shared_down.cols;
  RowsArgs a = rows_args(w, adig, M, K, scratch);
  const int gI = int(w.down.first.cols / 64), gS = int(w.shared_down.cols / 64), gmax = std::max(gI, gS);
  const size_t smem = 2 * (size_t(kL) * gmax * 8 * 64 + size_t(gmax) * 8 * 8);
  const int ipc = int(((w.down.first.rows + 15) / 16 + 8 * kDownRpw - 1) / (8 * kDownRpw));
  const int64_t max_items = (int64_t(M) * w.top_k + (M + kMoEChunk - 1) / kMoEChunk) * ipc;
  auto go = [&](auto kernel) {
    launch_pdl(kernel, dim3(grid_for(kernel, smem, max_items)), dim3(kThreads), smem, stream, a);
  };
  switch (pow2_divisor(gI, gS)) {
    case 4: go(down_rows_kernel<4>); break;
    case 2: go(down_rows_kernel<2>); break;
    default: go(down_rows_kernel<1>); break;
  }
}

}  // namespace lilac::cuda::digits
