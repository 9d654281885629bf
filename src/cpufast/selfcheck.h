// A self-contained check of a kernel set against the portable one on random packed data (4 and 8
// bits, one and two activation levels, 1..6 tokens, a partial last tile): used by the tests and by the
// ARM64 cross-check (scripts/cross-check-arm64.sh runs it under qemu). No dependency beyond kernels.h.
#pragma once
#include <cstdint>
#include <string>

#include "cpufast/kernels.h"

namespace lilac::cpufast {

// Empty when `k` agrees with kernels_scalar() (relative 1e-5), else the first mismatch.
std::string kernel_selfcheck(const KernelSet& k, uint64_t seed = 1);

}  // namespace lilac::cpufast
