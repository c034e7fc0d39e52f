// The sum/ tier: comm/sum.h's sumParts, the one way the collectives sum, against a plain loop
// that adds the parts left to right in the sum type and rounds once. Bits must match exactly
// (a reduce-scatter's block has the same bits whichever transport and path ran it): for every
// dtype the collectives sum, 1–7 parts, lengths around the staged block and the streaming size
// (comm/copy.h kStreamBytes, where f32 and f64 take the fused streamed path), outputs and parts
// off 16-byte alignment, and an output that is one of the parts (the all-reduce's in place).
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "check.h"
#include "comm/sum.h"

namespace {

using lfc::bf16;
using lfc::comm::sumParts;

// values in about ±1000 with all mantissa bits in use (so the order of additions shows in the
// bits), from a cheap generator: the cases fill some 100 MiB
template <typename T>
T randomValue(uint64_t& state) {
  state ^= state << 13;
  state ^= state >> 7;
  state ^= state << 17;
  const double u = double(state >> 11) / double(uint64_t(1) << 53) * 2e3 - 1e3;
  if constexpr (std::is_same_v<T, bf16>) return lfc::toBf16(float(u));
  else if constexpr (std::is_integral_v<T>) return T(int64_t(u * 1e4));
  else return T(u);
}

template <typename T>
void plainSum(T* out, const std::vector<const T*>& parts, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    if constexpr (std::is_same_v<T, bf16>) {
      float s = lfc::toFloat(parts[0][i]);
      for (size_t j = 1; j < parts.size(); j++) s += lfc::toFloat(parts[j][i]);
      out[i] = lfc::toBf16(s);
    } else {
      T s = parts[0][i];
      for (size_t j = 1; j < parts.size(); j++) s += parts[j][i];
      out[i] = s;
    }
  }
}

// one case: P parts of n elements, each and the output starting `skew` elements past a 64-byte
// line; inPlace: the output is part `P / 2`
template <typename T>
bool sameBits(int P, int64_t n, int skew, bool inPlace, uint64_t seed) {
  uint64_t rng = seed * 0x9e3779b97f4a7c15ull + 1;
  const int64_t stride = n + 64;  // room for the skew
  std::vector<T> store(size_t(stride) * size_t(P + 1) + 64);
  T* base = store.data() + (64 - reinterpret_cast<uintptr_t>(store.data()) % 64) / sizeof(T);
  std::vector<T*> parts;
  for (int j = 0; j < P; j++) {
    parts.push_back(base + int64_t(j) * stride + skew * (j + 1) % 5);
    for (int64_t i = 0; i < n; i++) parts.back()[i] = randomValue<T>(rng);
  }
  T* out = inPlace ? parts[size_t(P / 2)] : base + int64_t(P) * stride + skew;
  std::vector<const T*> in(parts.begin(), parts.end());
  std::vector<T> want(static_cast<size_t>(n));
  plainSum(want.data(), in, n);
  sumParts(out, in.data(), P, n);
  return std::memcmp(out, want.data(), size_t(n) * sizeof(T)) == 0;
}

template <typename T>
void sumChecks(const std::string& dtype) {
  const int64_t streamed = int64_t(lfc::comm::kStreamBytes / sizeof(T));
  for (int P : {1, 2, 3, 4, 5, 7}) {
    bool ok = true;
    for (int64_t n : {int64_t(0), int64_t(1), int64_t(15), int64_t(2048), int64_t(2049), int64_t(5000), streamed - 3,
                      streamed + 37})
      for (int skew : {0, 1})
        for (bool inPlace : {false, true}) ok = ok && sameBits<T>(P, n, skew, inPlace, uint64_t(P * 1000 + n + skew));
    report_bool("sum/" + dtype + " " + std::to_string(P) + " parts, bits of the plain sum", ok);
  }
}

}  // namespace

void sum_checks() {
  sumChecks<float>("f32");
  sumChecks<double>("f64");
  sumChecks<bf16>("bf16");
  sumChecks<int32_t>("i32");
  sumChecks<int64_t>("i64");
}
