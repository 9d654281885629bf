// The plain 4-bit quantized GEMMs of long prompts on Hopper, with the weights as wgmma's register operand (gemm.cu's
// rs_takes picks it on the wgmma path for at least kRsMinRows X rows, K a multiple of 512 from 2048 and a wave of
// blocks; the MoE's grouped GEMMs, split-K, 8-bit weights and the mma.sync path keep qgemm_kernel, gemm.cuh).
//
// Why: qgemm_kernel's wgmma form dequantizes each weight tile into a bf16 tile in shared memory that both
// warpgroups then read as the B operand: per block and 64-wide k tile 88 KB of shared-memory traffic for 2 MFLOP,
// and the dequantization of a weight element serves 128 X rows. Here the roles are swapped: the weights are the A
// operand (M = weight rows), dequantized straight into registers, and X (tokens) is B from shared memory, N = 256
// rows per block: each dequantized weight serves twice the rows, and no bf16 weight tile exists.
// bench/GPU_NOTES.md ("Twentieth stop") has the measurements, including the 128-row form that lost.
//
// Block: 2 warpgroups × 64 weight rows (SwiGLU: warpgroup 0 the gate rows, 1 the up rows of the same 64 outputs) ×
// RS_TN = 256 X rows, one block per SM (128 accumulators per thread); k tiles of 64 (one quantization group)
// through an RS_STAGES-deep cp.async ring of {X tile 32 KB (swizzled as swz), raw words 4 KB}. Each warp holds 16
// weight rows; lane (g, c) rows g and g + 8 of them.
//
// The A fragment of a k16 step takes k = 2c, 2c+1 (a0, a1) and 2c+8, 2c+9 (a2, a3): in the MLX layout (8 nibbles
// per 32-bit word, element j at bits 4j) byte c of the step's two words. A lane loads 8 bytes of each of its rows
// (words 2c, 2c+1 of the k tile) and a 4 × 4 byte transpose across the quad (two shuffles and two byte permutes per
// word) gives it byte c of all 8 words. A byte's two nibbles become a bf16 pair exactly as qgemm_kernel's
// dequant8_q4 does it: (128 + q) by exponent bits, minus 128 (exact), then one rounding of s·q + b. So the bf16
// weights are the same values as in qgemm_kernel (the tests find the outputs bit for bit equal).
//
// Pipeline per k tile kt: barrier (tile kt + 1 landed; both warpgroups done with the wgmma of kt - 2), copies of
// tile kt + RS_STAGES - 2 into the stage kt - 2 used, wgmma of kt from fragments A[kt & 1], wait until the wgmma
// of kt - 1 is done, dequantize kt + 1 into A[(kt + 1) & 1] while the wgmma of kt runs. The epilogue stages the fp32
// tile in the ring and writes whole output rows (store_tile, swiglu_store).
#pragma once
#include "cuda/kernels/gemm/gemm.cuh"

namespace lilac::cuda::gemm {

constexpr int RS_TN = 256;     // X rows per block
constexpr int kRsMinRows = 512;  // below this the 128-row blocks of qgemm_kernel fill the GPU better (H200: at 512
                                  // and 768 rows the prefill is +2–3 % with this kernel; 1024 until 2026-12-04)
constexpr int kRsMinKT = 32;      // K ≥ 2048: one block per SM needs long k loops to amortize its prologue
constexpr int RS_STAGES = 5;
struct RsSmem {
  static constexpr int X_BYTES = RS_TN * BK * 2;    // 32 KiB
  static constexpr int W_BYTES = BN * BK / 2;       // 4 KiB: 128 rows × 32 bytes of 4-bit words
  static constexpr int STAGE = X_BYTES + W_BYTES;   // a multiple of 1024: every X tile 1024-byte aligned
  static constexpr int TOTAL = RS_STAGES * STAGE;   // 180 KiB: one block per SM
  static constexpr int EPI_LD = BN + 4;
  static constexpr int MAX_KT = 80;  // scales + biases of 128 rows: 512·KT bytes after the ring (K ≤ 5120)
  static constexpr int alloc(int kt) { return TOTAL + 512 * kt + 1024; }
  static_assert(STAGE % 1024 == 0, "X tiles must stay 1024-byte aligned");
  static_assert(RS_TN * EPI_LD * 4 <= TOTAL, "the epilogue's fp32 tile must fit in the ring");
};

// Per-lane byte-permute selectors of the quad's 4 × 4 byte transpose: lane c holds word M[c]; after
// quad_transpose it holds byte c of M[0..3] (byte i = byte c of M[i]).
struct QuadT {
  uint32_t s1, s2;
  __device__ __forceinline__ explicit QuadT(int c) {
    const uint32_t a = c & 1, b = c >> 1;
    // step 1 (with lane c ^ 1): [M[c][a], M[c][a + 2], M[c^1][a], M[c^1][a + 2]]
    s1 = a | (a + 2) << 4 | (4 + a) << 8 | (6 + a) << 12;
    // step 2 (with lane c ^ 2): row i's byte a + 2b sits at y[b] (i = c), y[2 + b] (c ^ 1), y'[b] (c ^ 2), y'[2 + b] (c ^ 3)
    uint32_t s = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t d = uint32_t(i) ^ uint32_t(c);  // 0, 1, 2, 3 for i = c, c^1, c^2, c^3
      const uint32_t src = (d & 2 ? 4 : 0) + (d & 1 ? 2 : 0) + b;
      s |= src << (4 * i);
    }
    s2 = s;
  }
  __device__ __forceinline__ uint32_t operator()(uint32_t x) const {
    const uint32_t y = __byte_perm(x, __shfl_xor_sync(0xffffffffu, x, 1), s1);
    return __byte_perm(y, __shfl_xor_sync(0xffffffffu, y, 2), s2);
  }
};

