// Decode GEMVs on the tensor cores (the default on sm_80+): the dense GEMV here, MoE gate/up and MoE down in
// moe_tc.cu; their shared device pieces in gemv_tc.cuh.
//
// Why: the decode step moves ~1.7 GB of 4-bit weights per token. Dequantizing to fp32 and using fp32
// FMAs costs ~4 instructions per weight, which keeps the kernels issue/latency-bound far below the
// memory bandwidth. Here a warp multiplies a 16-row x 256-column weight tile with `mma.sync
// m16n8k16` (fp16 inputs, fp32 accumulation): per thread ~1.3 instructions per weight.
//
// Exactness: nibbles (bytes) become fp16 exactly, centred (q - 8, q - 128). The input x is split per
// 64-column quantization group into x = 2^E (hi + lo), hi and lo fp16 (E from the group's max |x|), so
// hi + lo carries ~22 bits of each value relative to its group's max; products are exact in the
// tensor core and summed in fp32. A group then adds s·2^E·dot + (zc·s + b)·Σx in fp32 (zc = 8 or
// 128, Σx the exact fp32 sum). The result matches the fp32 kernel to ~1e-6 relative.
//
// Tile layout. B is 16 x 8: its 8 columns are 4 group slots x {hi, lo}: the k-tile's 4 groups each go
// to their own pair of accumulator columns, so after the tile thread (g, c) holds, for rows g and g+8,
// the dot products of group c of the tile. A thread's weights per row and k-tile: NCH 16-byte chunks
// (4-bit: 2, 8-bit: 4) at byte offsets i*64 + c*16 of the row's tile (each warp load instruction reads
// whole 32-byte sectors). The k order inside the mma is a permutation of the columns; the staged
// fragments of x follow the same permutation (build_frags), so the dot products are unchanged.
// That is the layout of the MoE kernels and of 8-bit weights. The dense 4-bit kernel (batch 1, the MTP head,
// the LM head) uses the group layout of tc_g4.cuh instead — the same loads, each mma inside one group — which
// lets the multi-row kernel (rows/gemv_rows.cu) put 4 input rows in one mma with the same bits per row.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda/kernels/gemv/gemv_tc.cuh"
#include "cuda/kernels/gemv/gemv_tc.h"
#include "cuda/kernels/launch.cuh"

