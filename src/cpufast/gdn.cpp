#include "cpufast/gdn.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace lilac::cpufast {

void gdn_chunked_fast(const KernelSet& k, float* S, const float* q, int64_t q_stride, const float* kk,
                      int64_t k_stride, const float* v, int64_t v_stride, const float* g, const float* beta, int64_t T,
                      int dk, int dv, float* o, int64_t o_stride, std::vector<float>& scratch) {
  constexpr int C = 64;
  const size_t need = size_t(C) * dk * 2 + size_t(C) * C + size_t(C) * dv * 2 + 3 * C + size_t(std::max(dk, C));
  if (scratch.size() < need) scratch.resize(need);
  float* kb = scratch.data();                // [C][dk] β-scaled keys
  float* W = kb + size_t(C) * dk;            // [C][dk]
  float* A = W + size_t(C) * dk;             // [C][C]
  float* U = A + size_t(C) * C;              // [C][dv]
  float* Vn = U + size_t(C) * dv;            // [C][dv]
  float* gc = Vn + size_t(C) * dv;           // [C]
  float* row = gc + C;                       // [C]
  float* fj = row + C;                       // [C] e^{gc_last − gc_j}
  float* coef = fj + C;                      // [max(dk, C)] the coefficients of one axpys
  for (int64_t t0 = 0; t0 < T; t0 += C) {
    const int c = int(std::min<int64_t>(C, T - t0));
    auto Q = [&](int i) { return q + (t0 + i) * q_stride; };
    auto Kr = [&](int i) { return kk + (t0 + i) * k_stride; };
    auto Vr = [&](int i) { return v + (t0 + i) * v_stride; };
    float acc = 0.f;
    for (int i = 0; i < c; ++i) {
      acc += g[t0 + i];
      gc[i] = acc;
      const float b = beta[t0 + i];
      for (int d = 0; d < dk; ++d) kb[size_t(i) * dk + d] = Kr(i)[d] * b;
    }
    // A[i][j] = −(β_i k_i · k_j) e^{gc_i − gc_j} (j < i), then T = (I − A_strict)^{-1} row by row.
    std::fill(A, A + size_t(C) * C, 0.f);
    for (int i = 0; i < c; ++i)
      for (int j = 0; j < i; ++j) A[size_t(i) * C + j] = -k.dot(kb + size_t(i) * dk, Kr(j), dk) * std::exp(gc[i] - gc[j]);
    for (int i = 1; i < c; ++i) {
      for (int j = 0; j < i; ++j) row[j] = A[size_t(i) * C + j];
      for (int j = 0; j < i; ++j) {
        float s = row[j];
        for (int m = j + 1; m < i; ++m) s += row[m] * A[size_t(m) * C + j];
        A[size_t(i) * C + j] = s;
      }
    }
    for (int i = 0; i < c; ++i) A[size_t(i) * C + i] = 1.f;
    // U = T (β v), W = T (β k e^{gc}).
    for (int i = 0; i < c; ++i) {
      float* Ui = U + size_t(i) * dv;
      float* Wi = W + size_t(i) * dk;
      std::fill(Ui, Ui + dv, 0.f);
      std::fill(Wi, Wi + dk, 0.f);
      for (int j = 0; j <= i; ++j) {
        const float a = A[size_t(i) * C + j];
        if (a == 0.f) continue;
        k.axpy(beta[t0 + j] * a, Vr(j), Ui, dv);
        k.axpy(a * std::exp(gc[j]), kb + size_t(j) * dk, Wi, dk);
      }
    }
    // Vn_i = U_i − W_i S.
    for (int i = 0; i < c; ++i) {
      float* vn = Vn + size_t(i) * dv;
      std::memcpy(vn, U + size_t(i) * dv, size_t(dv) * sizeof(float));
      const float* Wi = W + size_t(i) * dk;
      for (int d = 0; d < dk; ++d) coef[d] = -Wi[d];
      k.axpys(coef, S, dv, dk, vn, dv);
    }
    // o_i = e^{gc_i} q_i S + Σ_{j≤i} (q_i·k_j) e^{gc_i − gc_j} Vn_j.
    for (int i = 0; i < c; ++i) {
      float* oi = o + (t0 + i) * o_stride;
      const float* qi = Q(i);
      std::fill(oi, oi + dv, 0.f);
      const float ei = std::exp(gc[i]);
      for (int d = 0; d < dk; ++d) coef[d] = qi[d] * ei;
      k.axpys(coef, S, dv, dk, oi, dv);
      for (int j = 0; j <= i; ++j) coef[j] = k.dot(qi, Kr(j), dk) * std::exp(gc[i] - gc[j]);
      k.axpys(coef, Vn, dv, i + 1, oi, dv);
    }
    // S ← e^{gc_last} S + Σ_j e^{gc_last − gc_j} k_j Vn_jᵀ.
    const float glast = gc[c - 1], el = std::exp(glast);
    for (int d = 0; d < dk; ++d) {
      float* Sd = S + size_t(d) * dv;
      for (int e = 0; e < dv; ++e) Sd[e] *= el;
    }
    for (int j = 0; j < c; ++j) fj[j] = std::exp(glast - gc[j]);
    for (int d = 0; d < dk; ++d) {  // row d of S gets Σ_j (k_j[d] f_j) Vn_j, j in order
      for (int j = 0; j < c; ++j) coef[j] = Kr(j)[d] * fj[j];
      k.axpys(coef, Vn, dv, c, S + size_t(d) * dv, dv);
    }
  }
}

void gdn_step_fast(float* S, const float* q, const float* k, const float* v, float g, float beta, int dk, int dv,
                   float* o, float* u) {
  const float decay = std::exp(g);
  std::fill(u, u + dv, 0.f);
  for (int i = 0; i < dk; ++i) {
    float* Si = S + int64_t(i) * dv;
    const float ki = k[i];
    for (int j = 0; j < dv; ++j) {
      Si[j] *= decay;
      u[j] += Si[j] * ki;
    }
  }
  for (int j = 0; j < dv; ++j) u[j] = beta * (v[j] - u[j]);
  std::fill(o, o + dv, 0.f);
  for (int i = 0; i < dk; ++i) {
    float* Si = S + int64_t(i) * dv;
    const float ki = k[i], qi = q[i];
    for (int j = 0; j < dv; ++j) {
      Si[j] += ki * u[j];
      o[j] += Si[j] * qi;
    }
  }
}

}  // namespace lilac::cpufast
