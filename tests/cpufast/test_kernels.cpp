// The fast CPU path's integer kernels against the definitions, for every kernel set this machine runs
// (scalar always; AVX2, AVX-512 VNNI, NEON when present): packing, activation quantization, the
// GEMM for 4- and 8-bit matrices of odd shapes, batch invariance, and agreement with the fp32
// reference's qmatvec.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/error.h"
#include "cpu/ops.h"
#include "avx512_emu.h"
#include "cpufast/acts.h"
#include "cpufast/gdn.h"
#include "cpufast/isa.h"
#include "cpufast/pack.h"
#include "cpufast/selfcheck.h"
#include "model/quant.h"

using namespace lilac;
using namespace lilac::cpufast;

namespace {

// A random MLX-layout matrix with its storage.
struct RandMatrix {
  QMatrix m;
  std::vector<uint32_t> w;
  std::vector<uint16_t> s, b;
  RandMatrix(int64_t rows, int64_t cols, int bits, int group, uint32_t seed) {
    std::mt19937 rng(seed);
    m.rows = rows;
    m.cols = cols;
    m.bits = bits;
    m.group_size = group;
    std::vector<uint8_t> q(static_cast<size_t>(rows * cols));
    for (auto& v : q) v = uint8_t(rng() % (1u << bits));
    w.resize(static_cast<size_t>(rows * cols * bits / 32));
    for (int64_t r = 0; r < rows; ++r) pack_bits(q.data() + r * cols, cols, bits, w.data() + r * cols * bits / 32);
    std::normal_distribution<float> nd(0.f, 1.f);
    s.resize(static_cast<size_t>(rows * cols / group));
    b.resize(s.size());
    for (size_t i = 0; i < s.size(); ++i) {
      s[i] = f32_to_bf16(0.01f * (1.f + std::fabs(nd(rng))) / float(1 << (bits - 4)));
      b[i] = f32_to_bf16(-0.08f * std::fabs(nd(rng)));
    }
    m.qweight = w.data();
    m.scales = s.data();
    m.biases = b.data();
  }
};

std::vector<float> rand_x(int64_t n, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(n * cols));
  for (auto& v : x) v = nd(rng);
  x[3] = 9.f;  // an outlier
  return x;
}

// The kernels' definition in double (kernels.h): Σ_b scale (d Σ q_w q_x [+ d2 Σ q_w q2_x] + mid rsum) + bias
// xsum, from the unpacked matrix; mid is the packed matrix's.
std::vector<double> expected(const QMatrix& W, const QActs& X, double mid) {
  std::vector<double> y(static_cast<size_t>(X.n * W.rows));
  for (int64_t t = 0; t < X.n; ++t)
    for (int64_t r = 0; r < W.rows; ++r) {
      double acc = 0;
      for (int64_t b = 0; b < W.cols / 64; ++b) {
        const int64_t g = b * 64 / W.group_size;
        int64_t s = 0;
        for (int j = 0; j < 64; ++j)
          s += int64_t(unpack_at(W.qweight + r * W.words_per_row(), b * 64 + j, W.bits)) * X.q[t * X.cols + b * 64 + j];
        int64_t s2 = 0;
        if (X.q2)
          for (int j = 0; j < 64; ++j)
            s2 += int64_t(unpack_at(W.qweight + r * W.words_per_row(), b * 64 + j, W.bits)) * X.q2[t * X.cols + b * 64 + j];
        const double scale = bf16_to_f32(W.scales[r * W.groups_per_row() + g]);
        acc += scale * X.d[t * X.blocks + b] * double(s) + (X.q2 ? scale * X.d2[t * X.blocks + b] * double(s2) : 0.0) +
               scale * mid * X.rsum[t * X.blocks + b] +
               double(bf16_to_f32(W.biases[r * W.groups_per_row() + g])) * X.sum[t * X.blocks + b];
      }
      y[static_cast<size_t>(t * W.rows + r)] = acc;
    }
  return y;
}

