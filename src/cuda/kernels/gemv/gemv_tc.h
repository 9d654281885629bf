// Tensor-core decode GEMVs (gemv_tc.cu, moe_tc.cu): the default implementation of gemv / moe_gate_up / moe_down
// (GemvImpl::Tensor) for 4- and 8-bit matrices with 64-column groups. Same arguments and results as
// the fp32 kernels (relative difference ~1e-6); callers go through gemv.h.
#pragma once
#include "cuda/kernels/gemv/gemv.h"

namespace lilac::cuda {

// Whether the tensor-core kernel takes these arguments (4/8-bit, 64-groups, 16-byte aligned inputs,
// conv taps <= 4, staged input within the shared memory budget); else callers use the fp32 kernel.
bool gemv_tc_supported(const GemvArgs& a);
void gemv_tc(const GemvArgs& a, cudaStream_t stream);
bool moe_tc_supported(const MoEDecodeWeights& w, const float* x, const float* norm_w, const float* act);
void moe_gate_up_tc(const MoEDecodeWeights& w, const float* logits, const float* x, const float* norm_w, float eps,
                    int32_t* sel_ids, float* sel_w, float* act, cudaStream_t stream);
void moe_down_tc(const MoEDecodeWeights& w, const int32_t* sel_ids, const float* sel_w, const float* act, float* y,
                 cudaStream_t stream);
// The MoE kernels' phase-trace pointer (gemv.h: gemv_tc_trace sets it with the dense kernel's).
void moe_tc_trace(unsigned long long* buf);
// Measurement (bench): with LILAC_MOE_TRACE=<file> (or LILAC_GEMV_TRACE=<file>) set, the MoE (dense) tensor-core
// kernels' phase marks go to a device buffer from now on, and at exit the last launch's marks of each block are
// written to <file> as "block,mark,ns" lines. Call before any graph is captured.
void tc_trace_from_env();

}  // namespace lilac::cuda
