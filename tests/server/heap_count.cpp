// heap_count.h: the global operator new / delete of lilac_tests_server, counted (or a sanitizer's malloc hooks).
#include "heap_count.h"

#include <malloc.h>

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define LILAC_TEST_SANITIZER_ALLOCATOR 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define LILAC_TEST_SANITIZER_ALLOCATOR 1
#endif
#endif
#ifdef LILAC_TEST_SANITIZER_ALLOCATOR
#include <sanitizer/allocator_interface.h>
#endif

namespace {
std::atomic<int64_t> live{0}, peak{0};
void add(int64_t n) {
  const int64_t now = live.fetch_add(n) + n;
  for (int64_t p = peak.load(); now > p && !peak.compare_exchange_weak(p, now);) {
  }
}
#ifdef LILAC_TEST_SANITIZER_ALLOCATOR
void on_malloc(const volatile void*, size_t n) { add(int64_t(n)); }
void on_free(const volatile void* p) { live.fetch_sub(int64_t(__sanitizer_get_allocated_size(p))); }
// (installed before main, while there is one thread, as the hooks require)
const int hooks_installed = __sanitizer_install_malloc_and_free_hooks(on_malloc, on_free);
#endif
}  // namespace

namespace lilac::test {

int64_t heap_live() { return live.load(); }
int64_t heap_peak() { return peak.load(); }
void heap_peak_reset() { peak.store(live.load()); }
bool heap_counted() {
#ifdef LILAC_TEST_SANITIZER_ALLOCATOR
  return hooks_installed > 0;
#else
  return true;
#endif
}

}  // namespace lilac::test

#ifndef LILAC_TEST_SANITIZER_ALLOCATOR
void* operator new(size_t n) {
  void* p = std::malloc(n ? n : 1);
  if (!p) throw std::bad_alloc();
  add(int64_t(malloc_usable_size(p)));
  return p;
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"  // (free of what operator new above took from malloc)
#endif
void operator delete(void* p) noexcept {
  if (!p) return;
  live.fetch_sub(int64_t(malloc_usable_size(p)));
  std::free(p);
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
void operator delete(void* p, size_t) noexcept { operator delete(p); }
#endif