struct Case {
  int64_t rows, cols;
  int bits, group;
};

}  // namespace

TEST(CpuFastKernels, ScalarIsAlwaysAvailable) {
  ASSERT_NE(kernels_for("scalar"), nullptr);
  EXPECT_STREQ(available_kernels().front()->name, "scalar");
  std::printf("kernel sets here: ");
  for (const KernelSet* k : available_kernels()) std::printf("%s ", k->name);
  std::printf("(CPU: %s)\n", cpu_features().describe().c_str());
}

TEST(CpuFastKernels, ActivationQuantization) {
  const auto x = rand_x(1, 192, 3);
  std::vector<int8_t> q(192);
  float d[3], s[3];
  quantize_act_row(x.data(), 192, q.data(), d, s);
  for (int b = 0; b < 3; ++b) {
    float amax = 0, sum = 0;
    for (int j = 0; j < 64; ++j) {
      amax = std::max(amax, std::fabs(x[b * 64 + j]));
      sum += x[b * 64 + j];
    }
    EXPECT_FLOAT_EQ(d[b], amax / 127.f);
    EXPECT_FLOAT_EQ(s[b], sum);
    for (int j = 0; j < 64; ++j) {
      EXPECT_LE(std::abs(int(q[b * 64 + j])), 127);
      EXPECT_LE(std::fabs(q[b * 64 + j] * d[b] - x[b * 64 + j]), 0.5f * d[b] * 1.0001f) << b << " " << j;
    }
  }
}

// Every kernel set: exact integer sums (only float rounding differs from the double definition), any
// number of rows (padding), 4 and 8 bits, group sizes 64 and 128, 1..7 tokens.
TEST(CpuFastKernels, GemmMatchesDefinitionOnEveryIsa) {
  const Case cases[] = {{37, 192, 4, 64}, {64, 256, 8, 64}, {19, 128, 4, 128}, {3, 64, 8, 64}, {50, 320, 4, 64}};
  for (const KernelSet* k : available_kernels()) {
    for (const Case& c : cases) {
      RandMatrix rm(c.rows, c.cols, c.bits, c.group, uint32_t(c.rows * 7 + c.bits));
      std::vector<std::shared_ptr<PackedBuffer>> owners;
      const PackedMatrix P = pack_matrix({rm.m}, k->rows_per_tile, "test", owners, nullptr);
      EXPECT_EQ(P.bits, c.bits);
      EXPECT_EQ(P.mid, c.bits == 4 ? 7.5f : 127.5f);
      for (int64_t n : {1, 2, 3, 4, 5, 7})
      for (int levels : {1, 2}) {
        const auto x = rand_x(n, c.cols, uint32_t(n));
        ActBuffer ab;
        QActs X = ab.resize(n, c.cols, levels);
        for (int64_t t = 0; t < n; ++t) ab.quantize_row(t, x.data() + t * c.cols);
        const auto want = expected(rm.m, X, P.mid);
        std::vector<float> y(static_cast<size_t>(n * c.rows), NAN);
        k->gemm(P, 0, P.tiles, X, y.data(), c.rows);
        for (int64_t i = 0; i < n * c.rows; ++i)
          ASSERT_NEAR(y[static_cast<size_t>(i)], want[static_cast<size_t>(i)], 2e-5 * (1 + std::fabs(want[static_cast<size_t>(i)])))
              << k->name << " rows " << c.rows << " cols " << c.cols << " bits " << c.bits << " n " << n << " levels "
              << levels << " i " << i;
      }
    }
  }
}

