#include "ops/basic_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace lfc::basic {

void split_last(void* const* parts, const void* x, const int64_t* widths, int64_t P, int64_t R, int64_t es) {
  int64_t total = 0;
  for (int64_t p = 0; p < P; p++) total += widths[p];
  const auto* src = static_cast<const char*>(x);
  for (int64_t r = 0; r < R; r++) {
    int64_t col = 0;
    for (int64_t p = 0; p < P; p++) {
      std::memcpy(static_cast<char*>(parts[p]) + r * widths[p] * es, src + (r * total + col) * es,
                  size_t(widths[p] * es));
      col += widths[p];
    }
  }
}

void concat_last(void* y, const void* const* parts, const int64_t* widths, int64_t P, int64_t R, int64_t es) {
  int64_t total = 0;
  for (int64_t p = 0; p < P; p++) total += widths[p];
  auto* dst = static_cast<char*>(y);
  for (int64_t r = 0; r < R; r++) {
    int64_t col = 0;
    for (int64_t p = 0; p < P; p++) {
      std::memcpy(dst + (r * total + col) * es, static_cast<const char*>(parts[p]) + r * widths[p] * es,
                  size_t(widths[p] * es));
      col += widths[p];
    }
  }
}

double clip_coef(double sumsq, double max_norm) {
  return std::min(1.0, max_norm / (std::sqrt(sumsq) + 1e-6));
}

}  // namespace lfc::basic
