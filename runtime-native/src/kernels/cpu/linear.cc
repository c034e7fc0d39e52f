#include "linear.h"

#include <algorithm>

#include "blas.h"

namespace lfc::cpu {

namespace {

// Σ counts, checked against the rows available.
int64_t checked_rows(const char* kernel, const int32_t* counts, int64_t E, int64_t N) {
  int64_t total = 0;
  for (int64_t e = 0; e < E; e++) {
    LFC_KERNEL_CHECK(counts[e] >= 0, kernel, ": counts[", e, "] = ", counts[e], " is negative");
    total += counts[e];
  }
  LFC_KERNEL_CHECK(total <= N, kernel, ": counts sum to ", total, " rows but x has ", N);
  return total;
}

}  // namespace

// ---- linear, optimized (CBLAS) --------------------------------------------------------------

template <typename Real>
void linear_forward(Real* y, const Real* x, const Real* w, const Real* b, int64_t N, int64_t in,
                    int64_t out) {
  // y (N, out) ← b broadcast, then y += x (N, in) · w (out, in)ᵀ
  for (int64_t n = 0; n < N; n++) {
    Real* yn = y + n * out;
    if (b) std::copy(b, b + out, yn);
    else std::fill(yn, yn + out, Real(0));
  }
  blas::gemm<Real>(false, true, N, out, in, 1, x, in, w, in, 1, y, out);
}

template <typename Real>
void linear_backward_data(Real* dx, const Real* dy, const Real* w, int64_t N, int64_t in, int64_t out) {
  // dx (N, in) = dy (N, out) · w (out, in)
  blas::gemm<Real>(false, false, N, in, out, 1, dy, out, w, in, 0, dx, in);
}

template <typename Real>
void linear_backward_weight(Real* dw, Real* db, const Real* dy, const Real* x, int64_t N, int64_t in,
                            int64_t out) {
  // dw (out, in) += dy (N, out)ᵀ · x (N, in)
  blas::gemm<Real>(true, false, out, in, N, 1, dy, out, x, in, 1, dw, in);
  if (!db) return;
  for (int64_t n = 0; n < N; n++) {  // db (out) += Σ_n dy[n]
    const Real* dyn = dy + n * out;
    for (int64_t o = 0; o < out; o++) db[o] += dyn[o];
  }
}

// ---- grouped_linear, optimized: one gemm per expert block, all of them one pool job -----------

template <typename Real>
void grouped_linear_forward(Real* y, const Real* x, const int32_t* counts, const Real* const* w,
                            int64_t E, int64_t N, int64_t in, int64_t out) {
  const int64_t used = checked_rows("grouped_linear_forward", counts, E, N);
  std::vector<blas::GemmCall<Real>> calls;
  int64_t r0 = 0;
  for (int64_t e = 0; e < E; e++) {
    // y[r0 : r0+c] (c, out) = x[r0 : r0+c] (c, in) · w[e] (out, in)ᵀ
    calls.push_back({false, true, counts[e], out, in, 1, x + r0 * in, in, w[e], in, 0, y + r0 * out, out});
    r0 += counts[e];
  }
  blas::gemm_batch(calls);
  std::fill(y + used * out, y + N * out, Real(0));
}

template <typename Real>
void grouped_linear_backward_data(Real* dx, const Real* dy, const int32_t* counts,
                                  const Real* const* w, int64_t E, int64_t N, int64_t in, int64_t out) {
  const int64_t used = checked_rows("grouped_linear_backward_data", counts, E, N);
  std::vector<blas::GemmCall<Real>> calls;
  int64_t r0 = 0;
  for (int64_t e = 0; e < E; e++) {
    // dx[r0 : r0+c] (c, in) = dy[r0 : r0+c] (c, out) · w[e] (out, in)
    calls.push_back({false, false, counts[e], in, out, 1, dy + r0 * out, out, w[e], in, 0, dx + r0 * in, in});
    r0 += counts[e];
  }
  blas::gemm_batch(calls);
  std::fill(dx + used * in, dx + N * in, Real(0));
}

template <typename Real>
void grouped_linear_backward_weight(Real* const* dw, const Real* dy, const Real* x,
                                    const int32_t* counts, int64_t E, int64_t N, int64_t in,
                                    int64_t out) {
  checked_rows("grouped_linear_backward_weight", counts, E, N);
  std::vector<blas::GemmCall<Real>> calls;
  int64_t r0 = 0;
  for (int64_t e = 0; e < E; e++) {
    // dw[e] (out, in) += dy[r0 : r0+c] (c, out)ᵀ · x[r0 : r0+c] (c, in)
    calls.push_back({true, false, out, in, counts[e], 1, dy + r0 * out, out, x + r0 * in, in, 1, dw[e], in});
    r0 += counts[e];
  }
  blas::gemm_batch(calls);
}

// ---- by storage dtype ---------------------------------------------------------------------------

void linear_forward(Dst y, Src x, Src w, Src b, int64_t N, int64_t in, int64_t out) {
  by_dtype("linear_forward", {y, x, w, b}, [&](auto& s) {
    linear_forward(s.out(y, N * out), s.in(x, N * in), s.in(w, out * in), s.in(b, out), N, in, out);
  });
}

void linear_backward_data(Dst dx, Src dy, Src w, int64_t N, int64_t in, int64_t out) {
  by_dtype("linear_backward_data", {dx, dy, w}, [&](auto& s) {
    linear_backward_data(s.out(dx, N * in), s.in(dy, N * out), s.in(w, out * in), N, in, out);
  });
}

void linear_backward_weight(Dst dw, Dst db, Src dy, Src x, int64_t N, int64_t in, int64_t out) {
  by_dtype("linear_backward_weight", {dw, db, dy, x}, [&](auto& s) {
    linear_backward_weight(s.out(dw, out * in), s.out(db, out), s.in(dy, N * out), s.in(x, N * in), N, in, out);
  });
}

void grouped_linear_forward(Dst y, Src x, const int32_t* counts, const std::vector<Src>& w, int64_t N,
                            int64_t in, int64_t out) {
  std::vector<Src> operands{y, x};
  operands.insert(operands.end(), w.begin(), w.end());
  by_dtype("grouped_linear_forward", operands, [&](auto& s) {
    const auto ws = s.in(w, out * in);
    grouped_linear_forward(s.out(y, N * out), s.in(x, N * in), counts, ws.data(), int64_t(w.size()), N, in, out);
  });
}

void grouped_linear_backward_data(Dst dx, Src dy, const int32_t* counts, const std::vector<Src>& w,
                                  int64_t N, int64_t in, int64_t out) {
  std::vector<Src> operands{dx, dy};
  operands.insert(operands.end(), w.begin(), w.end());
  by_dtype("grouped_linear_backward_data", operands, [&](auto& s) {
    const auto ws = s.in(w, out * in);
    grouped_linear_backward_data(s.out(dx, N * in), s.in(dy, N * out), counts, ws.data(), int64_t(w.size()), N,
                                 in, out);
  });
}

void grouped_linear_backward_weight(const std::vector<Dst>& dw, Src dy, Src x, const int32_t* counts,
                                    int64_t N, int64_t in, int64_t out) {
  std::vector<Src> operands{dy, x};
  operands.insert(operands.end(), dw.begin(), dw.end());
  by_dtype("grouped_linear_backward_weight", operands, [&](auto& s) {
    const auto dws = s.out(dw, out * in);
    grouped_linear_backward_weight(dws.data(), s.in(dy, N * out), s.in(x, N * in), counts, int64_t(dw.size()), N,
                                   in, out);
  });
}

// ---- reference: naive loops, double accumulators ---------------------------------------------

namespace ref {

template <typename Real>
void linear_forward(Real* y, const Real* x, const Real* w, const Real* b, int64_t N, int64_t in,
                    int64_t out) {
  for (int64_t n = 0; n < N; n++)
    for (int64_t o = 0; o < out; o++) {
      double acc = b ? double(b[o]) : 0.0;
      for (int64_t i = 0; i < in; i++) acc += double(x[n * in + i]) * double(w[o * in + i]);
      y[n * out + o] = Real(acc);
    }
}

template <typename Real>
void linear_backward_data(Real* dx, const Real* dy, const Real* w, int64_t N, int64_t in, int64_t out) {
  for (int64_t n = 0; n < N; n++)
    for (int64_t i = 0; i < in; i++) {
      double acc = 0;
      for (int64_t o = 0; o < out; o++) acc += double(dy[n * out + o]) * double(w[o * in + i]);
      dx[n * in + i] = Real(acc);
    }
}

template <typename Real>
void linear_backward_weight(Real* dw, Real* db, const Real* dy, const Real* x, int64_t N, int64_t in,
                            int64_t out) {
  for (int64_t o = 0; o < out; o++) {
    for (int64_t i = 0; i < in; i++) {
      double acc = 0;
      for (int64_t n = 0; n < N; n++) acc += double(dy[n * out + o]) * double(x[n * in + i]);
      dw[o * in + i] += Real(acc);
    }
    if (db) {
      double acc = 0;
      for (int64_t n = 0; n < N; n++) acc += double(dy[n * out + o]);
      db[o] += Real(acc);
    }
  }
}

template <typename Real>
void grouped_linear_forward(Real* y, const Real* x, const int32_t* counts, const Real* const* w,
                            int64_t E, int64_t N, int64_t in, int64_t out) {
  const int64_t used = checked_rows("ref::grouped_linear_forward", counts, E, N);
  for (int64_t e = 0, r0 = 0; e < E; r0 += counts[e], e++)
    ref::linear_forward<Real>(y + r0 * out, x + r0 * in, w[e], nullptr, counts[e], in, out);
  std::fill(y + used * out, y + N * out, Real(0));
}

template <typename Real>
void grouped_linear_backward_data(Real* dx, const Real* dy, const int32_t* counts,
                                  const Real* const* w, int64_t E, int64_t N, int64_t in, int64_t out) {
  const int64_t used = checked_rows("ref::grouped_linear_backward_data", counts, E, N);
  for (int64_t e = 0, r0 = 0; e < E; r0 += counts[e], e++)
    ref::linear_backward_data<Real>(dx + r0 * in, dy + r0 * out, w[e], counts[e], in, out);
  std::fill(dx + used * in, dx + N * in, Real(0));
}

template <typename Real>
void grouped_linear_backward_weight(Real* const* dw, const Real* dy, const Real* x,
                                    const int32_t* counts, int64_t E, int64_t N, int64_t in,
                                    int64_t out) {
  checked_rows("ref::grouped_linear_backward_weight", counts, E, N);
  for (int64_t e = 0, r0 = 0; e < E; r0 += counts[e], e++)
    ref::linear_backward_weight<Real>(dw[e], nullptr, dy + r0 * out, x + r0 * in, counts[e], in, out);
}

}  // namespace ref

#define LFC_INSTANTIATE_LINEAR(NS, Real)                                                            \
  template void NS linear_forward<Real>(Real*, const Real*, const Real*, const Real*, int64_t,     \
                                         int64_t, int64_t);                                         \
  template void NS linear_backward_data<Real>(Real*, const Real*, const Real*, int64_t, int64_t,   \
                                               int64_t);                                            \
  template void NS linear_backward_weight<Real>(Real*, Real*, const Real*, const Real*, int64_t,   \
                                                 int64_t, int64_t);                                 \
  template void NS grouped_linear_forward<Real>(Real*, const Real*, const int32_t*,                \
                                                 const Real* const*, int64_t, int64_t, int64_t,     \
                                                 int64_t);                                          \
  template void NS grouped_linear_backward_data<Real>(Real*, const Real*, const int32_t*,          \
                                                       const Real* const*, int64_t, int64_t,        \
                                                       int64_t, int64_t);                           \
  template void NS grouped_linear_backward_weight<Real>(Real* const*, const Real*, const Real*,    \
                                                         const int32_t*, int64_t, int64_t, int64_t, \
                                                         int64_t);
LFC_INSTANTIATE_LINEAR(, float)
LFC_INSTANTIATE_LINEAR(, double)
LFC_INSTANTIATE_LINEAR(ref::, float)
LFC_INSTANTIATE_LINEAR(ref::, double)

}  // namespace lfc::cpu
