#include "fuzz/fuzz_target.h"

namespace lilac::fuzz {

std::vector<Target>& targets() {
  static std::vector<Target> t;
  return t;
}

const Target* find_target(std::string_view name) {
  for (const Target& t : targets())
    if (name == t.name) return &t;
  return nullptr;
}

}  // namespace lilac::fuzz
