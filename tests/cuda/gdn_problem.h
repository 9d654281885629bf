// One Gated DeltaNet prefill problem (random inputs, the CPU token-by-token reference, device buffers and
// the GdnPrefillArgs), shared by the GDN prefill tests and bench/bench_kernels_gdn.cpp; free of GoogleTest.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <thread>
#include <vector>

#include "cpu/ops.h"
#include "cuda/kernels/gdn/gdn.h"
#include "prefill_data.h"

namespace lilac::cuda::prefill_testing {

// One problem: host inputs, the CPU reference, device buffers and the args.
struct Problem {
  int n, Hk, Hv, dk, dv;
  int64_t ld_qkv, ld_ab;
  std::vector<float> qkv, ab, z, A_log, dt_bias, norm_w, S0;
  std::vector<float> S_ref, o_ref, out_ref;  // final state, pre-norm output, normed output

  Problem(int n_, int Hk_, int Hv_, int dk_, int dv_, std::mt19937& rng)
      : n(n_), Hk(Hk_), Hv(Hv_), dk(dk_), dv(dv_) {
    ld_qkv = 2 * int64_t(Hk) * dk + int64_t(Hv) * dv + 4;
    ld_ab = 2 * int64_t(Hv) + 2;
    qkv = rand_f(size_t(n) * ld_qkv, rng, -1.f, 1.f);
    ab = rand_f(size_t(n) * ld_ab, rng, -3.f, 3.f);  // [b | a | pad] per row
    z = rand_f(size_t(n) * Hv * dv, rng, -2.f, 2.f);
    A_log = rand_f(Hv, rng, -1.5f, 0.5f);
    dt_bias = rand_f(Hv, rng, -1.f, 1.f);
    norm_w = rand_f(dv, rng, 0.5f, 1.5f);
    S0 = rand_f(size_t(Hv) * dk * dv, rng, -0.1f, 0.1f);
  }

  // Token-by-token CPU reference, value heads in parallel.
  void reference() {
    S_ref = S0;
    o_ref.assign(size_t(n) * Hv * dv, 0.f);
    out_ref.assign(size_t(n) * Hv * dv, 0.f);
    // per-token normalised q, k and gates first (shared by the heads)
    std::vector<float> qn(size_t(n) * Hk * dk), kn(size_t(n) * Hk * dk), g(size_t(n) * Hv), beta(size_t(n) * Hv);
    for (int t = 0; t < n; ++t) {
      const float* row = &qkv[size_t(t) * ld_qkv];
      std::copy(row, row + size_t(Hk) * dk, &qn[size_t(t) * Hk * dk]);
      std::copy(row + size_t(Hk) * dk, row + 2 * size_t(Hk) * dk, &kn[size_t(t) * Hk * dk]);
      for (int hk = 0; hk < Hk; ++hk) {
        float* q = &qn[(size_t(t) * Hk + hk) * dk];
        cpu::l2norm(q, dk);
        cpu::l2norm(&kn[(size_t(t) * Hk + hk) * dk], dk);
        for (int i = 0; i < dk; ++i) q[i] /= std::sqrt(float(dk));
      }
      const float* abr = &ab[size_t(t) * ld_ab];
      cpu::gdn_gates(abr, abr + Hv, A_log.data(), dt_bias.data(), Hv, &beta[size_t(t) * Hv], &g[size_t(t) * Hv]);
    }
    auto head = [&](int h) {
      const int hk = h / (Hv / Hk);
      for (int t = 0; t < n; ++t) {
        float* o = &o_ref[(size_t(t) * Hv + h) * dv];
        cpu::gdn_recurrent_step(&S_ref[size_t(h) * dk * dv], &qn[(size_t(t) * Hk + hk) * dk],
                                &kn[(size_t(t) * Hk + hk) * dk], &qkv[size_t(t) * ld_qkv + 2 * size_t(Hk) * dk + size_t(h) * dv],
                                g[size_t(t) * Hv + h], beta[size_t(t) * Hv + h], dk, dv, o);
        cpu::gated_rmsnorm(o, &z[(size_t(t) * Hv + h) * dv], norm_w.data(), dv, 1e-6f,
                           &out_ref[(size_t(t) * Hv + h) * dv]);
      }
    };
    std::vector<std::thread> th;
    const int nth = std::max(1, std::min<int>(Hv, int(std::thread::hardware_concurrency())));
    for (int w = 0; w < nth; ++w)
      th.emplace_back([&, w] {
        for (int h = w; h < Hv; h += nth) head(h);
      });
    for (auto& x : th) x.join();
  }
};

struct DevProblem {
  Dev<float> qkv, ab, z, A_log, dt_bias, norm_w, S, osc;
  Dev<uint16_t> out;
  GdnPrefillArgs a;
  explicit DevProblem(const Problem& p)
      : qkv(p.qkv), ab(p.ab), z(p.z), A_log(p.A_log), dt_bias(p.dt_bias), norm_w(p.norm_w), S(p.S0),
        osc(size_t(p.n) * p.Hv * p.dv), out(size_t(p.n) * p.Hv * p.dv) {
    osc.poison();
    out.poison();
    a.qkv = qkv.p;
    a.ld_qkv = p.ld_qkv;
    a.b = ab.p;
    a.ld_b = p.ld_ab;
    a.a = ab.p + p.Hv;
    a.ld_a = p.ld_ab;
    a.z = z.p;
    a.ld_z = int64_t(p.Hv) * p.dv;
    a.A_log = A_log.p;
    a.dt_bias = dt_bias.p;
    a.norm_w = norm_w.p;
    a.eps = 1e-6f;
    a.state = S.p;
    a.o_scratch = osc.p;
    a.out = reinterpret_cast<__nv_bfloat16*>(out.p);
    a.ld_out = int64_t(p.Hv) * p.dv;
    a.n = p.n;
    a.Hk = p.Hk;
    a.Hv = p.Hv;
    a.dk = p.dk;
    a.dv = p.dv;
  }
};

inline const char* math_name(GdnChunkedMath m) { return m == GdnChunkedMath::TF32 ? "tf32" : "3xtf32"; }

}  // namespace lilac::cuda::prefill_testing
