// Optimizer step pieces: gradient accumulation, the squared norm for gradient clipping, scaling,
// and AdamW (on the parameter itself, or on its fp32 master copy for a bf16 parameter).
#pragma once

#include <cstdint>

#include "common.h"
#include "storage.h"

namespace lfc::cpu {

// acc (n) += g (n)
template <typename Real>
void grad_accumulate(Real* acc, const Real* g, int64_t n);

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

// Pooled (core/thread_pool.h) in fixed blocks: grad_accumulate and adamw_step element by element
// in blocks of kElementGrain (the same bits as ref), sum_squares as one partial per block of
// 4·kElementGrain (8 interleaved double sums, in lane order), the partials summed in block order:
// the same bits at any thread count, within rounding of ref's single running sum.
namespace ref {
template <typename Real>
void grad_accumulate(Real* acc, const Real* g, int64_t n);
template <typename Real>
double sum_squares(const Real* x, int64_t n);
template <typename Real>
void adamw_step(Real* param, const Real* grad, Real* m, Real* v, int64_t n, const AdamWParams& hp,
                int64_t t);
}  // namespace ref

// ---- entry points by storage dtype (storage.h): each operand f32 or bf16, or all f64 -----------
// grad_accumulate: acc += g in f32, written in acc's dtype (a bf16 g into an f32 acc is the usual
// mixed case). sum_squares: any float dtype, summed in double.
void grad_accumulate(Dst acc, Src g, int64_t n);
double sum_squares(Src x, int64_t n);
// AdamW on the parameter itself. A bf16 param throws KernelError: its update would be lost to
// rounding, it needs an fp32 master (adamw_step_master).
void adamw_step(Dst param, Src grad, Dst m, Dst v, int64_t n, const AdamWParams& hp, int64_t t);
// Mixed precision (Megatron's fp32 master weights): the AdamW step runs on master (n, f32 in
// practice) with grad, m, v, then param (n, bf16 in practice) = master rounded to param's dtype.
void adamw_step_master(Dst param, Dst master, Src grad, Dst m, Dst v, int64_t n, const AdamWParams& hp, int64_t t);

}  // namespace lfc::cpu
