// bfloat16 storage: the top 16 bits of an IEEE float (1 sign, 8 exponent, 7 mantissa bits).
//
// float → bf16 rounds to nearest, ties to even, on the bits (so denormals round like any other
// value and a value past the largest bf16 rounds to ±inf); a NaN stays a NaN, made quiet (the
// mantissa's top bit set), with its sign. bf16 → float is exact (16 zero bits appended). This is
// what torch's `tensor.to(torch.bfloat16)` and the avx512_bf16 `vcvtneps2bf16` instruction do.
//
// bf16 is a storage type only: nothing computes in it. The kernels load bf16 operands into f32,
// compute in f32 and round each result once when they store it (kernels/cpu/storage.h).
#pragma once

#include <cstdint>
#include <cstring>

namespace lfc {

struct bf16 {
  uint16_t bits = 0;
};
static_assert(sizeof(bf16) == 2, "bf16 is two bytes");

inline uint32_t floatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float floatOfBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Round to nearest even; NaN → quiet NaN of the same sign.
inline bf16 toBf16(float f) {
  const uint32_t u = floatBits(f);
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  // adding 0x7fff (+1 when the kept part is odd) carries into bit 16 exactly when the dropped
  // half is above one half ulp, or equal to it with an odd kept part
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet = (u >> 16) | 0x0040u;
  return bf16{uint16_t(nan ? quiet : rounded)};
}

inline float toFloat(bf16 h) { return floatOfBits(uint32_t(h.bits) << 16); }

// Bulk conversions over n values (plain loops: the compiler vectorizes both).
inline void bf16FromFloat(bf16* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = toBf16(x[i]);
}

inline void floatFromBf16(float* y, const bf16* x, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = toFloat(x[i]);
}

}  // namespace lfc
