#include "loss.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/thread_pool.h"

namespace lfc::cpu {

namespace {
void check_args(const char* kernel, const int32_t* labels, const uint8_t* mask, double loss_tokens,
                int64_t T, int64_t V) {
  LFC_KERNEL_CHECK(loss_tokens > 0, kernel, ": loss_tokens is ", loss_tokens,
                   "; a global batch with no loss token is an error");
  for (int64_t t = 0; t < T; t++)
    LFC_KERNEL_CHECK(!mask[t] || (labels[t] >= 0 && labels[t] < V), kernel, ": labels[", t, "] = ",
                     labels[t], " is outside the vocab of ", V);
}
// log Σ exp(x[i·stride]) over n values, max-shifted, summed in double (cross_entropy_forward's
// arithmetic)
template <typename Real>
double logsumexp(const Real* x, int64_t n, int64_t stride) {
  double m = double(x[0]);
  for (int64_t i = 1; i < n; i++) m = std::max(m, double(x[i * stride]));
  double sum = 0;
  for (int64_t i = 0; i < n; i++) sum += std::exp(double(x[i * stride]) - m);
  return m + std::log(sum);
}

void check_loss_tokens(const char* kernel, double loss_tokens) {
  LFC_KERNEL_CHECK(loss_tokens > 0, kernel, ": loss_tokens is ", loss_tokens,
                   "; a global batch with no loss token is an error");
}

// the column of labels[t] in the block [first, first + V), or −1 when the row reads no logit
int64_t target_column(const char* kernel, const int32_t* labels, const uint8_t* mask, int64_t t, int64_t V,
                      int64_t first, int64_t vocab) {
  if (mask && !mask[t]) return -1;
  if (mask)
    LFC_KERNEL_CHECK(labels[t] >= 0 && labels[t] < vocab, kernel, ": labels[", t, "] = ", labels[t],
                     " is outside the vocab of ", vocab);
  const int64_t col = int64_t(labels[t]) - first;
  return col >= 0 && col < V ? col : -1;
}

}  // namespace

namespace ref {

template <typename Real>
Real cross_entropy_forward(Real* lse, const Real* logits, const int32_t* labels, const uint8_t* mask,
                           double loss_tokens, int64_t T, int64_t V) {
  check_args("cross_entropy_forward", labels, mask, loss_tokens, T, V);
  double total = 0;
  for (int64_t t = 0; t < T; t++) {
    lse[t] = Real(0);
    if (!mask[t]) continue;
    const Real* lt = logits + t * V;  // (V)
    const double m = *std::max_element(lt, lt + V);
    double sum = 0;
    for (int64_t v = 0; v < V; v++) sum += std::exp(double(lt[v]) - m);
    const double l = m + std::log(sum);
    lse[t] = Real(l);
    total += l - double(lt[labels[t]]);
  }
  return Real(total / loss_tokens);
}

template <typename Real>
void cross_entropy_backward(Real* dlogits, Real g, const Real* logits, const Real* lse,
                            const int32_t* labels, const uint8_t* mask, double loss_tokens, int64_t T,
                            int64_t V) {
  check_args("cross_entropy_backward", labels, mask, loss_tokens, T, V);
  const Real scale = Real(double(g) / loss_tokens);
  for (int64_t t = 0; t < T; t++) {
    Real* dt = dlogits + t * V;  // (V)
    if (!mask[t]) {
      std::fill(dt, dt + V, Real(0));
      continue;
    }
    const Real* lt = logits + t * V;  // (V)
    const Real l = lse[t];
    for (int64_t v = 0; v < V; v++) dt[v] = scale * std::exp(lt[v] - l);
    dt[labels[t]] -= scale;
  }
}

}  // namespace ref

namespace {
// cross_entropy_forward's row t: lse[t], and the row's loss term in double (0 when masked out)
template <typename Real>
double cross_entropy_row(Real* lse, const Real* logits, const int32_t* labels, const uint8_t* mask, int64_t t,
                         int64_t V) {
  lse[t] = Real(0);
  if (!mask[t]) return 0;
  const Real* lt = logits + t * V;  // (V)
  const double m = *std::max_element(lt, lt + V);
  double sum = 0;
  for (int64_t v = 0; v < V; v++) sum += std::exp(double(lt[v]) - m);
  const double l = m + std::log(sum);
  lse[t] = Real(l);
  return l - double(lt[labels[t]]);
}
}  // namespace

// Pooled over fixed blocks of rows; each row's term is kept in double and the terms summed in row
// order on the calling thread, as ref sums them: ref's bits at any thread count (and so still
// ce_from_stats ∘ lse_combine's bits on one rank).
template <typename Real>
Real cross_entropy_forward(Real* lse, const Real* logits, const int32_t* labels, const uint8_t* mask,
                           double loss_tokens, int64_t T, int64_t V) {
  check_args("cross_entropy_forward", labels, mask, loss_tokens, T, V);
  std::vector<double> term(static_cast<size_t>(T));  // (T)
  parallelFor(T, row_grain(V * int64_t(sizeof(Real))), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; t++) term[size_t(t)] = cross_entropy_row(lse, logits, labels, mask, t, V);
  });
  double total = 0;
  for (int64_t t = 0; t < T; t++)
    if (mask[t]) total += term[size_t(t)];
  return Real(total / loss_tokens);
}