// The emulated avx512-vnni arithmetic (avx512_emu.h, what the accuracy tests run on machines without
// AVX-512): the definition within float rounding everywhere, and bit for bit the real kernels where the
// CPU runs them.
TEST(CpuFastKernels, Avx512EmulationIsExact) {
  const KernelSet& emu = emu::avx512_emulated();
  const KernelSet* real = kernels_for("avx512");
  std::printf("avx512-vnni here: %s\n", real ? "yes, compared bit for bit" : "no (definition only)");
  for (int bits : {4, 8}) {
    RandMatrix rm(37, 320, bits, 64, 5u + bits);
    std::vector<std::shared_ptr<PackedBuffer>> owners;
    const PackedMatrix P = pack_matrix({rm.m}, emu.rows_per_tile, "test", owners, nullptr);
    const PackedMatrix P16 = pack_matrix({rm.m}, 16, "test", owners, nullptr);
    for (int levels : {1, 2})
      for (int64_t n : {1, 3, 4, 6}) {
        const auto x = rand_x(n, 320, uint32_t(n + 10 * levels));
        ActBuffer ab;
        QActs X = ab.resize(n, 320, levels);
        for (int64_t t = 0; t < n; ++t) ab.quantize_row(t, x.data() + t * 320);
        const auto want = expected(rm.m, X, P.mid);
        std::vector<float> y(static_cast<size_t>(n * 37)), yr(y.size());
        emu.gemm(P, 0, P.tiles, X, y.data(), 37);
        for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], want[i], 2e-5 * (1 + std::fabs(want[i]))) << bits << " " << i;
        if (real) {
          real->gemm(P16, 0, P16.tiles, X, yr.data(), 37);
          EXPECT_EQ(0, std::memcmp(y.data(), yr.data(), y.size() * sizeof(float))) << "bits " << bits << " levels " << levels << " n " << n;
        }
      }
  }
  for (int64_t n : {64, 133, 256}) {
    const auto a = rand_x(1, n, 3), b = rand_x(1, n, 4);
    std::vector<uint16_t> b16(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) b16[i] = f32_to_f16(b[i]);
    double want = 0;
    for (int64_t i = 0; i < n; ++i) want += double(a[i]) * b[i];
    EXPECT_NEAR(emu.dot(a.data(), b.data(), n), want, 1e-4);
    std::vector<float> y(b), y16(b), yr(b), yr16(b);
    emu.axpy(0.3f, a.data(), y.data(), n);
    emu.axpy_f16(0.3f, b16.data(), y16.data(), n);
    for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(y[i], b[i] + 0.3 * a[i], 1e-5);
    if (!real) continue;
    EXPECT_EQ(emu.dot(a.data(), b.data(), n), real->dot(a.data(), b.data(), n)) << n;
    EXPECT_EQ(emu.dot_f16(a.data(), b16.data(), n), real->dot_f16(a.data(), b16.data(), n)) << n;
    real->axpy(0.3f, a.data(), yr.data(), n);
    real->axpy_f16(0.3f, b16.data(), yr16.data(), n);
    EXPECT_EQ(0, std::memcmp(y.data(), yr.data(), size_t(n) * sizeof(float))) << n;
    EXPECT_EQ(0, std::memcmp(y16.data(), yr16.data(), size_t(n) * sizeof(float))) << n;
  }
}

// The result for a token does not depend on the other tokens of the call (bit for bit), nor on how
// the tiles are split.
TEST(CpuFastKernels, GemmIsBatchInvariant) {
  for (const KernelSet* k : available_kernels()) {
    for (int bits : {4, 8})
    for (int levels : {1, 2}) {
      RandMatrix rm(70, 256, bits, 64, 11u + bits);
      std::vector<std::shared_ptr<PackedBuffer>> owners;
      const PackedMatrix P = pack_matrix({rm.m}, k->rows_per_tile, "test", owners, nullptr);
      const int64_t n = 9;
      const auto x = rand_x(n, 256, 5);
      ActBuffer ab;
      QActs X = ab.resize(n, 256, levels);
      for (int64_t t = 0; t < n; ++t) ab.quantize_row(t, x.data() + t * 256);
      std::vector<float> all(static_cast<size_t>(n * 70));
      k->gemm(P, 0, P.tiles, X, all.data(), 70);
      for (int64_t t = 0; t < n; ++t) {
        std::vector<float> one(70);
        for (int64_t tile = 0; tile < P.tiles; ++tile) k->gemm(P, tile, tile + 1, act_rows(X, t, t + 1), one.data(), 70);
        EXPECT_EQ(0, std::memcmp(one.data(), all.data() + t * 70, 70 * sizeof(float)))
            << k->name << " bits " << bits << " levels " << levels << " t " << t;
      }
    }
  }
}

