// The small-M expert GEMMs of the MoE prefill (gemm.h: moe_small_gate_up / moe_small_down, moe_prefill's
// small path) against an exact reference and against the grouped GEMM path.
//
// Tolerances, from the arithmetic: the small path multiplies exact integers (q − zc) with the bf16 inputs
// (exact products), sums each 64-column group in fp32 and applies s·dot + (zc·s + b)·Σx in fp32, so its
// fp32 outputs differ from an exact (double) reference only by fp32 summation: ‖Δ‖/‖ref‖ ≤ 1e-5 (expected
// ~1e-6; the grouped GEMM's bf16-rounded weights give ~1e-3, so this also shows the weights are not
// rounded). The gate/up output h = silu(g)·u is stored as bf16: per element |Δ| ≤ 2^-8·|h| (half an ulp
// of rounding plus __expf, with room) + 1e-5·max|h| (the fp32 sums where h is near 0). The MoE block on
// either path against the CPU and against each other: ‖Δ‖/‖ref‖ ≤ 1e-2 (the grouped path rounds weights
// and h to bf16, as test_gemm.cpp states).
#include <gtest/gtest.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/error.h"
#include "cuda/kernels/gemm/gemm.h"
#include "moe_weights_fixture.h"
#include "prefill_test_util.h"

using namespace lilac;
namespace lc = lilac::cuda;
using namespace lilac::cuda::prefill_testing;

namespace {

// Test routings: 30 % of the picks among the first 4 experts, so that some experts get several 16-token
// chunks.
SortedRouting make_routing(int n, int E, int k, std::mt19937& rng) { return make_sorted_routing(n, E, k, 0.3f, rng); }

// Row `row` of W (exact dequantization s·q + b) dotted with x, in double.
double ref_dot(const QMatrix& W, int64_t row, const float* x) {
  const int64_t gpr = W.cols / 64, wpr = W.cols * W.bits / 32;
  const int per_word = 32 / W.bits;
  double acc = 0;
  for (int64_t col = 0; col < W.cols; ++col) {
    const uint32_t word = W.qweight[row * wpr + col / per_word];
    const uint32_t q = (word >> (W.bits * (col % per_word))) & ((1u << W.bits) - 1);
    const double s = bf16_to_f32(W.scales[row * gpr + col / 64]), b = bf16_to_f32(W.biases[row * gpr + col / 64]);
    acc += (s * q + b) * x[col];
  }
  return acc;
}

// Up to 64 sorted rows to check: spread over all rows, with the first and the last.
std::vector<int> sample_rows(int P) {
  std::vector<int> v;
  const int step = std::max(1, P / 63);
  for (int i = 0; i < P; i += step) v.push_back(i);
  if (v.back() != P - 1) v.push_back(P - 1);
  return v;
}

void check_gate_up(int n, int E, int k, int hidden, int inter, int bits) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " n=" + std::to_string(n) + " hidden=" + std::to_string(hidden) +
               " inter=" + std::to_string(inter) + " bits=" + std::to_string(bits));
  std::mt19937 rng(seed);
  SortedRouting r = make_routing(n, E, k, rng);
  const int P = n * k;
  QMat gate(inter, hidden, bits, rng, E), up(inter, hidden, bits, rng, E);
  const int64_t ldx = hidden + 8, ldh = inter + 3;
  std::vector<float> xf;
  auto xb = rand_bf16(size_t(n) * ldx, rng, -1.f, 1.f, &xf);
  Dev<uint16_t> dx(xb), dh(size_t(P) * ldh);
  SortedRoutingDev dr(r);
  dh.poison();
  lc::moe_small_gate_up(gate.experts(E), up.experts(E), reinterpret_cast<const __nv_bfloat16*>(dx.p), ldx, dr.tok.p,
                        dr.start.p, P, reinterpret_cast<__nv_bfloat16*>(dh.p), ldh, nullptr);
  CK(cudaDeviceSynchronize());
  auto h = bf16_to_f(dh.get());
  for (int i = 0; i < P; ++i)
    for (int c = 0; c < inter; ++c) ASSERT_TRUE(std::isfinite(h[size_t(i) * ldh + c])) << "row " << i << " col " << c;
  QExperts hg = gate.host_experts(E), hu = up.host_experts(E);
  std::vector<double> ref;
  std::vector<float> got;
  for (int i : sample_rows(P)) {
    const int e = r.sorted_exp[i];
    const float* x = &xf[size_t(r.sorted_tok[i]) * ldx];
    for (int c = 0; c < inter; ++c) {
      const double g = ref_dot(hg.expert(e), c, x), u = ref_dot(hu.expert(e), c, x);
      ref.push_back(g / (1.0 + std::exp(-g)) * u);
      got.push_back(h[size_t(i) * ldh + c]);
    }
  }
  double mx = 0;
  for (double v : ref) mx = std::max(mx, std::abs(v));
  int bad = 0;
  for (size_t j = 0; j < ref.size(); ++j)
    if (std::abs(got[j] - ref[j]) > std::ldexp(std::abs(ref[j]), -8) + 1e-5 * mx && ++bad <= 5)
      ADD_FAILURE() << "element " << j << ": got " << got[j] << ", exact " << ref[j];
  EXPECT_EQ(bad, 0);
}

