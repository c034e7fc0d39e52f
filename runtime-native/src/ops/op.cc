#include "ops/op.h"

#include <cmath>
#include <cstring>

#include "core/bf16.h"

namespace lfc {

namespace {
const nlohmann::json& attr(const Instr& in, const char* name) {
  auto it = in.attrs.find(name);
  if (it == in.attrs.end()) throw OpError(cat("missing attribute '", name, "'"));
  return *it;
}
}  // namespace

double StepCtx::num(const char* name) const { return attr(instr_, name).get<double>(); }

double StepCtx::num(const char* name, double fallback) const {
  return instr_.attrs.contains(name) ? num(name) : fallback;
}

int64_t StepCtx::integer(const char* name) const {
  return int64_t(std::llround(attr(instr_, name).get<double>()));
}

bool StepCtx::flag(const char* name) const { return attr(instr_, name).get<bool>(); }

std::string StepCtx::str(const char* name) const { return attr(instr_, name).get<std::string>(); }

bool StepCtx::has(const char* name) const { return instr_.attrs.contains(name); }

std::vector<int64_t> StepCtx::ints(const char* name) const {
  std::vector<int64_t> out;
  for (const auto& v : attr(instr_, name)) out.push_back(int64_t(std::llround(v.get<double>())));
  return out;
}

std::vector<double> StepCtx::numbers(const char* name) const {
  std::vector<double> out;
  for (const auto& v : attr(instr_, name)) out.push_back(v.get<double>());
  return out;
}

void requireDType(const Tensor& t, DType want, const char* what) {
  if (t.dtype != want)
    throw OpError(cat(what, " has dtype ", dtypeName(t.dtype), ", expected ", dtypeName(want)));
}

void requireFloat(const Tensor& t, const char* what) {
  if (t.dtype != DType::f32 && t.dtype != DType::bf16 && t.dtype != DType::f64)
    throw OpError(cat(what, " has dtype ", dtypeName(t.dtype), "; the CPU kernels take f32, bf16 or f64"));
}

void requireFloat(const Tensor& t, int64_t n, const char* what) {
  requireFloat(t, what);
  requireNumel(t, n, what);
}

void requireNumel(const Tensor& t, int64_t want, const char* what) {
  if (t.numel != want)
    throw OpError(cat(what, " ", formatShape(t.shape), " holds ", t.numel, " elements, expected ", want));
}

void requireRank(const Tensor& t, int rank, const char* what) {
  if (t.rank() != rank)
    throw OpError(cat(what, " ", formatShape(t.shape), " must have rank ", rank));
}

double scalarValue(const Tensor& t, const char* what) {
  if (t.numel != 1) throw OpError(cat(what, " ", formatShape(t.shape), " must be a scalar"));
  switch (t.dtype) {
    case DType::f32: return *t.as<float>();
    case DType::f64: return *t.as<double>();
    case DType::bf16: return toFloat(*t.as<bf16>());
    case DType::i32: return *t.as<int32_t>();
    case DType::i64: return double(*t.as<int64_t>());
    case DType::u8: return *t.as<uint8_t>();
    default: throw OpError(cat(what, " has dtype ", dtypeName(t.dtype), ", which this runtime cannot read"));
  }
}

void setScalarValue(const Tensor& t, double v, const char* what) {
  if (t.numel != 1) throw OpError(cat(what, " ", formatShape(t.shape), " must be a scalar"));
  switch (t.dtype) {
    case DType::f32: *t.as<float>() = float(v); return;
    case DType::f64: *t.as<double>() = v; return;
    case DType::bf16: *t.as<bf16>() = toBf16(float(v)); return;
    default: throw OpError(cat(what, " has dtype ", dtypeName(t.dtype), "; a scalar result is f32, bf16 or f64"));
  }
}

void zero(const Tensor& t) {
  if (t.numel > 0) std::memset(t.data, 0, size_t(t.bytes()));
}

}  // namespace lfc
