#include "moe.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace lfc::cpu {

namespace {

void check_expert(const char* kernel, int32_t e, int64_t a, int64_t E) {
  LFC_KERNEL_CHECK(e >= 0 && e < E, kernel, ": assignment ", a, " has expert ", e, ", outside [0, ", E, ")");
}

// a row in [0, N), or −1: the assignment was dropped (expert capacity)
void check_row(const char* kernel, int32_t r, int64_t a, int64_t N) {
  LFC_KERNEL_CHECK(r >= -1 && r < N, kernel, ": row_of[", a, "] = ", r, " is outside the ", N,
                   " rows (and not −1, dropped)");
}

// f_e · n · k: assignments per expert over non-padding tokens; returns n.
int64_t assignment_counts(int64_t* count, const char* kernel, const int32_t* experts,
                          const int32_t* segments, int64_t T, int64_t E, int64_t k) {
  std::fill(count, count + E, 0);
  int64_t n = 0;
  for (int64_t t = 0; t < T; t++) {
    if (segments[t] < 0) continue;
    n++;
    for (int64_t j = 0; j < k; j++) {
      check_expert(kernel, experts[t * k + j], t * k + j, E);
      count[experts[t * k + j]]++;
    }
  }
  return n;
}

}  // namespace

// ---- router_topk ---------------------------------------------------------------------------

template <typename Real>
void router_topk_forward(Real* probs, Real* weights, int32_t* experts, const Real* logits, int64_t T,
                         int64_t E, int64_t k, bool normalize) {
  LFC_KERNEL_CHECK(k >= 1 && k <= E, "router_topk_forward: top-k ", k, " is outside [1, ", E, "]");
  for (int64_t t = 0; t < T; t++) {
    const Real* lt = logits + t * E;  // (E)
    Real* pt = probs + t * E;         // (E)
    int32_t* et = experts + t * k;    // (k)
    Real* wt = weights + t * k;       // (k)
    const Real m = *std::max_element(lt, lt + E);
    double sum = 0;
    for (int64_t e = 0; e < E; e++) sum += std::exp(double(lt[e] - m));
    for (int64_t e = 0; e < E; e++) pt[e] = Real(std::exp(double(lt[e] - m)) / sum);
    // k passes of "largest not yet taken"; the strict > keeps the lower index on ties
    double chosen = 0;
    for (int64_t j = 0; j < k; j++) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; e++) {
        if (std::find(et, et + j, int32_t(e)) != et + j) continue;
        if (best < 0 || pt[e] > pt[best]) best = e;
      }
      et[j] = int32_t(best);
      chosen += pt[best];
    }
    for (int64_t j = 0; j < k; j++) wt[j] = normalize ? Real(pt[et[j]] / chosen) : pt[et[j]];
  }
}

template <typename Real>
void router_topk_weights(Real* weights, const Real* probs, const int32_t* experts, int64_t T, int64_t E, int64_t k,
                         bool normalize) {
  for (int64_t t = 0; t < T; t++) {
    const Real* pt = probs + t * E;       // (E)
    const int32_t* et = experts + t * k;  // (k)
    double chosen = 0;
    for (int64_t j = 0; j < k; j++) {
      LFC_KERNEL_CHECK(et[j] >= 0 && et[j] < E, "router_topk_weights: experts[", t, ", ", j, "] = ", et[j],
                       " is outside [0, ", E, ")");
      chosen += pt[et[j]];
    }
    for (int64_t j = 0; j < k; j++) weights[t * k + j] = normalize ? Real(pt[et[j]] / chosen) : pt[et[j]];
  }
}

