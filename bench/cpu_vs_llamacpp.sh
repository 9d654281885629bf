#!/usr/bin/env bash
# lilac's fast CPU path against llama.cpp on the same machine and model shape, plus the machine's
# memory-bandwidth floor. Builds nothing: it takes what exists.
#
#   bench/cpu_vs_llamacpp.sh MODEL [LLAMA_BENCH GGUF]
#     MODEL        a lilac model folder (e.g. /tmp/real4/mlx4), or synthetic:N (random weights of the
#                  real shape with N layers, made in memory by `lilac bench --synthetic`)
#     LLAMA_BENCH  path to llama.cpp's llama-bench (optional)
#     GGUF         a GGUF of the same shape for it (optional)
#   Environment: LILAC (default build/lilac), MEMBW (default build/bench/bench_membw),
#     THREADS (default "all 4"), PROMPT (512), GEN (64), OUT (folder for the JSON, default a temp dir).
#
# Reports per thread count: prefill tok/s (a PROMPT-token prompt), decode tok/s (GEN tokens after a
# 16-token prompt, as llama-bench's tg from an almost empty cache), decode as a fraction of the
# bandwidth floor (bytes a decode step must read / measured copy bandwidth), and llama.cpp's pp/tg with
# the ratios when LLAMA_BENCH and GGUF are given.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:?usage: bench/cpu_vs_llamacpp.sh MODEL [LLAMA_BENCH GGUF]}
LLAMA_BENCH=${2:-}
GGUF=${3:-}
LILAC=${LILAC:-build/lilac}
MEMBW=${MEMBW:-build/bench/bench_membw}
PROMPT=${PROMPT:-512}
GEN=${GEN:-64}
NPROC=$(nproc)
THREADS=${THREADS:-"all 4"}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
[ -x "$LILAC" ] || { echo "no lilac binary at $LILAC (build it, or set LILAC)"; exit 1; }

threads_list=()
for t in $THREADS; do
  [ "$t" = all ] && t=$NPROC
  [ "$t" -le "$NPROC" ] && threads_list+=("$t")
done

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $NPROC hardware threads"
echo "lilac: $($LILAC --version 2>/dev/null || echo "$LILAC"), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"

# Memory bandwidth floor: copy GB/s (read + write bytes) with all threads.
membw_gbs=""
if [ -x "$MEMBW" ]; then
  "$MEMBW" --benchmark_filter="Copy/$NPROC/" --benchmark_format=json > "$OUT/membw.json" 2>/dev/null
  membw_gbs=$(python3 -c "import json,sys; b=json.load(open(sys.argv[1]))['benchmarks'][0]; print('%.1f' % (b['bytes_per_second']/1e9))" "$OUT/membw.json")
  echo "memory bandwidth (copy, $NPROC threads): $membw_gbs GB/s"
else
  echo "no $MEMBW: no bandwidth floor (build the bench_membw target)"
fi
peak_tbs=$(python3 -c "print(${membw_gbs:-0}/1000 if '${membw_gbs}' else 1)")

model_args=(--model "$MODEL")
case "$MODEL" in synthetic:*) model_args=(--synthetic --layers "${MODEL#synthetic:}") ;; esac

printf '\n%8s %14s %14s %10s %14s %14s %9s %9s\n' threads "lilac pp t/s" "lilac tg t/s" "floor %" "llama pp t/s" "llama tg t/s" "pp ratio" "tg ratio"
for t in "${threads_list[@]}"; do
  "$LILAC" bench "${model_args[@]}" --backend cpu --threads "$t" --prompt-lens "16,$PROMPT" --decode-tokens "$GEN" \
    --peak-tbs "$peak_tbs" --json "$OUT/lilac_t$t.json" > "$OUT/lilac_t$t.log" 2>&1 || { cat "$OUT/lilac_t$t.log"; exit 1; }
  read -r pp tg floor < <(python3 - "$OUT/lilac_t$t.json" "$PROMPT" <<'PY'
import json, sys
r = {x["prompt_len"]: x for x in json.load(open(sys.argv[1]))["results"]}
p = int(sys.argv[2])
print("%.1f %.1f %.1f" % (r[p]["prefill_tok_s"], r[16]["decode_tok_s"], 100 * r[16].get("floor_fraction", 0)))
PY
)
  lpp="-"; ltg="-"; rpp="-"; rtg="-"
  if [ -n "$LLAMA_BENCH" ] && [ -n "$GGUF" ]; then
    "$LLAMA_BENCH" -m "$GGUF" -p "$PROMPT" -n "$GEN" -t "$t" -ngl 0 -o json > "$OUT/llama_t$t.json" 2> "$OUT/llama_t$t.log"
    read -r lpp ltg < <(python3 - "$OUT/llama_t$t.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
pp = [r["avg_ts"] for r in rows if r["n_prompt"] > 0 and r["n_gen"] == 0]
tg = [r["avg_ts"] for r in rows if r["n_gen"] > 0 and r["n_prompt"] == 0]
print("%.1f %.1f" % (pp[0] if pp else 0, tg[0] if tg else 0))
PY
)
    rpp=$(python3 -c "print('%.2f' % ($pp/$lpp) if $lpp else '-')")
    rtg=$(python3 -c "print('%.2f' % ($tg/$ltg) if $ltg else '-')")
  fi
  printf '%8s %14s %14s %10s %14s %14s %9s %9s\n' "$t" "$pp" "$tg" "$floor" "$lpp" "$ltg" "$rpp" "$rtg"
done
[ -z "$LLAMA_BENCH" ] && echo "(no llama-bench given: lilac alone)"
echo "JSON and logs: $OUT"
