#!/usr/bin/env bash
# Runs ON the GPU machine (device `run`, carry [".gpu"]) from the repository root, after
# scripts/gpu-pack.sh packed .gpu/ here. Logs go to $OUT (or /tmp/lilac-out).
#   bash scripts/gpu-check.sh [all|tests|golden|bench|sanitize|cpu|bench-kernels]   (default all; cpu = the
#   fast CPU path on the host's cores: its kernel tests, check-golden on tiny/tiny2/real4,
#   bench/cpu_vs_llamacpp.sh on real4 -- not part of all)
# bench-kernels (not part of all) runs the CUDA kernel benchmarks bench_kernels_<family> (one per kernel
# family; unpacked from .gpu/bench_kernels.tar.xz into .gpu/kbench/), console output in the log and JSON
# in $OUT/bench_kernels_<family>.json.
# Env: BENCH_LENS (default 512,4096,16384), BENCH_LAYERS (default 40), SANITIZE=0 to skip
# compute-sanitizer, GTEST_FILTER for the tests, KERNEL_BENCHES (default: every packed family, e.g.
# "gemv gdn") and BENCH_FILTER (a --benchmark_filter regex) for bench-kernels.
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

exec > >(tee -a "$OUT/check.log") 2>&1
step "device"
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,clocks.mem,driver_version --format=csv 2>&1 
ldd $L | grep -i "not found" && echo "MISSING LIBRARIES" || echo "ldd: all libraries found"

if [ "$WHAT" = all ] || [ "$WHAT" = tests ]; then
  step "CUDA tests"
  timeout ${TEST_TIMEOUT:-120} $T --gtest_filter="${GTEST_FILTER:-*}" > /tmp/tests.log 2>&1
  [ $? = 0 ] || status=1
  cat /tmp/tests.log | grep -E "^\[  (FAILED|PASSED|SKIPPED) |OK \]|Failure|error|seed|Expected|Which is|actual" | head -150
fi

if [ "$WHAT" = all ] || [ "$WHAT" = golden ]; then
  for f in tiny tiny2 tiny-mtp; do
    step "check-golden $f"
    $L check-golden --backend cuda --model .gpu/fixtures/$f/mlx4 --golden .gpu/fixtures/$f/golden.safetensors 2>&1 | tail -25
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
  done
  step "real4 fixture"
  if [ ! -f /tmp/real4/golden.safetensors ]; then
    PYTHONUNBUFFERED=1 timeout ${FIXTURE_TIMEOUT:-120} python3 .gpu/oracle/make_fixture.py --preset real4 --out /tmp/real4 --device cuda --no-hf > /tmp/real4-make.log 2>&1
    echo "make_fixture rc=$?"; tail -3 /tmp/real4-make.log
  fi
  timeout ${GOLDEN_TIMEOUT:-120} $L check-golden --backend cuda --model /tmp/real4/mlx4 --golden /tmp/real4/golden.safetensors 2>&1 | tail -30
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi

if [ "$WHAT" = all ] || [ "$WHAT" = bench ]; then
  step "bench --synthetic"
  timeout ${BENCH_TIMEOUT:-180} $L bench --synthetic --layers "${BENCH_LAYERS:-40}" --prompt-lens "${BENCH_LENS:-512,4096,16384}" --json "$OUT/bench.json" 2>&1
  if [ $? != 0 ]; then
    status=1
    step "bench again with the token-by-token prefill (decode kernels)"
    LILAC_CUDA_TOKEN_PREFILL=1 timeout 90 $L bench --synthetic --layers "${BENCH_LAYERS:-40}" --prompt-lens 512,4096 --json "$OUT/bench-token.json" 2>&1
  fi
