// The bytes the heap of lilac_tests_server holds and their peak since heap_peak_reset(), for the memory a request takes
// while it is answered: exact, where resident memory would also count a sanitizer's shadow and quarantine. Under ASan /
// TSan (which bring their own allocator and operator new) through the sanitizer's malloc and free hooks; else by
// replacing the global operator new / delete of the test binary (heap_count.cpp: malloc / free, counted as
// malloc_usable_size: one atomic add more each). Only what operator new takes is counted (not a plain malloc).
#pragma once
#include <cstdint>

namespace lilac::test {

int64_t heap_live();
int64_t heap_peak();
void heap_peak_reset();  // the peak := the bytes held now
// Whether the counting works (false: a sanitizer's hooks could not be installed).
bool heap_counted();

}  // namespace lilac::test
