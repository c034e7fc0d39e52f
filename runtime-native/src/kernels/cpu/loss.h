// Cross-entropy over the masked-in tokens, normalized by the loss tokens of the global batch.
#pragma once

#include <cstdint>

#include "common.h"
#include "storage.h"

namespace lfc::cpu {

// Returns Σ_{t: mask[t]} (logsumexp(logits[t]) − logits[t, labels[t]]) / loss_tokens, accumulated
// in double. logits (T, V), labels (T), mask (T) (0 or not), loss_tokens > 0 (the count of the whole
// global batch; 0 throws KernelError, since a global batch with no loss token is an error). Saves
// lse (T): the log-sum-exp of masked-in rows, 0 on the others. A masked-in label outside [0, V)
// throws; labels of masked-out rows are not read.
template <typename Real>
Real cross_entropy_forward(Real* lse, const Real* logits, const int32_t* labels, const uint8_t* mask,
                           double loss_tokens, int64_t T, int64_t V);
// dlogits (T, V) OVERWRITTEN: (g / loss_tokens) · (softmax(logits[t]) − onehot(labels[t])) on
// masked-in rows, 0 elsewhere; g is the upstream gradient of the scalar loss.
template <typename Real>
void cross_entropy_backward(Real* dlogits, Real g, const Real* logits, const Real* lse,
                            const int32_t* labels, const uint8_t* mask, double loss_tokens, int64_t T,
                            int64_t V);

// Pooled over fixed blocks of rows (core/thread_pool.h), ref's bits at any thread count: the rows'
// loss terms are summed in row order on the calling thread. ref: the one-thread loop.
namespace ref {
template <typename Real>
Real cross_entropy_forward(Real* lse, const Real* logits, const int32_t* labels, const uint8_t* mask,
                           double loss_tokens, int64_t T, int64_t V);
template <typename Real>
void cross_entropy_backward(Real* dlogits, Real g, const Real* logits, const Real* lse,
                            const int32_t* labels, const uint8_t* mask, double loss_tokens, int64_t T,
                            int64_t V);
}  // namespace ref

// ---- vocab-parallel cross-entropy: cross_entropy over a vocabulary split in column blocks --------
// A rank holds logits (T, V) = columns [first, first + V) of a vocabulary of `vocab` ids. With the
// per-rank lse gathered into (P, T) and the target logits summed over the ranks:
//   ce_from_stats(lse_combine(lse_p), Σ_p target_p, mask) = cross_entropy over the whole vocabulary.
// Every log-sum-exp is shifted by its max and summed in double, as cross_entropy_forward does, so
// on one rank (P = 1) the composition gives cross_entropy's value and gradient bit for bit.
// vocab_logsumexp's forward and backward are pooled over fixed blocks of rows (rows independent).

// lse (T) = log Σ_v exp(logits (T, V)[t, v]), every row (no mask).
template <typename Real>
void vocab_logsumexp_forward(Real* lse, const Real* logits, int64_t T, int64_t V);
// dlogits (T, V) OVERWRITTEN = dy (T)[t] · exp(logits[t, v] − lse (T)[t]).
template <typename Real>
void vocab_logsumexp_backward(Real* dlogits, const Real* dy, const Real* logits, const Real* lse, int64_t T,
                              int64_t V);

// y (T) = log Σ_p exp(x (P, T)[p, t]).
template <typename Real>
void lse_combine_forward(Real* y, const Real* x, int64_t P, int64_t T);
// dx (P, T) OVERWRITTEN = dy (T)[t] · exp(x[p, t] − y (T)[t]).
template <typename Real>
void lse_combine_backward(Real* dx, const Real* dy, const Real* x, const Real* y, int64_t P, int64_t T);

// target (T) = logits (T, V)[t, labels[t] − first] where first ≤ labels[t] < first + V, else 0.
// mask (T) may be null. With a mask, rows with mask 0 give 0 (their labels are not read) and a
// masked-in label outside [0, vocab) throws KernelError, as in cross_entropy_forward.
template <typename Real>
void vocab_target_logit_forward(Real* target, const Real* logits, const int32_t* labels, const uint8_t* mask,
                                int64_t T, int64_t V, int64_t first, int64_t vocab);
// dlogits (T, V) OVERWRITTEN: dy (T)[t] at (t, labels[t] − first) on the rows the forward read a
// logit for, 0 elsewhere.
template <typename Real>
void vocab_target_logit_backward(Real* dlogits, const Real* dy, const int32_t* labels, const uint8_t* mask,
                                 int64_t T, int64_t V, int64_t first, int64_t vocab);

// Returns Σ_{t: mask[t]} (lse[t] − target[t]) / loss_tokens, accumulated in double. lse, target (T).
// loss_tokens 0 throws KernelError (a global batch with no loss token).
template <typename Real>
Real ce_from_stats_forward(const Real* lse, const Real* target, const uint8_t* mask, double loss_tokens,
                           int64_t T);
// dlse (T) = (g / loss_tokens)·[mask[t]], dtarget (T) = −dlse; both OVERWRITTEN.
template <typename Real>
void ce_from_stats_backward(Real* dlse, Real* dtarget, Real g, const uint8_t* mask, double loss_tokens,
                            int64_t T);

// ---- entry points by storage dtype (storage.h): each operand f32 or bf16, or all f64 -----------
// The log-sum-exps (lse, y of lse_combine) are f32 (f64 on the f64 path) in mixed precision plans;
// the returned losses are summed in double as the cores do.
double cross_entropy_forward(Dst lse, Src logits, const int32_t* labels, const uint8_t* mask, double loss_tokens,
                             int64_t T, int64_t V);
void cross_entropy_backward(Dst dlogits, double g, Src logits, Src lse, const int32_t* labels, const uint8_t* mask,
                            double loss_tokens, int64_t T, int64_t V);
void vocab_logsumexp_forward(Dst lse, Src logits, int64_t T, int64_t V);
void vocab_logsumexp_backward(Dst dlogits, Src dy, Src logits, Src lse, int64_t T, int64_t V);
void lse_combine_forward(Dst y, Src x, int64_t P, int64_t T);
void lse_combine_backward(Dst dx, Src dy, Src x, Src y, int64_t P, int64_t T);
void vocab_target_logit_forward(Dst target, Src logits, const int32_t* labels, const uint8_t* mask, int64_t T,
                                int64_t V, int64_t first, int64_t vocab);
void vocab_target_logit_backward(Dst dlogits, Src dy, const int32_t* labels, const uint8_t* mask, int64_t T,
                                 int64_t V, int64_t first, int64_t vocab);
double ce_from_stats_forward(Src lse, Src target, const uint8_t* mask, double loss_tokens, int64_t T);
void ce_from_stats_backward(Dst dlse, Dst dtarget, double g, const uint8_t* mask, double loss_tokens, int64_t T);

}  // namespace lfc::cpu
