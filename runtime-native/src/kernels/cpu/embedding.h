// Token embedding: rows of a table at integer ids.
#pragma once

#include <cstdint>

#include "common.h"

namespace lfc::cpu {

// y (T, H) = table (V, H) [ids (T)]. Throws KernelError if an id is outside [0, V).
template <typename Real>
void embedding_forward(Real* y, const int32_t* ids, const Real* table, int64_t T, int64_t V, int64_t H);
// dtable (V, H) [ids[t]] += dy (T, H) [t]: ACCUMULATES (repeated ids sum).
template <typename Real>
void embedding_backward(Real* dtable, const Real* dy, const int32_t* ids, int64_t T, int64_t V, int64_t H);

}  // namespace lfc::cpu
