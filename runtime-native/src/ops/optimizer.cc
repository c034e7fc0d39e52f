// Optimizer ops: in place on persistent buffers (grad, param, optim regions).
#include "kernels/cpu/optimizer.h"
#include "ops/basic_kernels.h"
#include "ops/ops.h"
#include "ops/shared.h"

namespace lfc::ops {

void run_grad_accumulate(const Instr&, StepCtx& c) {
  const Tensor &g = c.in(0), &acc = c.in(1);  // acc += g
  requireSame(g, acc, "input 0 (gradient)");
  withReal(acc, "input 1 (accumulator)", [&](auto z) {
    using Real = decltype(z);
    basic::accumulate<Real>(acc.as<Real>(), g.as<Real>(), acc.numel);
  });
}

void run_sum_squares(const Instr&, StepCtx& c) {
  // Σ over every element of every input, in double; input i weighed by scales[i] when given
  std::vector<double> scales = c.has("scales") ? c.numbers("scales") : std::vector<double>();
  if (!scales.empty() && int(scales.size()) != c.numIn())
    throw OpError(cat("scales has ", scales.size(), " entries for ", c.numIn(), " inputs"));
  double total = 0;
  for (int i = 0; i < c.numIn(); i++)
    withReal(c.in(i), "input", [&](auto z) {
      using Real = decltype(z);
      const double s = cpu::sum_squares<Real>(c.in(i).as<Real>(), c.in(i).numel);
      total += scales.empty() ? s : scales[size_t(i)] * s;
    });
  setScalarValue(c.out(0), total, "output 0");
}

void run_clip_coef(const Instr&, StepCtx& c) {
  const double sumsq = scalarValue(c.in(0), "input 0 (sum of squares)");
  setScalarValue(c.out(0), basic::clip_coef(sumsq, c.num("max_norm")), "output 0");
}

void run_adamw(const Instr&, StepCtx& c) {
  // param, grad, m, v (same shape), clip_coef []: the step on g·clip_coef; the grad buffer keeps
  // the unclipped gradient (dumps report gradients before clipping)
  const Tensor &p = c.in(0), &g = c.in(1), &m = c.in(2), &v = c.in(3);
  requireSame(g, p, "input 1 (grad)");
  requireSame(m, p, "input 2 (m)");
  requireSame(v, p, "input 3 (v)");
  const double coef = scalarValue(c.in(4), "input 4 (clip_coef)");
  cpu::AdamWParams hp;
  hp.lr = c.params().lr;
  hp.beta1 = c.num("beta1");
  hp.beta2 = c.num("beta2");
  hp.eps = c.num("eps");
  hp.weight_decay = c.num("weight_decay");
  hp.grad_scale = coef;
  withReal(p, "input 0 (param)", [&](auto z) {
    using Real = decltype(z);
    cpu::adamw_step<Real>(p.as<Real>(), g.as<Real>(), m.as<Real>(), v.as<Real>(), p.numel, hp,
                          c.params().step);
  });
}

}  // namespace lfc::ops
