#!/usr/bin/env bash
# Builds the multi-threaded layers' tests with clang's ThreadSanitizer (no CUDA) in build-tsan/ and runs them:
# the thread pool (core), the fast CPU path (cpufast), the engine, the server (scheduler, HTTP, batching) and the
# hybrid router. ctest arguments pass through (e.g. -R Scheduler). A data race fails the test that hits it
# (halt_on_error); ~5-15x slower than the normal run, so the default is these layers, not the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-$PWD/build-tsan}
. scripts/sanitizer-lib.sh
need_clang
configure_sanitized "$BUILD" "-fsanitize=thread"
LAYERS=${LAYERS:-core cpufast engine server router}
targets=()
for l in $LAYERS; do targets+=("lilac_tests_$l"); done
cmake --build "$BUILD" -j "$(nproc)" --target lilac "${targets[@]}"
labels=$(echo "$LAYERS" | tr ' ' '|')
# scripts/tsan.supp: a false positive inside the uninstrumented cpp-httplib. The router's timing guards are left out
# (ThreadSanitizer's slowdown would be measured there, not a regression).
TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/scripts/tsan.supp} \
  ctest --test-dir "$BUILD" --output-on-failure -j "$(nproc)" --timeout 1500 -L "^($labels)\$" \
  -E 'DecisionFor100KBPromptIsUnderOneMillisecond|MegabytesOfAmpersandsAreScannedInLinearTime' "$@"
