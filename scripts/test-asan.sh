#!/usr/bin/env bash
# Builds lilac and its tests with clang's AddressSanitizer + UndefinedBehaviorSanitizer (no CUDA) in
# build-asan/ and runs the whole CPU test suite there (ctest arguments pass through, e.g. -R server).
# Slower than the normal run (~2-3x); undefined behaviour aborts the test that hits it.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-$PWD/build-asan}
. scripts/sanitizer-lib.sh
need_clang
configure_sanitized "$BUILD" "-fsanitize=address,undefined -fno-sanitize-recover=undefined"
cmake --build "$BUILD" -j "$(nproc)"
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1} UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1} \
  ctest --test-dir "$BUILD" --output-on-failure -j "$(nproc)" --timeout 1500 "$@"
