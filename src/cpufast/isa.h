// Run-time CPU feature detection and the choice of kernel set for the fast CPU path. One x86-64
// binary carries the scalar, AVX2 and AVX-512 VNNI kernels and uses the best one the CPU (and the
// OS, for the vector state) supports; an ARM64 binary carries scalar and NEON dot-product kernels.
#pragma once
#include <string>
#include <vector>

#include "cpufast/kernels.h"

namespace lilac::cpufast {

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;                            // x86-64
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512vnni = false, avx512bf16 = false;
  bool neon_dot = false;                                                   // ARM64 asimddp
  std::string describe() const;  // e.g. "avx2 fma f16c avx512f avx512bw avx512vnni"
};

const CpuFeatures& cpu_features();

// Kernel set by level name: "scalar", "avx2", "avx512" (VNNI), "neon"; nullptr when this binary or this
// CPU cannot run it.
const KernelSet* kernels_for(const std::string& level);
// Every kernel set this machine can run, best last (scalar first).
std::vector<const KernelSet*> available_kernels();
// The best set; the environment variable LILAC_CPU_ISA (scalar, avx2, avx512, neon) forces a level
// (lilac::Error when this machine cannot run it).
const KernelSet& best_kernels();

}  // namespace lilac::cpufast
