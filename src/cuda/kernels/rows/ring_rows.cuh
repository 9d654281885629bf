// The weight stream of the MoE rows kernels (moe_rows.cu, where rings are on): a ring of D k-tile stages per
// warp in shared memory, filled by cp.async D-1 steps ahead of the math, so that a warp keeps several weight
// tiles in flight whatever its math does (bench/probe_rows_hw.cu streams the same pattern at ~4 TB/s with 8
// warps per SM).
//
// A stage holds one k-tile of a 16-row block for one warp: each lane's own weight units (rows g, g+8, NCH
// chunks: written and read by the same lane, lane-major so that a warp's 16-byte reads cover 512 contiguous
// bytes) and the 16 rows' scales / biases of the tile's 4 groups (8 bytes each, copied by one lane per row and
// kind, read by the 4 lanes of a row after a __syncwarp). Units of groups past the matrix's last group are
// zero-filled without a read. Scales / biases that are not 8-byte aligned in 4-group runs (odd shapes, partial
// last tiles) are not staged; the reader loads them itself (load_sb_slow).
#pragma once
#include <cstdint>

#include "cuda/kernels/rows/tc_rows.cuh"

namespace lilac::cuda::rows_dev {

template <int BITS>
struct RingShape {
  static constexpr int NU = 2 * TcShape<BITS>::NCH;  // 16-byte weight units per lane and k-tile
  static constexpr int A_BYTES = NU * 32 * 16;
  static constexpr int STAGE = A_BYTES + 256;        // + 16 rows × {scales, biases} of 4 groups
  // Byte offsets inside a stage: lane's 16-byte weight unit of chunk i of row g + 8h; the scales (kind 0) or
  // biases (kind 1) of row r of the block.
  __device__ static constexpr int w_off(int h, int i, int lane) { return ((h * TcShape<BITS>::NCH + i) * 32 + lane) * 16; }
  __device__ static constexpr int sb_off(int r, int kind) { return A_BYTES + r * 16 + kind * 8; }
};
constexpr int kMaxRing = 8;

using ::lilac::cuda::dev::cp_async16_zfill;
using ::lilac::cuda::dev::cp_async8;
using ::lilac::cuda::dev::cp_async_commit;
// Wait until at most n (0..7) of this thread's newest copy groups are pending.
__device__ __forceinline__ void cp_async_wait_n(int n) {
  switch (n) {
    case 0: asm volatile("cp.async.wait_group 0;" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;" ::: "memory"); break;
    case 3: asm volatile("cp.async.wait_group 3;" ::: "memory"); break;
    case 4: asm volatile("cp.async.wait_group 4;" ::: "memory"); break;
    case 5: asm volatile("cp.async.wait_group 5;" ::: "memory"); break;
    case 6: asm volatile("cp.async.wait_group 6;" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 7;" ::: "memory"); break;
  }
}


// Whether k-tile kt's scales / biases go through the ring.
__device__ __forceinline__ bool sb_staged(bool sb_vec, int kt, int ngroups) { return sb_vec && kt * 4 + 3 < ngroups; }

// The copies of k-tile kt of a 16-row block into stage `st`: r = this lane's rows g, g+8; sbr = row lane % 16
// of the block (its scales for lanes < 16, biases for the others).
template <int BITS>
__device__ __forceinline__ void ring_issue(char* st, const RowRef (&r)[2], const RowRef& sbr, int kt, int lane,
                                           int ngroups, bool sb_vec) {
  using S = TcShape<BITS>;
  const int c = lane & 3;
#pragma unroll
  for (int i = 0; i < S::NCH; ++i) {
    const int G = kt * 4 + S::slot(i, c);
    const bool ok = G < ngroups;
    const int off = ok ? G * S::GROUP_BYTES + S::off_in_group(c) : 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) cp_async16_zfill(st + RingShape<BITS>::w_off(h, i, lane), r[h].q + off, ok ? 16 : 0);
  }
  if (sb_staged(sb_vec, kt, ngroups))
    cp_async8(st + RingShape<BITS>::sb_off(lane & 15, lane >> 4), (lane < 16 ? sbr.s : sbr.b) + kt * 4);
}

// The tile of stage `st` into registers (scales / biases only when staged).
template <int BITS>
__device__ __forceinline__ void ring_read(RowTile<BITS>& t, const char* st, int lane, bool staged_sb) {
  using S = TcShape<BITS>;
#pragma unroll
  for (int i = 0; i < S::NCH; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) t.w[h][i] = *reinterpret_cast<const uint4*>(st + RingShape<BITS>::w_off(h, i, lane));
  if (staged_sb) {
    const int g = lane >> 2;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const char* sb = st + RingShape<BITS>::sb_off(g + 8 * h, 0);
      t.s[h] = *reinterpret_cast<const uint2*>(sb);
      t.b[h] = *reinterpret_cast<const uint2*>(sb + 8);
    }
  }
}

// One warp's ring: D stages from `base`. step(issue) refills the stage read last with the step D-1 ahead
// (issue(stage) copies it, or nothing once the warp's steps are all issued), commits, waits for the oldest
// step's copies and returns its stage. prologue(issue) issues the first D-1 steps (weights only: may run
// before the PDL wait).
struct WarpRing {
  char* base;
  int stage_bytes, D, islot = 0, rslot = 0;
  template <typename Issue>
  __device__ __forceinline__ void prologue(Issue&& issue) {
    for (int k = 0; k < D - 1; ++k) {
      issue(base + k * stage_bytes);
      cp_async_commit();
    }
    islot = D - 1;
  }
  template <typename Issue>
  __device__ __forceinline__ const char* step(Issue&& issue) {
    __syncwarp();  // every lane is done with the stage read last (its scales / biases are shared)
    issue(base + islot * stage_bytes);
    cp_async_commit();
    islot = islot + 1 == D ? 0 : islot + 1;
    cp_async_wait_n(D - 1);
    __syncwarp();  // the other lanes' scale / bias copies are visible
    const char* st = base + rslot * stage_bytes;
    rslot = rslot + 1 == D ? 0 : rslot + 1;
    return st;
  }
};

// Copies n 16-byte units from global memory (written by an earlier kernel: after the PDL wait) into shared
// memory with the block's threads, 8 loads in flight per thread; src(i) / dst(i) give unit i's addresses
// (src null: unit skipped).
template <typename Src, typename Dst>
__device__ __forceinline__ void block_copy16(int n, Src&& src, Dst&& dst) {
  for (int i0 = threadIdx.x; i0 < n; i0 += 8 * blockDim.x) {
    uint4 v[8];
    const void* p[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int i = i0 + k * int(blockDim.x);
      p[k] = i < n ? src(i) : nullptr;
      if (p[k] != nullptr) v[k] = __ldcg(reinterpret_cast<const uint4*>(p[k]));
    }
#pragma unroll
    for (int k = 0; k < 8; ++k)
      if (p[k] != nullptr) *reinterpret_cast<uint4*>(dst(i0 + k * int(blockDim.x))) = v[k];
  }
}

// Staged fragments + meta of `n` rows (rows[t] >> shift: the row's index in the stage() output, < 0: not
// copied) into the shared buffers of a block (row t at xf + t·xstride, meta + t·mstride), and the zero block.
// No barrier.
__device__ __forceinline__ void stage_rows_in(char* xf, float2* meta, char* zero, const char* gfrag,
                                              const float2* gmeta, const int* rows, int shift, int n, int xstride,
                                              int mstride) {
  const int ux = xstride / 16, um = mstride / 2, per = ux + um;
  block_copy16(
      n * per,
      [&](int i) -> const void* {
        const int t = i / per, u = i - t * per, row = rows[t] >> shift;
        if (row < 0) return nullptr;
        return u < ux ? static_cast<const void*>(gfrag + int64_t(row) * xstride + 16 * u)
                      : static_cast<const void*>(gmeta + int64_t(row) * mstride + 2 * (u - ux));
      },
      [&](int i) -> void* {
        const int t = i / per, u = i - t * per;
        return u < ux ? static_cast<void*>(xf + t * xstride + 16 * u) : static_cast<void*>(meta + t * mstride + 2 * (u - ux));
      });
  for (int i = threadIdx.x; i < kZeroTileBytes / 16; i += blockDim.x) reinterpret_cast<uint4*>(zero)[i] = make_uint4(0, 0, 0, 0);
}

}  // namespace lilac::cuda::rows_dev
