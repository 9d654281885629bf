// Helpers of the multi-row kernel tests (test_rows_*.cpp): bitwise comparison of rows, slot layouts with
// padding rows, and the staged dense GEMV over M rows.
#pragma once
#include <gtest/gtest.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/kernels/rows/gemv_rows_wg.h"
#include "cuda/kernels/rows/rows_mm.h"
#include "model/weights.h"
#include "decode_test_util.h"

namespace lilac::cuda::testing {

// Index of the first element whose bits differ, -1 if none.
inline int64_t first_bit_diff(const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (std::memcmp(a + i, b + i, sizeof(float)) != 0) return i;
  return -1;
}
inline std::string bit_diff_msg(const float* a, const float* b, int64_t n) {
  const int64_t i = first_bit_diff(a, b, n);
  if (i < 0) return "equal";
  int64_t cnt = 0;
  for (int64_t j = 0; j < n; ++j) cnt += std::memcmp(a + j, b + j, sizeof(float)) != 0;
  return "first difference at " + std::to_string(i) + ": " + std::to_string(a[i]) + " vs " + std::to_string(b[i]) +
         " (" + std::to_string(cnt) + " of " + std::to_string(n) + " differ)";
}

// M rows: row `keep` active, about a fifth of the others padding (slot -1), the rest slots in some order.
inline std::vector<int32_t> slots_with_padding(Rng& r, int M, int keep) {
  std::vector<int32_t> s(static_cast<size_t>(M));
  for (int i = 0; i < M; ++i) s[size_t(i)] = (i != keep && r.uni(0.f, 1.f) < 0.2f) ? -1 : (i * 7 + 3) % 101;
  return s;
}

constexpr float kSentinel = 12345.f;  // what padding rows' outputs hold before and must hold after

// stage() + gemv_rows() over M rows of x [M][K] (z [M][K] for GatedHeadNorm); y [M][W.rows] starts as y0.
struct RowsGemvRun {
  const DevQ& W;
  lilac::cuda::Prologue pro = lilac::cuda::Prologue::None;
  const float* norm_w = nullptr;  // device
  int head_dim = 0;
  bool accumulate = false;
  lilac::cuda::rows::RowsGemvKernel kernel = lilac::cuda::rows::RowsGemvKernel::Auto;

  std::vector<float> run(int M, const std::vector<float>& x, const std::vector<float>& z, const std::vector<float>& y0,
                         const std::vector<int32_t>& slots, cudaStream_t s = nullptr) const {
    namespace lr = lilac::cuda::rows;
    const int64_t K = W.d.cols, N = W.d.rows;
    Dev<float> dx(x), dz(z.empty() ? std::vector<float>(1) : z), dy(y0);
    Dev<int32_t> dslot(slots.empty() ? std::vector<int32_t>(1) : slots);
    Dev<char> frag(lr::frag_row_bytes(K) * size_t(M)), fragw(lr::frag_row_bytes(K) * size_t(M));
    Dev<float2> meta(lr::meta_row_count(K) * size_t(M));
    lr::StageArgs st;
    st.x = dx.p;
    st.K = K;
    st.M = M;
    st.row_slot = slots.empty() ? nullptr : dslot.p;
    st.pro = pro;
    st.norm_w = norm_w;
    st.z = dz.p;
    st.head_dim = head_dim;
    st.eps = 1e-6f;
    (W.d.bits == 4 ? st.frag4g : st.frag8) = frag.p;
    const bool wg = W.d.bits == 4 && (kernel == lr::RowsGemvKernel::Wgmma || lr::gemv_rows_wg_wanted(M));
    if (wg) st.frag4w = fragw.p;
    st.meta = meta.p;
    lr::stage(st, s);
    lr::GemvRowsArgs g;
    g.W = W.d;
    g.frag = frag.p;
    g.frag_wg = wg ? fragw.p : nullptr;
    g.meta = meta.p;
    g.M = M;
    g.row_slot = st.row_slot;
    g.y = dy.p;
    g.accumulate = accumulate;
    const size_t pf = lr::gemv_rows_partial_floats(W.d, M);
    Dev<float> partials(pf);
    partials.poison();  // NaN: a chain the slice kernel did not write would reach y
    g.partials = partials.p;
    g.partial_floats = pf;
    g.kernel = kernel;
    lr::gemv_rows(g, s);
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    (void)N;
    return dy.get();
  }
};

}  // namespace lilac::cuda::testing
