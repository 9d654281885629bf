#include "cpufast/pack.h"

#include <bit>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.h"
#include "model/quant.h"

namespace lilac::cpufast {

PackedBuffer::PackedBuffer(size_t bytes) : size(bytes) {
  data = static_cast<uint8_t*>(std::aligned_alloc(64, std::max<size_t>(64, (bytes + 63) / 64 * 64)));
  if (!data) throw Error("cpu backend: out of memory packing " + std::to_string(bytes) + " bytes of weights");
}

PackedBuffer::~PackedBuffer() { std::free(data); }

bool packs_exactly(const QMatrix& m) {
  return m.quantized() && (m.bits == 4 || m.bits == 8) && m.group_size % kBlock == 0;
}

static_assert(std::endian::native == std::endian::little, "pack.cpp reads MLX words as little-endian bytes");

namespace {

// One row of one part as q values [cols] and a bf16 scale / bias per 64-block.
void row_values(const QMatrix& m, int64_t r, uint8_t* q, uint16_t* sc, uint16_t* bi, std::vector<float>& tmp,
                std::vector<uint32_t>& words) {
  const int64_t blocks = m.cols / kBlock;
  if (packs_exactly(m)) {
    // Element j sits in bits [j*bits, (j+1)*bits) of the row's little-endian words: byte j/2 (4-bit,
    // low nibble first) or byte j (8-bit).
    const uint8_t* bytes = reinterpret_cast<const uint8_t*>(m.qweight + r * m.words_per_row());
    if (m.bits == 8) {
      std::memcpy(q, bytes, static_cast<size_t>(m.cols));
    } else {
      for (int64_t k = 0; k < m.cols / 2; ++k) {
        q[2 * k] = bytes[k] & 15;
        q[2 * k + 1] = bytes[k] >> 4;
      }
    }
    const int per = m.group_size / kBlock;
    for (int64_t b = 0; b < blocks; ++b) {
      sc[b] = m.scales[r * m.groups_per_row() + b / per];
      bi[b] = m.biases[r * m.groups_per_row() + b / per];
    }
    return;
  }
  tmp.resize(static_cast<size_t>(m.cols));
  words.resize(static_cast<size_t>(m.cols / 4));
  if (m.quantized())
    dequantize_row(m, r, tmp.data());
  else
    std::memcpy(tmp.data(), m.dense + r * m.cols, static_cast<size_t>(m.cols) * sizeof(float));
  quantize_row(tmp.data(), m.cols, 8, kBlock, words.data(), sc, bi);
  unpack_bits(words.data(), m.cols, 8, q);
}

}  // namespace

PackedMatrix pack_matrix(const std::vector<QMatrix>& parts, int R, const char* what,
                         std::vector<std::shared_ptr<PackedBuffer>>& owners, ThreadPool* pool) {
  LILAC_CHECK(!parts.empty(), std::string("pack_matrix: no parts for ") + what);
  PackedMatrix P;
  P.cols = parts[0].cols;
  P.bits = 4;
  bool all4 = true, all8 = true;
  for (const QMatrix& m : parts) {
    if (m.cols != P.cols)
      throw Error(std::string("cpu backend: ") + what + ": parts have " + std::to_string(P.cols) + " and " +
                  std::to_string(m.cols) + " columns");
    const bool four = packs_exactly(m) && m.bits == 4;
    if (!four) P.bits = 8;
    all4 = all4 && four;
    all8 = all8 && !four;
    P.rows += m.rows;
  }
  P.mid = all4 ? 7.5f : all8 ? 127.5f : 0.f;
  if (P.cols % kBlock != 0 || P.cols == 0)
    throw Error(std::string("cpu backend: ") + what + " has " + std::to_string(P.cols) +
                " columns, not a multiple of 64 (use --backend cpu-ref)");
  P.R = R;
  P.tiles = (P.rows + R - 1) / R;
  P.blocks = P.cols / kBlock;
  P.block_bytes = int64_t(R) * kBlock * P.bits / 8 + 4 * R;
  auto buf = std::make_shared<PackedBuffer>(size_t(P.tiles * P.blocks * P.block_bytes));
  std::memset(buf->data, 0, buf->size);
  P.data = buf->data;
  owners.push_back(buf);
  // Row index -> (part, row in part).
  std::vector<int64_t> starts;
  int64_t acc = 0;
  for (const QMatrix& m : parts) {
    starts.push_back(acc);
    acc += m.rows;
  }
  const int64_t qbytes = P.block_bytes - 4 * R;
  parallel_for(pool, P.tiles, [&](int64_t t0, int64_t t1) {
    std::vector<uint8_t> q(static_cast<size_t>(P.cols));
    std::vector<uint16_t> sc(static_cast<size_t>(P.blocks)), bi(static_cast<size_t>(P.blocks));
    std::vector<float> tmp;
    std::vector<uint32_t> words;
    for (int64_t tile = t0; tile < t1; ++tile) {
      uint8_t* tp = buf->data + tile * P.blocks * P.block_bytes;
      for (int r = 0; r < R; ++r) {
        const int64_t row = tile * R + r;
        if (row >= P.rows) break;
        const size_t part = size_t(std::upper_bound(starts.begin(), starts.end(), row) - starts.begin() - 1);
        row_values(parts[part], row - starts[part], q.data(), sc.data(), bi.data(), tmp, words);
        for (int64_t b = 0; b < P.blocks; ++b) {
          uint8_t* bp = tp + b * P.block_bytes;
          const uint8_t* qb = q.data() + b * kBlock;
          if (P.bits == 4) {
            for (int c = 0; c < 8; ++c)
              for (int i = 0; i < 4; ++i)
                bp[(c * R + r) * 4 + i] = uint8_t(qb[4 * c + i] | (qb[32 + 4 * c + i] << 4));
          } else {
            for (int c = 0; c < 16; ++c)
              for (int i = 0; i < 4; ++i) bp[(c * R + r) * 4 + i] = qb[4 * c + i];
          }
          std::memcpy(bp + qbytes + 2 * r, &sc[static_cast<size_t>(b)], 2);
          std::memcpy(bp + qbytes + 2 * R + 2 * r, &bi[static_cast<size_t>(b)], 2);
        }
      }
    }
  }, 16);
  return P;
}

}  // namespace lilac::cpufast
