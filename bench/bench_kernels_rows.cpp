// Google Benchmark of the multi-row decode kernels (src/cuda/kernels/rows/rows_mm.h) at the model's shapes
// for M = 1, 2, 4, 8, 16, 32, 64 rows, beside today's single-row kernels (M = 1). Each case is a CUDA graph of
// back-to-back PDL launches over rotating copies of the weights (more bytes than the L2 holds); the time is
// per launch (or per MoE layer), from CUDA events. Counters: us, GB/s against the bytes the kernel must move
// at least (each weight it needs once, each input and output once; MoE: the experts the M rows select), and
// the fraction of 4.3 TB/s. Without a GPU it prints a line and exits 0.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda/kernels/gemv/gemv.h"
#include "cuda/kernels/sampling/sampling.h"
#include "cuda/kernels/digits/digits.h"
#include "cuda/kernels/rows/rows_mm.h"

namespace lc = lilac::cuda;
namespace lr = lilac::cuda::rows;
namespace ld = lilac::cuda::digits;

namespace {

constexpr double kPeakGBs = 4300.0;
const int kMs[] = {1, 2, 4, 8, 16, 32, 64};

#define BCK(x)                                                                     \
  do {                                                                             \
    cudaError_t e_ = (x);                                                          \
    if (e_ != cudaSuccess) {                                                       \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)

struct Buf {
  void* p = nullptr;
  explicit Buf(size_t n) { BCK(cudaMalloc(&p, std::max<size_t>(n, 16))); }
  ~Buf() { cudaFree(p); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

std::mt19937_64 g_rng(12345);
void upload_words(void* dst, size_t bytes) {
  std::vector<uint64_t> h((bytes + 7) / 8);
  for (auto& w : h) w = g_rng();
  BCK(cudaMemcpy(dst, h.data(), bytes, cudaMemcpyHostToDevice));
}
void upload_floats(float* dst, size_t n, float sd) {
  std::vector<float> h(n);
  std::normal_distribution<float> nd(0.f, sd);
  for (auto& v : h) v = nd(g_rng);
  BCK(cudaMemcpy(dst, h.data(), n * 4, cudaMemcpyHostToDevice));
}
uint16_t bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}
// scales / biases that keep the products in a sane range (as the tests' HostQ)
void upload_scales(void* s, void* b, size_t n, int64_t cols, int bits) {
  std::vector<uint16_t> hs(n), hb(n);
  std::uniform_real_distribution<float> u(0.5f, 1.5f);
  const float levels = float((1 << bits) - 1);
  for (size_t i = 0; i < n; ++i) {
    const float sc = u(g_rng) / (std::sqrt(float(cols)) * levels * 0.29f);
    hs[i] = bf16(sc);
    hb[i] = bf16(-sc * levels / 2);
  }
  BCK(cudaMemcpy(s, hs.data(), n * 2, cudaMemcpyHostToDevice));
  BCK(cudaMemcpy(b, hb.data(), n * 2, cudaMemcpyHostToDevice));
}

// `n` matrices of one shape back to back (copies for rotation, or experts).
struct Mats {
  int64_t rows, cols;
  int bits, n;
  std::unique_ptr<Buf> q, s, b;
  Mats(int64_t r, int64_t c, int bt, int count) : rows(r), cols(c), bits(bt), n(count) {
    const size_t qb = size_t(r) * c * bt / 8, sb = size_t(r) * (c / 64);
    q = std::make_unique<Buf>(qb * count);
    s = std::make_unique<Buf>(sb * 2 * count);
    b = std::make_unique<Buf>(sb * 2 * count);
    upload_words(q->p, qb);  // one random matrix, copied
    upload_scales(s->p, b->p, sb, c, bt);
    for (int i = 1; i < count; ++i) {
      BCK(cudaMemcpy(q->as<char>() + qb * i, q->p, qb, cudaMemcpyDeviceToDevice));
      BCK(cudaMemcpy(s->as<char>() + sb * 2 * i, s->p, sb * 2, cudaMemcpyDeviceToDevice));
      BCK(cudaMemcpy(b->as<char>() + sb * 2 * i, b->p, sb * 2, cudaMemcpyDeviceToDevice));
    }
  }
  lc::QMatrixDev get(int i) const {
    lc::QMatrixDev m;
    m.rows = rows;
    m.cols = cols;
    m.bits = bits;
    m.group_size = 64;
    const size_t qb = size_t(rows) * cols * bits / 8, sb = size_t(rows) * (cols / 64);
    m.qweight = reinterpret_cast<const uint32_t*>(q->as<char>() + qb * i);
    m.scales = reinterpret_cast<const __nv_bfloat16*>(s->as<char>() + sb * 2 * i);
    m.biases = reinterpret_cast<const __nv_bfloat16*>(b->as<char>() + sb * 2 * i);
    return m;
  }
  double bytes() const { return double(rows) * cols * bits / 8 + double(rows) * (cols / 64) * 4; }
};

// µs per body(i) call: `calls` calls captured in one graph, replayed per benchmark iteration.
void run_graph(benchmark::State& state, int calls, const std::function<void(cudaStream_t, int)>& body) {
  cudaStream_t s;
  BCK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  BCK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  for (int i = 0; i < calls; ++i) body(s, i);
  BCK(cudaStreamEndCapture(s, &g));
  BCK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t e0, e1;
  BCK(cudaEventCreate(&e0));
  BCK(cudaEventCreate(&e1));
  BCK(cudaGraphLaunch(ge, s));
  BCK(cudaStreamSynchronize(s));
  double total_us = 0;
  int64_t n = 0;
  for (auto _ : state) {
    BCK(cudaEventRecord(e0, s));
    BCK(cudaGraphLaunch(ge, s));
    BCK(cudaEventRecord(e1, s));
    BCK(cudaEventSynchronize(e1));
    float ms = 0;
    BCK(cudaEventElapsedTime(&ms, e0, e1));
    state.SetIterationTime(ms / 1e3 / calls);
    total_us += ms * 1e3 / calls;
    ++n;
  }
  state.counters["us"] = n ? total_us / n : 0;
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
}
void set_bw(benchmark::State& state, double bytes) {
  const double us = state.counters["us"];
  state.counters["MB"] = bytes / 1e6;
  state.counters["GB/s"] = us > 0 ? bytes / us / 1e3 : 0;
  state.counters["of_peak"] = us > 0 ? bytes / us / 1e3 / kPeakGBs : 0;
}

// ------------------------------------------------------------------------------------------------ dense
struct DenseShape {
  const char* name;
  int64_t rows, cols;
  int bits;
  lc::Prologue pro;
  bool acc;
};
const DenseShape kDense[] = {
    {"gdn_in_proj", 12352, 2048, 4, lc::Prologue::RmsNorm, false},
    {"gdn_out_proj", 2048, 4096, 4, lc::Prologue::GatedHeadNorm, true},
    {"attn_qkv", 9216, 2048, 4, lc::Prologue::RmsNorm, false},
    {"attn_o_proj", 2048, 4096, 4, lc::Prologue::None, true},
    {"router", 257, 2048, 8, lc::Prologue::RmsNorm, false},
    {"lm_head", 248320, 2048, 4, lc::Prologue::RmsNorm, false},
};

struct DenseCtx {
  const DenseShape& sh;
  Mats W;
  size_t partial_floats;  // the slice kernel's partials at 64 rows
  Buf x, z, y, nw, frag, fragw, meta, partials;  // fragw: the wgmma rows GEMV's input layout (frag4w)
  static int copies(const DenseShape& sh) {
    const double b = double(sh.rows) * sh.cols * sh.bits / 8;
    return int(std::clamp(240e6 / b, 1.0, 1024.0));
  }
  explicit DenseCtx(const DenseShape& s)
      : sh(s), W(s.rows, s.cols, s.bits, copies(s)), partial_floats(lr::gemv_rows_partial_floats(W.get(0), 64)),
        x(64 * s.cols * 4), z(64 * s.cols * 4), y(64 * s.rows * 4),
        nw(s.cols * 4), frag(lr::frag_row_bytes(s.cols) * 64), fragw(lr::frag_row_bytes(s.cols) * 64), meta(lr::meta_row_count(s.cols) * 8 * 64),
        partials(std::max<size_t>(partial_floats, 1) * 4) {
    upload_floats(x.as<float>(), 64 * s.cols, 1.f);
    upload_floats(z.as<float>(), 64 * s.cols, 1.f);
    upload_floats(y.as<float>(), 64 * s.rows, 1.f);
    std::vector<float> w(s.cols, 1.f);
    BCK(cudaMemcpy(nw.p, w.data(), w.size() * 4, cudaMemcpyHostToDevice));
    make_tiles();
  }
  lr::StageArgs stage_args(int M) const {
    lr::StageArgs a;
    a.x = x.as<float>();
    a.K = sh.cols;
    a.M = M;
    a.pro = sh.pro;
    a.norm_w = nw.as<float>();
    a.z = z.as<float>();
    a.head_dim = 128;
    (sh.bits == 4 ? a.frag4g : a.frag8) = frag.p;
    if (sh.bits == 4) a.frag4w = fragw.p;
    a.meta = meta.as<float2>();
    return a;
  }
  // The matrix copies in the digits kernels' tile order (4-bit RMSNorm shapes the tiles take), their staged input.
  struct TileCopies {
    std::unique_ptr<Buf> q, sb;
    size_t qb, sbb;
    int64_t rows, K;
    TileCopies(const Mats& W) : qb(ld::tiles_q_bytes(W.get(0))), sbb(ld::tiles_sb_bytes(W.get(0))), rows(W.rows), K(W.cols) {
      q = std::make_unique<Buf>(qb * W.n);
      sb = std::make_unique<Buf>(sbb * W.n);
      for (int i = 0; i < W.n; ++i) ld::tiles_repack(W.get(i), q->as<char>() + qb * i, sb->as<char>() + sbb * i, nullptr);
      BCK(cudaDeviceSynchronize());
    }
    ld::TilesDev get(int i) const {
      ld::TilesDev t;
      t.rows = rows;
      t.K = K;
      t.q = reinterpret_cast<const uint4*>(q->as<char>() + qb * i);
      t.sb = reinterpret_cast<const uint32_t*>(sb->as<char>() + sbb * i);
      return t;
    }
  };
  std::unique_ptr<TileCopies> tiles;
  std::unique_ptr<Buf> digit_buf;
  void make_tiles() {
    if (sh.pro != lc::Prologue::RmsNorm || !ld::tiles_supported(W.get(0))) return;
    tiles = std::make_unique<TileCopies>(W);
    digit_buf = std::make_unique<Buf>(ld::stage_bytes(sh.cols, ld::kMaxRows));
  }
  ld::StageArgs digits_stage(int M) const {
    ld::StageArgs a;
    a.x = x.as<float>();
    a.K = sh.cols;
    a.M = M;
    a.norm_w = nw.as<float>();
    a.buf = digit_buf->p;
    return a;
  }
  lr::GemvRowsArgs gemv_args(int M, int copy) const {
    lr::GemvRowsArgs a;
    a.W = W.get(copy);
    a.frag = frag.p;
    if (sh.bits == 4) a.frag_wg = fragw.p;
    a.meta = meta.as<float2>();
    a.M = M;
    a.y = y.as<float>();
    a.accumulate = sh.acc;
    a.partials = partials.as<float>();
    a.partial_floats = partial_floats;
    return a;
  }
};

void register_dense() {
  for (const DenseShape& sh : kDense) {
    auto ctx = std::make_shared<DenseCtx>(sh);
    const int calls = std::max(ctx->W.n, 16);
    benchmark::RegisterBenchmark((std::string("dense/") + sh.name + "/today_gemv_tc/M:1").c_str(), [ctx, calls](benchmark::State& st) {
      run_graph(st, calls, [&](cudaStream_t s, int i) {
        lc::GemvArgs a;
        a.W = ctx->W.get(i % ctx->W.n);
        a.x = ctx->x.as<float>();
        a.y = ctx->y.as<float>();
        a.accumulate = ctx->sh.acc;
        a.pro = ctx->sh.pro;
        a.norm_w = ctx->nw.as<float>();
        a.z = ctx->z.as<float>();
        a.head_dim = 128;
        a.impl = lc::GemvImpl::Tensor;
        lc::gemv(a, s);
      });
      set_bw(st, ctx->W.bytes() + ctx->sh.cols * 4.0 + ctx->sh.rows * 4.0 * (ctx->sh.acc ? 2 : 1));
    })->UseManualTime()->Iterations(20);
    for (int M : kMs) {
      const double io = M * (ctx->sh.cols * 4.0 + ctx->sh.rows * 4.0 * (ctx->sh.acc ? 2 : 1));
      benchmark::RegisterBenchmark((std::string("dense/") + sh.name + "/gemv_rows/M:" + std::to_string(M)).c_str(),
                                   [ctx, calls, M, io](benchmark::State& st) {
                                     lr::stage(ctx->stage_args(M), nullptr);
                                     run_graph(st, calls, [&](cudaStream_t s, int i) {
                                       lr::gemv_rows(ctx->gemv_args(M, i % ctx->W.n), s);
                                     });
                                     set_bw(st, ctx->W.bytes() + io);
                                   })
          ->UseManualTime()
          ->Iterations(20);
      if (M > 8 && sh.bits == 4)  // the tiles kernel where the slice kernel runs by default
        benchmark::RegisterBenchmark((std::string("dense/") + sh.name + "/gemv_rows_tiles/M:" + std::to_string(M)).c_str(),
                                     [ctx, calls, M, io](benchmark::State& st) {
                                       lr::stage(ctx->stage_args(M), nullptr);
                                       run_graph(st, calls, [&](cudaStream_t s, int i) {
                                         lr::GemvRowsArgs a = ctx->gemv_args(M, i % ctx->W.n);
                                         a.kernel = lr::RowsGemvKernel::Tiles;
                                         lr::gemv_rows(a, s);
                                       });
                                       set_bw(st, ctx->W.bytes() + io);
                                     })
            ->UseManualTime()
            ->Iterations(20);
      if (ctx->tiles)  // the digits kernels (kernels/digits): the GEMV on a staged input, and the staging
        for (int lr : {0, 16}) {
          if (lr == 16 && M <= 16) continue;  // the same launches as lr 0
          const std::string v = lr ? "/digits_16rows" : "/digits";
          benchmark::RegisterBenchmark((std::string("dense/") + sh.name + v + "/M:" + std::to_string(M)).c_str(),
                                       [ctx, calls, M, io, lr](benchmark::State& st) {
                                         ld::stage_rmsnorm(ctx->digits_stage(M), nullptr);
                                         run_graph(st, calls, [&](cudaStream_t s, int i) {
                                           ld::GemvArgs a;
                                           a.W = ctx->tiles->get(i % ctx->W.n);
                                           a.buf = ctx->digit_buf->p;
                                           a.M = M;
                                           a.y = ctx->y.as<float>();
                                           a.launch_rows = lr;
                                           ld::gemv(a, s);
                                         });
                                         set_bw(st, ctx->W.bytes() + io);
                                       })
              ->UseManualTime()
              ->Iterations(20);
        }
      if (ctx->tiles)
        benchmark::RegisterBenchmark((std::string("dense/") + sh.name + "/digits_stage/M:" + std::to_string(M)).c_str(),
                                     [ctx, M](benchmark::State& st) {
                                       run_graph(st, 16, [&](cudaStream_t s, int) { ld::stage_rmsnorm(ctx->digits_stage(M), s); });
                                       set_bw(st, M * ctx->sh.cols * 4.0 * 2);
                                     })
            ->UseManualTime()
            ->Iterations(20);
      benchmark::RegisterBenchmark((std::string("dense/") + sh.name + "/stage/M:" + std::to_string(M)).c_str(),
                                   [ctx, M](benchmark::State& st) {
                                     run_graph(st, 16, [&](cudaStream_t s, int) { lr::stage(ctx->stage_args(M), s); });
                                     set_bw(st, M * ctx->sh.cols * 4.0 * (ctx->sh.pro == lc::Prologue::GatedHeadNorm ? 3 : 2));
                                   })
          ->UseManualTime()
          ->Iterations(20);
    }
  }
}

// ------------------------------------------------------------------------------------------------ MoE
struct MoECtx {
  static constexpr int E = 256, k = 8, kSets = 8;
  static constexpr int64_t H = 2048, I = 512, Is = 512;
  Mats gate{I, H, 4, E}, up{I, H, 4, E}, down{H, I, 4, E}, sg{Is, H, 4, 1}, su{Is, H, 4, 1}, sd{H, Is, 4, 1};
  lc::MoEDecodeWeights w;
  Buf h{64 * H * 4}, nw{H * 4}, logits{kSets * 64 * (E + 1) * 4}, act{64 * (k * I + Is) * 4}, sel{64 * k * 4},
      selw{64 * (k + 1) * 4}, y{64 * H * 4}, frag{lr::frag_row_bytes(H) * 64}, meta{lr::meta_row_count(H) * 8 * 64},
      scratch{lr::moe_rows_scratch_bytes(w_for_size(), 64)};
  std::vector<float> host_logits;
  static lc::MoEDecodeWeights w_for_size() {
    lc::MoEDecodeWeights x;
    x.top_k = k;
    x.down.first.rows = H;
    x.down.first.cols = I;
    x.shared_down.cols = Is;
    return x;
  }
  MoECtx() {
    w.E = E;
    w.top_k = k;
    w.gate.n = w.up.n = w.down.n = E;
    w.gate.first = gate.get(0);
    w.up.first = up.get(0);
    w.down.first = down.get(0);
    w.shared_gate = sg.get(0);
    w.shared_up = su.get(0);
    w.shared_down = sd.get(0);
    upload_floats(h.as<float>(), 64 * H, 1.f);
    upload_floats(y.as<float>(), 64 * H, 1.f);
    std::vector<float> one(H, 1.f);
    BCK(cudaMemcpy(nw.p, one.data(), H * 4, cudaMemcpyHostToDevice));
    host_logits.resize(size_t(kSets) * 64 * (E + 1));
    std::normal_distribution<float> nd(0.f, 1.f);
    for (auto& v : host_logits) v = nd(g_rng);
    BCK(cudaMemcpy(logits.p, host_logits.data(), host_logits.size() * 4, cudaMemcpyHostToDevice));
    lr::StageArgs a;
    a.x = h.as<float>();
    a.K = H;
    a.M = 64;
    a.pro = lc::Prologue::RmsNorm;
    a.norm_w = nw.as<float>();
    a.frag4 = frag.p;
    a.meta = meta.as<float2>();
    lr::stage(a, nullptr);
    BCK(cudaDeviceSynchronize());
  }
  const float* logits_set(int set) const { return logits.as<float>() + size_t(set) * 64 * (E + 1); }
  // distinct experts the first M rows of a logits set select (top k by logit = by probability)
  int touched(int set, int M) const {
    std::vector<char> used(E, 0);
    std::vector<int> ids(E);
    for (int m = 0; m < M; ++m) {
      const float* l = host_logits.data() + (size_t(set) * 64 + m) * (E + 1);
      std::iota(ids.begin(), ids.end(), 0);
      std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int a, int b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
      for (int j = 0; j < k; ++j) used[size_t(ids[size_t(j)])] = 1;
    }
    return int(std::count(used.begin(), used.end(), 1));
  }
  double expert_bytes() const { return gate.bytes() + up.bytes() + down.bytes(); }  // one expert
  double bytes(int M) const {
    double t = 0;
    for (int s = 0; s < kSets; ++s) t += touched(s, M);
    t /= kSets;
    return t * expert_bytes() + sg.bytes() + su.bytes() + sd.bytes() + M * (H * 4.0 * 3 + (k * I + Is) * 8.0);
  }
};

std::shared_ptr<MoECtx> register_moe() {
  auto ctx = std::make_shared<MoECtx>();
  const int calls = 16;
  benchmark::RegisterBenchmark("moe/today_gate_up+down/M:1", [ctx, calls](benchmark::State& st) {
    run_graph(st, calls, [&](cudaStream_t s, int i) {
      lc::moe_gate_up(ctx->w, ctx->logits_set(i % MoECtx::kSets), ctx->h.as<float>(), ctx->nw.as<float>(), 1e-6f,
                      ctx->sel.as<int32_t>(), ctx->selw.as<float>(), ctx->act.as<float>(), s, lc::GemvImpl::Tensor);
      lc::moe_down(ctx->w, ctx->sel.as<int32_t>(), ctx->selw.as<float>(), ctx->act.as<float>(), ctx->y.as<float>(), s,
                   lc::GemvImpl::Tensor);
    });
    set_bw(st, ctx->bytes(1));
  })->UseManualTime()->Iterations(20);
  for (int M : kMs) {
    // route + gate/up + down + combine (the layer's MoE after the router GEMV), and each launch alone
    for (int part = 0; part < 5; ++part) {
      static const char* names[] = {"all4", "route", "gate_up", "down", "combine"};
      benchmark::RegisterBenchmark((std::string("moe/rows_") + names[part] + "/M:" + std::to_string(M)).c_str(),
                                   [ctx, calls, M, part](benchmark::State& st) {
                                     auto& c = *ctx;
                                     auto route = [&](cudaStream_t s, int i) {
                                       lr::moe_route_rows(c.w, c.logits_set(i % MoECtx::kSets), MoECtx::E + 1, M, nullptr,
                                                          c.sel.as<int32_t>(), c.selw.as<float>(), c.scratch.p, s);
                                     };
                                     auto gate_up = [&](cudaStream_t s) {
                                       lr::moe_gate_up_rows(c.w, c.frag.p, c.meta.as<float2>(), M, c.scratch.p, c.act.as<float>(), s);
                                     };
                                     auto down = [&](cudaStream_t s) { lr::moe_down_rows(c.w, c.act.as<float>(), M, c.scratch.p, s); };
                                     auto combine = [&](cudaStream_t s) {
                                       lr::moe_combine_rows(c.w, c.selw.as<float>(), M, nullptr, c.scratch.p, c.y.as<float>(), MoECtx::H, s);
                                     };
                                     if (part > 1) {  // the others need one routing done
                                       route(nullptr, 0);
                                       gate_up(nullptr);
                                       down(nullptr);
                                       BCK(cudaDeviceSynchronize());
                                     }
                                     run_graph(st, calls, [&](cudaStream_t s, int i) {
                                       if (part == 0 || part == 1) route(s, i);
                                       if (part == 0 || part == 2) gate_up(s);
                                       if (part == 0 || part == 3) down(s);
                                       if (part == 0 || part == 4) combine(s);
                                     });
                                     st.counters["experts"] = c.touched(0, M);
                                     if (part == 0) set_bw(st, c.bytes(M));
                                   })
          ->UseManualTime()
          ->Iterations(20);
    }
  }
  return ctx;
}

// ------------------------------------------------------------------------------------------------ layer
// The part of one Gated DeltaNet layer that these kernels make, chained as the decode graph will chain it
// (the conv + GDN step of the rows family in between is left out): stage(RMSNorm) → in_proj → stage(gated
// head norm) → out_proj (+= residual) → stage(RMSNorm, both layouts) → router + shared-expert gate (8-bit) →
// route → gate/up → down → combine. Weights rotate over 4 copies of the dense matrices and 8 routings.
void register_layer(const std::shared_ptr<MoECtx>& moe) {
  struct Ctx {
    Mats in_proj{12352, 2048, 4, 4}, out_proj{2048, 4096, 4, 4}, router{256, 2048, 8, 4}, seg{1, 2048, 8, 4};
    Buf proj{64 * 12352 * 4}, o{64 * 4096 * 4}, nw{4096 * 4}, logits{64 * 257 * 4}, frag4{lr::frag_row_bytes(4096) * 64},
        frag4g{lr::frag_row_bytes(4096) * 64}, frag8{lr::frag_row_bytes(2048) * 64}, meta{lr::meta_row_count(4096) * 8 * 64};
    Ctx() {
      upload_floats(proj.as<float>(), 64 * 12352, 1.f);
      upload_floats(o.as<float>(), 64 * 4096, 1.f);
      std::vector<float> one(4096, 1.f);
      BCK(cudaMemcpy(nw.p, one.data(), one.size() * 4, cudaMemcpyHostToDevice));
    }
  };
  auto ctx = std::make_shared<Ctx>();
  for (int M : kMs) {
    benchmark::RegisterBenchmark(("layer/gdn_dense+moe/M:" + std::to_string(M)).c_str(), [ctx, moe, M](benchmark::State& st) {
      auto& c = *ctx;
      auto& m = *moe;
      // dense: the group layout for the 4-bit projections; else the MoE's layout and the router's (f8)
      auto stage = [&](cudaStream_t s, const float* x, int64_t K, lc::Prologue pro, const float* z, int64_t ldz, void* f8,
                       bool dense) {
        lr::StageArgs a;
        a.x = x;
        a.K = K;
        a.M = M;
        a.pro = pro;
        a.norm_w = c.nw.as<float>();
        a.z = z;
        a.ldz = ldz;
        a.head_dim = 128;
        a.frag4g = dense ? c.frag4g.p : nullptr;
        a.frag4 = dense ? nullptr : c.frag4.p;
        a.frag8 = f8;
        a.meta = c.meta.as<float2>();
        lr::stage(a, s);
      };
      auto gemv = [&](cudaStream_t s, const lc::QMatrixDev& W, const void* frag, float* y, int64_t ldy, bool acc) {
        lr::GemvRowsArgs a;
        a.W = W;
        a.frag = frag;
        a.meta = c.meta.as<float2>();
        a.M = M;
        a.y = y;
        a.ldy = ldy;
        a.accumulate = acc;
        lr::gemv_rows(a, s);
      };
      run_graph(st, 8, [&](cudaStream_t s, int i) {
        float* h = m.h.as<float>();
        stage(s, h, 2048, lc::Prologue::RmsNorm, nullptr, 0, nullptr, true);
        gemv(s, c.in_proj.get(i % 4), c.frag4g.p, c.proj.as<float>(), 12352, false);
        stage(s, c.o.as<float>(), 4096, lc::Prologue::GatedHeadNorm, c.proj.as<float>() + 8192, 12352, nullptr, true);
        gemv(s, c.out_proj.get(i % 4), c.frag4g.p, h, 2048, true);
        stage(s, h, 2048, lc::Prologue::RmsNorm, nullptr, 0, c.frag8.p, false);
        gemv(s, c.router.get(i % 4), c.frag8.p, c.logits.as<float>(), 257, false);
        gemv(s, c.seg.get(i % 4), c.frag8.p, c.logits.as<float>() + 256, 257, false);
        lr::moe_route_rows(m.w, c.logits.as<float>(), 257, M, nullptr, m.sel.as<int32_t>(), m.selw.as<float>(),
                           m.scratch.p, s);
        lr::moe_gate_up_rows(m.w, c.frag4.p, c.meta.as<float2>(), M, m.scratch.p, m.act.as<float>(), s);
        lr::moe_down_rows(m.w, m.act.as<float>(), M, m.scratch.p, s);
        lr::moe_combine_rows(m.w, m.selw.as<float>(), M, nullptr, m.scratch.p, h, 2048, s);
      });
    })->UseManualTime()->Iterations(10);
  }
}

// ------------------------------------------------------------------------------------------------ sampling
void register_sample() {
  const int64_t vocab = 248320;
  struct Ctx {
    Buf logits{64 * vocab * 4}, params{64 * sizeof(lc::SampleParamsDev)}, counts{64 * vocab * 4}, mask{64 * vocab},
        tokens{64 * 4}, results{64 * sizeof(lc::SampleResult)}, scratch{lr::sample_rows_scratch_bytes(vocab, 64)};
  };
  auto ctx = std::make_shared<Ctx>();
  upload_floats(ctx->logits.as<float>(), 64 * vocab, 2.f);
  BCK(cudaMemset(ctx->counts.p, 0, 64 * vocab * 4));
  BCK(cudaMemset(ctx->mask.p, 0, 64 * vocab));
  for (float temp : {0.f, 0.8f}) {
    std::vector<lc::SampleParamsDev> p(64);
    for (int i = 0; i < 64; ++i) {
      p[size_t(i)] = lc::SampleParamsDev{};
      p[size_t(i)].temperature = temp;
      p[size_t(i)].top_p = temp > 0 ? 0.9f : 1.f;
      p[size_t(i)].repetition = 1.f;
      p[size_t(i)].seed = 7 + i;
    }
    const std::string tn = temp > 0 ? "sampled" : "greedy";
    for (int M : kMs) {
      benchmark::RegisterBenchmark(("sample/rows_" + tn + "/M:" + std::to_string(M)).c_str(), [ctx, p, M](benchmark::State& st) {
        BCK(cudaMemcpy(ctx->params.p, p.data(), p.size() * sizeof(p[0]), cudaMemcpyHostToDevice));
        run_graph(st, 8, [&](cudaStream_t s, int) {
          lr::SampleRowsArgs a;
          a.logits = ctx->logits.as<float>();
          a.vocab = vocab;
          a.M = M;
          a.params = ctx->params.as<lc::SampleParamsDev>();
          a.counts = ctx->counts.as<int32_t>();
          a.prompt_mask = ctx->mask.as<uint8_t>();
          a.token_by_slot = ctx->tokens.as<int32_t>();
          a.results = ctx->results.as<lc::SampleResult>();
          a.scratch = ctx->scratch.p;
          lr::sample_rows(a, s);
        });
        set_bw(st, M * vocab * 4.0);
      })->UseManualTime()->Iterations(20);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("no CUDA GPU: bench_kernels_rows skipped\n");
    return 0;
  }
  benchmark::Initialize(&argc, argv);
  register_dense();
  const auto moe = register_moe();
  register_layer(moe);
  register_sample();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
