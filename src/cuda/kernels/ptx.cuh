// The inline-PTX wrappers the kernel families share (one definition each): asynchronous copies to
// shared memory (cp.async), ldmatrix, the mma.sync shapes in use, streaming loads, f16x2 / lop3
// helpers, programmatic dependent launch (griddepcontrol, see launch.cuh for the rules), thread-block clusters and
// the global timer of the phase-trace hooks.
//
// Each wrapper emits exactly one instruction with the qualifiers in its name. Ordering: the cp.async
// wrappers (issue, commit, wait) and the PDL wrappers are `asm volatile` with a "memory" clobber, so
// the compiler keeps ordinary loads / stores of the same thread on the right side of them (a wait is
// still not a barrier between threads: __syncthreads() after it where other threads' copies are read).
// The wgmma wrappers are in wgmma.cuh; family-specific instructions (the tile stores of the GEMM) stay with their family.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace lilac::cuda::dev {

// ------------------------------------------------------------------------------------------------ addresses
// The 32-bit shared-state-space address of a generic pointer into shared memory.
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ------------------------------------------------------------------------------------------------ cp.async
// 16 bytes global → shared, bypassing L1 (.cg).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src) { cp_async16(smem_u32(dst), src); }
// 16 bytes of which the first `src_bytes` (0..16) are read from `src`, the rest zero-filled (0: src is
// not read).
__device__ __forceinline__ void cp_async16_zfill(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async16_zfill(void* dst, const void* src, int src_bytes) {
  cp_async16_zfill(smem_u32(dst), src, src_bytes);
}
// 4 bytes global → shared, through L1 (.ca: the only mode for copies smaller than 16 bytes).
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src) { cp_async4(smem_u32(dst), src); }
// 8 bytes global → shared, through L1 (.ca).
__device__ __forceinline__ void cp_async8(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(smem_u32(dst)), "l"(src) : "memory");
}
// 16 bytes global → shared (.cg) whose miss fetches the whole aligned 256 bytes into L2 (.L2::256B): for copies
// whose neighbours in memory other warps of the block request at about the same time.
__device__ __forceinline__ void cp_async16_l2pf(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(smem_u32(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Wait until at most N of this thread's committed groups are pending.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// ------------------------------------------------------------------------------------------------ ldmatrix
// Four 8x8 b16 matrices from shared memory (lane l supplies the row address of matrix l / 8).
__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                                  uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// ------------------------------------------------------------------------------------------------ mma.sync
// d (16x8 fp32) += a (16x16 fp16, row) · b (16x8 fp16, col).
__device__ __forceinline__ void mma_m16n8k16_f16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                 uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
// d (16x8 fp32) += a (16x16 bf16, row) · b (16x8 bf16, col).
__device__ __forceinline__ void mma_m16n8k16_bf16(float* d, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// d (16x8 fp32) += a (16x8 bf16, row) · b (8x8 bf16, col). Not volatile: the compiler may schedule it.
__device__ __forceinline__ void mma_m16n8k8_bf16(float* d, uint32_t a0, uint32_t a1, uint32_t b0) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(b0));
}
// d (16x8 fp32) += a (16x16 bf16, row, as one uint4 of fragments) · b (16x8 bf16, col); not volatile.
__device__ __forceinline__ void mma_m16n8k16_bf16_nv(float* d, uint4 a, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
}
// c (16x8 fp32) += a (16x8 tf32, row) · b (8x8 tf32, col).
// D (int32 16x8) += A (u8 16x32, row) · B (s8 32x8, col): the digits kernels' integer product (kernels/digits/).
__device__ __forceinline__ void mma_m16n8k32_u8s8(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_m16n8k8_tf32(float c[4], const uint32_t a[4], const uint32_t b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// fp32 → tf32 (round to nearest, ties away from zero), as the bits of a float.
__device__ __forceinline__ uint32_t cvt_rna_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

// ------------------------------------------------------------------------------------------------ ALU
// (a & b) | c in one instruction.
__device__ __forceinline__ uint32_t and_or(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}
// a - b and a * b + c on two fp16 halves held in 32-bit registers.
__device__ __forceinline__ uint32_t hsub2_u(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
__device__ __forceinline__ uint32_t hfma2_u(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t r;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}

// ------------------------------------------------------------------------------------------------ loads
// 16-byte streaming load of data read once (weights): non-coherent path, not kept in L1.
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

// 16-byte streaming load (evict first, as __ldcs) whose miss fetches the whole aligned 256 bytes into L2: for a
// block that reads 64 bytes of each 512-byte row of a matrix whose neighbouring 64-byte slices other blocks of the
// same wave read (the GDN state).
__device__ __forceinline__ float4 ld_cs_pf(const float4* p) {
  float4 r;
  asm volatile("ld.global.cs.L2::256B.v4.f32 {%0,%1,%2,%3}, [%4];"
               : "=f"(r.x), "=f"(r.y), "=f"(r.z), "=f"(r.w)
               : "l"(p));
  return r;
}

// 16-byte shared-memory load at a shared-window address (volatile: kept where the code puts it).
__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 r;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "r"(addr));
  return r;
}

// ------------------------------------------------------------------------------------------------ PDL
// Programmatic dependent launch (sm_90+; no-ops below): wait for the predecessor kernel's completion
// and memory, and allow the dependent kernel to launch. Rules: launch.cuh.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// ------------------------------------------------------------------------------------------------ clusters
// Thread-block clusters (sm_90+; launched with a cluster dimension). cluster_sync: every thread of every block of
// the cluster arrives (release) and waits (acquire), so shared-memory stores before it are visible to the cluster's
// other blocks after it; cluster_arrive / cluster_wait are its two halves, for work between them (arrive where a
// block's part is done, wait where it needs the others'). cluster_map: the address of the same shared-memory
// location in block `rank` of the cluster (distributed shared memory), for ld_cluster_f4. Below sm_90 they compile
// to nothing (the host never launches clusters there).
__device__ __forceinline__ void cluster_arrive() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_sync() {
  cluster_arrive();
  cluster_wait();
}
__device__ __forceinline__ uint32_t cluster_map(uint32_t smem_addr, uint32_t rank) {
  uint32_t r = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(smem_addr), "r"(rank));
#endif
  return r;
}
// The generic address of `p` (this block's shared memory) in block `rank` of the cluster: plain loads and stores
// through it reach that block's shared memory.
template <typename T>
__device__ __forceinline__ T* cluster_map_generic(T* p, uint32_t rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint64_t r;
  asm volatile("mapa.u64 %0, %1, %2;" : "=l"(r) : "l"(reinterpret_cast<uint64_t>(p)), "r"(rank));
  return reinterpret_cast<T*>(r);
#else
  return rank == 0 ? p : nullptr;
#endif
}
__device__ __forceinline__ float4 ld_cluster_f4(uint32_t addr) {
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("ld.shared::cluster.v4.f32 {%0,%1,%2,%3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr)
               : "memory");
#endif
  return v;
}

// ------------------------------------------------------------------------------------------------ timer
// %globaltimer in ns (the phase-trace hooks' clock).
__device__ __forceinline__ unsigned long long globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

}  // namespace lilac::cuda::dev
