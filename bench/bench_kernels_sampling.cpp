// The sampling family (src/cuda/kernels/sampling/) at the model's vocabulary (248320): sample_token
// (the two launches that end every decode step) over random logits, µs per call over a graph of 20
// back-to-back calls (10 replays after a warm-up replay):
//   Sample/greedy          — temperature 0 (exact argmax), no logprobs;
//   Sample/top_p           — temperature 0.7, top-p 0.9, presence penalty 0.5;
//   Sample/greedy_logprobs — temperature 0 with the chosen token's logprob and 20 alternatives.
// Without a GPU it prints "no CUDA GPU" and exits 0.
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

#include "cuda/kernels/sampling/sampling.h"
#include "decode_data.h"
#include "kernel_bench.h"

namespace lc = lilac::cuda;
using namespace lilac::cuda::testing;

namespace {

constexpr int64_t kVocab = 248320;

void BM_Sample(benchmark::State& state, lc::SampleParamsDev p) {
  Rng r(fresh_seed());
  Dev<float> logits(randv(r, size_t(kVocab), 3.f));
  Dev<lc::SampleParamsDev> prm(std::vector<lc::SampleParamsDev>{p});
  Dev<int32_t> counts(std::vector<int32_t>(size_t(kVocab), 0)), slot(1);
  Dev<uint8_t> mask(std::vector<uint8_t>(size_t(kVocab), 0));
  Dev<char> scratch(lc::sample_scratch_bytes(kVocab));
  Dev<lc::SampleResult> res(1);
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  double us = -1;
  for (auto _ : state) {
    us = lilac::bench::graph_us(s, 20, 10, [&] {
      lc::sample_token(logits.p, kVocab, prm.p, counts.p, mask.p, scratch.p, slot.p, res.p, s);
    });
    state.SetIterationTime(us * 1e-6);
  }
  const lc::SampleResult out = res.get()[0];
  std::printf("sample-timing temperature %.1f top_p %.2f top_logprobs %d: %.2f us per call (last token %d)\n",
              p.temperature, p.top_p, p.top_logprobs, us, out.token);
  if (us <= 0 || out.token < 0 || out.token >= kVocab) state.SkipWithError("CUDA error or no token chosen");
  cudaStreamDestroy(s);
}

lc::SampleParamsDev params(float t, float top_p, int top_logprobs) {
  lc::SampleParamsDev p{};
  p.temperature = t;
  p.top_p = top_p;
  p.repetition = 1.f;
  p.presence = t > 0 ? 0.5f : 0.f;
  p.logprobs = top_logprobs > 0;
  p.top_logprobs = top_logprobs;
  p.seed = 7;
  return p;
}

}  // namespace

void lilac::bench::register_benchmarks() {
  auto reg = [](const char* name, lc::SampleParamsDev p) {
    benchmark::RegisterBenchmark(name, BM_Sample, p)->UseManualTime()->Iterations(1)->Unit(benchmark::kMicrosecond);
  };
  reg("Sample/greedy", params(0.f, 1.f, 0));
  reg("Sample/top_p", params(0.7f, 0.9f, 0));
  reg("Sample/greedy_logprobs", params(0.f, 1.f, 20));
}

LILAC_KERNEL_BENCH_MAIN("sampling")
