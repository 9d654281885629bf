#!/usr/bin/env bash
# Builds lilac_fuzz (clang, libFuzzer, ASan + UBSan on the whole build) in build-fuzz/ and runs fuzz
# targets, each for SECONDS (default 60), JOBS at a time (default: the cores), from a copy of their
# checked-in corpus (fuzz/corpus/<target>/). An input that breaks a target's property (or crashes,
# leaks, hangs past 10 s) is left in $WORK/<target>/ as crash-* / timeout-* / leak-* and the script
# exits 1; add it to fuzz/corpus/<target>/ with the fix, so tests/fuzz replays it in every test run.
#
#   bash scripts/fuzz.sh                 # every target
#   SECONDS_PER=600 bash scripts/fuzz.sh server http
#   LILAC_FUZZ_TARGET=list build-fuzz/fuzz/lilac_fuzz   # the targets and their properties
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${BUILD:-$ROOT/build-fuzz}
WORK=${WORK:-/tmp/lilac-fuzz}
PER=${SECONDS_PER:-60}
JOBS=${JOBS:-$(nproc)}
FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
. scripts/sanitizer-lib.sh
need_clang  # clang, libFuzzer and the sanitizers
if [ ! -f "$BUILD/build.ninja" ]; then
  CC=clang CXX=clang++ cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLILAC_CUDA=OFF \
    -DLILAC_BUILD_TESTS=OFF -DLILAC_BUILD_BENCH=OFF -DLILAC_FUZZ=ON -DCMAKE_CXX_FLAGS="$FLAGS" >/dev/null
fi
cmake --build "$BUILD" --target lilac_fuzz -j "$JOBS"
BIN=$BUILD/fuzz/lilac_fuzz
if [ $# -gt 0 ]; then TARGETS=("$@"); else
  mapfile -t TARGETS < <(LILAC_FUZZ_TARGET=list "$BIN" 2>&1 | awk 'NR > 1 { print $1 }')
fi
mkdir -p "$WORK"
run_one() {
  local t=$1 dir=$WORK/$1
  mkdir -p "$dir/corpus"
  [ -d "$ROOT/fuzz/corpus/$t" ] && cp -n "$ROOT/fuzz/corpus/$t"/* "$dir/corpus/" 2>/dev/null || true
  if (cd "$dir" && LILAC_FUZZ_TARGET=$t ASAN_OPTIONS=detect_leaks=1 "$BIN" -max_total_time="$PER" -timeout=10 \
        -rss_limit_mb=4096 -max_len=8192 -print_final_stats=1 corpus >"$dir/log" 2>&1); then
    echo "ok    $t ($(grep -o 'stat::number_of_executed_units: *[0-9]*' "$dir/log" | grep -o '[0-9]*$') runs)"
  else
    echo "FAIL  $t: $(grep -m1 -E 'property violated|ERROR: |runtime error' "$dir/log" | cut -c1-300)"
    echo "      input and log in $dir"
    return 1
  fi
}
fail=0
pids=()
for t in "${TARGETS[@]}"; do
  run_one "$t" &
  pids+=($!)
  if [ ${#pids[@]} -ge "$JOBS" ]; then
    wait "${pids[0]}" || fail=1
    pids=("${pids[@]:1}")
  fi
done
for p in "${pids[@]}"; do wait "$p" || fail=1; done
exit $fail
