// Causal GQA attention prefill (attention.h), flash style with bf16 mma.sync m16n8k16:
// a block = 64 queries of one head (4 warps × 16 rows), key/value tiles of 64 rows streamed through
// shared memory (cp.async: V of tile j loads while S = Q Kᵀ is computed, K of tile j+1 while P V is),
// online softmax in fp32 (exp2 with the scale folded in), P kept in registers as the A operand of
// P V, output divided by the row sum, optional sigmoid(gate) fused, bf16 out.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.h"
#include "cuda/kernels/attention/attention.h"
#include "cuda/kernels/attention/attn_prefill.cuh"
#include "cuda/kernels/gemm/gemm.h"
#include "cuda/kernels/launch.cuh"
#include "cuda/kernels/ptx.cuh"

namespace lilac::cuda {
namespace {

using dev::cp_async16_zfill;
using dev::cp_async_commit;
using dev::cp_async_wait;
using dev::ldmatrix_x4;
using dev::ldmatrix_x4_trans;
using dev::mma_m16n8k16_bf16;
using dev::smem_u32;

constexpr int ABM = 64, ABN = 64, ATHREADS = 128;

// Byte offset of element (r, d) in a [rows][HD] bf16 tile, 16-byte chunks swizzled by r % 8.
template <int HD>
__device__ __forceinline__ uint32_t aswz(int r, int d) {
  return uint32_t(r * (HD * 2) + ((((d >> 3) ^ (r & 7))) << 4) + ((d & 7) << 1));
}

template <int HD>
__global__ void __launch_bounds__(ATHREADS, 2) attn_prefill_kernel(const AttentionPrefillArgs a, float scale_log2) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int TILE_BYTES = ABM * HD * 2;
  constexpr int CH = HD / 8;  // 16-byte chunks per row
  const uint32_t sQ = smem_u32(smem), sK = sQ + TILE_BYTES, sV = sK + TILE_BYTES;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int n_qt = (a.n_new + ABM - 1) / ABM;
  const int qt = n_qt - 1 - blockIdx.x;  // heaviest tiles first
  const int h = blockIdx.y;
  const int kvh = h / (a.heads / a.kv_heads);
  const int q0 = qt * ABM;
  const int64_t n_ctx = a.start_pos + a.n_new;
  const int64_t last_q = a.start_pos + min(q0 + ABM - 1, a.n_new - 1);
  const int nkt = int(last_q / ABN) + 1;
  const int64_t first_q = a.start_pos + q0;

  // Q tile
  for (int c = tid; c < ABM * CH; c += ATHREADS) {
    int r = c / CH, ch = c % CH;
    bool ok = q0 + r < a.n_new;
    const __nv_bfloat16* src = a.q + (ok ? int64_t(q0 + r) * a.q_stride + int64_t(h) * a.q_head_stride : 0) + ch * 8;
    cp_async16_zfill(sQ + aswz<HD>(r, ch * 8), src, ok ? 16 : 0);
  }
  auto load_kv = [&](uint32_t dst, const __nv_bfloat16* base, int kt) {
    for (int c = tid; c < ABN * CH; c += ATHREADS) {
      int r = c / CH, ch = c % CH;
      int64_t pos = int64_t(kt) * ABN + r;
      bool ok = pos < n_ctx;
      const __nv_bfloat16* src = base + (ok ? pos * a.kv_stride + int64_t(kvh) * HD : 0) + ch * 8;
      cp_async16_zfill(dst + aswz<HD>(r, ch * 8), src, ok ? 16 : 0);
    }
    cp_async_commit();
  };
  load_kv(sK, a.k_cache, 0);  // group 0 holds Q and K[0]

