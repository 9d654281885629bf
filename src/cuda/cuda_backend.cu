// The CUDA backend: a model on the device (device_model.h: uploaded from a checkpoint, or synthetic)
// shared by its sessions (cuda_session.h: one sequence each, the decode step as CUDA graphs).
#include "cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <string>
#include <utility>

#include "core/error.h"
#include "cuda/cuda_common.h"
#include "cuda/cuda_session.h"
#include "cuda/device_model.h"
#include "cuda/synthetic_model.h"

namespace lilac::cuda {
namespace {

class CudaBackendImpl : public Backend {
 public:
  explicit CudaBackendImpl(std::unique_ptr<DevModel> m) : m_(std::move(m)) {
    cudaDeviceProp p{};
    LILAC_CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
    desc_ = std::string(p.name) + ", " + std::to_string(p.multiProcessorCount) + " SMs, " +
            std::to_string(p.totalGlobalMem >> 20) + " MiB";
  }
  std::string name() const override { return "cuda"; }
  const ModelConfig& config() const override { return m_->cfg; }
  std::unique_ptr<Session> new_session(int64_t max_length) override {
    if (max_length <= 0) max_length = m_->cfg.max_position_embeddings > 0 ? m_->cfg.max_position_embeddings : 4096;
    return std::make_unique<CudaSession>(*m_, max_length);
  }
  std::string describe() const override { return desc_; }
  size_t weight_bytes() const { return m_->weight_bytes(); }

 private:
  std::unique_ptr<DevModel> m_;
  std::string desc_;
};

}  // namespace

bool gpu_available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

std::unique_ptr<Backend> make_cuda_backend(std::shared_ptr<const ModelWeights> weights) {
  LILAC_CHECK(weights, "cuda: no weights");
  LILAC_CHECK(gpu_available(), "cuda: no CUDA GPU is available");
  auto m = upload_model(*weights);
  return std::make_unique<CudaBackendImpl>(std::move(m));  // weights are on the device: drop the host copy
}

std::unique_ptr<Backend> make_synthetic_cuda_backend(const ModelConfig& cfg, uint64_t seed) {
  LILAC_CHECK(gpu_available(), "cuda: no CUDA GPU is available");
  return std::make_unique<CudaBackendImpl>(synthetic_model(cfg, seed));
}

MemoryInfo memory_info(const Backend& b) {
  MemoryInfo m;
  size_t fr = 0, tot = 0;
  if (cudaMemGetInfo(&fr, &tot) == cudaSuccess) {
    m.used = tot - fr;
    m.total = tot;
  }
  if (const auto* cb = dynamic_cast<const CudaBackendImpl*>(&b)) m.weights = cb->weight_bytes();
  return m;
}

}  // namespace lilac::cuda
