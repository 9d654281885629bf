// Prefill kernels (src/cuda/kernels/prefill.h) against the CPU reference ops on random inputs:
// fresh seeds each run (printed on failure), outputs poisoned with NaN, sizes that are not multiples
// of the tiles. Precision: the GPU rounds dequantized weights / probabilities / hidden activations to
// bf16 (relative error 2^-9 per element, ~1e-3 on a norm), so ‖Δ‖/‖ref‖ ≤ 1e-2 where bf16 operands are
// involved; the fp32-only paths (conv, the GDN state) are held to 1e-4.
// Also times each kernel at the model's real sizes (printed; see bench/GPU_NOTES.md).
#include <gtest/gtest.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "core/bf16.h"
#include "core/error.h"
#include "cpu/ops.h"
#include "cuda/kernels/prefill.h"
#include "prefill_test_util.h"

using namespace lilac;
namespace lc = lilac::cuda;
using namespace lilac::cuda::prefill_testing;

namespace {

uint32_t fresh_seed() { return std::random_device{}(); }

// Runs `f` once per tensor-core path of the quantized GEMMs (mma.sync, and wgmma where available),
// then restores the automatic choice.
template <class F>
void for_each_gemm_path(F&& f) {
  std::vector<std::pair<lc::GemmPath, const char*>> paths = {{lc::GemmPath::MmaSync, "mma.sync"}};
  if (lc::gemm_wgmma_available()) paths.push_back({lc::GemmPath::Wgmma, "wgmma"});
  for (auto& [path, name] : paths) {
    SCOPED_TRACE(std::string("gemm path ") + name);
    std::printf("[path] %s\n", name);
    lc::set_gemm_path(path);
    f();
  }
  lc::set_gemm_path(lc::GemmPath::Auto);
}

// Random values, rounded to bf16: returns the bf16 bits; `f` gets the same values as float.
std::vector<uint16_t> rand_bf16(size_t n, std::mt19937& rng, float lo, float hi, std::vector<float>* f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<uint16_t> v(n);
  if (f) f->resize(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = f32_to_bf16(d(rng));
    if (f) (*f)[i] = bf16_to_f32(v[i]);
  }
  return v;
}

// A random quantized matrix (or `count` of them back to back), host copy + device copy.
struct QMat {
  std::vector<uint32_t> q;
  std::vector<uint16_t> s, b;
  QMatrix host;  // first matrix
  uint32_t* dq = nullptr;
  __nv_bfloat16 *ds = nullptr, *db = nullptr;
  QMat(int64_t rows, int64_t cols, int bits, std::mt19937& rng, int count = 1) {
    const int64_t words = rows * cols * bits / 32 * count, groups = rows * cols / 64 * count;
    q.resize(words);
    s.resize(groups);
    b.resize(groups);
    for (auto& w : q) w = rng();
    std::uniform_real_distribution<float> sd(0.5f, 1.5f), bd(-0.2f, 0.2f);
    const float qmax = float((1 << bits) - 1);
    for (int64_t g = 0; g < groups; ++g) {
      float sc = sd(rng) * 0.04f / qmax;  // values within ≈ ±0.02·(1 ± 0.5)
      s[g] = f32_to_bf16(sc);
      b[g] = f32_to_bf16(-0.5f * qmax * sc + bd(rng) * sc * qmax);
    }
    host.rows = rows;
    host.cols = cols;
    host.bits = bits;
    host.group_size = 64;
    host.qweight = q.data();
    host.scales = s.data();
    host.biases = b.data();
    cudaMalloc(&dq, q.size() * 4);
    cudaMalloc(&ds, s.size() * 2);
    cudaMalloc(&db, b.size() * 2);
    cudaMemcpy(dq, q.data(), q.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(ds, s.data(), s.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(db, b.data(), b.size() * 2, cudaMemcpyHostToDevice);
  }
  ~QMat() {
    cudaFree(dq);
    cudaFree(ds);
    cudaFree(db);
  }
  QMat(const QMat&) = delete;
  lc::QMatrixDev dev() const {
    lc::QMatrixDev m;
    m.rows = host.rows;
    m.cols = host.cols;
    m.bits = host.bits;
    m.group_size = 64;
    m.qweight = dq;
    m.scales = ds;
    m.biases = db;
    return m;
  }
  lc::QExpertsDev experts(int n) const { return lc::QExpertsDev{n, dev()}; }
  QExperts host_experts(int n) const { return QExperts{n, host}; }
};

float silu(float x) { return x / (1.f + std::exp(-x)); }
float sigm(float x) { return 1.f / (1.f + std::exp(-x)); }

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
  });
}
TEST(PrefillQgemm, Int4AddAndBf16) {
  NEED_GPU();
  for_each_gemm_path([] {
    check_qgemm(129, 131, 512, 4, lc::GemmOut::AddF32, 0);
    check_qgemm(100, 2048, 4096, 4, lc::GemmOut::AddF32, 0);  // split-K (small grid, long K), like out_proj
    check_qgemm(45, 257, 192, 4, lc::GemmOut::StoreBF16, 16);
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
  const int n = 150, rows = 130, cols = 192;
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

// -------------------------------------------------------------------------------------- attention
void check_attention(int heads, int kv_heads, int hd, int64_t start_pos, int n_new, bool gate) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " hd=" + std::to_string(hd) + " start=" + std::to_string(start_pos) +
               " n=" + std::to_string(n_new));
  std::mt19937 rng(seed);
  const int64_t n_ctx = start_pos + n_new;
  const int64_t kv_stride = int64_t(kv_heads) * hd;
  // q laid out like q_proj's output: per head [query hd | gate hd]
  const int64_t q_stride = int64_t(heads) * hd * 2, q_head_stride = 2 * hd;
  std::vector<float> qf, kf, vf;
  auto qb = rand_bf16(size_t(n_new) * q_stride, rng, -1.f, 1.f, &qf);
  auto kb = rand_bf16(size_t(n_ctx) * kv_stride, rng, -1.f, 1.f, &kf);
  auto vb = rand_bf16(size_t(n_ctx) * kv_stride, rng, -1.f, 1.f, &vf);
  auto gf = rand_f(size_t(n_new) * q_stride, rng, -3.f, 3.f);
  const float scale = 1.f / std::sqrt(float(hd));
  std::vector<float> ref(size_t(n_new) * heads * hd), scores(n_ctx);
  for (int i = 0; i < n_new; ++i)
    for (int h = 0; h < heads; ++h) {
      const int kvh = h / (heads / kv_heads);
      float* o = &ref[(size_t(i) * heads + h) * hd];
      cpu::attention_head(&qf[i * q_stride + h * q_head_stride], &kf[kvh * hd], &vf[kvh * hd], start_pos + i + 1,
                          kv_stride, hd, scale, o, scores.data());
      if (gate)
        for (int d = 0; d < hd; ++d) o[d] *= sigm(gf[i * q_stride + h * q_head_stride + hd + d]);
    }
  Dev<uint16_t> dq(qb), dk(kb), dv(vb), dout(size_t(n_new) * heads * hd);
  Dev<float> dg(gf);
  dout.poison();
  lc::AttentionPrefillArgs a;
  a.q = reinterpret_cast<const __nv_bfloat16*>(dq.p);
  a.q_stride = q_stride;
  a.q_head_stride = q_head_stride;
  a.k_cache = reinterpret_cast<const __nv_bfloat16*>(dk.p);
  a.v_cache = reinterpret_cast<const __nv_bfloat16*>(dv.p);
  a.kv_stride = kv_stride;
  if (gate) {
    a.gate = dg.p + hd;
    a.gate_stride = q_stride;
    a.gate_head_stride = q_head_stride;
  }
  a.out = reinterpret_cast<__nv_bfloat16*>(dout.p);
  a.out_stride = int64_t(heads) * hd;
  a.n_new = n_new;
  a.start_pos = start_pos;
  a.heads = heads;
  a.kv_heads = kv_heads;
  a.head_dim = hd;
  lc::attention_prefill(a, nullptr);
  CK(cudaDeviceSynchronize());
  EXPECT_LT(rel_err(bf16_to_f(dout.get()), ref), 1e-2);
}

TEST(PrefillAttention, CausalGqaHead256WithPrefixAndGate) {
  NEED_GPU();
  check_attention(4, 2, 256, 37, 90, true);
  check_attention(16, 2, 256, 0, 130, true);
}
TEST(PrefillAttention, OtherHeadDims) {
  NEED_GPU();
  check_attention(4, 1, 128, 200, 65, false);
  check_attention(2, 2, 64, 5, 1, false);
}

// -------------------------------------------------------------------------------- Gated DeltaNet
TEST(PrefillGdn, ConvSiluAndState) {
  NEED_GPU();
  for (int n : {37, 2, 70}) {
    const uint32_t seed = fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed) + " n=" + std::to_string(n));
    std::mt19937 rng(seed);
    const int C = 200, K = 4;
    const int64_t ldx = C + 8;
    auto x = rand_f(size_t(n) * ldx, rng, -2.f, 2.f);
    auto w = rand_f(size_t(C) * K, rng, -1.f, 1.f);
    auto st = rand_f(size_t(C) * (K - 1), rng, -2.f, 2.f);
    std::vector<float> ref(size_t(n) * C), st_ref = st;
    for (int t = 0; t < n; ++t) {
      std::vector<float> row(&x[size_t(t) * ldx], &x[size_t(t) * ldx] + C);
      cpu::conv1d_silu_step(w.data(), C, K, st_ref.data(), row.data(), &ref[size_t(t) * C]);
    }
    Dev<float> dx(x), dw(w), ds(st), dy(size_t(n) * C);
    dy.poison();
    lc::gdn_conv_prefill(dx.p, ldx, dw.p, ds.p, dy.p, C, n, C, K, nullptr);
    CK(cudaDeviceSynchronize());
    EXPECT_LT(rel_err(dy.get(), ref), 1e-5);
    EXPECT_LT(rel_err(ds.get(), st_ref), 1e-7);
  }
}

