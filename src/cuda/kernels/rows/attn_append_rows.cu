// Multi-row q/k RMSNorm + partial RoPE + KV append (rows_state.h: attn_qk_norm_rope_append_rows) and
// the multi-row embedding gather (embed_rows). Per row exactly the arithmetic of the single-row
// kernels (attention_decode.cu's qk_norm_rope_kernel, gemv.cu's embed_kernel): bitwise the same.
#include <cstdint>
#include <string>

#include "cuda/cuda_common.h"
#include "cuda/kernels/attention/qk_norm_rope.cuh"
#include "cuda/kernels/launch.cuh"
#include "cuda/kernels/qdot.cuh"
#include "cuda/kernels/rows/rows_state.h"

namespace lilac::cuda::rows {
namespace {
using namespace dev;

constexpr int kMaxHeadDim = 256;

// Grid (heads + kv_heads rounded up to 4, M): one warp per head of row blockIdx.y (q heads first,
// then kv heads).
__global__ void __launch_bounds__(128)
    qk_rows_kernel(AttnDecodeShape s, const int32_t* row_slot, const int32_t* row_pos, const float* proj,
                   int64_t proj_stride, const float* q_norm, const float* k_norm, const float* inv_freq, float* q_out,
                   KvPool kv) {
  __shared__ float xs[4][kMaxHeadDim];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int b = blockIdx.x * 4 + warp, r = blockIdx.y;
  const int hd = s.head_dim, half = s.rotary_dim / 2;
  const bool active = b < s.heads + s.kv_heads;
  const bool is_q = b < s.heads;
  const int h = is_q ? b : b - s.heads;
  const float* w = is_q ? q_norm : k_norm;
  // weights (not written by the step) before the wait
  float wv[kMaxHeadDim / 32], fr[kMaxHeadDim / 32];
#pragma unroll
  for (int j = 0; j < kMaxHeadDim / 32; ++j) {
    const int d = lane + 32 * j;
    wv[j] = active && d < hd ? w[d] : 0.f;
    fr[j] = active && d < 2 * half ? inv_freq[d < half ? d : d - half] : 0.f;
  }
  pdl_wait();
  pdl_trigger();
  if (!active) return;
  const int slot = row_slot[r];
  if (slot < 0) return;
  const float* row = proj + r * proj_stride;
  const float* k = row + int64_t(s.heads) * 2 * hd;
  const float* v = k + int64_t(s.kv_heads) * hd;
  const float* src = is_q ? row + int64_t(h) * 2 * hd : k + int64_t(h) * hd;
  const int64_t pos = row_pos[r];
  float x[kMaxHeadDim / 32];
#pragma unroll
  for (int j = 0; j < kMaxHeadDim / 32; ++j) {
    const int d = lane + 32 * j;
    x[j] = d < hd ? src[d] : 0.f;
  }
  const int64_t crow = slot * kv.slot_stride + (pos * s.kv_heads + h) * hd;
  float* qo = q_out + (r * int64_t(s.heads) + h) * hd;
  qk_head_norm_rope(x, wv, fr, hd, half, s.eps, pos, xs[warp], lane, [&](int d, float val) {
    if (is_q) {
      qo[d] = val;
    } else {
      kv.k[crow + d] = __float2bfloat16(val);
      kv.v[crow + d] = __float2bfloat16(v[int64_t(h) * hd + d]);
    }
  });
}

// Grid (cols / 256 rounded up, M).
template <int BITS>
__global__ void embed_rows_kernel(QMatrixDev E, const int32_t* row_slot, const int32_t* tokens, const int32_t* tok_idx,
                                  float* out, int64_t out_stride) {
  pdl_wait();
  pdl_trigger();
  const int r = blockIdx.y;
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= E.cols || row_slot[r] < 0) return;
  const int64_t t = tokens[tok_idx ? tok_idx[r] : r];
  float* o = out + r * out_stride;
  if (t < 0 || t >= E.rows) {
    o[c] = __int_as_float(0x7fc00000);  // NaN: an invalid token id must not pass unnoticed
    return;
  }
  constexpr int per = 32 / BITS;
  const uint32_t word = E.qweight[t * E.words_per_row() + c / per];
  const uint32_t q = (word >> ((c % per) * BITS)) & ((1u << BITS) - 1u);
  const int64_t g = t * E.groups_per_row() + c / E.group_size;
  o[c] = bf2f(E.scales[g]) * float(q) + bf2f(E.biases[g]);
}

}  // namespace

void attn_qk_norm_rope_append_rows(const AttnDecodeShape& s, int M, const int32_t* row_slot, const int32_t* row_pos,
                                   const float* proj, int64_t proj_stride, const float* q_norm, const float* k_norm,
                                   const float* inv_freq, float* q_out, const KvPool& kv, cudaStream_t stream) {
  const int hd = s.head_dim;
  LILAC_CHECK((hd == 32 || hd == 64 || hd == 128 || hd == kMaxHeadDim) && s.kv_heads > 0 && s.heads % s.kv_heads == 0 &&
                  s.rotary_dim <= hd && s.rotary_dim % 2 == 0,
              "rows q/k norm + rope: unsupported shape (head_dim " + std::to_string(hd) + ")");
  LILAC_CHECK(M >= 1 && M <= kMaxRows, "rows q/k norm + rope: M must be 1.." + std::to_string(kMaxRows));
  const int nheads = s.heads + s.kv_heads;
  launch_pdl(qk_rows_kernel, dim3((nheads + 3) / 4, M), dim3(128), 0, stream, s, row_slot, row_pos, proj, proj_stride,
             q_norm, k_norm, inv_freq, q_out, kv);
}

void embed_rows(const QMatrixDev& E, int M, const int32_t* row_slot, const int32_t* tokens, const int32_t* tok_idx,
                float* out, int64_t out_stride, cudaStream_t stream) {
  LILAC_CHECK(E.bits == 4 || E.bits == 8, "rows embed: only 4- and 8-bit matrices are supported");
  LILAC_CHECK(M >= 1 && M <= kMaxRows, "rows embed: M must be 1.." + std::to_string(kMaxRows));
  const dim3 grid(unsigned((E.cols + 255) / 256), unsigned(M));
  if (E.bits == 4)
    launch_pdl(embed_rows_kernel<4>, grid, dim3(256), 0, stream, E, row_slot, tokens, tok_idx, out, out_stride);
  else
    launch_pdl(embed_rows_kernel<8>, grid, dim3(256), 0, stream, E, row_slot, tokens, tok_idx, out, out_stride);
}

}  // namespace lilac::cuda::rows
