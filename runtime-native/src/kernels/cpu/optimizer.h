// Optimizer step pieces: the squared norm for gradient clipping, scaling, and AdamW.
#pragma once

#include <cstdint>

#include "common.h"

namespace lfc::cpu {

// Σ x² over x (n), accumulated in double (the caller sums buffers, takes √, and clips).
template <typename Real>
double sum_squares(const Real* x, int64_t n);
// x (n) *= factor
template <typename Real>
void scale(Real* x, double factor, int64_t n);

struct AdamWParams {
  double lr;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.0;  // 0.1 on parameters of two or more dims, 0 on norms and biases
  double grad_scale = 1.0;    // the clipping factor: the step uses grad · grad_scale
};

// One AdamW step t ≥ 1 (t = 1 on the first call) over param, grad, m, v (n), as torch.optim.AdamW:
//   p ← p − lr·wd·p;  m ← β1·m + (1−β1)·g;  v ← β2·v + (1−β2)·g²;
//   p ← p − lr · (m / (1−β1ᵗ)) / (√(v / (1−β2ᵗ)) + ε)
// Updates param, m, v in place. Throws KernelError if t < 1.
template <typename Real>
void adamw_step(Real* param, const Real* grad, Real* m, Real* v, int64_t n, const AdamWParams& hp,
                int64_t t);

}  // namespace lfc::cpu