void check_down(int n, int E, int k, int hidden, int inter, int bits) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " n=" + std::to_string(n) + " hidden=" + std::to_string(hidden) +
               " inter=" + std::to_string(inter) + " bits=" + std::to_string(bits));
  std::mt19937 rng(seed);
  SortedRouting r = make_routing(n, E, k, rng);
  const int P = n * k;
  QMat down(hidden, inter, bits, rng, E);
  const int64_t ldh = inter + 16, ldy = hidden + 1;
  std::vector<float> hf;
  auto hb = rand_bf16(size_t(P) * ldh, rng, -0.5f, 0.5f, &hf);
  Dev<uint16_t> dh(hb);
  Dev<float> dy(size_t(P) * ldy);
  SortedRoutingDev dr(r);
  dy.poison();
  lc::moe_small_down(down.experts(E), reinterpret_cast<const __nv_bfloat16*>(dh.p), ldh, dr.start.p, P, dr.w.p, dy.p,
                     ldy, nullptr);
  CK(cudaDeviceSynchronize());
  auto y = dy.get();
  for (int i = 0; i < P; ++i)
    for (int c = 0; c < hidden; ++c) ASSERT_TRUE(std::isfinite(y[size_t(i) * ldy + c])) << "row " << i << " col " << c;
  QExperts hd = down.host_experts(E);
  std::vector<float> ref, got;
  for (int i : sample_rows(P)) {
    const int e = r.sorted_exp[i];
    for (int c = 0; c < hidden; ++c) {
      ref.push_back(float(r.sorted_w[i] * ref_dot(hd.expert(e), c, &hf[size_t(i) * ldh])));
      got.push_back(y[size_t(i) * ldy + c]);
    }
  }
  EXPECT_LT(rel_err(got, ref, "moe_small_down"), 1e-5);
}

// Both kernels of the small path: the ring (4-bit, even group counts; Ring falls back to the staged kernel for the
// rest) and the staged one.
const lc::MoeSmallKernel kKernels[2] = {lc::MoeSmallKernel::Ring, lc::MoeSmallKernel::Staged};
const char* kernel_name(lc::MoeSmallKernel k) { return k == lc::MoeSmallKernel::Ring ? "ring" : "staged"; }

TEST(MoeSmall, GateUpMatchesExact) {
  NEED_GPU();
  for (lc::MoeSmallKernel kern : kKernels) {
    SCOPED_TRACE(kernel_name(kern));
    lc::set_moe_small_kernel(kern);
    for (int bits : {4, 8}) {
      for (int n : {1, 7, 16, 64, 512}) check_gate_up(n, 256, 8, 2048, 512, bits);  // the model's widths
      check_gate_up(37, 5, 2, 320, 72, bits);  // 5 groups, rows not a multiple of 16, few experts
      check_gate_up(37, 5, 2, 256, 72, bits);  // 4 groups (the ring's), rows not a multiple of 16
    }
  }
  lc::set_moe_small_kernel(lc::MoeSmallKernel::Auto);
}

TEST(MoeSmall, DownMatchesExact) {
  NEED_GPU();
  for (lc::MoeSmallKernel kern : kKernels) {
    SCOPED_TRACE(kernel_name(kern));
    lc::set_moe_small_kernel(kern);
    for (int bits : {4, 8}) {
      for (int n : {1, 7, 16, 64, 512}) check_down(n, 256, 8, 2048, 512, bits);
      check_down(37, 5, 2, 100, 192, bits);  // 3 groups, rows not a multiple of 16
      check_down(37, 5, 2, 100, 256, bits);  // 4 groups (the ring's), rows not a multiple of 32
    }
  }
  lc::set_moe_small_kernel(lc::MoeSmallKernel::Auto);
}

