// Multi-row dense GEMV (rows_mm.h: stage + gemv_rows: the 4-bit group-layout kernel with one and two mma tiles
// of 4 rows per block, the 8-bit kernel) against the CPU reference (qmatvec of the prologue's output) on random inputs
// with NaN-poisoned or sentinel-filled outputs, at the model's shapes and odd ones;
// every row bit for bit equal to today's single-row tensor-core kernel (gemv with GemvImpl::Tensor) on that
// row alone; batch invariance (a row alone and inside M = 2, 7, 16, 64 with other rows and padding rows,
// memcmp; padding rows' outputs untouched); the slice and wgmma kernels bit for bit the tiles kernel; a dependent chain
// captured in a CUDA graph with PDL.
#include <gtest/gtest.h>
#include <cuda_runtime.h>

#include <cmath>
#include <initializer_list>
#include <string>
#include <vector>

#include "cpu/ops.h"
#include "cuda/kernels/gemm/gemm.h"
#include "cuda/kernels/gemv/gemv.h"
#include "cuda/kernels/rows/rows_mm.h"
#include "decode_test_util.h"
#include "rows_test_util.h"

using namespace lilac;
namespace lc = lilac::cuda;
namespace lr = lilac::cuda::rows;
using namespace lilac::cuda::testing;

