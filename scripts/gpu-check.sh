#!/usr/bin/env bash
# Runs ON the GPU machine (device `run`, carry [".gpu"]) from the repository root, after
# scripts/gpu-pack.sh packed .gpu/ here. Logs go to $OUT (or /tmp/lilac-out).
#   bash scripts/gpu-check.sh [all|tests|golden|bench]   (default all)
# Env: BENCH_LENS (default 512,4096,16384), BENCH_LAYERS (default 40), SANITIZE=0 to skip
# compute-sanitizer, GTEST_FILTER for the tests.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/lilac-out}
mkdir -p "$OUT"
WHAT=${1:-all}
export LD_LIBRARY_PATH="$PWD/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The tests look for the fixtures at the build machine's ../shared: point that path at the copy.
if [ ! -e /work/shared/fixtures/tiny ]; then
  mkdir -p /work && rm -rf /work/shared 2>/dev/null; ln -sfn "$PWD/.gpu" /work/shared 2>/dev/null || true
fi
L=.gpu/lilac
T=.gpu/lilac_tests_cuda
status=0
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }

step "device"
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,clocks.mem,driver_version --format=csv 2>&1 | tee "$OUT/nvidia-smi.txt"
ldd $L | grep -i "not found" && echo "MISSING LIBRARIES" || echo "ldd: all libraries found"

if [ "$WHAT" = all ] || [ "$WHAT" = tests ]; then
  step "CUDA tests"
  $T --gtest_filter="${GTEST_FILTER:-*}" 2>&1 | tee "$OUT/tests.log" | grep -E "^\[  (FAILED|PASSED|SKIPPED) |OK \]|Failure|error|seed|Expected|Which is|actual" | head -150
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  if [ "${SANITIZE:-1}" = 1 ] && command -v compute-sanitizer >/dev/null; then
    step "compute-sanitizer memcheck (decode kernels)"
    compute-sanitizer --tool memcheck --error-exitcode 9 $T --gtest_filter='CudaDecode.Gemv*:CudaDecode.MoE*:CudaDecode.Attention*:CudaDecode.GatedDeltaNet*:CudaDecode.Greedy*' > "$OUT/memcheck.log" 2>&1
    echo "memcheck rc=$?"; tail -3 "$OUT/memcheck.log"
    step "compute-sanitizer racecheck (decode kernels)"
    compute-sanitizer --tool racecheck --error-exitcode 9 $T --gtest_filter='CudaDecode.Gemv*:CudaDecode.GatedDeltaNet*:CudaDecode.Attention*' > "$OUT/racecheck.log" 2>&1
    echo "racecheck rc=$?"; tail -3 "$OUT/racecheck.log"
  fi
fi

if [ "$WHAT" = all ] || [ "$WHAT" = golden ]; then
  for f in tiny tiny2; do
    step "check-golden $f"
    $L check-golden --backend cuda --model .gpu/fixtures/$f/mlx4 --golden .gpu/fixtures/$f/golden.safetensors 2>&1 | tee "$OUT/golden-$f.log" | tail -25
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
  done
  step "real4 fixture"
  if [ ! -f /tmp/real4/golden.safetensors ]; then
    PYTHONUNBUFFERED=1 python3 .gpu/oracle/make_fixture.py --preset real4 --out /tmp/real4 --device cuda --no-hf > "$OUT/real4-make.log" 2>&1
    echo "make_fixture rc=$?"; tail -3 "$OUT/real4-make.log"
  fi
  $L check-golden --backend cuda --model /tmp/real4/mlx4 --golden /tmp/real4/golden.safetensors 2>&1 | tee "$OUT/golden-real4.log" | tail -30
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi

if [ "$WHAT" = all ] || [ "$WHAT" = bench ]; then
  step "bench --synthetic"
  $L bench --synthetic --layers "${BENCH_LAYERS:-40}" --prompt-lens "${BENCH_LENS:-512,4096,16384}" --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
echo; echo "gpu-check status $status"
exit $status
