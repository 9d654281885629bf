// The decode GEMV family (src/cuda/kernels/gemv/) at the model's shapes, tensor-core kernels:
//   GemvTc/<matrix>: one dense GEMV — µs per launch over a graph of 50 back-to-back launches (4 replays
//     after a warm-up replay; L2 holds what fits of the weights), the bandwidth that implies, and the
//     per-block phase trace of one launch (gemv_tc_trace): medians after the first block entry of
//     entry / after the PDL wait / input copies landed / staged / first group done / exit (+ max exit).
//   MoeTc: MoE gate/up + down of one layer (256 experts, top 8 + shared; the same experts each layer:
//     L2-warm), µs per layer over 20 copies x 5 replays, then the phase trace of each of the two kernels.
// Each case first checks the tensor-core result against the fp32 kernel once (relative error ≤ 2e-6,
// else the case reports an error). Without a GPU it prints "no CUDA GPU" and exits 0.
//   build/bench_kernels_gemv [--benchmark_filter=GemvTc]
#include <cuda_runtime.h>

#include <cstdio>
#include <string>
#include <vector>

#include "cuda/kernels/gemv/gemv.h"
#include "decode_data.h"
#include "kernel_bench.h"

namespace lc = lilac::cuda;
using namespace lilac::cuda::testing;
using lilac::bench::graph_us;
using lilac::bench::PhaseTrace;

