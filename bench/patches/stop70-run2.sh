#!/usr/bin/env bash
# Stop 70's second device call: the MoE rows kernels' rings 5 stages deep (LILAC_MOE_DEEP=1: gate/up and down up to 32
# rows, down above; bench/patches/stop70-moe-deep-rings.patch on 59aebeb) against the same binary without (= main's
# kernels), and, on an H200, issue 11 / 14 / 17's figures of main. Pack: PACK_KERNEL_BENCHES=0 PACK_XZ=1 bash
# scripts/gpu-pack.sh; device: carry [".device"], `tar -xJf .device/g.tar.xz && LIMIT=420 OUT=$OUT bash
# bench/patches/stop70-run2.sh`.
cd "$(dirname "$0")/../.."
T0=$(date +%s); LIMIT=${LIMIT:-300}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
export LD_LIBRARY_PATH="$PWD/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mkdir -p /work && ln -sfn "$PWD/.gpu" /work/shared
N=.gpu/lilac; TN=.gpu/lilac_tests_cuda
O=${OUT:-/tmp/o}; mkdir -p $O
s() { echo; echo "=== $* (t=$(( $(date +%s) - T0 ))s, left $(left)s)"; }
s device; GPU=$(nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader); echo "$GPU"
s "tests with LILAC_MOE_DEEP=1"
LILAC_MOE_DEEP=1 timeout 90 $TN --gtest_filter='RowsMoE.*:CudaRowsStep.*:CudaBatch.*' > $O/tests-deep.txt 2>&1; echo rc=$?; grep -E "^\[  (FAILED|PASSED) |FAILED  \]" $O/tests-deep.txt | head -8
bb() { [ $(left) -gt 40 ] || { echo "skip $1"; return; }; local lab=$1; shift; echo "--- $lab"; env "$@" bench --synthetic --batch 1,4,8,16,32,64 --prompt-lens 512 --decode-tokens 64 2>&1 | grep -E "^ +512 |error" | awk "{print \$2, \$3, \$4}" | tr '\n' ' '; echo; }
s "batch (batch, step ms, tok/s)"
for r in 1 2; do bb main $N; bb deep LILAC_MOE_DEEP=1 $N; done
SEC="--section SpeedOfLight --section WarpStateStats --metrics dram__bytes_read.sum,smsp__inst_executed.sum"
prof() {  # label kernel-regex batch [env]
  [ $(left) -gt 40 ] || { echo "skip $1"; return; }; s "ncu $1"
  env $4 timeout 45 ncu --launch-skip 4000 --launch-count 1 -k regex:$2 $SEC $N bench --synthetic --batch $3 \
    --prompt-lens 512 --decode-tokens 160 > $O/ncu-$1.txt 2>&1
  grep -E "Duration|DRAM Throughput|Compute \(SM\)|Warp Cycles Per Issued|dram__bytes_read|inst_executed" \
    $O/ncu-$1.txt | awk '{$1=$1; print}' | tr '\n' ';'; echo
}
prof gu16-deep moe_gate_up_rows 16 LILAC_MOE_DEEP=1
prof dn16-deep moe_down_rows 16 LILAC_MOE_DEEP=1
case "$GPU" in *H200*)
  sp() { [ $(left) -gt 50 ] || { echo "skip spec $1"; return; }; echo "--- spec $1"; shift; timeout 45 $N bench --synthetic --prompt-lens 512 --decode-tokens 256 --spec-tokens 3 --draft-accept 0.8 --spec-policy fixed "$@" 2>&1 | grep -E "fixed|error" | tail -2; }
  s "spec K=3 P=0.8 (main)"; sp whole; sp "draft-vocab 32768" --draft-vocab 32768
  s "issue 17 figures (main)"
  [ $(left) -gt 150 ] && timeout 140 $N bench --synthetic --prompt-lens 16,512,4096,16384,32768,131072 --decode-tokens 64 > $O/bench17.txt 2>&1; echo rc=$?; tail -9 $O/bench17.txt ;;
esac
s done
