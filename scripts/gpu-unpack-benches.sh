#!/usr/bin/env bash
# Runs ON the GPU machine: unpacks the kernel benchmarks that scripts/gpu-pack.sh packed as
# .gpu/bench_kernels.tar.xz into .gpu/kbench/ (with Python's tarfile: no xz binary needed), replacing what is there.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f .gpu/bench_kernels.tar.xz ] || { echo "no .gpu/bench_kernels.tar.xz (run scripts/gpu-pack.sh)"; exit 1; }
rm -rf .gpu/kbench
mkdir -p .gpu/kbench
python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' .gpu/bench_kernels.tar.xz .gpu/kbench
ls .gpu/kbench
