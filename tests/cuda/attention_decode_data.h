// One decode-attention layer's inputs (random q/gate, k, v, norm weights, RoPE table; a bf16 cache whose
// rows past the current position are NaN) and the CPU reference, shared by test_attention_decode.cpp and
// bench/bench_kernels_attention.cpp; free of GoogleTest.
#pragma once
#include <cstdint>
#include <vector>

#include "core/bf16.h"
#include "cpu/ops.h"
#include "decode_data.h"

namespace lilac::cuda::testing {

struct AttnShape {
  int heads, kv, hd, rot;
};

// Inputs of one attention layer and the CPU reference for a given position.
struct AttnLayer {
  AttnShape c;
  int64_t max_len, kvd;
  std::vector<float> qg, kn, vn, qw, kw, inv;
  std::vector<uint16_t> Kb, Vb;  // host cache (bf16), rows > current pos are NaN
  AttnLayer(Rng& r, AttnShape c_, int64_t max_len_) : c(c_), max_len(max_len_), kvd(int64_t(c_.kv) * c_.hd) {
    Kb.assign(size_t(max_len * kvd), 0xffff);  // NaN
    Vb.assign(Kb.size(), 0xffff);
    qg = randv(r, size_t(c.heads) * c.hd * 2, 1.f);
    kn = randv(r, size_t(kvd));
    vn = randv(r, size_t(kvd));
    qw.resize(size_t(c.hd));
    kw.resize(size_t(c.hd));
    for (auto& v : qw) v = r.uni(0.5f, 1.5f);
    for (auto& v : kw) v = r.uni(0.5f, 1.5f);
    inv = cpu::rope_inv_freq(c.rot, 1e7);
  }
  void fill_rows(Rng& r, int64_t n) {  // rows [0, n) random bf16
    for (size_t i = 0; i < size_t(n * kvd); ++i) {
      Kb[i] = f32_to_bf16(r.normal());
      Vb[i] = f32_to_bf16(r.normal());
    }
  }
  std::vector<float> q_ref(int64_t pos, std::vector<float>* gate) const {
    std::vector<float> q(size_t(c.heads) * c.hd);
    gate->resize(q.size());
    cpu::split_query_gate(qg.data(), c.heads, c.hd, q.data(), gate->data());
    for (int h = 0; h < c.heads; ++h) {
      cpu::rmsnorm(q.data() + h * c.hd, qw.data(), c.hd, 1e-6f, q.data() + h * c.hd);
      cpu::rope_with(q.data() + h * c.hd, c.rot, pos, inv.data());
    }
    return q;
  }
  std::vector<float> k_ref(int64_t pos) const {
    std::vector<float> kr(kn);
    for (int h = 0; h < c.kv; ++h) {
      cpu::rmsnorm(kn.data() + h * c.hd, kw.data(), c.hd, 1e-6f, kr.data() + h * c.hd);
      cpu::rope_with(kr.data() + h * c.hd, c.rot, pos, inv.data());
    }
    return kr;
  }
  // CPU attention over rows [0, pos] of the given (GPU-written) caches.
  std::vector<float> attn_ref(int64_t pos, const std::vector<uint16_t>& Kg, const std::vector<uint16_t>& Vg) const {
    std::vector<float> gate;
    const auto q = q_ref(pos, &gate);
    const int64_t L = pos + 1;
    std::vector<float> Kc(size_t(L * kvd)), Vc(Kc.size());
    for (size_t i = 0; i < Kc.size(); ++i) {
      Kc[i] = bf16_to_f32(Kg[i]);
      Vc[i] = bf16_to_f32(Vg[i]);
    }
    std::vector<float> ref(q.size()), scores(static_cast<size_t>(L));
    cpu::gated_attention_token(q.data(), gate.data(), Kc.data(), Vc.data(), L, c.heads, c.kv, c.hd, ref.data(),
                               scores.data());
    return ref;
  }
};

}  // namespace lilac::cuda::testing
