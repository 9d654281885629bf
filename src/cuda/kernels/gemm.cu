// qgemm / qgemm_swiglu (prefill.h) and the launcher of the shared quantized GEMM kernel (gemm.cuh).
#include <string>

#include "core/error.h"
#include "cuda/kernels/gemm.cuh"
#include "cuda/kernels/prefill.h"

namespace lilac::cuda {
namespace gemm {

template <int BITS, bool GROUPED, int EPI>
static void launch_one(const Params& p, int grid_y, cudaStream_t stream) {
  auto kern = qgemm_kernel<BITS, GROUPED, EPI>;
  constexpr int smem = Smem<BITS>::TOTAL;
  static bool attr_set = false;  // per instantiation (per device is fine: one GPU per process)
  if (!attr_set) {
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) throw Error(std::string("qgemm: cudaFuncSetAttribute: ") + cudaGetErrorString(e));
    attr_set = true;
  }
  constexpr int bn_out = EPI == EPI_SWIGLU_BF16 ? BN / 2 : BN;
  dim3 grid((p.N + bn_out - 1) / bn_out, grid_y);
  kern<<<grid, THREADS, smem, stream>>>(p);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw Error(std::string("qgemm: launch failed: ") + cudaGetErrorString(e));
}

template <int BITS, bool GROUPED>
static void launch_bits(const Params& p, int epi, int grid_y, cudaStream_t stream) {
  switch (epi) {
    case EPI_STORE_F32: return launch_one<BITS, GROUPED, EPI_STORE_F32>(p, grid_y, stream);
    case EPI_ADD_F32: return launch_one<BITS, GROUPED, EPI_ADD_F32>(p, grid_y, stream);
    case EPI_STORE_BF16: return launch_one<BITS, GROUPED, EPI_STORE_BF16>(p, grid_y, stream);
    case EPI_SWIGLU_BF16: return launch_one<BITS, GROUPED, EPI_SWIGLU_BF16>(p, grid_y, stream);
    case EPI_SCALED_F32: return launch_one<BITS, GROUPED, EPI_SCALED_F32>(p, grid_y, stream);
  }
  throw Error("qgemm: bad epilogue");
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

void qgemm(const QMatrixDev& W, const __nv_bfloat16* X, int64_t ldx, int n, void* Y, int64_t ldy, GemmOut mode,
           cudaStream_t stream) {
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
  gemm::launch(p, W.bits, false, epi, (n + gemm::BM - 1) / gemm::BM, stream);
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
