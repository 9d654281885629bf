#!/usr/bin/env bash
# Build lilac + the CUDA tests here (sm_90a, static cudart) and pack what a GPU run needs into the
# git-ignored folder .gpu/ (binaries, the non-CUDA shared libraries they link, a copy of
# ../shared/oracle and the tiny fixtures). Then call the device with carry [".gpu"] and run
# `bash scripts/gpu-check.sh` there.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-cuda}
if [ ! -f "$BUILD/build.ninja" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLILAC_CUDA=ON -DLILAC_CUDA_ARCHS=90a-real
fi
cmake --build "$BUILD" --target lilac lilac_tests_cuda lilac_tests_cpufast bench_membw -j2
rm -rf .gpu
mkdir -p .gpu/lib .gpu/fixtures
cp "$BUILD/lilac" "$BUILD/tests/lilac_tests_cuda" "$BUILD/tests/lilac_tests_cpufast" "$BUILD/bench/bench_membw" .gpu/
strip .gpu/lilac .gpu/lilac_tests_cuda .gpu/lilac_tests_cpufast .gpu/bench_membw
# Shared libraries the device image may lack (the CUDA runtime is linked statically; glibc, libstdc++
# and the driver's libcuda come from the image).
ldd .gpu/lilac .gpu/lilac_tests_cuda .gpu/lilac_tests_cpufast .gpu/bench_membw | awk '/=> \//{print $3}' | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libstdc++.so*|libgcc_s.so*|ld-linux*|libpthread.so*|libdl.so*|librt.so*|libcuda.so*) ;;
    *) cp -L "$lib" .gpu/lib/ ;;
  esac
done
cp -r ../shared/oracle .gpu/oracle
cp -r ../shared/fixtures/tiny ../shared/fixtures/tiny2 .gpu/fixtures/
du -sh .gpu