template <typename Real>
void router_topk_backward(Real* dlogits, const Real* dprobs, const Real* dweights, const Real* probs,
                          const Real* weights, const int32_t* experts, int64_t T, int64_t E, int64_t k,
                          bool normalize) {
  ScratchScope scratch;
  double* dp = scratch.take<double>(E);  // (E): total gradient of one row of probs
  for (int64_t t = 0; t < T; t++) {
    const Real* pt = probs + t * E;  // (E)
    for (int64_t e = 0; e < E; e++) dp[e] = dprobs ? double(dprobs[t * E + e]) : 0.0;
    if (dweights && !normalize) {
      // w_j = p_{e_j}
      const int32_t* et = experts + t * k;  // (k)
      for (int64_t j = 0; j < k; j++) {
        check_expert("router_topk_backward", et[j], t * k + j, E);
        dp[et[j]] += double(dweights[t * k + j]);
      }
    } else if (dweights) {
      // w_j = p_{e_j} / S, S = Σ_i p_{e_i}:  ∂/∂p_{e_j} = (dw_j − Σ_i dw_i·w_i) / S
      const int32_t* et = experts + t * k;  // (k)
      const Real* wt = weights + t * k;     // (k)
      const Real* dwt = dweights + t * k;   // (k)
      double S = 0, dw_dot_w = 0;
      for (int64_t j = 0; j < k; j++) {
        check_expert("router_topk_backward", et[j], t * k + j, E);
        S += pt[et[j]];
        dw_dot_w += double(dwt[j]) * double(wt[j]);
      }
      for (int64_t j = 0; j < k; j++) dp[et[j]] += (double(dwt[j]) - dw_dot_w) / S;
    }
    // softmax backward: dlogit_e = p_e · (dp_e − Σ_i p_i·dp_i)
    double p_dot_dp = 0;
    for (int64_t e = 0; e < E; e++) p_dot_dp += double(pt[e]) * dp[e];
    for (int64_t e = 0; e < E; e++) dlogits[t * E + e] = Real(double(pt[e]) * (dp[e] - p_dot_dp));
  }
}

// ---- moe_permute / moe_unpermute ---------------------------------------------------------------

template <typename Real>
void moe_permute_forward(Real* rows, int32_t* counts, int32_t* row_of, const Real* x,
                         const int32_t* experts, int64_t T, int64_t H, int64_t k, int64_t E, int64_t N,
                         int64_t capacity, const Real* priority) {
  const int64_t A = T * k;  // assignments
  for (int64_t a = 0; a < A; a++) check_expert("moe_permute_forward", experts[a], a, E);
  // which assignments each expert keeps: all, its first `capacity` in assignment order, or (with
  // priority) its `capacity` of highest priority, ties to the earlier assignment
  ScratchScope scratch;
  uint8_t* keep = scratch.take<uint8_t>(A);  // (A)
  std::fill(keep, keep + A, uint8_t(1));
  if (capacity >= 0) {
    // each expert's assignments in order: expert e's are of[start[e] : start[e + 1]]
    int64_t* start = scratch.take<int64_t>(E + 1);  // (E + 1)
    int64_t* of = scratch.take<int64_t>(A);         // (A)
    std::fill(start, start + E + 1, 0);
    for (int64_t a = 0; a < A; a++) start[experts[a] + 1]++;
    for (int64_t e = 0; e < E; e++) start[e + 1] += start[e];
    int64_t* fill = scratch.take<int64_t>(E);  // (E): next free place of each expert's list
    std::copy(start, start + E, fill);
    for (int64_t a = 0; a < A; a++) of[fill[experts[a]]++] = a;
    for (int64_t e = 0; e < E; e++) {
      int64_t* first = of + start[e];
      int64_t* last = of + start[e + 1];
      if (last - first <= capacity) continue;
      if (priority) std::stable_sort(first, last, [&](int64_t p, int64_t q) { return priority[p] > priority[q]; });
      for (int64_t* a = first + capacity; a < last; a++) keep[*a] = 0;
    }
  }
  std::fill(counts, counts + E, 0);
  for (int64_t a = 0; a < A; a++) counts[experts[a]] += keep[a];
  int64_t* next = scratch.take<int64_t>(E);  // (E): next free row of each expert
  int64_t kept = 0;
  for (int64_t e = 0; e < E; e++) {
    next[e] = kept;
    kept += counts[e];
  }
  LFC_KERNEL_CHECK(kept <= N, "moe_permute_forward: ", kept, " kept rows do not fit the ", N, " rows");
  for (int64_t a = 0; a < A; a++) {
    if (!keep[a]) {  // dropped
      row_of[a] = -1;
      continue;
    }
    const int64_t r = next[experts[a]]++;
    row_of[a] = int32_t(r);
    const Real* xt = x + (a / k) * H;  // (H)
    std::copy(xt, xt + H, rows + r * H);
  }
  std::fill(rows + kept * H, rows + N * H, Real(0));  // (N − kept, H): a bounded buffer's tail
}

template <typename Real>
void moe_permute_backward(Real* dx, const Real* drows, const int32_t* row_of, int64_t T, int64_t H,
                          int64_t k, int64_t N) {
  for (int64_t t = 0; t < T; t++) {
    Real* dxt = dx + t * H;  // (H)
    std::fill(dxt, dxt + H, Real(0));
    for (int64_t j = 0; j < k; j++) {
      const int64_t a = t * k + j;
      check_row("moe_permute_backward", row_of[a], a, N);
      if (row_of[a] < 0) continue;  // dropped: no gradient
      const Real* dr = drows + int64_t(row_of[a]) * H;  // (H)
      for (int64_t i = 0; i < H; i++) dxt[i] += dr[i];
    }
  }
}

