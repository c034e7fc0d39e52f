// Normalization over the last dim of x (R, H): LayerNorm (weight, bias) and RMSNorm (weight).
// q_norm / k_norm are RMSNorm with R = T·nh, H = d.
//
// forward saves per-row statistics for backward; backward OVERWRITES dx and ACCUMULATES dw, db.
// The forwards' reference is the formula itself, which the tests evaluate independently; the
// pooled kernels (core/thread_pool.h: fixed blocks of rows) run ref's loop, one pass over memory,
// on each block of rows, and the tests compare them with it.
#pragma once

#include <cstdint>

#include "common.h"
#include "storage.h"

namespace lfc::cpu {

// y (R, H) = (x − mean) · rstd · w + b, with mean and the biased variance of each row and
// rstd = 1/√(var + eps). Saves mean (R) and rstd (R).
template <typename Real>
void layernorm_forward(Real* y, Real* mean, Real* rstd, const Real* x, const Real* w, const Real* b,
                       int64_t R, int64_t H, double eps);
// dx (R, H) overwritten; dw (H) += Σ_rows dy·x̂; db (H) += Σ_rows dy; x̂ = (x − mean)·rstd.
template <typename Real>
void layernorm_backward(Real* dx, Real* dw, Real* db, const Real* dy, const Real* x, const Real* w,
                        const Real* mean, const Real* rstd, int64_t R, int64_t H);

// y (R, H) = x · rstd · w, rstd = 1/√(mean(x²) + eps). Saves rstd (R).
template <typename Real>
void rmsnorm_forward(Real* y, Real* rstd, const Real* x, const Real* w, int64_t R, int64_t H, double eps);
// dx (R, H) overwritten; dw (H) += Σ_rows dy·x·rstd.
template <typename Real>
void rmsnorm_backward(Real* dx, Real* dw, const Real* dy, const Real* x, const Real* w,
                      const Real* rstd, int64_t R, int64_t H);

// The forwards' statistics alone, the same bits (the backwards' recomputation: no y is written).
template <typename Real>
void layernorm_stats(Real* mean, Real* rstd, const Real* x, int64_t R, int64_t H, double eps);
template <typename Real>
void rmsnorm_stats(Real* rstd, const Real* x, int64_t R, int64_t H, double eps);

// The one-thread loops the pooled kernels above run on each block of rows (their dw, db summed per
// block, then the blocks in order).
namespace ref {
template <typename Real>
void layernorm_forward(Real* y, Real* mean, Real* rstd, const Real* x, const Real* w, const Real* b,
                       int64_t R, int64_t H, double eps);
template <typename Real>
void layernorm_backward(Real* dx, Real* dw, Real* db, const Real* dy, const Real* x, const Real* w,
                        const Real* mean, const Real* rstd, int64_t R, int64_t H);
template <typename Real>
void rmsnorm_forward(Real* y, Real* rstd, const Real* x, const Real* w, int64_t R, int64_t H, double eps);
template <typename Real>
void rmsnorm_backward(Real* dx, Real* dw, const Real* dy, const Real* x, const Real* w,
                      const Real* rstd, int64_t R, int64_t H);
template <typename Real>
void layernorm_stats(Real* mean, Real* rstd, const Real* x, int64_t R, int64_t H, double eps);
template <typename Real>
void rmsnorm_stats(Real* rstd, const Real* x, int64_t R, int64_t H, double eps);
}  // namespace ref

// ---- entry points by storage dtype (storage.h): each operand f32 or bf16, or all f64 -----------
// mean, rstd: the statistics in the compute type (f32, or f64 on the f64 path).
void layernorm_forward(Dst y, Dst mean, Dst rstd, Src x, Src w, Src b, int64_t R, int64_t H, double eps);
void layernorm_backward(Dst dx, Dst dw, Dst db, Src dy, Src x, Src w, Src mean, Src rstd, int64_t R, int64_t H);
void rmsnorm_forward(Dst y, Dst rstd, Src x, Src w, int64_t R, int64_t H, double eps);
void rmsnorm_backward(Dst dx, Dst dw, Src dy, Src x, Src w, Src rstd, int64_t R, int64_t H);
void layernorm_stats(Dst mean, Dst rstd, Src x, int64_t R, int64_t H, double eps);
void rmsnorm_stats(Dst rstd, Src x, int64_t R, int64_t H, double eps);

}  // namespace lfc::cpu
