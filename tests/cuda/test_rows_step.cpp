// The rows step (src/cuda/rows_step.h) as speculative verify uses it: the rows of one sequence at
// consecutive positions in one step, Gated DeltaNet in Log mode, then enqueue_rows_commit. On a real-width
// synthetic model (rows_step_exact) every row's logits must be bit for bit the single-row step's for that
// token, the state before commit untouched, and after commit(keep) the GDN / conv state and the first KV
// rows bit for bit those of a sequence that was fed the first `keep` tokens one by one. Padding rows
// (slot -1) in the same step change nothing. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_common.h"
#include "cuda/cuda_session.h"
#include "cuda/rows_step.h"
#include "cuda/seq_pool.h"
#include "cuda/synthetic_model.h"
#include "gpu_test.h"

using namespace lilac;
using namespace lilac::cuda;

namespace {

template <typename T>
std::vector<T> to_host(const T* d, size_t n) {
  std::vector<T> h(n);
  LILAC_CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

template <typename T>
T* to_device(DevAlloc& mem, const std::vector<T>& h) {
  return mem.upload(h.data(), h.size());
}

size_t differing(const void* a, const void* b, size_t bytes) {
  size_t n = 0;
  const auto* x = static_cast<const unsigned char*>(a);
  const auto* y = static_cast<const unsigned char*>(b);
  for (size_t i = 0; i < bytes; ++i) n += x[i] != y[i];
  return n;
}

// The slot's GDN and conv states and its first `rows` K rows of every attention layer, as bytes.
std::vector<unsigned char> state_bytes(const SeqState& st, int64_t rows) {
  std::vector<unsigned char> out;
  auto add = [&](const void* d, size_t n) {
    const auto h = to_host(static_cast<const unsigned char*>(d), n);
    out.insert(out.end(), h.begin(), h.end());
  };
  add(st.gdn_state, size_t(st.shape.n_gdn * st.shape.gdn_elems) * 4);
  add(st.conv_state, size_t(st.shape.n_gdn * st.shape.conv_elems) * 4);
  for (size_t i = 0; i < st.k_cache.size(); ++i) {
    add(st.k_cache[i], size_t(rows * st.shape.kv_row) * 2);
    add(st.v_cache[i], size_t(rows * st.shape.kv_row) * 2);
  }
  return out;
}

TEST(CudaRowsStep, VerifyRowsEqualSingleStepsAndCommitRollsBack) {
  NEED_GPU();
  auto m = synthetic_model(synthetic_config(4), 11);
  ASSERT_TRUE(rows_step_supported(*m, 8));
  ASSERT_TRUE(rows_step_exact(*m));
  const int64_t V = m->cfg.vocab_size, H = m->cfg.hidden_size;
  auto pool = std::make_shared<SeqPool>(*m, 64, 8);
  CudaSession ref(*m, pool), ver(*m, pool);
  const std::vector<int32_t> prompt = {11, 902, 4051, 17, 3, 1999, 250, 7};
  const std::vector<int32_t> xs = {42, 1234, 7, 4999, 300};  // the pending token and 4 drafts
  const int M = int(xs.size());
  ref.prefill(prompt, nullptr);
  ver.prefill(prompt, nullptr);
  const int64_t n0 = int64_t(prompt.size());
  const std::vector<unsigned char> before = state_bytes(ver.seq(), n0);
  // the reference: one token at a time through the single-row decode body + head
  std::vector<std::vector<float>> want;
  std::vector<std::vector<unsigned char>> want_state;
  for (int32_t x : xs) {
    ref.prefill(std::vector<int32_t>{x}, nullptr);
    want.push_back(ref.logits());
    want_state.push_back(state_bytes(ref.seq(), ref.length()));
  }
  // the verify step: M rows of ver's slot, plus padding rows around them
  DevAlloc mem;
  const RowsScratch sc = alloc_rows_scratch(mem, *m, M + 2, pool->rows_state().n_split);
  std::vector<int32_t> slot(size_t(M + 2), ver.slot()), pos(size_t(M + 2), 0), tok(size_t(M + 2), 0);
  slot.front() = -1;
  slot.back() = -1;
  for (int r = 0; r < M; ++r) {
    pos[size_t(r + 1)] = int32_t(n0 + r);
    tok[size_t(r + 1)] = xs[size_t(r)];
  }
  RowsArgs a;
  a.M = M + 2;
  a.row_slot = to_device(mem, slot);
  a.row_pos = to_device(mem, pos);
  a.tokens = to_device(mem, tok);
  a.gdn_mode = rows::GdnMode::Log;
  cudaStream_t s = nullptr;
  LILAC_CUDA_CHECK(cudaStreamCreate(&s));
  enqueue_rows_step(*m, pool->rows_state(), sc, a, s);
  LILAC_CUDA_CHECK(cudaStreamSynchronize(s));
  const std::vector<float> got = to_host(sc.logits, size_t(M + 2) * size_t(V));
  for (int r = 0; r < M; ++r) {
    const float* row = got.data() + size_t(r + 1) * size_t(V);
    EXPECT_EQ(differing(row, want[size_t(r)].data(), size_t(V) * 4), 0u) << "row " << r << ": logits differ";
  }
  const std::vector<float> hid = to_host(sc.h, size_t(M + 2) * size_t(H));
  EXPECT_TRUE(std::isfinite(hid[size_t(H)])) << "the first verify row's hidden (sc.h)";
  // Log mode left the recurrent and conv state as they were (the KV rows of the prompt too)
  const std::vector<unsigned char> after_log = state_bytes(ver.seq(), n0);
  EXPECT_EQ(differing(after_log.data(), before.data(), before.size()), 0u) << "Log mode changed the state";
  // commit 3 of the 5 rows: the state of a sequence fed xs[0..2]
  const int keep = 3;
  const std::vector<int32_t> seq_slot = {ver.slot()}, seq_keep = {keep};
  enqueue_rows_commit(*m, pool->rows_state(), 1, to_device(mem, seq_slot), to_device(mem, seq_keep), s);
  LILAC_CUDA_CHECK(cudaStreamSynchronize(s));
  const std::vector<unsigned char> committed = state_bytes(ver.seq(), n0 + keep);
  const std::vector<unsigned char>& w = want_state[size_t(keep - 1)];
  ASSERT_EQ(committed.size(), w.size());
  EXPECT_EQ(differing(committed.data(), w.data(), w.size()), 0u) << "state after commit(" << keep << ")";
  LILAC_CUDA_CHECK(cudaStreamDestroy(s));
}

}  // namespace
