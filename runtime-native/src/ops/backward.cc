// Backward ops → the kernels' backward entry points (kernels/cpu), float operands each f32 or bf16
// (or every one f64), each output in its own buffer's dtype. Every output is overwritten: a kernel that
// accumulates into a weight gradient (embedding, linear, norm weights, grouped weights, aux loss)
// gets a zeroed output first. Statistics the kernels want but the IR does not carry (norm mean
// and rstd, the cross-entropy log-sum-exp, the router's renormalized weights) are recomputed here
// exactly as the forward computes them.
#include <cstring>
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
  // dy [T, H], ids [T] → [rows, H]; or dy, ids [T, K], weights [T, K] (the weighted bag)
  const Tensor &dy = c.in(0), &ids = c.in(1), &dtable = c.out(0);
  requireDType(ids, DType::i32, "input 1 (ids)");
  const int64_t H = dy.last(), V = c.integer("rows");
  requireFloat(dtable, V * H, "output 0 (dtable)");
  zero(dtable);
  if (c.numIn() > 2) {
    const int64_t T = dy.rows(), K = ids.numel / std::max<int64_t>(T, 1);
    requireNumel(ids, T * K, "input 1 (ids)");
    requireFloat(c.in(2), T * K, "input 2 (weights)");
    requireFloat(dy, T * H, "input 0 (dy)");
    cpu::embedding_bag_backward(dst(dtable), src(dy), ids.as<int32_t>(), src(c.in(2)), T, K, V, H);
    return;
  }
  const int64_t T = ids.numel;
  requireFloat(dy, T * H, "input 0 (dy)");
  if (const std::optional<GroupPos> shard = vocabShard(c))
    cpu::embedding_shard_backward(dst(dtable), src(dy), ids.as<int32_t>(), T, V, H, shard->rank * V,
                                  shard->size * V);
  else
    cpu::embedding_backward(dst(dtable), src(dy), ids.as<int32_t>(), T, V, H);
}

void run_linear_dgrad(const Instr&, StepCtx& c) {
  const Tensor &dy = c.in(0), &w = c.in(1), &dx = c.out(0);  // dy [..., out], W [out, in] → [..., in]
  requireRank(w, 2, "input 1 (weight)");
  const int64_t N = dy.rows(), out = w.dim(0), in = w.dim(1);
  requireDim(dy.last(), out, "dy features vs weight out-features");
  requireFloat(dy, "input 0 (dy)");
  requireFloat(w, "input 1 (weight)");
  requireFloat(dx, N * in, "output 0 (dx)");
  cpu::linear_backward_data(dst(dx), src(dy), src(w), N, in, out);
}

namespace {

// dW (, db) += the weight gradient of dy [..., out], x [..., in] (the kernel accumulates); with
// `overwrite`, zeroed first, once the operands are checked
void linearWgradInto(StepCtx& c, const Tensor& dw, const Tensor* db, const char* what, bool overwrite) {
  const Tensor &dy = c.in(0), &x = c.in(1);
  const int64_t N = dy.rows(), out = dy.last(), in = x.last();
  requireDim(x.rows(), N, "rows of x vs dy");
  requireFloat(dy, "input 0 (dy)");
  requireFloat(x, "input 1 (x)");
  requireFloat(dw, out * in, what);
  if (db) requireFloat(*db, out, "the bias gradient (db)");
  if (overwrite) {
    zero(dw);
    if (db) zero(*db);
  }
  cpu::linear_backward_weight(dst(dw), db ? dst(*db) : cpu::Dst{}, src(dy), src(x), N, in, out);
}

}  // namespace

void run_linear_wgrad(const Instr&, StepCtx& c) {
  // dy [..., out], x [..., in] → dW [out, in] (, db [out] with bias)
  const bool bias = c.flag("bias");
  if (c.numOut() != (bias ? 2 : 1))
    throw OpError(cat("linear_wgrad with bias=", bias ? "true" : "false", " gives ", bias ? 2 : 1,
                      " outputs, the instruction has ", c.numOut()));
  linearWgradInto(c, c.out(0), bias ? &c.out(1) : nullptr, "output 0 (dW)", true);
}

void run_linear_wgrad_accumulate(const Instr&, StepCtx& c) {
  // dy [..., out], x [..., in], dW [out, in] (, db [out] with bias): dW += dyᵀ·x (, db += Σ dy)
  const bool bias = c.flag("bias");
  if (c.numIn() != (bias ? 4 : 3))
    throw OpError(cat("linear_wgrad_accumulate with bias=", bias ? "true" : "false", " takes ", bias ? 4 : 3,
                      " inputs, the instruction has ", c.numIn()));
  linearWgradInto(c, c.in(2), bias ? &c.in(3) : nullptr, "input 2 (dW)", false);
}

