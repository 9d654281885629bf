#include "cpufast/isa.h"

#include <cstdlib>

#include "core/error.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#endif

namespace lilac::cpufast {

namespace {

CpuFeatures detect() {
  CpuFeatures f;
#if defined(__x86_64__)
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = c & (1u << 27);
  uint64_t xcr0 = 0;
  if (osxsave) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = (uint64_t(hi) << 32) | lo;
  }
  const bool ymm_os = (xcr0 & 0x6) == 0x6;            // SSE + AVX state
  const bool zmm_os = ymm_os && (xcr0 & 0xE0) == 0xE0;  // opmask + zmm state
  f.fma = ymm_os && (c & (1u << 12));
  f.f16c = ymm_os && (c & (1u << 29));
  if (__get_cpuid_max(0, nullptr) >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    f.avx2 = ymm_os && (b & (1u << 5));
    f.avx512f = zmm_os && (b & (1u << 16));
    f.avx512bw = zmm_os && (b & (1u << 30));
    f.avx512vl = zmm_os && (b & (1u << 31));
    f.avx512vnni = zmm_os && (c & (1u << 11));
    __cpuid_count(7, 1, a, b, c, d);
    f.avx512bf16 = zmm_os && (a & (1u << 5));
  }
#elif defined(__aarch64__) && defined(__linux__)
  f.neon_dot = getauxval(AT_HWCAP) & HWCAP_ASIMDDP;
#endif
  return f;
}

bool can_run(const std::string& level) {
  const CpuFeatures& f = cpu_features();
  if (level == "scalar") return true;
  if (level == "avx2") return f.avx2 && f.fma && f.f16c;
  if (level == "avx512") return f.avx512f && f.avx512bw && f.avx512vl && f.avx512vnni;
  if (level == "neon") return f.neon_dot;
  return false;
}

const KernelSet* compiled(const std::string& level) {
  if (level == "scalar") return kernels_scalar();
  if (level == "avx2") return kernels_avx2();
  if (level == "avx512") return kernels_avx512();
  if (level == "neon") return kernels_neon();
  return nullptr;
}

}  // namespace

std::string CpuFeatures::describe() const {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(avx2, "avx2");
  add(fma, "fma");
  add(f16c, "f16c");
  add(avx512f, "avx512f");
  add(avx512bw, "avx512bw");
  add(avx512vl, "avx512vl");
  add(avx512vnni, "avx512vnni");
  add(avx512bf16, "avx512bf16");
  add(neon_dot, "asimddp");
  return s.empty() ? "baseline" : s;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

const KernelSet* kernels_for(const std::string& level) { return can_run(level) ? compiled(level) : nullptr; }

std::vector<const KernelSet*> available_kernels() {
  std::vector<const KernelSet*> v;
  for (const char* l : {"scalar", "neon", "avx2", "avx512"})
    if (const KernelSet* k = kernels_for(l)) v.push_back(k);
  return v;
}

const KernelSet& best_kernels() {
  if (const char* env = std::getenv("LILAC_CPU_ISA"); env && *env && std::string(env) != "auto") {
    const KernelSet* k = kernels_for(env);
    if (!k)
      throw Error(std::string("LILAC_CPU_ISA=") + env + ": this CPU or build cannot run that level (CPU has: " +
                  cpu_features().describe() + "; levels: scalar, avx2, avx512, neon)");
    return *k;
  }
  return *available_kernels().back();
}

}  // namespace lilac::cpufast