// Byte `beta` of t (two nibbles: k, k + 1) → the bf16 pair (s·q_k + b, s·q_{k+1} + b), one rounding each.
template <int beta>
__device__ __forceinline__ uint32_t dq_byte(uint32_t t, uint32_t t4, __nv_bfloat162 s2, __nv_bfloat162 b2) {
  const __nv_bfloat162 k128 = __floats2bfloat162_rn(128.f, 128.f);
  const uint32_t v = dev::and_or(__byte_perm(t, t4, beta | (4 + beta) << 8), 0x000F000Fu, bf2_as_u32(k128));
  return bf2_as_u32(__hfma2(__hsub2(u32_as_bf2(v), k128), s2, b2));
}

// Y[row_base + r][n0 + col] (=, += for EPI_ADD_F32, bf16 for EPI_STORE_BF16) ← st[r][col] for the block's TM × BN
// fp32 tile in shared memory: each thread 4 consecutive outputs at a time, rows past rows_valid and columns past N
// skipped; whole 16-byte pieces where Y's rows allow it, batches of 8 pieces with their loads issued together.
template <int EPI, int EPI_LD, int TM>
__device__ __forceinline__ void store_tile(const Params& p, const float* st, int row_base, int rows_valid, int n0,
                                           int tid) {
  constexpr int PER_ROW = BN / 4, PIECES = TM * PER_ROW, BATCH = 8;
  static_assert(PIECES % (THREADS * BATCH) == 0, "whole batches");
  constexpr bool BF = EPI == EPI_STORE_BF16, ADD = EPI == EPI_ADD_F32;
  const bool vec = (p.ldy % 4) == 0 && (reinterpret_cast<uintptr_t>(p.Y) % (BF ? 8 : 16)) == 0;
  for (int i0 = tid; i0 < PIECES; i0 += THREADS * BATCH) {
    float4 v[BATCH], y[BATCH];
#pragma unroll
    for (int b = 0; b < BATCH; ++b) {
      const int i = i0 + b * THREADS, r = i / PER_ROW, col = (i % PER_ROW) * 4;
      v[b] = *reinterpret_cast<const float4*>(st + r * EPI_LD + col);
      y[b] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (ADD && vec && r < rows_valid && n0 + col + 3 < p.N)
        y[b] = *reinterpret_cast<const float4*>(static_cast<const float*>(p.Y) + int64_t(row_base + r) * p.ldy + n0 + col);
    }
#pragma unroll
    for (int b = 0; b < BATCH; ++b) {
      const int i = i0 + b * THREADS, r = i / PER_ROW, col = (i % PER_ROW) * 4;
      if (r >= rows_valid) continue;
      const int64_t off = int64_t(row_base + r) * p.ldy + n0 + col;
      if (vec && n0 + col + 3 < p.N) {
        if constexpr (BF) {
          uint2 o;
          o.x = bf2_as_u32(__floats2bfloat162_rn(v[b].x, v[b].y));
          o.y = bf2_as_u32(__floats2bfloat162_rn(v[b].z, v[b].w));
          *reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(p.Y) + off) = o;
        } else {
          *reinterpret_cast<float4*>(static_cast<float*>(p.Y) + off) =
              make_float4(y[b].x + v[b].x, y[b].y + v[b].y, y[b].z + v[b].z, y[b].w + v[b].w);
        }
      } else {  // the row's ragged end or a Y whose rows are not 16-byte aligned
        const float vs[4] = {v[b].x, v[b].y, v[b].z, v[b].w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (n0 + col + e >= p.N) break;
          if constexpr (BF) {
            static_cast<__nv_bfloat16*>(p.Y)[off + e] = __float2bfloat16_rn(vs[e]);
          } else {
            float* yp = static_cast<float*>(p.Y) + off + e;
            *yp = ADD ? *yp + vs[e] : vs[e];
          }
        }
      }
    }
  }
}

