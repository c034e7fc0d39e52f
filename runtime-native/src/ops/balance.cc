// The ViT data-parallel balance ops (passes/parallel/vit-balance.ts) → kernels/cpu/balance.h.
#include "kernels/cpu/balance.h"
#include "ops/ops.h"
#include "ops/shared.h"

namespace lfc::ops {

void run_image_sizes(const Instr&, StepCtx& c) {
  const Tensor &seg = c.in(0), &y = c.out(0);  // segments i32 [N] → i32 [images]
  requireDType(seg, DType::i32, "input 0 (segments)");
  const int64_t I = c.integer("images");
  requireOut(y, DType::i32, I, "output 0");
  cpu::image_sizes(y.as<int32_t>(), seg.as<int32_t>(), seg.numel, I);
}

void run_vit_balance_route(const Instr&, StepCtx& c) {
  // all_sizes i32 [P·I], segments i32 [N] → send [P], order [N], back [P], inverse [N/merge], moved f32 []
  const Tensor &all = c.in(0), &seg = c.in(1);
  const GroupPos g = groupPos(c, "group");
  const int64_t I = c.integer("images"), merge = c.integer("merge"), N = seg.numel;
  requireDType(seg, DType::i32, "input 1 (segments)");
  requireOut(all, DType::i32, g.size * I, "input 0 (all_sizes)");
  requireOut(c.out(0), DType::i32, g.size, "output 0 (send)");
  requireOut(c.out(1), DType::i32, N, "output 1 (order)");
  requireOut(c.out(2), DType::i32, g.size, "output 2 (back)");
  requireOut(c.out(3), DType::i32, merge > 0 ? N / merge : 0, "output 3 (inverse)");
  const int64_t moved = cpu::vit_balance_route(c.out(0).as<int32_t>(), c.out(1).as<int32_t>(), c.out(2).as<int32_t>(),
                                               c.out(3).as<int32_t>(), all.as<int32_t>(), seg.as<int32_t>(), N,
                                               g.size, I, g.rank, merge, c.integer("capacity"));
  setScalarValue(c.out(4), double(moved), "output 4 (moved)");
}

void run_segment_offset(const Instr&, StepCtx& c) {
  const Tensor &seg = c.in(0), &y = c.out(0);  // i32 [N] → i32 [N]
  requireDType(seg, DType::i32, "input 0 (segments)");
  requireOut(y, DType::i32, seg.numel, "output 0");
  cpu::segment_offset(y.as<int32_t>(), seg.as<int32_t>(), seg.numel, groupPos(c, "group").rank,
                      c.integer("stride"));
}

void run_gather_rows(const Instr&, StepCtx& c) {
  const Tensor &x = c.in(0), &index = c.in(1), &y = c.out(0);  // x [N, ...], index i32 [M] → [M, ...]
  requireDType(index, DType::i32, "input 1 (index)");
  const int64_t N = x.dim(0), M = index.numel, rowBytes = N > 0 ? x.bytes() / N : 0;
  requireDType(y, x.dtype, "output 0");
  if (M > 0 && N > 0) requireNumel(y, M * (x.numel / N), "output 0");
  cpu::gather_rows(y.data, x.data,
                   index.as<int32_t>(), M, N, rowBytes);
}

void run_scatter_rows(const Instr&, StepCtx& c) {
  const Tensor &dy = c.in(0), &index = c.in(1), &dx = c.out(0);  // dy [M, ...], index i32 [M] → [rows, ...]
  requireDType(index, DType::i32, "input 1 (index)");
  const int64_t M = index.numel, N = dx.dim(0), H = N > 0 ? dx.numel / N : 0;
  requireDim(dy.dim(0), M, "input 0 (dy) rows vs index");
  requireFloat(dy, "input 0 (dy)");
  requireFloat(dx, "output 0");
  if (M > 0) requireNumel(dy, M * H, "input 0 (dy)");
  cpu::scatter_rows(dst(dx), src(dy), index.as<int32_t>(), M, N, H);
}

}  // namespace lfc::ops