namespace {

constexpr int kHd = 128;  // GatedHeadNorm head size (the model's dv)
struct Shape {
  int64_t rows, cols;
  int bits;
  lc::Prologue pro;
  int hd = kHd;  // GatedHeadNorm: the head size
};

// The prologue's output for one row on the CPU.
std::vector<float> prologue_cpu(const Shape& c, const float* x, const float* z, const std::vector<float>& nw) {
  std::vector<float> out(x, x + c.cols);
  if (c.pro == lc::Prologue::RmsNorm) cpu::rmsnorm(x, nw.data(), c.cols, 1e-6f, out.data());
  if (c.pro == lc::Prologue::GatedHeadNorm)
    for (int64_t h = 0; h < c.cols / c.hd; ++h)
      cpu::gated_rmsnorm(x + h * c.hd, z + h * c.hd, nw.data(), c.hd, 1e-6f, out.data() + h * c.hd);
  return out;
}

// Today's kernel on one row: y (+)= W t(x).
std::vector<float> today_row(const DevQ& W, const Shape& c, const std::vector<float>& x, const std::vector<float>& z,
                             const float* dnw, bool acc, const std::vector<float>& y0) {
  Dev<float> dx(x), dz(z.empty() ? std::vector<float>(1) : z), dy(y0);
  lc::GemvArgs a;
  a.W = W.d;
  a.x = dx.p;
  a.y = dy.p;
  a.accumulate = acc;
  a.pro = c.pro;
  a.norm_w = dnw;
  a.z = dz.p;
  a.head_dim = c.hd;
  a.eps = 1e-6f;
  a.impl = lc::GemvImpl::Tensor;
  lc::gemv(a, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return dy.get();
}

std::vector<float> norm_weights(Rng& r, const Shape& c) {
  std::vector<float> nw(size_t(c.pro == lc::Prologue::GatedHeadNorm ? c.hd : c.cols));
  for (auto& v : nw) v = r.uni(0.6f, 1.4f);
  return nw;
}

// A shape's quantized matrix (host and device) and its prologue's norm weights on the device, drawn in that order.
struct ShapeWeights {
  HostQ hq;
  DevQ dq;
  Dev<float> dnw;
  lc::Prologue pro;
  int hd;
  ShapeWeights(Rng& r, const Shape& c)
      : hq(r, c.rows, c.cols, c.bits), dq(hq), dnw(norm_weights(r, c)), pro(c.pro), hd(c.hd) {}
  RowsGemvRun run(bool acc) const { return RowsGemvRun{dq, pro, dnw.p, hd, acc}; }
  // z as RowsGemvRun::run takes it: only the gated head norm reads one
  std::vector<float> z_for(const std::vector<float>& z) const {
    return pro == lc::Prologue::GatedHeadNorm ? z : std::vector<float>();
  }
};

// Padding rows (slot < 0) of an [M][rows] output: set to kSentinel before a run, still kSentinel after it.
void fill_padding(std::vector<float>& y, const std::vector<int32_t>& slots, int64_t rows) {
  for (size_t m = 0; m < slots.size(); ++m)
    if (slots[m] < 0) std::fill(y.begin() + int64_t(m) * rows, y.begin() + int64_t(m + 1) * rows, kSentinel);
}
void expect_padding_untouched(const std::vector<float>& got, const std::vector<int32_t>& slots, int64_t rows) {
  for (size_t m = 0; m < slots.size(); ++m) {
    if (slots[m] >= 0) continue;
    bool untouched = true;
    for (int64_t i = 0; i < rows; ++i) untouched &= got[m * size_t(rows) + size_t(i)] == kSentinel;
    EXPECT_TRUE(untouched) << "padding row " << m << " was written";
  }
}

TEST(RowsGemv, MatchesCpuAndTodaysKernelRowByRow) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  using P = lc::Prologue;
  // GDN in_proj (RMSNorm), out_proj (gated head norm), attention qkv, router + shared gate (8-bit), a tall
  // matrix (one k-slice), MoE-down width, odd shapes (7 groups, partial k-tiles, 3 rows)
  const Shape shapes[] = {{12352, 2048, 4, P::RmsNorm}, {2048, 4096, 4, P::GatedHeadNorm}, {9216, 2048, 4, P::RmsNorm},
                          {257, 2048, 8, P::RmsNorm},   {50704, 2048, 4, P::None},         {2048, 512, 4, P::None},
                          {1000, 320, 8, P::None},      {1001, 448, 4, P::RmsNorm},        {77, 192, 4, P::None},
                          {3, 64, 8, P::RmsNorm},       {130, 384, 4, P::GatedHeadNorm},   {515, 1024, 8, P::GatedHeadNorm},
                          // heads that are not a power-of-two number of 8-value units (tiny2's dv 48; 96; 12, whose
                          // units straddle heads): gemv_tc summed their squares with shared-memory atomics (an order
                          // that depends on scheduling, not the rows staging's bits) until stop 53
                          {192, 192, 4, P::GatedHeadNorm, 48}, {200, 384, 4, P::GatedHeadNorm, 96},
                          {130, 192, 4, P::GatedHeadNorm, 12}};
  for (const Shape& c : shapes) {
    for (int M : {1, 3, 8, 13, 16}) {
      // the tall matrix (CPU reference: few rows) at M = 16: 2 row tiles of 8 side by side
      if (c.rows > 20000 ? (M == 8 || M == 13) : M == 16) continue;
      for (int acc = 0; acc < 2; ++acc) {
        SCOPED_TRACE("rows " + std::to_string(c.rows) + " cols " + std::to_string(c.cols) + " bits " +
                     std::to_string(c.bits) + " prologue " + std::to_string(int(c.pro)) + " head " +
                     std::to_string(c.hd) + " M " + std::to_string(M) + " accumulate " + std::to_string(acc));
        HostQ hq(r, c.rows, c.cols, c.bits);
        DevQ dq(hq);
        const auto x = randv(r, size_t(M * c.cols), 2.f), z = randv(r, size_t(M * c.cols));
        const auto nw = norm_weights(r, c);
        Dev<float> dnw(nw);
        std::vector<float> y0 = randv(r, size_t(M * c.rows));
        if (!acc) std::fill(y0.begin(), y0.end(), std::nanf(""));
        RowsGemvRun run{dq, c.pro, dnw.p, c.hd, bool(acc)};
        const auto got = run.run(M, x, c.pro == P::GatedHeadNorm ? z : std::vector<float>(), y0, {});
        for (int m = 0; m < M; ++m) {
          SCOPED_TRACE("row " + std::to_string(m));
          const float* xr = x.data() + m * c.cols;
          const auto xin = prologue_cpu(c, xr, z.data() + m * c.cols, nw);
          std::vector<float> ref(size_t(c.rows));
          cpu::qmatvec(hq.m, xin.data(), ref.data());
          if (acc)
            for (int64_t i = 0; i < c.rows; ++i) ref[size_t(i)] += y0[size_t(m * c.rows + i)];
          const std::vector<float> gr(got.begin() + m * c.rows, got.begin() + (m + 1) * c.rows);
          EXPECT_LE(rel_err(gr, ref), c.pro == P::None ? 2e-6 : 1e-5);
          const std::vector<float> y0r(y0.begin() + m * c.rows, y0.begin() + (m + 1) * c.rows);
          const auto today = today_row(dq, c, std::vector<float>(xr, xr + c.cols),
                                       std::vector<float>(z.begin() + m * c.cols, z.begin() + (m + 1) * c.cols),
                                       dnw.p, acc, y0r);
          EXPECT_EQ(first_bit_diff(gr.data(), today.data(), c.rows), -1)
              << "vs gemv_tc: " << bit_diff_msg(gr.data(), today.data(), c.rows);
        }
      }
    }
  }
}

// A row's output is the same bits alone and inside batches of M rows at any position; padding rows
// (slot < 0) keep their outputs.
TEST(RowsGemv, BatchInvariantAndPaddingUntouched) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  using P = lc::Prologue;
  const Shape shapes[] = {{12352, 2048, 4, P::RmsNorm}, {2048, 4096, 4, P::GatedHeadNorm}, {257, 2048, 8, P::RmsNorm},
                          {77, 192, 4, P::None},         {1000, 320, 8, P::None}};
  for (const Shape& c : shapes) {
    const ShapeWeights sw(r, c);
    for (int acc = 0; acc < 2; ++acc) {
      const RowsGemvRun run = sw.run(bool(acc));
      const auto x0 = randv(r, size_t(c.cols), 2.f), z0 = randv(r, size_t(c.cols)), y00 = randv(r, size_t(c.rows));
      const auto alone = run.run(1, x0, sw.z_for(z0), y00, {});
      for (int M : {2, 7, 16, 64}) {
        SCOPED_TRACE("rows " + std::to_string(c.rows) + " bits " + std::to_string(c.bits) + " M " + std::to_string(M) +
                     " accumulate " + std::to_string(acc));
        const int pos = int(r.word() % uint32_t(M));
        auto x = randv(r, size_t(M * c.cols), 2.f), z = randv(r, size_t(M * c.cols)), y0 = randv(r, size_t(M * c.rows));
        std::copy(x0.begin(), x0.end(), x.begin() + pos * c.cols);
        std::copy(z0.begin(), z0.end(), z.begin() + pos * c.cols);
        std::copy(y00.begin(), y00.end(), y0.begin() + pos * c.rows);
        const auto slots = slots_with_padding(r, M, pos);
        fill_padding(y0, slots, c.rows);
        const auto got = run.run(M, x, sw.z_for(z), y0, slots);
        EXPECT_EQ(first_bit_diff(got.data() + pos * c.rows, alone.data(), c.rows), -1)
            << "row " << pos << ": " << bit_diff_msg(got.data() + pos * c.rows, alone.data(), c.rows);
        expect_padding_untouched(got, slots, c.rows);
      }
    }
  }
}

