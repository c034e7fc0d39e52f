// Backward ops → the kernels' backward functions. Every output is overwritten: a kernel that
// accumulates into a weight gradient (embedding, linear, norm weights, grouped weights, aux loss)
// gets a zeroed output first. Statistics the kernels want but the IR does not carry (norm mean
// and rstd, the cross-entropy log-sum-exp, the router's renormalized weights) are recomputed here
// exactly as the forward computes them.
#include <algorithm>
#include <optional>
#include <vector>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/loss.h"
#include "kernels/cpu/merge.h"
#include "kernels/cpu/moe.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/rope.h"
#include "ops/ops.h"
#include "ops/shared.h"

namespace lfc::ops {

void run_embedding_grad(const Instr&, StepCtx& c) {
  const Tensor &dy = c.in(0), &ids = c.in(1), &dtable = c.out(0);  // dy [T, H], ids [T] → [rows, H]
  requireDType(ids, DType::i32, "input 1 (ids)");
  const int64_t T = ids.numel, H = dy.last(), V = c.integer("rows");
  requireNumel(dy, T * H, "input 0 (dy)");
  requireOut(dtable, dy.dtype, V * H, "output 0 (dtable)");
  const std::optional<GroupPos> shard = vocabShard(c);
  zero(dtable);
  withReal(dy, "input 0 (dy)", [&](auto z) {
    using Real = decltype(z);
    if (shard)
      cpu::embedding_shard_backward<Real>(dtable.as<Real>(), dy.as<Real>(), ids.as<int32_t>(), T, V, H,
                                          shard->rank * V, shard->size * V);
    else
      cpu::embedding_backward<Real>(dtable.as<Real>(), dy.as<Real>(), ids.as<int32_t>(), T, V, H);
  });
}

void run_linear_dgrad(const Instr&, StepCtx& c) {
  const Tensor &dy = c.in(0), &w = c.in(1), &dx = c.out(0);  // dy [..., out], W [out, in] → [..., in]
  requireRank(w, 2, "input 1 (weight)");
  const int64_t N = dy.rows(), out = w.dim(0), in = w.dim(1);
  requireDim(dy.last(), out, "dy features vs weight out-features");
  requireDType(w, dy.dtype, "input 1 (weight)");
  requireOut(dx, dy.dtype, N * in, "output 0 (dx)");
  withReal(dy, "input 0 (dy)", [&](auto z) {
    using Real = decltype(z);
    cpu::linear_backward_data<Real>(dx.as<Real>(), dy.as<Real>(), w.as<Real>(), N, in, out);
  });
}

void run_linear_wgrad(const Instr&, StepCtx& c) {
  // dy [..., out], x [..., in] → dW [out, in] (, db [out] with bias)
  const Tensor &dy = c.in(0), &x = c.in(1), &dw = c.out(0);
  const bool bias = c.flag("bias");
  if (c.numOut() != (bias ? 2 : 1))
    throw OpError(cat("linear_wgrad with bias=", bias ? "true" : "false", " gives ", bias ? 2 : 1,
                      " outputs, the instruction has ", c.numOut()));
  const int64_t N = dy.rows(), out = dy.last(), in = x.last();
  requireDim(x.rows(), N, "rows of x vs dy");
  requireDType(x, dy.dtype, "input 1 (x)");
  requireOut(dw, dy.dtype, out * in, "output 0 (dW)");
  zero(dw);
  if (bias) {
    requireOut(c.out(1), dy.dtype, out, "output 1 (db)");
    zero(c.out(1));
  }
  withReal(dy, "input 0 (dy)", [&](auto z) {
    using Real = decltype(z);
    cpu::linear_backward_weight<Real>(dw.as<Real>(), bias ? c.out(1).as<Real>() : nullptr, dy.as<Real>(),
                                      x.as<Real>(), N, in, out);
  });
}

void run_layernorm_grad(const Instr&, StepCtx& c) {
  // dy, x [..., H], w [H] → dx, dw, db; b is not an input: the statistics only need x
  const Tensor &dy = c.in(0), &x = c.in(1), &w = c.in(2);
  const Tensor &dx = c.out(0), &dw = c.out(1), &db = c.out(2);
  const int64_t R = x.rows(), H = x.last();
  requireSame(dy, x, "input 0 (dy)");
  requireNumel(w, H, "input 2 (weight)");
  requireDType(w, x.dtype, "input 2 (weight)");
  requireOut(dx, x.dtype, x.numel, "output 0 (dx)");
  requireOut(dw, x.dtype, H, "output 1 (dw)");
  requireOut(db, x.dtype, H, "output 2 (db)");
  zero(dw);
  zero(db);
  withReal(x, "input 1 (x)", [&](auto z) {
    using Real = decltype(z);
    // recompute mean and rstd (the forward's y goes to scratch; bias 0 does not change them)
    Real* y = c.scratch().get<Real>(0, x.numel);
    Real* mean = c.scratch().get<Real>(1, R);
    Real* rstd = c.scratch().get<Real>(2, R);
    Real* zeros = c.scratch().get<Real>(3, H);
    std::fill(zeros, zeros + H, Real(0));
    cpu::layernorm_forward<Real>(y, mean, rstd, x.as<Real>(), w.as<Real>(), zeros, R, H, c.num("eps"));
    cpu::layernorm_backward<Real>(dx.as<Real>(), dw.as<Real>(), db.as<Real>(), dy.as<Real>(), x.as<Real>(),
                                  w.as<Real>(), mean, rstd, R, H);
  });
}

void run_rmsnorm_grad(const Instr&, StepCtx& c) {
  const Tensor &dy = c.in(0), &x = c.in(1), &w = c.in(2), &dx = c.out(0), &dw = c.out(1);
  const int64_t R = x.rows(), H = x.last();
  requireSame(dy, x, "input 0 (dy)");
  requireNumel(w, H, "input 2 (weight)");
  requireDType(w, x.dtype, "input 2 (weight)");
  requireOut(dx, x.dtype, x.numel, "output 0 (dx)");
  requireOut(dw, x.dtype, H, "output 1 (dw)");
  zero(dw);
  withReal(x, "input 1 (x)", [&](auto z) {
    using Real = decltype(z);
    Real* y = c.scratch().get<Real>(0, x.numel);
    Real* rstd = c.scratch().get<Real>(1, R);
    cpu::rmsnorm_forward<Real>(y, rstd, x.as<Real>(), w.as<Real>(), R, H, c.num("eps"));
    cpu::rmsnorm_backward<Real>(dx.as<Real>(), dw.as<Real>(), dy.as<Real>(), x.as<Real>(), w.as<Real>(), rstd,
                                R, H);
  });
}

void run_rope_grad(const Instr&, StepCtx& c) {
  const Tensor &dy = c.in(0), &pos = c.in(1), &dx = c.out(0);  // dy [T, nh, d]
  requireRank(dy, 3, "input 0 (dy)");
  requireOut(dx, dy.dtype, dy.numel, "output 0 (dx)");
  const RopeArgs r = ropeArgs(c, dy, pos);
  withReal(dy, "input 0 (dy)", [&](auto z) {
    using Real = decltype(z);
    cpu::rope_backward<Real>(dx.as<Real>(), dy.as<Real>(), pos.as<int32_t>(), r.sections.data(), r.P,
                             dy.dim(0), dy.dim(1), dy.dim(2), c.num("theta"));
  });
}

void run_attention_grad(const Instr&, StepCtx& c) {
  // dout, q, k, v, segments, out, lse → dq, dk, dv
  const Tensor &dout = c.in(0), &q = c.in(1), &k = c.in(2), &v = c.in(3), &seg = c.in(4);
  const Tensor &out = c.in(5), &lse = c.in(6);
  const AttnArgs a = attnArgs(q, k, v, seg);
  requireSame(dout, q, "input 0 (dout)");
  requireSame(out, q, "input 5 (out)");
  requireOut(lse, q.dtype, a.T * a.nh, "input 6 (lse)");
  requireOut(c.out(0), q.dtype, q.numel, "output 0 (dq)");
  requireOut(c.out(1), q.dtype, k.numel, "output 1 (dk)");
  requireOut(c.out(2), q.dtype, v.numel, "output 2 (dv)");
  withReal(q, "input 1 (q)", [&](auto z) {
    using Real = decltype(z);
    cpu::attention_backward<Real>(c.out(0).as<Real>(), c.out(1).as<Real>(), c.out(2).as<Real>(),
                                  dout.as<Real>(), q.as<Real>(), k.as<Real>(), v.as<Real>(), out.as<Real>(),
                                  lse.as<Real>(), seg.as<int32_t>(), a.T, a.nh, a.nkv, a.d, c.num("scale"),
                                  c.flag("causal"));
  });
}

void run_gelu_grad(const Instr&, StepCtx& c) {
  const Tensor &dy = c.in(0), &x = c.in(1), &dx = c.out(0);
  requireSame(x, dy, "input 1 (x)");
  requireOut(dx, dy.dtype, dy.numel, "output 0 (dx)");
  withReal(dy, "input 0 (dy)", [&](auto z) {
    using Real = decltype(z);
    cpu::gelu_backward<Real>(dx.as<Real>(), dy.as<Real>(), x.as<Real>(), dy.numel);
  });
}

void run_swiglu_grad(const Instr&, StepCtx& c) {
  const Tensor &dy = c.in(0), &gate = c.in(1), &up = c.in(2);
  requireSame(gate, dy, "input 1 (gate)");
  requireSame(up, dy, "input 2 (up)");
  requireOut(c.out(0), dy.dtype, dy.numel, "output 0 (dgate)");
  requireOut(c.out(1), dy.dtype, dy.numel, "output 1 (dup)");
  withReal(dy, "input 0 (dy)", [&](auto z) {
    using Real = decltype(z);
    cpu::swiglu_backward<Real>(c.out(0).as<Real>(), c.out(1).as<Real>(), dy.as<Real>(), gate.as<Real>(),
                               up.as<Real>(), dy.numel);
  });
}

void run_merge_visual_grad(const Instr&, StepCtx& c) {
  // dy [T, H], tokens [T] → dtext [T, H], dvisual [Nv, H] (Nv from the output's resolved shape)
  const Tensor &dy = c.in(0), &tokens = c.in(1), &dtext = c.out(0), &dvis = c.out(1);
  requireRank(dy, 2, "input 0 (dy)");
  requireDType(tokens, DType::i32, "input 1 (tokens)");
  const int64_t T = dy.dim(0), H = dy.dim(1), Nv = dvis.rows();
  requireNumel(tokens, T, "input 1 (tokens)");
  requireOut(dtext, dy.dtype, dy.numel, "output 0 (dtext)");
  requireOut(dvis, dy.dtype, Nv * H, "output 1 (dvisual)");
  const cpu::MergeMode mode = mergeMode(c);
  withReal(dy, "input 0 (dy)", [&](auto z) {
    using Real = decltype(z);
    cpu::merge_visual_backward<Real>(dtext.as<Real>(), dvis.as<Real>(), dy.as<Real>(), tokens.as<int32_t>(),
                                     int32_t(c.integer("placeholder")), mode, T, Nv, H);
  });
}

void run_router_topk_grad(const Instr&, StepCtx& c) {
  // dprobs [T, E], dweights [T, k], probs [T, E], experts [T, k] → dlogits [T, E]
  const Tensor &dprobs = c.in(0), &dweights = c.in(1), &probs = c.in(2), &experts = c.in(3);
  const Tensor& dlogits = c.out(0);
  requireRank(probs, 2, "input 2 (probs)");
  requireRank(experts, 2, "input 3 (experts)");
  requireDType(experts, DType::i32, "input 3 (experts)");
  const int64_t T = probs.dim(0), E = probs.dim(1), k = experts.dim(1);
  requireDim(experts.dim(0), T, "experts vs tokens");
  requireSame(dprobs, probs, "input 0 (dprobs)");
  requireOut(dweights, probs.dtype, T * k, "input 1 (dweights)");
  requireOut(dlogits, probs.dtype, T * E, "output 0 (dlogits)");
  withReal(probs, "input 2 (probs)", [&](auto z) {
    using Real = decltype(z);
    // the renormalized weights, exactly as router_topk_forward computes them
    Real* weights = c.scratch().get<Real>(0, T * k);
    const Real* p = probs.as<Real>();
    const int32_t* ex = experts.as<int32_t>();
    for (int64_t t = 0; t < T; t++) {
      double chosen = 0;
      for (int64_t j = 0; j < k; j++) {
        const int32_t e = ex[t * k + j];
        if (e < 0 || e >= E) throw OpError(cat("experts[", t, ", ", j, "] = ", e, " is outside [0, ", E, ")"));
        chosen += p[t * E + e];
      }
      for (int64_t j = 0; j < k; j++) weights[t * k + j] = Real(p[t * E + ex[t * k + j]] / chosen);
    }
    cpu::router_topk_backward<Real>(dlogits.as<Real>(), dprobs.as<Real>(), dweights.as<Real>(), p, weights, ex,
                                    T, E, k);
  });
}

void run_moe_permute_grad(const Instr&, StepCtx& c) {
  // drows [N, H], row_of i32 [T·k] (−1: dropped by capacity) → dx [T, H]
  const Tensor &drows = c.in(0), &rowOf = c.in(1), &dx = c.out(0);
  requireRank(drows, 2, "input 0 (drows)");
  requireDType(rowOf, DType::i32, "input 1 (row_of)");
  const int64_t k = c.integer("k"), N = drows.dim(0), H = drows.dim(1), T = dx.rows();
  requireNumel(rowOf, T * k, "input 1 (row_of)");
  requireOut(dx, drows.dtype, T * H, "output 0 (dx)");
  const int32_t* r = rowOf.as<int32_t>();
  for (int64_t a = 0; a < T * k; a++)
    if (r[a] < -1 || r[a] >= N)
      throw OpError(cat("row_of[", a, "] = ", r[a], " is outside the ", N, " rows (and not −1, dropped)"));
  withReal(drows, "input 0 (drows)", [&](auto z) {
    using Real = decltype(z);
    cpu::moe_permute_backward<Real>(dx.as<Real>(), drows.as<Real>(), r, T, H, k, N);
  });
}

void run_grouped_linear_dgrad(const Instr&, StepCtx& c) {
  // dy [N, out], counts [E], W_0 … → dx [N, in]
  const Tensor &dy = c.in(0), &counts = c.in(1), &dx = c.out(0);
  const GroupedArgs g = groupedArgs(c, dy, counts, 2, true);
  requireOut(dx, dy.dtype, g.N * g.in, "output 0 (dx)");
  withReal(dy, "input 0 (dy)", [&](auto z) {
    using Real = decltype(z);
    std::vector<const Real*> w = weightPointers<Real>(c, 2);
    cpu::grouped_linear_backward_data<Real>(dx.as<Real>(), dy.as<Real>(), counts.as<int32_t>(), w.data(), g.E,
                                            g.N, g.in, g.out);
  });
}

void run_grouped_linear_wgrad(const Instr&, StepCtx& c) {
  // dy [N, out], x [N, in], counts [E] → dW_0 … dW_{E−1} [out, in]
  const Tensor &dy = c.in(0), &x = c.in(1), &counts = c.in(2);
  requireRank(dy, 2, "input 0 (dy)");
  requireRank(x, 2, "input 1 (x)");
  requireDType(counts, DType::i32, "input 2 (counts)");
  requireDType(x, dy.dtype, "input 1 (x)");
  const int64_t E = counts.numel, N = dy.dim(0), out = dy.dim(1), in = x.dim(1);
  requireDim(x.dim(0), N, "rows of x vs dy");
  if (c.numOut() != E)
    throw OpError(cat("counts has ", E, " experts, the instruction has ", c.numOut(), " weight gradients"));
  for (int e = 0; e < c.numOut(); e++) {
    requireOut(c.out(e), dy.dtype, out * in, "weight gradient");
    zero(c.out(e));
  }
  withReal(dy, "input 0 (dy)", [&](auto z) {
    using Real = decltype(z);
    std::vector<Real*> dw;
    for (int e = 0; e < c.numOut(); e++) dw.push_back(c.out(e).as<Real>());
    cpu::grouped_linear_backward_weight<Real>(dw.data(), dy.as<Real>(), x.as<Real>(), counts.as<int32_t>(), E,
                                              N, in, out);
  });
}

void run_moe_unpermute_grad(const Instr&, StepCtx& c) {
  // dy [T, H], rows [N, H], row_of [T·k], weights [T, k] → drows [N, H], dweights [T, k]
  const Tensor &dy = c.in(0), &rows = c.in(1), &rowOf = c.in(2), &w = c.in(3);
  requireRank(rows, 2, "input 1 (rows)");
  requireRank(w, 2, "input 3 (weights)");
  requireDType(rowOf, DType::i32, "input 2 (row_of)");
  const int64_t N = rows.dim(0), H = rows.dim(1), T = w.dim(0), k = w.dim(1);
  requireOut(dy, rows.dtype, T * H, "input 0 (dy)");
  requireNumel(rowOf, T * k, "input 2 (row_of)");
  requireDType(w, rows.dtype, "input 3 (weights)");
  requireOut(c.out(0), rows.dtype, N * H, "output 0 (drows)");
  requireOut(c.out(1), rows.dtype, T * k, "output 1 (dweights)");
  withReal(rows, "input 1 (rows)", [&](auto z) {
    using Real = decltype(z);
    cpu::moe_unpermute_backward<Real>(c.out(0).as<Real>(), c.out(1).as<Real>(), dy.as<Real>(), rows.as<Real>(),
                                      rowOf.as<int32_t>(), w.as<Real>(), T, k, N, H);
  });
}

void run_moe_aux_loss_grad(const Instr&, StepCtx& c) {
  // dloss [], probs [T, E], experts, segments → dprobs [T, E]
  const Tensor &dloss = c.in(0), &probs = c.in(1), &experts = c.in(2), &seg = c.in(3), &dprobs = c.out(0);
  const AuxArgs a = auxArgs(probs, experts, seg);
  const double g = scalarValue(dloss, "input 0 (dloss)");
  requireOut(dprobs, probs.dtype, probs.numel, "output 0 (dprobs)");
  zero(dprobs);
  withReal(probs, "input 1 (probs)", [&](auto z) {
    using Real = decltype(z);
    cpu::moe_aux_loss_backward<Real>(dprobs.as<Real>(), Real(g), experts.as<int32_t>(), seg.as<int32_t>(), a.T,
                                     a.E, a.k, c.num("coeff"));
  });
}

void run_cross_entropy_grad(const Instr&, StepCtx& c) {
  // dloss [], logits [T, V], labels, mask, loss_tokens [] → dlogits [T, V]
  const Tensor &dloss = c.in(0), &logits = c.in(1), &labels = c.in(2), &mask = c.in(3), &count = c.in(4);
  const Tensor& dlogits = c.out(0);
  const CeArgs a = ceArgs(logits, labels, mask);
  const double g = scalarValue(dloss, "input 0 (dloss)");
  const double lossTokens = scalarValue(count, "input 4 (loss_tokens)");
  requireOut(dlogits, logits.dtype, logits.numel, "output 0 (dlogits)");
  withReal(logits, "input 1 (logits)", [&](auto z) {
    using Real = decltype(z);
    Real* lse = c.scratch().get<Real>(0, a.T);  // recomputed as the forward saves it
    cpu::cross_entropy_forward<Real>(lse, logits.as<Real>(), labels.as<int32_t>(), mask.as<uint8_t>(),
                                     lossTokens, a.T, a.V);
    cpu::cross_entropy_backward<Real>(dlogits.as<Real>(), Real(g), logits.as<Real>(), lse, labels.as<int32_t>(),
                                      mask.as<uint8_t>(), lossTokens, a.T, a.V);
  });
}

void run_vocab_logsumexp_grad(const Instr&, StepCtx& c) {
  // dy [T], logits [T, Vl], lse [T] → dlogits [T, Vl]
  const Tensor &dy = c.in(0), &logits = c.in(1), &lse = c.in(2), &dlogits = c.out(0);
  requireRank(logits, 2, "input 1 (logits)");
  const int64_t T = logits.dim(0), V = logits.dim(1);
  requireOut(dy, logits.dtype, T, "input 0 (dy)");
  requireOut(lse, logits.dtype, T, "input 2 (lse)");
  requireOut(dlogits, logits.dtype, T * V, "output 0 (dlogits)");
  withReal(logits, "input 1 (logits)", [&](auto z) {
    using Real = decltype(z);
    cpu::vocab_logsumexp_backward<Real>(dlogits.as<Real>(), dy.as<Real>(), logits.as<Real>(), lse.as<Real>(), T,
                                        V);
  });
}

void run_lse_combine_grad(const Instr&, StepCtx& c) {
  // dy [T], x [P, T], y [T] → dx [P, T]
  const Tensor &dy = c.in(0), &x = c.in(1), &y = c.in(2), &dx = c.out(0);
  requireRank(x, 2, "input 1 (x)");
  const int64_t P = x.dim(0), T = x.dim(1);
  requireOut(dy, x.dtype, T, "input 0 (dy)");
  requireOut(y, x.dtype, T, "input 2 (y)");
  requireOut(dx, x.dtype, P * T, "output 0 (dx)");
  withReal(x, "input 1 (x)", [&](auto z) {
    using Real = decltype(z);
    cpu::lse_combine_backward<Real>(dx.as<Real>(), dy.as<Real>(), x.as<Real>(), y.as<Real>(), P, T);
  });
}

void run_vocab_target_logit_grad(const Instr&, StepCtx& c) {
  // dy [T], labels i32 [T], mask? u8 [T] → dlogits [T, columns]
  const Tensor &dy = c.in(0), &labels = c.in(1), &dlogits = c.out(0);
  const TargetArgs a = targetArgs(c, dy.numel, c.integer("columns"), labels);
  requireOut(dlogits, dy.dtype, a.T * a.V, "output 0 (dlogits)");
  withReal(dy, "input 0 (dy)", [&](auto z) {
    using Real = decltype(z);
    cpu::vocab_target_logit_backward<Real>(dlogits.as<Real>(), dy.as<Real>(), labels.as<int32_t>(), a.mask, a.T,
                                           a.V, a.shard.rank * a.V, a.shard.size * a.V);
  });
}

void run_ce_from_stats_grad(const Instr&, StepCtx& c) {
  // dloss [], lse [T], mask u8 [T], loss_tokens [] → dlse [T], dtarget [T]
  const Tensor &lse = c.in(1), &mask = c.in(2), &dlse = c.out(0), &dtarget = c.out(1);
  const double g = scalarValue(c.in(0), "input 0 (dloss)");
  const double lossTokens = scalarValue(c.in(3), "input 3 (loss_tokens)");
  const int64_t T = lse.numel;
  requireDType(mask, DType::u8, "input 2 (mask)");
  requireNumel(mask, T, "input 2 (mask)");
  requireOut(dlse, lse.dtype, T, "output 0 (dlse)");
  requireOut(dtarget, lse.dtype, T, "output 1 (dtarget)");
  withReal(lse, "input 1 (lse)", [&](auto z) {
    using Real = decltype(z);
    cpu::ce_from_stats_backward<Real>(dlse.as<Real>(), dtarget.as<Real>(), Real(g), mask.as<uint8_t>(), lossTokens,
                                      T);
  });
}

}  // namespace lfc::ops
