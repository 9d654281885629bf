// The sequence pool: the per-sequence states (seq_state.h) of up to rows::kMaxRows sessions of one
// capacity (max_len) in slot-strided device arrays, so that the rows step (rows_step.h) reaches slot s of
// every pool at base + s * stride. Each array is slot-major ([slot][...]): a slot's GDN states of all layers
// are one block, its KV cache of layer i is rows [0, max_len) of K_i / V_i at s * kv_stride.
//
// Capacity grows on demand (1, 2, 4, ... kMaxRows slots): when a slot is wanted and none is free the arrays
// are reallocated at twice the size, the old contents copied to their prefix (the device is synchronised
// first), and every holder of a slot is told to re-read its views (PoolClient::pool_moved) — so do not
// create sessions while other sessions of the backend are running work on other threads (the server
// creates its sessions at start). Only what exists is allocated; `lilac bench --batch` and the server's
// memory figures see the real size.
//
// The pool also holds what the batched decode step of its slots needs: the RowsState view of the arrays
// (rows_state(), rebuilt on every move) and the BatchStep (batch_step.h), made on first use.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "cuda/device_model.h"
#include "cuda/rows_step.h"
#include "cuda/seq_state.h"

namespace lilac::cuda {

class BatchStep;

// Holder of a pool slot (a session): called after the pool's arrays moved (old views are invalid).
class PoolClient {
 public:
  virtual ~PoolClient() = default;
  virtual void pool_moved() = 0;
};

class SeqPool {
 public:
  // log_rows: GDN log rows per slot for Log-mode steps (speculative verify); 0 = none.
  SeqPool(const DevModel& m, int64_t max_len, int log_rows = 0);
  ~SeqPool();
  SeqPool(const SeqPool&) = delete;
  SeqPool& operator=(const SeqPool&) = delete;

  int64_t max_len() const { return max_len_; }
  int log_rows() const { return log_rows_; }
  int capacity() const { return cap_; }
  int used() const;
  // A free slot for `c` (growing the arrays when all are taken: to twice the slots, or to one more when
  // twice does not fit), or -1 when kMaxRows slots are taken. Throws lilac::Error when the device memory
  // for the larger arrays cannot be allocated (the pool stays as it was).
  int acquire(PoolClient* c);
  // Grows the arrays to at least `slots` (<= kMaxRows) now; the same errors as acquire.
  void reserve(int slots);
  void release(int slot);
  // Views of slot s (SeqState: len 0, the caller keeps its own len).
  SeqState view(int slot) const;
  const RowsState& rows_state() const { return rows_; }
  // Counts reallocations (graphs captured on the arrays must be re-captured when it changes).
  uint64_t generation() const { return gen_; }
  // The batched step of this pool's slots (allocated on first use).
  BatchStep& batch();
  // Device bytes one slot takes.
  static size_t slot_bytes(const DevModel& m, int64_t max_len, int log_rows);

 private:
  struct Arrays;
  void build_rows_state();
  void grow_to(int cap2);  // under mu_
  std::unique_ptr<Arrays> alloc(int cap) const;

  const DevModel& m_;
  int64_t max_len_ = 0;
  int log_rows_ = 0;
  SeqShape sh_;
  int64_t kv_stride_ = 0;  // elements between slots in one layer's K (V) array
  int64_t log_floats_ = 0;  // floats of one GDN layer's log per slot
  int cap_ = 0;
  uint64_t gen_ = 0;
  std::unique_ptr<Arrays> a_;
  mutable std::mutex mu_;            // guards owner_ (acquire / release / used)
  std::vector<PoolClient*> owner_;  // per slot, null = free
  RowsState rows_;
  std::unique_ptr<BatchStep> batch_;
};

}  // namespace lilac::cuda
