// A random MoE routing already sorted by expert, as moe_prefill's histogram / scan / scatter leave it
// (expert_start, and per sorted row its token, expert and routing weight): for the small-M expert GEMM
// tests (test_moe_small.cpp) and their benchmark (bench/bench_kernels_gemm.cpp). Free of GoogleTest.
#pragma once
#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

namespace lilac::cuda::prefill_testing {

struct SortedRouting {
  int n = 0, E = 0, k = 0;
  std::vector<int32_t> start;       // [E + 1]
  std::vector<int32_t> sorted_tok;  // [n·k]
  std::vector<int32_t> sorted_exp;  // [n·k]
  std::vector<float> sorted_w;      // [n·k], in [0.1, 1.1)
  // Bytes the small-M kernels read for one matrix of `bytes_per_expert`: each hit expert once per
  // `chunk` tokens.
  double chunked_bytes(double bytes_per_expert, int chunk) const {
    double b = 0;
    for (int e = 0; e < E; ++e) b += double((start[e + 1] - start[e] + chunk - 1) / chunk) * bytes_per_expert;
    return b;
  }
};

// n tokens, each to k distinct experts of E; a fraction `hot` of the picks goes to the first 4 experts
// (skew: experts with several 16-token chunks), the rest uniform.
inline SortedRouting make_sorted_routing(int n, int E, int k, float hot, std::mt19937& rng) {
  SortedRouting r;
  r.n = n;
  r.E = E;
  r.k = k;
  std::vector<int32_t> ids(size_t(n) * k);
  std::uniform_int_distribution<int> any(0, E - 1), hot_e(0, std::min(E, 4) - 1);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  for (int t = 0; t < n; ++t)
    for (int s = 0; s < k; ++s) {
      int32_t* row = &ids[size_t(t) * k];
      int e;
      do e = u(rng) < hot ? hot_e(rng) : any(rng);
      while (std::find(row, row + s, e) != row + s);
      row[s] = e;
    }
  r.start.assign(E + 1, 0);
  for (int32_t e : ids) ++r.start[e + 1];
  for (int e = 0; e < E; ++e) r.start[e + 1] += r.start[e];
  std::vector<int32_t> fill(r.start.begin(), r.start.end() - 1);
  r.sorted_tok.resize(ids.size());
  r.sorted_exp.resize(ids.size());
  r.sorted_w.resize(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int pos = fill[ids[i]]++;
    r.sorted_tok[pos] = int32_t(i / k);
    r.sorted_exp[pos] = ids[i];
    r.sorted_w[pos] = 0.1f + u(rng);
  }
  return r;
}

}  // namespace lilac::cuda::prefill_testing
