// qgemm / qgemm_swiglu (gemm.h) and the launcher of the shared quantized GEMM kernel (gemm.cuh).
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.h"
#include "cuda/cuda_common.h"
#include "cuda/kernels/gemm/gemm.cuh"
#include "cuda/kernels/gemm/gemm_rs.cuh"
#include "cuda/kernels/gemm/gemm.h"
#include "cuda/kernels/launch.cuh"
#include "cuda/kernels/stream_scratch.h"

namespace lilac::cuda {
namespace gemm {

// Whether the quantized GEMMs use wgmma by default on Hopper (LILAC_QGEMM_WGMMA=0/1 overrides).
constexpr bool kWgmmaDefault = true;  // verified on H200 2026-11-29 (tests + timings, GPU_NOTES.md)

__global__ void probe_wgmma_kernel(int* out) { *out = LILAC_WGMMA; }

namespace {
std::atomic<int> g_forced{0};     // 0 auto, 1 mma.sync, 2 wgmma, 3 wgmma with 4-bit weights from shared memory
std::atomic<int> g_probe{-1};     // -1 unknown, 0 no sm_90a code / not Hopper, 1 wgmma usable

// Is the wgmma kernel usable on the current device? Probed once, outside graph capture.
bool wgmma_usable(cudaStream_t stream) {
  int v = g_probe.load();
  if (v >= 0) return v == 1;
  if (capturing(stream)) return false;  // decide later, outside a capture
  int dev = 0, major = 0, minor = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  int result = 0;
  if (major == 9 && minor == 0) {
    int* d = nullptr;
    cudaStream_t ps;
    if (cudaStreamCreateWithFlags(&ps, cudaStreamNonBlocking) == cudaSuccess) {
      if (cudaMalloc(&d, sizeof(int)) == cudaSuccess) {
        probe_wgmma_kernel<<<1, 1, 0, ps>>>(d);
        int h = 0;
        if (cudaMemcpyAsync(&h, d, sizeof(int), cudaMemcpyDeviceToHost, ps) == cudaSuccess &&
            cudaStreamSynchronize(ps) == cudaSuccess)
          result = h;
        cudaFree(d);
      }
      cudaStreamDestroy(ps);
    }
  }
  cudaGetLastError();
  g_probe.store(result);
  return result == 1;
}

bool use_wgmma(cudaStream_t stream) {
  const int forced = g_forced.load();
  if (forced == 1) return false;
  if (forced == 0) {
    const char* port = std::getenv("LILAC_CUDA_PORTABLE");
    if (port && std::strcmp(port, "1") == 0) return false;
    const char* env = std::getenv("LILAC_QGEMM_WGMMA");
    const bool want = env ? std::strcmp(env, "1") == 0 : kWgmmaDefault;
    if (!want) return false;
  }
  return wgmma_usable(stream);
}
}  // namespace

// Pipeline stages of the device code for the current device (see STAGES in gemm.cuh).
int device_stages() {
  static std::atomic<int> stages{0};
  int s = stages.load();
  if (s == 0) {
    int dev = 0, major = 0, minor = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    s = stages_for(major, minor);
    stages.store(s);
  }
  return s;
}

// Whether a plain 4-bit GEMM on the wgmma path takes the register-operand kernel (gemm_rs.cuh): what the kernel
// needs (K a multiple of 512 with room for its scales) and, on the default path, where it pays (long prompts, long
// K, at least a wave of blocks). A forced GemmPath::Wgmma takes it whenever it can run (the tests' shapes);
// GemmPath::WgmmaSmem or LILAC_QGEMM_RS=0 never.
static bool rs_takes(const Params& p, int grid_x) {
  const int forced = g_forced.load();
  if (forced == 3) return false;
  static const bool env_on = env_switch_on("LILAC_QGEMM_RS");  // read once: this runs for every prefill GEMM launch
  if (forced == 0 && !env_on) return false;
  const int kt = int(p.W0.cols / BK);
  if (kt % 8 != 0 || kt > RsSmem::MAX_KT) return false;
  if (forced == 2) return true;
  const int64_t blocks = int64_t(grid_x) * ((p.M + RS_TN - 1) / RS_TN);
  return p.M >= kRsMinRows && kt >= kRsMinKT && blocks >= sm_count();
}

template <typename Kern>
static void set_smem_once(Kern kern, int smem, bool& done) {
  if (done) return;
  cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess)
    throw Error("qgemm: cannot get " + std::to_string(smem) + " bytes of shared memory per block: " +
                cudaGetErrorString(e));
  done = true;
}

template <int BITS, bool GROUPED, int EPI, bool WG, bool SPLIT = false>
static void launch_one(const Params& p, int grid_y, cudaStream_t stream) {
  constexpr int bn_out = EPI == EPI_SWIGLU_BF16 ? BN / 2 : BN;
  dim3 grid((p.N + bn_out - 1) / bn_out, grid_y, p.k_split);
  if constexpr (WG && BITS == 4 && !GROUPED && !SPLIT && EPI != EPI_SCALED_F32) {
    if (rs_takes(p, int(grid.x))) {
      const int kt = int(p.W0.cols / BK);
      auto kern = qgemm_rs_kernel<EPI>;
      static bool attr_set = false;  // per instantiation (one GPU per process)
      set_smem_once(kern, RsSmem::alloc(RsSmem::MAX_KT), attr_set);
      kern<<<dim3(grid.x, (p.M + RS_TN - 1) / RS_TN), THREADS, RsSmem::alloc(kt), stream>>>(p);
      cudaError_t e = cudaGetLastError();
      if (e != cudaSuccess) throw Error(std::string("qgemm: launch failed: ") + cudaGetErrorString(e));
      return;
    }
  }
  auto kern = qgemm_kernel<BITS, GROUPED, EPI, WG, SPLIT>;
  const int smem = Smem<BITS>::total(device_stages()) + (WG ? 1024 : 0);
  static bool attr_set = false;  // per instantiation (per device is fine: one GPU per process)
  set_smem_once(kern, smem, attr_set);
  cudaError_t e = cudaSuccess;
  if (SPLIT && p.split_cluster) {  // the k_split blocks of a tile as one cluster (split_cluster_store)
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(THREADS);
    cfg.dynamicSmemBytes = size_t(smem);
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 1;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = unsigned(p.k_split);
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    e = cudaLaunchKernelEx(&cfg, kern, p);
  } else {
    kern<<<grid, THREADS, smem, stream>>>(p);
  }
  if (e == cudaSuccess) e = cudaGetLastError();
  if (e != cudaSuccess) throw Error(std::string("qgemm: launch failed: ") + cudaGetErrorString(e));
}

template <int BITS, bool GROUPED, int EPI, bool SPLIT = false>
static void launch_wg(const Params& p, int grid_y, cudaStream_t stream) {
  if (use_wgmma(stream)) return launch_one<BITS, GROUPED, EPI, true, SPLIT>(p, grid_y, stream);
  launch_one<BITS, GROUPED, EPI, false, SPLIT>(p, grid_y, stream);
}

// Instantiated combinations: plain 4-bit (all epilogues), plain 8-bit (router / gates: f32 stores),
// grouped 4-bit (SwiGLU gate+up, scaled down).
template <int BITS, bool GROUPED>
static void launch_bits(const Params& p, int epi, int grid_y, cudaStream_t stream) {
  if (p.k_split > 1) {  // split-K partials (plain GEMMs only)
    if constexpr (!GROUPED)
      if (epi == EPI_STORE_F32) return launch_wg<BITS, false, EPI_STORE_F32, true>(p, grid_y, stream);
    throw Error("qgemm: split-K needs a plain GEMM with fp32 partials");
  }
  if constexpr (GROUPED) {
    if (BITS == 4 && epi == EPI_SWIGLU_BF16) return launch_wg<4, true, EPI_SWIGLU_BF16>(p, grid_y, stream);
    if (BITS == 4 && epi == EPI_SCALED_F32) return launch_wg<4, true, EPI_SCALED_F32>(p, grid_y, stream);
  } else if constexpr (BITS == 8) {
    switch (epi) {
      case EPI_STORE_F32: return launch_wg<8, false, EPI_STORE_F32>(p, grid_y, stream);
      case EPI_ADD_F32: return launch_wg<8, false, EPI_ADD_F32>(p, grid_y, stream);
      case EPI_STORE_BF16: return launch_wg<8, false, EPI_STORE_BF16>(p, grid_y, stream);
    }
  } else {
    switch (epi) {
      case EPI_STORE_F32: return launch_wg<BITS, false, EPI_STORE_F32>(p, grid_y, stream);
      case EPI_ADD_F32: return launch_wg<BITS, false, EPI_ADD_F32>(p, grid_y, stream);
      case EPI_STORE_BF16: return launch_wg<BITS, false, EPI_STORE_BF16>(p, grid_y, stream);
      case EPI_SWIGLU_BF16: return launch_wg<BITS, false, EPI_SWIGLU_BF16>(p, grid_y, stream);
    }
  }
  throw Error("qgemm: unsupported epilogue / bits combination");
}

static void check_matrix(const QMatrixDev& W, const char* what) {
  if (W.bits != 4 && W.bits != 8)
    throw Error(std::string(what) + ": qgemm supports 4- and 8-bit weights, got bits=" + std::to_string(W.bits));
  if (W.group_size != BK)
    throw Error(std::string(what) + ": qgemm needs group_size 64, got " + std::to_string(W.group_size));
  if (W.cols % BK != 0 || W.cols <= 0 || W.rows <= 0)
    throw Error(std::string(what) + ": qgemm needs cols a positive multiple of 64, got " + std::to_string(W.cols));
  if (!W.qweight || !W.scales || !W.biases) throw Error(std::string(what) + ": null weight pointer");
  if (reinterpret_cast<uintptr_t>(W.qweight) % 16) throw Error(std::string(what) + ": qweight not 16-byte aligned");
}

void launch(const Params& p, int bits, bool grouped, int epi, int grid_y, cudaStream_t stream) {
  check_matrix(grouped ? p.W0s.first : p.W0, "qgemm weight");
  if (reinterpret_cast<uintptr_t>(p.X) % 16 || p.ldx % 8)
    throw Error("qgemm: X must be 16-byte aligned with a row stride that is a multiple of 8 elements");
  if (grid_y <= 0 || p.N <= 0) return;
  if (bits == 4) {
    grouped ? launch_bits<4, true>(p, epi, grid_y, stream) : launch_bits<4, false>(p, epi, grid_y, stream);
  } else {
    grouped ? launch_bits<8, true>(p, epi, grid_y, stream) : launch_bits<8, false>(p, epi, grid_y, stream);
  }
}

}  // namespace gemm