// Rows are independent: ref's loop on each fixed block of rows (ref's bits).
template <typename Real>
void cross_entropy_backward(Real* dlogits, Real g, const Real* logits, const Real* lse,
                            const int32_t* labels, const uint8_t* mask, double loss_tokens, int64_t T,
                            int64_t V) {
  check_args("cross_entropy_backward", labels, mask, loss_tokens, T, V);
  parallelFor(T, row_grain(V * int64_t(sizeof(Real))), [&](int64_t t0, int64_t t1) {
    ref::cross_entropy_backward(dlogits + t0 * V, g, logits + t0 * V, lse + t0, labels + t0, mask + t0, loss_tokens,
                                t1 - t0, V);
  });
}

template float ref::cross_entropy_forward<float>(float*, const float*, const int32_t*, const uint8_t*,
                                                 double, int64_t, int64_t);
template double ref::cross_entropy_forward<double>(double*, const double*, const int32_t*, const uint8_t*,
                                                   double, int64_t, int64_t);
template void ref::cross_entropy_backward<float>(float*, float, const float*, const float*, const int32_t*,
                                                 const uint8_t*, double, int64_t, int64_t);
template void ref::cross_entropy_backward<double>(double*, double, const double*, const double*,
                                                  const int32_t*, const uint8_t*, double, int64_t, int64_t);
template float cross_entropy_forward<float>(float*, const float*, const int32_t*, const uint8_t*,
                                            double, int64_t, int64_t);
template double cross_entropy_forward<double>(double*, const double*, const int32_t*, const uint8_t*,
                                              double, int64_t, int64_t);
template void cross_entropy_backward<float>(float*, float, const float*, const float*, const int32_t*,
                                            const uint8_t*, double, int64_t, int64_t);
template void cross_entropy_backward<double>(double*, double, const double*, const double*,
                                             const int32_t*, const uint8_t*, double, int64_t, int64_t);

// ---- vocab-parallel pieces ---------------------------------------------------------------------

template <typename Real>
void vocab_logsumexp_forward(Real* lse, const Real* logits, int64_t T, int64_t V) {
  LFC_KERNEL_CHECK(V >= 1 || T == 0, "vocab_logsumexp_forward: no vocabulary columns");
  parallelFor(T, row_grain(V * int64_t(sizeof(Real))), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; t++) lse[t] = Real(logsumexp(logits + t * V, V, 1));
  });
}

template <typename Real>
void vocab_logsumexp_backward(Real* dlogits, const Real* dy, const Real* logits, const Real* lse, int64_t T,
                              int64_t V) {
  parallelFor(T, row_grain(V * int64_t(sizeof(Real))), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; t++) {
      const Real* lt = logits + t * V;  // (V)
      Real* dt = dlogits + t * V;       // (V)
      for (int64_t v = 0; v < V; v++) dt[v] = dy[t] * std::exp(lt[v] - lse[t]);
    }
  });
}