namespace {

struct TimedCase {
  const char* name;
  int64_t rows, cols;
  int bits;
  lc::Prologue pro;
  bool acc;
  int conv_rows;
};

const TimedCase kCases[] = {{"gdn_in_proj", 12352, 2048, 4, lc::Prologue::RmsNorm, false, 8192},
                            {"gdn_out_proj", 2048, 4096, 4, lc::Prologue::GatedHeadNorm, true, 0},
                            {"attn_qkv", 9216, 2048, 4, lc::Prologue::RmsNorm, false, 0},
                            {"router", 257, 2048, 8, lc::Prologue::RmsNorm, false, 0},
                            {"lm_head", 248320, 2048, 4, lc::Prologue::RmsNorm, false, 0}};

// The phase trace of one launch of the tensor-core GEMVs (dense and MoE).
template <typename Launch>
PhaseTrace trace_launch(cudaStream_t s, Launch&& launch) {
  constexpr size_t kBlocks = 4096;
  Dev<unsigned long long> tr(kBlocks * 8);
  cudaMemset(tr.p, 0, kBlocks * 8 * sizeof(unsigned long long));
  lc::gemv_tc_trace(tr.p);
  launch();
  cudaStreamSynchronize(s);
  lc::gemv_tc_trace(nullptr);
  return lilac::bench::summarise_trace(tr.get(), kBlocks);
}

void BM_GemvTc(benchmark::State& state, TimedCase c) {
  Rng r(fresh_seed());
  HostQ hq(r, c.rows, c.cols, c.bits);
  DevQ dq(hq);
  const auto x = randv(r, size_t(c.cols));
  std::vector<float> nw(static_cast<size_t>(c.cols), 1.f), z = randv(r, size_t(c.cols));
  Dev<float> dx(x), dnw(nw), dz(z), dy(static_cast<size_t>(c.rows));
  Dev<float> cw(randv(r, size_t(c.conv_rows * 4) + 1, 0.5f)), cst(randv(r, size_t(c.conv_rows * 3) + 1));
  lc::GemvArgs a;
  a.W = dq.d;
  a.x = dx.p;
  a.y = dy.p;
  a.impl = lc::GemvImpl::Tensor;
  a.pro = c.pro;
  a.norm_w = dnw.p;
  a.z = dz.p;
  a.head_dim = 128;
  a.accumulate = c.acc;
  if (c.conv_rows) {
    a.conv_rows = c.conv_rows;
    a.conv_k = 4;
    a.conv_w = cw.p;
    a.conv_state = cst.p;
  }
  {  // the result, once (plain store, no conv): tensor cores vs the fp32 kernel
    lc::GemvArgs chk = a;
    chk.accumulate = false;
    chk.conv_rows = 0;
    Dev<float> y32(static_cast<size_t>(c.rows));
    lc::gemv(chk, nullptr);
    chk.y = y32.p;
    chk.impl = lc::GemvImpl::Fp32;
    lc::gemv(chk, nullptr);
    cudaDeviceSynchronize();
    const double e = rel_err(dy.get(), y32.get());
    if (!(e <= 2e-6)) {
      state.SkipWithError(("tensor cores vs fp32: relative error " + std::to_string(e)).c_str());
      return;
    }
  }
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  double us = -1;
  for (auto _ : state) {
    us = graph_us(s, 50, 4, [&] { lc::gemv(a, s); });
    state.SetIterationTime(us * 1e-6);
  }
  const double mb = (double(c.rows) * c.cols * c.bits / 8 + double(c.rows) * (c.cols / 64) * 4) / 1e6;
  // one traced launch (after the graph replays: L2 holds what fits of the weights)
  const PhaseTrace pt = trace_launch(s, [&] { lc::gemv(a, s); });
  std::printf("gemv-timing %-13s %6lld x %5lld %d-bit: %7.2f us/launch (%6.2f MB, %5.2f TB/s) | blocks %d, median "
              "us after first entry: entry %.2f wait %.2f copies %.2f staged %.2f group1 %.2f exit %.2f (max %.2f)\n",
              c.name, (long long)c.rows, (long long)c.cols, c.bits, us, mb, mb / us, pt.blocks, pt.med[0], pt.med[1],
              pt.med[2], pt.med[3], pt.med[4], pt.med[7], pt.max[7]);
  state.counters["MB"] = mb;
  state.counters["TB/s"] = mb / us;
  state.counters["blocks"] = pt.blocks;
  state.counters["wait_us"] = pt.med[1];
  state.counters["staged_us"] = pt.med[3];
  state.counters["exit_us"] = pt.med[7];
  if (us <= 0 || pt.blocks == 0) state.SkipWithError("CUDA error, or the trace recorded no block");
  cudaStreamDestroy(s);
}

void BM_MoeTc(benchmark::State& state) {
  Rng r(fresh_seed());
  const int E = 256, k = 8;
  const int64_t H = 2048, I = 512, Is = 512;
  HostQ gate(r, I * E, H, 4), up(r, I * E, H, 4), down(r, H * E, I, 4), sg(r, Is, H, 4), su(r, Is, H, 4),
      sd(r, H, Is, 4);
  DevMoE dm(gate, up, down, sg, su, sd, E, k, I, H);
  const auto logits = randv(r, size_t(E + 1), 2.f);
  const auto h = randv(r, size_t(H));
  std::vector<float> nw(static_cast<size_t>(H), 1.f);
  Dev<float> dl(logits), dh(h), dnw(nw), act(size_t(k * I + Is)), y(static_cast<size_t>(H)), selw(size_t(k + 1));
  Dev<float> act32(size_t(k * I + Is)), y32(static_cast<size_t>(H));
  Dev<int32_t> sel(static_cast<size_t>(k));
  {  // once: tensor cores vs fp32
    y.set(std::vector<float>(size_t(H), 0.f));
    y32.set(std::vector<float>(size_t(H), 0.f));
    lc::moe_gate_up(dm.w, dl.p, dh.p, dnw.p, 1e-6f, sel.p, selw.p, act.p, nullptr, lc::GemvImpl::Tensor);
    lc::moe_down(dm.w, sel.p, selw.p, act.p, y.p, nullptr, lc::GemvImpl::Tensor);
    lc::moe_gate_up(dm.w, dl.p, dh.p, dnw.p, 1e-6f, sel.p, selw.p, act32.p, nullptr, lc::GemvImpl::Fp32);
    lc::moe_down(dm.w, sel.p, selw.p, act32.p, y32.p, nullptr, lc::GemvImpl::Fp32);
    cudaDeviceSynchronize();
    const double ea = rel_err(act.get(), act32.get()), ey = rel_err(y.get(), y32.get());
    if (!(ea <= 2e-6 && ey <= 2e-6)) {
      state.SkipWithError(("tensor cores vs fp32: relative error act " + std::to_string(ea) + ", y " +
                           std::to_string(ey))
                              .c_str());
      return;
    }
  }
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  double us = -1;
  for (auto _ : state) {
    us = graph_us(s, 20, 5, [&] {
      lc::moe_gate_up(dm.w, dl.p, dh.p, dnw.p, 1e-6f, sel.p, selw.p, act.p, s, lc::GemvImpl::Tensor);
      lc::moe_down(dm.w, sel.p, selw.p, act.p, y.p, s, lc::GemvImpl::Tensor);
    });
    state.SetIterationTime(us * 1e-6);
  }
  std::printf(
      "moe-timing gate_up + down (E 256, top 8 + shared): %.2f us per layer (same experts each layer: L2-warm)\n", us);
  lc::moe_gate_up(dm.w, dl.p, dh.p, dnw.p, 1e-6f, sel.p, selw.p, act.p, s, lc::GemvImpl::Tensor);
  cudaStreamSynchronize(s);
  bool traced = true;
  for (int which : {0, 1}) {  // gate/up, then down
    const PhaseTrace pt = trace_launch(s, [&] {
      if (which == 0)
        lc::moe_gate_up(dm.w, dl.p, dh.p, dnw.p, 1e-6f, sel.p, selw.p, act.p, s, lc::GemvImpl::Tensor);
      else
        lc::moe_down(dm.w, sel.p, selw.p, act.p, y.p, s, lc::GemvImpl::Tensor);
    });
    if (which == 0)  // gate/up's marks (moe_tc.cu): 2 warp 0's routing, 5 routing and staging, 3 first tiles issued
      std::printf("moe-timing gate_up: blocks %d, median us after first entry: entry %.2f wait %.2f routed %.2f "
                  "routed+staged %.2f tiles issued %.2f exit %.2f (max %.2f)\n",
                  pt.blocks, pt.med[0], pt.med[1], pt.med[2], pt.med[5], pt.med[3], pt.med[7], pt.max[7]);
    else
      std::printf("moe-timing down: blocks %d, median us after first entry: entry %.2f wait %.2f table %.2f "
                  "copies %.2f staged %.2f exit %.2f (max %.2f)\n",
                  pt.blocks, pt.med[0], pt.med[1], pt.med[5], pt.med[2], pt.med[3], pt.med[7], pt.max[7]);
    state.counters[which == 0 ? "gate_up_exit_us" : "down_exit_us"] = pt.med[7];
    traced = traced && pt.blocks > 0;
  }
  if (us <= 0 || !traced) state.SkipWithError("CUDA error, or a trace recorded no block");
  cudaStreamDestroy(s);
}

}  // namespace

void lilac::bench::register_benchmarks() {
  for (const TimedCase& c : kCases)
    benchmark::RegisterBenchmark((std::string("GemvTc/") + c.name).c_str(), BM_GemvTc, c)
        ->UseManualTime()
        ->Iterations(1)
        ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("MoeTc/layer", BM_MoeTc)->UseManualTime()->Iterations(1)->Unit(benchmark::kMicrosecond);
}

LILAC_KERNEL_BENCH_MAIN("decode GEMV")