// Against the fp32 reference (cpu::qmatvec on unquantized activations, one outlier): one int8 level
// leaves ~0.7 % relative error, the two-level activations the backend uses ~0.003 %.
TEST(CpuFastKernels, GemmCloseToFp32Reference) {
  for (const KernelSet* k : available_kernels()) {
    for (int bits : {4, 8})
    for (int levels : {1, 2}) {
      RandMatrix rm(96, 1024, bits, 64, 21u + bits);
      std::vector<std::shared_ptr<PackedBuffer>> owners;
      const PackedMatrix P = pack_matrix({rm.m}, k->rows_per_tile, "test", owners, nullptr);
      const auto x = rand_x(1, 1024, 8);
      std::vector<float> ref(96), y(96);
      cpu::qmatvec(rm.m, x.data(), ref.data());
      ActBuffer ab;
      QActs X = ab.resize(1, 1024, levels);
      ab.quantize_row(0, x.data());
      k->gemm(P, 0, P.tiles, X, y.data(), 96);
      double num = 0, den = 0;
      for (int r = 0; r < 96; ++r) {
        num += (y[r] - ref[r]) * (y[r] - ref[r]);
        den += ref[r] * ref[r];
      }
      EXPECT_LT(std::sqrt(num / den), levels == 1 ? 1e-2 : 1e-4) << k->name << " bits " << bits << " levels " << levels;
    }
  }
}

// Stacked parts and a dense part (re-quantized to 8 bits per 64) in one packed matrix.
TEST(CpuFastKernels, PackStacksPartsAndRequantizesDense) {
  RandMatrix a(10, 128, 4, 64, 1), b(7, 128, 8, 64, 2);
  std::vector<float> dense(5 * 128);
  for (size_t i = 0; i < dense.size(); ++i) dense[i] = std::sin(float(i));
  QMatrix d;
  d.rows = 5;
  d.cols = 128;
  d.dense = dense.data();
  std::vector<std::shared_ptr<PackedBuffer>> owners;
  const PackedMatrix P = pack_matrix({a.m, b.m, d}, 8, "test", owners, nullptr);
  EXPECT_EQ(P.rows, 22);
  EXPECT_EQ(P.bits, 8);
  EXPECT_EQ(P.mid, 0.f);  // 4- and 8-bit rows stacked: no common mid level
  const auto x = rand_x(1, 128, 4);
  ActBuffer ab;
  QActs X = ab.resize(1, 128, 2);
  ab.quantize_row(0, x.data());
  std::vector<float> y(22);
  kernels_scalar()->gemm(P, 0, P.tiles, X, y.data(), 22);
  const auto wa = expected(a.m, X, P.mid), wb = expected(b.m, X, P.mid);
  for (int r = 0; r < 10; ++r) EXPECT_NEAR(y[r], wa[r], 1e-4 * (1 + std::fabs(wa[r])));
  for (int r = 0; r < 7; ++r) EXPECT_NEAR(y[10 + r], wb[r], 1e-4 * (1 + std::fabs(wb[r])));
  // 8 bits per 64: |error| <= 128 * (range / 255 / 2) * max|x| in the worst case; typically far less.
  for (int r = 0; r < 5; ++r) EXPECT_NEAR(y[17 + r], cpu::dot(dense.data() + r * 128, x.data(), 128), 0.05);
  EXPECT_THROW(pack_matrix({RandMatrix(4, 96, 4, 32, 3).m}, 8, "odd", owners, nullptr), lilac::Error);
}

