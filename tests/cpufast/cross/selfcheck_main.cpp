// Cross-build driver (scripts/cross-check-arm64.sh): runs kernel_selfcheck on every kernel set the
// machine (or emulator) supports and exits 1 on a mismatch.
#include <cstdio>

#include "cpufast/isa.h"
#include "cpufast/selfcheck.h"

int main() {
  using namespace lilac::cpufast;
  int bad = 0;
  std::printf("CPU features: %s\n", cpu_features().describe().c_str());
  for (const KernelSet* k : available_kernels()) {
    const std::string err = kernel_selfcheck(*k);
    std::printf("%-12s %s\n", k->name, err.empty() ? "ok" : err.c_str());
    bad += !err.empty();
  }
  return bad ? 1 : 0;
}
