#include "cuda/batch_step.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "cuda/cuda_common.h"
#include "cuda/decode_step.h"

namespace lilac::cuda {

constexpr int kRows = rows::kMaxRows;

BatchStep::BatchStep(const DevModel& m, const SeqPool& pool) : m_(m), pool_(pool) {
  LILAC_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  sc_ = alloc_rows_scratch(mem_, m_, kRows, pool.rows_state().n_split);
  d_rows_ = static_cast<int32_t*>(mem_.get(3 * kRows * 4));
  LILAC_CUDA_CHECK(cudaMallocHost(&h_rows_, 4 * kRows * 4));
  LILAC_CUDA_CHECK(cudaMallocHost(&h_res_, kRows * sizeof(SampleResult)));
  graphs_.assign(kRows + 1, nullptr);
  pgraphs_.assign(kRows + 1, nullptr);
  gen_ = pool.generation();
}

BatchStep::~BatchStep() {
  drop_graphs();
  if (h_rows_) cudaFreeHost(h_rows_);
  if (h_res_) cudaFreeHost(h_res_);
  cudaStreamDestroy(stream_);
}

void BatchStep::drop_graphs() {
  for (auto* v : {&graphs_, &pgraphs_})
    for (auto& g : *v)
      if (g) {
        cudaGraphExecDestroy(g);
        g = nullptr;
      }
}

void BatchStep::check_generation() {
  if (pool_.generation() != gen_) {  // the pool's arrays moved: the captured pointers are stale
    drop_graphs();
    gen_ = pool_.generation();
  }
}

cudaGraphExec_t BatchStep::graph(int M) {
  check_generation();
  cudaGraphExec_t& g = graphs_[size_t(M)];
  if (!g) {
    const RowsState& st = pool_.rows_state();
    RowsArgs a;
    a.M = M;
    a.row_slot = d_rows_;
    a.row_pos = d_rows_ + kRows;
    a.tokens = st.token;
    a.tok_idx = d_rows_;  // each slot's pending token cell
    a.gdn_mode = rows::GdnMode::Advance;
    a.sample = true;
    a.finish = true;
    g = capture_graph(stream_, [&] { enqueue_rows_step(m_, st, sc_, a, stream_); });
  }
  return g;
}

cudaGraphExec_t BatchStep::prefill_graph(int n) {
  check_generation();
  cudaGraphExec_t& g = pgraphs_[size_t(n)];
  if (!g) {
    RowsArgs a;
    a.M = n;
    a.row_slot = d_rows_;
    a.row_pos = d_rows_ + kRows;
    a.tokens = d_rows_ + 2 * kRows;
    a.gdn_mode = rows::GdnMode::Advance;
    g = capture_graph(stream_, [&] { enqueue_rows_body(m_, pool_.rows_state(), sc_, a, stream_); });
  }
  return g;
}

void BatchStep::prefill(int slot, int32_t pos, std::span<const int32_t> tokens, cudaEvent_t ready,
                        const HiddenSink& hiddens) {
  const int n = int(tokens.size());
  LILAC_CHECK(n >= 1 && n <= kRows, "cuda batch step: bad prefill row count");
  LILAC_CHECK(slot >= 0 && slot < pool_.capacity(), "cuda batch step: bad prefill slot");
  cudaGraphExec_t g = prefill_graph(n);
  for (int r = 0; r < n; ++r) {
    h_rows_[r] = slot;
    h_rows_[kRows + r] = pos + r;
    h_rows_[3 * kRows + r] = tokens[size_t(r)];
  }
  if (ready) LILAC_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready, 0));
  LILAC_CUDA_CHECK(cudaMemcpyAsync(d_rows_, h_rows_, 2 * kRows * 4, cudaMemcpyHostToDevice, stream_));
  LILAC_CUDA_CHECK(cudaMemcpyAsync(d_rows_ + 2 * kRows, h_rows_ + 3 * kRows, size_t(n) * 4, cudaMemcpyHostToDevice,
                                   stream_));
  LILAC_CUDA_CHECK(cudaGraphLaunch(g, stream_));
  if (hiddens) hiddens(stream_, sc_.h, m_.cfg.hidden_size);
  LILAC_CUDA_CHECK(cudaStreamSynchronize(stream_));
  ++prefills_;
}

void BatchStep::head_rows(const float* x, int64_t ldx, int M, cudaEvent_t ready, float* host) {
  LILAC_CHECK(M >= 1 && M <= kRows && m_.lm_tiles, "cuda batch step: bad head rows");
  const int64_t V = m_.cfg.vocab_size;
  if (ready) LILAC_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready, 0));
  enqueue_lm_head(m_, x, ldx, M, nullptr, m_.final_norm, sc_.logits, V, sc_.digits, stream_);
  LILAC_CUDA_CHECK(cudaMemcpyAsync(host, sc_.logits, size_t(M) * size_t(V) * 4, cudaMemcpyDeviceToHost, stream_));
  LILAC_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void BatchStep::prepare(int M) {
  LILAC_CHECK(M >= 1 && M <= kRows, "cuda batch step: bad row count");
  graph(M);
}

void BatchStep::run(std::span<const BatchRow> rows, SampleResult* out, const HiddenSink& hiddens) {
  const int M = int(rows.size());
  LILAC_CHECK(M >= 1 && M <= kRows, "cuda batch step: bad row count");
  cudaGraphExec_t g = graph(M);  // captured before anything else is enqueued on the stream
  const int cap = pool_.capacity();
  int32_t* on = h_rows_ + 2 * kRows;
  std::fill(on, on + cap, 0);
  for (int r = 0; r < M; ++r) {
    h_rows_[r] = rows[size_t(r)].slot;
    h_rows_[kRows + r] = rows[size_t(r)].pos;
    on[rows[size_t(r)].slot] = rows[size_t(r)].mask_on ? 1 : 0;
    if (rows[size_t(r)].ready) LILAC_CUDA_CHECK(cudaStreamWaitEvent(stream_, rows[size_t(r)].ready, 0));
  }
  LILAC_CUDA_CHECK(cudaMemcpyAsync(d_rows_, h_rows_, 2 * kRows * 4, cudaMemcpyHostToDevice, stream_));
  LILAC_CUDA_CHECK(cudaMemcpyAsync(const_cast<int32_t*>(pool_.rows_state().allowed_on), on, size_t(cap) * 4,
                                   cudaMemcpyHostToDevice, stream_));
  LILAC_CUDA_CHECK(cudaGraphLaunch(g, stream_));
  if (hiddens) hiddens(stream_, sc_.h, m_.cfg.hidden_size);
  LILAC_CUDA_CHECK(cudaMemcpyAsync(h_res_, sc_.results, size_t(M) * sizeof(SampleResult), cudaMemcpyDeviceToHost,
                                   stream_));
  LILAC_CUDA_CHECK(cudaStreamSynchronize(stream_));
  std::copy(h_res_, h_res_ + M, out);
  ++steps_;
}

}  // namespace lilac::cuda
