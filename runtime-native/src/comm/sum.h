// The one way the collectives sum: P parts element by element, in group order (part 0, then 1, …),
// in T itself, or in f32 for bf16 (widened on load, rounded to nearest even once, when the sum is
// stored). The shared-memory all-reduce and reduce-scatter and the TCP reduce-scatter all sum
// through sumParts, so a reduce-scatter's block has the same bits whichever transport ran it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

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

#if defined(__x86_64__)
// The sum of f32 or f64 parts, fused: each 64-byte line of out is summed in registers, part by part
// in group order, and stored, with no block staged in between; with non-temporal stores where the
// output streams. An output that is one of the parts is safe: a line's loads all come before its
// stores. On the 2-core EPYC, two threads at once each summing two 32 MiB f32 parts (a scratch
// benchmark, medians of 15, alternated), a fused loop of this form took 2.8–3.0 ms into a third
// array with non-temporal stores, against 3.6–3.9 through the staged block, and 1.51–1.64 ms in
// place against 1.67–1.99; sumParts with this path then matched that loop in place. AVX2 and
// AVX-512 loops were no faster than these SSE2 ones, the sum being bound by memory. The additions
// are the same IEEE operations in the same order as the staged path's, so the bits are too. Only
// for one or two parts: over four, each line reads four streams (three of them peers' mappings)
// 64 bytes at a time, and bench/collectives on 4 ranks (2 cores) took 7.7–8.5 ms for a 64 MiB
// reduce_scatter this way against 6.0–6.6 through the block, which reads 8 KiB of each at a time
// (four runs of each, alternated); on 2 ranks 2.9–3.5 against 3.1–3.4, all_reduce 4.9–5.9 against
// 5.1–5.4.
template <typename T, typename V, int kLanes, V (*load)(const T*), V (*add)(V, V), void (*store)(T*, V)>
inline void sumFused(T* out, const T* const* parts, int P, int64_t n) {
  constexpr int64_t kLine = 4 * kLanes;  // elements of a 64-byte line
  const auto one = [&](int64_t i) {
    T s = parts[0][i];
    for (int j = 1; j < P; j++) s += parts[j][i];
    out[i] = s;
  };
  int64_t i = 0;
  for (; i < n && reinterpret_cast<uintptr_t>(out + i) % 16 != 0; i++) one(i);
  for (; i + kLine <= n; i += kLine) {
    const T* p = parts[0] + i;
    V s0 = load(p), s1 = load(p + kLanes), s2 = load(p + 2 * kLanes), s3 = load(p + 3 * kLanes);
    for (int j = 1; j < P; j++) {
      p = parts[j] + i;
      s0 = add(s0, load(p));
      s1 = add(s1, load(p + kLanes));
      s2 = add(s2, load(p + 2 * kLanes));
      s3 = add(s3, load(p + 3 * kLanes));
    }
    store(out + i, s0);
    store(out + i + kLanes, s1);
    store(out + i + 2 * kLanes, s2);
    store(out + i + 3 * kLanes, s3);
  }
  for (; i < n; i++) one(i);
}
inline __m128 loadF32(const float* p) { return _mm_loadu_ps(p); }
inline __m128 addF32(__m128 a, __m128 b) { return _mm_add_ps(a, b); }
inline void storeF32(float* p, __m128 v) { _mm_store_ps(p, v); }
inline void streamF32(float* p, __m128 v) { _mm_stream_ps(p, v); }
inline __m128d loadF64(const double* p) { return _mm_loadu_pd(p); }
inline __m128d addF64(__m128d a, __m128d b) { return _mm_add_pd(a, b); }
inline void storeF64(double* p, __m128d v) { _mm_store_pd(p, v); }
inline void streamF64(double* p, __m128d v) { _mm_stream_pd(p, v); }

// whether sumParts has the fused path for T (and then takes it for P ≤ 2)
template <typename T>
constexpr bool kFused = std::is_same_v<T, float> || std::is_same_v<T, double>;
template <typename T>
inline void sumFusedOf(T* out, const T* const* parts, int P, int64_t n, bool stream) {
  if constexpr (std::is_same_v<T, float>) {
    if (stream) sumFused<float, __m128, 4, loadF32, addF32, streamF32>(out, parts, P, n);
    else sumFused<float, __m128, 4, loadF32, addF32, storeF32>(out, parts, P, n);
  } else if constexpr (std::is_same_v<T, double>) {
    if (stream) sumFused<double, __m128d, 2, loadF64, addF64, streamF64>(out, parts, P, n);
    else sumFused<double, __m128d, 2, loadF64, addF64, storeF64>(out, parts, P, n);
  }
}
#else
template <typename T>
constexpr bool kFused = false;
template <typename T>
inline void sumFusedOf(T*, const T* const*, int, int64_t, bool) {}
#endif

// out[0:n] ← parts[0][i] + parts[1][i] + … + parts[P−1][i], left to right. out may be one of the
// parts (each block of kBlock elements is read whole before it is written). A pass over the block
// adds up to four parts (the first) or three more (the others) to its running sum, so a group of
// up to four ranks sums in one pass; the order of the additions is the same either way. An output
// of kStreamBytes or more apart from every part (a reduce-scatter's block) is written with
// non-temporal stores, which skip reading each line before writing it; one that is a part was
// just read, and is written in place. f32 and f64 over one or two parts take the fused path above.
template <typename T>
void sumParts(T* out, const T* const* parts, int P, int64_t n) {
  using Sum = typename SumOf<T>::type;
  constexpr int64_t kBlock = 2048;
  bool stream = int64_t(sizeof(T)) * n >= int64_t(kStreamBytes);
  for (int j = 0; j < P && stream; j++) stream = parts[j] != out;
  if (kFused<T> && P <= 2) {
    sumFusedOf(out, parts, P, n, stream);
    if (stream) streamFence();
    return;
  }
  alignas(64) Sum acc[kBlock];
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
