// Time per launch of the multi-row per-sequence-state decode kernels (src/cuda/kernels/rows/
// rows_state.h) at the real model shapes: attention 16 q / 2 kv heads × 256 (rotary 64), Gated
// DeltaNet Hk 16, Hv 32, dk = dv = 128, conv kernel 4 (conv_dim 8192), embedding 248320 × 2048 4-bit.
// CUDA only (bench/CMakeLists.txt builds bench_kernels_* with the CUDA backend); without a GPU it prints a
// line and exits 0.
//   build-*/bench/bench_kernels_rows_state                               # everything
//   build-*/bench/bench_kernels_rows_state --benchmark_filter=Attention  # one family
// Method: >= 10 launches of the kernel(s) captured in one CUDA graph on a non-default stream (PDL as in
// the decode graph, like consecutive layers of a step), the graph replayed; the reported time is per
// launch (manual time from CUDA events). Every sequence of a batch has its own slot (its own cache /
// state), so the bytes read grow with M; the launches of a graph cycle through distinct pools of >= 128
// MB in all (pools_for), so caches and states come from HBM as in a decode step (the embedding: L2-warm).
// Counters: rows = M, bytes_per_second = the per-sequence cache / state bytes a launch must move at the
// minimum (attention: K + V read; GDN step: state read + written, Log mode read only; commit: read +
// written, 30 layers).
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/kernels/attention/attention.h"
#include "cuda/kernels/sampling/sampling.h"
#include "cuda/kernels/rows/rows_state.h"

namespace lc = lilac::cuda;
namespace lr = lilac::cuda::rows;

