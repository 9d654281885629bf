// The fast CPU backend (`--backend cpu`): the model with int8-quantized activations and integer dot
// products against the 4/8-bit weights repacked at load (kernels.h), the best kernel set the CPU
// supports (isa.h), a persistent worker pool with one barrier per phase (pool.h), grouped-by-expert
// MoE, the chunked Gated DeltaNet for prefill and an f16 K/V cache (forward.h). Reduced precision: it
// meets the thresholds check-golden applies to the CUDA backend, not the fp32 reference's
// (`--backend cpu-ref`, src/cpu/).
//
// Sessions are cpu::CpuSession (activation taps, prefill chunk; set_kv_bf16 is a no-op: the cache is
// always f16). decode_batch runs one step for several sessions reading each weight tile once; every
// row is bit-identical to that session's decode_step() alone.
#pragma once
#include <memory>
#include <string>

#include "cpu/cpu_backend.h"
#include "cpufast/kernels.h"
#include "engine/backend.h"
#include "model/weights.h"

namespace lilac::cpufast {

struct FastOptions {
  int threads = 0;  // <= 0: all hardware threads
  // Kernel level ("scalar", "avx2", "avx512", "neon"); empty: the best this CPU runs (or LILAC_CPU_ISA).
  std::string isa;
  // A kernel set to use instead (tests: e.g. another ISA's arithmetic emulated); must outlive the backend.
  const KernelSet* kernels = nullptr;
};

std::unique_ptr<Backend> make_fast_cpu_backend(std::shared_ptr<const ModelWeights> weights,
                                               const FastOptions& opts = {});

}  // namespace lilac::cpufast
