// Layout ops (reshape, split, concat, constant, copy_to_group, group_slice) and memory moves
// (offload, reload).
#include <cstring>
#include <vector>

#include "core/bf16.h"
#include "ops/basic_kernels.h"
#include "ops/ops.h"
#include "ops/shared.h"

namespace lfc::ops {

namespace {
void copyBytes(const Tensor& dst, const Tensor& src) {
  requireSame(dst, src, "output 0");
  if (dst.data != src.data && src.numel > 0) std::memmove(dst.data, src.data, size_t(src.bytes()));
}
}  // namespace

void run_reshape(const Instr&, StepCtx& c) {
  // a view (viewOf set: the output's bytes are the input's) costs nothing; otherwise a copy
  copyBytes(c.out(0), c.in(0));
}

void run_split(const Instr&, StepCtx& c) {
  // x [..., Σ sizes] → parts [..., sizes[p]]
  const Tensor& x = c.in(0);
  const std::vector<int64_t> sizes = c.ints("sizes");
  if (int64_t(sizes.size()) != c.numOut())
    throw OpError(cat("sizes has ", sizes.size(), " parts, the instruction has ", c.numOut(), " outputs"));
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  requireDim(x.last(), total, "last dim vs the sum of sizes");
  const int64_t R = x.rows();
  std::vector<void*> parts;
  for (int p = 0; p < c.numOut(); p++) {
    requireOut(c.out(p), x.dtype, R * sizes[size_t(p)], "part");
    parts.push_back(c.out(p).data);
  }
  basic::split_last(parts.data(), x.data, sizes.data(), int64_t(parts.size()), R, dtypeBytes(x.dtype));
}

void run_concat(const Instr&, StepCtx& c) {
  // parts [..., w_p] → y [..., Σ w_p]
  const Tensor& y = c.out(0);
  const int64_t R = c.in(0).rows();
  std::vector<const void*> parts;
  std::vector<int64_t> widths;
  int64_t total = 0;
  for (int p = 0; p < c.numIn(); p++) {
    const Tensor& t = c.in(p);
    requireDType(t, y.dtype, "part");
    requireDim(t.rows(), R, "leading elements of a part vs part 0");
    parts.push_back(t.data);
    widths.push_back(t.last());
    total += t.last();
  }
  requireNumel(y, R * total, "output 0");
  basic::concat_last(y.data, parts.data(), widths.data(), int64_t(parts.size()), R, dtypeBytes(y.dtype));
}

void run_constant(const Instr&, StepCtx& c) {
  const Tensor& y = c.out(0);
  const std::string dtype = c.str("dtype");
  if (dtype != dtypeName(y.dtype))
    throw OpError(cat("attribute dtype ", dtype, " differs from its buffer's ", dtypeName(y.dtype)));
  const double v = c.num("value");
  switch (y.dtype) {
    case DType::f32: basic::fill(y.as<float>(), float(v), y.numel); return;
    case DType::f64: basic::fill(y.as<double>(), v, y.numel); return;
    case DType::bf16: basic::fill(y.as<bf16>(), toBf16(float(v)), y.numel); return;
    case DType::i32: basic::fill(y.as<int32_t>(), int32_t(v), y.numel); return;
    case DType::i64: basic::fill(y.as<int64_t>(), int64_t(v), y.numel); return;
    case DType::u8: basic::fill(y.as<uint8_t>(), uint8_t(v), y.numel); return;
    default: throw OpError(cat("constant of dtype ", dtypeName(y.dtype), " is not supported on CPU"));
  }
}

// Entering a parallel region is the identity forward (its backward is an all-reduce the plan
// holds): a copy, or nothing when the plan made the output a view of the input.
void run_copy_to_group(const Instr&, StepCtx& c) { copyBytes(c.out(0), c.in(0)); }

void run_group_slice(const Instr&, StepCtx& c) {
  // x [P·n, ...] → block r [n, ...], r = this rank's index in the group
  const Tensor &x = c.in(0), &y = c.out(0);
  const GroupPos g = groupPos(c, "group");
  if (x.rank() < 1) throw OpError("group_slice needs an input of rank ≥ 1");
  if (x.dim(0) % g.size != 0)
    throw OpError(cat("dim 0 of input 0 ", formatShape(x.shape), " is not divisible by group_size ", g.size));
  requireOut(y, x.dtype, x.numel / g.size, "output 0");
  basic::take_block(y.data, x.data, y.bytes(), g.rank);
}

// Host and device memory are the same on CPU: a copy between the two buffers.
void run_offload(const Instr&, StepCtx& c) { copyBytes(c.out(0), c.in(0)); }
void run_reload(const Instr&, StepCtx& c) { copyBytes(c.out(0), c.in(0)); }

}  // namespace lfc::ops