// `kernel` gives every present row the tiles kernel's bits (row tiles of 8 side by side), for each shape, M and residual
// or not, with padding rows at random places; padding rows' outputs stay untouched.
void expect_matches_tiles(Rng& r, const std::vector<Shape>& shapes, std::initializer_list<int> Ms,
                          lr::RowsGemvKernel kernel) {
  for (const Shape& c : shapes) {
    const ShapeWeights sw(r, c);
    for (int M : Ms) {
      for (int acc = 0; acc < 2; ++acc) {
        SCOPED_TRACE("rows " + std::to_string(c.rows) + " cols " + std::to_string(c.cols) + " M " + std::to_string(M) +
                     " accumulate " + std::to_string(acc));
        const auto x = randv(r, size_t(M * c.cols), 2.f), z = randv(r, size_t(M * c.cols));
        auto y0 = randv(r, size_t(M * c.rows));
        const auto slots = slots_with_padding(r, M, int(r.word() % uint32_t(M)));
        fill_padding(y0, slots, c.rows);
        RowsGemvRun run = sw.run(bool(acc));
        run.kernel = lr::RowsGemvKernel::Tiles;
        const auto tiles = run.run(M, x, sw.z_for(z), y0, slots);
        run.kernel = kernel;
        const auto got = run.run(M, x, sw.z_for(z), y0, slots);
        EXPECT_EQ(first_bit_diff(got.data(), tiles.data(), got.size()), -1)
            << bit_diff_msg(got.data(), tiles.data(), got.size());
        expect_padding_untouched(got, slots, c.rows);
      }
    }
  }
}

