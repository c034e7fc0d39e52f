// The one way the collectives sum: P parts element by element, in group order (part 0, then 1, …),
// in T itself, or in f32 for bf16 (widened on load, rounded to nearest even once, when the sum is
// stored). The shared-memory all-reduce and reduce-scatter and the TCP reduce-scatter all sum
// through sumParts, so a reduce-scatter's block has the same bits whichever transport ran it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "comm/copy.h"
#include "core/bf16.h"

namespace lfc::comm {

template <typename T>
struct SumOf {
  using type = T;
};
template <>
struct SumOf<bf16> {
  using type = float;
};

template <typename T>
inline T widen(T v) {
  return v;
}
inline float widen(bf16 v) { return toFloat(v); }

// out[0:m] ← sum[0:m] as T; streamed (comm/copy.h) when `stream`
template <typename T>
inline void storeSum(T* out, const T* sum, int64_t m, bool stream) {
  if (stream)
    streamStores(out, sum, size_t(m) * sizeof(T));
  else
    std::memcpy(out, sum, size_t(m) * sizeof(T));
}
inline void storeSum(bf16* out, const float* sum, int64_t m, bool stream) {
  if (!stream) return bf16FromFloat(out, sum, m);
  alignas(64) bf16 rounded[2048];
  for (int64_t at = 0; at < m; at += 2048) {
    const int64_t k = std::min<int64_t>(2048, m - at);
    bf16FromFloat(rounded, sum + at, k);
    streamStores(out + at, rounded, size_t(k) * sizeof(bf16));
  }
}

// out[0:n] ← parts[0][i] + parts[1][i] + … + parts[P−1][i], left to right. out may be one of the
// parts (each block of kBlock elements is read whole before it is written). A pass over the block
// adds up to four parts (the first) or three more (the others) to its running sum, so a group of
// up to four ranks sums in one pass; the order of the additions is the same either way. An output
// of kStreamBytes or more apart from every part (a reduce-scatter's block) is written with
// non-temporal stores, which skip reading each line before writing it; one that is a part was
// just read, and is written in place.
template <typename T>
void sumParts(T* out, const T* const* parts, int P, int64_t n) {
  using Sum = typename SumOf<T>::type;
  constexpr int64_t kBlock = 2048;
  alignas(64) Sum acc[kBlock];
  bool stream = int64_t(sizeof(T)) * n >= int64_t(kStreamBytes);
  for (int j = 0; j < P && stream; j++) stream = parts[j] != out;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t m = std::min(kBlock, n - b);
    const T* p[4] = {};
    const int first = std::min(P, 4);
    for (int j = 0; j < first; j++) p[j] = parts[j] + b;
    switch (first) {
      case 1:
        for (int64_t i = 0; i < m; i++) acc[i] = widen(p[0][i]);
        break;
      case 2:
        for (int64_t i = 0; i < m; i++) acc[i] = widen(p[0][i]) + widen(p[1][i]);
        break;
      case 3:
        for (int64_t i = 0; i < m; i++) acc[i] = widen(p[0][i]) + widen(p[1][i]) + widen(p[2][i]);
        break;
      default:
        for (int64_t i = 0; i < m; i++)
          acc[i] = widen(p[0][i]) + widen(p[1][i]) + widen(p[2][i]) + widen(p[3][i]);
    }
    for (int j = first; j < P;) {
      const int k = std::min(P - j, 3);
      for (int q = 0; q < k; q++) p[q] = parts[j + q] + b;
      switch (k) {
        case 1:
          for (int64_t i = 0; i < m; i++) acc[i] += widen(p[0][i]);
          break;
        case 2:
          for (int64_t i = 0; i < m; i++) acc[i] = acc[i] + widen(p[0][i]) + widen(p[1][i]);
          break;
        default:
          for (int64_t i = 0; i < m; i++) acc[i] = acc[i] + widen(p[0][i]) + widen(p[1][i]) + widen(p[2][i]);
      }
      j += k;
    }
    storeSum(out + b, acc, m, stream);
  }
  if (stream) streamFence();
}

}  // namespace lfc::comm
