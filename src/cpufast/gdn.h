// The Gated DeltaNet recurrence for the fast CPU path: the reference's chunked (WY / UT transform) form
// (cpu::gdn_chunked, same algebra and order of chunks) with its vector loops on the kernel set's
// dot / axpy / axpys (AVX2 / AVX-512 / NEON FMA instead of the baseline build's SSE2), and the one-token step.
#pragma once
#include <cstdint>
#include <vector>

#include "cpufast/kernels.h"

namespace lilac::cpufast {

// As cpu::gdn_chunked (chunk 64). scratch is resized as needed.
void gdn_chunked_fast(const KernelSet& k, float* S, const float* q, int64_t q_stride, const float* kk,
                      int64_t k_stride, const float* v, int64_t v_stride, const float* g, const float* beta, int64_t T,
                      int dk, int dv, float* o, int64_t o_stride, std::vector<float>& scratch);

// One token: S ← exp(g)·S ; u = Sᵀk ; S ← S + k (β (v − u))ᵀ ; o = Sᵀ q. u: scratch of dv floats.
void gdn_step_fast(float* S, const float* q, const float* k, const float* v, float g, float beta, int dk, int dv,
                   float* o, float* u);

}  // namespace lilac::cpufast
