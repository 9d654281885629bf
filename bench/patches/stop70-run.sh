#!/usr/bin/env bash
# Stop 70's device call: the MoE rows kernels with two 16-row blocks per warp and step (bench/patches/
# stop70-moe-row-pairs.patch, applied to d9e082d; N = the packed lilac /
# lilac_tests_cuda; LILAC_MOE_PAIRS=0 / LILAC_MOE_PAIRS_DOWN=0 / LILAC_MOE_PAIRS2_DOWN=0 switch gate/up / down at up to
# 32 rows / down above 32 rows back to one block) against main
# before them (B = .gpu/lilacB, PACK_EXTRA). Pack: PACK_KERNEL_BENCHES=0 PACK_XZ=1 PACK_EXTRA="/tmp/ab/lilacB" bash
# scripts/gpu-pack.sh; device: carry [".device"], `tar -xJf .device/g.tar.xz && LIMIT=540 OUT=$OUT bash
# bench/patches/stop70-run.sh` (PART=2: the profiles only, for a warm follow-up).
cd "$(dirname "$0")/../.."
T0=$(date +%s); LIMIT=${LIMIT:-300}; PART=${PART:-1}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
export LD_LIBRARY_PATH="$PWD/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mkdir -p /work && ln -sfn "$PWD/.gpu" /work/shared
B=.gpu/lilacB; N=.gpu/lilac; TN=.gpu/lilac_tests_cuda
O=${OUT:-/tmp/o}; mkdir -p $O
s() { echo; echo "=== $* (t=$(( $(date +%s) - T0 ))s, left $(left)s)"; }
s device; nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
SEC="--section SpeedOfLight --section WarpStateStats --metrics dram__bytes_read.sum,smsp__inst_executed.sum"
prof() {  # label kernel-regex batch [env]
  [ $(left) -gt 40 ] || { echo "skip $1"; return; }; s "ncu $1"
  env $4 timeout 45 ncu --launch-skip 4000 --launch-count 1 -k regex:$2 $SEC $N bench --synthetic --batch $3 \
    --prompt-lens 512 --decode-tokens 160 > $O/ncu-$1.txt 2>&1
  grep -E "Duration|DRAM Throughput|Compute \(SM\)|Warp Cycles Per Issued|dram__bytes_read|inst_executed|Grid Size|Registers" \
    $O/ncu-$1.txt | awk '{$1=$1; print}' | tr '\n' ';'; echo
}
if [ "$PART" = 2 ]; then
  prof gu16-pairs moe_gate_up_rows 16 LILAC_MOE_PAIRS=1
  prof gu16-one moe_gate_up_rows 16 LILAC_MOE_PAIRS=0
  prof dn16-pairs moe_down_rows 16 LILAC_MOE_PAIRS=1
  prof dn16-one moe_down_rows 16 LILAC_MOE_PAIRS_DOWN=0
  prof dn64-pairs moe_down_rows 64 LILAC_MOE_PAIRS2_DOWN=1
  prof dn64-one moe_down_rows 64 LILAC_MOE_PAIRS2_DOWN=0
  s done; exit 0
fi
s "tests N (RowsMoE first)"
timeout 60 $TN --gtest_filter='RowsMoE.*' > $O/tests-rowsmoe.txt 2>&1; echo rc=$?; grep -E "^\[  (FAILED|PASSED) |FAILED  \]|Failure|bit|seed" $O/tests-rowsmoe.txt | head -12
timeout 170 $TN > $O/tests-N.txt 2>&1; echo rc=$?; grep -E "^\[  (FAILED|PASSED) |FAILED  \]|tests ran" $O/tests-N.txt | head -10
s golden
for f in tiny tiny2 tiny-mtp; do timeout 30 $N check-golden --backend cuda --model .gpu/fixtures/$f/mlx4 --golden .gpu/fixtures/$f/golden.safetensors > $O/golden-$f.txt 2>&1; echo "$f rc=$?"; tail -1 $O/golden-$f.txt; done
bb() { [ $(left) -gt 40 ] || { echo "skip $1"; return; }; local lab=$1; shift; echo "--- $lab"; env "$@" bench --synthetic --batch 1,4,8,16,32,64 --prompt-lens 512 --decode-tokens 64 2>&1 | grep -E "^ +512 |error" | awk "{print \$2, \$3, \$4}" | tr '\n' ' '; echo; }
s "batch (batch, step ms, tok/s)"
for r in 1 2; do bb B $B; bb N $N; bb N-off LILAC_MOE_PAIRS=0 LILAC_MOE_PAIRS_DOWN=0 LILAC_MOE_PAIRS2_DOWN=0 $N; done
bb N-gu-only LILAC_MOE_PAIRS_DOWN=0 $N
bb N-dn-only LILAC_MOE_PAIRS=0 $N
bb N-no-dn64 LILAC_MOE_PAIRS2_DOWN=0 $N
sp() { [ $(left) -gt 50 ] || { echo "skip spec $1"; return; }; local lab=$1; shift; echo "--- spec $lab"; timeout 45 "$@" bench --synthetic --prompt-lens 512 --decode-tokens 256 --spec-tokens 3 --draft-accept 0.8 --spec-policy fixed 2>&1 | grep -E "fixed|adaptive|error" | tail -3; }
s "spec K=3 P=0.8"
sp B $B; sp N $N; sp B $B; sp N $N
s "first token at 16 / 32 / 512 tokens (B, N, B, N)"
for x in $B $N $B $N; do [ $(left) -gt 40 ] && timeout 30 $x bench --synthetic --prompt-lens 16,32,512 --decode-tokens 8 2>&1 | grep -E "^ +(16|32|512) |error" | awk '{print $1, $2, $3, $4, $5}' | tr '\n' ' '; echo; done
s memcheck
[ $(left) -gt 80 ] && timeout 75 compute-sanitizer --tool memcheck --error-exitcode 9 $TN --gtest_filter='RowsMoE.*:CudaRowsStep.*' > $O/memcheck.txt 2>&1; echo rc=$?; tail -3 $O/memcheck.txt
prof gu16-pairs moe_gate_up_rows 16 LILAC_MOE_PAIRS=1
prof gu16-one moe_gate_up_rows 16 LILAC_MOE_PAIRS=0
s done
