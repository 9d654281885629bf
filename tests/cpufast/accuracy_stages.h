// The fast CPU path's error per sublayer (a diagnostic shared by the accuracy tests): the fast model runs
// a prompt once with its stage tap (FastModel::set_stage_tap) and every stage's result is compared with
// the fp32 reference ops (src/cpu/ops.h) applied to the fast path's own input of that stage, so each
// figure is that stage's local error, not the error it inherits.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "cpufast/kernels.h"
#include "model/weights.h"

namespace lilac::cpufast::accuracy {

struct StageError {
  int layer = 0;
  std::string stage;   // mixer_in, core, mixer, router, moe (FastModel::StageTap)
  double rel = 0;      // ‖fast − ref‖ / ‖ref‖ of the stage's own output (for mixer / moe: the residual's
                       // increment, i.e. the sublayer's output, not the hidden state it is added to)
  double max_abs = 0;  // max |fast − ref| over the stage's values
};

// One prefill of `tokens` from an empty context through FastModel with kernel set `k`, one thread.
// chained = false: each stage's local error (the reference op fed the fast path's input of that stage;
// mixer / moe: the sublayer's increment); true: the error the fast path has accumulated there (the
// reference fed its own results; mixer / moe: the whole hidden state).
std::vector<StageError> stage_errors(const ModelWeights& w, const KernelSet& k, const std::vector<int32_t>& tokens,
                                     bool chained = false);

// The routing's near ties: per layer, over the tokens, the smallest gap between the reference's k-th and
// (k+1)-th router logits (its own chain of stages), the fast path's error of that gap at that token, and
// how many tokens the fast path routes to another set of experts.
struct RouterTie {
  int layer = 0;
  int64_t token = 0;        // position of the smallest gap
  double gap = 0;           // reference: logit_k − logit_{k+1}
  double fast_gap = 0;      // the fast path's, same token, same two experts
  int64_t flips = 0;        // tokens whose top-k set differs
};
// One list per kernel set of `sets`.
std::vector<std::vector<RouterTie>> router_ties(const ModelWeights& w, const std::vector<const KernelSet*>& sets,
                                                const std::vector<int32_t>& tokens);

// A table of the errors, one line per stage.
std::string format_stage_errors(const std::vector<StageError>& e);

}  // namespace lilac::cpufast::accuracy