// The path rule (host logic only, no GPU needed): small while n·top_k / E <= kMoeSmallMaxAvg and the
// experts fit the kernel; LILAC_MOE_SMALL and set_moe_path override.
TEST(MoeSmall, PathRule) {
  lc::MoEPrefillWeights w;
  for (lc::QExpertsDev* x : {&w.gate, &w.up, &w.down}) {
    x->n = 256;
    x->first.bits = 4;
    x->first.group_size = 64;
  }
  w.gate.first.rows = w.up.first.rows = 512;
  w.gate.first.cols = w.up.first.cols = 2048;
  w.down.first.rows = 2048;
  w.down.first.cols = 512;
  w.top_k = 8;
  unsetenv("LILAC_MOE_SMALL");
  lc::set_moe_path(lc::MoePath::Auto);
  EXPECT_TRUE(lc::moe_use_small(w, 1));
  EXPECT_TRUE(lc::moe_use_small(w, 512));  // 16 pairs per expert
  EXPECT_FALSE(lc::moe_use_small(w, 513));
  EXPECT_FALSE(lc::moe_use_small(w, 1024));
  EXPECT_FALSE(lc::moe_use_small(w, 4096));
  setenv("LILAC_MOE_SMALL", "1", 1);
  EXPECT_TRUE(lc::moe_use_small(w, 4096));
  setenv("LILAC_MOE_SMALL", "0", 1);
  EXPECT_FALSE(lc::moe_use_small(w, 16));
  lc::set_moe_path(lc::MoePath::Small);  // overrides the environment
  EXPECT_TRUE(lc::moe_use_small(w, 16));
  unsetenv("LILAC_MOE_SMALL");
  lc::set_moe_path(lc::MoePath::Grouped);
  EXPECT_FALSE(lc::moe_use_small(w, 16));
  lc::set_moe_path(lc::MoePath::Small);
  w.gate.first.cols = w.up.first.cols = 2560;  // 40 groups: the most a row's scales have room for
  EXPECT_TRUE(lc::moe_small_supported(w));
  w.gate.first.cols = w.up.first.cols = 2624;  // 41: unsupported, never small
  EXPECT_FALSE(lc::moe_small_supported(w));
  EXPECT_FALSE(lc::moe_use_small(w, 16));
  w.gate.first.cols = w.up.first.cols = 2048;
  w.down.first.group_size = 32;  // unsupported: never small
  EXPECT_FALSE(lc::moe_small_supported(w));
  EXPECT_FALSE(lc::moe_use_small(w, 16));
  lc::set_moe_path(lc::MoePath::Auto);
}

TEST(MoeSmall, RejectsBadShapes) {
  NEED_GPU();
  std::mt19937 rng(1);
  QMat W(64, 96, 4, rng, 2);  // cols not a multiple of 64
  Dev<uint16_t> dx(1024);
  Dev<int32_t> ds(std::vector<int32_t>{0, 0, 0});
  Dev<float> dy(1024);
  EXPECT_THROW(lc::moe_small_down(W.experts(2), reinterpret_cast<const __nv_bfloat16*>(dx.p), 96, ds.p, 0, dy.p,
                                  dy.p, 64, nullptr),
               Error);
  QMat wide(64, 2624, 4, rng, 2);  // 41 groups: more than a row's scales have room for in shared memory
  Dev<uint16_t> dxw(4 * 2624);
  EXPECT_THROW(lc::moe_small_down(wide.experts(2), reinterpret_cast<const __nv_bfloat16*>(dxw.p), 2624, ds.p, 0,
                                  dy.p, dy.p, 64, nullptr),
               Error);
}

