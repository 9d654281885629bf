// MoE down (gemv/gemv_tc.cu) reads the selected expert ids before its PDL wait, because MoE gate/up publishes
// them before its trigger, and reads them again after the wait. Here the predecessor is a kernel that
// triggers at once and publishes the ids only ~50 µs later, so the early read sees the previous ids: the
// output must still be the combine over the ids published last (CPU reference, fresh seed).
#include <gtest/gtest.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "cpu/ops.h"
#include "cuda/kernels/gemv/gemv.h"
#include "cuda/kernels/launch.cuh"
#include "cuda/kernels/ptx.cuh"
#include "decode_test_util.h"

using namespace lilac;
namespace lc = lilac::cuda;

namespace {

using namespace lilac::cuda::testing;

__global__ void publish_late(const int32_t* ids, const float* wts, int k, int32_t* sel_ids, float* sel_w,
                             unsigned long long delay_ns) {
  lc::dev::pdl_wait();
  lc::dev::pdl_trigger();  // the dependant may start now, before the ids below are written
  const unsigned long long t0 = lc::dev::globaltimer();
  while (lc::dev::globaltimer() - t0 < delay_ns) {
  }
  if (int(threadIdx.x) < k) sel_ids[threadIdx.x] = ids[threadIdx.x];
  if (int(threadIdx.x) <= k) sel_w[threadIdx.x] = wts[threadIdx.x];
}

TEST(CudaDecode, MoEDownRechecksEarlyIds) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  const int E = 64, k = 8;
  const int64_t H = 320, I = 512, Is = 576;  // K = 8·512 + 576: 19 k-tiles, three for some warps
  HostQ gate(r, I * E, H, 4), up(r, I * E, H, 4), down(r, H * E, I, 4), sg(r, Is, H, 4), su(r, Is, H, 4),
      sd(r, H, Is, 4);
  DevMoE dmoe(gate, up, down, sg, su, sd, E, k, I, H);

  // stale ids 0..7 in the buffers; the published ones: 8 distinct random experts, random weights
  std::vector<int32_t> stale(k), ids(E);
  std::iota(stale.begin(), stale.end(), 0);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937_64(seed));
  ids.resize(k);
  std::vector<float> stale_w(k + 1, 0.25f), wts(k + 1);
  for (auto& v : wts) v = r.uni(0.05f, 1.f);
  const auto act = randv(r, size_t(k * I + Is));
  const auto y0 = randv(r, size_t(H));

  // reference: y0 + Σ_t wts[t] · down_{ids[t]} · act_t + wts[k] · shared_down · act_shared
  QExperts dn;
  dn.n = E;
  dn.first = down.m;
  dn.first.rows = H;
  std::vector<float> ref(static_cast<size_t>(H), 0.f), tmp(static_cast<size_t>(H));
  for (int t = 0; t <= k; ++t) {
    cpu::qmatvec(t < k ? dn.expert(ids[size_t(t)]) : sd.m, act.data() + t * I, tmp.data());
    for (int64_t i = 0; i < H; ++i) ref[size_t(i)] += wts[size_t(t)] * tmp[size_t(i)];
  }

  Dev<int32_t> sel(stale), dids(ids);
  Dev<float> selw(stale_w), dwts(wts), dact(act), y(y0);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  lc::launch_pdl(publish_late, dim3(1), dim3(32), 0, s, dids.p, dwts.p, k, sel.p, selw.p, 50000ull);
  lc::moe_down(dmoe.w, sel.p, selw.p, dact.p, y.p, s);
  CK(cudaStreamSynchronize(s));
  CK(cudaStreamDestroy(s));
  auto got = y.get();
  for (size_t i = 0; i < got.size(); ++i) got[i] -= y0[i];
  EXPECT_LE(rel_err(got, ref), 1e-5);
}

}  // namespace
