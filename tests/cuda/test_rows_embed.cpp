// Multi-row embedding gather (embed_rows, src/cuda/kernels/rows/): per row the token chosen through the
// index array (tokens[tok_idx[r]]) or the row itself (tok_idx null), 4- and 8-bit embeddings, padding
// rows untouched (NaN-poisoned output stays so), an out-of-range token gives a NaN row, rows
// bitwise equal to embed_gather of the same token and within 1e-6 of the CPU's embed_row; a captured
// graph replayed after the token cells change.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/ops.h"
#include "cuda/kernels/decode.h"
#include "cuda/kernels/rows/rows_state.h"
#include "decode_test_util.h"

using namespace lilac;
namespace lc = lilac::cuda;
namespace lr = lilac::cuda::rows;

namespace {

using namespace lilac::cuda::testing;

TEST(CudaRowsEmbed, GathersRowsLikeEmbedGather) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  for (const int bits : {4, 8}) {
    SCOPED_TRACE("bits " + std::to_string(bits));
    const int64_t vocab = 300, cols = 576, stride = cols + 20;
    HostQ E(r, vocab, cols, bits);
    DevQ dE(E);
    // token cells: [per-slot pending tokens (8) | draft cells (8)]
    std::vector<int32_t> cells(16);
    for (auto& t : cells) t = int32_t(r.word() % vocab);
    cells[9] = int32_t(vocab);  // invalid: a NaN row
    const std::vector<int32_t> slot{2, -1, 5, 5, 5, 0, -1, 7};
    const std::vector<int32_t> idx{2, 3, 5, 8, 10, 0, 1, 9};
    const int M = int(slot.size());
    Dev<int32_t> dcells(cells), dslot(slot), didx(idx);
    Dev<float> out(size_t(M * stride)), out2(size_t(M * stride)), one(static_cast<size_t>(cols));
    for (const bool indexed : {true, false}) {
      SCOPED_TRACE(indexed ? "tok_idx" : "row tokens");
      out.poison();
      lr::embed_rows(dE.d, M, dslot.p, dcells.p, indexed ? didx.p : nullptr, out.p, stride, nullptr);
      CK(cudaDeviceSynchronize());
      const auto got = out.get();
      for (int i = 0; i < M; ++i) {
        SCOPED_TRACE("row " + std::to_string(i));
        const float* g = got.data() + i * stride;
        if (slot[size_t(i)] < 0) {
          const auto* b = reinterpret_cast<const unsigned char*>(g);
          EXPECT_TRUE(std::all_of(b, b + stride * 4, [](unsigned char c) { return c == 0xff; }));
          continue;
        }
        const int32_t t = cells[size_t(indexed ? idx[size_t(i)] : i)];
        if (t >= vocab) {
          EXPECT_TRUE(std::all_of(g, g + cols, [](float v) { return std::isnan(v); }));
          continue;
        }
        std::vector<float> ref(static_cast<size_t>(cols));
        cpu::embed_row(E.m, t, ref.data());
        EXPECT_LE(rel_err(std::vector<float>(g, g + cols), ref), 1e-6);
        Dev<int32_t> tok(std::vector<int32_t>{t});
        one.poison();
        lc::embed_gather(dE.d, tok.p, one.p, nullptr);
        CK(cudaDeviceSynchronize());
        EXPECT_EQ(std::memcmp(one.get().data(), g, size_t(cols) * 4), 0) << "differs from embed_gather";
        const auto* b = reinterpret_cast<const unsigned char*>(g + cols);  // the stride gap: untouched
        EXPECT_TRUE(std::all_of(b, b + (stride - cols) * 4, [](unsigned char c) { return c == 0xff; }));
      }
    }
    // graph replay after the cells change (tokens read from device memory at each replay)
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    lr::embed_rows(dE.d, M, dslot.p, dcells.p, didx.p, out2.p, stride, st);
    CK(cudaStreamEndCapture(st, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    for (auto& t : cells) t = int32_t(r.word() % vocab);
    dcells.set(cells);
    out2.poison();
    CK(cudaGraphLaunch(exec, st));
    CK(cudaStreamSynchronize(st));
    const auto g2 = out2.get();
    for (int i = 0; i < M; ++i) {
      if (slot[size_t(i)] < 0) continue;
      std::vector<float> ref(static_cast<size_t>(cols));
      cpu::embed_row(E.m, cells[size_t(idx[size_t(i)])], ref.data());
      EXPECT_LE(rel_err(std::vector<float>(g2.data() + i * stride, g2.data() + i * stride + cols), ref), 1e-6)
          << "replay, row " << i;
    }
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    CK(cudaStreamDestroy(st));
  }
}

}  // namespace