void check_gdn(int n, int Hk, int Hv, bool use_work) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " n=" + std::to_string(n) + " work=" + std::to_string(use_work));
  std::mt19937 rng(seed);
  const int dk = 128, dv = 128;
  const int64_t conv_dim = 2 * int64_t(Hk) * dk + int64_t(Hv) * dv;
  const int64_t ld_qkv = conv_dim + 4;
  auto qkv = rand_f(size_t(n) * ld_qkv, rng, -1.f, 1.f);
  auto ab = rand_f(size_t(n) * 2 * Hv, rng, -3.f, 3.f);  // [b | a] per row
  auto z = rand_f(size_t(n) * Hv * dv, rng, -2.f, 2.f);
  auto A_log = rand_f(Hv, rng, -1.f, 1.f);
  auto dt_bias = rand_f(Hv, rng, -1.f, 1.f);
  auto norm_w = rand_f(dv, rng, 0.5f, 1.5f);
  auto S0 = rand_f(size_t(Hv) * dk * dv, rng, -0.1f, 0.1f);
  // reference
  std::vector<float> S = S0, ref(size_t(n) * Hv * dv);
  std::vector<float> beta(Hv), g(Hv), o(dv);
  for (int t = 0; t < n; ++t) {
    const float* row = &qkv[size_t(t) * ld_qkv];
    std::vector<float> q(row, row + Hk * dk), k(row + Hk * dk, row + 2 * Hk * dk);
    for (int hk = 0; hk < Hk; ++hk) {
      cpu::l2norm(&q[hk * dk], dk);
      cpu::l2norm(&k[hk * dk], dk);
      for (int i = 0; i < dk; ++i) q[hk * dk + i] /= std::sqrt(float(dk));
    }
    cpu::gdn_gates(&ab[size_t(t) * 2 * Hv], &ab[size_t(t) * 2 * Hv + Hv], A_log.data(), dt_bias.data(), Hv,
                   beta.data(), g.data());
    for (int h = 0; h < Hv; ++h) {
      const int hk = h / (Hv / Hk);
      cpu::gdn_recurrent_step(&S[size_t(h) * dk * dv], &q[hk * dk], &k[hk * dk], row + 2 * Hk * dk + h * dv, g[h],
                              beta[h], dk, dv, o.data());
      cpu::gated_rmsnorm(o.data(), &z[(size_t(t) * Hv + h) * dv], norm_w.data(), dv, 1e-6f,
                         &ref[(size_t(t) * Hv + h) * dv]);
    }
  }
  Dev<float> dqkv(qkv), dab(ab), dz(z), dA(A_log), ddt(dt_bias), dw(norm_w), dS(S0), dosc(size_t(n) * Hv * dv);
  Dev<uint16_t> dout(size_t(n) * Hv * dv);
  dout.poison();
  dosc.poison();
  Dev<float> dwork(lc::gdn_prefill_work_floats(n, Hk, Hv, dk));
  dwork.poison();
  lc::GdnPrefillArgs a;
  a.work = use_work ? dwork.p : nullptr;
  a.qkv = dqkv.p;
  a.ld_qkv = ld_qkv;
  a.b = dab.p;
  a.ld_b = 2 * Hv;
  a.a = dab.p + Hv;
  a.ld_a = 2 * Hv;
  a.z = dz.p;
  a.ld_z = int64_t(Hv) * dv;
  a.A_log = dA.p;
  a.dt_bias = ddt.p;
  a.norm_w = dw.p;
  a.state = dS.p;
  a.o_scratch = dosc.p;
  a.out = reinterpret_cast<__nv_bfloat16*>(dout.p);
  a.ld_out = int64_t(Hv) * dv;
  a.n = n;
  a.Hk = Hk;
  a.Hv = Hv;
  a.dk = dk;
  a.dv = dv;
  if (use_work) {
    lc::gdn_prefill(a, nullptr);
  } else {
    // no work buffer, inside a graph capture: the allocation-free path, and capturability
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    lc::gdn_prefill(a, st);
    CK(cudaStreamEndCapture(st, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    CK(cudaGraphLaunch(exec, st));
    CK(cudaStreamSynchronize(st));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(st);
  }
  CK(cudaDeviceSynchronize());
  EXPECT_LT(rel_err(bf16_to_f(dout.get()), ref), 5e-3);  // output rounded to bf16
  EXPECT_LT(rel_err(dS.get(), S), 1e-4);                 // fp32 state, different summation order
}

TEST(PrefillGdn, RecurrenceMatchesTokenByToken) {
  NEED_GPU();
  check_gdn(70, 2, 4, true);
  check_gdn(1, 1, 2, true);
  check_gdn(300, 4, 8, true);
  check_gdn(37, 2, 4, false);  // captured in a graph without a work buffer: the in-scan path
  check_gdn(17, 3, 3, true);
}

// -------------------------------------------------------------------------------------------- MoE
TEST(PrefillMoe, RouteMatchesCpu) {
  NEED_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const int n = 333, E = 256, k = 8;
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
  QMat router(E, hidden, 8, rng), gate(inter, hidden, 4, rng, E), up(inter, hidden, 4, rng, E),
      down(hidden, inter, 4, rng, E), sg(sinter, hidden, 4, rng), su(sinter, hidden, 4, rng),
      sd(hidden, sinter, 4, rng), seg(1, hidden, 8, rng);
  lc::MoEPrefillWeights w;
  w.router = router.dev();
  w.gate = gate.experts(E);
  w.up = up.experts(E);
  w.down = down.experts(E);
  w.shared_gate = sg.dev();
  w.shared_up = su.dev();
  w.shared_down = sd.dev();
  w.shared_expert_gate = seg.dev();
  w.top_k = k;
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
  cpu::qmatmul(router.host, xf.data(), n, logits.data());
  check_routing(logits, ids, wts, n, E, k);
  // experts with the GPU's routing
  QExperts hg = gate.host_experts(E), hu = up.host_experts(E), hd = down.host_experts(E);
  std::vector<float> ref = y0, tmp(hidden), hid(2 * inter), shid(2 * sinter);
  for (int t = 0; t < n; ++t) {
    const float* x = &xf[size_t(t) * hidden];
    float* r = &ref[size_t(t) * hidden];
    for (int s = 0; s < k; ++s) {
      const int e = ids[t * k + s];
      ASSERT_TRUE(e >= 0 && e < E);
      cpu::swiglu(hg.expert(e), hu.expert(e), hd.expert(e), x, 1, tmp.data(), hid.data());
      for (int c = 0; c < hidden; ++c) r[c] += wts[t * k + s] * tmp[c];
    }
    float sgl;
    cpu::qmatvec(seg.host, x, &sgl);
    cpu::swiglu(sg.host, su.host, sd.host, x, 1, tmp.data(), shid.data());
    for (int c = 0; c < hidden; ++c) r[c] += sigm(sgl) * tmp[c];
  }
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
  for_each_gemm_path([] {
    check_moe(150, 16, 4, 256, 128, 192);  // some experts get no token, uneven tiles
    check_moe(300, 64, 8, 512, 192, 128);
    check_moe(3, 32, 8, 128, 64, 64);
  });
}

// ----------------------------------------------------------------------------- timings (real sizes)
// Times each kernel at the model's sizes (4096-token chunk) with CUDA events (median of 20 after
// warm-up) and prints TFLOP/s; checks the outputs are finite.

bool all_finite_dev(const float* p, size_t n) {
  std::vector<float> v(n);
  cudaMemcpy(v.data(), p, n * 4, cudaMemcpyDeviceToHost);
  for (float x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

TEST(PrefillTiming, RealSizes) {
  NEED_GPU();
  const char* env = std::getenv("LILAC_PREFILL_TIMING");
  const int n = env && *env ? std::atoi(env) : 4096;
  std::mt19937 rng(fresh_seed());
  const int hidden = 2048;
  std::vector<float> xf;
  auto xb = rand_bf16(size_t(n) * 8192, rng, -1.f, 1.f, nullptr);
  Dev<uint16_t> dx(xb);
  auto X = reinterpret_cast<const __nv_bfloat16*>(dx.p);
  {  // dense projections
    struct Shape {
      const char* name;
      int rows, cols;
    } shapes[] = {{"in_proj_qkv 2048->8192", 8192, 2048}, {"q_proj 2048->8192", 8192, 2048},
                  {"out_proj 4096->2048", 2048, 4096}, {"in_proj_z 2048->4096", 4096, 2048}};
    for (auto& s : shapes) {
      QMat W(s.rows, s.cols, 4, rng);
      Dev<float> dy(size_t(n) * s.rows);
      for_each_gemm_path([&] {
        float ms =
            time_ms([&] { lc::qgemm(W.dev(), X, s.cols, n, dy.p, s.rows, lc::GemmOut::StoreF32, nullptr); });
        EXPECT_TRUE(all_finite_dev(dy.p, dy.n));
        double fl = 2.0 * n * s.rows * s.cols;
        std::printf("[timing] qgemm %-24s n=%d: %8.3f ms  %6.1f TFLOP/s\n", s.name, n, ms, fl / ms / 1e9);
      });
    }
  }
  {  // MoE block
    const int E = 256, k = 8, inter = 512;
    QMat router(E, hidden, 8, rng), gate(inter, hidden, 4, rng, E), up(inter, hidden, 4, rng, E),
        down(hidden, inter, 4, rng, E), sg(inter, hidden, 4, rng), su(inter, hidden, 4, rng),
        sd(hidden, inter, 4, rng), seg(1, hidden, 8, rng);
    lc::MoEPrefillWeights w;
    w.router = router.dev();
    w.gate = gate.experts(E);
    w.up = up.experts(E);
    w.down = down.experts(E);
    w.shared_gate = sg.dev();
    w.shared_up = su.dev();
    w.shared_down = sd.dev();
    w.shared_expert_gate = seg.dev();
    Dev<float> dy(size_t(n) * hidden);
    Dev<unsigned char> ws(lc::moe_prefill_workspace_bytes(w, n));
    cudaMemset(dy.p, 0, dy.n * 4);
    for_each_gemm_path([&] {
      float ms = time_ms([&] { lc::moe_prefill(w, X, hidden, n, dy.p, hidden, false, ws.p, nullptr); });
      EXPECT_TRUE(all_finite_dev(dy.p, dy.n));
      double fl = 2.0 * n * (double(k) * 3 * inter * hidden + 3.0 * inter * hidden + double(E) * hidden);
      std::printf("[timing] moe_prefill (256 experts top-8 + shared) n=%d: %8.3f ms  %6.1f TFLOP/s\n", n, ms,
                  fl / ms / 1e9);
    });
  }
  {  // attention
    const int heads = 16, kvh = 2, hd = 256;
    Dev<uint16_t> dkv(size_t(n) * kvh * hd * 2);
    std::vector<uint16_t> kvb = rand_bf16(dkv.n, rng, -1.f, 1.f, nullptr);
    cudaMemcpy(dkv.p, kvb.data(), kvb.size() * 2, cudaMemcpyHostToDevice);
    Dev<uint16_t> dout(size_t(n) * heads * hd);
    lc::AttentionPrefillArgs a;
    a.q = X;
    a.q_stride = heads * hd;
    a.q_head_stride = hd;
    a.k_cache = reinterpret_cast<const __nv_bfloat16*>(dkv.p);
    a.v_cache = reinterpret_cast<const __nv_bfloat16*>(dkv.p) + size_t(n) * kvh * hd;
    a.kv_stride = kvh * hd;
    a.out = reinterpret_cast<__nv_bfloat16*>(dout.p);
    a.out_stride = heads * hd;
    a.n_new = n;
    a.heads = heads;
    a.kv_heads = kvh;
    a.head_dim = hd;
    float ms = time_ms([&] { lc::attention_prefill(a, nullptr); });
    double fl = 4.0 * heads * hd * (double(n) * (n + 1) / 2);
    std::printf("[timing] attention_prefill 16q/2kv hd256 causal n=%d: %8.3f ms  %6.1f TFLOP/s\n", n, ms,
                fl / ms / 1e9);
  }
  {  // GDN
    const int Hk = 16, Hv = 32, d = 128;
    const int64_t conv_dim = 2 * Hk * d + Hv * d;
    auto qkv = rand_f(size_t(n) * conv_dim, rng, -1.f, 1.f);
    Dev<float> dqkv(qkv), dconv(size_t(n) * conv_dim), dab(rand_f(size_t(n) * 2 * Hv, rng, -3.f, 3.f)),
        dz(rand_f(size_t(n) * Hv * d, rng, -2.f, 2.f));
    Dev<float> dcw(rand_f(size_t(conv_dim) * 4, rng, -0.5f, 0.5f)), dcs(rand_f(size_t(conv_dim) * 3, rng, -1.f, 1.f)),
        dA(rand_f(Hv, rng, -1.f, 1.f)), ddt(rand_f(Hv, rng, -1.f, 1.f)), dw(rand_f(d, rng, 0.5f, 1.5f)),
        dS(rand_f(size_t(Hv) * d * d, rng, -0.1f, 0.1f)), dosc(size_t(n) * Hv * d);
    Dev<uint16_t> dout(size_t(n) * Hv * d);
    float ms_conv = time_ms([&] {
      lc::gdn_conv_prefill(dqkv.p, conv_dim, dcw.p, dcs.p, dconv.p, conv_dim, n, int(conv_dim), 4, nullptr);
    });
    lc::GdnPrefillArgs a;
    a.qkv = dconv.p;
    a.ld_qkv = conv_dim;
    a.b = dab.p;
    a.ld_b = 2 * Hv;
    a.a = dab.p + Hv;
    a.ld_a = 2 * Hv;
    a.z = dz.p;
    a.ld_z = Hv * d;
    a.A_log = dA.p;
    a.dt_bias = ddt.p;
    a.norm_w = dw.p;
    a.state = dS.p;
    a.o_scratch = dosc.p;
    a.out = reinterpret_cast<__nv_bfloat16*>(dout.p);
    a.ld_out = Hv * d;
    a.n = n;
    a.Hk = Hk;
    a.Hv = Hv;
    a.dk = d;
    a.dv = d;
    Dev<float> dwork(lc::gdn_prefill_work_floats(n, Hk, Hv, d));
    a.work = dwork.p;
    float ms = time_ms([&] { lc::gdn_prefill(a, nullptr); });
    EXPECT_TRUE(all_finite_dev(dosc.p, dosc.n));
    double bytes = double(n) * conv_dim * 4 * 2;
    std::printf("[timing] gdn_conv_prefill n=%d: %8.3f ms  %6.0f GB/s\n", n, ms_conv, bytes / ms_conv / 1e6);
    std::printf("[timing] gdn_prefill (scan + gated norm) 32 heads n=%d: %8.3f ms  %.1f us/token\n", n, ms,
                ms * 1e3 / n);
  }
  CK(cudaGetLastError());
}

}  // namespace