  float o[HD / 8][4];
#pragma unroll
  for (int i = 0; i < HD / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  const int g = lane >> 2, c2 = (lane & 3) * 2;
  const int64_t qp0 = first_q + warp * 16 + g, qp1 = qp0 + 8;

  for (int kt = 0; kt < nkt; ++kt) {
    cp_async_wait<0>();
    __syncthreads();
    load_kv(sV, a.v_cache, kt);
    // S = Q Kᵀ (16 × 64 per warp)
    float s[8][4];
#pragma unroll
    for (int i = 0; i < 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < HD / 16; ++ks) {
      uint32_t af[4];
      ldmatrix_x4(sQ + aswz<HD>(warp * 16 + (lane & 15), ks * 16 + (lane >> 4) * 8), af[0], af[1], af[2], af[3]);
#pragma unroll
      for (int nj = 0; nj < 4; ++nj) {
        uint32_t b0, b1, b2, b3;
        ldmatrix_x4(sK + aswz<HD>(nj * 16 + (lane & 7) + ((lane >> 4) << 3), ks * 16 + ((lane >> 3) & 1) * 8), b0, b1,
                    b2, b3);
        mma_m16n8k16_bf16(s[2 * nj], af, b0, b1);
        mma_m16n8k16_bf16(s[2 * nj + 1], af, b2, b3);
      }
    }
    // scale, causal mask, online softmax
    const int64_t kbase = int64_t(kt) * ABN;
    const bool need_mask = kbase + ABN - 1 > first_q;
    float mx0 = m0, mx1 = m1;
#pragma unroll
    for (int ni = 0; ni < 8; ++ni) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = s[ni][e] * scale_log2;
        if (need_mask) {
          int64_t kp = kbase + ni * 8 + c2 + (e & 1);
          int64_t qp = e < 2 ? qp0 : qp1;
          if (kp > qp) v = -INFINITY;
        }
        s[ni][e] = v;
      }
      mx0 = fmaxf(mx0, fmaxf(s[ni][0], s[ni][1]));
      mx1 = fmaxf(mx1, fmaxf(s[ni][2], s[ni][3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    // rows past the chunk end (qp beyond n_ctx) may see only masked keys: keep them finite
    const float base0 = mx0 == -INFINITY ? 0.f : mx0, base1 = mx1 == -INFINITY ? 0.f : mx1;
    const float alpha0 = exp2f(m0 - base0), alpha1 = exp2f(m1 - base1);
    m0 = mx0;
    m1 = mx1;
    float rs0 = 0.f, rs1 = 0.f;
    uint32_t pf[4][4];  // P as A fragments, 4 k-steps of 16 keys
#pragma unroll
    for (int ni = 0; ni < 8; ++ni) {
      float p0 = exp2f(s[ni][0] - base0), p1 = exp2f(s[ni][1] - base0);
      float p2 = exp2f(s[ni][2] - base1), p3 = exp2f(s[ni][3] - base1);
      rs0 += p0 + p1;
      rs1 += p2 + p3;
      pf[ni >> 1][(ni & 1) * 2 + 0] = attn::pack_bf16(p0, p1);
      pf[ni >> 1][(ni & 1) * 2 + 1] = attn::pack_bf16(p2, p3);
    }
    l0 = l0 * alpha0 + rs0;
    l1 = l1 * alpha1 + rs1;
#pragma unroll
    for (int i = 0; i < HD / 8; ++i) {
      o[i][0] *= alpha0;
      o[i][1] *= alpha0;
      o[i][2] *= alpha1;
      o[i][3] *= alpha1;
    }
    __syncthreads();  // everyone is done with K[kt]
    if (kt + 1 < nkt) {
      load_kv(sK, a.k_cache, kt + 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // V[kt] visible
    // O += P V
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      // A fragment order: a0 (g, k 0-7), a1 (g+8, k 0-7), a2 (g, k 8-15), a3 (g+8, k 8-15)
      uint32_t af[4] = {pf[kk][0], pf[kk][1], pf[kk][2], pf[kk][3]};
#pragma unroll
      for (int nd = 0; nd < HD / 16; ++nd) {
        uint32_t b0, b1, b2, b3;
        ldmatrix_x4_trans(sV + aswz<HD>(kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, nd * 16 + (lane >> 4) * 8), b0,
                          b1, b2, b3);
        mma_m16n8k16_bf16(o[2 * nd], af, b0, b1);
        mma_m16n8k16_bf16(o[2 * nd + 1], af, b2, b3);
      }
    }
  }

  // finalize
  attn::store_rows<HD>(a, &o[0][0], l0, l1, q0 + warp * 16, h, g, c2);
}

template <int HD>
void launch_hd(const AttentionPrefillArgs& a, cudaStream_t stream) {
  constexpr int smem = 3 * ABM * HD * 2;
  static bool attr_set = false;
  if (!attr_set) {
    cudaError_t e = cudaFuncSetAttribute(attn_prefill_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) throw Error(std::string("attention_prefill: cudaFuncSetAttribute: ") + cudaGetErrorString(e));
    attr_set = true;
  }
  const float scale = a.scale > 0.f ? a.scale : 1.f / std::sqrt(float(HD));
  dim3 grid((a.n_new + ABM - 1) / ABM, a.heads);
  attn_prefill_kernel<HD><<<grid, ATHREADS, smem, stream>>>(a, scale * 1.4426950408889634f);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw Error(std::string("attention_prefill: launch failed: ") + cudaGetErrorString(e));
}

}  // namespace

namespace {
// Whether attention_prefill takes the wgmma kernel (attention.h: AttnPrefillPath).
bool take_wgmma(const AttentionPrefillArgs& a, AttnPrefillPath path) {
  if (path == AttnPrefillPath::MmaSync || a.head_dim != 256 || !gemm_wgmma_available()) return false;
  if (path == AttnPrefillPath::Wgmma) return true;
  static const bool off = [] {
    const char* e = std::getenv("LILAC_ATTN_WGMMA");
    return e && std::strcmp(e, "0") == 0;
  }();
  return !off && attention_prefill_wgmma_blocks(a.n_new, a.heads) >= sm_count();
}
}  // namespace

void attention_prefill(const AttentionPrefillArgs& a, cudaStream_t stream, AttnPrefillPath path) {
  if (a.n_new <= 0) return;
  if (a.heads <= 0 || a.kv_heads <= 0 || a.heads % a.kv_heads)
    throw Error("attention_prefill: heads must be a positive multiple of kv_heads");
  if (a.q_stride % 8 || a.q_head_stride % 8 || a.kv_stride % 8 || a.out_stride % 2 ||
      reinterpret_cast<uintptr_t>(a.q) % 16 || reinterpret_cast<uintptr_t>(a.k_cache) % 16 ||
      reinterpret_cast<uintptr_t>(a.v_cache) % 16)
    throw Error("attention_prefill: q / k / v must be 16-byte aligned with strides that are multiples of 8");
  if (take_wgmma(a, path)) {
    const float scale = a.scale > 0.f ? a.scale : 1.f / std::sqrt(256.f);
    return attention_prefill_wgmma(a, scale * 1.4426950408889634f, stream);
  }
  switch (a.head_dim) {
    case 64: return launch_hd<64>(a, stream);
    case 128: return launch_hd<128>(a, stream);
    case 256: return launch_hd<256>(a, stream);
  }
  throw Error("attention_prefill: head_dim must be 64, 128 or 256, got " + std::to_string(a.head_dim));
}

}  // namespace lilac::cuda
