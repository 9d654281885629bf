// The quantized GEMM family (src/cuda/kernels/gemm/gemm.h: qgemm, qgemm_swiglu, the MoE prefill block)
// against the CPU reference ops on random inputs, on each tensor-core path (mma.sync, and wgmma where
// available): fresh seeds each run (printed on failure), outputs poisoned with NaN, sizes that are not
// multiples of the tiles. Precision: the GPU rounds dequantized weights / probabilities / hidden
// activations to bf16 (relative error 2^-9 per element, ~1e-3 on a norm), so ‖Δ‖/‖ref‖ ≤ 1e-2.
// (Timed at the model's sizes in bench/bench_kernels_gemm.cpp.)
#include <gtest/gtest.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/error.h"
#include "cpu/ops.h"
#include "cuda/kernels/gemm/gemm.h"
#include "moe_weights_fixture.h"
#include "prefill_test_util.h"

using namespace lilac;
namespace lc = lilac::cuda;
using namespace lilac::cuda::prefill_testing;

namespace {

// ------------------------------------------------------------------------------------------ qgemm
void check_qgemm(int n, int rows, int cols, int bits, lc::GemmOut mode, int ldx_pad) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " n=" + std::to_string(n) + " rows=" + std::to_string(rows) +
               " cols=" + std::to_string(cols) + " bits=" + std::to_string(bits) + " mode=" +
               std::to_string(int(mode)));
  std::mt19937 rng(seed);
  QMat W(rows, cols, bits, rng);
  const int64_t ldx = cols + ldx_pad;
  std::vector<float> xf;
  auto xb = rand_bf16(size_t(n) * ldx, rng, -1.f, 1.f, &xf);
  std::vector<float> xdense(size_t(n) * cols);
  for (int i = 0; i < n; ++i) std::memcpy(&xdense[size_t(i) * cols], &xf[size_t(i) * ldx], cols * 4);
  std::vector<float> ref(size_t(n) * rows);
  cpu::qmatmul(W.host, xdense.data(), n, ref.data());
  Dev<uint16_t> dx(xb);
  const int64_t ldy = rows + 3;
  std::vector<float> got(size_t(n) * rows);
  if (mode == lc::GemmOut::StoreBF16) {
    Dev<uint16_t> dy(size_t(n) * ldy);
    dy.poison();
    lc::qgemm(W.dev(), reinterpret_cast<const __nv_bfloat16*>(dx.p), ldx, n, dy.p, ldy, mode, nullptr);
    CK(cudaDeviceSynchronize());
    auto y = dy.get();
    for (int i = 0; i < n; ++i)
      for (int r = 0; r < rows; ++r) got[size_t(i) * rows + r] = bf16_to_f32(y[size_t(i) * ldy + r]);
  } else {
    std::vector<float> y0(size_t(n) * ldy, NAN);
    if (mode == lc::GemmOut::AddF32) {
      y0 = rand_f(y0.size(), rng, -1.f, 1.f);
      for (int i = 0; i < n; ++i)
        for (int r = 0; r < rows; ++r) ref[size_t(i) * rows + r] += y0[size_t(i) * ldy + r];
    }
    Dev<float> dy(y0);
    lc::qgemm(W.dev(), reinterpret_cast<const __nv_bfloat16*>(dx.p), ldx, n, dy.p, ldy, mode, nullptr);
    CK(cudaDeviceSynchronize());
    auto y = dy.get();
    for (int i = 0; i < n; ++i)
      for (int r = 0; r < rows; ++r) got[size_t(i) * rows + r] = y[size_t(i) * ldy + r];
  }
  double err = rel_err(got, ref);
  EXPECT_LT(err, 1e-2);
  EXPECT_GT(err, 0.0);  // bf16 rounding must show: guards against comparing a buffer with itself
}

TEST(PrefillQgemm, Int4F32) {
  NEED_GPU();
  for_each_gemm_path([] {
    check_qgemm(77, 200, 320, 4, lc::GemmOut::StoreF32, 0);
    check_qgemm(300, 1000, 2048, 4, lc::GemmOut::StoreF32, 8);
    check_qgemm(1, 65, 64, 4, lc::GemmOut::StoreF32, 0);
    // enough blocks for no split-K: the forced wgmma path takes the register-operand kernel (gemm_rs.cuh); Y's rows
    // are not 16-byte aligned (ldy = rows + 3), so its epilogue stores element by element
    check_qgemm(1100, 1000, 2048, 4, lc::GemmOut::StoreF32, 8);
  });
}
TEST(PrefillQgemm, Int4AddAndBf16) {
  NEED_GPU();
  for_each_gemm_path([] {
    check_qgemm(129, 131, 512, 4, lc::GemmOut::AddF32, 0);
    check_qgemm(100, 2048, 4096, 4, lc::GemmOut::AddF32, 0);  // split-K (small grid, long K), like out_proj
    check_qgemm(45, 257, 192, 4, lc::GemmOut::StoreBF16, 16);
    check_qgemm(1029, 131, 512, 4, lc::GemmOut::AddF32, 0);
  });
}
TEST(PrefillQgemm, Int8) {
  NEED_GPU();
  for_each_gemm_path([] {
    check_qgemm(50, 37, 256, 8, lc::GemmOut::StoreF32, 0);
    check_qgemm(140, 1, 512, 8, lc::GemmOut::StoreF32, 0);
  });
}

