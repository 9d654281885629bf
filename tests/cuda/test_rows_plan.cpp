// Host-side checks (no GPU needed) of the index plans of the multi-row kernels (rows/rows_plan.h):
// the attention's (row, split) work items over one wave of W blocks — every split of every row done
// exactly once, a row's splits on distinct blocks, split y of a lone row on block y (as
// attention_decode), splits that tile [0, L) with R-row multiples — and the GDN blocks' conv channels:
// every channel written (conv state, log) by exactly one block, every block computing exactly the
// channels its step reads (q and k of its key head, v of its columns).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "cuda/kernels/rows/rows_plan.h"

namespace rp = lilac::cuda::rows::plan;

namespace {

TEST(CudaRowsPlan, AttentionItemsCoverEverySplitOnce) {
  std::mt19937 g(7);
  const int64_t lens[] = {1, 2, 63, 64, 65, 511, 512, 4097, 16390, 262144};
  for (int trial = 0; trial < 2000; ++trial) {
    const int M = 1 + int(g() % 64);
    const int W = std::vector<int>{1, 2, 7, 16, 40, 66, 128, 132}[g() % 8];
    const int R = 2 << (g() % 4);  // 2..16 rows per chunk
    const int min_rows = 4 * 8 * R;
    std::vector<int> slot(static_cast<size_t>(M));
    std::vector<int64_t> L(static_cast<size_t>(M));
    std::vector<int> first(size_t(M) + 1, 0);
    for (int r = 0; r < M; ++r) {
      slot[size_t(r)] = int(g() % 5) - 1;
      L[size_t(r)] = g() % 3 ? lens[g() % 10] : 1 + int64_t(g() % 300000);
      int nsp = 0;
      int64_t rps = 0;
      if (slot[size_t(r)] >= 0) rp::split_plan(L[size_t(r)], W, min_rows, R, nsp, rps);
      first[size_t(r) + 1] = first[size_t(r)] + nsp;
    }
    SCOPED_TRACE("trial " + std::to_string(trial) + " M " + std::to_string(M) + " W " + std::to_string(W));
    std::vector<std::vector<int>> block_of(static_cast<size_t>(M));  // [row][split] → block
    for (int r = 0; r < M; ++r) block_of[size_t(r)].assign(size_t(first[size_t(r) + 1] - first[size_t(r)]), -1);
    for (int b = 0; b < W; ++b) {
      int row = 0;
      for (int item = b; item < first[size_t(M)]; item += W) {
        row = rp::item_row(first.data(), item, row);
        ASSERT_LT(row, M);
        ASSERT_GE(slot[size_t(row)], 0) << "an item of a padding row";
        int& at = block_of[size_t(row)][size_t(item - first[size_t(row)])];
        EXPECT_EQ(at, -1) << "split done twice";
        at = b;
      }
    }
    for (int r = 0; r < M; ++r) {
      const auto& bl = block_of[size_t(r)];
      if (slot[size_t(r)] < 0) {
        EXPECT_TRUE(bl.empty());
        continue;
      }
      int nsp = 0;
      int64_t rps = 0;
      const int64_t n = L[size_t(r)];
      rp::split_plan(n, W, min_rows, R, nsp, rps);
      ASSERT_EQ(int(bl.size()), nsp) << "row " << r;
      EXPECT_EQ(std::count(bl.begin(), bl.end(), -1), 0) << "a split of row " << r << " not done";
      EXPECT_EQ(std::set<int>(bl.begin(), bl.end()).size(), size_t(nsp))
          << "two splits of row " << r << " on one block";
      EXPECT_LE(nsp, W);
      EXPECT_EQ(rps % R, 0);
      EXPECT_LT((nsp - 1) * rps, n) << "an empty split";
      EXPECT_GE(nsp * rps, n) << "rows not covered";
      EXPECT_LE(nsp, (n + min_rows - 1) / min_rows) << "more splits than the min_rows rule allows";
      if (M == 1) {
        for (int s2 = 0; s2 < nsp; ++s2) EXPECT_EQ(bl[size_t(s2)], s2) << "a lone row: split y on block y";
      }
    }
  }
}

TEST(CudaRowsPlan, GdnChannelsHaveOneWriterAndEveryBlockItsInputs) {
  struct S {
    int Hk, Hv, dk, dv;
  };
  for (const S s : {S{16, 32, 128, 128}, S{1, 2, 32, 48}, S{2, 8, 32, 52}, S{1, 3, 96, 20}, S{1, 4, 200, 64},
                    S{2, 2, 256, 128}, S{2, 6, 48, 7}, S{1, 1, 256, 33}, S{4, 8, 128, 128}}) {
    SCOPED_TRACE("Hk " + std::to_string(s.Hk) + " Hv " + std::to_string(s.Hv) + " dk " + std::to_string(s.dk) + " dv " +
                 std::to_string(s.dv));
    const int conv_dim = 2 * s.Hk * s.dk + s.Hv * s.dv;
    const int slices = (s.dv + rp::kGdnSliceCols - 1) / rp::kGdnSliceCols;
    std::vector<int> writers(size_t(conv_dim), 0);
    for (int h = 0; h < s.Hv; ++h)
      for (int y = 0; y < slices; ++y) {
        const int kh = h / (s.Hv / s.Hk);
        std::set<int> got, want;
        for (int c = 0; c < 2 * 256 + rp::kGdnSliceCols + 128; ++c) {  // beyond the block's channels: -1
          bool own = false;
          const int ch = rp::gdn_block_channel(s.Hk, s.Hv, s.dk, s.dv, h, y, c, &own);
          if (ch < 0) {
            EXPECT_FALSE(own);
            continue;
          }
          ASSERT_LT(c, 2 * s.dk + rp::kGdnSliceCols) << "channel index past the block's shared buffer";
          ASSERT_LT(ch, conv_dim);
          EXPECT_TRUE(got.insert(ch).second) << "channel computed twice in one block";
          writers[size_t(ch)] += own;
          if (c < s.dk)
            EXPECT_EQ(ch, kh * s.dk + c) << "q";
          else if (c < 2 * s.dk)
            EXPECT_EQ(ch, s.Hk * s.dk + kh * s.dk + c - s.dk) << "k";
          else
            EXPECT_EQ(ch, 2 * s.Hk * s.dk + h * s.dv + y * rp::kGdnSliceCols + c - 2 * s.dk) << "v";
        }
        for (int i = 0; i < s.dk; ++i) want.insert(kh * s.dk + i), want.insert(s.Hk * s.dk + kh * s.dk + i);
        for (int col = y * rp::kGdnSliceCols; col < std::min(s.dv, (y + 1) * rp::kGdnSliceCols); ++col)
          want.insert(2 * s.Hk * s.dk + h * s.dv + col);
        EXPECT_EQ(got, want) << "block (" << h << ", " << y << ")";
      }
    for (int ch = 0; ch < conv_dim; ++ch) EXPECT_EQ(writers[size_t(ch)], 1) << "writers of channel " << ch;
  }
}

}  // namespace
