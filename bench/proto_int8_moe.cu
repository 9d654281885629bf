// Prototype (not part of the build; bench/BENCHMARKS.md "Twelfth stop" quotes its output): the MoE's routed gate/up
// and down on the integer tensor cores, in the arithmetic of src/cuda/kernels/digits/digits.h (whose header explains it).
// Routing random (8 distinct experts of 256 per row) plus the shared expert for every row; a chunk holds up to 8
// entries of one expert (one digit n-tile holds 8 rows). Timed as bench_kernels_rows times main's MoE rows kernels.
// nvcc -O3 -std=c++20 -arch=sm_90a -I src -o proto_int8_moe bench/proto_int8_moe.cu src/cuda/kernels/launch.cu
// proto_int8_moe [M]: M = 1, 4, 16 and 64 rows, or that M only (for Nsight Compute).
#include "proto_int8_common.cuh"

namespace {
using namespace proto_i8;

// The MoE kernel's D weight tiles in flight per warp (registers): tile i of the warp's sequence sits in slot i % D.
template <int D>
struct TileRing {
  uint4 w[D];
  uint32_t s0[D], s1[D];
  const uint4* lw = nullptr;     // the next tile to request: this lane's 16 bytes
  const uint32_t* ls = nullptr;  // its scale words of rows g and g + 8
  __device__ __forceinline__ void fetch(int i) {
    w[i] = ld_stream(lw);
    s0[i] = __ldg(ls);
    s1[i] = __ldg(ls + 8);
  }
  __device__ __forceinline__ void advance(int64_t tiles) {
    lw += tiles * 32;
    ls += tiles * 16;
  }
};

// ------------------------------------------------------------------------------------------------ MoE gate/up
// The routed shape: E experts (+ the shared one as expert E), each 16·rbe rows × K (gate/up: 1024 × 2048, down:
// 2048 × 512); a row's 8 experts grouped into chunks of <= 8 entries per expert (one n-tile per digit); an entry's
// input is row entry_row[entry] of xr (gate/up: the token's row; down: the entry's own act). Items = (chunk, 8 row
// blocks); a block takes
// items b, b + grid, ..., stages the next item's rows' digits (gathered by row) into its second buffer by cp.async
// while its warps compute the current one (a warp a row block, the whole K, D tiles in flight across items).
struct MoEArgs {
  const uint4* qp;     // [E + 1][64 row blocks][G][32]
  const uint32_t* sb;  // [E + 1][64][G][16]
  int K;
  const char* xr;      // [M][L][G][64] digits per row
  const float2* meta;  // [M][G]
  const int4* chunks;  // {expert, first entry, rows, 0}
  const int* entry_row;
  int nchunks;
  int rbe;             // row blocks per expert (a multiple of 8)
  float* y;            // [entries][16·rbe]
};

__device__ __forceinline__ void cp8(uint32_t dst, const void* src, int n) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(dst), "l"(src), "r"(n) : "memory");
}

