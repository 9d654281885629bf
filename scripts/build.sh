#!/usr/bin/env bash
# Configures and builds lilac into ./build (CUDA backend when nvcc is found).
# LILAC_CUDA_ARCHS overrides the GPU targets (default: sm_80, sm_86, sm_89, sm_90a + PTX).
set -euo pipefail
cd "$(dirname "$0")/.."
args=(-S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release)
if [ -n "${LILAC_CUDA_ARCHS:-}" ]; then args+=("-DLILAC_CUDA_ARCHS=${LILAC_CUDA_ARCHS}"); fi
if [ -n "${LILAC_CUDA:-}" ]; then args+=("-DLILAC_CUDA=${LILAC_CUDA}"); fi
cmake "${args[@]}"
cmake --build build -j "$(nproc)"