TEST(PrefillQgemm, SwiGLU) {
  NEED_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  for (const int cols : {192, 1024}) {  // 1024: a multiple of 512, so the forced wgmma path takes gemm_rs.cuh
    SCOPED_TRACE("cols " + std::to_string(cols));
    const int n = 150, rows = 130;
    QMat G(rows, cols, 4, rng), U(rows, cols, 4, rng);
    std::vector<float> xf;
    auto xb = rand_bf16(size_t(n) * cols, rng, -1.f, 1.f, &xf);
    std::vector<float> g(size_t(n) * rows), u(size_t(n) * rows), ref(size_t(n) * rows);
    cpu::qmatmul(G.host, xf.data(), n, g.data());
    cpu::qmatmul(U.host, xf.data(), n, u.data());
    for (size_t i = 0; i < ref.size(); ++i) ref[i] = silu(g[i]) * u[i];
    Dev<uint16_t> dx(xb), dh(size_t(n) * rows);
    for_each_gemm_path([&] {
      dh.poison();
      lc::qgemm_swiglu(G.dev(), U.dev(), reinterpret_cast<const __nv_bfloat16*>(dx.p), cols, n,
                       reinterpret_cast<__nv_bfloat16*>(dh.p), rows, nullptr);
      CK(cudaDeviceSynchronize());
      EXPECT_LT(rel_err(bf16_to_f(dh.get()), ref), 1e-2);
    });
  }
}

// The 4-bit paths multiply the same bf16 weights (one rounding of s·q + b) with the same bf16 X in fp32: they may
// differ only by the tensor cores' summation order. Far tighter than the CPU comparison above, so a fragment,
// nibble or k-permutation slip that moves a few products shows. Shapes: the model's in_proj / out_proj widths with
// ragged row and token counts; K a multiple of 512 without split-K (the forced wgmma path then takes the
// register-operand kernel, gemm_rs.cuh; Y's rows 16-byte aligned or not, so both of its store paths), split-K (a
// small grid with a long K, the shared-memory kernel), and the SwiGLU pair.
TEST(PrefillQgemm, WgmmaPathsAgreeWithMmaSync) {
  NEED_GPU();
  if (!lc::gemm_wgmma_available()) GTEST_SKIP() << "no sm_90a wgmma on this GPU";
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  struct Case {
    int n, rows, cols;
    lc::GemmOut mode;
  };
  for (const Case& cs : {Case{1100, 1000, 2048, lc::GemmOut::StoreF32}, Case{1030, 2048, 4096, lc::GemmOut::AddF32},
                         Case{1030, 2047, 2048, lc::GemmOut::AddF32}, Case{1069, 257, 512, lc::GemmOut::StoreBF16},
                         Case{1100, 512, 2048, lc::GemmOut::StoreBF16}, Case{45, 257, 192, lc::GemmOut::StoreBF16},
                         Case{300, 1000, 2048, lc::GemmOut::StoreF32}, Case{129, 2048, 4096, lc::GemmOut::AddF32},
                         Case{7, 130, 512, lc::GemmOut::StoreF32}}) {
    SCOPED_TRACE("n=" + std::to_string(cs.n) + " rows=" + std::to_string(cs.rows) + " cols=" + std::to_string(cs.cols));
    QMat W(cs.rows, cs.cols, 4, rng);
    Dev<uint16_t> dx(rand_bf16(size_t(cs.n) * cs.cols, rng, -1.f, 1.f, nullptr));
    const std::vector<float> y0 = rand_f(size_t(cs.n) * cs.rows, rng, -1.f, 1.f);
    auto run = [&](lc::GemmPath path, std::vector<float>& out) {
      lc::set_gemm_path(path);
      out.assign(size_t(cs.n) * cs.rows, 0.f);
      if (cs.mode == lc::GemmOut::StoreBF16) {
        Dev<uint16_t> dy(out.size());
        dy.poison();
        lc::qgemm(W.dev(), reinterpret_cast<const __nv_bfloat16*>(dx.p), cs.cols, cs.n, dy.p, cs.rows, cs.mode, nullptr);
        CK(cudaDeviceSynchronize());
        out = bf16_to_f(dy.get());
      } else {
        Dev<float> dy(y0);
        lc::qgemm(W.dev(), reinterpret_cast<const __nv_bfloat16*>(dx.p), cs.cols, cs.n, dy.p, cs.rows, cs.mode, nullptr);
        CK(cudaDeviceSynchronize());
        out = dy.get();
      }
      lc::set_gemm_path(lc::GemmPath::Auto);
    };
    std::vector<float> ref, rs, smem;
    run(lc::GemmPath::MmaSync, ref);
    run(lc::GemmPath::Wgmma, rs);
    run(lc::GemmPath::WgmmaSmem, smem);
    const double tol = cs.mode == lc::GemmOut::StoreBF16 ? 4e-3 : 2e-6;  // bf16 outputs: a rounding step apart at most
    EXPECT_LT(rel_err(rs, ref), tol);
    EXPECT_LT(rel_err(smem, ref), tol);
  }
  // SwiGLU (bf16 out)
  const int n = 1100, rows = 130, cols = 1024;
  QMat G(rows, cols, 4, rng), U(rows, cols, 4, rng);
  Dev<uint16_t> dx(rand_bf16(size_t(n) * cols, rng, -1.f, 1.f, nullptr)), dh(size_t(n) * rows);
  auto swiglu = [&](lc::GemmPath path, std::vector<float>& out) {
    lc::set_gemm_path(path);
    dh.poison();
    lc::qgemm_swiglu(G.dev(), U.dev(), reinterpret_cast<const __nv_bfloat16*>(dx.p), cols, n,
                     reinterpret_cast<__nv_bfloat16*>(dh.p), rows, nullptr);
    CK(cudaDeviceSynchronize());
    lc::set_gemm_path(lc::GemmPath::Auto);
    out = bf16_to_f(dh.get());
  };
  std::vector<float> href, hrs;
  swiglu(lc::GemmPath::MmaSync, href);
  swiglu(lc::GemmPath::Wgmma, hrs);
  EXPECT_LT(rel_err(hrs, href), 4e-3);
}

