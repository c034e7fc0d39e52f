#include "attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "storage.h"

#include "blas.h"
#include "core/thread_pool.h"
#include "simd.h"

namespace lfc::cpu {

namespace {

void check_heads(const char* kernel, int64_t nh, int64_t nkv) {
  LFC_KERNEL_CHECK(nkv > 0 && nh % nkv == 0, kernel, ": query heads ", nh,
                   " are not a multiple of KV heads ", nkv);
}

bool attends(const int32_t* segments, int64_t i, int64_t j, bool causal) {
  if (segments[i] < 0) return i == j;  // padding: only itself
  return segments[j] == segments[i] && (!causal || j <= i);
}

template <typename Real>
double dot(const Real* a, const Real* b, int64_t d) {
  double acc = 0;
  for (int64_t c = 0; c < d; c++) acc += double(a[c]) * double(b[c]);
  return acc;
}

// A maximal run of tokens [start, start + len) with one segment id.
struct Run {
  int64_t start, len;
  int32_t id;
};
static_assert(sizeof(Run) == 24, "compiler/plan/scratch.ts counts 24 bytes a run");

// The runs of segments (T) into runs (T: at most one a token), using ids (T) as scratch; how many,
// or −1 when a non-negative id occurs in two separate runs.
int64_t segment_runs(const int32_t* segments, int64_t T, Run* runs, int32_t* ids) {
  int64_t n = 0;
  for (int64_t t = 0; t < T; t++) {
    if (n == 0 || segments[t] != runs[n - 1].id) runs[n++] = {t, 0, segments[t]};
    runs[n - 1].len++;
  }
  int64_t m = 0;
  for (int64_t r = 0; r < n; r++)
    if (runs[r].id >= 0) ids[m++] = runs[r].id;
  std::sort(ids, ids + m);
  return std::adjacent_find(ids, ids + m) == ids + m ? n : -1;
}

constexpr int64_t kRowBlock = 64;  // rows of scores computed at once

// Segments that are not contiguous runs (attention windows in merge-block order): the tokens in a
// stable order by segment id, so that each segment is one run (its own order kept: causal masks
// mean the same), with the segment ids in that order. perm (T), sorted (T).
void sort_by_segment(const int32_t* segments, int64_t T, int64_t* perm, int32_t* sorted) {
  for (int64_t t = 0; t < T; t++) perm[t] = t;
  std::stable_sort(perm, perm + T, [&](int64_t a, int64_t b) { return segments[a] < segments[b]; });
  for (int64_t t = 0; t < T; t++) sorted[t] = segments[perm[t]];
}

// dst[t] = src[perm[t]] (gather) or dst[perm[t]] = src[t] (scatter), rows of w values
template <typename Real>
void permute_rows(Real* dst, const Real* src, const int64_t* perm, int64_t T, int64_t w, bool scatter) {
  for (int64_t t = 0; t < T; t++) {
    const Real* from = src + (scatter ? t : perm[t]) * w;
    std::copy(from, from + w, dst + (scatter ? perm[t] : t) * w);
  }
}

}  // namespace

// ---- reference: naive O(T²), double accumulators ---------------------------------------------

namespace ref {

template <typename Real>
void attention_forward(Real* out, Real* lse, const Real* q, const Real* k, const Real* v,
                       const int32_t* segments, int64_t T, int64_t nh, int64_t nkv, int64_t d,
                       double scale, bool causal) {
  check_heads("ref::attention_forward", nh, nkv);
  const int64_t g = nh / nkv;
  ScratchScope scratch;
  double* acc = scratch.take<double>(d);  // (d)
  for (int64_t i = 0; i < T; i++)
    for (int64_t h = 0; h < nh; h++) {
      const int64_t kvh = h / g;
      const Real* qi = q + (i * nh + h) * d;  // (d)
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < T; j++)
        if (attends(segments, i, j, causal)) m = std::max(m, scale * dot(qi, k + (j * nkv + kvh) * d, d));
      double sum = 0;
      for (int64_t j = 0; j < T; j++)
        if (attends(segments, i, j, causal)) sum += std::exp(scale * dot(qi, k + (j * nkv + kvh) * d, d) - m);
      const double l = m + std::log(sum);
      std::fill(acc, acc + d, 0.0);
      for (int64_t j = 0; j < T; j++) {
        if (!attends(segments, i, j, causal)) continue;
        const double p = std::exp(scale * dot(qi, k + (j * nkv + kvh) * d, d) - l);
        const Real* vj = v + (j * nkv + kvh) * d;  // (d)
        for (int64_t c = 0; c < d; c++) acc[c] += p * double(vj[c]);
      }
      for (int64_t c = 0; c < d; c++) out[(i * nh + h) * d + c] = Real(acc[c]);
      lse[i * nh + h] = Real(l);
    }
}

template <typename Real>
void attention_backward(Real* dq, Real* dk, Real* dv, const Real* dout, const Real* q, const Real* k,
                        const Real* v, const Real* out, const Real* lse, const int32_t* segments,
                        int64_t T, int64_t nh, int64_t nkv, int64_t d, double scale, bool causal) {
  check_heads("ref::attention_backward", nh, nkv);
  const int64_t g = nh / nkv;
  ScratchScope scratch;
  double* dq_acc = scratch.take<double>(T * nh * d);   // (T, nh, d)
  double* dk_acc = scratch.take<double>(T * nkv * d);  // (T, nkv, d)
  double* dv_acc = scratch.take<double>(T * nkv * d);  // (T, nkv, d)
  std::fill(dq_acc, dq_acc + T * nh * d, 0.0);
  std::fill(dk_acc, dk_acc + T * nkv * d, 0.0);
  std::fill(dv_acc, dv_acc + T * nkv * d, 0.0);
  for (int64_t i = 0; i < T; i++)
    for (int64_t h = 0; h < nh; h++) {
      const int64_t kvh = h / g;
      const Real* qi = q + (i * nh + h) * d;      // (d)
      const Real* doi = dout + (i * nh + h) * d;  // (d)
      const double D = dot(doi, out + (i * nh + h) * d, d);
      for (int64_t j = 0; j < T; j++) {
        if (!attends(segments, i, j, causal)) continue;
        const Real* kj = k + (j * nkv + kvh) * d;  // (d)
        const Real* vj = v + (j * nkv + kvh) * d;  // (d)
        const double p = std::exp(scale * dot(qi, kj, d) - double(lse[i * nh + h]));
        const double ds = p * (dot(doi, vj, d) - D);  // d loss / d score
        for (int64_t c = 0; c < d; c++) {
          dv_acc[(j * nkv + kvh) * d + c] += p * double(doi[c]);
          dq_acc[(i * nh + h) * d + c] += scale * ds * double(kj[c]);
          dk_acc[(j * nkv + kvh) * d + c] += scale * ds * double(qi[c]);
        }
      }
    }
  std::transform(dq_acc, dq_acc + T * nh * d, dq, [](double x) { return Real(x); });
  std::transform(dk_acc, dk_acc + T * nkv * d, dk, [](double x) { return Real(x); });
  std::transform(dv_acc, dv_acc + T * nkv * d, dv, [](double x) { return Real(x); });
}

}  // namespace ref

