#!/usr/bin/env bash
# ARM64 check of the fast CPU path's kernels: cross-compiles the kernel sets (scalar + NEON dot-product,
# the latter with its own -march flags, as CMake does) with Debian's g++-aarch64-linux-gnu and, when
# qemu-user is installed, runs the self-check (each set against the scalar one) under
# `qemu-aarch64 -cpu max` (which has the dot-product extension).
#   apt-get install g++-aarch64-linux-gnu qemu-user
set -euo pipefail
cd "$(dirname "$0")/.."
CXX=${CXX:-aarch64-linux-gnu-g++}
command -v "$CXX" >/dev/null || { echo "no $CXX (apt-get install g++-aarch64-linux-gnu)"; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
flags=(-std=gnu++20 -O2 -ffp-contract=off -Wall -Wextra -Wno-unused-parameter -Werror -Isrc)
for f in kernels_scalar kernels_avx2 kernels_avx512 isa selfcheck; do
  "$CXX" "${flags[@]}" -c "src/cpufast/$f.cpp" -o "$out/$f.o"
done
"$CXX" "${flags[@]}" -march=armv8.2-a+dotprod -c src/cpufast/kernels_neon.cpp -o "$out/kernels_neon.o"
"$CXX" "${flags[@]}" -c tests/cpufast/cross/selfcheck_main.cpp -o "$out/main.o"
# isa.cpp throws lilac::Error (core/error.h, header-only).
"$CXX" -static "$out"/*.o -o "$out/selfcheck"
echo "cross-compiled for aarch64: $(file -b "$out/selfcheck" | cut -d, -f1-2)"
if command -v qemu-aarch64 >/dev/null; then
  qemu-aarch64 -cpu max "$out/selfcheck"
else
  echo "qemu-aarch64 not installed: compiled only (apt-get install qemu-user to run it)"
fi