template <int L, int D>
__global__ void __launch_bounds__(kThreads, 2) moe_i8(MoEArgs a) {
  extern __shared__ uint4 sm4[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g8 = lane >> 2, c = lane & 3;
  const int G = a.K / 64, ipc = a.rbe / 8, items = a.nchunks * ipc, ldy = a.rbe * 16;
  const uint32_t digits_bytes = uint32_t(L * G * 8 * 64), buf_bytes = digits_bytes + uint32_t(G * 8 * 8);
  const uint32_t sbase = uint32_t(__cvta_generic_to_shared(sm4));
  const char* sgen = reinterpret_cast<const char*>(sm4);

  TileRing<D> ring;
  int litem = blockIdx.x, lg = 0;
  auto lstart = [&]() {
    if (litem < items) {
      const int64_t t0 = (int64_t(a.chunks[litem / ipc].x) * a.rbe + (litem % ipc) * 8 + warp) * G;
      ring.lw = a.qp + t0 * 32 + lane;
      ring.ls = a.sb + t0 * 16 + g8;
    }
  };
  lstart();
  auto load = [&](int i) {
    if (litem < items) ring.fetch(i);
    ring.advance(1);
    if (++lg == G) {
      lg = 0;
      litem += gridDim.x;
      lstart();
    }
  };
#pragma unroll
  for (int i = 0; i < D; ++i) load(i);
  auto stage = [&](int it, int b) {
    const int4 ch = a.chunks[it / ipc];
    const uint32_t dst = sbase + b * buf_bytes;
    for (int idx = threadIdx.x; idx < L * G * 32; idx += kThreads) {
      const int q = idx & 3, col = (idx >> 2) & 7, lgi = idx >> 5;
      const bool on = col < ch.z;
      const int row = on ? a.entry_row[ch.y + col] : 0;
      const int l = lgi / G, g = lgi % G;
      cp_async16_zfill(dst + uint32_t(((l * G + g) * 8 + col) * 64 + q * 16), a.xr + ((int64_t(row) * L + l) * G + g) * 64 + q * 16,
           on ? 16 : 0);
    }
    for (int idx = threadIdx.x; idx < G * 8; idx += kThreads) {
      const int col = idx & 7, g = idx >> 3;
      const bool on = col < ch.z;
      const int row = on ? a.entry_row[ch.y + col] : 0;
      cp8(dst + digits_bytes + uint32_t(idx * 8), a.meta + int64_t(row) * G + g, on ? 8 : 0);
    }
  };
  pdl_wait();
  pdl_trigger();
  int item = blockIdx.x;
  if (item < items) stage(item, 0);
  cp_async_commit();
  for (int n = 0; item < items; ++n, item += gridDim.x) {
    const int4 ch = a.chunks[item / ipc];
    if (item + int(gridDim.x) < items) stage(item + gridDim.x, (n + 1) & 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const uint32_t xb = sbase + (n & 1) * buf_bytes + g8 * 64 + c * 16;
    const float2* mp = reinterpret_cast<const float2*>(sgen + (n & 1) * buf_bytes + digits_bytes) + 2 * c;
    float acc[1][4] = {{0.f, 0.f, 0.f, 0.f}}, tot[4] = {0.f, 0.f, 0.f, 0.f};
    for (int g0 = 0; g0 < G; g0 += D) {
#pragma unroll
      for (int i = 0; i < D; ++i) {
        const int gl = g0 + i;
        const uint4 w = ring.w[i];
        const uint32_t s0 = ring.s0[i], s1 = ring.s1[i];
        load(i);
        tile_math<L, 1>(w, s0, s1, xb + gl * 512, uint32_t(G * 512), mp + gl * 8, acc);
        if (((gl + 1) & (kSliceGroups - 1)) == 0)
#pragma unroll
          for (int v = 0; v < 4; ++v) {
            tot[v] += acc[0][v];
            acc[0][v] = 0.f;
          }
      }
    }
    const int rb = (item % ipc) * 8 + warp;
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const int m = 2 * c + (v & 1);
      if (m < ch.z) a.y[int64_t(ch.y + m) * ldy + rb * 16 + g8 + 8 * (v >> 1)] = tot[v];
    }
    __syncthreads();  // this buffer is restaged at item n + 2
  }
}

__global__ void ref_moe(const uint4* qp, const uint32_t* sb, int R, int K, const float* x, const int* entry_row,
                        const int* entry_expert, int entries, double* yd) {
  const int o = blockIdx.x * blockDim.x + threadIdx.x, en = blockIdx.y;
  if (o >= R || en >= entries) return;
  const int G = K / 64, e = entry_expert[en], r = entry_row[en];
  const uint4* q = qp + int64_t(e) * (R / 16) * G * 32;
  const uint32_t* s = sb + int64_t(e) * (R / 16) * G * 16;
  double acc = 0;
  for (int k = 0; k < K; ++k) {
    const uint32_t w = s[(int64_t(o / 16) * G + k / 64) * 16 + o % 16];
    acc += double(fmaf(bf_lo(w), float(q_at(q, G, o, k)), bf_hi(w))) * x[int64_t(r) * K + k];
  }
  yd[int64_t(en) * R + o] = acc;
}

// The routed MoE at M rows: routing random (8 distinct experts per row) plus the shared expert for every row;
// gate/up (the token rows as input) or down (each entry's own act as input). The experts are held in enough copies
// that consecutive launches read ≥ 100 MB of distinct weights (L2 holds ~50 MB), as main's bench changes routings.
void run_moe(int sms, cudaStream_t st, bool down, int only) {
  constexpr int E = 256, L = 3, D = 4;
  const int R = down ? 2048 : 1024, K = down ? 512 : 2048, G = K / 64, rbe = R / 16;
  const int64_t tiles = int64_t(E + 1) * rbe * G;
  std::mt19937 rng(99);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint4> hq(static_cast<size_t>(tiles * 32));
  for (auto& v : hq) v = make_uint4(rng(), rng(), rng(), rng());
  std::vector<uint32_t> hs(static_cast<size_t>(tiles * 16));
  random_scales(hs, rng, nd);
  const double expert_bytes = double(R) * K / 2 + double(rbe) * G * 64;
  for (int M : {1, 4, 16, 64}) {
    if (only > 0 && M != only) continue;
    std::vector<std::vector<int>> rows_of(E + 1);
    for (int m = 0; m < M; ++m) {
      std::vector<int> ex;
      while (ex.size() < 8) {
        const int e = int(rng() % E);
        if (std::find(ex.begin(), ex.end(), e) == ex.end()) ex.push_back(e);
      }
      for (int e : ex) rows_of[e].push_back(m);
      rows_of[E].push_back(m);
    }
    std::vector<int4> chunks;
    std::vector<int> entry_row, entry_expert;
    for (int e = 0; e <= E; ++e)
      for (size_t i = 0; i < rows_of[e].size(); i += 8) {
        const int n = int(std::min<size_t>(8, rows_of[e].size() - i));
        chunks.push_back(make_int4(e, int(entry_row.size()), n, 0));
        for (int j = 0; j < n; ++j) {
          entry_row.push_back(rows_of[e][i + j]);
          entry_expert.push_back(e);
        }
      }
    const int entries = int(entry_row.size());
    if (down)  // an entry's input is its own act row
      for (int i = 0; i < entries; ++i) entry_row[i] = i;
    const int X = down ? entries : M, Xpad = (X + 7) / 8 * 8;
    int touched = 0;
    for (int e = 0; e < E; ++e) touched += !rows_of[e].empty();
    const int copies = std::max(2, int(std::ceil(100e6 / ((touched + 1) * expert_bytes))));
    uint4* dq;
    uint32_t* ds;
    CK(cudaMalloc(&dq, hq.size() * 16 * copies));
    CK(cudaMalloc(&ds, hs.size() * 4 * copies));
    for (int cp = 0; cp < copies; ++cp) {
      CK(cudaMemcpy(dq + hq.size() * cp, hq.data(), hq.size() * 16, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(ds + hs.size() * cp, hs.data(), hs.size() * 4, cudaMemcpyHostToDevice));
    }
    std::vector<float> hx(size_t(X) * K);
    for (int m = 0; m < X; ++m)
      for (int k = 0; k < K; ++k) hx[size_t(m) * K + k] = nd(rng) * (k % 53 == 7 ? 20.f : 1.f);
    float *dx, *dy;
    double* dyd;
    char *dxq, *dxr;
    float2 *dmeta, *dmr;
    int4* dch;
    int *der, *dee;
    CK(cudaMalloc(&dx, hx.size() * 4));
    CK(cudaMalloc(&dy, size_t(entries) * R * 4));
    CK(cudaMalloc(&dyd, size_t(entries) * R * 8));
    CK(cudaMalloc(&dxq, size_t(L) * G * Xpad * 64));
    CK(cudaMalloc(&dxr, size_t(X) * L * G * 64));
    CK(cudaMalloc(&dmeta, size_t(G) * Xpad * 8));
    CK(cudaMalloc(&dmr, size_t(X) * G * 8));
    CK(cudaMalloc(&dch, chunks.size() * 16));
    CK(cudaMalloc(&der, entries * 4));
    CK(cudaMalloc(&dee, entries * 4));
    CK(cudaMemcpy(dx, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dch, chunks.data(), chunks.size() * 16, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(der, entry_row.data(), entries * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dee, entry_expert.data(), entries * 4, cudaMemcpyHostToDevice));
    // digits per input row: the dense staging's, regathered [row][l][g] (the layout a routed kernel gathers by row)
    stage_digits<L><<<(Xpad * G + 127) / 128, 128, 0, st>>>(dx, X, Xpad, K, dxq, dmeta);
    CK(cudaStreamSynchronize(st));
    {
      std::vector<char> q(size_t(L) * G * Xpad * 64), r(size_t(X) * L * G * 64);
      std::vector<float2> mq(size_t(G) * Xpad), mr(size_t(X) * G);
      CK(cudaMemcpy(q.data(), dxq, q.size(), cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(mq.data(), dmeta, mq.size() * 8, cudaMemcpyDeviceToHost));
      for (int m = 0; m < X; ++m)
        for (int l = 0; l < L; ++l)
          for (int g = 0; g < G; ++g) {
            std::memcpy(&r[((size_t(m) * L + l) * G + g) * 64], &q[((size_t(l) * G + g) * Xpad + m) * 64], 64);
            mr[size_t(m) * G + g] = mq[size_t(g) * Xpad + m];
          }
      CK(cudaMemcpy(dxr, r.data(), r.size(), cudaMemcpyHostToDevice));
      CK(cudaMemcpy(dmr, mr.data(), mr.size() * 8, cudaMemcpyHostToDevice));
    }
    ref_moe<<<dim3((R + 127) / 128, entries), 128, 0, st>>>(dq, ds, R, K, dx, der, dee, entries, dyd);
    MoEArgs a{dq, ds, K, dxr, dmr, dch, der, int(chunks.size()), rbe, dy};
    const size_t smem = 2 * (size_t(L) * G * 8 * 64 + size_t(G) * 8 * 8);
    CK(cudaFuncSetAttribute(moe_i8<L, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    int occ = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, moe_i8<L, D>, kThreads, smem));
    const int grid = std::min(int(chunks.size()) * (rbe / 8), sms * std::max(occ, 1));
    auto run = [&](int i) {
      MoEArgs b = a;
      b.qp = dq + hq.size() * (i % copies);
      b.sb = ds + hs.size() * (i % copies);
      launch_pdl(moe_i8<L, D>, dim3(unsigned(grid)), dim3(kThreads), smem, st, b);
    };
    run(0);
    CK(cudaStreamSynchronize(st));
    std::vector<float> y(size_t(entries) * R);
    std::vector<double> yd(y.size());
    CK(cudaMemcpy(y.data(), dy, y.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(yd.data(), dyd, yd.size() * 8, cudaMemcpyDeviceToHost));
    double num = 0, den = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      num += (double(y[i]) - yd[i]) * (double(y[i]) - yd[i]);
      den += yd[i] * yd[i];
    }
    const double us = graph_us(st, run);
    std::printf("moe_%-7s_routed  M=%-2d L=%d experts %3d+1 chunks %3zu copies %2d: %8.1f us  %5.2f TB/s  rel_err %.2e\n",
                down ? "down" : "gate_up", M, L, touched, chunks.size(), copies, us, (touched + 1) * expert_bytes / us * 1e-6,
                std::sqrt(num / den));
    cudaFree(dx), cudaFree(dy), cudaFree(dyd), cudaFree(dxq), cudaFree(dxr), cudaFree(dmeta), cudaFree(dmr);
    cudaFree(dch), cudaFree(der), cudaFree(dee), cudaFree(dq), cudaFree(ds);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int only = argc > 1 ? std::atoi(argv[1]) : 0;  // 0: every M
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  run_moe(sms, st, false, only);
  run_moe(sms, st, true, only);
  return 0;
}
