// Staging of M input rows for the tensor-core kernels (rows_mm.h: stage): one block per row computes t(x)
// (None / RmsNorm / GatedHeadNorm) and its hi/lo fp16 fragments exactly as gemv_tc.cu's in-block staging
// does (same 256-thread partial sums, block reduction and per-group shuffles), and writes them to global
// memory, where every block of the following GEMV / MoE kernels copies the rows it needs; and, when asked, the
// digits MoE's input (digits/moe_digits.h) from the same values t(x).
#include <algorithm>

#include "cuda/cuda_common.h"
#include "cuda/kernels/launch.cuh"
#include "cuda/kernels/rows/rows_mm.h"
#include "cuda/kernels/rows/stage_row.cuh"

namespace lilac::cuda::rows {
namespace {

using namespace rows_dev;

constexpr size_t kMaxStageSmem = 96 * 1024;

// Block (r, y): row r, its units [y·S, y·S + S) where the row is cut into slices of S units (S = blockDim.x,
// stage_slice_units), else (S = 0, gridDim.y = 1, kThreads) the whole row.
__global__ void __launch_bounds__(kThreads) stage_kernel(StageArgs a, int S) {
  extern __shared__ float4 smem4[];
  __shared__ float red[32];
  const int K = int(a.K), r = blockIdx.x;
  const StageSmem m = stage_smem(smem4, K, a.pro, a.head_dim);
  if (!stage_enter(a, r, m)) return;
  UnitRange ur;
  if (S > 0) {
    ur.u0 = int(blockIdx.y) * S;
    ur.u1 = min(ur.u0 + S, tc_kt(K) * kTileCols / 8);
  }
  const int64_t ldx = a.ldx > 0 ? a.ldx : a.K, ldz = a.ldz > 0 ? a.ldz : a.K;
  const float* x = a.x + r * ldx;
  const float* z = a.z + r * ldz;
  const int i1 = S > 0 ? min(2 * ur.u1, K / 4) : K / 4;  // the range's float4s that hold values
  for (int i = 2 * ur.u0 + threadIdx.x; i < i1; i += blockDim.x) {
    cp_async16(m.xs + 4 * i, x + 4 * i);
    if (a.pro == Prologue::GatedHeadNorm) cp_async16(m.zs + 4 * i, z + 4 * i);
  }
  cp_async_wait_all();
  __syncthreads();
  stage_row(a, r, m, red, ur);
}

bool aligned16(const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

size_t frag_row_bytes(int64_t K) { return size_t(tc_kt(K)) * kTileXBytes; }
size_t meta_row_count(int64_t K) { return size_t(tc_kt(K)) * 4; }

bool stage_supported(const StageArgs& a) {
  const bool frags = a.frag4 != nullptr || a.frag4g != nullptr || a.frag4w != nullptr || a.frag8 != nullptr;
  if (a.K <= 0 || a.K % kGroup != 0 || a.M < 0 || (frags && a.meta == nullptr) || (!frags && a.digits == nullptr))
    return false;
  const int64_t ldx = a.ldx > 0 ? a.ldx : a.K, ldz = a.ldz > 0 ? a.ldz : a.K;
  if (!aligned16(a.x) || ldx % 4 != 0 || !aligned16(a.frag4) || !aligned16(a.frag4g) || !aligned16(a.frag4w) ||
      !aligned16(a.frag8) || !aligned16(a.meta))
    return false;
  if (a.pro == Prologue::RmsNorm && (a.norm_w == nullptr || !aligned16(a.norm_w))) return false;
  if (a.pro == Prologue::GatedHeadNorm &&
      (a.head_dim <= 0 || a.head_dim % 4 != 0 || a.K % a.head_dim != 0 || a.z == nullptr || !aligned16(a.z) ||
       ldz % 4 != 0 || a.norm_w == nullptr || !aligned16(a.norm_w)))
    return false;
  return size_t(stage_smem_bytes(int(a.K), a.pro, a.head_dim)) <= kMaxStageSmem;
}

void stage(const StageArgs& a, cudaStream_t stream) {
  if (!stage_supported(a)) throw Error("rows::stage: unsupported arguments (K " + std::to_string(a.K) + ")");
  if (a.M == 0) return;
  const size_t smem = size_t(stage_smem_bytes(int(a.K), a.pro, a.head_dim));
  if (smem > 48 * 1024)
    LILAC_CUDA_CHECK(cudaFuncSetAttribute(stage_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  // rows cut into slices where the prologue allows it (a block's chain, not the row's work, sets the launch's time);
  // LILAC_STAGE_SLICES=0: a block per row (measurement)
  static const bool slices_on = env_switch_on("LILAC_STAGE_SLICES");
  const int S = slices_on ? stage_slice_units(a) : 0;
  const int n8t = tc_kt(int(a.K)) * kTileCols / 8;
  if (S > 0)
    launch_pdl(stage_kernel, dim3(a.M, (n8t + S - 1) / S), dim3(S), smem, stream, a, S);
  else
    launch_pdl(stage_kernel, dim3(a.M), dim3(kThreads), smem, stream, a, 0);
}

}  // namespace lilac::cuda::rows