void set_gemm_path(GemmPath path) {
  gemm::g_forced.store(path == GemmPath::MmaSync ? 1 : path == GemmPath::Wgmma ? 2 : path == GemmPath::WgmmaSmem ? 3 : 0);
}
bool gemm_wgmma_available() {
  const char* port = std::getenv("LILAC_CUDA_PORTABLE");
  if (port && std::strcmp(port, "1") == 0) return false;
  return gemm::wgmma_usable(nullptr);
}

namespace {

// Whether a split-K GEMM adds its partials inside a thread-block cluster (split_cluster_store, gemm.cuh) instead of
// through a partial buffer and splitk_reduce_kernel: sm_90+, unless LILAC_SPLITK_CLUSTER=0 (read once) or a test
// chose (set_splitk_cluster). Both give the same bits.
std::atomic<int> g_split_cluster{0};  // 0 auto, 1 on, 2 off
bool split_cluster_on() {
  const int forced = g_split_cluster.load();
  if (forced != 0) return forced == 1 && splitk_cluster_available();
  static const bool env_on = env_switch_on("LILAC_SPLITK_CLUSTER");
  return env_on && splitk_cluster_available();
}

// Y[m, n] (=|+=) Σ_z partial[z][m][n], z in order: the deterministic end of a split-K GEMM.
__global__ void splitk_reduce_kernel(const float* __restrict__ partial, int S, int M, int N, float* __restrict__ Y,
                                     int64_t ldy, bool add) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(M) * N) return;
  const int64_t m = i / N, n = i % N, plane = int64_t(M) * N;
  float v = 0.f;
  for (int z = 0; z < S; ++z) v += partial[z * plane + i];
  float* y = Y + m * ldy + n;
  *y = add ? *y + v : v;
}