template <typename Real>
void lse_combine_forward(Real* y, const Real* x, int64_t P, int64_t T) {
  LFC_KERNEL_CHECK(P >= 1 || T == 0, "lse_combine_forward: no rows to combine");
  for (int64_t t = 0; t < T; t++) y[t] = Real(logsumexp(x + t, P, T));
}

template <typename Real>
void lse_combine_backward(Real* dx, const Real* dy, const Real* x, const Real* y, int64_t P, int64_t T) {
  for (int64_t p = 0; p < P; p++)
    for (int64_t t = 0; t < T; t++) dx[p * T + t] = dy[t] * std::exp(x[p * T + t] - y[t]);
}

template <typename Real>
void vocab_target_logit_forward(Real* target, const Real* logits, const int32_t* labels, const uint8_t* mask,
                                int64_t T, int64_t V, int64_t first, int64_t vocab) {
  for (int64_t t = 0; t < T; t++) {
    const int64_t col = target_column("vocab_target_logit_forward", labels, mask, t, V, first, vocab);
    target[t] = col < 0 ? Real(0) : logits[t * V + col];
  }
}

template <typename Real>
void vocab_target_logit_backward(Real* dlogits, const Real* dy, const int32_t* labels, const uint8_t* mask,
                                 int64_t T, int64_t V, int64_t first, int64_t vocab) {
  std::fill(dlogits, dlogits + T * V, Real(0));
  for (int64_t t = 0; t < T; t++) {
    const int64_t col = target_column("vocab_target_logit_backward", labels, mask, t, V, first, vocab);
    if (col >= 0) dlogits[t * V + col] = dy[t];
  }
}

template <typename Real>
Real ce_from_stats_forward(const Real* lse, const Real* target, const uint8_t* mask, double loss_tokens,
                           int64_t T) {
  check_loss_tokens("ce_from_stats_forward", loss_tokens);
  double total = 0;
  for (int64_t t = 0; t < T; t++)
    if (mask[t]) total += double(lse[t]) - double(target[t]);
  return Real(total / loss_tokens);
}

template <typename Real>
void ce_from_stats_backward(Real* dlse, Real* dtarget, Real g, const uint8_t* mask, double loss_tokens,
                            int64_t T) {
  check_loss_tokens("ce_from_stats_backward", loss_tokens);
  const Real scale = Real(double(g) / loss_tokens);  // as cross_entropy_backward rounds it
  for (int64_t t = 0; t < T; t++) {
    dlse[t] = mask[t] ? scale : Real(0);
    dtarget[t] = -dlse[t];
  }
}

#define LFC_INSTANTIATE_VOCAB_PARALLEL(Real)                                                               \
  template void vocab_logsumexp_forward<Real>(Real*, const Real*, int64_t, int64_t);                      \
  template void vocab_logsumexp_backward<Real>(Real*, const Real*, const Real*, const Real*, int64_t,      \
                                               int64_t);                                                   \
  template void lse_combine_forward<Real>(Real*, const Real*, int64_t, int64_t);                          \
  template void lse_combine_backward<Real>(Real*, const Real*, const Real*, const Real*, int64_t, int64_t); \
  template void vocab_target_logit_forward<Real>(Real*, const Real*, const int32_t*, const uint8_t*,       \
                                                 int64_t, int64_t, int64_t, int64_t);                      \
  template void vocab_target_logit_backward<Real>(Real*, const Real*, const int32_t*, const uint8_t*,      \
                                                  int64_t, int64_t, int64_t, int64_t);                     \
  template Real ce_from_stats_forward<Real>(const Real*, const Real*, const uint8_t*, double, int64_t);   \
  template void ce_from_stats_backward<Real>(Real*, Real*, Real, const uint8_t*, double, int64_t);
LFC_INSTANTIATE_VOCAB_PARALLEL(float)
LFC_INSTANTIATE_VOCAB_PARALLEL(double)
#undef LFC_INSTANTIATE_VOCAB_PARALLEL

