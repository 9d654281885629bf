// The fast CPU path's forward pass over a batch of rows that may belong to several sessions: a batch
// is a list of segments (one session's consecutive new tokens each; prefill = one segment of a chunk,
// decode_batch = one segment of one token per session). The matrices run once over all rows (each
// weight tile read once for the batch); attention, the Gated DeltaNet recurrence and the conv run per
// segment on that session's state. Every row's arithmetic is independent of the other rows.
//
// Session state: K/V cache f16 (IEEE half) [len][kv_heads * head_dim] per attention layer (k after norm + RoPE,
// as the CUDA backend stores it), Gated DeltaNet state fp32 [Hv][dk][dv] and conv state fp32
// [conv_dim][K-1] per linear-attention layer.
#pragma once
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "cpufast/acts.h"
#include "cpufast/packed_model.h"
#include "cpufast/pool.h"
#include "model/weights.h"

namespace lilac::cpufast {

struct LayerState {
  std::vector<uint16_t> k, v;  // attention: f16 [capacity][kv_dim]
  std::vector<float> S, conv;  // Gated DeltaNet
};

struct SeqState {
  std::vector<LayerState> layers;
  int64_t len = 0;  // tokens in the context
};

struct Segment {
  SeqState* st = nullptr;
  int64_t n = 0;         // new tokens (positions st->len .. st->len + n - 1)
  int64_t max_len = 0;   // the session's capacity (KV cache growth bound)
};

// (name, first row of the segment's positions, rows, data [rows][hidden]) as cpu::ActivationTap.
using Tap = std::function<void(const std::string& name, int64_t first_pos, int64_t n_rows, const float* data)>;

class FastModel {
 public:
  FastModel(std::shared_ptr<const ModelWeights> w, const KernelSet& kernels, int threads);

  const ModelWeights& weights() const { return *w_; }
  const ModelConfig& config() const { return w_->config; }
  const KernelSet& kernels() const { return *k_; }
  int threads() const { return pool_.size(); }
  size_t packed_bytes() const { return pm_->bytes; }

  // A fresh state (empty context).
  void init_state(SeqState& s) const;

  // Runs the model over the tokens of `segs` (rows in segment order) and advances each segment's
  // state. The final-normed hidden state of each row in `out_rows` (row indices of the batch) is
  // written to out[i * hidden] (i = index in out_rows). A tap (single-segment batches only) sees the
  // hidden states. One forward / lm_head at a time per model (a mutex).
  void forward(std::span<const Segment> segs, std::span<const int32_t> tokens, std::span<const int64_t> out_rows,
               float* out, const Tap* tap = nullptr);
  // logits[m][vocab] of m final-normed hidden rows.
  void lm_head(const float* h, int64_t m, float* logits);

  // Diagnostics (the accuracy tests, not the serving path): sees each sublayer's result for all rows of
  // a batch, as (layer, stage, rows, width, data [rows][width]). Stages of a Gated DeltaNet layer:
  // "mixer_in" (in_proj after the conv + SiLU: [conv_dim | z | b | a]), "core" (the recurrence after its
  // gated norm, out_proj's input), "mixer" (the hidden state after out_proj's residual), "router" (the
  // router logits and the shared expert gate's), "moe" (the hidden state after the MoE's residual); of an
  // attention layer: "mixer_in" (q|gate, k, v as projected), "core" (the gated attention output), then
  // "mixer", "router", "moe" as above. Set it only while no forward runs.
  using StageTap = std::function<void(int layer, const char* stage, int64_t rows, int64_t width, const float* data)>;
  void set_stage_tap(StageTap tap) { stage_tap_ = std::move(tap); }

 private:
  struct GemmJob {
    const PackedMatrix* W;
    QActs X;
    float* Y;
    int64_t ldy;
  };
  using Epilogue = std::function<void(size_t job, int64_t row0, int64_t row1)>;
  // One pool phase over all tiles of `jobs`; `epi` runs after each task on its rows.
  void gemm_phase(std::span<const GemmJob> jobs, const Epilogue* epi = nullptr);
  // Rows of `x` [n][cols] quantized into `out` (parallel over rows when there are many).
  void quantize_rows(const float* x, int64_t n, int64_t cols, ActBuffer& out);
  // y = RMSNorm(x; w) for n rows, quantized into `out`; y kept in `y` when non-null.
  void norm_quantize(const float* x, const float* w, int64_t n, ActBuffer& out, float* y);

  void attention(int layer, std::span<const Segment> segs, int64_t n, float* x);
  void deltanet(int layer, std::span<const Segment> segs, int64_t n, float* x);
  void moe(int layer, int64_t n, float* x);
  void stage(int layer, const char* name, int64_t rows, int64_t width, const float* data) const {
    if (stage_tap_) stage_tap_(layer, name, rows, width, data);
  }

  std::shared_ptr<const ModelWeights> w_;
  const KernelSet* k_;
  std::unique_ptr<PackedModel> pm_;
  WorkPool pool_;
  std::vector<float> inv_freq_;
  int levels_ = 2;  // activation levels (acts.h): 2 = int8 + int8 residual
  StageTap stage_tap_;
  std::mutex mu_;
  // Scratch reused across calls (guarded by mu_).
  struct Scratch {
    ActBuffer act, act2, act3, hact;
    std::vector<float> x, proj, mix, out, g, u, dout;
  } s_;
};

}  // namespace lilac::cpufast