// ---- optimized: per segment and head, pooled; row blocks up to the diagonal, gemms ------------

namespace {
// row[j] = e^(row[j] − shift), j < n: float through simd.h's vectorized exp, double through libm
LFC_ISA_CLONES void exp_shifted_f32(float* row, float shift, int64_t n) {
  for (int64_t j = 0; j < n; j++) row[j] = simd::exp_approx(row[j] - shift);
}
inline void exp_shifted(float* row, float shift, int64_t n) { exp_shifted_f32(row, shift, n); }
inline void exp_shifted(double* row, double shift, int64_t n) {
  for (int64_t j = 0; j < n; j++) row[j] = std::exp(row[j] - shift);
}
}  // namespace

template <typename Real>
void attention_forward(Real* out, Real* lse, const Real* q, const Real* k, const Real* v,
                       const int32_t* segments, int64_t T, int64_t nh, int64_t nkv, int64_t d,
                       double scale, bool causal) {
  check_heads("attention_forward", nh, nkv);
  ScratchScope scratch;
  Run* runs = scratch.take<Run>(T);  // (T)
  const int64_t nruns = segment_runs(segments, T, runs, scratch.take<int32_t>(T));
  if (nruns < 0) {  // windows: through the run kernel in segment order, and back
    int64_t* perm = scratch.take<int64_t>(T);
    int32_t* sorted = scratch.take<int32_t>(T);
    sort_by_segment(segments, T, perm, sorted);
    Real *qs = scratch.take<Real>(T * nh * d), *os = scratch.take<Real>(T * nh * d);
    Real *ks = scratch.take<Real>(T * nkv * d), *vs = scratch.take<Real>(T * nkv * d);
    Real* ls = scratch.take<Real>(T * nh);
    permute_rows(qs, q, perm, T, nh * d, false);
    permute_rows(ks, k, perm, T, nkv * d, false);
    permute_rows(vs, v, perm, T, nkv * d, false);
    attention_forward(os, ls, qs, ks, vs, sorted, T, nh, nkv, d, scale, causal);
    permute_rows(out, os, perm, T, nh * d, true);
    permute_rows(lse, ls, perm, T, nh, true);
    return;
  }
  const int64_t g = nh / nkv;
  const int64_t ldq = nh * d, ldkv = nkv * d;  // row strides of one head's (L, d) matrices
  int64_t max_len = 0;
  for (int64_t r = 0; r < nruns; r++) max_len = std::max(max_len, runs[r].len);
  const int64_t block_elems = std::min(kRowBlock, max_len) * max_len;  // (rows, cols) of one block

  // one item a (run, query head): its rows of out and lse, written by no other item
  parallelFor(nruns * nh, 1, [&](int64_t i0, int64_t i1) {
    ScratchScope local;
    Real* scores = local.take<Real>(block_elems);
    for (int64_t item = i0; item < i1; item++) {
      const Run& run = runs[item / nh];
      const int64_t h = item % nh, s0 = run.start, L = run.len;
      if (run.id < 0) {  // padding: each token attends to itself, p = 1
        for (int64_t t = s0; t < s0 + L; t++) {
          const Real* vt = v + (t * nkv + h / g) * d;  // (d)
          std::copy(vt, vt + d, out + (t * nh + h) * d);
          lse[t * nh + h] = Real(scale * dot(q + (t * nh + h) * d, k + (t * nkv + h / g) * d, d));
        }
        continue;
      }
      const Real* Q = q + (s0 * nh + h) * d;        // (L, d), row stride ldq
      const Real* K = k + (s0 * nkv + h / g) * d;   // (L, d), row stride ldkv
      const Real* Vm = v + (s0 * nkv + h / g) * d;  // (L, d), row stride ldkv
      Real* O = out + (s0 * nh + h) * d;            // (L, d), row stride ldq
      for (int64_t r0 = 0; r0 < L; r0 += kRowBlock) {
        const int64_t rb = std::min(kRowBlock, L - r0);
        const int64_t cols = causal ? r0 + rb : L;  // columns past the block's last row are masked
        // scores (rb, cols) = scale · Q[r0 : r0+rb] · K[0 : cols]ᵀ
        blas::gemm<Real>(false, true, rb, cols, d, Real(scale), Q + r0 * ldq, ldq, K, ldkv, 0,
                         scores, cols);
        for (int64_t i = 0; i < rb; i++) {  // softmax of each row over its visible columns
          Real* row = scores + i * cols;
          const int64_t visible = causal ? r0 + i + 1 : cols;
          const Real m = *std::max_element(row, row + visible);
          exp_shifted(row, m, visible);
          double sum = 0;
          for (int64_t j = 0; j < visible; j++) sum += row[j];
          const Real inv = Real(1.0 / sum);
          for (int64_t j = 0; j < visible; j++) row[j] *= inv;
          std::fill(row + visible, row + cols, Real(0));
          lse[(s0 + r0 + i) * nh + h] = Real(double(m) + std::log(sum));
        }
        // O[r0 : r0+rb] (rb, d) = P (rb, cols) · V[0 : cols] (cols, d)
        blas::gemm<Real>(false, false, rb, d, cols, 1, scores, cols, Vm, ldkv, 0, O + r0 * ldq, ldq);
      }
    }
  });
}