// ---- by storage dtype ---------------------------------------------------------------------------

double cross_entropy_forward(Dst lse, Src logits, const int32_t* labels, const uint8_t* mask, double loss_tokens,
                             int64_t T, int64_t V) {
  double loss = 0;
  by_dtype("cross_entropy_forward", {lse, logits}, [&](auto& s) {
    loss = double(cross_entropy_forward(s.out(lse, T), s.in(logits, T * V), labels, mask, loss_tokens, T, V));
  });
  return loss;
}

void cross_entropy_backward(Dst dlogits, double g, Src logits, Src lse, const int32_t* labels, const uint8_t* mask,
                            double loss_tokens, int64_t T, int64_t V) {
  by_dtype("cross_entropy_backward", {dlogits, logits, lse}, [&](auto& s) {
    using Real = typename std::decay_t<decltype(s)>::Real;
    cross_entropy_backward(s.out(dlogits, T * V), Real(g), s.in(logits, T * V), s.in(lse, T), labels, mask,
                           loss_tokens, T, V);
  });
}

void vocab_logsumexp_forward(Dst lse, Src logits, int64_t T, int64_t V) {
  by_dtype("vocab_logsumexp_forward", {lse, logits},
           [&](auto& s) { vocab_logsumexp_forward(s.out(lse, T), s.in(logits, T * V), T, V); });
}

void vocab_logsumexp_backward(Dst dlogits, Src dy, Src logits, Src lse, int64_t T, int64_t V) {
  by_dtype("vocab_logsumexp_backward", {dlogits, dy, logits, lse}, [&](auto& s) {
    vocab_logsumexp_backward(s.out(dlogits, T * V), s.in(dy, T), s.in(logits, T * V), s.in(lse, T), T, V);
  });
}

void lse_combine_forward(Dst y, Src x, int64_t P, int64_t T) {
  by_dtype("lse_combine_forward", {y, x}, [&](auto& s) { lse_combine_forward(s.out(y, T), s.in(x, P * T), P, T); });
}

void lse_combine_backward(Dst dx, Src dy, Src x, Src y, int64_t P, int64_t T) {
  by_dtype("lse_combine_backward", {dx, dy, x, y}, [&](auto& s) {
    lse_combine_backward(s.out(dx, P * T), s.in(dy, T), s.in(x, P * T), s.in(y, T), P, T);
  });
}

void vocab_target_logit_forward(Dst target, Src logits, const int32_t* labels, const uint8_t* mask, int64_t T,
                                int64_t V, int64_t first, int64_t vocab) {
  by_dtype("vocab_target_logit_forward", {target, logits}, [&](auto& s) {
    vocab_target_logit_forward(s.out(target, T), s.in(logits, T * V), labels, mask, T, V, first, vocab);
  });
}

void vocab_target_logit_backward(Dst dlogits, Src dy, const int32_t* labels, const uint8_t* mask, int64_t T,
                                 int64_t V, int64_t first, int64_t vocab) {
  by_dtype("vocab_target_logit_backward", {dlogits, dy}, [&](auto& s) {
    vocab_target_logit_backward(s.out(dlogits, T * V), s.in(dy, T), labels, mask, T, V, first, vocab);
  });
}

double ce_from_stats_forward(Src lse, Src target, const uint8_t* mask, double loss_tokens, int64_t T) {
  double loss = 0;
  by_dtype("ce_from_stats_forward", {lse, target}, [&](auto& s) {
    loss = double(ce_from_stats_forward(s.in(lse, T), s.in(target, T), mask, loss_tokens, T));
  });
  return loss;
}

void ce_from_stats_backward(Dst dlse, Dst dtarget, double g, const uint8_t* mask, double loss_tokens, int64_t T) {
  by_dtype("ce_from_stats_backward", {dlse, dtarget}, [&](auto& s) {
    using Real = typename std::decay_t<decltype(s)>::Real;
    ce_from_stats_backward(s.out(dlse, T), s.out(dtarget, T), Real(g), mask, loss_tokens, T);
  });
}

}  // namespace lfc::cpu