// The slice kernel (M > 8: each weight tile dequantized once per 16 or 32 rows, k-slice chains through partials), at
// the model's shapes (the in_proj and qkv's one k-tile per slice and out_proj's two, kept in shared memory; the LM
// head's single slice of 8 k-tiles, streamed) and odd ones (partial k-tiles, fewer row blocks than a block's 8, M not
// a multiple of 4).
TEST(RowsGemv, SliceKernelMatchesTilesKernelBitForBit) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  using P = lc::Prologue;
  expect_matches_tiles(r,
                       {{12352, 2048, 4, P::RmsNorm}, {2048, 4096, 4, P::GatedHeadNorm}, {9216, 2048, 4, P::RmsNorm},
                        {50704, 2048, 4, P::None}, {1001, 448, 4, P::RmsNorm}, {77, 192, 4, P::None},
                        {130, 384, 4, P::GatedHeadNorm}},
                       {9, 16, 19, 32, 45, 64}, lr::RowsGemvKernel::Slices);
}

// The wgmma kernel (Hopper: 64 weight rows × 16 input rows per warpgroup, the k-slices chained in registers, the input
// staged in the frag4w layout; at 9..16 rows a tile's slices split over a 2-block cluster), at the model's shapes
// (in_proj, where Auto takes it from 16 rows; qkv; out_proj's two k-tiles per slice) and odd ones (a partial weight tile, one k-tile, K = 768's empty fourth k-slice, slices of 1-3
// k-tiles), M = 9..64.
TEST(RowsGemv, WgmmaKernelMatchesTilesKernelBitForBit) {
  NEED_GPU();
  if (!lc::gemm_wgmma_available()) GTEST_SKIP() << "no sm_90a wgmma on this GPU";
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  using P = lc::Prologue;
  expect_matches_tiles(r,
                       {{12352, 2048, 4, P::RmsNorm}, {9216, 2048, 4, P::RmsNorm}, {2048, 4096, 4, P::GatedHeadNorm},
                        {1001, 512, 4, P::RmsNorm}, {77, 256, 4, P::None}, {130, 768, 4, P::GatedHeadNorm},
                        {40, 1024, 4, P::None}},
                       {9, 16, 17, 32, 45, 64}, lr::RowsGemvKernel::Wgmma);
}

// The wgmma kernel's input-streaming form (from 33 rows: two 16-row slices per warpgroup on one dequantized weight
// tile, the block's input steps shared by its three warpgroups): the model's in_proj and qkv shapes, out_proj's two
// k-tiles per slice, and odd ones (a partial weight tile, fewer weight tiles than one block's three warpgroups, K =
// 768's empty fourth k-slice); M = 33 (a block row of one row) to 64, 45 with its second block's second slice empty.
TEST(RowsGemv, WgmmaStreamKernelMatchesTilesKernelBitForBit) {
  NEED_GPU();
  if (!lc::gemm_wgmma_available()) GTEST_SKIP() << "no sm_90a wgmma on this GPU";
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  using P = lc::Prologue;
  expect_matches_tiles(r,
                       {{12352, 2048, 4, P::RmsNorm}, {9216, 2048, 4, P::RmsNorm}, {2048, 4096, 4, P::GatedHeadNorm},
                        {1001, 512, 4, P::RmsNorm}, {77, 256, 4, P::None}, {130, 768, 4, P::GatedHeadNorm}},
                       {33, 40, 45, 48, 64}, lr::RowsGemvKernel::WgmmaStream);
}

