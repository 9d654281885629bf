// Random quantized weights of one MoE block for the prefill MoE tests (test_gemm.cpp, test_moe_small.cpp) and
// their benchmark (bench/bench_kernels_gemm.cpp): the matrices (QMat: host + device copies) drawn in one fixed
// order, the device view moe_prefill takes, the CPU reference of the block, and a sorted routing on the
// device. Free of GoogleTest.
#pragma once
#include <algorithm>
#include <cstdint>
#include <optional>
#include <random>
#include <vector>

#include "cpu/ops.h"
#include "cuda/kernels/gemm/gemm.h"
#include "moe_routing_data.h"
#include "prefill_data.h"

namespace lilac::cuda::prefill_testing {

// Drawn from rng in this order (the tests' seeds reproduce the same weights): the router [E, hidden] 8-bit
// (unless with_router is false); E experts of gate, up [inter, hidden] and down [hidden, inter], 4-bit; when
// sinter > 0 the shared expert's gate, up [sinter, hidden] and down [hidden, sinter], 4-bit, and its gate
// [1, hidden], 8-bit. (std::optional: QMat can be neither copied nor moved.)
struct MoeBlockQ {
  int E, hidden, inter, sinter;
  std::optional<QMat> router, gate, up, down, sg, su, sd, seg;

  MoeBlockQ(int E_, int hidden_, int inter_, int sinter_, std::mt19937& rng, bool with_router = true)
      : E(E_), hidden(hidden_), inter(inter_), sinter(sinter_) {
    if (with_router) router.emplace(E, hidden, 8, rng);
    gate.emplace(inter, hidden, 4, rng, E);
    up.emplace(inter, hidden, 4, rng, E);
    down.emplace(hidden, inter, 4, rng, E);
    if (sinter > 0) {
      sg.emplace(sinter, hidden, 4, rng);
      su.emplace(sinter, hidden, 4, rng);
      sd.emplace(hidden, sinter, 4, rng);
      seg.emplace(1, hidden, 8, rng);
    }
  }

  // The device view (absent matrices stay null; renormalise keeps its default, true).
  MoEPrefillWeights view(int top_k) const {
    MoEPrefillWeights w;
    if (router) w.router = router->dev();
    w.gate = gate->experts(E);
    w.up = up->experts(E);
    w.down = down->experts(E);
    if (seg) {
      w.shared_gate = sg->dev();
      w.shared_up = su->dev();
      w.shared_down = sd->dev();
      w.shared_expert_gate = seg->dev();
    }
    w.top_k = top_k;
    return w;
  }

  // CPU reference, tokens t < n (x, y rows of `hidden`): y[t] += Σ_s wts[t·k + s]·expert_{ids[t·k + s]}(x[t]),
  // slot by slot, then (with a shared expert) += sigmoid(seg·x[t])·shared(x[t]). Expert ids must be in [0, E).
  void cpu_reference(const float* x, int n, const int32_t* ids, const float* wts, int k, float* y) const {
    const QExperts hg = gate->host_experts(E), hu = up->host_experts(E), hd = down->host_experts(E);
    std::vector<float> tmp(hidden), hid(2 * std::max(inter, sinter));
    for (int t = 0; t < n; ++t) {
      const float* xt = &x[size_t(t) * hidden];
      float* yt = &y[size_t(t) * hidden];
      for (int s = 0; s < k; ++s) {
        const int e = ids[size_t(t) * k + s];
        ::lilac::cpu::swiglu(hg.expert(e), hu.expert(e), hd.expert(e), xt, 1, tmp.data(), hid.data());
        for (int c = 0; c < hidden; ++c) yt[c] += wts[size_t(t) * k + s] * tmp[c];
      }
      if (!seg) continue;
      float sgl;
      ::lilac::cpu::qmatvec(seg->host, xt, &sgl);
      ::lilac::cpu::swiglu(sg->host, su->host, sd->host, xt, 1, tmp.data(), hid.data());
      for (int c = 0; c < hidden; ++c) yt[c] += sigm(sgl) * tmp[c];
    }
  }
};

// A sorted routing (moe_routing_data.h) on the device: expert_start, and per sorted row its token and weight.
struct SortedRoutingDev {
  Dev<int32_t> start, tok;
  Dev<float> w;
  explicit SortedRoutingDev(const SortedRouting& r) : start(r.start), tok(r.sorted_tok), w(r.sorted_w) {}
};

}  // namespace lilac::cuda::prefill_testing
