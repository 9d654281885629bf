// Batched prefill of a chunk of n tokens through the prefill kernels (kernels/gemm, attention, gdn): the glue
// between the backend's device state and those kernels (embedding rows, RMSNorm → bf16, q/k norm +
// RoPE + KV append for n rows, scratch buffers).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "cuda/kernels/attention/attention.h"
#include "cuda/kernels/gdn/gdn.h"
#include "cuda/kernels/gemm/gemm.h"
#include "cuda/kernels/qmatrix.cuh"
#include "model/config.h"

namespace lilac::cuda {

struct PrefillCtx {
  const ModelConfig* cfg = nullptr;
  cudaStream_t stream = nullptr;
  int n = 0;
  int64_t start_pos = 0;
  const int32_t* tokens = nullptr;  // device [n]
  QMatrixDev embed;
  const float* inv_freq = nullptr;
  float* h_last = nullptr;          // receives the last row of the residual stream
};

struct PrefillPart {
  QMatrixDev m;
  int64_t offset = 0;
};

struct PrefillLayer {
  bool attn = false;
  const float *input_norm = nullptr, *post_norm = nullptr;
  std::vector<PrefillPart> in_parts;  // fused input projection(s): attn [q|k|v], GDN [qkv|z|b|a]
  int64_t in_rows = 0;
  QMatrixDev out_proj;  // o_proj / out_proj
  const float *q_norm = nullptr, *k_norm = nullptr;
  __nv_bfloat16 *k_cache = nullptr, *v_cache = nullptr;
  const float *conv_w = nullptr, *A_log = nullptr, *dt_bias = nullptr, *gdn_norm = nullptr;
  float *gdn_state = nullptr, *conv_state = nullptr;
  const MoEPrefillWeights* moe = nullptr;
};

struct PrefillWorkspace {
  int cap = 0;
  float* H = nullptr;
  __nv_bfloat16* Xb = nullptr;
  float* P = nullptr;
  float* conv_out = nullptr;
  __nv_bfloat16* Qb = nullptr;
  __nv_bfloat16* Ob = nullptr;
  float* o_scratch = nullptr;
  void* moe_ws = nullptr;
  size_t moe_ws_bytes = 0;
  std::vector<void*> owned;
  ~PrefillWorkspace();
};

// False when LILAC_CUDA_TOKEN_PREFILL=1 (forces the token-by-token decode path for prefill).
bool prefill_glue_available();
void prefill_begin(PrefillWorkspace& ws, const PrefillCtx& ctx, int max_n, int64_t max_in_rows,
                   const MoEPrefillWeights& any_moe);
void prefill_layer(PrefillWorkspace& ws, const PrefillCtx& ctx, const PrefillLayer& L);
void prefill_finish(PrefillWorkspace& ws, const PrefillCtx& ctx);

}  // namespace lilac::cuda