fi
if [ "$WHAT" = all ] || [ "$WHAT" = sanitize ]; then
  if [ "${SANITIZE:-1}" = 1 ] && command -v compute-sanitizer >/dev/null; then
    step "compute-sanitizer memcheck (decode kernels)"
    timeout ${SAN_TIMEOUT:-60} compute-sanitizer --tool memcheck --error-exitcode 9 $T --gtest_filter='CudaDecode.Gemv*:CudaDecode.MoE*:CudaDecode.Attention*:CudaDecode.GatedDeltaNet*:CudaDecode.Greedy*' > /tmp/memcheck.log 2>&1
    echo "memcheck rc=$?"; tail -3 /tmp/memcheck.log
    step "compute-sanitizer racecheck (decode kernels)"
    timeout ${SAN_TIMEOUT:-60} compute-sanitizer --tool racecheck --error-exitcode 9 $T --gtest_filter='CudaDecode.Gemv*:CudaDecode.GatedDeltaNet*:CudaDecode.Attention*' > /tmp/racecheck.log 2>&1
    echo "racecheck rc=$?"; tail -3 /tmp/racecheck.log
    # synccheck: barriers and warp collectives. The prefill GEMM's tiles of at most 64 rows (short prompts, an expert's
    # last tile) once reached two copies of __syncthreads (stop 52: 23,744 errors; 0 since 037872f, stop 54); the
    # batched step runs those GEMMs for its prompts.
    step "compute-sanitizer synccheck (prefill GEMMs, rows kernels, batched step)"
    timeout ${SAN_TIMEOUT:-120} compute-sanitizer --tool synccheck --error-exitcode 9 $T --gtest_filter='PrefillQgemm.*:PrefillMoe.*:RowsGemv.*:CudaBatch.*' > /tmp/synccheck.log 2>&1
    echo "synccheck rc=$?"; tail -3 /tmp/synccheck.log
    # memcheck of the batched step. RejectsBadBatchesAndOversizedSessions is left out: it asks for a 2^40-token
    # session on purpose, and memcheck counts the refused cudaMalloc as 2 API errors.
    step "compute-sanitizer memcheck (batched step)"
    timeout ${SAN_TIMEOUT:-120} compute-sanitizer --tool memcheck --error-exitcode 9 $T --gtest_filter='CudaBatch.*:-CudaBatch.RejectsBadBatchesAndOversizedSessions' > /tmp/memcheck-batch.log 2>&1
    echo "memcheck (batched step) rc=$?"; tail -3 /tmp/memcheck-batch.log
  fi
fi
if [ "$WHAT" = bench-kernels ]; then
  bash scripts/gpu-unpack-benches.sh || status=1
  for fam in ${KERNEL_BENCHES:-$(ls .gpu/kbench 2>/dev/null | sed 's/^bench_kernels_//')}; do
    b=.gpu/kbench/bench_kernels_$fam
    step "kernel benchmarks: $fam"
    [ -x "$b" ] || { echo "missing $b (run scripts/gpu-pack.sh)"; status=1; continue; }
    timeout ${KBENCH_TIMEOUT:-300} $b --benchmark_filter="${BENCH_FILTER:-.}" \
      --benchmark_out="$OUT/bench_kernels_$fam.json" --benchmark_out_format=json 2>&1
    [ $? = 0 ] || status=1
  done
fi
if [ "$WHAT" = cpu ]; then
  step "fast CPU path: kernel and backend tests (every kernel set this CPU runs)"
  timeout ${TEST_TIMEOUT:-300} .gpu/lilac_tests_cpufast > /tmp/tests-cpufast.log 2>&1
  [ $? = 0 ] || status=1
  grep -E "kernel sets here|avx512-vnni here|^\[  (FAILED|PASSED) |OK \]|Failure|Expected|Which is|actual" /tmp/tests-cpufast.log | head -80
  for isa in auto avx2 scalar; do
    for f in tiny tiny2; do
      step "check-golden --backend cpu $f (LILAC_CPU_ISA=$isa)"
      LILAC_CPU_ISA=$isa $L check-golden --backend cpu --model .gpu/fixtures/$f/mlx4 --golden .gpu/fixtures/$f/golden.safetensors 2>&1 | tail -14
      [ "${PIPESTATUS[0]}" = 0 ] || status=1
    done
  done
  step "real4 fixture"
  if [ ! -f /tmp/real4/golden.safetensors ]; then
    PYTHONUNBUFFERED=1 timeout ${FIXTURE_TIMEOUT:-120} python3 .gpu/oracle/make_fixture.py --preset real4 --out /tmp/real4 --device cuda --no-hf > /tmp/real4-make.log 2>&1
    echo "make_fixture rc=$?"; tail -3 /tmp/real4-make.log
  fi
  for isa in auto avx2; do
    step "check-golden --backend cpu real4 (LILAC_CPU_ISA=$isa)"
    LILAC_CPU_ISA=$isa timeout ${GOLDEN_TIMEOUT:-240} $L check-golden --backend cpu --model /tmp/real4/mlx4 --golden /tmp/real4/golden.safetensors 2>&1 | tail -16
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
  done
  step "CPU bench (real4; llama.cpp when LLAMA_BENCH and GGUF are set)"
  LILAC=$L MEMBW=.gpu/bench_membw OUT="$OUT/cpu-bench" timeout ${BENCH_TIMEOUT:-400} bash bench/cpu_vs_llamacpp.sh /tmp/real4/mlx4 ${LLAMA_BENCH:-} ${GGUF:-} 2>&1
fi
cp /tmp/tests.log /tmp/memcheck.log /tmp/racecheck.log /tmp/synccheck.log /tmp/memcheck-batch.log "$OUT"/ 2>/dev/null
echo; echo "gpu-check status $status"
exit $status