// Split-K on sm_90: the k splits of a tile as one thread-block cluster adding their partials through distributed
// shared memory must give exactly what the partial buffer + reduce kernel gives (the same sums in the same order), on
// every tensor-core path: shapes that split (small grids, long K: out_proj-like with 1 and 4 token tiles, the 8-bit
// router), ragged token and row counts (a tile's rows and columns past the edge), Y rows 16-byte aligned or not (both
// store paths), stores and adds.
TEST(PrefillQgemm, SplitKClusterEqualsReduce) {
  NEED_GPU();
  if (!lc::splitk_cluster_available()) GTEST_SKIP() << "thread-block clusters need sm_90";
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  struct Case {
    int n, rows, cols, bits, ldy_pad;
    lc::GemmOut mode;
  };
  for (const Case& cs : {Case{100, 2048, 4096, 4, 0, lc::GemmOut::AddF32}, Case{512, 2048, 4096, 4, 0, lc::GemmOut::AddF32},
                         Case{77, 257, 2048, 4, 3, lc::GemmOut::StoreF32}, Case{129, 2047, 512, 4, 1, lc::GemmOut::AddF32},
                         Case{300, 256, 2048, 8, 0, lc::GemmOut::StoreF32}, Case{5, 1, 2048, 8, 0, lc::GemmOut::StoreF32}}) {
    SCOPED_TRACE("n=" + std::to_string(cs.n) + " rows=" + std::to_string(cs.rows) + " cols=" + std::to_string(cs.cols) +
                 " bits=" + std::to_string(cs.bits));
    QMat W(cs.rows, cs.cols, cs.bits, rng);
    std::vector<float> xf;
    Dev<uint16_t> dx(rand_bf16(size_t(cs.n) * cs.cols, rng, -1.f, 1.f, &xf));
    const int64_t ldy = cs.rows + cs.ldy_pad;
    const std::vector<float> y0 = rand_f(size_t(cs.n) * ldy, rng, -1.f, 1.f);
    std::vector<float> ref(size_t(cs.n) * cs.rows);
    cpu::qmatmul(W.host, xf.data(), cs.n, ref.data());
    lc::set_splitk_cluster(lc::SplitKPath::Reduce);
    ASSERT_GT(lc::qgemm_split_floats(W.dev(), cs.n, cs.mode), 0u) << "this shape must split K";
    lc::set_splitk_cluster(lc::SplitKPath::Cluster);
    EXPECT_EQ(lc::qgemm_split_floats(W.dev(), cs.n, cs.mode), 0u);
    auto run = [&](lc::SplitKPath path, std::vector<float>& out) {
      lc::set_splitk_cluster(path);
      Dev<float> dy(y0);
      lc::qgemm(W.dev(), reinterpret_cast<const __nv_bfloat16*>(dx.p), cs.cols, cs.n, dy.p, ldy, cs.mode, nullptr);
      CK(cudaDeviceSynchronize());
      lc::set_splitk_cluster(lc::SplitKPath::Auto);
      out = dy.get();
    };
    for_each_gemm_path([&] {
      std::vector<float> red, clu;
      run(lc::SplitKPath::Reduce, red);
      run(lc::SplitKPath::Cluster, clu);
      ASSERT_EQ(red.size(), clu.size());
      EXPECT_EQ(std::memcmp(red.data(), clu.data(), red.size() * sizeof(float)), 0);
      std::vector<float> got(ref.size());
      for (int i = 0; i < cs.n; ++i)
        for (int r = 0; r < cs.rows; ++r) {
          const size_t at = size_t(i) * ldy + r;
          got[size_t(i) * cs.rows + r] = clu[at] - (cs.mode == lc::GemmOut::AddF32 ? y0[at] : 0.f);
          // padding columns of Y untouched
          if (r + 1 == cs.rows) {
            for (int pd = 0; pd < cs.ldy_pad; ++pd) {
              EXPECT_EQ(clu[at + 1 + pd], y0[at + 1 + pd]);
            }
          }
        }
      EXPECT_LT(rel_err(got, ref), 1e-2);
    });
  }
}

