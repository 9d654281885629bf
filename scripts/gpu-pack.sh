#!/usr/bin/env bash
# Build lilac, the CUDA tests and the CUDA kernel benchmarks here (sm_90a, static cudart) and pack what a
# GPU run needs into the git-ignored folder .gpu/ (binaries, the non-CUDA shared libraries they link, a
# copy of ../shared/oracle and the tiny fixtures). Then call the device with carry [".gpu"] and run
# `bash scripts/gpu-check.sh` there. BUILD (default build-cuda) is the build folder to use.
# The kernel benchmarks travel as one xz tarball (.gpu/bench_kernels.tar.xz, ~2 MB instead of ~17 MB:
# the carry limit is 64 MiB; .gpu is ~62 MiB with them); gpu-check.sh bench-kernels and gpu-profile.sh
# kernels unpack it there. PACK_KERNEL_BENCHES=0 leaves them out (more room for other binaries in the carry).
# A/B calls: PACK_EXTRA="path/to/lilacB ..." copies more binaries (built beforehand, e.g. main's lilac before a
# change) into .gpu/ under their own names, and PACK_XZ=1 then packs .gpu into one xz tarball, .device/g.tar.xz
# (three lilac binaries fit the 64 MiB carry only so): carry [".device"] and run `tar -xJf .device/g.tar.xz && ...`.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-cuda}
if [ ! -f "$BUILD/build.ninja" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLILAC_CUDA=ON -DLILAC_CUDA_ARCHS=90a-real
fi
# The kernel benchmarks: one per kernel family (bench/bench_kernels_<family>.cpp).
BENCHES=$(cd bench && ls bench_kernels_*.cpp | sed 's/\.cpp$//')
[ "${PACK_KERNEL_BENCHES:-1}" = 0 ] && BENCHES=""
cmake --build "$BUILD" --target lilac lilac_tests_cuda lilac_tests_cpufast bench_membw $BENCHES -j2
rm -rf .gpu
mkdir -p .gpu/lib .gpu/fixtures
cp "$BUILD/lilac" "$BUILD/tests/lilac_tests_cuda" "$BUILD/tests/lilac_tests_cpufast" "$BUILD/bench/bench_membw" .gpu/
strip .gpu/lilac .gpu/lilac_tests_cuda .gpu/lilac_tests_cpufast .gpu/bench_membw
KB=$(mktemp -d)
trap 'rm -rf "$KB"' EXIT
for b in $BENCHES; do cp "$BUILD/bench/$b" "$KB/"; done
[ -z "$BENCHES" ] || strip "$KB"/bench_kernels_*
# Shared libraries the device image may lack (the CUDA runtime is linked statically; glibc, libstdc++
# and the driver's libcuda come from the image).
ldd .gpu/lilac .gpu/lilac_tests_cuda .gpu/lilac_tests_cpufast .gpu/bench_membw $(for b in $BENCHES; do echo "$KB/$b"; done) |
  awk '/=> \//{print $3}' | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libstdc++.so*|libgcc_s.so*|ld-linux*|libpthread.so*|libdl.so*|librt.so*|libcuda.so*) ;;
    *) cp -L "$lib" .gpu/lib/ ;;
  esac
done
[ -z "$BENCHES" ] || tar -C "$KB" -cf - $BENCHES | xz -T2 -6 > .gpu/bench_kernels.tar.xz
# The CUPTI tracer (bench/cupti_trace.cpp) and the CUPTI library it loads, for gpu-profile.sh trace (~1 MB xz).
if cmake --build "$BUILD" --target lilac_cupti_trace -j2 2>/dev/null; then
  CUPTI=$(ldd "$BUILD/bench/liblilac_cupti_trace.so" | awk '/libcupti/{print $3}')
  tar -cf - -C "$(dirname "$CUPTI")" "$(basename "$CUPTI")" -C "$PWD/$BUILD/bench" liblilac_cupti_trace.so |
    xz -T2 -6 > .gpu/trace.tar.xz
fi
cp -r ../shared/oracle .gpu/oracle
cp -r ../shared/fixtures/tiny ../shared/fixtures/tiny2 ../shared/fixtures/tiny-mtp .gpu/fixtures/
mkdir -p .gpu/fixtures/qwen3-tokenizer  # the CUDA scheduler tests (CudaSchedulerSpec.*) tokenize with it
cp ../shared/fixtures/qwen3-tokenizer/tokenizer.json ../shared/fixtures/qwen3-tokenizer/tokenizer_config.json .gpu/fixtures/qwen3-tokenizer/
for x in ${PACK_EXTRA:-}; do
  cp "$x" .gpu/
  strip ".gpu/$(basename "$x")" 2>/dev/null || true
done
du -sh .gpu
if [ "${PACK_XZ:-0}" = 1 ]; then
  mkdir -p .device
  tar -cf - .gpu | xz -T2 -6 > .device/g.tar.xz
  ls -la .device/g.tar.xz
fi
