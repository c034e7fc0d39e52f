// Optimizer ops: in place on persistent buffers (grad, param, optim regions).
#include "kernels/cpu/optimizer.h"
#include "ops/basic_kernels.h"
#include "ops/ops.h"
#include "ops/shared.h"

namespace lfc::ops {

void run_grad_accumulate(const Instr&, StepCtx& c) {
  const Tensor &g = c.in(0), &acc = c.in(1);  // acc += g, in f32, written in acc's dtype
  requireFloat(acc, "input 1 (accumulator)");
  requireFloat(g, acc.numel, "input 0 (gradient)");
  cpu::grad_accumulate(dst(acc), src(g), acc.numel);
}

void run_sum_squares(const Instr&, StepCtx& c) {
  // Σ over every element of every input (each any float dtype), in double; input i weighed by
  // scales[i] when given
  std::vector<double> scales = c.has("scales") ? c.numbers("scales") : std::vector<double>();
  if (!scales.empty() && int(scales.size()) != c.numIn())
    throw OpError(cat("scales has ", scales.size(), " entries for ", c.numIn(), " inputs"));
  double total = 0;
  for (int i = 0; i < c.numIn(); i++) {
    requireFloat(c.in(i), "input");
    const double s = cpu::sum_squares(src(c.in(i)), c.in(i).numel);
    total += scales.empty() ? s : scales[size_t(i)] * s;
  }
  setScalarValue(c.out(0), total, "output 0");
}

void run_clip_coef(const Instr&, StepCtx& c) {
  const double sumsq = scalarValue(c.in(0), "input 0 (sum of squares)");
  setScalarValue(c.out(0), basic::clip_coef(sumsq, c.num("max_norm")), "output 0");
}

void run_adamw(const Instr&, StepCtx& c) {
  // param, grad, m, v (same numel), clip_coef [], master? (same numel): the step on g·clip_coef;
  // the grad buffer keeps the unclipped gradient (dumps report gradients before clipping). With
  // master (mixed precision: a bf16 param), the step runs on master and param = master rounded.
  const Tensor &p = c.in(0), &g = c.in(1), &m = c.in(2), &v = c.in(3);
  const Tensor* master = c.numIn() > 5 ? &c.in(5) : nullptr;
  requireFloat(p, "input 0 (param)");
  requireFloat(g, p.numel, "input 1 (grad)");
  requireFloat(m, p.numel, "input 2 (m)");
  requireFloat(v, p.numel, "input 3 (v)");
  if (master) requireFloat(*master, p.numel, "input 5 (master)");
  else if (p.dtype == DType::bf16)
    throw OpError("input 0 (param) is bf16: a bf16 parameter needs its fp32 master (6th input)");
  const double coef = scalarValue(c.in(4), "input 4 (clip_coef)");
  cpu::AdamWParams hp;
  hp.lr = c.params().lr;
  hp.beta1 = c.num("beta1");
  hp.beta2 = c.num("beta2");
  hp.eps = c.num("eps");
  hp.weight_decay = c.num("weight_decay");
  hp.grad_scale = coef;
  if (master)
    cpu::adamw_step_master(dst(p), dst(*master), src(g), dst(m), dst(v), p.numel, hp, c.params().step);
  else
    cpu::adamw_step(dst(p), src(g), dst(m), dst(v), p.numel, hp, c.params().step);
}

}  // namespace lfc::ops
