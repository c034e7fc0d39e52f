// Linear layers: y = x·Wᵀ + b (linear, patch_embed), and one linear per expert over consecutive
// row blocks (grouped_linear). W is stored (out, in) as in the checkpoints.
//
// backward_data OVERWRITES dx; backward_weight ACCUMULATES into dw / db (the caller zeroes once).
// The optimized versions go through CBLAS gemm; lfc::cpu::ref has the naive loops.
#pragma once

#include <cstdint>
#include <vector>

#include "common.h"
#include "storage.h"

namespace lfc::cpu {

// y (N, out) = x (N, in) · w (out, in)ᵀ + b (out); b may be null.
template <typename Real>
void linear_forward(Real* y, const Real* x, const Real* w, const Real* b, int64_t N, int64_t in,
                    int64_t out);
// dx (N, in) = dy (N, out) · w (out, in).
template <typename Real>
void linear_backward_data(Real* dx, const Real* dy, const Real* w, int64_t N, int64_t in, int64_t out);
// dw (out, in) += dy (N, out)ᵀ · x (N, in);  db (out) += Σ_rows dy (db may be null).
template <typename Real>
void linear_backward_weight(Real* dw, Real* db, const Real* dy, const Real* x, int64_t N, int64_t in,
                            int64_t out);

// grouped_linear: the rows of x (N, in) are split into consecutive blocks of counts[e] rows,
// e = 0 … E−1; block e is multiplied by w[e] (out, in): y_block = x_block · w[e]ᵀ. No bias.
// Σ counts may be less than N (a bounded buffer): rows past Σ counts get y = 0 and dx = 0.
// Throws KernelError if a count is negative or Σ counts > N.
//   w: E pointers to (out, in) matrices;  dw: E pointers, each ACCUMULATED.
template <typename Real>
void grouped_linear_forward(Real* y, const Real* x, const int32_t* counts, const Real* const* w,
                            int64_t E, int64_t N, int64_t in, int64_t out);
template <typename Real>
void grouped_linear_backward_data(Real* dx, const Real* dy, const int32_t* counts,
                                  const Real* const* w, int64_t E, int64_t N, int64_t in, int64_t out);
template <typename Real>
void grouped_linear_backward_weight(Real* const* dw, const Real* dy, const Real* x,
                                    const int32_t* counts, int64_t E, int64_t N, int64_t in,
                                    int64_t out);

// ---- entry points by storage dtype (storage.h): each operand f32 or bf16, or all f64 -----------
// The same functions on dtype-tagged operands. bf16 operands are upconverted to f32 and go
// through cblas_sgemm; each output accumulates in f32 and is rounded once. A fast bf16 GEMM
// plugs in at the top of these (linear.cc). Grouped: E = w.size() (or dw.size()).
void linear_forward(Dst y, Src x, Src w, Src b, int64_t N, int64_t in, int64_t out);
void linear_backward_data(Dst dx, Src dy, Src w, int64_t N, int64_t in, int64_t out);
void linear_backward_weight(Dst dw, Dst db, Src dy, Src x, int64_t N, int64_t in, int64_t out);
void grouped_linear_forward(Dst y, Src x, const int32_t* counts, const std::vector<Src>& w, int64_t N,
                            int64_t in, int64_t out);
void grouped_linear_backward_data(Dst dx, Src dy, const int32_t* counts, const std::vector<Src>& w,
                                  int64_t N, int64_t in, int64_t out);
void grouped_linear_backward_weight(const std::vector<Dst>& dw, Src dy, Src x, const int32_t* counts,
                                    int64_t N, int64_t in, int64_t out);

namespace ref {
template <typename Real>
void linear_forward(Real* y, const Real* x, const Real* w, const Real* b, int64_t N, int64_t in,
                    int64_t out);
template <typename Real>
void linear_backward_data(Real* dx, const Real* dy, const Real* w, int64_t N, int64_t in, int64_t out);
template <typename Real>
void linear_backward_weight(Real* dw, Real* db, const Real* dy, const Real* x, int64_t N, int64_t in,
                            int64_t out);
template <typename Real>
void grouped_linear_forward(Real* y, const Real* x, const int32_t* counts, const Real* const* w,
                            int64_t E, int64_t N, int64_t in, int64_t out);
template <typename Real>
void grouped_linear_backward_data(Real* dx, const Real* dy, const int32_t* counts,
                                  const Real* const* w, int64_t E, int64_t N, int64_t in, int64_t out);
template <typename Real>
void grouped_linear_backward_weight(Real* const* dw, const Real* dy, const Real* x,
                                    const int32_t* counts, int64_t E, int64_t N, int64_t in,
                                    int64_t out);
}  // namespace ref

}  // namespace lfc::cpu
