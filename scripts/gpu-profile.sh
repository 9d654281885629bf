#!/usr/bin/env bash
# Runs ON the GPU machine (like gpu-check.sh): per-kernel GPU times of a prefill chunk and of the decode
# step with Nsight Compute (each kernel node of the decode graph timed on its own, clocks left alone, caches
# not flushed), summed per kernel name (bench/perf_profile.py; the model of bench/PERF.md). A synthetic model of PROFILE_LAYERS (default 4) layers: one attention
# and three Gated DeltaNet layers, i.e. the real model's per-layer kernels.
#   bash scripts/gpu-profile.sh            → $OUT/ncu.csv, $OUT/ncu-summary.txt
# Or one kernel benchmark (bench/bench_kernels_<family>.cpp, packed by gpu-pack.sh) under Nsight Compute,
# every kernel launch timed, summed per kernel name (graph nodes profiled one by one):
#   bash scripts/gpu-profile.sh kernels <family> [benchmark filter regex]
#                                          → $OUT/ncu-<family>.csv, $OUT/ncu-<family>-summary.txt
# Or one launch of one kernel of a kernel benchmark, instruction by instruction (Nsight Compute's source
# counters on the SASS: executed instructions and stall samples per instruction, bench/sass_profile.py):
#   bash scripts/gpu-profile.sh sass <family> <kernel name regex> [benchmark filter regex]
#                                          → $OUT/sass-<family>.csv, $OUT/sass-<family>-summary.txt
# Or the speculative verify round (K = 3 drafts forced right with P = 0.8): every kernel node of the run timed,
# then per round (bench/perf_profile.py --per verify_accept); PROFILE_LAYERS (default 4), and a kernel-name regex
# (default: all) to keep the profile short with all 40 layers. The run also decodes without drafts (the K = 0
# column), so kernels that plain decoding launches too (the single-row ones, the MTP head's) are summed over both:
#   bash scripts/gpu-profile.sh verify [kernel name regex]  → $OUT/ncu-verify.csv, $OUT/ncu-verify-summary.txt
# Or the in-graph timeline, without Nsight Compute: every kernel's start and end on the GPU as the graphs run
# (CUPTI, bench/cupti_trace.cpp, packed by gpu-pack.sh), then per graph what each kernel adds to its critical
# path (bench/graph_trace.py) — the real step, PDL overlap included; default arguments: batch 1 / 4 / 16:
#   bash scripts/gpu-profile.sh trace [lilac bench arguments]  → $OUT/trace.csv.xz, $OUT/trace-summary.txt
# Or a prompt's prefill as it runs (the same CUPTI trace; its kernels are launched one by one, so each runs between its
# real neighbours, which Nsight Compute's serialised times do not show): per kernel its in-situ durations
# (bench/prefill_trace.py); default arguments: a 512-token prompt:
#   bash scripts/gpu-profile.sh prefill-trace [lilac bench arguments]  → $OUT/prefill-trace-summary.txt
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/lilac-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
L=.gpu/lilac
# The bench under the CUPTI tracer: trace_bench NAME ARGS... writes $OUT/NAME.csv (the trace) and $OUT/NAME-bench.txt.
trace_bench() {
  local name=$1
  shift
  [ -f .gpu/trace.tar.xz ] || { echo "no .gpu/trace.tar.xz (gpu-pack.sh packs it when CUPTI is found)"; exit 1; }
  mkdir -p .gpu/trace && tar -xJf .gpu/trace.tar.xz -C .gpu/trace
  LD_LIBRARY_PATH="$PWD/.gpu/trace:$LD_LIBRARY_PATH" CUDA_INJECTION64_PATH="$PWD/.gpu/trace/liblilac_cupti_trace.so" \
    LILAC_TRACE_OUT="$OUT/$name.csv" timeout ${PROFILE_TIMEOUT:-240} $L bench "$@" > "$OUT/$name-bench.txt" 2>&1
  echo "bench rc=$?"
}
if [ "${1:-}" = trace ]; then
  shift
  [ $# -gt 0 ] || set -- --synthetic --batch 1,4,16 --prompt-lens 512 --decode-tokens 16
  trace_bench trace "$@"
  python3 bench/graph_trace.py "$OUT/trace.csv" --graphs 8 --top 40 > "$OUT/trace-summary.txt"
  xz -T0 -f "$OUT/trace.csv"
  cat "$OUT/trace-summary.txt"
  exit 0
fi
if [ "${1:-}" = prefill-trace ]; then
  shift
  [ $# -gt 0 ] || set -- --synthetic --prompt-lens 512 --decode-tokens 2
  trace_bench prefill-trace "$@"
  python3 bench/prefill_trace.py "$OUT/prefill-trace.csv" --all > "$OUT/prefill-trace-summary.txt"
  rm -f "$OUT/prefill-trace.csv"
  cat "$OUT/prefill-trace-summary.txt"
  exit 0
fi
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "no ncu"; exit 1; }
if [ "${1:-}" = sass ]; then
  fam=${2:?usage: gpu-profile.sh sass <family> <kernel regex> [filter]}
  kre=${3:?usage: gpu-profile.sh sass <family> <kernel regex> [filter]}
  bash scripts/gpu-unpack-benches.sh || exit 1
  timeout ${PROFILE_TIMEOUT:-240} "$NCU" --clock-control none --section SourceCounters --page source \
    --print-source sass --csv -k "regex:$kre" -c 1 .gpu/kbench/bench_kernels_$fam --benchmark_filter="${4:-.}" \
    > "$OUT/sass-$fam.csv" 2> "$OUT/sass-$fam.err"
  echo "ncu rc=$?"
  python3 bench/sass_profile.py "$OUT/sass-$fam.csv" > "$OUT/sass-$fam-summary.txt"
  cat "$OUT/sass-$fam-summary.txt"
  tail -5 "$OUT/sass-$fam.err"
  exit 0
fi
if [ "${1:-}" = verify ]; then
  kre=${2:-.}
  [ "$kre" = . ] || kre="$kre|verify_accept"  # the round counter is always profiled
  timeout ${PROFILE_TIMEOUT:-240} "$NCU" --graph-profiling node --clock-control none --cache-control none \
    --metrics gpu__time_duration.sum --csv --page raw -k "regex:$kre" \
    $L bench --synthetic --layers "${PROFILE_LAYERS:-4}" --prompt-lens "${PROFILE_LEN:-512}" --decode-tokens 24 \
    --spec-tokens 3 --draft-accept 0.8 --spec-policy fixed > "$OUT/ncu-verify.csv" 2> "$OUT/ncu-verify.err"
  echo "ncu rc=$?"
  python3 bench/perf_profile.py "$OUT/ncu-verify.csv" --per verify_accept > "$OUT/ncu-verify-summary.txt"
  cat "$OUT/ncu-verify-summary.txt"
  tail -5 "$OUT/ncu-verify.err"
  exit 0
fi
if [ "${1:-}" = kernels ]; then
  fam=${2:?usage: gpu-profile.sh kernels <family> [filter]}
  bash scripts/gpu-unpack-benches.sh || exit 1
  timeout ${PROFILE_TIMEOUT:-240} "$NCU" --graph-profiling node --clock-control none --cache-control none \
    --metrics gpu__time_duration.sum --csv --page raw \
    .gpu/kbench/bench_kernels_$fam --benchmark_filter="${3:-.}" > "$OUT/ncu-$fam.csv" 2> "$OUT/ncu-$fam.err"
  echo "ncu rc=$?"
  python3 - "$OUT/ncu-$fam.csv" > "$OUT/ncu-$fam-summary.txt" <<'PY'
import csv, sys, collections
rows = list(csv.reader(open(sys.argv[1])))
hdr = next(i for i, r in enumerate(rows) if 'Kernel Name' in r)
h = rows[hdr]; data = rows[hdr + 2:]
ki, ti = h.index('Kernel Name'), h.index('gpu__time_duration.sum')
tot = collections.defaultdict(float); cnt = collections.Counter()
for r in data:
    n = r[ki].split('(')[0][:90]
    tot[n] += float(r[ti].replace(",", "")) / 1000.0; cnt[n] += 1  # ns -> us
for n, t in sorted(tot.items(), key=lambda x: -x[1]):
    print(f"{t:11.1f} us  {cnt[n]:6d}x  {t/cnt[n]:8.2f} us/launch  {n}")
PY
  cat "$OUT/ncu-$fam-summary.txt"
  tail -5 "$OUT/ncu-$fam.err"
  exit 0
fi
# The whole bench run is profiled (a 16-token warm-up prefill, the prompt's prefill, 2 decode steps);
# bench/perf_profile.py splits it at the sampling kernels and sums the prefill and the last decode step per kernel.
timeout ${PROFILE_TIMEOUT:-240} "$NCU" --graph-profiling node --clock-control none --cache-control none \
  --metrics gpu__time_duration.sum --csv --page raw \
  $L bench --synthetic --layers "${PROFILE_LAYERS:-4}" --prompt-lens "${PROFILE_LEN:-512}" --decode-tokens 2 \
  > "$OUT/ncu.csv" 2> "$OUT/ncu.err"
echo "ncu rc=$?"
python3 bench/perf_profile.py "$OUT/ncu.csv" > "$OUT/ncu-summary.txt"
cat "$OUT/ncu-summary.txt"
tail -5 "$OUT/ncu.err"