void run_layernorm_grad(const Instr&, StepCtx& c) {
  // dy, x [..., H], w [H] → dx, dw, db; b is not an input: the statistics only need x
  const Tensor &dy = c.in(0), &x = c.in(1), &w = c.in(2);
  const Tensor &dx = c.out(0), &dw = c.out(1), &db = c.out(2);
  const int64_t R = x.rows(), H = x.last();
  requireFloat(x, "input 1 (x)");
  requireFloat(dy, x.numel, "input 0 (dy)");
  requireFloat(w, H, "input 2 (weight)");
  requireFloat(dx, x.numel, "output 0 (dx)");
  requireFloat(dw, H, "output 1 (dw)");
  requireFloat(db, H, "output 2 (db)");
  zero(dw);
  zero(db);
  // mean and rstd recomputed from x, the forward's bits (layernorm_stats: no y written)
  const DType acc = computeDType(x);
  const cpu::Dst mean = scratchOf(c, R, acc), rstd = scratchOf(c, R, acc);
  cpu::layernorm_stats(mean, rstd, src(x), R, H, c.num("eps"));
  cpu::layernorm_backward(dst(dx), dst(dw), dst(db), src(dy), src(x), src(w), mean, rstd, R, H);
}

void run_rmsnorm_grad(const Instr&, StepCtx& c) {
  const Tensor &dy = c.in(0), &x = c.in(1), &w = c.in(2), &dx = c.out(0), &dw = c.out(1);
  const int64_t R = x.rows(), H = x.last();
  requireFloat(x, "input 1 (x)");
  requireFloat(dy, x.numel, "input 0 (dy)");
  requireFloat(w, H, "input 2 (weight)");
  requireFloat(dx, x.numel, "output 0 (dx)");
  requireFloat(dw, H, "output 1 (dw)");
  zero(dw);
  const DType acc = computeDType(x);
  const cpu::Dst rstd = scratchOf(c, R, acc);
  cpu::rmsnorm_stats(rstd, src(x), R, H, c.num("eps"));
  cpu::rmsnorm_backward(dst(dx), dst(dw), src(dy), src(x), src(w), rstd, R, H);
}

void run_rope_grad(const Instr&, StepCtx& c) {
  const Tensor &dy = c.in(0), &pos = c.in(1), &dx = c.out(0);  // dy [T, nh, d]
  requireRank(dy, 3, "input 0 (dy)");
  requireFloat(dy, "input 0 (dy)");
  requireFloat(dx, dy.numel, "output 0 (dx)");
  const RopeArgs r = ropeArgs(c, dy, pos);
  cpu::rope_backward(dst(dx), src(dy), pos.as<int32_t>(), r.sections.data(), r.P, dy.dim(0), dy.dim(1), dy.dim(2),
                     c.num("theta"), r.layout);
}

void run_attention_grad(const Instr&, StepCtx& c) {
  // dout, q, k, v, segments, out, lse → dq, dk, dv
  const Tensor &dout = c.in(0), &q = c.in(1), &k = c.in(2), &v = c.in(3), &seg = c.in(4);
  const Tensor &out = c.in(5), &lse = c.in(6);
  const AttnArgs a = attnArgs(q, k, v, seg);
  requireFloat(dout, q.numel, "input 0 (dout)");
  requireFloat(out, q.numel, "input 5 (out)");
  requireFloat(lse, a.T * a.nh, "input 6 (lse)");
  requireFloat(c.out(0), q.numel, "output 0 (dq)");
  requireFloat(c.out(1), k.numel, "output 1 (dk)");
  requireFloat(c.out(2), v.numel, "output 2 (dv)");
  cpu::attention_backward(dst(c.out(0)), dst(c.out(1)), dst(c.out(2)), src(dout), src(q), src(k), src(v), src(out),
                          src(lse), seg.as<int32_t>(), a.T, a.nh, a.nkv, a.d, c.num("scale"), c.flag("causal"));
}

