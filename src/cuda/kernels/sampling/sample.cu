// Token choice on the GPU: penalties, temperature, top-k, top-p, min-p, seeded sampling or exact
// greedy argmax (ties to the lower id), and log-probabilities (chosen + top alternatives).
// Two launches: a grid-wide pass (penalised/tempered logits, partial argmax and log-sum-exp), then
// one block that merges, selects and writes the token into the decode graph's input slot.
#include <cfloat>

#include "cuda/cuda_common.h"
#include "cuda/kernels/launch.cuh"
#include "cuda/kernels/qdot.cuh"
#include "cuda/kernels/sampling/sampling.h"

namespace lilac::cuda {
namespace {
using namespace dev;

constexpr int kPassBlocks = 264;
constexpr int kPassThreads = 256;
constexpr int kSelThreads = 1024;

struct Partial {
  float raw_max, raw_sum, t_max;
  int t_arg;
};

struct Scratch {
  Partial* partials;  // [kPassBlocks]
  float* tl;          // [vocab] tempered + penalised logits
  float* cand_v;      // [vocab] candidates (compacted, in id order)
  int* cand_i;        // [vocab]
};

__host__ __device__ inline size_t align256(size_t x) { return (x + 255) / 256 * 256; }

__host__ __device__ inline Scratch carve(void* base, int64_t vocab) {
  char* p = static_cast<char*>(base);
  Scratch s;
  s.partials = reinterpret_cast<Partial*>(p);
  p += align256(sizeof(Partial) * kPassBlocks);
  s.tl = reinterpret_cast<float*>(p);
  p += align256(sizeof(float) * vocab);
  s.cand_v = reinterpret_cast<float*>(p);
  p += align256(sizeof(float) * vocab);
  s.cand_i = reinterpret_cast<int*>(p);
  return s;
}

__device__ __forceinline__ bool better(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }

// r ← the merge of partials r and q: log-sum-exp of the raw logits, best transformed logit (ties to
// the lower id).
__device__ __forceinline__ void merge(Partial& r, const Partial& q) {
  const float m = fmaxf(r.raw_max, q.raw_max);
  r.raw_sum = (r.raw_max == -INFINITY ? 0.f : r.raw_sum * expf(r.raw_max - m)) +
              (q.raw_max == -INFINITY ? 0.f : q.raw_sum * expf(q.raw_max - m));
  r.raw_max = m;
  if (better(q.t_max, q.t_arg, r.t_max, r.t_arg)) {
    r.t_max = q.t_max;
    r.t_arg = q.t_arg;
  }
}
__device__ __forceinline__ Partial shfl_xor(const Partial& r, int o) {
  return Partial{__shfl_xor_sync(0xffffffffu, r.raw_max, o), __shfl_xor_sync(0xffffffffu, r.raw_sum, o),
                 __shfl_xor_sync(0xffffffffu, r.t_max, o), __shfl_xor_sync(0xffffffffu, r.t_arg, o)};
}

__global__ void __launch_bounds__(kPassThreads)
    sample_pass_kernel(const float* logits, int64_t vocab, const SampleParamsDev* prm, const int32_t* counts,
                       const uint8_t* mask, void* scratch) {
  pdl_wait();
  pdl_trigger();
  const Scratch sc = carve(scratch, vocab);
  const SampleParamsDev p = *prm;
  const bool sampling = p.temperature > 0.f;
  const float inv_t = sampling ? 1.f / p.temperature : 1.f;
  const bool pen = p.presence != 0.f || p.frequency != 0.f || p.repetition != 1.f;
  float rmax = -INFINITY, rsum = 0.f, tmax = -INFINITY;
  int targ = 0x7fffffff;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < vocab; i += int64_t(gridDim.x) * blockDim.x) {
    const float raw = logits[i];
    if (raw > rmax) {
      rsum = rsum * expf(rmax - raw) + 1.f;
      rmax = raw;
    } else {
      rsum += expf(raw - rmax);
    }
    float l = raw;
    if (pen) {
      const int c = counts[i];
      if (p.repetition != 1.f && (c > 0 || mask[i])) l = l > 0.f ? l / p.repetition : l * p.repetition;
      if (c > 0) l -= p.presence + p.frequency * float(c);
    }
    l *= inv_t;
    if (sampling) sc.tl[i] = l;
    if (better(l, int(i), tmax, targ)) {
      tmax = l;
      targ = int(i);
    }
  }
  // warp then block merge
  __shared__ Partial sp[kPassThreads / 32];
  Partial r{rmax, rsum, tmax, targ};
  for (int o = 16; o > 0; o >>= 1) merge(r, shfl_xor(r, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) sp[warp] = r;
  __syncthreads();
  if (threadIdx.x == 0) {
    Partial b = sp[0];
    for (int w = 1; w < kPassThreads / 32; ++w) {
      const Partial q = sp[w];
      merge(b, q);
    }
    sc.partials[blockIdx.x] = b;
  }
}

__device__ __forceinline__ uint32_t fkey(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ unsigned long long splitmix(unsigned long long x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Block-wide reductions for kSelThreads threads.
__device__ float bsum(float v, float* red) {
  v = warp_sum(v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float t = 0.f;
  for (int i = 0; i < kSelThreads / 32; ++i) t += red[i];
  return t;
}
__device__ int bsum_i(int v, int* red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  int t = 0;
  for (int i = 0; i < kSelThreads / 32; ++i) t += red[i];
  return t;
}
// Exclusive prefix over threads (in thread order) of v; returns the prefix, *total the sum.
template <typename T>
__device__ T bscan(T v, T* buf, T* total) {
  buf[threadIdx.x] = v;
  __syncthreads();
  for (int o = 1; o < kSelThreads; o <<= 1) {
    T t = threadIdx.x >= o ? buf[threadIdx.x - o] : T(0);
    __syncthreads();
    buf[threadIdx.x] += t;
    __syncthreads();
  }
  *total = buf[kSelThreads - 1];
  const T r = buf[threadIdx.x] - v;
  __syncthreads();
  return r;
}
// Block argmax of (v, i), ties to the lower i.
__device__ void bargmax(float& v, int& i, float* rv, int* ri) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (better(ov, oi, v, i)) {
      v = ov;
      i = oi;
    }
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) {
    rv[threadIdx.x >> 5] = v;
    ri[threadIdx.x >> 5] = i;
  }
  __syncthreads();
  v = rv[0];
  i = ri[0];
  for (int w = 1; w < kSelThreads / 32; ++w)
    if (better(rv[w], ri[w], v, i)) {
      v = rv[w];
      i = ri[w];
    }
}

__global__ void __launch_bounds__(kSelThreads)
    sample_select_kernel(const float* logits, int64_t vocab, SampleParamsDev* prm, int32_t* counts, void* scratch,
                         int32_t* token_slot, SampleResult* result) {
  pdl_wait();
  pdl_trigger();
  const Scratch sc = carve(scratch, vocab);
  __shared__ float red[32];
  __shared__ int redi[32];
  __shared__ float scan_f[kSelThreads];
  __shared__ int scan_i[kSelThreads];
  const SampleParamsDev p = *prm;
  // merge partials: one per thread, then a block reduction
  Partial r{-INFINITY, 0.f, -INFINITY, 0x7fffffff};
  if (threadIdx.x < kPassBlocks) r = sc.partials[threadIdx.x];
  {
    __shared__ Partial sp[kSelThreads / 32];
    for (int o = 16; o > 0; o >>= 1) merge(r, shfl_xor(r, o));
    if ((threadIdx.x & 31) == 0) sp[threadIdx.x >> 5] = r;
    __syncthreads();
    r = sp[0];
    for (int w = 1; w < kSelThreads / 32; ++w) {
      const Partial q = sp[w];
      merge(r, q);
    }
  }
  const float lse = r.raw_max + logf(r.raw_sum);
  int token = r.t_arg;
  if (p.temperature > 0.f) {
    const float M = r.t_max;
    // Candidates: tempered logits within 40 of the max (weights below e^-40 relative are dropped),
    // compacted in id order.
    const float floor_v = M - 40.f;
    const int64_t per = (vocab + kSelThreads - 1) / kSelThreads;
    const int64_t lo = threadIdx.x * per, hi = lo + per < vocab ? lo + per : vocab;
    int mine = 0;
    for (int64_t i = lo; i < hi; ++i) mine += sc.tl[i] >= floor_v;
    int total = 0;
    int off = bscan<int>(mine, scan_i, &total);
    for (int64_t i = lo; i < hi; ++i) {
      const float v = sc.tl[i];
      if (v >= floor_v) {
        sc.cand_v[off] = v;
        sc.cand_i[off] = int(i);
        ++off;
      }
    }
    __syncthreads();
    const int n = total;
    uint32_t tau = 0;  // keep candidates with key >= tau
    if (p.top_k > 0 && p.top_k < n) {
      // largest tau with count(key >= tau) >= top_k: the top_k-th largest value
      uint32_t lo_k = 0, hi_k = 0xffffffffu;
      while (lo_k < hi_k) {
        const uint32_t mid = uint32_t(lo_k + (uint64_t(hi_k) - lo_k + 1) / 2);  // 64-bit: no wrap at the full range
        int c = 0;
        for (int j = threadIdx.x; j < n; j += kSelThreads) c += fkey(sc.cand_v[j]) >= mid;
        c = bsum_i(c, redi);
        if (c >= p.top_k)
          lo_k = mid;
        else
          hi_k = mid - 1;
      }
      tau = lo_k;
    }
    if (p.top_p < 1.f) {
      float z = 0.f;
      for (int j = threadIdx.x; j < n; j += kSelThreads)
        if (fkey(sc.cand_v[j]) >= tau) z += expf(sc.cand_v[j] - M);
      z = bsum(z, red);
      const float target = p.top_p * z;
      uint32_t lo_p = tau, hi_p = fkey(M);
      while (lo_p < hi_p) {  // largest tau' with mass(key >= tau') >= target
        const uint32_t mid = uint32_t(lo_p + (uint64_t(hi_p) - lo_p + 1) / 2);
        float m = 0.f;
        for (int j = threadIdx.x; j < n; j += kSelThreads)
          if (fkey(sc.cand_v[j]) >= mid) m += expf(sc.cand_v[j] - M);
        m = bsum(m, red);
        if (m >= target)
          lo_p = mid;
        else
          hi_p = mid - 1;
      }
      tau = lo_p;
    }
    if (p.min_p > 0.f) {
      const uint32_t tm = fkey(M + logf(p.min_p));
      tau = tm > tau ? tm : tau;
    }
    // inverse CDF over the kept candidates, in id order
    float w = 0.f;
    const int per_c = (n + kSelThreads - 1) / kSelThreads;
    const int clo = threadIdx.x * per_c, chi = clo + per_c < n ? clo + per_c : n;
    for (int j = clo; j < chi; ++j)
      if (fkey(sc.cand_v[j]) >= tau) w += expf(sc.cand_v[j] - M);
    float ztot = 0.f;
    const float before = bscan<float>(w, scan_f, &ztot);
    const unsigned long long rbits = splitmix(p.seed * 0x2545F4914F6CDD1Dull + splitmix(p.step));
    const float u = float(double(rbits >> 11) * (1.0 / 9007199254740992.0)) * ztot;
    __shared__ int chosen;
    if (threadIdx.x == 0) chosen = 0x7fffffff;
    __syncthreads();
    if (w > 0.f && u >= before && (u < before + w || threadIdx.x == kSelThreads - 1 ||
                                   before + w >= ztot)) {
      float acc = before;
      int pick = -1, last = -1;
      for (int j = clo; j < chi; ++j)
        if (fkey(sc.cand_v[j]) >= tau) {
          last = sc.cand_i[j];
          acc += expf(sc.cand_v[j] - M);
          if (u < acc) {
            pick = sc.cand_i[j];
            break;
          }
        }
      if (pick < 0) pick = last;
      if (pick >= 0) atomicMin(&chosen, pick);  // at most one thread's range holds u (two only at an edge)
    }
    __syncthreads();
    token = chosen != 0x7fffffff ? chosen : r.t_arg;  // no range held u (rounding at the very end): argmax
  }
  // log-probabilities of the raw distribution
  if (threadIdx.x == 0) {
    result->token = token;
    result->logprob = p.logprobs ? logits[token] - lse : 0.f;
    result->n_top = 0;
    *token_slot = token;
    counts[token] += 1;
    prm->step = p.step + 1;
  }
  const int ntop = p.top_logprobs < kMaxTopLogprobs ? p.top_logprobs : kMaxTopLogprobs;
  if (p.logprobs && ntop > 0) {
    // One pass: each thread keeps the ntop best (value desc, id asc) of its strided share of the
    // vocabulary, sorted; then ntop block-argmax rounds over the threads' current heads, the winner's
    // thread moving on to its next entry (ids are unique, so exactly one thread advances per round).
    float lv[kMaxTopLogprobs];
    int li[kMaxTopLogprobs];
    int cnt = 0;
    for (int64_t i = threadIdx.x; i < vocab; i += kSelThreads) {
      const float v = logits[i];
      if (cnt == ntop && !better(v, int(i), lv[ntop - 1], li[ntop - 1])) continue;
      int j = cnt < ntop ? cnt++ : ntop - 1;  // insertion: shift worse entries down
      while (j > 0 && better(v, int(i), lv[j - 1], li[j - 1])) {
        lv[j] = lv[j - 1];
        li[j] = li[j - 1];
        --j;
      }
      lv[j] = v;
      li[j] = int(i);
    }
    int head = 0;
    for (int t = 0; t < ntop; ++t) {
      float bv = head < cnt ? lv[head] : -INFINITY;
      int bi = head < cnt ? li[head] : 0x7fffffff;
      bargmax(bv, bi, red, redi);
      if (head < cnt && li[head] == bi) ++head;
      if (threadIdx.x == 0) {
        result->top_ids[t] = bi;
        result->top_lp[t] = bv - lse;
        result->n_top = t + 1;
      }
      __syncthreads();  // every thread has read red/redi before the next round writes them
    }
  }
}

__global__ void inc_kernel(int32_t* p) {
  pdl_wait();
  pdl_trigger();
  *p += 1;
}

}  // namespace

size_t sample_scratch_bytes(int64_t vocab) {
  return align256(sizeof(Partial) * kPassBlocks) + 3 * align256(sizeof(float) * size_t(vocab));
}

void sample_token(const float* logits, int64_t vocab, SampleParamsDev* params, int32_t* counts,
                  const uint8_t* prompt_mask, void* scratch, int32_t* token_slot, SampleResult* result,
                  cudaStream_t stream) {
  launch_pdl(sample_pass_kernel, dim3(kPassBlocks), dim3(kPassThreads), 0, stream, logits, vocab, params, counts,
             prompt_mask, scratch);
  launch_pdl(sample_select_kernel, dim3(1), dim3(kSelThreads), 0, stream, logits, vocab, params, counts, scratch,
             token_slot, result);
}

void increment_i32(int32_t* p, cudaStream_t stream) {
  launch_pdl(inc_kernel, dim3(1), dim3(1), 0, stream, p);
}

}  // namespace lilac::cuda