namespace lilac::cuda {
namespace {

// ------------------------------------------------------------------------------------------------ dense GEMV
// Block = 8 warps = RB row blocks (16 rows each) x KS k-slices (RB·KS = 8); a block loops over groups
// of RB row blocks (grid-stride); within a group, warp (rb, ks) takes k-tiles ks, ks + KS, ... and the
// KS partial sums of each row are added in a fixed order (deterministic).
// Latency: a warp's first two tiles, the norm weights and the conv taps / state of the epilogue rows
// are requested before the PDL wait; then the residual y and the input; every later tile is requested
// one step ahead of its math. The epilogue data goes through shared memory (cp.async), not registers.
constexpr int kMaxConvK = 4;
constexpr int kMaxEpiRows = 128;

// 4-bit weights take the group layout (tc_g4.cuh): the same tiles and loads, 4 mmas per group whose B columns
// hold the one input row in lanes g = 0, 1 (hi / lo) and zeros elsewhere; lane (g, 0) ends with the row's chains
// for weight rows g, g+8 (the other lanes' columns are the zero rows), bit for bit gemv_rows' row 0.
template <int BITS, int KS>
__global__ void __launch_bounds__(kThreads, kMinBlocks<BITS>) gemv_tc_kernel(GemvArgs a) {
  constexpr int RB = kWarps / KS;
  constexpr bool G4 = BITS == 4;
  using Tile = std::conditional_t<G4, G4Tile, TileRegs<BITS>>;
  extern __shared__ float4 smem4[];
  __shared__ float red[32];
  __shared__ float part[2][kWarps][16];
  __shared__ float epi_cw[kMaxEpiRows][kMaxConvK], epi_cs[kMaxEpiRows][kMaxConvK], epi_y[kMaxEpiRows];
  const int K = int(a.W.cols), KT = tc_kt(K), ngroups_k = K / kGroup;
  const TcSmem m = carve(reinterpret_cast<char*>(smem4), K, a.pro, a.head_dim);
  const char* zero = m.xf + KT * kTileXBytes;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int rbw = warp / KS, ks = warp % KS;
  const int iters = (KT + KS - 1) / KS;
  const int64_t rows = a.W.rows, nrb = (rows + 15) / 16, ngrp = (nrb + RB - 1) / RB;
  const LaneB<BITS> lb(lane);
  StageIn in;
  in.x = a.x;
  in.norm_w = a.norm_w;
  in.z = a.z;
  in.pro = a.pro;
  in.head_dim = a.head_dim;
  in.eps = a.eps;

  auto refs_for = [&](int64_t grp, RowRef(&r)[2]) {
    const int64_t r0 = (grp * RB + rbw) * 16 + g;
    r[0] = row_ref(a.W, min(r0, rows - 1), BITS);
    r[1] = row_ref(a.W, min(r0 + 8, rows - 1), BITS);
  };
  auto next = [&](Step s2) { return next_step(s2, iters); };
  auto load = [&](Tile& t, Step st) {
    if (st.grp < ngrp && ks + st.j * KS < KT) {
      RowRef r[2];
      refs_for(st.grp, r);
      if constexpr (G4)
        load_g4_tile(t, r, ks + st.j * KS, c, ngroups_k);
      else
        load_tile<BITS>(t, r, ks + st.j * KS, c, ngroups_k);
    }
  };
  // epilogue thread e < RB·16 owns row (grp·RB + e/16)·16 + e%16 of each group
  const bool epi = threadIdx.x < RB * 16;
  auto epi_row = [&](int64_t grp) { return (grp * RB + threadIdx.x / 16) * 16 + threadIdx.x % 16; };
  auto conv_fetch = [&](int64_t grp) {  // taps + state: not written by the step's other kernels
    const int64_t r = epi_row(grp);
    if (epi && grp < ngrp && r < a.conv_rows) {
      const int Kc = a.conv_k;
      for (int k = 0; k < Kc; ++k) cp_async4(&epi_cw[threadIdx.x][k], a.conv_w + r * Kc + k);
      for (int k = 0; k + 1 < Kc; ++k)
        cp_async4(&epi_cs[threadIdx.x][k], a.conv_state + r * (Kc - 1) + k);
    }
  };
  auto y_fetch = [&](int64_t grp) {  // the residual: after the PDL wait
    const int64_t r = epi_row(grp);
    if (epi && grp < ngrp && a.accumulate && r < rows) cp_async4(&epi_y[threadIdx.x], a.y + r);
  };

  tc_mark(0);
  Step st{blockIdx.x, 0};
  Tile t0, t1;  // swapping roles each step (the loop body runs twice per iteration): no tile copies
  load(t0, st);
  load(t1, next(st));
  bool nxt_loaded = true;
  conv_fetch(st.grp);
  stage_preload(in, m, K);
  pdl_wait();
  pdl_trigger();
  tc_mark(1);
  y_fetch(st.grp);
  stage_issue(in, m, K);
  stage_compute<BITS, G4>(in, m, K, red);
  tc_mark(3);
  bool first_group = true;
  // G4: this lane's B unit of group G at xb0 + G·gst (the zero block, gst = 0, in lanes g >= 2)
  const char* xb0 = ((g >> 1) == 0 ? m.xf : zero) + g4_lane_off(lane);
  const int gst = (g >> 1) == 0 ? kG4GroupBytes : 0;

  float acc[2] = {0.f, 0.f};
  int par = 0;
  auto step = [&](const Tile& cur, Tile& nxt) {
    if (st.grp >= ngrp) return false;
    const Step ns = next(st);
    if (!nxt_loaded) load(nxt, ns);
    nxt_loaded = false;
    const int kt = ks + st.j * KS;
    if (kt < KT) {
      if constexpr (G4) {
        g4_walk<1>(
            cur, lane, 1, [&](int, int q) { return xb0 + (kt * 4 + q) * gst; },
            [&](int, int q, float dot0, float dot1, const G4Scale& sc) {
              const int G = kt * 4 + q;
              if (c == 0 && G < ngroups_k) {
                const float2 mm = m.meta[G];
                acc[0] += g4_value(sc, 0, dot0, mm);
                acc[1] += g4_value(sc, 1, dot1, mm);
              }
            });
      } else {
        tile_accumulate<BITS>(cur, m, zero, kt, c, ngroups_k, lb, acc);
      }
    }
    if (ns.j == 0) {  // end of the group: combine the k-slices, epilogue
      if constexpr (G4) {
        if (c == 0) {
          part[par][warp][g] = acc[0];
          part[par][warp][g + 8] = acc[1];
        }
        acc[0] = acc[1] = 0.f;
      } else {
        write_partials(acc, part[par][warp], g, c);
      }
      cp_async_wait_all();  // this thread's epilogue copies
      __syncthreads();
      const int64_t r = epi_row(st.grp);
      if (epi && r < rows) {
        const int rb = threadIdx.x / 16, rr = threadIdx.x % 16;
        float v = 0.f;
#pragma unroll
        for (int s2 = 0; s2 < KS; ++s2) v += part[par][rb * KS + s2][rr];
        if (r < a.conv_rows) {  // causal depthwise conv (state oldest first) + SiLU
          const int S = a.conv_k - 1;
          float cacc = 0.f;
          for (int k = 0; k < S; ++k) cacc += epi_cw[threadIdx.x][k] * epi_cs[threadIdx.x][k];
          cacc += epi_cw[threadIdx.x][S] * v;
          float* stt = a.conv_state + r * S;
          for (int k = 0; k + 1 < S; ++k) stt[k] = epi_cs[threadIdx.x][k + 1];
          if (S > 0) stt[S - 1] = v;
          v = silu_f(cacc);
        }
        a.y[r] = a.accumulate ? epi_y[threadIdx.x] + v : v;
      }
      par ^= 1;
      conv_fetch(ns.grp);
      y_fetch(ns.grp);
      if (first_group) tc_mark(4);
      first_group = false;
    }
    st = ns;
    return true;
  };
  while (step(t0, t1) && step(t1, t0)) {
  }
  tc_mark(7);
}

}  // namespace

namespace {
unsigned long long* g_env_trace = nullptr;
std::string g_env_trace_path;
bool moe_env_trace = false;
constexpr size_t kEnvTraceBlocks = 8192;
void dump_env_trace() {
  std::vector<unsigned long long> h(kEnvTraceBlocks * 8);
  if (cudaMemcpy(h.data(), g_env_trace, h.size() * 8, cudaMemcpyDeviceToHost) != cudaSuccess) return;
  FILE* f = std::fopen(g_env_trace_path.c_str(), "w");
  if (f == nullptr) return;
  // A block that ran has its entry mark (0); its unwritten marks stay 0 and are left out, except the MoE's SM id (6),
  // which is 0 on SM 0.
  for (size_t b = 0; b < kEnvTraceBlocks; ++b)
    for (int k = 0; k < 8; ++k)
      if (h[b * 8 + k] != 0 || (k == 6 && h[b * 8] != 0 && moe_env_trace))
        std::fprintf(f, "%zu,%d,%llu\n", b, k, h[b * 8 + k]);
  std::fclose(f);
}
}  // namespace

void tc_trace_from_env() {
  if (g_env_trace != nullptr) return;
  const char* moe = std::getenv("LILAC_MOE_TRACE");
  const char* dense = std::getenv("LILAC_GEMV_TRACE");
  if (moe == nullptr && dense == nullptr) return;
  LILAC_CUDA_CHECK(cudaMalloc(&g_env_trace, kEnvTraceBlocks * 8 * 8));
  LILAC_CUDA_CHECK(cudaMemset(g_env_trace, 0, kEnvTraceBlocks * 8 * 8));
  LILAC_CUDA_CHECK(cudaDeviceSynchronize());
  unsigned long long* buf = g_env_trace;
  if (moe != nullptr) {
    moe_tc_trace(buf);
    g_env_trace_path = moe;
    moe_env_trace = true;
  } else {
    LILAC_CUDA_CHECK(cudaMemcpyToSymbol(g_tc_trace, &buf, sizeof(buf)));
    g_env_trace_path = dense;
  }
  std::atexit(dump_env_trace);
}

void gemv_tc_trace(unsigned long long* buf) {
  LILAC_CUDA_CHECK(cudaMemcpyToSymbol(g_tc_trace, &buf, sizeof(buf)));
  moe_tc_trace(buf);  // the MoE kernels' copy (moe_tc.cu)
}

bool gemv_tc_supported(const GemvArgs& a) {
  const int K = int(a.W.cols);
  if (!shape_ok(a.W) || !aligned16(a.x)) return false;
  if (a.pro == Prologue::RmsNorm && !aligned16(a.norm_w)) return false;
  if (a.pro == Prologue::GatedHeadNorm &&
      (a.head_dim <= 0 || a.head_dim % 4 != 0 || K % a.head_dim != 0 || !aligned16(a.z) || !aligned16(a.norm_w)))
    return false;
  if (a.conv_rows > 0 && (a.conv_k < 1 || a.conv_k > kMaxConvK)) return false;
  return size_t(tc_smem_bytes(K, a.pro, a.head_dim)) <= kMaxSmem;
}

void gemv_tc(const GemvArgs& a, cudaStream_t stream) {
  const int64_t K = a.W.cols, KT = tc_kt(int(K)), nrb = (a.W.rows + 15) / 16;
  // k-slices per row block: enough warps in flight (~3 blocks of 8 warps per SM) for small matrices.
  const int64_t target = int64_t(sm_count()) * kMinBlocks<4> * kWarps;
  int KS = 1;
  while (KS < kWarps && KS < KT && nrb * KS < target) KS *= 2;
  const size_t smem = size_t(tc_smem_bytes(int(K), a.pro, a.head_dim));
  auto go = [&](auto kernel) {
    const int RB = kWarps / KS;
    const int64_t groups = (nrb + RB - 1) / RB;
    launch_pdl(kernel, dim3(grid_of(groups, resident_blocks(kernel, smem))), dim3(kThreads), smem, stream, a);
  };
  if (a.W.bits == 4) {
    switch (KS) {
      case 1: go(gemv_tc_kernel<4, 1>); break;
      case 2: go(gemv_tc_kernel<4, 2>); break;
      case 4: go(gemv_tc_kernel<4, 4>); break;
      default: go(gemv_tc_kernel<4, 8>); break;
    }
  } else {
    switch (KS) {
      case 1: go(gemv_tc_kernel<8, 1>); break;
      case 2: go(gemv_tc_kernel<8, 2>); break;
      case 4: go(gemv_tc_kernel<8, 4>); break;
      default: go(gemv_tc_kernel<8, 8>); break;
    }
  }
}

}  // namespace lilac::cuda