template <typename Real>
void attention_backward(Real* dq, Real* dk, Real* dv, const Real* dout, const Real* q, const Real* k,
                        const Real* v, const Real* out, const Real* lse, const int32_t* segments,
                        int64_t T, int64_t nh, int64_t nkv, int64_t d, double scale, bool causal) {
  check_heads("attention_backward", nh, nkv);
  ScratchScope scratch;
  Run* runs = scratch.take<Run>(T);  // (T)
  const int64_t nruns = segment_runs(segments, T, runs, scratch.take<int32_t>(T));
  if (nruns < 0) {  // windows: through the run kernel in segment order, and back
    int64_t* perm = scratch.take<int64_t>(T);
    int32_t* sorted = scratch.take<int32_t>(T);
    sort_by_segment(segments, T, perm, sorted);
    const int64_t nq = T * nh * d, nk = T * nkv * d;
    Real *dos = scratch.take<Real>(nq), *qs = scratch.take<Real>(nq), *os = scratch.take<Real>(nq);
    Real *ks = scratch.take<Real>(nk), *vs = scratch.take<Real>(nk), *ls = scratch.take<Real>(T * nh);
    Real *dqs = scratch.take<Real>(nq), *dks = scratch.take<Real>(nk), *dvs = scratch.take<Real>(nk);
    permute_rows(dos, dout, perm, T, nh * d, false);
    permute_rows(qs, q, perm, T, nh * d, false);
    permute_rows(os, out, perm, T, nh * d, false);
    permute_rows(ks, k, perm, T, nkv * d, false);
    permute_rows(vs, v, perm, T, nkv * d, false);
    permute_rows(ls, lse, perm, T, nh, false);
    attention_backward(dqs, dks, dvs, dos, qs, ks, vs, os, ls, sorted, T, nh, nkv, d, scale, causal);
    permute_rows(dq, dqs, perm, T, nh * d, true);
    permute_rows(dk, dks, perm, T, nkv * d, true);
    permute_rows(dv, dvs, perm, T, nkv * d, true);
    return;
  }
  const int64_t g = nh / nkv;
  const int64_t ldq = nh * d, ldkv = nkv * d;
  int64_t max_len = 0;
  for (int64_t r = 0; r < nruns; r++) max_len = std::max(max_len, runs[r].len);
  const int64_t block_elems = std::min(kRowBlock, max_len) * max_len;  // (rows, cols) of one block
  std::fill(dk, dk + T * nkv * d, Real(0));  // dk, dv accumulate over the g heads of a group
  std::fill(dv, dv + T * nkv * d, Real(0));

  // one item a (run, KV head), its g query heads in order: its rows of dq, dk and dv, written by
  // no other item (the same sums in the same order at any thread count)
  parallelFor(nruns * nkv, 1, [&](int64_t i0, int64_t i1) {
    ScratchScope local;
    Real* probs = local.take<Real>(block_elems);   // (rows, cols) of one block
    Real* dprobs = local.take<Real>(block_elems);  // (rows, cols) of one block
    Real* D = local.take<Real>(kRowBlock);         // (rows): dout·out per row
    for (int64_t item = i0; item < i1; item++) {
      const Run& run = runs[item / nkv];
      const int64_t kvh = item % nkv, s0 = run.start, L = run.len;
      for (int64_t h = kvh * g; h < (kvh + 1) * g; h++) {
        if (run.id < 0) {  // padding: out = v, so dv += dout and the score gradient is 0
          for (int64_t t = s0; t < s0 + L; t++) {
            const Real* dOt = dout + (t * nh + h) * d;  // (d)
            Real* dvt = dv + (t * nkv + kvh) * d;       // (d)
            for (int64_t c = 0; c < d; c++) dvt[c] += dOt[c];
            std::fill(dq + (t * nh + h) * d, dq + (t * nh + h + 1) * d, Real(0));
          }
          continue;
        }
        const Real* Q = q + (s0 * nh + h) * d;      // (L, d), row stride ldq
        const Real* K = k + (s0 * nkv + kvh) * d;   // (L, d), row stride ldkv
        const Real* Vm = v + (s0 * nkv + kvh) * d;  // (L, d), row stride ldkv
        const Real* O = out + (s0 * nh + h) * d;    // (L, d), row stride ldq
        const Real* dO = dout + (s0 * nh + h) * d;  // (L, d), row stride ldq
        Real* dQ = dq + (s0 * nh + h) * d;          // (L, d), row stride ldq
        Real* dK = dk + (s0 * nkv + kvh) * d;       // (L, d), row stride ldkv
        Real* dV = dv + (s0 * nkv + kvh) * d;       // (L, d), row stride ldkv
        for (int64_t r0 = 0; r0 < L; r0 += kRowBlock) {
          const int64_t rb = std::min(kRowBlock, L - r0);
          const int64_t cols = causal ? r0 + rb : L;
          // P (rb, cols) = exp(scale · Q_blk · K[0 : cols]ᵀ − lse), 0 where masked
          blas::gemm<Real>(false, true, rb, cols, d, Real(scale), Q + r0 * ldq, ldq, K, ldkv, 0,
                           probs, cols);
          for (int64_t i = 0; i < rb; i++) {
            Real* row = probs + i * cols;
            const int64_t visible = causal ? r0 + i + 1 : cols;
            exp_shifted(row, lse[(s0 + r0 + i) * nh + h], visible);
            std::fill(row + visible, row + cols, Real(0));
            D[i] = Real(dot(dO + (r0 + i) * ldq, O + (r0 + i) * ldq, d));
          }
          // dV[0 : cols] (cols, d) += Pᵀ (cols, rb) · dO_blk (rb, d)
          blas::gemm<Real>(true, false, cols, d, rb, 1, probs, cols, dO + r0 * ldq, ldq, 1, dV, ldkv);
          // dP (rb, cols) = dO_blk (rb, d) · V[0 : cols]ᵀ
          blas::gemm<Real>(false, true, rb, cols, d, 1, dO + r0 * ldq, ldq, Vm, ldkv, 0, dprobs, cols);
          // dS = scale · P ⊙ (dP − D), in place of dP (masked entries have P = 0)
          for (int64_t i = 0; i < rb; i++) {
            const Real* p = probs + i * cols;
            Real* ds = dprobs + i * cols;
            for (int64_t j = 0; j < cols; j++) ds[j] = Real(scale) * p[j] * (ds[j] - D[i]);
          }
          // dQ_blk (rb, d) = dS (rb, cols) · K[0 : cols] (cols, d)
          blas::gemm<Real>(false, false, rb, d, cols, 1, dprobs, cols, K, ldkv, 0, dQ + r0 * ldq, ldq);
          // dK[0 : cols] (cols, d) += dSᵀ (cols, rb) · Q_blk (rb, d)
          blas::gemm<Real>(true, false, cols, d, rb, 1, dprobs, cols, Q + r0 * ldq, ldq, 1, dK, ldkv);
        }
      }
    }
  });
}

