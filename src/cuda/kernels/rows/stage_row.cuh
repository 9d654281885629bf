// The staging of one input row (rows_mm.h: stage) from its values in shared memory, shared by the staging launch
// (stage_rows.cu) and the kernels that produce a row whole and stage it themselves (moe_route_rows.cu: the MoE
// combine followed by the next layer's input norm), so that both write the same bits. A 256-thread block
// (kThreads): thread t owns units t, t + 256, ... (columns 8t .. 8t + 7), the RMSNorm's Σx² is its partial sums
// in that order and one block_sum — gemv_tc.cu's in-block staging, unit for unit.
#pragma once
#include "cuda/kernels/digits/digits_tile.cuh"
#include "cuda/kernels/rows/rows_mm.h"
#include "cuda/kernels/rows/tc_rows.cuh"
#include "cuda/kernels/tc_g4.cuh"

namespace lilac::cuda::rows_dev {

using ::lilac::cuda::rows::StageArgs;

__host__ __device__ inline int stage_round16(int b) { return (b + 15) / 16 * 16; }
// Shared memory of one row's staging: x [K]; RmsNorm: + the norm weights [K]; GatedHeadNorm: + z [K], the
// weights [hd] and the heads' Σx².
__host__ __device__ inline int stage_smem_bytes(int K, Prologue pro, int hd) {
  int b = K * 4;
  if (pro == Prologue::RmsNorm) b += K * 4;
  if (pro == Prologue::GatedHeadNorm) b += K * 4 + stage_round16(hd * 4) + stage_round16((K / hd + 1) * 4);
  return b;
}

// Where a row's staging keeps its values in shared memory (stage_smem_bytes from base, 16-byte aligned).
struct StageSmem {
  float* xs = nullptr;   // x [K]
  float* zs = nullptr;   // GatedHeadNorm: z [K]
  float* nws = nullptr;  // the norm weights
  float* hss = nullptr;  // GatedHeadNorm: Σx² per head
};
__device__ inline StageSmem stage_smem(void* base, int K, Prologue pro, int hd) {
  StageSmem m;
  m.xs = static_cast<float*>(base);
  if (pro == Prologue::RmsNorm) m.nws = m.xs + K;
  if (pro == Prologue::GatedHeadNorm) {
    m.zs = m.xs + K;
    m.nws = m.zs + K;
    m.hss = reinterpret_cast<float*>(reinterpret_cast<char*>(m.nws) + stage_round16(hd * 4));
  }
  return m;
}

// The norm weights into shared memory by cp.async (no kernel of the step writes them: may run before the PDL
// wait; the caller waits for the copies and makes them visible with a barrier).
__device__ inline void stage_norm_prefetch(const StageArgs& a, const StageSmem& m) {
  const int n = a.pro == Prologue::RmsNorm ? int(a.K) : a.pro == Prologue::GatedHeadNorm ? a.head_dim : 0;
  for (int i = threadIdx.x; i < n / 4; i += blockDim.x) ::lilac::cuda::dev::cp_async16(m.nws + 4 * i, a.norm_w + 4 * i);
}

// The start of a kernel that stages row r: the norm weights requested before the PDL wait (no kernel of the step
// writes them), the wait, the trigger; false for a padding row (nothing read, nothing written: the caller returns).
__device__ inline bool stage_enter(const StageArgs& a, int r, const StageSmem& m) {
  stage_norm_prefetch(a, m);
  ::lilac::cuda::dev::pdl_wait();
  ::lilac::cuda::dev::pdl_trigger();
  if (a.row_slot != nullptr && a.row_slot[r] < 0) {
    ::lilac::cuda::dev::cp_async_wait_all();
    return false;
  }
  return true;
}

// Units [u0, u1) of the row's padded units (default: all of them, n8t) — the whole row for RmsNorm (its Σx² is the
// block's, blockDim.x == kThreads); for the other prologues any cut at multiples of 32 units holding whole heads
// (stage_slice_units), each unit computed as when one block stages the whole row.
struct UnitRange {
  int u0 = 0, u1 = -1;
};

// Row r of the staging's outputs from the row's x (and z) in m.xs (m.zs; the whole row's layout, at least the
// range's values) and the norm weights in m.nws, all visible to the block (after a barrier). Every thread must call
// it.
__device__ inline void stage_row(const StageArgs& a, int r, const StageSmem& m, float* red, UnitRange ur = UnitRange{}) {
  const int K = int(a.K), hd = a.head_dim;
  const float* xs = m.xs;
  const int KT = tc_kt(K), n8 = K / 8, n8t = KT * kTileCols / 8;
  const int u0 = ur.u0, u1 = ur.u1 < 0 ? n8t : ur.u1;
  float scale = 1.f;
  if (a.pro == Prologue::RmsNorm) {
    float ss = 0.f;
    for (int t = threadIdx.x; t < n8; t += blockDim.x) ss += unit_sumsq(xs, t);
    ss = block_sum(ss, red);
    scale = rsqrtf(ss / float(K) + a.eps);
  } else if (a.pro == Prologue::GatedHeadNorm) {
    head_sums(xs, m.hss, K, hd, u0, u1);
  }
  char* f4 = a.frag4 ? static_cast<char*>(a.frag4) + int64_t(r) * KT * kTileXBytes : nullptr;
  char* f4g = a.frag4g ? static_cast<char*>(a.frag4g) + int64_t(r) * KT * kTileXBytes : nullptr;
  char* f8 = a.frag8 ? static_cast<char*>(a.frag8) + int64_t(r) * KT * kTileXBytes : nullptr;
  char* f4w = a.frag4w ? static_cast<char*>(a.frag4w) + int64_t(r) * KT * kTileXBytes : nullptr;
  float2* meta = a.meta ? a.meta + int64_t(r) * KT * 4 : nullptr;
  const int G = K / kGroup;
  char* dg = a.digits ? static_cast<char*>(a.digits) + int64_t(r) * G * 3 * 64 : nullptr;  // moe_digits.h's layout
  float2* dmeta =
      a.digits ? reinterpret_cast<float2*>(static_cast<char*>(a.digits) + int64_t(a.M) * G * 3 * 64) + int64_t(r) * G
               : nullptr;
  for (int t0 = u0; t0 < u1; t0 += blockDim.x) {
    const int t = t0 + threadIdx.x;
    float v[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (t < n8) unit_values(a.pro, m, t, scale, hd, a.eps, v);
    int E;
    float sum;
    group_meta(v, E, sum);
    const float inv = pow2i(-E);
    if (t < u1) {
      uint4 hi, lo;
      if (f4 || f4g || f4w) split_unit<4>(v, inv, hi, lo);
      if (f4) {
        *reinterpret_cast<uint4*>(f4 + unit_off<4>(t)) = hi;
        *reinterpret_cast<uint4*>(f4 + unit_off<4>(t) + 16) = lo;
      }
      if (f4g) {  // the group layout (tc_g4.cuh): the same fp16 pairs at another place
        *reinterpret_cast<uint4*>(f4g + g4_unit_off(t)) = hi;
        *reinterpret_cast<uint4*>(f4g + g4_unit_off(t) + 16) = lo;
      }
      if (f4w) {  // the wgmma B rows (rows_mm.h: frag4w): word i of the unit lane c' reads for half h at 16·(4h + i)
                  // + 4c' of the group's hi row, the lo word 128 bytes further
        uint32_t* w =
            reinterpret_cast<uint32_t*>(f4w + (t >> 3) * kG4GroupBytes + (t & 1) * 64 + 4 * g4_pi((t >> 1) & 3));
        w[0] = hi.x, w[4] = hi.y, w[8] = hi.z, w[12] = hi.w;
        w[32] = lo.x, w[36] = lo.y, w[40] = lo.z, w[44] = lo.w;
      }
      if (f8) {
        split_unit<8>(v, inv, hi, lo);
        *reinterpret_cast<uint4*>(f8 + unit_off<8>(t)) = hi;
        *reinterpret_cast<uint4*>(f8 + unit_off<8>(t) + 16) = lo;
      }
      if (meta && (t & 7) == 0) meta[t / 8] = make_float2(pow2i(E), sum);
    }
    if (dg) digits::tile::put_digits(v, t < n8, t, G, dg, dmeta);
  }
}

// Units per block where a row's staging is cut into slices (stage_rows.cu), or 0: one block stages the whole row
// (RmsNorm's Σx² is the block's; the digits output's layout is not cut; a head must lie inside a slice).
constexpr int kSliceUnits = 64;
__host__ __device__ inline int stage_slice_units(const StageArgs& a) {
  if (a.pro == Prologue::RmsNorm || a.digits != nullptr) return 0;
  if (a.pro == Prologue::GatedHeadNorm && (8 * kSliceUnits) % a.head_dim != 0) return 0;
  return kSliceUnits;
}

}  // namespace lilac::cuda::rows_dev