template <typename Real>
void moe_unpermute_forward(Real* y, const Real* rows, const int32_t* row_of, const Real* weights,
                           int64_t T, int64_t k, int64_t N, int64_t H) {
  for (int64_t a = 0; a < T * k; a++) check_row("moe_unpermute_forward", row_of[a], a, N);
  for (int64_t t = 0; t < T; t++) {
    Real* yt = y + t * H;  // (H)
    std::fill(yt, yt + H, Real(0));
    for (int64_t j = 0; j < k; j++) {
      if (row_of[t * k + j] < 0) continue;  // dropped: adds nothing
      const Real w = weights[t * k + j];
      const Real* r = rows + int64_t(row_of[t * k + j]) * H;  // (H)
      for (int64_t i = 0; i < H; i++) yt[i] += w * r[i];
    }
  }
}

template <typename Real>
void moe_unpermute_backward(Real* drows, Real* dweights, const Real* dy, const Real* rows,
                            const int32_t* row_of, const Real* weights, int64_t T, int64_t k, int64_t N,
                            int64_t H) {
  for (int64_t a = 0; a < T * k; a++) check_row("moe_unpermute_backward", row_of[a], a, N);
  std::fill(drows, drows + N * H, Real(0));
  for (int64_t t = 0; t < T; t++) {
    const Real* dyt = dy + t * H;  // (H)
    for (int64_t j = 0; j < k; j++) {
      const int64_t a = t * k + j;
      if (row_of[a] < 0) {  // dropped: its weight did not reach the output
        dweights[a] = Real(0);
        continue;
      }
      const Real* r = rows + int64_t(row_of[a]) * H;  // (H)
      Real* dr = drows + int64_t(row_of[a]) * H;      // (H)
      const Real w = weights[a];
      double dw = 0;
      for (int64_t i = 0; i < H; i++) {
        dw += double(dyt[i]) * double(r[i]);
        dr[i] += w * dyt[i];
      }
      dweights[a] = Real(dw);
    }
  }
}

// ---- moe_aux_loss ------------------------------------------------------------------------------

template <typename Real>
Real moe_aux_loss_forward(const Real* probs, const int32_t* experts, const int32_t* segments, int64_t T,
                          int64_t E, int64_t k, double coeff) {
  ScratchScope scratch;
  int64_t* count = scratch.take<int64_t>(E);  // (E)
  const int64_t n = assignment_counts(count, "moe_aux_loss_forward", experts, segments, T, E, k);
  if (n == 0) return Real(0);
  double* P = scratch.take<double>(E);  // (E): Σ over counted tokens of probs[t, e]
  std::fill(P, P + E, 0.0);
  for (int64_t t = 0; t < T; t++)
    if (segments[t] >= 0)
      for (int64_t e = 0; e < E; e++) P[e] += probs[t * E + e];
  double loss = 0;
  for (int64_t e = 0; e < E; e++) loss += (double(count[e]) / double(n * k)) * (P[e] / double(n));
  return Real(coeff * double(E) * loss);
}

template <typename Real>
void moe_aux_loss_backward(Real* dprobs, Real dloss, const int32_t* experts, const int32_t* segments,
                           int64_t T, int64_t E, int64_t k, double coeff) {
  ScratchScope scratch;
  int64_t* count = scratch.take<int64_t>(E);  // (E)
  const int64_t n = assignment_counts(count, "moe_aux_loss_backward", experts, segments, T, E, k);
  if (n == 0) return;
  Real* g = scratch.take<Real>(E);  // (E): ∂loss/∂probs[t, e], the same for every counted t
  for (int64_t e = 0; e < E; e++)
    g[e] = Real(double(dloss) * coeff * double(E) * (double(count[e]) / double(n * k)) / double(n));
  for (int64_t t = 0; t < T; t++)
    if (segments[t] >= 0)
      for (int64_t e = 0; e < E; e++) dprobs[t * E + e] += g[e];
}

