// Token choice for M rows (rows_mm.h: sample_rows, sample_token_masked) in two launches: a grid-wide pass
// (264 blocks per row over the vocabulary, gridDim.y = M) and a select kernel (one block per row), each row
// reading its slot's parameters, penalty counts, prompt mask and optional allowed-token bitmask. A row's
// arithmetic does not depend on M or on the other rows; sample_token (sampling/sample.cu) is this code at
// M = 1, so a row's choice and logprobs are bit for bit the same in a batch as alone. With one_sequence the
// rows are one sequence's next choices (a speculative verify without penalties): row r draws at step + r,
// as sample_token would after r choices, and the sequence's counts and step are the caller's to move.
#include <cfloat>

#include "cuda/cuda_common.h"
#include "cuda/kernels/launch.cuh"
#include "cuda/kernels/qdot.cuh"
#include "cuda/kernels/rows/rows_mm.h"

namespace lilac::cuda::rows {
namespace {

using ::lilac::cuda::dev::pdl_trigger;
using ::lilac::cuda::dev::pdl_wait;
using ::lilac::cuda::dev::warp_sum;

constexpr int kPassBlocks = 264;
constexpr int kPassThreads = 256;
constexpr int kSelThreads = 1024;
constexpr int kNone = 0x7fffffff;

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
__host__ __device__ inline size_t row_scratch_bytes(int64_t vocab) {
  return align256(sizeof(Partial) * kPassBlocks) + 3 * align256(sizeof(float) * size_t(vocab));
}
__host__ __device__ inline Scratch carve(void* base, int64_t vocab, int r) {
  char* p = static_cast<char*>(base) + size_t(r) * row_scratch_bytes(vocab);
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

// The slot of row r (-1: padding) and its state.
struct RowState {
  int slot;
  const uint32_t* allowed;
};
__device__ __forceinline__ RowState row_state(const SampleRowsArgs& a, int r) {
  RowState s;
  s.slot = a.one_sequence ? 0 : a.row_slot ? a.row_slot[r] : r;
  s.allowed = nullptr;
  if (s.slot >= 0 && a.allowed != nullptr && (a.allowed_on == nullptr || a.allowed_on[s.slot] != 0))
    s.allowed = a.allowed + int64_t(s.slot) * ((a.vocab + 31) / 32);
  return s;
}

__device__ __forceinline__ bool better(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }

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

__global__ void __launch_bounds__(kPassThreads) sample_pass_rows_kernel(SampleRowsArgs a) {
  pdl_wait();
  pdl_trigger();
  const int row = blockIdx.y;
  const RowState rs = row_state(a, row);
  if (rs.slot < 0) return;
  const int64_t vocab = a.vocab, ld = a.ld_logits > 0 ? a.ld_logits : vocab;
  const float* logits = a.logits + row * ld;
  const int32_t* counts = a.counts + int64_t(rs.slot) * vocab;
  const uint8_t* mask = a.prompt_mask + int64_t(rs.slot) * vocab;
  const Scratch sc = carve(a.scratch, vocab, row);
  const SampleParamsDev p = a.params[rs.slot];
  const bool sampling = p.temperature > 0.f;
  const float inv_t = sampling ? 1.f / p.temperature : 1.f;
  const bool pen = p.presence != 0.f || p.frequency != 0.f || p.repetition != 1.f;
  float rmax = -INFINITY, rsum = 0.f, tmax = -INFINITY;
  int targ = kNone;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < vocab; i += int64_t(gridDim.x) * blockDim.x) {
    const float raw = logits[i];
    if (raw > rmax) {
      rsum = rsum * expf(rmax - raw) + 1.f;
      rmax = raw;
    } else {
      rsum += expf(raw - rmax);
    }
    if (rs.allowed != nullptr && !((rs.allowed[i >> 5] >> (i & 31)) & 1u)) {  // not allowed: never chosen
      if (sampling) sc.tl[i] = -INFINITY;
      continue;
    }
    float l = raw;
    if (pen) {
      const int c = counts[i];
      if (p.repetition != 1.f && (c > 0 || mask[i])) l = l > 0.f ? l / p.repetition : l * p.repetition;
      if (c > 0) l -= p.presence + p.frequency * float(c);
    }
    if (p.bias != nullptr) l += p.bias[i];  // after the penalties, before the temperature (engine/sampler.h)
    l *= inv_t;
    if (sampling) sc.tl[i] = l;
    if (better(l, int(i), tmax, targ)) {
      tmax = l;
      targ = int(i);
    }
  }
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

// Seeded sampling among the tempered logits (sample.cu's select, unchanged): top-k, top-p, min-p, inverse CDF.
__device__ int sample_among(const Scratch& sc, int64_t vocab, const SampleParamsDev& p, float M, int fallback) {
  __shared__ float red[32];
  __shared__ int redi[32];
  __shared__ float scan_f[kSelThreads];
  __shared__ int scan_i[kSelThreads];
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
  uint32_t tau = 0;
  if (p.top_k > 0 && p.top_k < n) {
    uint32_t lo_k = 0, hi_k = 0xffffffffu;
    while (lo_k < hi_k) {
      const uint32_t mid = uint32_t(lo_k + (uint64_t(hi_k) - lo_k + 1) / 2);
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
    while (lo_p < hi_p) {
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
  if (threadIdx.x == 0) chosen = kNone;
  __syncthreads();
  if (w > 0.f && u >= before && (u < before + w || threadIdx.x == kSelThreads - 1 || before + w >= ztot)) {
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
    if (pick >= 0) atomicMin(&chosen, pick);
  }
  __syncthreads();
  return chosen != kNone ? chosen : fallback;
}

// The lowest id the bitmask allows (kNone: none), by the whole block (every thread gets it).
__device__ int first_allowed(const uint32_t* allowed, int64_t vocab) {
  __shared__ int lowest;
  if (threadIdx.x == 0) lowest = kNone;
  __syncthreads();
  const int64_t words = (vocab + 31) / 32;
  for (int64_t w = threadIdx.x; w < words; w += kSelThreads) {
    uint32_t bits = allowed[w];
    if (w == words - 1 && vocab % 32 != 0) bits &= (1u << (vocab % 32)) - 1u;  // ids past the vocabulary
    if (bits != 0u) {
      atomicMin(&lowest, int(w * 32) + __ffs(int(bits)) - 1);
      break;  // this thread's later words hold only higher ids
    }
  }
  __syncthreads();
  const int id = lowest;
  __syncthreads();  // every thread has read it before a later call may reset it
  return id;
}

__global__ void __launch_bounds__(kSelThreads) sample_select_rows_kernel(SampleRowsArgs a) {
  pdl_wait();
  pdl_trigger();
  const int row = blockIdx.x;
  const RowState rs = row_state(a, row);
  if (rs.slot < 0) return;
  const int64_t vocab = a.vocab, ld = a.ld_logits > 0 ? a.ld_logits : vocab;
  const float* logits = a.logits + row * ld;
  const Scratch sc = carve(a.scratch, vocab, row);
  SampleParamsDev* prm = a.params + rs.slot;
  SampleResult* result = a.results + row;
  __shared__ float red[32];
  __shared__ int redi[32];
  SampleParamsDev p = *prm;
  if (a.one_sequence) p.step += static_cast<unsigned long long>(row);  // row r: the sequence's r-th next choice
  Partial r{-INFINITY, 0.f, -INFINITY, kNone};
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
  // No allowed logit above -inf (t_arg: the best allowed one, NaNs never win; an allowed -inf one only ties): no
  // choice, as the CPU sampler throws (engine/sampler.h), the mask's fault when it allows no token. The result says
  // which (sampling.h: CudaSession::to_choice throws) and the device-side tokens read by later launches stay in range.
  int token = r.t_arg;
  if (token == kNone || !(r.t_max > -INFINITY))
    token = rs.allowed != nullptr && first_allowed(rs.allowed, vocab) == kNone ? kNoAllowedToken : kNoFiniteLogit;
  else if (p.temperature > 0.f)
    token = sample_among(sc, vocab, p, r.t_max, r.t_arg);
  const bool none = token < 0;
  const int safe = none ? 0 : token;
  if (threadIdx.x == 0) {
    result->token = token;
    result->logprob = p.logprobs && !none ? logits[token] - lse : 0.f;
    result->n_top = 0;
    if (a.token_by_row != nullptr) a.token_by_row[row] = safe;
    if (!a.one_sequence) {  // one sequence's rows: the caller counts the rows it keeps and moves the step
      if (a.token_by_slot != nullptr) a.token_by_slot[rs.slot] = safe;
      if (!none) a.counts[int64_t(rs.slot) * vocab + token] += 1;
      prm->step = p.step + 1;
    }
  }
  if (none) return;
  const int ntop = p.top_logprobs < kMaxTopLogprobs ? p.top_logprobs : kMaxTopLogprobs;
  if (p.logprobs && ntop > 0) {
    float lv[kMaxTopLogprobs];
    int li[kMaxTopLogprobs];
    int cnt = 0;
    for (int64_t i = threadIdx.x; i < vocab; i += kSelThreads) {
      const float v = logits[i];
      if (cnt == ntop && !better(v, int(i), lv[ntop - 1], li[ntop - 1])) continue;
      int j = cnt < ntop ? cnt++ : ntop - 1;
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
      int bi = head < cnt ? li[head] : kNone;
      bargmax(bv, bi, red, redi);
      if (head < cnt && li[head] == bi) ++head;
      if (threadIdx.x == 0) {
        result->top_ids[t] = bi;
        result->top_lp[t] = bv - lse;
        result->n_top = t + 1;
      }
      __syncthreads();
    }
  }
}

}  // namespace

int64_t allowed_words(int64_t vocab) { return (vocab + 31) / 32; }

size_t sample_rows_scratch_bytes(int64_t vocab, int max_rows) { return size_t(max_rows) * row_scratch_bytes(vocab); }

void sample_rows(const SampleRowsArgs& a, cudaStream_t stream) {
  if (a.vocab <= 0 || a.vocab > 0x7ffffff0 || a.M < 0 || a.M > 65535 || !a.logits || !a.params || !a.counts ||
      !a.prompt_mask || !a.results || !a.scratch)
    throw Error("rows::sample_rows: bad arguments");
  if (a.M == 0) return;
  launch_pdl(sample_pass_rows_kernel, dim3(kPassBlocks, a.M), dim3(kPassThreads), 0, stream, a);
  launch_pdl(sample_select_rows_kernel, dim3(a.M), dim3(kSelThreads), 0, stream, a);
}

void sample_token_masked(const float* logits, int64_t vocab, SampleParamsDev* params, int32_t* counts,
                         const uint8_t* prompt_mask, const uint32_t* allowed, void* scratch, int32_t* token_slot,
                         SampleResult* result, cudaStream_t stream) {
  SampleRowsArgs a;
  a.logits = logits;
  a.vocab = vocab;
  a.M = 1;
  a.params = params;
  a.counts = counts;
  a.prompt_mask = prompt_mask;
  a.allowed = allowed;
  a.token_by_slot = token_slot;
  a.results = result;
  a.scratch = scratch;
  sample_rows(a, stream);
}

}  // namespace lilac::cuda::rows
