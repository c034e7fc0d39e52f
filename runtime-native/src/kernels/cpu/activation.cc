#include "activation.h"

#include <cmath>
#include <type_traits>

#include "core/thread_pool.h"
#include "simd.h"

namespace lfc::cpu {

namespace {
constexpr double kGeluC = 0.7978845608028654;  // √(2/π)
constexpr double kGeluA = 0.044715;

template <typename Real>
Real sigmoid(Real g) {
  return Real(1) / (Real(1) + std::exp(-g));  // exp overflow → σ = 0, no NaN
}
}  // namespace

// ---- reference: one loop over the elements ---------------------------------------------------

namespace ref {

template <typename Real>
void gelu_forward(Real* y, const Real* x, int64_t n) {
  const Real c = Real(kGeluC), a = Real(kGeluA);
  for (int64_t i = 0; i < n; i++) {
    const Real xi = x[i];
    y[i] = Real(0.5) * xi * (Real(1) + std::tanh(c * (xi + a * xi * xi * xi)));
  }
}

template <typename Real>
void gelu_backward(Real* dx, const Real* dy, const Real* x, int64_t n) {
  const Real c = Real(kGeluC), a = Real(kGeluA);
  for (int64_t i = 0; i < n; i++) {
    const Real xi = x[i];
    const Real th = std::tanh(c * (xi + a * xi * xi * xi));
    const Real du = c * (Real(1) + Real(3) * a * xi * xi);  // d/dx of the tanh argument
    dx[i] = dy[i] * (Real(0.5) * (Real(1) + th) + Real(0.5) * xi * (Real(1) - th * th) * du);
  }
}

template <typename Real>
void gelu_exact_forward(Real* y, const Real* x, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    const double xi = double(x[i]);
    y[i] = Real(0.5 * xi * (1.0 + std::erf(xi * M_SQRT1_2)));
  }
}

template <typename Real>
void gelu_exact_backward(Real* dx, const Real* dy, const Real* x, int64_t n) {
  constexpr double kInvSqrt2Pi = 0.3989422804014327;  // 1/√(2π)
  for (int64_t i = 0; i < n; i++) {
    const double xi = double(x[i]);
    const double cdf = 0.5 * (1.0 + std::erf(xi * M_SQRT1_2)), pdf = kInvSqrt2Pi * std::exp(-0.5 * xi * xi);
    dx[i] = Real(double(dy[i]) * (cdf + xi * pdf));
  }
}

template <typename Real>
void swiglu_forward(Real* y, const Real* gate, const Real* up, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = gate[i] * sigmoid(gate[i]) * up[i];
}

template <typename Real>
void swiglu_backward(Real* dgate, Real* dup, const Real* dy, const Real* gate, const Real* up, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    const Real g = gate[i], u = up[i], s = sigmoid(g);
    const Real dyi = dy[i];
    dgate[i] = dyi * u * s * (Real(1) + g * (Real(1) - s));
    dup[i] = dyi * g * s;
  }
}

template <typename Real>
void add_forward(Real* y, const Real* a, const Real* b, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = a[i] + b[i];
}

template <typename Real>
void add_backward(Real* da, Real* db, const Real* dy, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    const Real g = dy[i];
    da[i] = g;
    db[i] = g;
  }
}

}  // namespace ref

// ---- fast: the float loops of the tanh GELU and SwiGLU, vectorized (simd.h) -----------------
//
// GELU-tanh as x·σ(2u) = x / (1 + e^(−2u)), u = √(2/π)(x + 0.044715x³): the same function as ref's
// ½x(1 + tanh u), with one exp_approx for the tanh (and no cancellation in 1 + tanh u for negative
// x, where ref loses digits). Backward: ½(1 + tanh u) = s and ½(1 − tanh² u) = 2s(1 − s), s = σ(2u).
// They agree with ref to a few float ulps of the output's scale (pool_check's tolerance).