#define LFC_INSTANTIATE_MOE(Real)                                                                   \
  template void router_topk_forward<Real>(Real*, Real*, int32_t*, const Real*, int64_t, int64_t,    \
                                          int64_t, bool);                                           \
  template void router_topk_weights<Real>(Real*, const Real*, const int32_t*, int64_t, int64_t, int64_t, \
                                          bool);                                                    \
  template void router_topk_backward<Real>(Real*, const Real*, const Real*, const Real*,            \
                                           const Real*, const int32_t*, int64_t, int64_t, int64_t,  \
                                           bool);                                                   \
  template void moe_permute_forward<Real>(Real*, int32_t*, int32_t*, const Real*, const int32_t*,   \
                                          int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,     \
                                          const Real*);                                             \
  template void moe_permute_backward<Real>(Real*, const Real*, const int32_t*, int64_t, int64_t,    \
                                           int64_t, int64_t);                                       \
  template void moe_unpermute_forward<Real>(Real*, const Real*, const int32_t*, const Real*,        \
                                            int64_t, int64_t, int64_t, int64_t);                    \
  template void moe_unpermute_backward<Real>(Real*, Real*, const Real*, const Real*,                \
                                             const int32_t*, const Real*, int64_t, int64_t,         \
                                             int64_t, int64_t);                                     \
  template Real moe_aux_loss_forward<Real>(const Real*, const int32_t*, const int32_t*, int64_t,    \
                                           int64_t, int64_t, double);                               \
  template void moe_aux_loss_backward<Real>(Real*, Real, const int32_t*, const int32_t*, int64_t,   \
                                            int64_t, int64_t, double);
LFC_INSTANTIATE_MOE(float)
LFC_INSTANTIATE_MOE(double)

// ---- expert parallelism ----------------------------------------------------------------------

void moe_rank_counts(int32_t* rank_counts, const int32_t* counts, int64_t E, int64_t P) {
  LFC_KERNEL_CHECK(P >= 1 && E % P == 0, "moe_rank_counts: ", E, " experts are not a multiple of ", P,
                   " ranks");
  const int64_t L = E / P;
  for (int64_t p = 0; p < P; p++) {
    int64_t sum = 0;
    for (int64_t l = 0; l < L; l++) {
      const int32_t c = counts[p * L + l];
      LFC_KERNEL_CHECK(c >= 0, "moe_rank_counts: counts[", p * L + l, "] = ", c, " is negative");
      sum += c;
    }
    rank_counts[p] = int32_t(sum);
  }
}

void moe_local_counts(int32_t* local, const int32_t* counts, int64_t P, int64_t L) {
  for (int64_t l = 0; l < L; l++) {
    int64_t sum = 0;
    for (int64_t p = 0; p < P; p++) {
      const int32_t c = counts[p * L + l];
      LFC_KERNEL_CHECK(c >= 0, "moe_local_counts: counts[", p, ", ", l, "] = ", c, " is negative");
      sum += c;
    }
    local[l] = int32_t(sum);
  }
}

template <typename Real>
void moe_sort_chunks(Real* y, const Real* x, const int32_t* counts, int64_t P, int64_t L, int64_t N, int64_t H,
                     bool inverse) {
  // start (P, L): the first row of block (p, l) in p-major order; lstart the same in l-major order
  ScratchScope scratch;
  int64_t* pstart = scratch.take<int64_t>(P * L);  // (P, L)
  int64_t* lstart = scratch.take<int64_t>(P * L);  // (P, L)
  int64_t total = 0;
  for (int64_t p = 0; p < P; p++)
    for (int64_t l = 0; l < L; l++) {
      const int32_t c = counts[p * L + l];
      LFC_KERNEL_CHECK(c >= 0, "moe_sort_chunks: counts[", p, ", ", l, "] = ", c, " is negative");
      pstart[(p * L + l)] = total;
      total += c;
    }
  LFC_KERNEL_CHECK(total <= N, "moe_sort_chunks: counts sum to ", total, " rows but there are ", N);
  int64_t at = 0;
  for (int64_t l = 0; l < L; l++)
    for (int64_t p = 0; p < P; p++) {
      lstart[(p * L + l)] = at;
      at += counts[p * L + l];
    }
  for (int64_t b = 0; b < P * L; b++) {
    const int64_t from = inverse ? lstart[(b)] : pstart[(b)];
    const int64_t to = inverse ? pstart[(b)] : lstart[(b)];
    std::copy(x + from * H, x + (from + counts[b]) * H, y + to * H);  // (counts[b], H)
  }
  std::copy(x + total * H, x + N * H, y + total * H);  // the rows past Σ counts
}

template void moe_sort_chunks<float>(float*, const float*, const int32_t*, int64_t, int64_t, int64_t, int64_t,
                                     bool);
template void moe_sort_chunks<double>(double*, const double*, const int32_t*, int64_t, int64_t, int64_t,
                                      int64_t, bool);