void run_gelu_grad(const Instr&, StepCtx& c) {
  const Tensor &dy = c.in(0), &x = c.in(1), &dx = c.out(0);
  requireFloat(dy, "input 0 (dy)");
  requireFloat(x, dy.numel, "input 1 (x)");
  requireFloat(dx, dy.numel, "output 0 (dx)");
  if (c.has("exact") && c.flag("exact")) cpu::gelu_exact_backward(dst(dx), src(dy), src(x), dy.numel);
  else cpu::gelu_backward(dst(dx), src(dy), src(x), dy.numel);
}

void run_swiglu_grad(const Instr&, StepCtx& c) {
  const Tensor &dy = c.in(0), &gate = c.in(1), &up = c.in(2);
  requireFloat(dy, "input 0 (dy)");
  requireFloat(gate, dy.numel, "input 1 (gate)");
  requireFloat(up, dy.numel, "input 2 (up)");
  requireFloat(c.out(0), dy.numel, "output 0 (dgate)");
  requireFloat(c.out(1), dy.numel, "output 1 (dup)");
  cpu::swiglu_backward(dst(c.out(0)), dst(c.out(1)), src(dy), src(gate), src(up), dy.numel);
}

void run_merge_visual_grad(const Instr&, StepCtx& c) {
  // dy [T, H], tokens [T], image_token_id [] → dtext [T, H], dvisual [Nv, H] (Nv from the output's
  // resolved shape)
  const Tensor &dy = c.in(0), &tokens = c.in(1), &dtext = c.out(0), &dvis = c.out(1);
  requireRank(dy, 2, "input 0 (dy)");
  requireFloat(dy, "input 0 (dy)");
  requireDType(tokens, DType::i32, "input 1 (tokens)");
  const int64_t T = dy.dim(0), H = dy.dim(1), Nv = dvis.rows();
  requireNumel(tokens, T, "input 1 (tokens)");
  requireFloat(dtext, dy.numel, "output 0 (dtext)");
  requireFloat(dvis, Nv * H, "output 1 (dvisual)");
  cpu::merge_visual_backward(dst(dtext), dst(dvis), src(dy), tokens.as<int32_t>(), imageTokenId(c.in(2), "input 2"),
                             mergeMode(c), T, Nv, H);
}

void run_router_topk_grad(const Instr&, StepCtx& c) {
  // dprobs [T, E], dweights [T, k], probs [T, E], experts [T, k] → dlogits [T, E]
  const Tensor &dprobs = c.in(0), &dweights = c.in(1), &probs = c.in(2), &experts = c.in(3);
  const Tensor& dlogits = c.out(0);
  requireRank(probs, 2, "input 2 (probs)");
  requireFloat(probs, "input 2 (probs)");
  requireRank(experts, 2, "input 3 (experts)");
  requireDType(experts, DType::i32, "input 3 (experts)");
  const int64_t T = probs.dim(0), E = probs.dim(1), k = experts.dim(1);
  requireDim(experts.dim(0), T, "experts vs tokens");
  requireFloat(dprobs, probs.numel, "input 0 (dprobs)");
  requireFloat(dweights, T * k, "input 1 (dweights)");
  requireFloat(dlogits, T * E, "output 0 (dlogits)");
  // the renormalized weights, exactly as router_topk_forward computes them
  const cpu::Dst weights = scratchOf(c, T * k, computeDType(probs));
  const bool normalize = normalizeTopk(c);
  cpu::router_topk_weights(weights, src(probs), experts.as<int32_t>(), T, E, k, normalize);
  cpu::router_topk_backward(dst(dlogits), src(dprobs), src(dweights), src(probs), weights, experts.as<int32_t>(), T,
                            E, k, normalize);
}

void run_moe_permute_grad(const Instr&, StepCtx& c) {
  // drows [N, H], row_of i32 [T·k] (−1: dropped by capacity) → dx [T, H]
  const Tensor &drows = c.in(0), &rowOf = c.in(1), &dx = c.out(0);
  requireRank(drows, 2, "input 0 (drows)");
  requireFloat(drows, "input 0 (drows)");
  requireDType(rowOf, DType::i32, "input 1 (row_of)");
  const int64_t k = c.integer("k"), N = drows.dim(0), H = drows.dim(1), T = dx.rows();
  requireNumel(rowOf, T * k, "input 1 (row_of)");
  requireFloat(dx, T * H, "output 0 (dx)");
  const int32_t* r = rowOf.as<int32_t>();
  for (int64_t a = 0; a < T * k; a++)
    if (r[a] < -1 || r[a] >= N)
      throw OpError(cat("row_of[", a, "] = ", r[a], " is outside the ", N, " rows (and not −1, dropped)"));
  cpu::moe_permute_backward(dst(dx), src(drows), r, T, H, k, N);
}