namespace {
LFC_ISA_CLONES void gelu_forward_f32(float* y, const float* x, int64_t n) {
  const float c2 = float(-2 * kGeluC), a = float(kGeluA);
  for (int64_t i = 0; i < n; i++) {
    const float xi = x[i];
    y[i] = xi / (1.0f + simd::exp_approx(c2 * (xi + a * xi * xi * xi)));
  }
}

LFC_ISA_CLONES void gelu_backward_f32(float* dx, const float* dy, const float* x, int64_t n) {
  const float c = float(kGeluC), c2 = float(-2 * kGeluC), a = float(kGeluA), a3 = float(3 * kGeluA);
  for (int64_t i = 0; i < n; i++) {
    const float xi = x[i];
    const float e = simd::exp_approx(c2 * (xi + a * xi * xi * xi));  // e^(−2u)
    const float s = 1.0f / (1.0f + e);                                  // σ(2u)
    const float du = c * (1.0f + a3 * xi * xi);
    dx[i] = dy[i] * (s + 2.0f * xi * (s * s * e) * du);  // 1 − s = e·s
  }
}

LFC_ISA_CLONES void swiglu_forward_f32(float* y, const float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    const float g = gate[i];
    y[i] = g / (1.0f + simd::exp_approx(-g)) * up[i];
  }
}

LFC_ISA_CLONES void swiglu_backward_f32(float* dgate, float* dup, const float* dy, const float* gate,
                                        const float* up, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    const float g = gate[i], u = up[i], dyi = dy[i];
    const float e = simd::exp_approx(-g), s = 1.0f / (1.0f + e);
    dgate[i] = dyi * u * s * (1.0f + g * (e * s));  // 1 − s = e·s
    dup[i] = dyi * g * s;
  }
}
}  // namespace

// ---- pooled: fixed blocks of kElementGrain elements, each a loop on its range (no element
// depends on another: the same bits at any thread count); float through the fast loops above,
// double through ref's --------------------------------------------------------------------------

template <typename Real>
void gelu_forward(Real* y, const Real* x, int64_t n) {
  parallelFor(n, kElementGrain, [&](int64_t b, int64_t e) {
    if constexpr (std::is_same_v<Real, float>)
      gelu_forward_f32(y + b, x + b, e - b);
    else
      ref::gelu_forward(y + b, x + b, e - b);
  });
}

template <typename Real>
void gelu_backward(Real* dx, const Real* dy, const Real* x, int64_t n) {
  parallelFor(n, kElementGrain, [&](int64_t b, int64_t e) {
    if constexpr (std::is_same_v<Real, float>)
      gelu_backward_f32(dx + b, dy + b, x + b, e - b);
    else
      ref::gelu_backward(dx + b, dy + b, x + b, e - b);
  });
}

template <typename Real>
void gelu_exact_forward(Real* y, const Real* x, int64_t n) {
  parallelFor(n, kElementGrain, [&](int64_t b, int64_t e) { ref::gelu_exact_forward(y + b, x + b, e - b); });
}

template <typename Real>
void gelu_exact_backward(Real* dx, const Real* dy, const Real* x, int64_t n) {
  parallelFor(n, kElementGrain,
              [&](int64_t b, int64_t e) { ref::gelu_exact_backward(dx + b, dy + b, x + b, e - b); });
}

template <typename Real>
void swiglu_forward(Real* y, const Real* gate, const Real* up, int64_t n) {
  parallelFor(n, kElementGrain, [&](int64_t b, int64_t e) {
    if constexpr (std::is_same_v<Real, float>)
      swiglu_forward_f32(y + b, gate + b, up + b, e - b);
    else
      ref::swiglu_forward(y + b, gate + b, up + b, e - b);
  });
}

template <typename Real>
void swiglu_backward(Real* dgate, Real* dup, const Real* dy, const Real* gate, const Real* up, int64_t n) {
  parallelFor(n, kElementGrain, [&](int64_t b, int64_t e) {
    if constexpr (std::is_same_v<Real, float>)
      swiglu_backward_f32(dgate + b, dup + b, dy + b, gate + b, up + b, e - b);
    else
      ref::swiglu_backward(dgate + b, dup + b, dy + b, gate + b, up + b, e - b);
  });
}