TEST(PrefillQgemm, RejectsBadShapes) {
  NEED_GPU();
  std::mt19937 rng(1);
  QMat W(64, 128, 4, rng);
  auto m = W.dev();
  m.group_size = 32;
  Dev<uint16_t> dx(128);
  Dev<float> dy(64);
  EXPECT_THROW(lc::qgemm(m, reinterpret_cast<const __nv_bfloat16*>(dx.p), 128, 1, dy.p, 64, lc::GemmOut::StoreF32,
                         nullptr),
               Error);
}

// -------------------------------------------------------------------------------------------- MoE
TEST(PrefillMoe, RouteMatchesCpu) {
  NEED_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  // 256: the probabilities cached in registers (E <= 256); 300 and 20: the uncached form and lanes without experts
  for (const int E : {256, 300, 20}) {
    SCOPED_TRACE("E " + std::to_string(E));
    const int n = 333, k = 8;
    auto logits = rand_f(size_t(n) * E, rng, -4.f, 4.f);
    Dev<float> dl(logits), dw(size_t(n) * k);
    Dev<int32_t> di(size_t(n) * k);
    dw.poison();
    lc::moe_route_prefill(dl.p, n, E, k, true, di.p, dw.p, nullptr);
    CK(cudaDeviceSynchronize());
    auto ids = di.get();
    auto w = dw.get();
    std::vector<int> rid(k);
    std::vector<float> rw(k);
    for (int t = 0; t < n; ++t) {
      cpu::moe_route(&logits[size_t(t) * E], E, k, true, rid.data(), rw.data());
      for (int s = 0; s < k; ++s) {
        ASSERT_EQ(ids[t * k + s], rid[s]) << "token " << t << " slot " << s;
        ASSERT_NEAR(w[t * k + s], rw[s], 1e-5f) << "token " << t << " slot " << s;
      }
    }
  }
}