void run_grouped_linear_dgrad(const Instr&, StepCtx& c) {
  // dy [N, out], counts [E], W_0 … → dx [N, in]
  const Tensor &dy = c.in(0), &counts = c.in(1), &dx = c.out(0);
  const GroupedArgs g = groupedArgs(c, dy, counts, 2, true);
  requireFloat(dx, g.N * g.in, "output 0 (dx)");
  cpu::grouped_linear_backward_data(dst(dx), src(dy), counts.as<int32_t>(), weightSrcs(c, 2), g.N, g.in, g.out);
}

namespace {

// dW_e += the weight gradient of expert e's rows of dy [N, out], x [N, in] (counts [E] rows each);
// with `overwrite`, zeroed first, once the operands are checked
void groupedWgradInto(StepCtx& c, const std::vector<const Tensor*>& dws, bool overwrite) {
  const Tensor &dy = c.in(0), &x = c.in(1), &counts = c.in(2);
  requireRank(dy, 2, "input 0 (dy)");
  requireRank(x, 2, "input 1 (x)");
  requireDType(counts, DType::i32, "input 2 (counts)");
  requireFloat(dy, "input 0 (dy)");
  requireFloat(x, "input 1 (x)");
  const int64_t E = counts.numel, N = dy.dim(0), out = dy.dim(1), in = x.dim(1);
  requireDim(x.dim(0), N, "rows of x vs dy");
  if (int64_t(dws.size()) != E)
    throw OpError(cat("counts has ", E, " experts, the instruction has ", dws.size(), " weight gradients"));
  std::vector<cpu::Dst> dw;
  for (const Tensor* t : dws) {
    requireFloat(*t, out * in, "weight gradient");
    dw.push_back(dst(*t));
  }
  if (overwrite)
    for (const Tensor* t : dws) zero(*t);
  cpu::grouped_linear_backward_weight(dw, src(dy), src(x), counts.as<int32_t>(), N, in, out);
}

}  // namespace

void run_grouped_linear_wgrad(const Instr&, StepCtx& c) {
  // dy [N, out], x [N, in], counts [E] → dW_0 … dW_{E−1} [out, in]
  std::vector<const Tensor*> dws;
  for (int e = 0; e < c.numOut(); e++) dws.push_back(&c.out(e));
  groupedWgradInto(c, dws, true);
}

void run_grouped_linear_wgrad_accumulate(const Instr&, StepCtx& c) {
  // dy [N, out], x [N, in], counts [E], dW_0 … dW_{E−1} [out, in]: dW_e += expert e's gradient
  std::vector<const Tensor*> dws;
  for (int e = 3; e < c.numIn(); e++) dws.push_back(&c.in(e));
  groupedWgradInto(c, dws, false);
}

void run_moe_unpermute_grad(const Instr&, StepCtx& c) {
  // dy [T, H], rows [N, H], row_of [T·k], weights [T, k] → drows [N, H], dweights [T, k]
  const Tensor &dy = c.in(0), &rows = c.in(1), &rowOf = c.in(2), &w = c.in(3);
  requireRank(rows, 2, "input 1 (rows)");
  requireRank(w, 2, "input 3 (weights)");
  requireDType(rowOf, DType::i32, "input 2 (row_of)");
  const int64_t N = rows.dim(0), H = rows.dim(1), T = w.dim(0), k = w.dim(1);
  requireFloat(rows, "input 1 (rows)");
  requireFloat(dy, T * H, "input 0 (dy)");
  requireNumel(rowOf, T * k, "input 2 (row_of)");
  requireFloat(w, "input 3 (weights)");
  requireFloat(c.out(0), N * H, "output 0 (drows)");
  requireFloat(c.out(1), T * k, "output 1 (dweights)");
  cpu::moe_unpermute_backward(dst(c.out(0)), dst(c.out(1)), src(dy), src(rows), rowOf.as<int32_t>(), src(w), T, k, N,
                              H);
}

void run_moe_aux_loss_grad(const Instr&, StepCtx& c) {
  // dloss [], probs [T, E], experts, segments → dprobs [T, E]
  const Tensor &dloss = c.in(0), &probs = c.in(1), &experts = c.in(2), &seg = c.in(3), &dprobs = c.out(0);
  const AuxArgs a = auxArgs(probs, experts, seg);
  const double g = scalarValue(dloss, "input 0 (dloss)");
  requireFloat(dprobs, probs.numel, "output 0 (dprobs)");
  zero(dprobs);
  cpu::moe_aux_loss_backward(dst(dprobs), g, experts.as<int32_t>(), seg.as<int32_t>(), a.T, a.E, a.k, c.num("coeff"));
}