template <typename Real>
void add_forward(Real* y, const Real* a, const Real* b, int64_t n) {
  parallelFor(n, kElementGrain, [&](int64_t i, int64_t e) { ref::add_forward(y + i, a + i, b + i, e - i); });
}

template <typename Real>
void add_backward(Real* da, Real* db, const Real* dy, int64_t n) {
  parallelFor(n, kElementGrain, [&](int64_t b, int64_t e) { ref::add_backward(da + b, db + b, dy + b, e - b); });
}

#define LFC_INSTANTIATE_ACTIVATION_IN(NS, Real)                                                           \
  template void NS gelu_forward<Real>(Real*, const Real*, int64_t);                                   \
  template void NS gelu_backward<Real>(Real*, const Real*, const Real*, int64_t);                     \
  template void NS gelu_exact_forward<Real>(Real*, const Real*, int64_t);                             \
  template void NS gelu_exact_backward<Real>(Real*, const Real*, const Real*, int64_t);               \
  template void NS swiglu_forward<Real>(Real*, const Real*, const Real*, int64_t);                    \
  template void NS swiglu_backward<Real>(Real*, Real*, const Real*, const Real*, const Real*, int64_t); \
  template void NS add_forward<Real>(Real*, const Real*, const Real*, int64_t);                       \
  template void NS add_backward<Real>(Real*, Real*, const Real*, int64_t);
#define LFC_INSTANTIATE_ACTIVATION(Real)    \
  LFC_INSTANTIATE_ACTIVATION_IN(, Real) \
  LFC_INSTANTIATE_ACTIVATION_IN(ref::, Real)
LFC_INSTANTIATE_ACTIVATION(float)
LFC_INSTANTIATE_ACTIVATION(double)
#undef LFC_INSTANTIATE_ACTIVATION
#undef LFC_INSTANTIATE_ACTIVATION_IN

// ---- by storage dtype ---------------------------------------------------------------------------

void gelu_forward(Dst y, Src x, int64_t n) {
  by_dtype("gelu_forward", {y, x}, [&](auto& s) { gelu_forward(s.out(y, n), s.in(x, n), n); });
}

void gelu_backward(Dst dx, Src dy, Src x, int64_t n) {
  by_dtype("gelu_backward", {dx, dy, x}, [&](auto& s) { gelu_backward(s.out(dx, n), s.in(dy, n), s.in(x, n), n); });
}

void gelu_exact_forward(Dst y, Src x, int64_t n) {
  by_dtype("gelu_exact_forward", {y, x}, [&](auto& s) { gelu_exact_forward(s.out(y, n), s.in(x, n), n); });
}

void gelu_exact_backward(Dst dx, Src dy, Src x, int64_t n) {
  by_dtype("gelu_exact_backward", {dx, dy, x},
           [&](auto& s) { gelu_exact_backward(s.out(dx, n), s.in(dy, n), s.in(x, n), n); });
}

void swiglu_forward(Dst y, Src gate, Src up, int64_t n) {
  by_dtype("swiglu_forward", {y, gate, up},
           [&](auto& s) { swiglu_forward(s.out(y, n), s.in(gate, n), s.in(up, n), n); });
}

void swiglu_backward(Dst dgate, Dst dup, Src dy, Src gate, Src up, int64_t n) {
  by_dtype("swiglu_backward", {dgate, dup, dy, gate, up}, [&](auto& s) {
    swiglu_backward(s.out(dgate, n), s.out(dup, n), s.in(dy, n), s.in(gate, n), s.in(up, n), n);
  });
}

void add_forward(Dst y, Src a, Src b, int64_t n) {
  by_dtype("add_forward", {y, a, b}, [&](auto& s) { add_forward(s.out(y, n), s.in(a, n), s.in(b, n), n); });
}

void add_backward(Dst da, Dst db, Src dy, int64_t n) {
  by_dtype("add_backward", {da, db, dy}, [&](auto& s) { add_backward(s.out(da, n), s.out(db, n), s.in(dy, n), n); });
}

}  // namespace lfc::cpu