template <int EPI>
__global__ void __launch_bounds__(THREADS, 1) qgemm_rs_kernel(const Params p) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw_u32 = smem_u32(smem_raw);
  unsigned char* smem = smem_raw + (((raw_u32 + 1023u) & ~1023u) - raw_u32);
  using S = RsSmem;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, c = lane & 3;
  constexpr bool SWIGLU = EPI == EPI_SWIGLU_BF16;
  constexpr int BN_OUT = SWIGLU ? BN / 2 : BN;

  static_assert(EPI != EPI_SCALED_F32, "the grouped GEMMs' epilogue: qgemm_kernel");
  const QMatrixDev W0 = p.W0, W1 = p.W1;
  const int row_base = blockIdx.y * RS_TN, rows_valid = min(RS_TN, p.M - row_base);
  const int n0 = blockIdx.x * BN_OUT;
  const int KT = int(W0.cols / BK);
  const XRows<RS_TN> xs(p, row_base, rows_valid, 0, tid);

  // The block's weight rows: local row lr (0..127) is row n0 + lr of W0, or with SwiGLU row n0 + lr % 64 of W0 (lr <
  // 64) or W1 (same shape). Thread tid copies 16 bytes of local row tid / 2 per k tile.
  auto of_w1 = [&](int lr) { return SWIGLU && lr >= BN / 2; };
  auto nrow = [&](int lr) { return n0 + (SWIGLU ? (lr & (BN / 2 - 1)) : lr); };
  const int cr = nrow(tid >> 1);
  const bool c_ok = cr < p.N;
  const uint32_t* w_src =
      (of_w1(tid >> 1) ? W1.qweight : W0.qweight) + (c_ok ? int64_t(cr) * W0.words_per_row() : 0) + (tid & 1) * 4;
  // This lane's fragment rows: local rows lr0 = 16·warp + g and lr0 + 8 (warpgroup warp / 4 holds local rows
  // 64·(warp / 4) ..; both rows of a lane are in the same matrix).
  const int lr0 = 16 * warp + g;

  // Shared memory: the ring, then the block's scales and biases, [local row][KT] bf16 each, copied once (16-byte
  // cp.async of each row's run: gemm.cu takes this kernel only when K % 512 == 0 and they fit).
  const uint32_t smem_base = smem_u32(smem);
  const __nv_bfloat16* ss = reinterpret_cast<const __nv_bfloat16*>(smem + S::TOTAL);
  const __nv_bfloat16* bs = ss + BN * KT;
  {
    const int per_row = KT / 8;  // 16-byte chunks per row and array
    const int64_t gpr = W0.groups_per_row();
    for (int i = tid; i < 2 * BN * per_row; i += THREADS) {
      const int arr = i / (BN * per_row), lr = (i / per_row) % BN, ch = i % per_row;
      const int r = nrow(lr);
      const bool w1 = of_w1(lr);
      const __nv_bfloat16* base = arr ? (w1 ? W1.biases : W0.biases) : (w1 ? W1.scales : W0.scales);
      const __nv_bfloat16* src = base + (r < p.N ? int64_t(r) * gpr + ch * 8 : 0);
      cp_async16_zfill(smem_base + S::TOTAL + (arr * BN * KT + lr * KT + ch * 8) * 2, src, r < p.N ? 16 : 0);
    }
  }

  auto stage_x = [&](int kt) { return smem_base + (kt % RS_STAGES) * S::STAGE; };
  auto stage_w = [&](int kt) { return smem + (kt % RS_STAGES) * S::STAGE + S::X_BYTES; };
  auto load_tile = [&](int kt) {
    if (kt < KT) {
      xs.load(p, stage_x(kt), kt, tid);
      cp_async16_zfill(smem_u32(stage_w(kt)) + (tid >> 1) * 32 + (tid & 1) * 16, w_src + int64_t(kt) * 8, c_ok ? 16 : 0);
    }
    cp_async_commit();
  };
  const QuadT qt(c);
  auto dequant = [&](int kt, uint32_t (&A)[16]) {
    const unsigned char* raw = stage_w(kt);
    uint32_t te[2], to[2], te4[2], to4[2];
    __nv_bfloat162 s2[2], b2[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint2 w = *reinterpret_cast<const uint2*>(raw + (lr0 + 8 * h) * 32 + 8 * c);  // words 2c, 2c + 1
      te[h] = qt(w.x);  // byte i: byte c of word 2i
      to[h] = qt(w.y);  // byte i: byte c of word 2i + 1
      te4[h] = te[h] >> 4;
      to4[h] = to[h] >> 4;
      const uint32_t sv = __bfloat16_as_ushort(ss[(lr0 + 8 * h) * KT + kt]);
      const uint32_t bv = __bfloat16_as_ushort(bs[(lr0 + 8 * h) * KT + kt]);
      s2[h] = u32_as_bf2(sv | sv << 16);
      b2[h] = u32_as_bf2(bv | bv << 16);
    }
    // k16 step ks: words 2ks (a0 row g, a1 row g + 8) and 2ks + 1 (a2, a3)
#define LILAC_RS_STEP(ks)                                        \
  A[4 * ks + 0] = dq_byte<ks>(te[0], te4[0], s2[0], b2[0]);     \
  A[4 * ks + 1] = dq_byte<ks>(te[1], te4[1], s2[1], b2[1]);     \
  A[4 * ks + 2] = dq_byte<ks>(to[0], to4[0], s2[0], b2[0]);     \
  A[4 * ks + 3] = dq_byte<ks>(to[1], to4[1], s2[1], b2[1]);
    LILAC_RS_STEP(0) LILAC_RS_STEP(1) LILAC_RS_STEP(2) LILAC_RS_STEP(3)
#undef LILAC_RS_STEP
  };

  float acc[2 * RS_TN / 4];  // acc[4j + e]: local row lr0 + 8·(e / 2), X row 8j + 2c + e % 2