TEST(CpuFastKernels, FloatHelpersOnEveryIsa) {
  const auto a = rand_x(1, 133, 1), b = rand_x(1, 133, 2);
  std::vector<uint16_t> bb(133);
  for (int i = 0; i < 133; ++i) bb[i] = f32_to_f16(b[i]);
  bb[5] = 0x0001;   // the smallest subnormal half, 2^-24
  bb[6] = 0x83ff;   // the largest negative subnormal
  bb[7] = 0x7bff;   // 65504, the largest half
  double want = 0, want16 = 0;
  for (int i = 0; i < 133; ++i) {
    want += double(a[i]) * b[i];
    want16 += double(a[i]) * f16_to_f32(bb[i]);
  }
  for (const KernelSet* k : available_kernels()) {
    EXPECT_NEAR(k->dot(a.data(), b.data(), 133), want, 1e-4) << k->name;
    EXPECT_NEAR(k->dot_f16(a.data(), bb.data(), 133), want16, 1e-4 * (1 + std::fabs(want16))) << k->name;
    std::vector<float> y(b), y16(b);
    k->axpy(0.5f, a.data(), y.data(), 133);
    k->axpy_f16(0.5f, bb.data(), y16.data(), 133);
    for (int i = 0; i < 133; ++i) {
      EXPECT_NEAR(y[i], b[i] + 0.5 * a[i], 1e-5) << k->name;
      EXPECT_NEAR(y16[i], b[i] + 0.5 * f16_to_f32(bb[i]), 1e-5 * (1 + std::fabs(y16[i]))) << k->name;
    }
  }
}

// f32_to_f16 (core/bf16.h), the K/V cache's rounding: exact on every half, nearest even between two,
// subnormals, overflow to inf from 65520 on, NaN; round trip through f16_to_f32.
TEST(CpuFastKernels, HalfConversion) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu)) continue;  // NaN payloads
    EXPECT_EQ(f32_to_f16(f16_to_f32(uint16_t(h))), h) << std::hex << h;
  }
  // Halfway between 1 and the next half (1 + 2^-10): to even (1); just above: up.
  EXPECT_EQ(f32_to_f16(1.f + 0x1p-11f), 0x3c00);
  EXPECT_EQ(f32_to_f16(1.f + 0x1p-11f + 0x1p-20f), 0x3c01);
  EXPECT_EQ(f32_to_f16(1.f + 3 * 0x1p-11f), 0x3c02);  // halfway between 0x3c01 and 0x3c02: even
  EXPECT_EQ(f32_to_f16(65519.f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.f), 0x7c00);
  EXPECT_EQ(f32_to_f16(-1e10f), 0xfc00);
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);               // half the smallest subnormal: to even (0)
  EXPECT_EQ(f32_to_f16(0x1p-25f + 0x1p-30f), 0x0001);
  EXPECT_EQ(f32_to_f16(0x1p-14f - 0x1p-26f), 0x0400);    // rounds up into the smallest normal
  EXPECT_EQ(f32_to_f16(-0.f), 0x8000);
  EXPECT_EQ(f32_to_f16(NAN) & 0x7e00, 0x7e00);
  // Relative error of the rounding: at most 2^-11 on normal halves (8x below bf16's 2^-8).
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-100.f, 100.f);
  for (int i = 0; i < 10000; ++i) {
    const float x = u(rng);
    if (std::fabs(x) < 0x1p-14f) continue;
    EXPECT_LE(std::fabs(f16_to_f32(f32_to_f16(x)) - x), std::fabs(x) * 0x1p-11f) << x;
  }
}