namespace {

constexpr int kCopies = 10;

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
#define CKB(x) ck((x), #x)

template <typename T>
struct Buf {
  T* p = nullptr;
  explicit Buf(size_t n, int byte = 0) {
    CKB(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
    CKB(cudaMemset(p, byte, std::max<size_t>(n, 1) * sizeof(T)));
  }
  Buf(const std::vector<T>& v) : Buf(v.size()) {
    CKB(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~Buf() { cudaFree(p); }
  Buf(const Buf&) = delete;
};

// Small deterministic fill (values only matter for not being NaN / Inf).
std::vector<float> ramp(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * float(int((i * 2654435761u) % 2001) - 1000) / 1000.f;
  return v;
}

// Distinct copies of a per-launch working set of `bytes` so that one graph cycles through >= 128 MB
// (more than the 50 MB L2): each layer's cache / state comes from HBM, as in a decode step.
int pools_for(double bytes) { return int(std::clamp(128e6 / std::max(bytes, 1.0), 1.0, 64.0) + 0.999); }

// Captures max(kCopies, copies) launches enqueue(stream, i) in a graph and times replays: seconds per
// launch per iteration.
void run_graph(benchmark::State& st, int copies, const std::function<void(cudaStream_t, int)>& enqueue) {
  copies = std::max(copies, kCopies);
  cudaStream_t s;
  CKB(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t g;
  cudaGraphExec_t ex;
  CKB(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < copies; ++i) enqueue(s, i);
  CKB(cudaStreamEndCapture(s, &g));
  CKB(cudaGraphInstantiate(&ex, g, 0));
  cudaEvent_t e0, e1;
  CKB(cudaEventCreate(&e0));
  CKB(cudaEventCreate(&e1));
  for (int i = 0; i < 5; ++i) CKB(cudaGraphLaunch(ex, s));
  CKB(cudaStreamSynchronize(s));
  for (auto _ : st) {
    CKB(cudaEventRecord(e0, s));
    CKB(cudaGraphLaunch(ex, s));
    CKB(cudaEventRecord(e1, s));
    CKB(cudaEventSynchronize(e1));
    float ms = 0.f;
    CKB(cudaEventElapsedTime(&ms, e0, e1));
    st.SetIterationTime(double(ms) / 1e3 / copies);
  }
  CKB(cudaEventDestroy(e0));
  CKB(cudaEventDestroy(e1));
  CKB(cudaGraphExecDestroy(ex));
  CKB(cudaGraphDestroy(g));
  CKB(cudaStreamDestroy(s));
}

// Rows: M / per sequences of `per` consecutive rows (verification) in slots 0, 1, ...
std::vector<int32_t> row_slots(int M, int per) {
  std::vector<int32_t> v(static_cast<size_t>(M));
  for (int r = 0; r < M; ++r) v[size_t(r)] = r / per;
  return v;
}

// ------------------------------------------------------------------------------------------------ attention
// Args: M, context (the last row of each sequence at position context - 1), rows per sequence.
void BM_RowsAttention(benchmark::State& st) {
  const int M = int(st.range(0)), per = int(st.range(2));
  const int64_t ctx = st.range(1);
  const lc::AttnDecodeShape s{16, 2, 256, 64, 1e-6f};
  const int nseq = (M + per - 1) / per;
  const int64_t kvd = int64_t(s.kv_heads) * s.head_dim, slot = ctx * kvd;
  const int n_split = int(std::min<int64_t>(lc::kAttnMaxSplit, (ctx + 31) / 32));
  const int64_t pw = int64_t(s.heads) * 2 * s.head_dim + 2 * kvd;
  const int npool = pools_for(double(nseq * slot) * 4);
  std::vector<std::unique_ptr<Buf<uint16_t>>> K, V;
  std::vector<lr::KvPool> kv;
  for (int i = 0; i < npool; ++i) {
    K.push_back(std::make_unique<Buf<uint16_t>>(size_t(nseq * slot), 0x3c));
    V.push_back(std::make_unique<Buf<uint16_t>>(size_t(nseq * slot), 0x3c));
    kv.push_back({reinterpret_cast<__nv_bfloat16*>(K.back()->p), reinterpret_cast<__nv_bfloat16*>(V.back()->p), slot});
  }
  Buf<float> proj(ramp(size_t(M * pw), 1.f)), qn(ramp(256, 0.1f)), kn(ramp(256, 0.1f)), inv(ramp(32, 0.01f));
  Buf<float> q(size_t(M) * s.heads * s.head_dim), out(size_t(M) * s.heads * s.head_dim);
  Buf<float> partial(lr::attention_rows_partial_floats(s, n_split, M));
  std::vector<int32_t> pos(static_cast<size_t>(M));
  for (int r = 0; r < M; ++r) pos[size_t(r)] = int32_t(ctx - per + r % per);
  Buf<int32_t> dslot(row_slots(M, per)), dpos(pos);
  const bool append = st.range(3) != 0;
  run_graph(st, npool, [&](cudaStream_t str, int i) {
    const lr::KvPool& p = kv[size_t(i % npool)];
    if (append) lr::attn_qk_norm_rope_append_rows(s, M, dslot.p, dpos.p, proj.p, pw, qn.p, kn.p, inv.p, q.p, p, str);
    lr::attention_rows(s, M, dslot.p, dpos.p, q.p, proj.p, pw, p, n_split, partial.p, out.p, str);
  });
  st.counters["rows"] = M;
  st.SetBytesProcessed(int64_t(st.iterations()) * nseq * ctx * kvd * 2 * 2);
}

// ------------------------------------------------------------------------------------------------ GDN
struct GdnPools {
  lr::GdnRowsShape s{16, 32, 128, 128, 4};
  lr::GdnPool pool;
  std::vector<Buf<float>*> bufs;
  std::vector<Buf<unsigned>*> syncs;
  std::vector<lr::GdnLayer> layers;
  GdnPools(int n_layers, int n_slots, int log_rows) {
    pool.state_stride = int64_t(s.Hv) * s.dk * s.dv;
    pool.conv_stride = s.conv_dim() * (s.conv_k - 1);
    pool.log_stride = lr::gdn_log_floats(s, log_rows);
    pool.log_rows = log_rows;
    for (int l = 0; l < n_layers; ++l) {
      auto* w = new Buf<float>(ramp(size_t(s.conv_dim() * s.conv_k), 0.5f));
      auto* A = new Buf<float>(ramp(size_t(s.Hv), 1.f));
      auto* S = new Buf<float>(ramp(size_t(n_slots * pool.state_stride), 0.3f));
      auto* C = new Buf<float>(ramp(size_t(n_slots * pool.conv_stride), 1.f));
      auto* L = new Buf<float>(ramp(size_t(n_slots * pool.log_stride), 1.f));
      auto* Y = new Buf<unsigned>(size_t(n_slots * s.Hk));  // conv_sync counters, zeroed
      bufs.insert(bufs.end(), {w, A, S, C, L});
      syncs.push_back(Y);
      layers.push_back({w->p, A->p, A->p, S->p, C->p, L->p, Y->p});
    }
  }
  ~GdnPools() {
    for (auto* b : bufs) delete b;
    for (auto* b : syncs) delete b;
  }
};

// Args: M, rows per sequence, mode (0 Advance, 1 Log).
void BM_RowsGdnStep(benchmark::State& st) {
  const int M = int(st.range(0)), per = int(st.range(1));
  const auto mode = st.range(2) ? lr::GdnMode::Log : lr::GdnMode::Advance;
  const int nseq = (M + per - 1) / per;
  const int npool = pools_for(double(nseq) * 2 * 2 * 1024 * 1024);  // 2 MiB of state per sequence
  GdnPools g(npool, nseq, per);
  const int64_t pw = g.s.conv_dim() + int64_t(g.s.Hv) * g.s.dv + 2 * g.s.Hv, od = int64_t(g.s.Hv) * g.s.dv;
  Buf<float> proj(ramp(size_t(M * pw), 1.f)), out(size_t(M * od)), cv(size_t(lr::gdn_conv_rows_floats(g.s, M)));
  Buf<int32_t> dslot(row_slots(M, per)), counter(1);
  run_graph(st, npool, [&](cudaStream_t str, int i) {
    lr::gdn_step_rows(g.s, g.layers[size_t(i % npool)], g.pool, M, dslot.p, proj.p, pw, out.p, od, mode, cv.p, str);
    lc::increment_i32(counter.p, str);  // the state is read before the PDL wait: never two back to back
  });
  st.counters["rows"] = M;
  st.SetBytesProcessed(int64_t(st.iterations()) * nseq * g.pool.state_stride * 4 *
                       (mode == lr::GdnMode::Advance ? 2 : 1));
}

// Args: sequences, rows kept per sequence; 30 layers in one launch.
void BM_RowsGdnCommit(benchmark::State& st) {
  const int nseq = int(st.range(0)), keep = int(st.range(1)), layers = 30;
  const int npool = pools_for(double(nseq) * layers * 2 * 1024 * 1024);
  GdnPools g(layers * npool, nseq, 4);
  std::vector<int32_t> slots(static_cast<size_t>(nseq)), keeps(size_t(nseq), keep);
  for (int i = 0; i < nseq; ++i) slots[size_t(i)] = i;
  Buf<int32_t> ds(slots), dk(keeps), counter(1);
  run_graph(st, npool, [&](cudaStream_t str, int i) {
    lr::gdn_commit_rows(g.s, g.layers.data() + layers * (i % npool), layers, g.pool, nseq, ds.p, dk.p, str);
    lc::increment_i32(counter.p, str);
  });
  st.counters["sequences"] = nseq;
  st.SetBytesProcessed(int64_t(st.iterations()) * nseq * layers * g.pool.state_stride * 4 * 2);
}

// ------------------------------------------------------------------------------------------------ embedding
void BM_RowsEmbed(benchmark::State& st) {
  const int M = int(st.range(0));
  lc::QMatrixDev E;
  E.rows = 248320;
  E.cols = 2048;
  E.bits = 4;
  E.group_size = 64;
  Buf<uint32_t> q(size_t(E.rows * E.words_per_row()));
  Buf<uint16_t> sb(size_t(E.rows * E.groups_per_row()) * 2, 0x3c);
  E.qweight = q.p;
  E.scales = reinterpret_cast<const __nv_bfloat16*>(sb.p);
  E.biases = E.scales + E.rows * E.groups_per_row();
  std::vector<int32_t> tok(static_cast<size_t>(M));
  for (int r = 0; r < M; ++r) tok[size_t(r)] = int32_t((r * 7919) % E.rows);
  Buf<int32_t> dslot(row_slots(M, 1)), dtok(tok);
  Buf<float> out(size_t(M * E.cols));
  run_graph(st, 1, [&](cudaStream_t str, int) { lr::embed_rows(E, M, dslot.p, dtok.p, nullptr, out.p, E.cols, str); });
  st.counters["rows"] = M;
}

void attention_args(benchmark::internal::Benchmark* b) {
  for (const int64_t ctx : {512, 4096, 16384}) {
    for (const int M : {1, 2, 4, 8, 16, 32, 64}) b->Args({M, ctx, 1, 0});
    for (const int M : {2, 4}) b->Args({M, ctx, M, 0});       // verification: the k + 1 rows of one sequence
    b->Args({64, ctx, 4, 0});                                 // 16 sequences verifying 4 rows each
    for (const int M : {1, 16, 64}) b->Args({M, ctx, 1, 1});  // with the q/k norm + RoPE + append
  }
  b->ArgNames({"M", "ctx", "per_seq", "append"});
}
void gdn_args(benchmark::internal::Benchmark* b) {
  for (const int M : {1, 2, 4, 8, 16, 32, 64}) b->Args({M, 1, 0});
  for (const int M : {2, 3, 4}) b->Args({M, M, 0}), b->Args({M, M, 1});  // one sequence verifying M rows
  b->Args({64, 4, 1});                                                   // 16 sequences verifying 4 rows
  b->ArgNames({"M", "per_seq", "log"});
}

BENCHMARK(BM_RowsAttention)->Apply(attention_args)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_RowsGdnStep)->Apply(gdn_args)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_RowsGdnCommit)
    ->Args({1, 1})
    ->Args({1, 4})
    ->Args({4, 4})
    ->Args({16, 4})
    ->ArgNames({"seqs", "keep"})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_RowsEmbed)->Arg(1)->Arg(16)->Arg(64)->ArgName("M")->UseManualTime()->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    std::printf("no CUDA GPU: bench_kernels_rows_state skipped (%s)\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "no device");
    return 0;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
