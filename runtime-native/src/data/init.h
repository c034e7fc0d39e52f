// Parameter initialization: a pure function of (seed, parameter name, global element index), so
// that a shard initializes exactly its slice of the global tensor on any layout.
//
// Init strings (PlanParam.init): `normal(std)` (mean 0), `zeros`, `ones`.
// Element g of parameter `name` under `normal(std)` is std · z, z the Box–Muller normal of words
// 2g and 2g+1 of the counter-hash stream keyed by combine(combine(tag, seed), hash(name)).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"

namespace lfc {

// Fills dst (the shard, row-major, dtype f32, bf16 or f64) with its slice of the global tensor; a
// bf16 element is the f32 value rounded to nearest even.
// shard: per dim [start, length] (empty: the whole tensor). Throws RuntimeError naming the
// parameter on a bad init string, a shard outside the global shape or an unsupported dtype.
void initParam(std::byte* dst, DType dtype, uint64_t seed, const std::string& name,
               const std::string& init, const std::vector<int64_t>& globalShape,
               const std::vector<std::pair<int64_t, int64_t>>& shard);

// The same for any piece of the global tensor: index[d][i] is the global index of local index i
// along dim d (a split over ranks with several blocks takes one range per block).
void initParamAt(std::byte* dst, DType dtype, uint64_t seed, const std::string& name,
                 const std::string& init, const std::vector<int64_t>& globalShape,
                 const std::vector<std::vector<int64_t>>& index);

}  // namespace lfc
