#include "cpufast/selfcheck.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "core/bf16.h"

namespace lilac::cpufast {

namespace {

struct Rng {
  uint64_t s;
  uint64_t next() {
    s += 0x9e3779b97f4a7c15ull;
    uint64_t x = s;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  }
  float uniform() { return float(next() >> 40) / float(1 << 24); }
};

uint16_t bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

}  // namespace

std::string kernel_selfcheck(const KernelSet& k, uint64_t seed) {
  Rng rng{seed};
  const KernelSet& ref = *kernels_scalar();
  for (int bits : {4, 8}) {
    PackedMatrix W;
    W.rows = 37;
    W.cols = 192;
    W.bits = bits;
    W.R = k.rows_per_tile;
    W.tiles = (W.rows + W.R - 1) / W.R;
    W.blocks = W.cols / kBlock;
    W.block_bytes = int64_t(W.R) * kBlock * bits / 8 + 4 * W.R;
    W.mid = bits == 4 ? 7.5f : 127.5f;
    std::vector<uint8_t> data(size_t(W.tiles * W.blocks * W.block_bytes), 0);
    const int64_t qbytes = W.block_bytes - 4 * W.R;
    for (int64_t t = 0; t < W.tiles; ++t)
      for (int64_t b = 0; b < W.blocks; ++b) {
        uint8_t* bp = data.data() + (t * W.blocks + b) * W.block_bytes;
        for (int r = 0; r < W.R && t * W.R + r < W.rows; ++r) {
          for (int c = 0; c < qbytes / (4 * W.R); ++c)
            for (int i = 0; i < 4; ++i) bp[(c * W.R + r) * 4 + i] = uint8_t(rng.next());
          const uint16_t s = bf16((0.5f + rng.uniform()) * 0.01f), o = bf16(-rng.uniform() * 0.1f);
          std::memcpy(bp + qbytes + 2 * r, &s, 2);
          std::memcpy(bp + qbytes + 2 * W.R + 2 * r, &o, 2);
        }
      }
    W.data = data.data();
    for (int levels : {1, 2})
      for (int64_t n = 1; n <= 6; ++n) {
        std::vector<int8_t> q(size_t(n * W.cols)), q2(q.size());
        std::vector<float> d(size_t(n * W.blocks)), sum(d.size()), rsum(d.size()), d2(d.size());
        for (auto& v : q) v = int8_t(int(rng.next() % 255) - 127);
        for (auto& v : q2) v = int8_t(int(rng.next() % 255) - 127);
        for (size_t i = 0; i < d.size(); ++i) {
          d[i] = 0.01f + rng.uniform() * 0.02f;
          d2[i] = d[i] / 254.f;
          sum[i] = (rng.uniform() - 0.5f) * 8.f;
          rsum[i] = (rng.uniform() - 0.5f) * d2[i] * 8.f;
        }
        QActs X;
        X.n = n;
        X.cols = W.cols;
        X.blocks = W.blocks;
        X.q = q.data();
        X.d = d.data();
        X.sum = sum.data();
        X.rsum = rsum.data();
        if (levels == 2) {
          X.q2 = q2.data();
          X.d2 = d2.data();
        }
        std::vector<float> want(size_t(n * W.rows), 0.f), got(want.size(), NAN);
        ref.gemm(W, 0, W.tiles, X, want.data(), W.rows);
        k.gemm(W, 0, W.tiles, X, got.data(), W.rows);
        for (size_t i = 0; i < want.size(); ++i)
          if (!(std::fabs(got[i] - want[i]) <= 1e-5f * (1.f + std::fabs(want[i]))))
            return std::string(k.name) + ": bits " + std::to_string(bits) + ", levels " + std::to_string(levels) +
                   ", " + std::to_string(n) + " tokens, output " + std::to_string(i) + ": " + std::to_string(got[i]) +
                   " vs scalar " + std::to_string(want[i]);
      }
  }
  // Float helpers.
  std::vector<float> a(133), b(133), y1(133), y2(133);
  std::vector<uint16_t> b16(133);
  for (int i = 0; i < 133; ++i) {
    a[size_t(i)] = rng.uniform() - 0.5f;
    b[size_t(i)] = rng.uniform() - 0.5f;
    b16[size_t(i)] = f32_to_f16(b[size_t(i)]);
  }
  if (std::fabs(k.dot(a.data(), b.data(), 133) - ref.dot(a.data(), b.data(), 133)) > 1e-4f ||
      std::fabs(k.dot_f16(a.data(), b16.data(), 133) - ref.dot_f16(a.data(), b16.data(), 133)) > 1e-4f)
    return std::string(k.name) + ": dot differs from scalar";
  y1 = b;
  y2 = b;
  k.axpy_f16(0.3f, b16.data(), y1.data(), 133);
  ref.axpy_f16(0.3f, b16.data(), y2.data(), 133);
  k.axpy(0.7f, a.data(), y1.data(), 133);
  ref.axpy(0.7f, a.data(), y2.data(), 133);
  for (int i = 0; i < 133; ++i)
    if (std::fabs(y1[size_t(i)] - y2[size_t(i)]) > 1e-5f) return std::string(k.name) + ": axpy differs from scalar";
  // The several-row helpers equal the set's own one-row helpers bit for bit (kernels.h); the conversion is exact.
  const int64_t n = 128, m = 5;
  std::vector<float> B(static_cast<size_t>(m * n)), p(static_cast<size_t>(m)), d1(static_cast<size_t>(m)), f(133);
  for (size_t i = 0; i < B.size(); ++i) B[i] = rng.uniform() - 0.5f;
  for (size_t i = 0; i < p.size(); ++i) p[i] = rng.uniform();
  k.dots(a.data(), B.data(), n, m, n, d1.data());
  for (int64_t j = 0; j < m; ++j)
    if (d1[size_t(j)] != k.dot(a.data(), B.data() + j * n, n)) return std::string(k.name) + ": dots differs from dot";
  y1 = b;
  y2 = b;
  k.axpys(p.data(), B.data(), n, m, y1.data(), n);
  for (int64_t j = 0; j < m; ++j) k.axpy(p[size_t(j)], B.data() + j * n, y2.data(), n);
  if (y1 != y2) return std::string(k.name) + ": axpys differs from axpy";
  k.f16_to_f32(b16.data(), f.data(), 133);
  for (int i = 0; i < 133; ++i)
    if (f[size_t(i)] != f16_to_f32(b16[size_t(i)])) return std::string(k.name) + ": f16_to_f32 is not exact";
  return "";
}

}  // namespace lilac::cpufast
