#!/usr/bin/env bash
# Installs dependencies, builds lilac and runs every test (unit, golden, CLI, HTTP API with the openai client).
# GPU tests skip (and say so) on a machine without a GPU. CUDA code is built for sm_90a only here to keep
# the build short; set LILAC_CUDA_ARCHS to override.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
LILAC_CUDA_ARCHS="${LILAC_CUDA_ARCHS:-90a-real}" bash scripts/build.sh
ctest --test-dir build --output-on-failure -j "$(nproc)" --timeout 900
