// Visual rows into the text at placeholder positions (image embeddings, deepstack features).
#pragma once

#include <cstdint>

#include "common.h"
#include "storage.h"

namespace lfc::cpu {

enum class MergeMode { Replace, Add };

// y (T, H) = text (T, H), where the i-th position whose token equals placeholder takes
// (Replace) or adds (Add) visual (Nv, H) row i. Throws KernelError, before writing anything, if the
// number of placeholders in tokens (T) differs from Nv. y may be text (in place).
template <typename Real>
void merge_visual_forward(Real* y, const Real* text, const Real* visual, const int32_t* tokens,
                          int32_t placeholder, MergeMode mode, int64_t T, int64_t Nv, int64_t H);
// dtext (T, H) = dy, with 0 at the placeholder rows in Replace mode; dvisual (Nv, H) row i = dy at
// the i-th placeholder. Both OVERWRITTEN; dtext may be dy. Throws like the forward.
template <typename Real>
void merge_visual_backward(Real* dtext, Real* dvisual, const Real* dy, const int32_t* tokens,
                           int32_t placeholder, MergeMode mode, int64_t T, int64_t Nv, int64_t H);

// ---- entry points by storage dtype (storage.h): each operand f32 or bf16, or all f64 -----------
void merge_visual_forward(Dst y, Src text, Src visual, const int32_t* tokens, int32_t placeholder,
                          MergeMode mode, int64_t T, int64_t Nv, int64_t H);
void merge_visual_backward(Dst dtext, Dst dvisual, Src dy, const int32_t* tokens, int32_t placeholder,
                           MergeMode mode, int64_t T, int64_t Nv, int64_t H);

}  // namespace lfc::cpu
