// Staging of M input rows for the tensor-core kernels (rows_mm.h: stage): one block per row computes t(x)
// (None / RmsNorm / GatedHeadNorm) and its hi/lo fp16 fragments exactly as gemv_tc.cu's in-block staging
// does (same 256-thread partial sums, block reduction and per-group shuffles), and writes them to global
// memory, where every block of the following GEMV / MoE kernels copies the rows it needs; and, when asked, the
// digits MoE's input (digits/moe_digits.h) from the same values t(x).
#include <algorithm>

#include "cuda/cuda_common.h"
#include "cuda/kernels/digits/digits_tile.cuh"
#include "cuda/kernels/launch.cuh"
#include "cuda/kernels/rows/rows_mm.h"
#include "cuda/kernels/rows/tc_rows.cuh"
#include "cuda/kernels/tc_g4.cuh"

namespace lilac::cuda::rows {
namespace {

using namespace rows_dev;
using ::lilac::cuda::dev::pdl_trigger;
using ::lilac::cuda::dev::pdl_wait;
using ::lilac::cuda::dev::warp_sum;

constexpr size_t kMaxStageSmem = 96 * 1024;

__host__ __device__ inline int round16(int b) { return (b + 15) / 16 * 16; }
__host__ __device__ inline int stage_smem_bytes(int K, Prologue pro, int hd) {
  int b = K * 4;
  if (pro == Prologue::RmsNorm) b += K * 4;
  if (pro == Prologue::GatedHeadNorm) b += K * 4 + round16(hd * 4) + round16((K / hd + 1) * 4);
  return b;
}

// Per-head Σx² of the gated head norm into hss[K / hd] (as gemv_tc's staging; a warp per head where a lane's
// 8 values may straddle heads, deterministic, where gemv_tc uses shared-memory atomics).
__device__ void head_sums(const float* xs, float* hss, int K, int hd) {
  const int n8 = K / 8, lph = hd / 8;
  if (hd % 8 == 0 && lph <= 32 && (lph & (lph - 1)) == 0) {
    for (int t0 = 0; t0 < n8; t0 += blockDim.x) {  // whole warps iterate together (n8 % lph == 0)
      const int t = t0 + threadIdx.x;
      float ss = 0.f;
      if (t < n8) {
        const float4 a = reinterpret_cast<const float4*>(xs)[2 * t], b = reinterpret_cast<const float4*>(xs)[2 * t + 1];
        ss = a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w + b.x * b.x + b.y * b.y + b.z * b.z + b.w * b.w;
      }
      for (int o = 1; o < lph; o <<= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      if (t < n8 && t % lph == 0) hss[t / lph] = ss;
    }
  } else {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int h = warp; h < K / hd; h += nw) {
      float ss = 0.f;
      for (int d = lane; d < hd; d += 32) ss += xs[h * hd + d] * xs[h * hd + d];
      ss = warp_sum(ss);
      if (lane == 0) hss[h] = ss;
    }
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads) stage_kernel(StageArgs a) {
  extern __shared__ float4 smem4[];
  __shared__ float red[32];
  const int K = int(a.K), r = blockIdx.x, hd = a.head_dim;
  float* xs = reinterpret_cast<float*>(smem4);
  float* zs = nullptr;
  float* nws = nullptr;
  float* hss = nullptr;
  if (a.pro == Prologue::RmsNorm) nws = xs + K;
  if (a.pro == Prologue::GatedHeadNorm) {
    zs = xs + K;
    nws = zs + K;
    hss = reinterpret_cast<float*>(reinterpret_cast<char*>(nws) + round16(hd * 4));
  }
  // before the PDL wait: the norm weights (written by no kernel of the step)
  if (a.pro == Prologue::RmsNorm)
    for (int i = threadIdx.x; i < K / 4; i += blockDim.x) cp_async16(nws + 4 * i, a.norm_w + 4 * i);
  if (a.pro == Prologue::GatedHeadNorm)
    for (int i = threadIdx.x; i < hd / 4; i += blockDim.x) cp_async16(nws + 4 * i, a.norm_w + 4 * i);
  pdl_wait();
  pdl_trigger();
  if (a.row_slot != nullptr && a.row_slot[r] < 0) {  // padding row: nothing read, nothing written
    cp_async_wait_all();
    return;
  }
  const int64_t ldx = a.ldx > 0 ? a.ldx : a.K, ldz = a.ldz > 0 ? a.ldz : a.K;
  const float* x = a.x + r * ldx;
  const float* z = a.z + r * ldz;
  for (int i = threadIdx.x; i < K / 4; i += blockDim.x) {
    cp_async16(xs + 4 * i, x + 4 * i);
    if (a.pro == Prologue::GatedHeadNorm) cp_async16(zs + 4 * i, z + 4 * i);
  }
  cp_async_wait_all();
  __syncthreads();
  const int KT = tc_kt(K), n8 = K / 8, n8t = KT * kTileCols / 8;
  float scale = 1.f;
  if (a.pro == Prologue::RmsNorm) {
    float ss = 0.f;
    for (int t = threadIdx.x; t < n8; t += blockDim.x) {
      const float4 p = reinterpret_cast<const float4*>(xs)[2 * t], q = reinterpret_cast<const float4*>(xs)[2 * t + 1];
      ss += p.x * p.x + p.y * p.y + p.z * p.z + p.w * p.w + q.x * q.x + q.y * q.y + q.z * q.z + q.w * q.w;
    }
    ss = block_sum(ss, red);
    scale = rsqrtf(ss / float(K) + a.eps);
  } else if (a.pro == Prologue::GatedHeadNorm) {
    head_sums(xs, hss, K, hd);
  }
  char* f4 = a.frag4 ? static_cast<char*>(a.frag4) + int64_t(r) * KT * kTileXBytes : nullptr;
  char* f4g = a.frag4g ? static_cast<char*>(a.frag4g) + int64_t(r) * KT * kTileXBytes : nullptr;
  char* f8 = a.frag8 ? static_cast<char*>(a.frag8) + int64_t(r) * KT * kTileXBytes : nullptr;
  float2* meta = a.meta ? a.meta + int64_t(r) * KT * 4 : nullptr;
  const int G = K / kGroup;
  char* dg = a.digits ? static_cast<char*>(a.digits) + int64_t(r) * G * 3 * 64 : nullptr;  // moe_digits.h's layout
  float2* dmeta =
      a.digits ? reinterpret_cast<float2*>(static_cast<char*>(a.digits) + int64_t(a.M) * G * 3 * 64) + int64_t(r) * G
               : nullptr;
  for (int t0 = 0; t0 < n8t; t0 += blockDim.x) {
    const int t = t0 + threadIdx.x;
    float v[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (t < n8) {
      const float4 xa = reinterpret_cast<const float4*>(xs)[2 * t], xb = reinterpret_cast<const float4*>(xs)[2 * t + 1];
      v[0] = xa.x, v[1] = xa.y, v[2] = xa.z, v[3] = xa.w, v[4] = xb.x, v[5] = xb.y, v[6] = xb.z, v[7] = xb.w;
      if (a.pro == Prologue::RmsNorm) {
        const float4 wa = reinterpret_cast<const float4*>(nws)[2 * t], wb = reinterpret_cast<const float4*>(nws)[2 * t + 1];
        const float w8[8] = {wa.x, wa.y, wa.z, wa.w, wb.x, wb.y, wb.z, wb.w};
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = v[j] * scale * w8[j];
      } else if (a.pro == Prologue::GatedHeadNorm) {
        const float4 za = reinterpret_cast<const float4*>(zs)[2 * t], zb = reinterpret_cast<const float4*>(zs)[2 * t + 1];
        const float z8[8] = {za.x, za.y, za.z, za.w, zb.x, zb.y, zb.z, zb.w};
        if (hd % 8 == 0) {  // the 8 values lie in one head
          const int h = (8 * t) / hd, d0 = 8 * t - h * hd;
          const float rr = rsqrtf(hss[h] / float(hd) + a.eps);
          const float4 wa = reinterpret_cast<const float4*>(nws + d0)[0], wb = reinterpret_cast<const float4*>(nws + d0)[1];
          const float w8[8] = {wa.x, wa.y, wa.z, wa.w, wb.x, wb.y, wb.z, wb.w};
#pragma unroll
          for (int j = 0; j < 8; ++j) v[j] = v[j] * rr * w8[j] * silu_f(z8[j]);
        } else {
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            const int k = 8 * t + j, h = k / hd, d = k - h * hd;
            const float rr = rsqrtf(hss[h] / float(hd) + a.eps);
            v[j] = v[j] * rr * nws[d] * silu_f(z8[j]);
          }
        }
      }
    }
    int E;
    float sum;
    group_meta(v, E, sum);
    const float inv = pow2i(-E);
    if (t < n8t) {
      uint4 hi, lo;
      if (f4) {
        split_unit<4>(v, inv, hi, lo);
        *reinterpret_cast<uint4*>(f4 + unit_off<4>(t)) = hi;
        *reinterpret_cast<uint4*>(f4 + unit_off<4>(t) + 16) = lo;
      }
      if (f4g) {  // the group layout (tc_g4.cuh): the same fp16 pairs at another place
        if (!f4) split_unit<4>(v, inv, hi, lo);
        *reinterpret_cast<uint4*>(f4g + g4_unit_off(t)) = hi;
        *reinterpret_cast<uint4*>(f4g + g4_unit_off(t) + 16) = lo;
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

bool aligned16(const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

size_t frag_row_bytes(int64_t K) { return size_t(tc_kt(K)) * kTileXBytes; }
size_t meta_row_count(int64_t K) { return size_t(tc_kt(K)) * 4; }

bool stage_supported(const StageArgs& a) {
  const bool frags = a.frag4 != nullptr || a.frag4g != nullptr || a.frag8 != nullptr;
  if (a.K <= 0 || a.K % kGroup != 0 || a.M < 0 || (frags && a.meta == nullptr) || (!frags && a.digits == nullptr))
    return false;
  const int64_t ldx = a.ldx > 0 ? a.ldx : a.K, ldz = a.ldz > 0 ? a.ldz : a.K;
  if (!aligned16(a.x) || ldx % 4 != 0 || !aligned16(a.frag4) || !aligned16(a.frag4g) || !aligned16(a.frag8) || !aligned16(a.meta)) return false;
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
  launch_pdl(stage_kernel, dim3(a.M), dim3(kThreads), smem, stream, a);
}

}  // namespace lilac::cuda::rows