// x1 = W1 x (None); x2 = W2 RmsNorm(x1); x += W3 x2 (8-bit, residual): stage + GEMV launches with PDL,
// captured once in a graph and replayed; every launch reads what the previous one wrote and the last one
// overwrites the first one's input. M = 5 rows, one of them padding.
TEST(RowsGemv, PdlChainInAGraphMatchesCpu) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  const int M = 5;
  const int64_t H = 1024, F = 3072;
  HostQ w1(r, F, H, 4), w2(r, H, F, 4), w3(r, H, H, 8);
  DevQ d1(w1), d2(w2), d3(w3);
  auto x = randv(r, size_t(M * H));
  std::vector<float> nw(static_cast<size_t>(F));
  for (auto& v : nw) v = r.uni(0.8f, 1.2f);
  const std::vector<int32_t> slots = {4, 0, -1, 2, 9};
  Dev<float> dx(x), dy1(size_t(M * F)), dy2(size_t(M * H)), dnw(nw);
  Dev<int32_t> dslot(slots);
  Dev<char> frag(lr::frag_row_bytes(F) * M);
  Dev<float2> meta(lr::meta_row_count(F) * M);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  auto stage = [&](const float* in, int64_t K, lc::Prologue pro, int bits) {
    lr::StageArgs a;
    a.x = in;
    a.K = K;
    a.M = M;
    a.row_slot = dslot.p;
    a.pro = pro;
    a.norm_w = dnw.p;
    (bits == 4 ? a.frag4g : a.frag8) = frag.p;
    a.meta = meta.p;
    lr::stage(a, s);
  };
  auto gemv = [&](const DevQ& W, float* y, bool acc) {
    lr::GemvRowsArgs a;
    a.W = W.d;
    a.frag = frag.p;
    a.meta = meta.p;
    a.M = M;
    a.row_slot = dslot.p;
    a.y = y;
    a.accumulate = acc;
    lr::gemv_rows(a, s);
  };
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  stage(dx.p, H, lc::Prologue::None, 4);
  gemv(d1, dy1.p, false);
  stage(dy1.p, F, lc::Prologue::RmsNorm, 4);
  gemv(d2, dy2.p, false);
  stage(dy2.p, H, lc::Prologue::None, 8);
  gemv(d3, dx.p, true);
  cudaGraph_t g;
  CK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t ge;
  CK(cudaGraphInstantiate(&ge, g, 0));
  std::vector<float> y1(static_cast<size_t>(F)), y1n(static_cast<size_t>(F)), y2(static_cast<size_t>(H)),
      y3(static_cast<size_t>(H));
  for (int rep = 0; rep < 3; ++rep) {
    CK(cudaGraphLaunch(ge, s));
    for (int m = 0; m < M; ++m) {
      if (slots[size_t(m)] < 0) continue;
      float* xm = x.data() + m * H;
      cpu::qmatvec(w1.m, xm, y1.data());
      cpu::rmsnorm(y1.data(), nw.data(), F, 1e-6f, y1n.data());
      cpu::qmatvec(w2.m, y1n.data(), y2.data());
      cpu::qmatvec(w3.m, y2.data(), y3.data());
      for (int64_t i = 0; i < H; ++i) xm[i] += y3[size_t(i)];
    }
  }
  CK(cudaStreamSynchronize(s));
  const auto got = dx.get();
  for (int m = 0; m < M; ++m) {
    const std::vector<float> gr(got.begin() + m * H, got.begin() + (m + 1) * H), xr(x.begin() + m * H, x.begin() + (m + 1) * H);
    if (slots[size_t(m)] < 0)
      EXPECT_EQ(first_bit_diff(gr.data(), xr.data(), H), -1) << "padding row " << m << " changed";
    else
      EXPECT_LE(rel_err(gr, xr), 1e-5) << "row " << m;
  }
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
}

// Shapes the kernels refuse are refused with a clear error, not run.
TEST(RowsGemv, RejectsUnsupportedShapes) {
  lr::GemvRowsArgs a;
  a.W.rows = 16;
  a.W.cols = 100;  // not a multiple of 64
  a.W.bits = 4;
  EXPECT_FALSE(lr::gemv_rows_supported(a));
  lr::StageArgs st;
  st.K = 100;
  EXPECT_FALSE(lr::stage_supported(st));
}

}  // namespace
