#!/usr/bin/env bash
# The device call stop 68 prepared and never got (bench/GPU_NOTES.md "Stop 68"). Binaries, built here beforehand:
#   B = main's lilac (copy build-cuda/lilac to /tmp/ab/lilacB before applying anything)
#   C = main + stop67-moe-gate-up-64-const-walk.patch: lilac and lilac_tests_cuda as /tmp/ab/lilacC, /tmp/ab/testsC
#   D = main + stop68-route-keys-down-chains.patch: lilac as /tmp/ab/lilacD
#   E = main + both stop 68 patches: the packed lilac / lilac_tests_cuda; F = E with LILAC_ROWS_WGS=1
# Pack: PACK_KERNEL_BENCHES=0 PACK_XZ=1 PACK_EXTRA="/tmp/ab/lilacB /tmp/ab/lilacC /tmp/ab/testsC /tmp/ab/lilacD"
#   bash scripts/gpu-pack.sh; device: carry [".device"], `tar -xJf .device/g.tar.xz && LIMIT=540 OUT=$OUT bash
#   bench/patches/stop68-run.sh` (tests of E and F first, then B/E/F alternated, C and D, ncu, the trace).
cd "$(dirname "$0")/../.."
T0=$(date +%s); LIMIT=${LIMIT:-300}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
export LD_LIBRARY_PATH="$PWD/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mkdir -p /work && ln -sfn "$PWD/.gpu" /work/shared
B=.gpu/lilacB; C=.gpu/lilacC; D=.gpu/lilacD; E=.gpu/lilac; TE=.gpu/lilac_tests_cuda; TC=.gpu/testsC
O=${OUT:-/tmp/o}; mkdir -p $O
s() { echo; echo "=== $* (t=$(( $(date +%s) - T0 ))s, left $(left)s)"; }
tt() { local lab=$1 lim=$2; shift 2; [ $(left) -gt $((lim / 2)) ] || { echo "skip $lab"; return; }; s "tests $lab"; timeout $lim "$@" > $O/tests-$lab.txt 2>&1; echo rc=$?; grep -E "^\[  (FAILED|PASSED) |^\[  FAILED|tests ran|SKIPPED \]" $O/tests-$lab.txt | head -8; }
bb() { [ $(left) -gt 25 ] || { echo "skip $1"; return; }; local lab=$1; shift; echo "--- $lab"; timeout 40 "$@" bench --synthetic --batch 1,4,16,64 --prompt-lens 512 --decode-tokens 64 2>&1 | grep -E "^ +512 |error" | awk "{print \$2, \$3, \$4}" | tr '\n' ' '; echo; }
s device; nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
tt E 100 $TE --gtest_filter='RowsGemv.*:CudaGemvTc.*:RowsMoE.*:DigitsMoE.*:CudaDecode.*:CudaBatch.*'
s batch
for r in 1 2; do bb B $B; bb E $E; bb F env LILAC_ROWS_WGS=1 $E; done
bb C $C; bb D $D
tt F 50 env LILAC_ROWS_WGS=1 $TE --gtest_filter='CudaBatch.*:CudaRowsStep.*'
tt C 40 $TC --gtest_filter='RowsMoE.*'
bb B $B; bb E $E; bb F env LILAC_ROWS_WGS=1 $E; bb C $C
sp() { [ $(left) -gt 60 ] || { echo "skip spec $1"; return; }; local lab=$1; shift; echo "--- spec $lab"; timeout 40 "$@" bench --synthetic --prompt-lens 512 --decode-tokens 128 --spec-tokens 3 --draft-accept 0.8 2>&1 | grep -E "x|tok/s|error" | tail -4; }
sp B $B; sp E $E
SEC="--section SpeedOfLight --section WarpStateStats --metrics dram__bytes_read.sum,smsp__inst_executed.sum,lts__t_bytes.sum"
prof() { [ $(left) -gt 35 ] || { echo "skip $1"; return; }; s "ncu $1"; timeout 40 ncu --launch-skip $3 --launch-count 1 -k regex:$2 $SEC $4 bench --synthetic --batch $5 --prompt-lens 512 --decode-tokens 128 2>&1 | grep -E "Duration|DRAM Throughput|Compute \(SM\)|Warp Cycles Per Issued|dram__bytes_read|inst_executed|lts__t_bytes|Grid Size|Registers" | awk '{$1=$1; print}' | tr '\n' ';'; echo; }
prof wgs64F gemv_rows_wgs 800 "env LILAC_ROWS_WGS=1 $E" 64
prof wgr64E gemv_rows_wgr 800 $E 64
if [ $(left) -gt 70 ]; then
  s trace
  mkdir -p .gpu/trace && tar -xJf .gpu/trace.tar.xz -C .gpu/trace
  LD_LIBRARY_PATH="$PWD/.gpu/trace:$LD_LIBRARY_PATH" CUDA_INJECTION64_PATH="$PWD/.gpu/trace/liblilac_cupti_trace.so" \
    LILAC_TRACE_OUT="$O/trace.csv" timeout $(( $(left) - 15 )) $E bench --synthetic --batch 1,4,16,64 --prompt-lens 512 --decode-tokens 16 > $O/trace-bench.txt 2>&1
  echo "trace rc=$?"
  python3 bench/graph_trace.py "$O/trace.csv" --graphs 8 --top 45 > "$O/trace-summary.txt" 2>&1; xz -T0 -f "$O/trace.csv"; head -c 2500 $O/trace-summary.txt
fi
s done
