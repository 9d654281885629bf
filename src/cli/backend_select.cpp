#include "cli/backend_select.h"

#include "core/error.h"
#include "cpu/cpu_backend.h"
#include "cpufast/fast_backend.h"

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

void add_backend_options(CLI::App& sub, std::string& backend, int& threads) {
  sub.add_option("--backend", backend,
                 "compute backend: auto (CUDA when a GPU is present, else cpu), cpu (fast, int8 kernels), "
                 "cpu-ref (the exact fp32 reference) or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cpu-ref", "cuda"}))
      ->capture_default_str();
  sub.add_option("--threads", threads, "CPU backend worker threads (0 = all hardware threads)")->capture_default_str();
}

}  // namespace lilac::cli