// The GPU's router logits come from bf16-rounded weights (relative error ~2^-9 per weight), so its
// top-k may differ from the CPU's only between experts whose CPU probabilities are nearly tied: every
// expert the GPU picked must have a CPU probability ≥ (1 − 1e-2) × the CPU's k-th largest (1e-2 in
// probability ≈ 1e-2 in logit, ~20× the expected logit error); the ids must be distinct; where both
// chose the same set, the renormalised weights must agree to 1e-2 relative. (Slot order among nearly
// equal probabilities may differ: the MoE output does not depend on it.)
void check_routing(const std::vector<float>& logits, const std::vector<int32_t>& ids, const std::vector<float>& wts,
                   int n, int E, int k) {
  int set_differs = 0;
  std::vector<float> p(E), rw(k);
  std::vector<int> rid(k);
  for (int t = 0; t < n; ++t) {
    const float* row = &logits[size_t(t) * E];
    std::copy(row, row + E, p.begin());
    cpu::softmax(p.data(), E);
    cpu::moe_route(row, E, k, true, rid.data(), rw.data());
    const float pk = p[rid[k - 1]];  // the CPU's k-th largest probability
    std::vector<int> a(rid.begin(), rid.end()), b(ids.begin() + size_t(t) * k, ids.begin() + size_t(t + 1) * k);
    for (int e : b) ASSERT_TRUE(e >= 0 && e < E) << "token " << t << " expert id " << e;
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    ASSERT_TRUE(std::adjacent_find(b.begin(), b.end()) == b.end()) << "token " << t << ": repeated expert id";
    for (int s = 0; s < k; ++s) {
      const int e = ids[size_t(t) * k + s];
      EXPECT_GE(p[e], pk * (1.f - 1e-2f)) << "token " << t << " slot " << s << ": expert " << e
                                          << " is no near-tie of the CPU's top-" << k;
    }
    if (a != b) {
      ++set_differs;
      continue;
    }
    for (int s = 0; s < k; ++s) {
      const int e = ids[size_t(t) * k + s];
      const int j = int(std::find(rid.begin(), rid.end(), e) - rid.begin());
      EXPECT_NEAR(wts[size_t(t) * k + s], rw[j], 1e-2f * rw[j] + 1e-6f) << "token " << t << " expert " << e;
    }
  }
  std::printf("[routing] %d of %d tokens chose a different expert set than the CPU (near-ties)\n", set_differs, n);
}

void check_moe(int n, int E, int k, int hidden, int inter, int sinter) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " n=" + std::to_string(n) + " E=" + std::to_string(E));
  std::mt19937 rng(seed);
  const MoeBlockQ m(E, hidden, inter, sinter, rng);
  lc::MoEPrefillWeights w = m.view(k);
  w.renormalise = true;
  std::vector<float> xf;
  auto xb = rand_bf16(size_t(n) * hidden, rng, -1.f, 1.f, &xf);
  auto y0 = rand_f(size_t(n) * hidden, rng, -1.f, 1.f);
  Dev<uint16_t> dx(xb);
  Dev<float> dy(y0), dwts(size_t(n) * k);
  Dev<int32_t> dids(size_t(n) * k);
  Dev<unsigned char> ws(lc::moe_prefill_workspace_bytes(w, n));
  cudaMemset(ws.p, 0xff, ws.n);
  lc::moe_prefill(w, reinterpret_cast<const __nv_bfloat16*>(dx.p), hidden, n, dy.p, hidden, true, ws.p, nullptr,
                  dids.p, dwts.p);
  CK(cudaDeviceSynchronize());
  auto got = dy.get();
  auto ids = dids.get();
  auto wts = dwts.get();
  std::vector<float> logits(size_t(n) * E);
  cpu::qmatmul(m.router->host, xf.data(), n, logits.data());
  check_routing(logits, ids, wts, n, E, k);
  // experts with the GPU's routing
  for (int32_t e : ids) ASSERT_TRUE(e >= 0 && e < E);
  std::vector<float> ref = y0;
  m.cpu_reference(xf.data(), n, ids.data(), wts.data(), k, ref.data());
  // compare the MoE contribution (without the residual, which would hide errors)
  std::vector<float> gd(got.size()), rd(ref.size());
  for (size_t i = 0; i < got.size(); ++i) {
    gd[i] = got[i] - y0[i];
    rd[i] = ref[i] - y0[i];
  }
  EXPECT_LT(rel_err(gd, rd), 1e-2);
}

TEST(PrefillMoe, GroupedExpertsMatchCpu) {
  NEED_GPU();
  lc::set_moe_path(lc::MoePath::Grouped);
  for_each_gemm_path([] {
    check_moe(150, 16, 4, 256, 128, 192);  // some experts get no token, uneven tiles
    check_moe(300, 64, 8, 512, 192, 128);
    check_moe(3, 32, 8, 128, 64, 64);
  });
  lc::set_moe_path(lc::MoePath::Auto);
}

// The same block with the small-M expert GEMMs (moe_small.cu; more in test_moe_small.cpp).
TEST(PrefillMoe, SmallExpertsMatchCpu) {
  NEED_GPU();
  lc::set_moe_path(lc::MoePath::Small);
  check_moe(150, 16, 4, 256, 128, 192);  // experts with several 16-token chunks
  check_moe(300, 64, 8, 512, 192, 128);
  check_moe(3, 32, 8, 128, 64, 64);
  lc::set_moe_path(lc::MoePath::Auto);
}

}  // namespace
