#include "optimizer.h"

#include <cmath>

#include "core/thread_pool.h"

namespace lfc::cpu {

// ---- reference: one pass, one running sum ------------------------------------------------------

namespace ref {

template <typename Real>
void grad_accumulate(Real* acc, const Real* g, int64_t n) {
  for (int64_t i = 0; i < n; i++) acc[i] += g[i];
}

template <typename Real>
double sum_squares(const Real* x, int64_t n) {
  double acc = 0;
  for (int64_t i = 0; i < n; i++) acc += double(x[i]) * double(x[i]);
  return acc;
}

template <typename Real>
void adamw_step(Real* param, const Real* grad, Real* m, Real* v, int64_t n, const AdamWParams& hp,
                int64_t t) {
  LFC_KERNEL_CHECK(t >= 1, "adamw_step: step ", t, " must be ≥ 1");
  // Per-step scalars in double, per-element work in Real, in the order torch computes them:
  // denom = √v / √(1−β2ᵗ) + ε, p −= (lr / (1−β1ᵗ)) · m / denom.
  const Real decay = Real(1.0 - hp.lr * hp.weight_decay);
  const Real b1 = Real(hp.beta1), b2 = Real(hp.beta2);
  const Real one_minus_b1 = Real(1.0 - hp.beta1), one_minus_b2 = Real(1.0 - hp.beta2);
  const Real step_size = Real(hp.lr / (1.0 - std::pow(hp.beta1, double(t))));
  const Real bc2_sqrt = Real(std::sqrt(1.0 - std::pow(hp.beta2, double(t))));
  const Real eps = Real(hp.eps);
  const Real gs = Real(hp.grad_scale);
  for (int64_t i = 0; i < n; i++) {
    const Real g = hp.grad_scale == 1.0 ? grad[i] : grad[i] * gs;
    const Real p = param[i] * decay;
    const Real mi = b1 * m[i] + one_minus_b1 * g;
    const Real vi = b2 * v[i] + one_minus_b2 * g * g;
    const Real denom = std::sqrt(vi) / bc2_sqrt + eps;
    param[i] = p - step_size * mi / denom;
    m[i] = mi;
    v[i] = vi;
  }
}

}  // namespace ref

// ---- pooled: fixed blocks of kElementGrain elements ------------------------------------------

template <typename Real>
void grad_accumulate(Real* acc, const Real* g, int64_t n) {
  parallelFor(n, kElementGrain, [&](int64_t b, int64_t e) { ref::grad_accumulate(acc + b, g + b, e - b); });
}

namespace {
// Σ x² over x (n) in 8 interleaved double sums (they vectorize), added in lane order
template <typename Real>
double sum_squares_lanes(const Real* x, int64_t n) {
  constexpr int64_t L = 8;
  double lane[L] = {};
  int64_t i = 0;
  for (; i + L <= n; i += L)
    for (int64_t l = 0; l < L; l++) lane[l] += double(x[i + l]) * double(x[i + l]);
  for (; i < n; i++) lane[i % L] += double(x[i]) * double(x[i]);
  double total = 0;
  for (int64_t l = 0; l < L; l++) total += lane[l];
  return total;
}
}  // namespace

// 4·kElementGrain elements a partial: a block of kElementGrain sums in ~3 µs, less than waking a
// worker costs (kernel_check --bench)
constexpr int64_t kSumSquaresGrain = 4 * kElementGrain;

template <typename Real>
double sum_squares(const Real* x, int64_t n) {
  // determinism: one partial per fixed block, summed in block order (parallelSum)
  return parallelSum(n, kSumSquaresGrain, [&](int64_t b, int64_t e) { return sum_squares_lanes(x + b, e - b); });
}

template <typename Real>
void adamw_step(Real* param, const Real* grad, Real* m, Real* v, int64_t n, const AdamWParams& hp,
                int64_t t) {
  LFC_KERNEL_CHECK(t >= 1, "adamw_step: step ", t, " must be ≥ 1");
  parallelFor(n, kElementGrain, [&](int64_t b, int64_t e) {
    ref::adamw_step(param + b, grad + b, m + b, v + b, e - b, hp, t);
  });
}

template <typename Real>
void scale(Real* x, double factor, int64_t n) {
  const Real f = Real(factor);
  for (int64_t i = 0; i < n; i++) x[i] *= f;
}

#define LFC_INSTANTIATE_OPTIMIZER(Real)                                                              \
  template void grad_accumulate<Real>(Real*, const Real*, int64_t);                                  \
  template double sum_squares<Real>(const Real*, int64_t);                                           \
  template void scale<Real>(Real*, double, int64_t);                                                 \
  template void adamw_step<Real>(Real*, const Real*, Real*, Real*, int64_t, const AdamWParams&,       \
                                 int64_t);                                                           \
  template void ref::grad_accumulate<Real>(Real*, const Real*, int64_t);                             \
  template double ref::sum_squares<Real>(const Real*, int64_t);                                      \
  template void ref::adamw_step<Real>(Real*, const Real*, Real*, Real*, int64_t, const AdamWParams&,  \
                                      int64_t);
LFC_INSTANTIATE_OPTIMIZER(float)
LFC_INSTANTIATE_OPTIMIZER(double)

// ---- by storage dtype ---------------------------------------------------------------------------

void grad_accumulate(Dst acc, Src g, int64_t n) {
  by_dtype("grad_accumulate", {acc, g}, [&](auto& s) { grad_accumulate(s.out(acc, n), s.in(g, n), n); });
}

double sum_squares(Src x, int64_t n) {
  double total = 0;
  by_dtype("sum_squares", {x}, [&](auto& s) { total = sum_squares(s.in(x, n), n); });
  return total;
}

void adamw_step(Dst param, Src grad, Dst m, Dst v, int64_t n, const AdamWParams& hp, int64_t t) {
  LFC_KERNEL_CHECK(param.dtype != DType::bf16, "adamw_step: a bf16 parameter needs its fp32 master (adamw_step_master)");
  by_dtype("adamw_step", {param, grad, m, v}, [&](auto& s) {
    adamw_step(s.out(param, n), s.in(grad, n), s.out(m, n), s.out(v, n), n, hp, t);
  });
}

void adamw_step_master(Dst param, Dst master, Src grad, Dst m, Dst v, int64_t n, const AdamWParams& hp, int64_t t) {
  runs_in_f64("adamw_step_master", {param, master, grad, m, v});  // the dtype checks, param included
  by_dtype("adamw_step_master", {master, grad, m, v}, [&](auto& s) {
    adamw_step(s.out(master, n), s.in(grad, n), s.out(m, n), s.out(v, n), n, hp, t);
  });
  convert(param, master, n);
}

}  // namespace lfc::cpu