// moe_prefill_routed on both paths with the same routing: each against the CPU, and against each other.
void check_paths(int n, int E, int k, int hidden, int inter, int sinter) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " n=" + std::to_string(n) + " E=" + std::to_string(E));
  std::mt19937 rng(seed);
  const MoeBlockQ m(E, hidden, inter, sinter, rng);
  const lc::MoEPrefillWeights w = m.view(k);
  SortedRouting r = make_routing(n, E, k, rng);
  std::vector<int32_t> ids(size_t(n) * k);
  std::vector<float> wts(size_t(n) * k);
  std::vector<int> slot(n, 0);
  for (size_t i = 0; i < r.sorted_tok.size(); ++i) {  // back to [token, slot] order
    const int t = r.sorted_tok[i];
    ids[size_t(t) * k + slot[t]] = r.sorted_exp[i];
    wts[size_t(t) * k + slot[t]++] = r.sorted_w[i];
  }
  std::vector<float> xf;
  auto xb = rand_bf16(size_t(n) * hidden, rng, -1.f, 1.f, &xf);
  Dev<uint16_t> dx(xb);
  Dev<int32_t> dids(ids);
  Dev<float> dwts(wts), dy(size_t(n) * hidden);
  Dev<unsigned char> ws(lc::moe_prefill_workspace_bytes(w, n));
  std::vector<float> out[2];
  const lc::MoePath paths[2] = {lc::MoePath::Grouped, lc::MoePath::Small};
  for (int pi = 0; pi < 2; ++pi) {
    lc::set_moe_path(paths[pi]);
    dy.poison();
    cudaMemset(ws.p, 0xff, ws.n);
    lc::moe_prefill_routed(w, reinterpret_cast<const __nv_bfloat16*>(dx.p), hidden, n, dids.p, dwts.p, dy.p, hidden,
                           false, ws.p, nullptr);
    CK(cudaDeviceSynchronize());
    out[pi] = dy.get();
  }
  lc::set_moe_path(lc::MoePath::Auto);
  // CPU reference on the first tokens (all of them when few)
  const int nc = std::min(n, 24);
  std::vector<float> ref(size_t(nc) * hidden, 0.f);
  m.cpu_reference(xf.data(), nc, ids.data(), wts.data(), k, ref.data());
  for (int pi = 0; pi < 2; ++pi) {
    std::vector<float> head(out[pi].begin(), out[pi].begin() + size_t(nc) * hidden);
    EXPECT_LT(rel_err(head, ref, pi ? "small vs cpu" : "grouped vs cpu"), 1e-2);
  }
  EXPECT_LT(rel_err(out[1], out[0], "small vs grouped"), 1e-2);
}

TEST(MoeSmall, RoutedBlockBothPathsMatch) {
  NEED_GPU();
  for (int n : {1, 7, 16, 64, 512}) check_paths(n, 256, 8, 2048, 512, 512);
  check_paths(37, 5, 2, 320, 192, 128);
}

// moe_prefill with its own routing (identical on both paths): the outputs of the two paths agree.
TEST(MoeSmall, FullBlockBothPathsMatch) {
  NEED_GPU();
  for (int n : {16, 200}) {
    const uint32_t seed = fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed) + " n=" + std::to_string(n));
    std::mt19937 rng(seed);
    const int E = 64, k = 8, hidden = 512, inter = 256;
    const MoeBlockQ m(E, hidden, inter, 0, rng);  // no shared expert
    const lc::MoEPrefillWeights w = m.view(k);
    std::vector<float> xf;
    auto xb = rand_bf16(size_t(n) * hidden, rng, -1.f, 1.f, &xf);
    auto y0 = rand_f(size_t(n) * hidden, rng, -1.f, 1.f);
    Dev<uint16_t> dx(xb);
    Dev<float> dy(size_t(n) * hidden);
    Dev<unsigned char> ws(lc::moe_prefill_workspace_bytes(w, n));
    std::vector<float> out[2];
    const lc::MoePath paths[2] = {lc::MoePath::Grouped, lc::MoePath::Small};
    for (int pi = 0; pi < 2; ++pi) {
      lc::set_moe_path(paths[pi]);
      dy.put(y0);
      lc::moe_prefill(w, reinterpret_cast<const __nv_bfloat16*>(dx.p), hidden, n, dy.p, hidden, true, ws.p, nullptr);
      CK(cudaDeviceSynchronize());
      out[pi] = dy.get();
      for (size_t i = 0; i < y0.size(); ++i) out[pi][i] -= y0[i];  // the MoE contribution
    }
    lc::set_moe_path(lc::MoePath::Auto);
    EXPECT_LT(rel_err(out[1], out[0], "moe_prefill small vs grouped"), 1e-2);
  }
}

}  // namespace
