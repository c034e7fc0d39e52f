#include "norm.h"

#include <cmath>

namespace lfc::cpu {

// Row reductions accumulate in double; the per-element work stays in Real.

template <typename Real>
void layernorm_forward(Real* y, Real* mean, Real* rstd, const Real* x, const Real* w, const Real* b,
                       int64_t R, int64_t H, double eps) {
  for (int64_t r = 0; r < R; r++) {
    const Real* xr = x + r * H;  // (H)
    Real* yr = y + r * H;        // (H)
    double sum = 0;
    for (int64_t i = 0; i < H; i++) sum += xr[i];
    const double m = sum / double(H);
    double var = 0;  // two passes: no cancellation when |mean| ≫ std
    for (int64_t i = 0; i < H; i++) var += (xr[i] - m) * (xr[i] - m);
    var /= double(H);
    const double s = 1.0 / std::sqrt(var + eps);
    for (int64_t i = 0; i < H; i++) yr[i] = Real((xr[i] - m) * s) * w[i] + b[i];
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
    double ss = 0;
    for (int64_t i = 0; i < H; i++) ss += double(xr[i]) * double(xr[i]);
    const Real s = Real(1.0 / std::sqrt(ss / double(H) + eps));
    for (int64_t i = 0; i < H; i++) yr[i] = xr[i] * s * w[i];
    rstd[r] = s;
  }
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

#define LFC_INSTANTIATE_NORM(Real)                                                                  \
  template void layernorm_forward<Real>(Real*, Real*, Real*, const Real*, const Real*, const Real*, \
                                        int64_t, int64_t, double);                                  \
  template void layernorm_backward<Real>(Real*, Real*, Real*, const Real*, const Real*,             \
                                         const Real*, const Real*, const Real*, int64_t, int64_t);  \
  template void rmsnorm_forward<Real>(Real*, Real*, const Real*, const Real*, int64_t, int64_t,     \
                                      double);                                                      \
  template void rmsnorm_backward<Real>(Real*, Real*, const Real*, const Real*, const Real*,         \
                                       const Real*, int64_t, int64_t);
LFC_INSTANTIATE_NORM(float)
LFC_INSTANTIATE_NORM(double)

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

void rmsnorm_backward(Dst dx, Dst dw, Src dy, Src x, Src w, Src rstd, int64_t R, int64_t H) {
  by_dtype("rmsnorm_backward", {dx, dw, dy, x, w, rstd}, [&](auto& s) {
    rmsnorm_backward(s.out(dx, R * H), s.out(dw, H), s.in(dy, R * H), s.in(x, R * H), s.in(w, H), s.in(rstd, R), R,
                     H);
  });
}

}  // namespace lfc::cpu
