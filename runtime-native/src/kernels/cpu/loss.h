// Cross-entropy over the masked-in tokens, normalized by the loss tokens of the global batch.
#pragma once

#include <cstdint>

#include "common.h"

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

}  // namespace lfc::cpu
