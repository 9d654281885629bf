// The MoE router of a prefill chunk in fp32 (gemm.h, moe_router_f32): the block's input norm applied to the fp32
// residual rows and the quantized router dequantized in fp32 (s·q + b, MLX's affine form) — the decode GEMV's
// precision, where qgemm rounds both operands to bf16 before the tensor cores. A block takes RT rows and every
// expert: its rows, normalized, sit in shared memory; each warp walks an expert's packed row once and feeds all RT
// rows from every word it reads.
#include <string>

#include "core/error.h"
#include "cuda/kernels/gemm/gemm.h"

namespace lilac::cuda {
namespace {

constexpr int kThreads = 256;
constexpr size_t kSmemLimit = 48 * 1024;  // the default dynamic shared memory of a block

template <int BITS, int RT>
__global__ void __launch_bounds__(kThreads) router_f32_kernel(QMatrixDev W, RouterF32Input in, int n,
                                                               float* __restrict__ logits) {
  extern __shared__ float xs[];  // RT × cols: the normalized rows (zero past n)
  const int cols = int(W.cols), warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = kThreads / 32;
  const int row0 = blockIdx.x * RT;
  for (int r = warp; r < RT; r += warps) {
    float* x = xs + size_t(r) * cols;
    if (row0 + r >= n) {
      for (int c = lane; c < cols; c += 32) x[c] = 0.f;
      continue;
    }
    const float* h = in.h + int64_t(row0 + r) * in.ldh;
    float ss = 0.f;
    for (int c = lane; c < cols; c += 32) ss += h[c] * h[c];
    for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float rs = rsqrtf(ss / float(cols) + in.eps);
    for (int c = lane; c < cols; c += 32) x[c] = h[c] * rs * in.norm_w[c];
  }
  __syncthreads();
  constexpr int VPW = 32 / BITS;  // values per 32-bit word, the first in the low bits
  constexpr uint32_t kMask = (1u << BITS) - 1;
  const int64_t wpr = W.words_per_row(), gpr = W.groups_per_row();
  const int wpg = W.group_size / VPW;
  for (int e = warp; e < int(W.rows); e += warps) {
    const uint32_t* q = W.qweight + int64_t(e) * wpr;
    const __nv_bfloat16* sc = W.scales + int64_t(e) * gpr;
    const __nv_bfloat16* bi = W.biases + int64_t(e) * gpr;
    float acc[RT];
#pragma unroll
    for (int r = 0; r < RT; ++r) acc[r] = 0.f;
    for (int64_t wi = lane; wi < wpr; wi += 32) {
      const uint32_t word = q[wi];
      const int g = int(wi / wpg);
      const float s = __bfloat162float(sc[g]), b = __bfloat162float(bi[g]);
      const float* xk = xs + wi * VPW;
#pragma unroll
      for (int j = 0; j < VPW; ++j) {
        const float w = fmaf(s, float((word >> (j * BITS)) & kMask), b);
#pragma unroll
        for (int r = 0; r < RT; ++r) acc[r] = fmaf(w, xk[size_t(r) * cols + j], acc[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < RT; ++r) {
      float v = acc[r];
      for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0 && row0 + r < n) logits[int64_t(row0 + r) * W.rows + e] = v;
    }
  }
}

template <int BITS>
void launch(const QMatrixDev& W, const RouterF32Input& in, int n, float* logits, cudaStream_t stream) {
  const size_t row_bytes = size_t(W.cols) * sizeof(float);
  if (4 * row_bytes <= kSmemLimit)
    router_f32_kernel<BITS, 4><<<(n + 3) / 4, kThreads, 4 * row_bytes, stream>>>(W, in, n, logits);
  else
    router_f32_kernel<BITS, 1><<<n, kThreads, row_bytes, stream>>>(W, in, n, logits);
}

}  // namespace

bool moe_router_f32_fits(const QMatrixDev& W) {
  if (W.bits != 4 && W.bits != 8) return false;
  const int vpw = 32 / W.bits;
  return W.group_size > 0 && W.group_size % vpw == 0 && W.cols % W.group_size == 0 &&
         size_t(W.cols) * sizeof(float) <= kSmemLimit && W.rows >= 1;
}

void moe_router_f32(const QMatrixDev& W, const RouterF32Input& in, int n, float* logits, cudaStream_t stream) {
  if (n <= 0) return;
  if (!moe_router_f32_fits(W))
    throw Error("moe_router_f32: unsupported router (bits " + std::to_string(W.bits) + ", group size " +
                std::to_string(W.group_size) + ", " + std::to_string(W.cols) + " columns)");
  if (in.h == nullptr || in.norm_w == nullptr || in.ldh < W.cols)
    throw Error("moe_router_f32: the residual rows and the norm weights are required (ldh >= columns)");
  if (W.bits == 4)
    launch<4>(W, in, n, logits, stream);
  else
    launch<8>(W, in, n, logits, stream);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw Error(std::string("moe_router_f32: launch failed: ") + cudaGetErrorString(e));
}

}  // namespace lilac::cuda
