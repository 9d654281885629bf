// libFuzzer's entry points for `lilac_fuzz`: the target is chosen by LILAC_FUZZ_TARGET (libFuzzer owns the
// command line). `LILAC_FUZZ_TARGET=list lilac_fuzz` lists the targets and their properties.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/log.h"
#include "fuzz/fuzz_target.h"

namespace {
const lilac::fuzz::Target* g_target = nullptr;
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* name = std::getenv("LILAC_FUZZ_TARGET");
  if (!name || !std::strcmp(name, "list") || !(g_target = lilac::fuzz::find_target(name))) {
    if (name && std::strcmp(name, "list")) std::fprintf(stderr, "lilac_fuzz: no target '%s'\n", name);
    std::fprintf(stderr, "set LILAC_FUZZ_TARGET to one of:\n");
    for (const auto& t : lilac::fuzz::targets()) std::fprintf(stderr, "  %-14s %s\n", t.name, t.what);
    std::exit(name && !std::strcmp(name, "list") ? 0 : 2);
  }
  lilac::set_log_level(lilac::LogLevel::Error);
  return 0;
}

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned seed) {
  if (g_target->mutator) return g_target->mutator(data, size, max_size, seed);
  return LLVMFuzzerMutate(data, size, max_size);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  g_target->fn(data, size);
  return 0;
}
