// Shared helpers of the decode-kernel tests: the data helpers of decode_data.h, CK (a CUDA call must
// succeed), GPU presence (NEED_GPU(): tests skip, and say so, without a GPU).
#pragma once
#include <gtest/gtest.h>
#include <cuda_runtime.h>

#include "decode_data.h"
#include "gpu_test.h"

#define CK(x) ASSERT_EQ((x), cudaSuccess) << #x
