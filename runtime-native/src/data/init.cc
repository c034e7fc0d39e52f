#include "data/init.h"

#include <cctype>
#include <cstdlib>
#include <type_traits>

#include "core/bf16.h"
#include "core/error.h"
#include "core/hash.h"
#include "core/shape.h"

namespace lfc {

namespace {

constexpr uint64_t kInitTag = 0x696E6974ull;  // "init"

struct InitSpec {
  enum Kind { normal, zeros, ones } kind = zeros;
  double std = 0;
};

InitSpec parseInit(const std::string& name, const std::string& raw) {
  std::string init;
  for (char c : raw)
    if (!std::isspace(static_cast<unsigned char>(c))) init += c;
  if (init == "zeros") return {InitSpec::zeros, 0};
  if (init == "ones") return {InitSpec::ones, 0};
  const std::string open = "normal(";
  if (init.size() > open.size() + 1 && init.compare(0, open.size(), open) == 0 && init.back() == ')') {
    const std::string text = init.substr(open.size(), init.size() - open.size() - 1);
    char* end = nullptr;
    const double s = std::strtod(text.c_str(), &end);
    if (end == text.c_str() + text.size() && s >= 0) return {InitSpec::normal, s};
  }
  throw RuntimeError(cat("param ", name, ": unknown init '", raw,
                         "' (this runtime knows normal(std), zeros, ones)"));
}

// An element of Real from the f32 or f64 value v: a bf16 element is the f32 value rounded to
// nearest even, so a bf16 parameter starts as its f32 twin rounded.
template <typename Real>
Real element(double v) {
  if constexpr (std::is_same_v<Real, bf16>) return toBf16(float(v));
  else return Real(v);
}

template <typename Real>
void fill(Real* dst, const InitSpec& spec, uint64_t key, const std::vector<int64_t>& shape,
          const std::vector<std::vector<int64_t>>& index) {
  const size_t rank = shape.size();
  std::vector<int64_t> stride(rank, 1);  // global strides
  for (size_t d = rank; d-- > 1;) stride[d - 1] = stride[d] * shape[d];
  int64_t n = 1;
  for (const auto& ix : index) n *= int64_t(ix.size());
  std::vector<size_t> idx(rank, 0);  // local multi-index
  for (int64_t i = 0; i < n; i++) {
    if (spec.kind == InitSpec::zeros) dst[i] = element<Real>(0);
    else if (spec.kind == InitSpec::ones) dst[i] = element<Real>(1);
    else {
      int64_t g = 0;
      for (size_t d = 0; d < rank; d++) g += index[d][idx[d]] * stride[d];
      dst[i] = element<Real>(spec.std * hash::normal(key, uint64_t(g)));
    }
    for (size_t d = rank; d-- > 0;) {  // next local index, row-major
      if (++idx[d] < index[d].size()) break;
      idx[d] = 0;
    }
  }
}

}  // namespace

void initParamAt(std::byte* dst, DType dtype, uint64_t seed, const std::string& name,
                 const std::string& init, const std::vector<int64_t>& globalShape,
                 const std::vector<std::vector<int64_t>>& index) {
  const InitSpec spec = parseInit(name, init);
  if (index.size() != globalShape.size())
    throw RuntimeError(cat("param ", name, ": the piece has ", index.size(), " dims, the global shape ",
                           globalShape.size()));
  for (size_t d = 0; d < index.size(); d++)
    for (int64_t g : index[d])
      if (g < 0 || g >= globalShape[d])
        throw RuntimeError(cat("param ", name, ": index ", g, " of dim ", d, " is outside the global size ",
                               globalShape[d]));
  // the global element index of every value must fit: a plan's shape may claim any size
  int64_t elements = 1;
  for (int64_t d : globalShape)
    if (d < 0 || __builtin_mul_overflow(elements, d, &elements))
      throw RuntimeError(cat("param ", name, ": the global shape ", formatShape(globalShape),
                             " is negative or has more than 2^63 elements"));
  const uint64_t key = hash::combine(hash::combine(hash::splitmix64(kInitTag), seed), hash::ofString(name));
  if (dtype == DType::f32) fill(reinterpret_cast<float*>(dst), spec, key, globalShape, index);
  else if (dtype == DType::f64) fill(reinterpret_cast<double*>(dst), spec, key, globalShape, index);
  else if (dtype == DType::bf16) fill(reinterpret_cast<bf16*>(dst), spec, key, globalShape, index);
  else
    throw RuntimeError(cat("param ", name, ": dtype ", dtypeName(dtype),
                           " cannot be initialized here (f32, bf16 or f64)"));
}

void initParam(std::byte* dst, DType dtype, uint64_t seed, const std::string& name,
               const std::string& init, const std::vector<int64_t>& globalShape,
               const std::vector<std::pair<int64_t, int64_t>>& shardIn) {
  std::vector<std::pair<int64_t, int64_t>> shard = shardIn;
  if (shard.empty())
    for (int64_t d : globalShape) shard.emplace_back(0, d);
  if (shard.size() != globalShape.size())
    throw RuntimeError(cat("param ", name, ": shard has ", shard.size(), " dims, the global shape ",
                           globalShape.size()));
  std::vector<std::vector<int64_t>> index;
  for (size_t d = 0; d < shard.size(); d++) {
    if (shard[d].first < 0 || shard[d].second < 0 || shard[d].second > globalShape[d] ||
        shard[d].first > globalShape[d] - shard[d].second)  // (no overflow: start + length may not fit)
      throw RuntimeError(cat("param ", name, ": shard [", shard[d].first, ", ", shard[d].second,
                             "] of dim ", d, " is outside the global size ", globalShape[d]));
    index.emplace_back();
    for (int64_t i = 0; i < shard[d].second; i++) index.back().push_back(shard[d].first + i);
  }
  initParamAt(dst, dtype, seed, name, init, globalShape, index);
}

}  // namespace lfc
