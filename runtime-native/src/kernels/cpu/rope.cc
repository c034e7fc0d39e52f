#include "rope.h"

#include <cmath>
#include <vector>

#include "storage.h"

namespace lfc::cpu {

namespace {

// Rotates every (j, j + d/2) pair of every head by sign·angle; sign −1 is the backward.
template <typename Real>
void rope_rotate(const char* kernel, Real* y, const Real* x, const int32_t* positions,
                 const int32_t* sections, int64_t P, int64_t T, int64_t nh, int64_t d, double theta,
                 double sign, RopeLayout layout) {
  LFC_KERNEL_CHECK(d % 2 == 0, kernel, ": head dim ", d, " is odd");
  const int64_t half = d / 2;
  LFC_KERNEL_CHECK(P >= 1, kernel, ": needs at least one position section, got ", P);
  int64_t total = 0;
  for (int64_t s = 0; s < P; s++) {
    LFC_KERNEL_CHECK(sections[s] >= 0, kernel, ": sections[", s, "] = ", sections[s], " is negative");
    total += sections[s];
  }
  LFC_KERNEL_CHECK(total == half, kernel, ": sections sum to ", total, ", head dim/2 is ", half);

  ScratchScope scratch;
  double* inv_freq = scratch.take<double>(half);     // (d/2)
  int64_t* section_of = scratch.take<int64_t>(half);  // (d/2): which positions column rotates frequency j
  if (layout == RopeLayout::interleaved)
    LFC_KERNEL_CHECK(P == 3, kernel, ": interleaved M-RoPE takes 3 position columns (t, h, w), got ", P);
  for (int64_t j = 0, s = 0, start = 0, end = sections[0]; j < half; j++) {
    while (j >= end) {
      start = end;
      end += sections[++s];
    }
    switch (layout) {
      case RopeLayout::sectioned:
        inv_freq[j] = std::pow(theta, -2.0 * double(j) / double(d));
        section_of[j] = s;
        break;
      case RopeLayout::interleaved:
        inv_freq[j] = std::pow(theta, -2.0 * double(j) / double(d));
        section_of[j] = j % 3 == 1 && j < 3 * sections[1] ? 1 : j % 3 == 2 && j < 3 * sections[2] ? 2 : 0;
        break;
      case RopeLayout::per_axis:
        inv_freq[j] = std::pow(theta, -double(j - start) / double(sections[s]));
        section_of[j] = s;
        break;
    }
  }
  Real* cos_t = scratch.take<Real>(half);  // (d/2), for the current token
  Real* sin_t = scratch.take<Real>(half);  // (d/2)
  for (int64_t t = 0; t < T; t++) {
    const int32_t* pos = positions + t * P;  // (P)
    for (int64_t j = 0; j < half; j++) {
      const double angle = sign * double(pos[section_of[j]]) * inv_freq[j];
      cos_t[j] = Real(std::cos(angle));
      sin_t[j] = Real(std::sin(angle));
    }
    for (int64_t h = 0; h < nh; h++) {
      const Real* xh = x + (t * nh + h) * d;  // (d)
      Real* yh = y + (t * nh + h) * d;        // (d)
      for (int64_t j = 0; j < half; j++) {
        const Real a = xh[j], b = xh[j + half];
        yh[j] = a * cos_t[j] - b * sin_t[j];
        yh[j + half] = b * cos_t[j] + a * sin_t[j];
      }
    }
  }
}

}  // namespace

template <typename Real>
void rope_forward(Real* y, const Real* x, const int32_t* positions, const int32_t* sections, int64_t P,
                  int64_t T, int64_t nh, int64_t d, double theta, RopeLayout layout) {
  rope_rotate("rope_forward", y, x, positions, sections, P, T, nh, d, theta, +1.0, layout);
}

template <typename Real>
void rope_backward(Real* dx, const Real* dy, const int32_t* positions, const int32_t* sections,
                   int64_t P, int64_t T, int64_t nh, int64_t d, double theta, RopeLayout layout) {
  rope_rotate("rope_backward", dx, dy, positions, sections, P, T, nh, d, theta, -1.0, layout);
}

#define LFC_INSTANTIATE_ROPE(Real)                                                                \
  template void rope_forward<Real>(Real*, const Real*, const int32_t*, const int32_t*, int64_t,  \
                                   int64_t, int64_t, int64_t, double, RopeLayout);                \
  template void rope_backward<Real>(Real*, const Real*, const int32_t*, const int32_t*, int64_t, \
                                    int64_t, int64_t, int64_t, double, RopeLayout);
LFC_INSTANTIATE_ROPE(float)
LFC_INSTANTIATE_ROPE(double)

// ---- by storage dtype ---------------------------------------------------------------------------

void rope_forward(Dst y, Src x, const int32_t* positions, const int32_t* sections, int64_t P, int64_t T,
                  int64_t nh, int64_t d, double theta, RopeLayout layout) {
  const int64_t n = T * nh * d;
  by_dtype("rope_forward", {y, x}, [&](auto& s) {
    rope_forward(s.out(y, n), s.in(x, n), positions, sections, P, T, nh, d, theta, layout);
  });
}

void rope_backward(Dst dx, Src dy, const int32_t* positions, const int32_t* sections, int64_t P, int64_t T,
                   int64_t nh, int64_t d, double theta, RopeLayout layout) {
  const int64_t n = T * nh * d;
  by_dtype("rope_backward", {dx, dy}, [&](auto& s) {
    rope_backward(s.out(dx, n), s.in(dy, n), positions, sections, P, T, nh, d, theta, layout);
  });
}

}  // namespace lfc::cpu
