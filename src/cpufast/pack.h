// Repacking the model's MLX affine matrices into the fast path's tiled layout (kernels.h), once at
// load. The packed copy replaces the quantized weights for this backend (the checkpoint's pages are
// only read while packing); nothing is ever expanded to fp32.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/thread_pool.h"
#include "cpufast/kernels.h"
#include "model/weights.h"

namespace lilac::cpufast {

// Owner of packed bytes (64-byte aligned).
struct PackedBuffer {
  explicit PackedBuffer(size_t bytes);
  ~PackedBuffer();
  PackedBuffer(const PackedBuffer&) = delete;
  PackedBuffer& operator=(const PackedBuffer&) = delete;
  uint8_t* data = nullptr;
  size_t size = 0;
};

// Whether `m` can be packed as it is (4 or 8 bits, groups a multiple of 64); otherwise pack_matrix
// re-quantizes it to 8 bits per 64 (dense fp32 matrices, other group sizes).
bool packs_exactly(const QMatrix& m);

// The matrices `parts` (same number of columns, a multiple of 64) stacked by rows into one packed
// matrix of R rows per tile: 4-bit when every part packs exactly at 4 bits, else 8-bit (4-bit parts
// keep their exact values in the 8-bit layout). Throws lilac::Error naming `what` when the columns
// differ or are not a multiple of 64.
PackedMatrix pack_matrix(const std::vector<QMatrix>& parts, int R, const char* what,
                         std::vector<std::shared_ptr<PackedBuffer>>& owners, ThreadPool* pool);

// Bytes a packed matrix holds.
inline size_t packed_bytes(const PackedMatrix& m) { return size_t(m.tiles * m.blocks * m.block_bytes); }

}  // namespace lilac::cpufast
