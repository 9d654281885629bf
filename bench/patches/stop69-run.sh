#!/usr/bin/env bash
# Stop 69's second device call: main with stop 68's two patches and the input-streaming rows GEMV on by default from
# 49 rows (N = the packed lilac / lilac_tests_cuda) against main before it (B = .gpu/lilacB, PACK_EXTRA). Pack:
# PACK_KERNEL_BENCHES=0 PACK_XZ=1 PACK_EXTRA="/tmp/ab/lilacB" bash scripts/gpu-pack.sh; device: carry [".device"],
# `tar -xJf .device/g.tar.xz && LIMIT=520 OUT=$OUT bash bench/patches/stop69-run.sh`.
cd "$(dirname "$0")/../.."
T0=$(date +%s); LIMIT=${LIMIT:-300}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
export LD_LIBRARY_PATH="$PWD/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mkdir -p /work && ln -sfn "$PWD/.gpu" /work/shared
B=.gpu/lilacB; N=.gpu/lilac; TN=.gpu/lilac_tests_cuda
O=${OUT:-/tmp/o}; mkdir -p $O
s() { echo; echo "=== $* (t=$(( $(date +%s) - T0 ))s, left $(left)s)"; }
s device; nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
s tests N; timeout 150 $TN > $O/tests-N.txt 2>&1; echo rc=$?; grep -E "^\[  (FAILED|PASSED) |^\[  FAILED|SKIPPED \]" $O/tests-N.txt | head -8
s golden
for f in tiny tiny2 tiny-mtp; do timeout 30 $N check-golden --backend cuda --model .gpu/fixtures/$f/mlx4 --golden .gpu/fixtures/$f/golden.safetensors > $O/golden-$f.txt 2>&1; echo "$f rc=$?"; tail -2 $O/golden-$f.txt; done
bb() { [ $(left) -gt 30 ] || { echo "skip $1"; return; }; local lab=$1; shift; echo "--- $lab"; timeout 50 "$@" bench --synthetic --batch 1,4,16,32,48,64 --prompt-lens 512 --decode-tokens 64 2>&1 | grep -E "^ +512 |error" | awk "{print \$2, \$3, \$4}" | tr '\n' ' '; echo; }
s batch; for r in 1 2; do bb B $B; bb N $N; done
sp() { [ $(left) -gt 60 ] || { echo "skip spec $1"; return; }; local lab=$1; shift; echo "--- spec $lab"; timeout 60 "$@" 2>&1 | grep -E "fixed|adaptive|error" | tail -4; }
s spec
sp "B K=3 P=0.8" $B bench --synthetic --prompt-lens 512 --decode-tokens 512 --spec-tokens 3 --draft-accept 0.8 --spec-policy fixed
sp "N K=3 P=0.8" $N bench --synthetic --prompt-lens 512 --decode-tokens 512 --spec-tokens 3 --draft-accept 0.8 --spec-policy fixed
sp "N K=3 P=0.8 draft-vocab 32768" $N bench --synthetic --prompt-lens 512 --decode-tokens 512 --spec-tokens 3 --draft-accept 0.8 --spec-policy fixed --draft-vocab 32768
s "issue 17 figures (N)"
[ $(left) -gt 150 ] && timeout 140 $N bench --synthetic --prompt-lens 16,512,4096,16384,32768,131072 --decode-tokens 64 > $O/bench17-N.txt 2>&1; echo rc=$?; cat $O/bench17-N.txt | tail -14
s memcheck
[ $(left) -gt 80 ] && timeout 70 compute-sanitizer --tool memcheck --error-exitcode 9 $TN --gtest_filter='RowsGemv.WgmmaStream*:RowsMoE.*:CudaDecode.MoE*' > $O/memcheck.txt 2>&1; echo rc=$?; tail -3 $O/memcheck.txt
SEC="--section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis --metrics dram__bytes_read.sum,smsp__inst_executed.sum,lts__t_bytes.sum,dram__sectors_read.sum,lts__t_sectors_srcunit_tex_op_read.sum"
prof() { [ $(left) -gt 35 ] || { echo "skip $1"; return; }; s "ncu $1"; timeout 40 ncu --launch-skip $3 --launch-count 1 -k regex:$2 $SEC $N bench --synthetic --batch $4 --prompt-lens 512 --decode-tokens 128 > $O/ncu-$1.txt 2>&1; grep -E "Duration|DRAM Throughput|Compute \(SM\)|Warp Cycles Per Issued|dram__bytes_read|dram__sectors|inst_executed|lts__t_bytes|lts__t_sectors|Grid Size|Registers|Hit Rate|Mem Busy|Max Bandwidth" $O/ncu-$1.txt | awk '{$1=$1; print}' | tr '\n' ';'; echo; }
prof gateup16 moe_gate_up_rows 600 16
prof down16 moe_down_rows 600 16
prof gateup64 moe_gate_up_rows 600 64
s done
