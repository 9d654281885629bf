// The fast CPU path's attention core over a session's f16 K/V cache (forward.h), for any number of query
// rows: decode (one row per session), batches and prefill chunks share it. A task is one kv head, some of
// the query heads that read it, and a block of consecutive queries of one session; it converts each tile of
// K and V rows to fp32 once for all of its (query, head) rows and runs those rows through the kernel set's
// several-row helpers (kernels.h: dots, axpys), which give every row exactly the one-row helpers' bits. So
// a row's result does not depend on which rows share its task: the same token gives the same output
// decoded alone, in a batch, or anywhere in a prefill chunk.
//
// Per (query, head) row, as before tiles: s_j = (q · k_j) · scale for j = 0 .. pos (its position), m = max s_j,
// p_j = exp(s_j − m), o = Σ_j p_j v_j (in j order), out = o · (1 / Σ_j p_j) [· sigmoid(gate)].
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "cpufast/forward.h"
#include "cpufast/kernels.h"

namespace lilac::cpufast {

struct AttentionTask {
  int seg = 0, kv = 0, h0 = 0, h1 = 0;  // segment, kv head, query heads [h0, h1) (of that kv head's group)
  int64_t t0 = 0, t1 = 0;               // the segment's new rows [t0, t1)
};

// The tasks of one layer over `segs`: blocks of up to 16 queries (fewer when long contexts would make a
// task's scores large), the group's heads split when there would be fewer than two tasks per thread.
std::vector<AttentionTask> attention_tasks(std::span<const Segment> segs, int kv_heads, int group, int threads);

struct AttentionShape {
  int heads = 0, head_dim = 0;  // query heads, their width
  int64_t kv_dim = 0;           // a cache row: kv heads × head_dim
  float scale = 1.f;            // 1 / sqrt(head_dim)
};

// Rows for queries at positions pos0 .. pos0 + nq − 1 (query i sees cache rows 0 .. pos0 + i), heads [h0, h1)
// of kv head `kv`: q, gate (nullptr: no output gate) and out are [nq][heads × head_dim] from the first query.
void attention_rows(const KernelSet& k, const AttentionShape& s, const uint16_t* K, const uint16_t* V, int64_t pos0,
                    int64_t nq, int kv, int h0, int h1, const float* q, const float* gate, float* out);

}  // namespace lilac::cpufast
