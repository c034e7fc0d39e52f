// Run-time ISA dispatch and vectorizable math for the CPU kernels' inner loops.
//
// The library is built for x86-64-v2 (one build runs on every CI machine), so a plain loop gets
// SSE4.2 at most. A loop function marked LFC_ISA_CLONES is compiled three times, for x86-64-v4
// (AVX-512), x86-64-v3 (AVX2 + FMA) and the build's own target, and the dynamic loader picks the
// best one this CPU runs (GCC's target_clones, an ifunc resolved once at load). The clones may
// give different last bits from one another (FMA contracts a·b + c), never from one thread count
// to another: a clone is chosen per machine, not per call.
//
// exp_approx is e^x in float without a libm call, so that a loop over it vectorizes (the library
// is built with -fno-math-errno -fno-trapping-math, which the loops' if-conversion needs): Cody–
// Waite range reduction and Cephes' degree-6 polynomial, within 2 ulp of std::exp on the clamped
// range [−87.3, 88.4] (below: the smallest normal, about 1.2e-38, for e^x < 1.2e-38; above:
// 2.4e38, never inf, so 1 / (1 + e^x) stays finite).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define LFC_ISA_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define LFC_ISA_CLONES
#endif

namespace lfc::cpu::simd {

inline float exp_approx(float x) {
  x = x < -87.33654f ? -87.33654f : x;
  x = x > 88.37626f ? 88.37626f : x;
  const float n = __builtin_floorf(x * 1.44269504088896341f + 0.5f);  // round(x / ln 2)
  float r = x - n * 0.693359375f;  // x − n·ln 2 in two steps (ln 2 = 0.693359375 − 2.12194440e-4)
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;  // e^r on [−ln 2 / 2, ln 2 / 2]
  const int32_t bits = (int32_t(n) + 127) << 23;  // 2^n, n in [−126, 127]
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

}  // namespace lfc::cpu::simd