// The self-check the ARM64 cross build runs under qemu (scripts/cross-check-arm64.sh), here on every
// set this CPU has; and forcing the portable level through LILAC_CPU_ISA.
TEST(CpuFastKernels, SelfCheckOnEveryIsaAndForcedLevel) {
  for (const KernelSet* k : available_kernels()) EXPECT_EQ(kernel_selfcheck(*k, 7), "") << k->name;
  setenv("LILAC_CPU_ISA", "scalar", 1);
  EXPECT_STREQ(best_kernels().name, "scalar");
  setenv("LILAC_CPU_ISA", "vax", 1);
  EXPECT_THROW(best_kernels(), lilac::Error);
  unsetenv("LILAC_CPU_ISA");
  EXPECT_EQ(&best_kernels(), available_kernels().back());
}

// The fast chunked Gated DeltaNet against the reference's chunked form and its token-by-token
// recurrence (random unit-norm keys, decays in (0, 1), odd T spanning several chunks), every ISA.
TEST(CpuFastKernels, GdnChunkedMatchesReference) {
  const int dk = 32, dv = 48;
  const int64_t T = 150;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> q(T * dk), k(T * dk), v(T * dv), g(T), beta(T), S0(dk * dv);
  for (auto& x : q) x = nd(rng);
  for (auto& x : k) x = nd(rng);
  for (auto& x : v) x = nd(rng);
  for (auto& x : S0) x = 0.1f * nd(rng);
  for (int64_t t = 0; t < T; ++t) {
    cpu::l2norm(q.data() + t * dk, dk);
    cpu::l2norm(k.data() + t * dk, dk);
    g[t] = -0.3f * std::fabs(nd(rng));
    beta[t] = 1.f / (1.f + std::exp(-nd(rng)));
  }
  std::vector<float> Sr = S0, orf(T * dv), Ss = S0, os(T * dv), u(dv);
  cpu::gdn_chunked(Sr.data(), q.data(), dk, k.data(), dk, v.data(), dv, g.data(), beta.data(), T, dk, dv, orf.data(), dv);
  for (int64_t t = 0; t < T; ++t)
    gdn_step_fast(Ss.data(), q.data() + t * dk, k.data() + t * dk, v.data() + t * dv, g[t], beta[t], dk, dv,
                  os.data() + t * dv, u.data());
  for (size_t i = 0; i < orf.size(); ++i) ASSERT_NEAR(os[i], orf[i], 2e-4) << "step " << i;
  for (const KernelSet* ks : available_kernels()) {
    std::vector<float> S = S0, o(T * dv), scratch;
    gdn_chunked_fast(*ks, S.data(), q.data(), dk, k.data(), dk, v.data(), dv, g.data(), beta.data(), T, dk, dv, o.data(), dv,
                     scratch);
    for (size_t i = 0; i < o.size(); ++i) ASSERT_NEAR(o[i], orf[i], 1e-4) << ks->name << " " << i;
    for (size_t i = 0; i < S.size(); ++i) ASSERT_NEAR(S[i], Sr[i], 1e-4) << ks->name << " state " << i;
  }
}

// The ISA files are compiled with wider target flags than the rest: they may include only kernels.h
// (plain structs, static inline helpers) and intrinsics / C headers, so that no inline function or
// template shared with other files gets an AVX / NEON copy the linker could pick for everyone.
TEST(CpuFastKernels, IsaFilesIncludeOnlyKernelsHeaderAndIntrinsics) {
  const std::set<std::string> allowed{"\"cpufast/kernels.h\"", "<immintrin.h>", "<arm_neon.h>", "<cstring>", "<cstdint>"};
  for (const char* f : {"kernels_scalar.cpp", "kernels_avx2.cpp", "kernels_avx512.cpp", "kernels_neon.cpp"}) {
    std::ifstream in(std::string(LILAC_SOURCE_DIR) + "/src/cpufast/" + f);
    ASSERT_TRUE(in) << f;
    std::string line;
    int includes = 0;
    while (std::getline(in, line)) {
      if (line.rfind("#include ", 0) != 0) continue;
      ++includes;
      const std::string what = line.substr(9);
      EXPECT_TRUE(allowed.count(what)) << f << " includes " << what;
    }
    EXPECT_GE(includes, 1) << f;
  }
}
