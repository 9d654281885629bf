#include "cli/backend_select.h"

#include "core/error.h"
#include "cpu/cpu_backend.h"
#include "cpufast/fast_backend.h"
#include "cpufast/synthetic.h"
#include "model/config.h"

#if defined(LILAC_HAVE_CUDA) && __has_include("cuda/cuda_backend.h")
#include "cuda/cuda_backend.h"
#define LILAC_CLI_CUDA 1
#else
#define LILAC_CLI_CUDA 0
#endif

namespace lilac::cli {

bool cuda_usable() {
#if LILAC_CLI_CUDA
  return lilac::cuda::gpu_available();
#else
  return false;
#endif
}

std::unique_ptr<Backend> make_backend(const std::string& name, std::shared_ptr<const ModelWeights> weights,
                                      int threads) {
  if (name == "cpu") return cpufast::make_fast_cpu_backend(std::move(weights), {.threads = threads});
  if (name == "cpu-ref") return make_cpu_backend(std::move(weights), threads);
  if (name == "cuda" || name == "auto") {
#if LILAC_CLI_CUDA
    if (lilac::cuda::gpu_available()) return lilac::cuda::make_cuda_backend(std::move(weights));
    if (name == "cuda") throw InputError("--backend cuda: no usable CUDA GPU found");
#else
    if (name == "cuda") throw InputError("--backend cuda: this build of lilac has no CUDA backend");
#endif
    return cpufast::make_fast_cpu_backend(std::move(weights), {.threads = threads});
  }
  throw InputError("unknown backend '" + name + "' (expected auto, cpu, cpu-ref or cuda)");
}

std::unique_ptr<Backend> make_synthetic_backend(const std::string& name, int layers, uint64_t seed, int threads,
                                                int64_t vocab) {
  if (layers < 1) throw InputError("synthetic model: the number of layers must be >= 1");
  if (name != "auto" && name != "cpu" && name != "cpu-ref" && name != "cuda")
    throw InputError("unknown backend '" + name + "' (expected auto, cpu, cpu-ref or cuda)");
  const bool gpu = name == "cuda" || (name == "auto" && cuda_usable());
  ModelConfig cfg = qwen36_shape(layers, gpu ? 1 : 0);
  if (vocab > 0) cfg.vocab_size = vocab;
  if (gpu) {
#if LILAC_CLI_CUDA
    if (!lilac::cuda::gpu_available()) throw InputError("--backend cuda: no usable CUDA GPU found");
    return lilac::cuda::make_synthetic_cuda_backend(cfg, seed);
#else
    throw InputError("--backend cuda: this build of lilac has no CUDA backend");
#endif
  }
  auto weights = cpufast::synthetic_weights(cfg, seed, threads);
  if (name == "cpu-ref") return make_cpu_backend(std::move(weights), threads);
  return cpufast::make_fast_cpu_backend(std::move(weights), {.threads = threads});
}

void add_backend_options(CLI::App& sub, std::string& backend, int& threads) {
  sub.add_option("--backend", backend,
                 "compute backend: auto (CUDA when a GPU is present, else cpu), cpu (fast, int8 kernels), "
                 "cpu-ref (the exact fp32 reference) or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cpu-ref", "cuda"}))
      ->capture_default_str();
  sub.add_option("--threads", threads, "CPU backend worker threads (0 = all hardware threads)")->capture_default_str();
}

}  // namespace lilac::cli
