#include "cuda/verify_step.h"

#include <algorithm>
#include <cstddef>
#include <vector>

#include "core/error.h"
#include "cuda/cuda_common.h"
#include "cuda/graph_capture.h"
#include "cuda/kernels/launch.cuh"
#include "cuda/kernels/rows/rows_mm.h"
#include "cuda/rows_step.h"

namespace lilac::cuda {
namespace {
using namespace dev;

constexpr int kRows = kMaxVerifyDrafts + 1;

// Row 0's token is the pending one; row i sits at position *pos + i.
__global__ void verify_prep_kernel(const int32_t* pending, const int32_t* pos, int M, int32_t* toks,
                                   int32_t* row_pos) {
  pdl_wait();
  pdl_trigger();
  const int i = int(threadIdx.x);
  if (i < M) row_pos[i] = *pos + i;
  if (i == 0) toks[0] = *pending;
}

// The acceptance of n drafts (toks[1..n]) against the choices of rows 0..n; the sampler's effects on the
// sequence (penalty counts, step) for rows 0..m only: undone for the rows after the first rejection when
// the rows were sampled one by one, done for the kept rows when they were sampled in one pass; the
// sequence's pending token and position move on. A row with no choice (results[i].token < 0: its chosen id is a
// stand-in 0, never counted) rejects its draft: it is the last row kept, and the host throws for it.
__global__ void verify_accept_kernel(int n, bool one_pass, const int32_t* toks, const int32_t* chosen,
                                     const SampleResult* results, int32_t* counts, SampleParamsDev* params,
                                     int32_t* token, int32_t* pos, int32_t* keep, int32_t* accepted) {
  pdl_wait();
  pdl_trigger();
  if (threadIdx.x != 0) return;
  int m = 0;
  while (m < n && results[m].token >= 0 && chosen[m] == toks[m + 1]) ++m;
  if (one_pass) {
    for (int i = 0; i <= m; ++i)
      if (results[i].token >= 0) counts[chosen[i]] += 1;
    params->step += static_cast<unsigned long long>(m + 1);
  } else {
    for (int i = m + 1; i <= n; ++i)
      if (results[i].token >= 0) counts[chosen[i]] -= 1;
    params->step -= static_cast<unsigned long long>(n - m);
  }
  *token = chosen[m];
  *pos = *pos + m + 1;
  *keep = m + 1;
  *accepted = m;
}

// The logits of the last kept row become the sequence's current logits.
__global__ void verify_logits_kernel(const float* rows, int64_t vocab, const int32_t* accepted, float* out) {
  pdl_wait();
  pdl_trigger();
  const float* src = rows + int64_t(*accepted) * vocab;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < vocab; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = src[i];
}

}  // namespace

bool verify_rows_ok(const DevModel& m) { return rows_step_supported(m, kRows) && rows_step_exact(m); }

struct VerifyStep::Impl {
  const DevModel& m;
  const SeqState& st;
  const DecodeScratch& dsc;
  RowsState rs;
  RowsScratch sc;
  int32_t* toks = nullptr;     // [kRows]: row i's token (toks[1..] the drafts)
  int32_t* row_slot = nullptr;  // [kRows] zeros: every row is slot 0 (the sequence's own state)
  int32_t* row_pos = nullptr;   // [kRows]
  int32_t* chosen = nullptr;    // [kRows]
  int32_t* keep = nullptr;      // [1]
  VerifyOut* out = nullptr;     // the device's copy of what run() hands the host: accepted, results
  cudaGraphExec_t graphs[2][kRows] = {};  // graphs[one_pass][n]: n drafts
  // The GDN commit's own stream and graph (the same for every n: `keep` is device memory), the events
  // that order it after the verify and the sequence's next work after it, and whether that is owed.
  cudaStream_t side = nullptr;
  cudaEvent_t verified = nullptr, committed = nullptr;
  cudaGraphExec_t commit_graph = nullptr;
  bool owed = false;

