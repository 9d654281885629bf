// Token choice on the GPU: penalties, temperature, top-k, top-p, min-p, seeded sampling or exact
// greedy argmax (ties to the lower id), and log-probabilities (chosen + top alternatives).
// sample_token is the multi-row sampler (rows/sample_rows.cu: a grid-wide pass of penalised / tempered
// logits, partial argmax and log-sum-exp, then one block that merges, selects and writes the token into
// the decode graph's input slot) for one row: one implementation, so that a row sampled in a batch is bit
// for bit the row sampled alone.
#include "cuda/cuda_common.h"
#include "cuda/kernels/launch.cuh"
#include "cuda/kernels/ptx.cuh"
#include "cuda/kernels/rows/rows_mm.h"
#include "cuda/kernels/sampling/sampling.h"

namespace lilac::cuda {
namespace {

__global__ void inc_kernel(int32_t* p, int n) {
  dev::pdl_wait();
  dev::pdl_trigger();
  *p += n;
}

}  // namespace

size_t sample_scratch_bytes(int64_t vocab) { return rows::sample_rows_scratch_bytes(vocab, 1); }

void sample_token(const float* logits, int64_t vocab, SampleParamsDev* params, int32_t* counts,
                  const uint8_t* prompt_mask, void* scratch, int32_t* token_slot, SampleResult* result,
                  cudaStream_t stream) {
  rows::sample_token_masked(logits, vocab, params, counts, prompt_mask, nullptr, scratch, token_slot, result, stream);
}

void increment_i32(int32_t* p, cudaStream_t stream, int n) {
  launch_pdl(inc_kernel, dim3(1), dim3(1), 0, stream, p, n);
}

}  // namespace lilac::cuda