StreamScratch g_splitk_scratch;

// k splits for a plain GEMM of `ctas` output tiles (m_tiles of them along the tokens) and KT k tiles: none for GEMMs
// with a block per SM already and above 1024 tokens (measured on the H200: faster at 128 and 512 tokens, slightly
// slower at 2048 and 4096); else at least 4 k tiles per block, at most 8 splits and enough blocks for ~2 per SM where
// clusters are unavailable, ~1 per SM where they are, on either path (LILAC_SPLITK_CLUSTER=0 keeps the splits, so the
// two paths give the same bits): the cluster's sums cost a block more than its partial's store (H200, against 2 per SM
// and against a model that counted waves: +0.5–2 % prefill at 128–1024 tokens).
int k_splits(int64_t ctas, int m_tiles, int KT) {
  const int64_t sms = sm_count();
  if (ctas >= sms || KT < 8 || m_tiles > 8) return 1;
  const int64_t target = splitk_cluster_available() ? sms : 2 * sms;
  return int(std::max<int64_t>(1, std::min<int64_t>({8, KT / 4, (target + ctas - 1) / ctas})));
}

// The k splits of a plain GEMM of n rows (1: none).
int split_of(const QMatrixDev& W, int n, GemmOut mode) {
  if (mode == GemmOut::StoreBF16 || W.cols % gemm::BK != 0) return 1;
  const int grid_y = (n + gemm::BM - 1) / gemm::BM;
  return k_splits(int64_t(grid_y) * ((W.rows + gemm::BN - 1) / gemm::BN), grid_y, int(W.cols / gemm::BK));
}

}  // namespace

