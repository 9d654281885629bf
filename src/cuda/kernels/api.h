// Conventions shared by the kernel families' launch APIs (gemv/, gemm/, attention/, gdn/, sampling/;
// each family declares its API in its own header: gemv/gemv.h, gemm/gemm.h, ...).
//  * Every function is asynchronous on `stream`, allocates nothing (except where a header says so: a
//    per-stream scratch buffer when the caller passes none), and is CUDA-graph capturable.
//  * Decode kernels (one token) read positions / tokens from device memory where a captured graph
//    must stay reusable, and are launched with programmatic dependent launch (launch.cuh: the PDL
//    rules). Their activations are fp32 unless stated.
//  * Prefill kernels (a chunk of n tokens) take row-major activations, one row per token, with row
//    strides in ELEMENTS (not bytes) so that the caller can point into a wider buffer; they launch a
//    fixed number of kernels (no per-expert or per-token launches).
//  * Quantized matrices are in the checkpoint's MLX layout (qmatrix.cuh), bits 4 or 8, cols % 64 == 0,
//    group_size a multiple of 32 (the prefill GEMMs: 64).
//  * Bad arguments (unsupported bits / group size, misaligned strides) throw lilac::Error.
//  * Hopper (sm_90a) may take faster paths; LILAC_CUDA_PORTABLE=1 in the environment forces the
//    portable (sm_80+) paths everywhere so the H200 tests them too.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda/kernels/qmatrix.cuh"