// ---- by storage dtype ---------------------------------------------------------------------------

void router_topk_forward(Dst probs, Dst weights, int32_t* experts, Src logits, int64_t T, int64_t E, int64_t k,
                         bool normalize) {
  by_dtype("router_topk_forward", {probs, weights, logits}, [&](auto& s) {
    router_topk_forward(s.out(probs, T * E), s.out(weights, T * k), experts, s.in(logits, T * E), T, E, k,
                        normalize);
  });
}

void router_topk_backward(Dst dlogits, Src dprobs, Src dweights, Src probs, Src weights, const int32_t* experts,
                          int64_t T, int64_t E, int64_t k, bool normalize) {
  by_dtype("router_topk_backward", {dlogits, dprobs, dweights, probs, weights}, [&](auto& s) {
    router_topk_backward(s.out(dlogits, T * E), s.in(dprobs, T * E), s.in(dweights, T * k), s.in(probs, T * E),
                         s.in(weights, T * k), experts, T, E, k, normalize);
  });
}

void router_topk_weights(Dst weights, Src probs, const int32_t* experts, int64_t T, int64_t E, int64_t k,
                         bool normalize) {
  by_dtype("router_topk_weights", {weights, probs}, [&](auto& s) {
    router_topk_weights(s.out(weights, T * k), s.in(probs, T * E), experts, T, E, k, normalize);
  });
}

void moe_permute_forward(Dst rows, int32_t* counts, int32_t* row_of, Src x, const int32_t* experts, int64_t T,
                         int64_t H, int64_t k, int64_t E, int64_t N, int64_t capacity, Src priority) {
  by_dtype("moe_permute_forward", {rows, x, priority}, [&](auto& s) {
    moe_permute_forward(s.out(rows, N * H), counts, row_of, s.in(x, T * H), experts, T, H, k, E, N, capacity,
                        s.in(priority, T * k));
  });
}

void moe_permute_backward(Dst dx, Src drows, const int32_t* row_of, int64_t T, int64_t H, int64_t k, int64_t N) {
  by_dtype("moe_permute_backward", {dx, drows}, [&](auto& s) {
    moe_permute_backward(s.out(dx, T * H), s.in(drows, N * H), row_of, T, H, k, N);
  });
}

void moe_unpermute_forward(Dst y, Src rows, const int32_t* row_of, Src weights, int64_t T, int64_t k, int64_t N,
                           int64_t H) {
  by_dtype("moe_unpermute_forward", {y, rows, weights}, [&](auto& s) {
    moe_unpermute_forward(s.out(y, T * H), s.in(rows, N * H), row_of, s.in(weights, T * k), T, k, N, H);
  });
}

void moe_unpermute_backward(Dst drows, Dst dweights, Src dy, Src rows, const int32_t* row_of, Src weights,
                            int64_t T, int64_t k, int64_t N, int64_t H) {
  by_dtype("moe_unpermute_backward", {drows, dweights, dy, rows, weights}, [&](auto& s) {
    moe_unpermute_backward(s.out(drows, N * H), s.out(dweights, T * k), s.in(dy, T * H), s.in(rows, N * H), row_of,
                           s.in(weights, T * k), T, k, N, H);
  });
}

double moe_aux_loss_forward(Src probs, const int32_t* experts, const int32_t* segments, int64_t T, int64_t E,
                            int64_t k, double coeff) {
  double loss = 0;
  by_dtype("moe_aux_loss_forward", {probs}, [&](auto& s) {
    loss = double(moe_aux_loss_forward(s.in(probs, T * E), experts, segments, T, E, k, coeff));
  });
  return loss;
}

void moe_aux_loss_backward(Dst dprobs, double dloss, const int32_t* experts, const int32_t* segments, int64_t T,
                           int64_t E, int64_t k, double coeff) {
  by_dtype("moe_aux_loss_backward", {dprobs}, [&](auto& s) {
    using Real = typename std::decay_t<decltype(s)>::Real;
    moe_aux_loss_backward(s.out(dprobs, T * E), Real(dloss), experts, segments, T, E, k, coeff);
  });
}

void moe_sort_chunks(Dst y, Src x, const int32_t* counts, int64_t P, int64_t L, int64_t N, int64_t H,
                     bool inverse) {
  by_dtype("moe_sort_chunks", {y, x}, [&](auto& s) {
    moe_sort_chunks(s.out(y, N * H), s.in(x, N * H), counts, P, L, N, H, inverse);
  });
}

}  // namespace lfc::cpu