// Clusters need an sm_90 device and device code compiled for it (split_cluster_store compiles to nothing below sm_90,
// e.g. in a binary without sm_90 code whose PTX the driver JIT-compiles for a Hopper part): the wgmma probe (the
// binary's sm_90a code running on a Hopper device) answers both.
bool splitk_cluster_available() { return gemm::wgmma_usable(nullptr); }
void set_splitk_cluster(SplitKPath path) {
  g_split_cluster.store(path == SplitKPath::Cluster ? 1 : path == SplitKPath::Reduce ? 2 : 0);
}

size_t qgemm_split_floats(const QMatrixDev& W, int n, GemmOut mode) {
  if (split_cluster_on()) return 0;  // the cluster path keeps its partials in shared memory
  // S · rows · W.rows for the largest chunk of each row-tile count (S depends on the tile count alone)
  size_t need = 0;
  for (int tiles = 1; tiles <= (n + gemm::BM - 1) / gemm::BM; ++tiles) {
    const int rows = std::min(n, tiles * gemm::BM), S = split_of(W, rows, mode);
    if (S > 1) need = std::max(need, size_t(S) * size_t(rows) * size_t(W.rows));
  }
  return need;
}

void qgemm(const QMatrixDev& W, const __nv_bfloat16* X, int64_t ldx, int n, void* Y, int64_t ldy, GemmOut mode,
           cudaStream_t stream, SplitScratch scratch) {
  if (n <= 0) return;
  gemm::Params p;
  p.X = X;
  p.ldx = ldx;
  p.M = n;
  p.W0 = W;
  p.N = int(W.rows);
  p.Y = Y;
  p.ldy = ldy;
  int epi = mode == GemmOut::StoreF32 ? gemm::EPI_STORE_F32
            : mode == GemmOut::AddF32 ? gemm::EPI_ADD_F32
                                      : gemm::EPI_STORE_BF16;
  const int grid_y = (n + gemm::BM - 1) / gemm::BM;
  // Small grids (few tokens, few output rows: router, projections back to the hidden size) split K so
  // that the GPU has enough blocks; fp32 outputs only.
  const int S = split_of(W, n, mode);
  if (S > 1 && split_cluster_on()) {
    p.k_split = S;
    p.split_cluster = true;
    p.split_add = mode == GemmOut::AddF32;
    gemm::launch(p, W.bits, false, gemm::EPI_STORE_F32, grid_y, stream);
    return;
  }
  if (S > 1) {
    const size_t need = size_t(S) * size_t(n) * size_t(p.N);
    float* ws = nullptr;
    if (scratch.p != nullptr) {
      if (scratch.floats < need)
        throw Error("qgemm: split-k scratch of " + std::to_string(scratch.floats) + " floats, " +
                    std::to_string(need) + " needed");
      ws = scratch.p;
    } else if (!capturing(stream)) {  // no allocation inside a capture
      ws = g_splitk_scratch.get(stream, need);
    }
    if (ws != nullptr) {
      p.k_split = S;
      p.partial = ws;
      gemm::launch(p, W.bits, false, gemm::EPI_STORE_F32, grid_y, stream);
      const int64_t total = int64_t(n) * p.N;
      splitk_reduce_kernel<<<unsigned((total + 255) / 256), 256, 0, stream>>>(ws, S, n, p.N, static_cast<float*>(Y),
                                                                              ldy, mode == GemmOut::AddF32);
      const cudaError_t e = cudaGetLastError();
      if (e != cudaSuccess) throw Error(std::string("qgemm: split-k reduce launch failed: ") + cudaGetErrorString(e));
      return;
    }
  }
  gemm::launch(p, W.bits, false, epi, grid_y, stream);
}

void qgemm_swiglu(const QMatrixDev& G, const QMatrixDev& U, const __nv_bfloat16* X, int64_t ldx, int n,
                  __nv_bfloat16* H, int64_t ldh, cudaStream_t stream) {
  if (n <= 0) return;
  if (G.rows != U.rows || G.cols != U.cols || G.bits != U.bits || G.group_size != U.group_size)
    throw Error("qgemm_swiglu: gate and up matrices differ in shape or quantization");
  gemm::Params p;
  p.X = X;
  p.ldx = ldx;
  p.M = n;
  p.W0 = G;
  p.W1 = U;
  p.N = int(G.rows);
  p.Y = H;
  p.ldy = ldh;
  gemm::launch(p, G.bits, false, gemm::EPI_SWIGLU_BF16, (n + gemm::BM - 1) / gemm::BM, stream);
}

}  // namespace lilac::cuda