void run_cross_entropy_grad(const Instr&, StepCtx& c) {
  // dloss [], logits [T, V], labels, mask, loss_tokens [] → dlogits [T, V]
  const Tensor &dloss = c.in(0), &logits = c.in(1), &labels = c.in(2), &mask = c.in(3), &count = c.in(4);
  const Tensor& dlogits = c.out(0);
  const CeArgs a = ceArgs(logits, labels, mask);
  const double g = scalarValue(dloss, "input 0 (dloss)");
  const double lossTokens = scalarValue(count, "input 4 (loss_tokens)");
  requireFloat(dlogits, logits.numel, "output 0 (dlogits)");
  const cpu::Dst lse = scratchOf(c, a.T, computeDType(logits));  // recomputed as the forward saves it
  cpu::cross_entropy_forward(lse, src(logits), labels.as<int32_t>(), mask.as<uint8_t>(), lossTokens, a.T, a.V);
  cpu::cross_entropy_backward(dst(dlogits), g, src(logits), lse, labels.as<int32_t>(), mask.as<uint8_t>(), lossTokens,
                              a.T, a.V);
}

void run_vocab_logsumexp_grad(const Instr&, StepCtx& c) {
  // dy [T], logits [T, Vl], lse [T] → dlogits [T, Vl]
  const Tensor &dy = c.in(0), &logits = c.in(1), &lse = c.in(2), &dlogits = c.out(0);
  requireRank(logits, 2, "input 1 (logits)");
  requireFloat(logits, "input 1 (logits)");
  const int64_t T = logits.dim(0), V = logits.dim(1);
  requireFloat(dy, T, "input 0 (dy)");
  requireFloat(lse, T, "input 2 (lse)");
  requireFloat(dlogits, T * V, "output 0 (dlogits)");
  cpu::vocab_logsumexp_backward(dst(dlogits), src(dy), src(logits), src(lse), T, V);
}

void run_lse_combine_grad(const Instr&, StepCtx& c) {
  // dy [T], x [P, T], y [T] → dx [P, T]
  const Tensor &dy = c.in(0), &x = c.in(1), &y = c.in(2), &dx = c.out(0);
  requireRank(x, 2, "input 1 (x)");
  requireFloat(x, "input 1 (x)");
  const int64_t P = x.dim(0), T = x.dim(1);
  requireFloat(dy, T, "input 0 (dy)");
  requireFloat(y, T, "input 2 (y)");
  requireFloat(dx, P * T, "output 0 (dx)");
  cpu::lse_combine_backward(dst(dx), src(dy), src(x), src(y), P, T);
}

void run_vocab_target_logit_grad(const Instr&, StepCtx& c) {
  // dy [T], labels i32 [T], mask? u8 [T] → dlogits [T, columns]
  const Tensor &dy = c.in(0), &labels = c.in(1), &dlogits = c.out(0);
  const TargetArgs a = targetArgs(c, dy.numel, c.integer("columns"), labels);
  requireFloat(dy, "input 0 (dy)");
  requireFloat(dlogits, a.T * a.V, "output 0 (dlogits)");
  cpu::vocab_target_logit_backward(dst(dlogits), src(dy), labels.as<int32_t>(), a.mask, a.T, a.V, a.shard.rank * a.V,
                                   a.shard.size * a.V);
}

void run_ce_from_stats_grad(const Instr&, StepCtx& c) {
  // dloss [], lse [T], mask u8 [T], loss_tokens [] → dlse [T], dtarget [T]
  const Tensor &lse = c.in(1), &mask = c.in(2), &dlse = c.out(0), &dtarget = c.out(1);
  const double g = scalarValue(c.in(0), "input 0 (dloss)");
  const double lossTokens = scalarValue(c.in(3), "input 3 (loss_tokens)");
  const int64_t T = lse.numel;
  requireFloat(lse, "input 1 (lse)");
  requireDType(mask, DType::u8, "input 2 (mask)");
  requireNumel(mask, T, "input 2 (mask)");
  requireFloat(dlse, T, "output 0 (dlse)");
  requireFloat(dtarget, T, "output 1 (dtarget)");
  cpu::ce_from_stats_backward(dst(dlse), dst(dtarget), g, mask.as<uint8_t>(), lossTokens, T);
}

}  // namespace lfc::ops
