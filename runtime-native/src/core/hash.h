// Counter-based hashing: every random number of the runtime (parameter init, synthetic data) is
// a pure function of a key and a counter, never of a generator's hidden state, so any slice of a
// tensor or any microbatch can be computed alone, in any order, on any rank.
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

namespace lfc::hash {

constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ull;

// splitmix64's finalizer applied to x + γ: a bijective, well-mixed map of 64-bit words.
constexpr uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + kGamma;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// FNV-1a over the bytes of s, then mixed.
constexpr uint64_t ofString(std::string_view s) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (char c : s) {
    h ^= uint8_t(c);
    h *= 0x100000001B3ull;
  }
  return splitmix64(h);
}

// A key derived from a parent key and one more value (order matters).
constexpr uint64_t combine(uint64_t key, uint64_t value) { return splitmix64(key ^ splitmix64(value)); }

// The counter-th 64-bit word of the stream named by key.
constexpr uint64_t at(uint64_t key, uint64_t counter) { return splitmix64(key + counter * kGamma); }

// Uniform in [0, 1) with 53 bits, from one word.
inline double unit(uint64_t word) { return double(word >> 11) * 0x1.0p-53; }

// Standard normal from words counter·2 and counter·2 + 1 of the stream (Box–Muller, cosine branch).
inline double normal(uint64_t key, uint64_t counter) {
  const double u1 = double((at(key, 2 * counter) >> 11) + 1) * 0x1.0p-53;  // (0, 1]
  const double u2 = unit(at(key, 2 * counter + 1));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

// A sequential reader of one stream: draw i is at(key, i). Copyable, no hidden global state.
struct Stream {
  uint64_t key;
  uint64_t counter = 0;
  uint64_t next() { return at(key, counter++); }
  // Uniform integer in [0, n), n ≥ 1 (the modulo bias is below 2⁻⁵⁰ for the small n used here).
  int64_t below(int64_t n) { return int64_t(next() % uint64_t(n)); }
};

}  // namespace lfc::hash
