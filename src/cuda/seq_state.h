// One sequence's state on the device: everything a decode or prefill step reads and writes that belongs
// to that sequence and outlives the step. A SeqState is a set of views (pointers) into device memory
// that something else owns: the sequence pool (seq_pool.h) keeps the sequences of one capacity in
// slot-strided arrays (kernels/rows/rows_state.h: layer j of slot s at base_j + s * slot_stride) and
// describes slot s by a SeqState whose pointers point there (SeqPool::view); the rows step
// (rows_step.h) steps several slots together.
// The per-session scratch of the steps (activations, workspaces, graphs) is separate (decode_step.h:
// DecodeScratch, prefill_step.h: PrefillWorkspace).
//
// Layouts (per sequence):
//   KV cache, per attention layer i: k_cache[i], v_cache[i] bf16 [max_len][kv_heads][head_dim] (k after
//     q/k-norm + RoPE; row p holds position p)
//   Gated DeltaNet state of GDN layer j: fp32 [Hv][dk][dv] at gdn(j) = gdn_state + j * gdn_layer_stride
//   conv state of GDN layer j: fp32 [conv_dim][K-1] at conv(j), the previous K-1 inputs per channel,
//     oldest first
//   logits fp32 [vocab] (the current logits: what sample() chooses from)
//   token, pos: int32 slots the decode graph reads (the pending token, its position)
//   sampling: params, penalty counts int32 [vocab], prompt mask u8 [vocab], the last result, the
//     allowed-token bitmask u32 [ceil(vocab / 32)] of constrained decoding
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "cuda/device_model.h"
#include "cuda/kernels/sampling/sampling.h"
#include "engine/backend.h"

namespace lilac::cuda {

// Sizes of one sequence's state for a model.
struct SeqShape {
  int n_attn = 0, n_gdn = 0;
  int64_t kv_row = 0;      // elements of one KV cache row (kv_heads * head_dim)
  int64_t gdn_elems = 0;   // elements of one GDN layer's state (Hv * dk * dv)
  int64_t conv_elems = 0;  // elements of one GDN layer's conv state (conv_dim * (K-1))
  int64_t vocab = 0;
  static SeqShape of(const DevModel& m);
  // Bytes of all GDN states / all conv states (at least 4: never a zero-size buffer).
  size_t gdn_bytes() const { return size_t(std::max<int64_t>(1, n_gdn * gdn_elems)) * 4; }
  size_t conv_bytes() const { return size_t(std::max<int64_t>(1, n_gdn * conv_elems)) * 4; }
};

struct SeqState {
  SeqShape shape;
  int64_t max_len = 0;
  int64_t len = 0;             // tokens in the context (host copy; *pos == len between steps)
  bool want_logprobs = false;  // of the current generation
  std::vector<__nv_bfloat16*> k_cache, v_cache;  // per attention layer
  float* gdn_state = nullptr;
  float* conv_state = nullptr;
  int64_t gdn_layer_stride = 0, conv_layer_stride = 0;  // elements between GDN layers j and j + 1
  float* logits = nullptr;
  int32_t* token = nullptr;
  int32_t* pos = nullptr;
  SampleParamsDev* params = nullptr;
  int32_t* counts = nullptr;
  uint8_t* prompt_mask = nullptr;
  SampleResult* result = nullptr;
  uint32_t* allowed = nullptr;  // allowed-token bitmask [rows::allowed_words(vocab)] (set_token_mask)
  // The dense logit-bias row [vocab] of a generation with SamplingParams::logit_bias (SampleParamsDev::bias):
  // the session's memory, not the pool's (a slot's params keep pointing at it when the pool moves); null:
  // logit_bias is refused.
  float* bias = nullptr;

  float* gdn(int j) const { return gdn_state + j * gdn_layer_stride; }
  float* conv(int j) const { return conv_state + j * conv_layer_stride; }
  // Whether all GDN (conv) states are one block (one copy / memset covers them).
  bool gdn_contiguous() const { return gdn_layer_stride == shape.gdn_elems && conv_layer_stride == shape.conv_elems; }

  // Host-side operations, asynchronous on `s` unless they say otherwise.
  // Empty context: zero recurrent and conv state, len = *pos = 0. Synchronises.
  void reset(cudaStream_t s);
  // *pos = len. Synchronises.
  void upload_pos(cudaStream_t s);
  // The sampler for a new generation (seed, penalties from zero, the prompt mask from `context`, the logit
  // bias row). Synchronises; throws lilac::InputError for a logit bias without a bias row or with a token
  // outside the vocabulary.
  void begin_generation(const SamplingParams& p, std::span<const int32_t> context, cudaStream_t s);
  // Copies of the state at the current length (`owner` identifies the model, checked by restore).
  // Synchronise.
  std::shared_ptr<const SessionSnapshot> snapshot(const void* owner, cudaStream_t s) const;
  void restore(const SessionSnapshot& snap, const void* owner, cudaStream_t s);
};

}  // namespace lilac::cuda
