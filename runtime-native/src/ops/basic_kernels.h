// Small kernels the ops need beyond the CPU kernel library (kernels/cpu/): layout moves along the
// last dim, the block of a rank, fill, and the clipping factor. Same conventions as kernels/cpu/common.h:
// raw row-major pointers, outputs first, then inputs, then sizes.
#pragma once

#include <cstdint>
#include <cstring>

namespace lfc::basic {

// parts[p] (R, widths[p]) = x (R, Σ widths)[:, offset_p : offset_p + widths[p]]; element size es bytes.
void split_last(void* const* parts, const void* x, const int64_t* widths, int64_t P, int64_t R, int64_t es);
// y (R, Σ widths) = the parts (R, widths[p]) side by side.
void concat_last(void* y, const void* const* parts, const int64_t* widths, int64_t P, int64_t R, int64_t es);

// y = block `index` of x, whose blocks are blockBytes bytes each (group_slice keeps block r of
// dim 0, r = this rank's index in the group).
inline void take_block(void* y, const void* x, int64_t blockBytes, int64_t index) {
  std::memcpy(y, static_cast<const char*>(x) + index * blockBytes, size_t(blockBytes));
}

template <typename T>
void fill(T* y, T value, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = value;
}

// min(1, max_norm / (√sumsq + 1e-6)): torch.nn.utils.clip_grad_norm_'s clamped coefficient.
double clip_coef(double sumsq, double max_norm);

}  // namespace lfc::basic