#pragma unroll
  for (int i = 0; i < 2 * RS_TN / 4; ++i) acc[i] = 0.f;
  uint32_t A0[16], A1[16];

  // prologue: the scales (in the first group) and tiles 0 .. RS_STAGES - 3 in flight, tile 0 dequantized
#pragma unroll
  for (int s = 0; s < RS_STAGES - 2; ++s) load_tile(s);
  cp_async_wait<RS_STAGES - 3>();
  __syncthreads();
  dequant(0, A0);

  // one k tile: A (tile kt's fragments) → wgmma; An ← tile kt + 1
  auto step = [&](int kt, uint32_t (&A)[16], uint32_t (&An)[16]) {
    cp_async_wait<RS_STAGES - 4>();  // tile kt + 1 (this thread's copies)
    fence_proxy_async();
    __syncthreads();
    load_tile(kt + RS_STAGES - 2);
    wg_fence_acc<128>(acc);
    wg_arrive();
    const uint32_t xt = stage_x(kt);
#pragma unroll
    for (int ks = 0; ks < BK / 16; ++ks) wgmma_rs_m64n256k16(acc, A + 4 * ks, wg_desc(xt + ks * 32));
    wg_commit();
    wg_wait<1>();  // the wgmma of kt - 1 is done: An is free
    wg_hold(An);
    if (kt + 1 < KT) dequant(kt + 1, An);
    wg_hold(A);
  };
  for (int kt = 0; kt < KT; kt += 2) {
    step(kt, A0, A1);
    if (kt + 1 < KT) step(kt + 1, A1, A0);
  }
  wg_wait<0>();
  wg_fence_acc<128>(acc);
  cp_async_wait<0>();

  // ---- epilogue: the fp32 tile [X row][local row] through shared memory (the ring is free), then whole output rows
  // in 16-byte pieces with the residual's loads of a batch in flight together (one block per SM: a chain of
  // dependent read-modify-writes would be its whole tail)
  __syncthreads();
  float* st = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int j = 0; j < RS_TN / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) st[(8 * j + 2 * c + (e & 1)) * S::EPI_LD + lr0 + 8 * (e >> 1)] = acc[4 * j + e];
  __syncthreads();
  if constexpr (SWIGLU) {
    swiglu_store<S::EPI_LD, RS_TN>(p, st, row_base, rows_valid, n0, tid);
  } else {
    store_tile<EPI, S::EPI_LD, RS_TN>(p, st, row_base, rows_valid, n0, tid);
  }
}

}  // namespace lilac::cuda::gemm
