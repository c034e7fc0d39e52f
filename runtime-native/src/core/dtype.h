// Element types of plan buffers (ir/dtype.ts: DTYPES, DTYPE_BYTES), in the same order.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace lfc {

enum class DType : int { f32, f64, bf16, f16, i32, i64, u8, kCount };

inline constexpr const char* kDTypeNames[] = {"f32", "f64", "bf16", "f16", "i32", "i64", "u8"};
inline constexpr int64_t kDTypeBytes[] = {4, 8, 2, 2, 4, 8, 1};
static_assert(sizeof(kDTypeNames) / sizeof(kDTypeNames[0]) == int(DType::kCount));
static_assert(sizeof(kDTypeBytes) / sizeof(kDTypeBytes[0]) == int(DType::kCount));

inline const char* dtypeName(DType t) { return kDTypeNames[int(t)]; }
inline int64_t dtypeBytes(DType t) { return kDTypeBytes[int(t)]; }

inline std::optional<DType> parseDType(std::string_view s) {
  for (int i = 0; i < int(DType::kCount); i++)
    if (s == kDTypeNames[i]) return DType(i);
  return std::nullopt;
}

}  // namespace lfc
