// Fuzz targets: each checks one property of code that reads outside input (a client's bytes, a
// model's files, generated text) for every input, and aborts when it does not hold. They are built two
// ways: into `lilac_fuzz` (clang, libFuzzer, ASan + UBSan; `scripts/fuzz.sh`), and into the normal
// test build, where tests/fuzz/test_fuzz_corpus.cpp runs every target over its checked-in inputs
// (fuzz/corpus/<target>/: seeds and every input that once failed), so a fixed bug stays fixed in CI.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

namespace lilac::fuzz {

using TargetFn = void (*)(const uint8_t* data, size_t size);
// A structure-aware mutation of data[0, size) in place (up to max_size bytes); returns the new size.
using MutatorFn = size_t (*)(uint8_t* data, size_t size, size_t max_size, unsigned seed);

struct Target {
  const char* name;
  TargetFn fn;
  const char* what;  // the property, one line
  MutatorFn mutator = nullptr;  // libFuzzer's own byte mutations when null
};

std::vector<Target>& targets();
const Target* find_target(std::string_view name);

struct Register {
  Register(const char* name, TargetFn fn, const char* what, MutatorFn m = nullptr) { targets().push_back({name, fn, what, m}); }
};

// A property that does not hold: prints it and aborts (libFuzzer keeps the input; the corpus test fails).
[[noreturn]] inline void violated(const char* target, const std::string& what) {
  std::fprintf(stderr, "fuzz target %s: property violated: %s\n", target, what.c_str());
  std::fflush(stderr);
  std::abort();
}

// Reads the input as a sequence of choices (what libFuzzer mutates), then the rest as bytes.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : p_(data), n_(size) {}
  bool empty() const { return n_ == 0; }
  size_t left() const { return n_; }
  uint8_t byte() {
    if (n_ == 0) return 0;
    --n_;
    return *p_++;
  }
  uint32_t below(uint32_t k) { return k <= 1 ? 0 : (k <= 256 ? byte() % k : ((uint32_t(byte()) << 8) | byte()) % k); }
  bool flag() { return byte() & 1; }
  std::string bytes(size_t max) {
    const size_t k = max < n_ ? max : n_;
    std::string s(reinterpret_cast<const char*>(p_), k);
    p_ += k;
    n_ -= k;
    return s;
  }
  std::string rest() { return bytes(n_); }

 private:
  const uint8_t* p_;
  size_t n_;
};

}  // namespace lilac::fuzz

#define LILAC_FUZZ_CAT2(a, b) a##b
#define LILAC_FUZZ_CAT(a, b) LILAC_FUZZ_CAT2(a, b)
// LILAC_FUZZ_TARGET(name, "property") { ... uses data, size ... }
#define LILAC_FUZZ_TARGET(name, what) LILAC_FUZZ_TARGET_MUTATED(name, what, nullptr)
// The same with a structure-aware mutator (a MutatorFn), e.g. lilac::fuzz::mutate_json_body.
#define LILAC_FUZZ_TARGET_MUTATED(name, what, mutator)                                              \
  static void LILAC_FUZZ_CAT(fuzz_, name)(const uint8_t* data, size_t size);                       \
  static ::lilac::fuzz::Register LILAC_FUZZ_CAT(fuzz_reg_, name)(#name, &LILAC_FUZZ_CAT(fuzz_, name), what, mutator); \
  static void LILAC_FUZZ_CAT(fuzz_, name)(const uint8_t* data, size_t size)
