#include "norm.h"

#include <cmath>
#include <vector>

#include "core/thread_pool.h"

namespace lfc::cpu {

// Row reductions accumulate in double; the per-element work stays in Real.

// ---- reference: one pass over the rows -------------------------------------------------------

namespace {
// a row's mean and rstd, in double: the forward and the statistics alone both use this, so the
// backward's recomputed statistics are the forward's bits
template <typename Real>
void layernorm_row_stats(const Real* xr, int64_t H, double eps, double& m, double& s) {
  double sum = 0;
  for (int64_t i = 0; i < H; i++) sum += xr[i];
  m = sum / double(H);
  double var = 0;  // two passes: no cancellation when |mean| ≫ std
  for (int64_t i = 0; i < H; i++) var += (xr[i] - m) * (xr[i] - m);
  var /= double(H);
  s = 1.0 / std::sqrt(var + eps);
}

template <typename Real>
Real rmsnorm_row_rstd(const Real* xr, int64_t H, double eps) {
  double ss = 0;
  for (int64_t i = 0; i < H; i++) ss += double(xr[i]) * double(xr[i]);
  return Real(1.0 / std::sqrt(ss / double(H) + eps));
}
}  // namespace

namespace ref {

template <typename Real>
void layernorm_forward(Real* y, Real* mean, Real* rstd, const Real* x, const Real* w, const Real* b,
                       int64_t R, int64_t H, double eps) {
  for (int64_t r = 0; r < R; r++) {
    const Real* xr = x + r * H;  // (H)
    Real* yr = y + r * H;        // (H)
    double m, s;
    layernorm_row_stats(xr, H, eps, m, s);
    for (int64_t i = 0; i < H; i++) yr[i] = Real((xr[i] - m) * s) * w[i] + b[i];
    mean[r] = Real(m);
    rstd[r] = Real(s);
  }
}

template <typename Real>
void layernorm_stats(Real* mean, Real* rstd, const Real* x, int64_t R, int64_t H, double eps) {
  for (int64_t r = 0; r < R; r++) {
    double m, s;
    layernorm_row_stats(x + r * H, H, eps, m, s);
    mean[r] = Real(m);
    rstd[r] = Real(s);
  }
}

template <typename Real>
void layernorm_backward(Real* dx, Real* dw, Real* db, const Real* dy, const Real* x, const Real* w,
                        const Real* mean, const Real* rstd, int64_t R, int64_t H) {
  for (int64_t r = 0; r < R; r++) {
    const Real* xr = x + r * H;    // (H)
    const Real* dyr = dy + r * H;  // (H)
    Real* dxr = dx + r * H;        // (H)
    const Real m = mean[r], s = rstd[r];
    // dx̂ = dy·w;  dx = rstd · (dx̂ − mean(dx̂) − x̂ · mean(dx̂ · x̂))
    double dnorm_mean = 0, dnorm_norm_mean = 0;
    for (int64_t i = 0; i < H; i++) {
      const Real norm = (xr[i] - m) * s;
      const Real dnorm = dyr[i] * w[i];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
      dw[i] += dyr[i] * norm;
      db[i] += dyr[i];
    }
    dnorm_mean /= double(H);
    dnorm_norm_mean /= double(H);
    for (int64_t i = 0; i < H; i++) {
      const Real norm = (xr[i] - m) * s;
      const Real dnorm = dyr[i] * w[i];
      dxr[i] = s * (dnorm - Real(dnorm_mean) - norm * Real(dnorm_norm_mean));
    }
  }
}

template <typename Real>
void rmsnorm_forward(Real* y, Real* rstd, const Real* x, const Real* w, int64_t R, int64_t H, double eps) {
  for (int64_t r = 0; r < R; r++) {
    const Real* xr = x + r * H;  // (H)
    Real* yr = y + r * H;        // (H)
    const Real s = rmsnorm_row_rstd(xr, H, eps);
    for (int64_t i = 0; i < H; i++) yr[i] = xr[i] * s * w[i];
    rstd[r] = s;
  }
}

template <typename Real>
void rmsnorm_stats(Real* rstd, const Real* x, int64_t R, int64_t H, double eps) {
  for (int64_t r = 0; r < R; r++) rstd[r] = rmsnorm_row_rstd(x + r * H, H, eps);
}

template <typename Real>
void rmsnorm_backward(Real* dx, Real* dw, const Real* dy, const Real* x, const Real* w,
                      const Real* rstd, int64_t R, int64_t H) {
  for (int64_t r = 0; r < R; r++) {
    const Real* xr = x + r * H;    // (H)
    const Real* dyr = dy + r * H;  // (H)
    Real* dxr = dx + r * H;        // (H)
    const Real s = rstd[r];
    // x̂ = x·rstd, dx̂ = dy·w;  dx = rstd · (dx̂ − x̂ · mean(dx̂ · x̂))
    double dnorm_norm_mean = 0;
    for (int64_t i = 0; i < H; i++) {
      const Real norm = xr[i] * s;
      dnorm_norm_mean += dyr[i] * w[i] * norm;
      dw[i] += dyr[i] * norm;
    }
    dnorm_norm_mean /= double(H);
    for (int64_t i = 0; i < H; i++) dxr[i] = s * (dyr[i] * w[i] - xr[i] * s * Real(dnorm_norm_mean));
  }
}

}  // namespace ref

// ---- pooled: fixed blocks of row_grain(H) rows ------------------------------------------------
// Rows are independent but for the weight gradients: each block accumulates its own partial of
// dw (and db) from zero with ref's loop over its rows, and the partials are added to dw in block
// order on the calling thread (the determinism rule of core/thread_pool.h). dx, y and the
// statistics are ref's bits; dw and db are ref's within rounding (Σ in another order).

template <typename Real>
void layernorm_forward(Real* y, Real* mean, Real* rstd, const Real* x, const Real* w, const Real* b,
                       int64_t R, int64_t H, double eps) {
  parallelFor(R, row_grain(H * int64_t(sizeof(Real))), [&](int64_t r0, int64_t r1) {
    ref::layernorm_forward(y + r0 * H, mean + r0, rstd + r0, x + r0 * H, w, b, r1 - r0, H, eps);
  });
}

template <typename Real>
void layernorm_stats(Real* mean, Real* rstd, const Real* x, int64_t R, int64_t H, double eps) {
  parallelFor(R, row_grain(H * int64_t(sizeof(Real))), [&](int64_t r0, int64_t r1) {
    ref::layernorm_stats(mean + r0, rstd + r0, x + r0 * H, r1 - r0, H, eps);
  });
}

template <typename Real>
void rmsnorm_stats(Real* rstd, const Real* x, int64_t R, int64_t H, double eps) {
  parallelFor(R, row_grain(H * int64_t(sizeof(Real))), [&](int64_t r0, int64_t r1) {
    ref::rmsnorm_stats(rstd + r0, x + r0 * H, r1 - r0, H, eps);
  });
}

namespace {
// dst (H) += Σ_k partial[k·H …] over k in order (the blocks' weight-gradient partials)
template <typename Real>
void add_partials(Real* dst, const std::vector<Real>& partial, int64_t H) {
  const int64_t blocks = H == 0 ? 0 : int64_t(partial.size()) / H;
  for (int64_t i = 0; i < H; i++) {
    Real acc = Real(0);
    for (int64_t k = 0; k < blocks; k++) acc += partial[size_t(k * H + i)];
    dst[i] += acc;
  }
}
}  // namespace

template <typename Real>
void layernorm_backward(Real* dx, Real* dw, Real* db, const Real* dy, const Real* x, const Real* w,
                        const Real* mean, const Real* rstd, int64_t R, int64_t H) {
  const int64_t grain = row_grain(H * int64_t(sizeof(Real)));
  const int64_t blocks = (R + grain - 1) / grain;
  std::vector<Real> dw_part(size_t(blocks * H), Real(0)), db_part(size_t(blocks * H), Real(0));  // (blocks, H)
  parallelFor(R, grain, [&](int64_t r0, int64_t r1) {
    const int64_t k = r0 / grain;
    ref::layernorm_backward(dx + r0 * H, dw_part.data() + k * H, db_part.data() + k * H, dy + r0 * H, x + r0 * H,
                            w, mean + r0, rstd + r0, r1 - r0, H);
  });
  add_partials(dw, dw_part, H);
  add_partials(db, db_part, H);
}

template <typename Real>
void rmsnorm_forward(Real* y, Real* rstd, const Real* x, const Real* w, int64_t R, int64_t H, double eps) {
  parallelFor(R, row_grain(H * int64_t(sizeof(Real))), [&](int64_t r0, int64_t r1) {
    ref::rmsnorm_forward(y + r0 * H, rstd + r0, x + r0 * H, w, r1 - r0, H, eps);
  });
}

template <typename Real>
void rmsnorm_backward(Real* dx, Real* dw, const Real* dy, const Real* x, const Real* w,
                      const Real* rstd, int64_t R, int64_t H) {
  const int64_t grain = row_grain(H * int64_t(sizeof(Real)));
  const int64_t blocks = (R + grain - 1) / grain;
  std::vector<Real> dw_part(size_t(blocks * H), Real(0));  // (blocks, H)
  parallelFor(R, grain, [&](int64_t r0, int64_t r1) {
    ref::rmsnorm_backward(dx + r0 * H, dw_part.data() + (r0 / grain) * H, dy + r0 * H, x + r0 * H, w, rstd + r0,
                          r1 - r0, H);
  });
  add_partials(dw, dw_part, H);
}

#define LFC_INSTANTIATE_NORM_IN(NS, Real)                                                                  \
  template void NS layernorm_forward<Real>(Real*, Real*, Real*, const Real*, const Real*, const Real*, \
                                        int64_t, int64_t, double);                                  \
  template void NS layernorm_backward<Real>(Real*, Real*, Real*, const Real*, const Real*,             \
                                         const Real*, const Real*, const Real*, int64_t, int64_t);  \
  template void NS rmsnorm_forward<Real>(Real*, Real*, const Real*, const Real*, int64_t, int64_t,     \
                                      double);                                                      \
  template void NS rmsnorm_backward<Real>(Real*, Real*, const Real*, const Real*, const Real*,         \
                                       const Real*, int64_t, int64_t);                                 \
  template void NS layernorm_stats<Real>(Real*, Real*, const Real*, int64_t, int64_t, double);         \
  template void NS rmsnorm_stats<Real>(Real*, const Real*, int64_t, int64_t, double);
#define LFC_INSTANTIATE_NORM(Real) LFC_INSTANTIATE_NORM_IN(, Real) LFC_INSTANTIATE_NORM_IN(ref::, Real)
LFC_INSTANTIATE_NORM(float)
LFC_INSTANTIATE_NORM(double)
#undef LFC_INSTANTIATE_NORM
#undef LFC_INSTANTIATE_NORM_IN

// ---- by storage dtype ---------------------------------------------------------------------------

void layernorm_forward(Dst y, Dst mean, Dst rstd, Src x, Src w, Src b, int64_t R, int64_t H, double eps) {
  by_dtype("layernorm_forward", {y, mean, rstd, x, w, b}, [&](auto& s) {
    layernorm_forward(s.out(y, R * H), s.out(mean, R), s.out(rstd, R), s.in(x, R * H), s.in(w, H), s.in(b, H), R, H,
                      eps);
  });
}

void layernorm_backward(Dst dx, Dst dw, Dst db, Src dy, Src x, Src w, Src mean, Src rstd, int64_t R, int64_t H) {
  by_dtype("layernorm_backward", {dx, dw, db, dy, x, w, mean, rstd}, [&](auto& s) {
    layernorm_backward(s.out(dx, R * H), s.out(dw, H), s.out(db, H), s.in(dy, R * H), s.in(x, R * H), s.in(w, H),
                       s.in(mean, R), s.in(rstd, R), R, H);
  });
}

void rmsnorm_forward(Dst y, Dst rstd, Src x, Src w, int64_t R, int64_t H, double eps) {
  by_dtype("rmsnorm_forward", {y, rstd, x, w}, [&](auto& s) {
    rmsnorm_forward(s.out(y, R * H), s.out(rstd, R), s.in(x, R * H), s.in(w, H), R, H, eps);
  });
}

void layernorm_stats(Dst mean, Dst rstd, Src x, int64_t R, int64_t H, double eps) {
  by_dtype("layernorm_stats", {mean, rstd, x},
           [&](auto& s) { layernorm_stats(s.out(mean, R), s.out(rstd, R), s.in(x, R * H), R, H, eps); });
}

void rmsnorm_stats(Dst rstd, Src x, int64_t R, int64_t H, double eps) {
  by_dtype("rmsnorm_stats", {rstd, x}, [&](auto& s) { rmsnorm_stats(s.out(rstd, R), s.in(x, R * H), R, H, eps); });
}

void rmsnorm_backward(Dst dx, Dst dw, Src dy, Src x, Src w, Src rstd, int64_t R, int64_t H) {
  by_dtype("rmsnorm_backward", {dx, dw, dy, x, w, rstd}, [&](auto& s) {
    rmsnorm_backward(s.out(dx, R * H), s.out(dw, H), s.in(dy, R * H), s.in(x, R * H), s.in(w, H), s.in(rstd, R), R,
                     H);
  });
}

}  // namespace lfc::cpu
