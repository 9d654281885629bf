// A CUPTI injection library that records when every kernel and copy of a process ran on the GPU, graph
// nodes included, without serialising them (CUPTI's concurrent-kernel activity): the in-graph timeline that
// Nsight Compute's node times (each node alone, no PDL overlap) do not give. For any binary, no rebuild:
//
//   export CUDA_INJECTION64_PATH=build/bench/liblilac_cupti_trace.so LILAC_TRACE_OUT=trace.csv
//   lilac bench --synthetic --batch 16 --prompt-lens 512 --decode-tokens 8
//   python3 bench/graph_trace.py trace.csv            (per graph launch: each kernel's share of the chain)
//
// One CSV line per record: kind (K kernel, C copy, S memset), start and end (ns, the GPU's clock), stream,
// graph id, graph node id, correlation id (a graph launch's kernels share its cudaGraphLaunch's), grid x/y/z
// and the kernel's (mangled) name or the copy's bytes. The driver loads the library at CUDA's initialisation
// and calls InitializeInjection(); records are written as CUPTI hands back its buffers and at exit.
#include <cupti.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace {

FILE* g_out = nullptr;
std::mutex g_mu;
constexpr size_t kBufferBytes = size_t(8) << 20;

void CUPTIAPI on_buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

template <class T>
void write_transfer(char kind, const T* t) {  // a copy or a memset: its bytes in the name column
  std::fprintf(g_out, "%c,%llu,%llu,%u,%u,%llu,%u,0,0,0,%llu\n", kind, (unsigned long long)t->start,
               (unsigned long long)t->end, t->streamId, t->graphId, (unsigned long long)t->graphNodeId,
               t->correlationId, (unsigned long long)t->bytes);
}

void write_record(const CUpti_Activity* rec) {
  switch (rec->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
      std::fprintf(g_out, "K,%llu,%llu,%u,%u,%llu,%u,%d,%d,%d,%s\n", (unsigned long long)k->start,
                   (unsigned long long)k->end, k->streamId, k->graphId, (unsigned long long)k->graphNodeId,
                   k->correlationId, k->gridX, k->gridY, k->gridZ, k->name ? k->name : "?");
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY:
      write_transfer('C', reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec));
      break;
    case CUPTI_ACTIVITY_KIND_MEMSET:
      write_transfer('S', reinterpret_cast<const CUpti_ActivityMemset4*>(rec));
      break;
    default:
      break;
  }
}

void CUPTIAPI on_buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    CUpti_Activity* rec = nullptr;
    while (g_out && cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) write_record(rec);
  }
  std::free(buffer);
}

void at_exit() {
  cuptiActivityFlushAll(1);
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_out) std::fclose(g_out), g_out = nullptr;
}

bool check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return true;
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  std::fprintf(stderr, "lilac_cupti_trace: %s: %s\n", what, msg ? msg : "?");
  return false;
}

}  // namespace

extern "C" int InitializeInjection(void) {
  const char* path = std::getenv("LILAC_TRACE_OUT");
  g_out = std::fopen(path && *path ? path : "trace.csv", "w");
  if (!g_out) {
    std::perror("lilac_cupti_trace: LILAC_TRACE_OUT");
    return 0;
  }
  std::fprintf(g_out, "kind,start,end,stream,graph,node,correlation,gx,gy,gz,name\n");
  if (!check(cuptiActivityRegisterCallbacks(on_buffer_requested, on_buffer_completed), "register") ||
      !check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "kernels") ||
      !check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "copies") ||
      !check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET), "memsets"))
    return 0;
  std::atexit(at_exit);
  return 1;
}