  Impl(const DevModel& m_, const SeqState& st_, const DecodeScratch& dsc_) : m(m_), st(st_), dsc(dsc_) {}
  ~Impl() {
    if (side) cudaStreamSynchronize(side);
    drop_graphs();
    if (verified) cudaEventDestroy(verified);
    if (committed) cudaEventDestroy(committed);
    if (side) cudaStreamDestroy(side);
  }
  void drop_graphs() {
    for (auto& row : graphs)
      for (cudaGraphExec_t& g : row)
        if (g) cudaGraphExecDestroy(g), g = nullptr;
    if (commit_graph) cudaGraphExecDestroy(commit_graph), commit_graph = nullptr;
  }
  void enqueue(int n, bool one_pass, cudaStream_t s);
  void bind();  // rs's views of st
};

void VerifyStep::Impl::bind() {
  rs.kv.clear();
  for (size_t i = 0; i < st.k_cache.size(); ++i)
    rs.kv.push_back({st.k_cache[i], st.v_cache[i], st.max_len * st.shape.kv_row});
  for (size_t j = 0; j < rs.gdn.size(); ++j) {
    rs.gdn[j].state = st.gdn(int(j));
    rs.gdn[j].conv_state = st.conv(int(j));
  }
}

VerifyStep::VerifyStep(const DevModel& m, const SeqState& st, const DecodeScratch& dsc, DevAlloc& mem)
    : p_(std::make_unique<Impl>(m, st, dsc)) {
  LILAC_CHECK(verify_rows_ok(m), "cuda verify: the rows step does not take this model exactly");
  const ModelConfig& c = m.cfg;
  Impl& p = *p_;
  // The sequence's state as slot 0 of one-slot pools (strides are never used with slot 0), with its own
  // GDN logs and conv_sync counters.
  const int64_t log_floats = rows::gdn_log_floats(rows_gdn_shape(c), kRows);
  p.rs.gdn_pool.state_stride = st.shape.gdn_elems;
  p.rs.gdn_pool.conv_stride = st.shape.conv_elems;
  p.rs.gdn_pool.log_stride = log_floats;
  p.rs.gdn_pool.log_rows = kRows;
  for (const DevLayer& L : m.layers) {
    if (L.attn) continue;
    rows::GdnLayer g;
    g.conv_w = L.conv_w;
    g.A_log = L.A_log;
    g.dt_bias = L.dt_bias;
    g.log = static_cast<float*>(mem.get(size_t(log_floats) * 4));
    g.conv_sync = static_cast<unsigned*>(mem.get(size_t(c.linear_num_key_heads) * sizeof(unsigned)));
    LILAC_CUDA_CHECK(cudaMemset(g.conv_sync, 0, size_t(c.linear_num_key_heads) * sizeof(unsigned)));
    p.rs.gdn.push_back(g);
  }
  LILAC_CHECK(int(p.rs.gdn.size()) <= rows::kGdnMaxLayers, "cuda verify: too many Gated DeltaNet layers");
  p.bind();
  p.rs.n_split = dsc.n_split;
  p.sc = alloc_rows_scratch(mem, m, kRows, p.rs.n_split);
  p.toks = static_cast<int32_t*>(mem.get(kRows * 4));
  p.row_slot = static_cast<int32_t*>(mem.get(kRows * 4));
  p.row_pos = static_cast<int32_t*>(mem.get(kRows * 4));
  p.chosen = static_cast<int32_t*>(mem.get(kRows * 4));
  p.keep = static_cast<int32_t*>(mem.get(4));
  p.out = static_cast<VerifyOut*>(mem.get(sizeof(VerifyOut)));
  LILAC_CUDA_CHECK(cudaMemset(p.row_slot, 0, kRows * 4));  // read before the GDN kernels' pdl_wait: set once
  LILAC_CUDA_CHECK(cudaStreamCreateWithFlags(&p.side, cudaStreamNonBlocking));
  LILAC_CUDA_CHECK(cudaEventCreateWithFlags(&p.verified, cudaEventDisableTiming));
  LILAC_CUDA_CHECK(cudaEventCreateWithFlags(&p.committed, cudaEventDisableTiming));
  LILAC_CUDA_CHECK(cudaDeviceSynchronize());
}

VerifyStep::~VerifyStep() = default;

void VerifyStep::rebind() {
  LILAC_CUDA_CHECK(cudaStreamSynchronize(p_->side));
  p_->owed = false;
  p_->drop_graphs();
  p_->bind();
}

int32_t* VerifyStep::drafts() const { return p_->toks + 1; }
const int32_t* VerifyStep::tokens() const { return p_->toks; }
const float* VerifyStep::hidden() const { return p_->sc.h; }

void VerifyStep::Impl::enqueue(int n, bool one_pass, cudaStream_t s) {
  const int M = n + 1;
  const int64_t V = m.cfg.vocab_size;
  launch_pdl(verify_prep_kernel, dim3(1), dim3(32), 0, s, static_cast<const int32_t*>(st.token),
             static_cast<const int32_t*>(st.pos), M, toks, row_pos);
  LILAC_CUDA_LAUNCH_CHECK();
  RowsArgs a;
  a.M = M;
  a.row_slot = row_slot;
  a.row_pos = row_pos;
  a.tokens = toks;
  a.gdn_mode = rows::GdnMode::Log;
  enqueue_rows_body(m, rs, sc, a, s);
  enqueue_rows_head(m, sc, a, s);
  if (one_pass) {  // no penalties: row i's choice depends on the step only (params.step + i)
    rows::SampleRowsArgs r;
    r.logits = sc.logits;
    r.vocab = V;
    r.M = M;
    r.one_sequence = true;
    r.params = st.params;
    r.counts = st.counts;
    r.prompt_mask = st.prompt_mask;
    r.token_by_row = chosen;
    r.results = out->results;
    r.scratch = sc.sample;
    rows::sample_rows(r, s);
  } else {
    for (int i = 0; i < M; ++i)  // in order: row i sees the counts and the step after rows 0..i-1
      sample_token(sc.logits + int64_t(i) * V, V, st.params, st.counts, st.prompt_mask, dsc.sample_scratch,
                   chosen + i, out->results + i, s);
  }
  launch_pdl(verify_accept_kernel, dim3(1), dim3(32), 0, s, n, one_pass, static_cast<const int32_t*>(toks),
             static_cast<const int32_t*>(chosen), static_cast<const SampleResult*>(out->results), st.counts,
             st.params, st.token, st.pos, keep, &out->accepted);
  LILAC_CUDA_LAUNCH_CHECK();
  const int blocks = int(std::min<int64_t>(64, (V + 255) / 256));
  launch_pdl(verify_logits_kernel, dim3(blocks), dim3(256), 0, s, static_cast<const float*>(sc.logits), V,
             static_cast<const int32_t*>(&out->accepted), st.logits);
  LILAC_CUDA_LAUNCH_CHECK();
}

void VerifyStep::run(int n, bool one_pass, VerifyOut* out, cudaStream_t s) {
  LILAC_CHECK(n >= 1 && n <= kMaxVerifyDrafts, "cuda verify: draft count out of range");
  Impl& p = *p_;
  cudaGraphExec_t& g = p.graphs[one_pass ? 1 : 0][n];
  if (!g) g = capture_graph(s, [&] { p.enqueue(n, one_pass, s); });
  LILAC_CUDA_CHECK(cudaGraphLaunch(g, s));
  // One copy: the accepted count and the n + 1 rows' results.
  LILAC_CUDA_CHECK(cudaMemcpyAsync(out, p.out, offsetof(VerifyOut, results) + sizeof(SampleResult) * size_t(n + 1),
                                   cudaMemcpyDeviceToHost, s));
  if (p.rs.gdn.empty()) return;
  // The GDN commit on the side stream: off the path to the host's results and the head's drafts.
  if (!p.commit_graph)
    p.commit_graph = capture_graph(p.side, [&] { enqueue_rows_commit(p.m, p.rs, 1, p.row_slot, p.keep, p.side); });
  LILAC_CUDA_CHECK(cudaEventRecord(p.verified, s));
  LILAC_CUDA_CHECK(cudaStreamWaitEvent(p.side, p.verified, 0));
  LILAC_CUDA_CHECK(cudaGraphLaunch(p.commit_graph, p.side));
  LILAC_CUDA_CHECK(cudaEventRecord(p.committed, p.side));
  p.owed = true;
}

void VerifyStep::join(cudaStream_t s) {
  Impl& p = *p_;
  if (!p.owed) return;
  LILAC_CUDA_CHECK(cudaStreamWaitEvent(s, p.committed, 0));
  p.owed = false;
}

}  // namespace lilac::cuda