#define LFC_INSTANTIATE_ATTENTION(NS, Real)                                                         \
  template void NS attention_forward<Real>(Real*, Real*, const Real*, const Real*, const Real*,     \
                                           const int32_t*, int64_t, int64_t, int64_t, int64_t,      \
                                           double, bool);                                           \
  template void NS attention_backward<Real>(Real*, Real*, Real*, const Real*, const Real*,          \
                                            const Real*, const Real*, const Real*, const Real*,     \
                                            const int32_t*, int64_t, int64_t, int64_t, int64_t,     \
                                            double, bool);
LFC_INSTANTIATE_ATTENTION(, float)
LFC_INSTANTIATE_ATTENTION(, double)
LFC_INSTANTIATE_ATTENTION(ref::, float)
LFC_INSTANTIATE_ATTENTION(ref::, double)

// ---- by storage dtype ---------------------------------------------------------------------------

void attention_forward(Dst out, Dst lse, Src q, Src k, Src v, const int32_t* segments, int64_t T, int64_t nh,
                       int64_t nkv, int64_t d, double scale, bool causal) {
  const int64_t nq = T * nh * d, nk = T * nkv * d;
  by_dtype("attention_forward", {out, lse, q, k, v}, [&](auto& s) {
    attention_forward(s.out(out, nq), s.out(lse, T * nh), s.in(q, nq), s.in(k, nk), s.in(v, nk), segments, T, nh,
                      nkv, d, scale, causal);
  });
}

void attention_backward(Dst dq, Dst dk, Dst dv, Src dout, Src q, Src k, Src v, Src out, Src lse,
                        const int32_t* segments, int64_t T, int64_t nh, int64_t nkv, int64_t d, double scale,
                        bool causal) {
  const int64_t nq = T * nh * d, nk = T * nkv * d;
  by_dtype("attention_backward", {dq, dk, dv, dout, q, k, v, out, lse}, [&](auto& s) {
    attention_backward(s.out(dq, nq), s.out(dk, nk), s.out(dv, nk), s.in(dout, nq), s.in(q, nq), s.in(k, nk),
                       s.in(v, nk), s.in(out, nq), s.in(lse, T * nh), segments, T, nh, nkv, d, scale, causal);
  });
}

}  // namespace lfc::cpu
