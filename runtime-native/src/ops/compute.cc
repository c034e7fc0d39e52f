// Forward compute ops → kernels/cpu. Shapes in the comments use the letters of ir/ops.ts.
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

void run_embedding(const Instr&, StepCtx& c) {
  const Tensor &ids = c.in(0), &table = c.in(1), &y = c.out(0);  // ids [T], table [V, H] → [T, H]
  requireDType(ids, DType::i32, "input 0 (ids)");
  requireRank(table, 2, "input 1 (table)");
  const int64_t T = ids.numel, V = table.dim(0), H = table.dim(1);
  requireOut(y, table.dtype, T * H, "output 0");
  const std::optional<GroupPos> shard = vocabShard(c);
  withReal(table, "input 1 (table)", [&](auto z) {
    using R = decltype(z);
    if (shard)  // this rank's rows [r·V, (r+1)·V) of a vocabulary of P·V
      cpu::embedding_shard_forward<R>(y.as<R>(), ids.as<int32_t>(), table.as<R>(), T, V, H, shard->rank * V,
                                      shard->size * V);
    else
      cpu::embedding_forward<R>(y.as<R>(), ids.as<int32_t>(), table.as<R>(), T, V, H);
  });
}

void run_linear(const Instr&, StepCtx& c) {
  // x [..., in], W [out, in], b? [out] → [..., out]
  const Tensor &x = c.in(0), &w = c.in(1), &y = c.out(0);
  const Tensor* b = c.numIn() > 2 ? &c.in(2) : nullptr;
  requireRank(w, 2, "input 1 (weight)");
  const int64_t N = x.rows(), in = x.last(), out = w.dim(0);
  requireDim(w.dim(1), in, "weight in-features vs last dim of x");
  requireDType(w, x.dtype, "input 1 (weight)");
  if (b) {
    requireDType(*b, x.dtype, "input 2 (bias)");
    requireNumel(*b, out, "input 2 (bias)");
  }
  requireOut(y, x.dtype, N * out, "output 0");
  withReal(x, "input 0 (x)", [&](auto z) {
    using R = decltype(z);
    cpu::linear_forward<R>(y.as<R>(), x.as<R>(), w.as<R>(), b ? b->as<R>() : nullptr, N, in, out);
  });
}

void run_patch_embed(const Instr& in, StepCtx& c) { run_linear(in, c); }

void run_layernorm(const Instr&, StepCtx& c) {
  const Tensor &x = c.in(0), &w = c.in(1), &b = c.in(2), &y = c.out(0);  // x [..., H], w, b [H]
  const int64_t R = x.rows(), H = x.last();
  requireNumel(w, H, "input 1 (weight)");
  requireNumel(b, H, "input 2 (bias)");
  requireDType(w, x.dtype, "input 1 (weight)");
  requireDType(b, x.dtype, "input 2 (bias)");
  requireOut(y, x.dtype, x.numel, "output 0");
  withReal(x, "input 0 (x)", [&](auto z) {
    using Real = decltype(z);
    Real* mean = c.scratch().get<Real>(0, R);
    Real* rstd = c.scratch().get<Real>(1, R);
    cpu::layernorm_forward<Real>(y.as<Real>(), mean, rstd, x.as<Real>(), w.as<Real>(), b.as<Real>(), R, H,
                                 c.num("eps"));
  });
}

void run_rmsnorm(const Instr&, StepCtx& c) {
  const Tensor &x = c.in(0), &w = c.in(1), &y = c.out(0);  // x [..., H], w [H]
  const int64_t R = x.rows(), H = x.last();
  requireNumel(w, H, "input 1 (weight)");
  requireDType(w, x.dtype, "input 1 (weight)");
  requireOut(y, x.dtype, x.numel, "output 0");
  withReal(x, "input 0 (x)", [&](auto z) {
    using Real = decltype(z);
    Real* rstd = c.scratch().get<Real>(0, R);
    cpu::rmsnorm_forward<Real>(y.as<Real>(), rstd, x.as<Real>(), w.as<Real>(), R, H, c.num("eps"));
  });
}

void run_rope(const Instr&, StepCtx& c) {
  const Tensor &x = c.in(0), &pos = c.in(1), &y = c.out(0);  // x [T, nh, d], positions [T] or [T, P]
  requireRank(x, 3, "input 0 (x)");
  requireOut(y, x.dtype, x.numel, "output 0");
  const RopeArgs r = ropeArgs(c, x, pos);
  withReal(x, "input 0 (x)", [&](auto z) {
    using Real = decltype(z);
    cpu::rope_forward<Real>(y.as<Real>(), x.as<Real>(), pos.as<int32_t>(), r.sections.data(), r.P,
                            x.dim(0), x.dim(1), x.dim(2), c.num("theta"));
  });
}

void run_attention(const Instr&, StepCtx& c) {
  // q [T, nh, d], k, v [T, nkv, d], segments [T] → out [T, nh, d], lse [T, nh]
  const Tensor &q = c.in(0), &k = c.in(1), &v = c.in(2), &seg = c.in(3);
  const Tensor &out = c.out(0), &lse = c.out(1);
  const AttnArgs a = attnArgs(q, k, v, seg);
  requireOut(out, q.dtype, q.numel, "output 0 (out)");
  requireOut(lse, q.dtype, a.T * a.nh, "output 1 (lse)");
  withReal(q, "input 0 (q)", [&](auto z) {
    using Real = decltype(z);
    cpu::attention_forward<Real>(out.as<Real>(), lse.as<Real>(), q.as<Real>(), k.as<Real>(), v.as<Real>(),
                                 seg.as<int32_t>(), a.T, a.nh, a.nkv, a.d, c.num("scale"), c.flag("causal"));
  });
}

void run_gelu(const Instr&, StepCtx& c) {
  const Tensor &x = c.in(0), &y = c.out(0);
  requireOut(y, x.dtype, x.numel, "output 0");
  withReal(x, "input 0 (x)", [&](auto z) {
    using Real = decltype(z);
    cpu::gelu_forward<Real>(y.as<Real>(), x.as<Real>(), x.numel);
  });
}

void run_swiglu(const Instr&, StepCtx& c) {
  const Tensor &gate = c.in(0), &up = c.in(1), &y = c.out(0);  // gate, up [..., F]
  requireSame(up, gate, "input 1 (up)");
  requireOut(y, gate.dtype, gate.numel, "output 0");
  withReal(gate, "input 0 (gate)", [&](auto z) {
    using Real = decltype(z);
    cpu::swiglu_forward<Real>(y.as<Real>(), gate.as<Real>(), up.as<Real>(), gate.numel);
  });
}

void run_add(const Instr&, StepCtx& c) {
  const Tensor &a = c.in(0), &b = c.in(1), &y = c.out(0);
  requireSame(b, a, "input 1 (b)");
  requireOut(y, a.dtype, a.numel, "output 0");
  withReal(a, "input 0 (a)", [&](auto z) {
    using Real = decltype(z);
    cpu::add_forward<Real>(y.as<Real>(), a.as<Real>(), b.as<Real>(), a.numel);
  });
}

void run_merge_visual(const Instr&, StepCtx& c) {
  // text [T, H], visual [Nv, H], tokens [T] → [T, H]
  const Tensor &text = c.in(0), &vis = c.in(1), &tokens = c.in(2), &y = c.out(0);
  requireRank(text, 2, "input 0 (text)");
  requireRank(vis, 2, "input 1 (visual)");
  requireDType(tokens, DType::i32, "input 2 (tokens)");
  const int64_t T = text.dim(0), H = text.dim(1), Nv = vis.dim(0);
  requireNumel(tokens, T, "input 2 (tokens)");
  requireDim(vis.dim(1), H, "visual hidden vs text hidden");
  requireDType(vis, text.dtype, "input 1 (visual)");
  requireOut(y, text.dtype, text.numel, "output 0");
  const cpu::MergeMode mode = mergeMode(c);
  withReal(text, "input 0 (text)", [&](auto z) {
    using Real = decltype(z);
    cpu::merge_visual_forward<Real>(y.as<Real>(), text.as<Real>(), vis.as<Real>(), tokens.as<int32_t>(),
                                    int32_t(c.integer("placeholder")), mode, T, Nv, H);
  });
}

void run_router_topk(const Instr&, StepCtx& c) {
  // logits [T, E] → probs [T, E], weights [T, k], experts i32 [T, k]
  const Tensor &logits = c.in(0), &probs = c.out(0), &weights = c.out(1), &experts = c.out(2);
  requireRank(logits, 2, "input 0 (logits)");
  const int64_t T = logits.dim(0), E = logits.dim(1), k = c.integer("k");
  requireOut(probs, logits.dtype, T * E, "output 0 (probs)");
  requireOut(weights, logits.dtype, T * k, "output 1 (weights)");
  requireOut(experts, DType::i32, T * k, "output 2 (experts)");
  withReal(logits, "input 0 (logits)", [&](auto z) {
    using Real = decltype(z);
    cpu::router_topk_forward<Real>(probs.as<Real>(), weights.as<Real>(), experts.as<int32_t>(),
                                   logits.as<Real>(), T, E, k);
  });
}

void run_moe_permute(const Instr&, StepCtx& c) {
  // x [T, H], experts [T, k] → rows [N, H], counts i32 [E], row_of i32 [T·k]; N = T·k, or with
  // capacity the bounded out_rows dim (the kernel checks the kept rows fit)
  const Tensor &x = c.in(0), &experts = c.in(1);
  const Tensor &rows = c.out(0), &counts = c.out(1), &rowOf = c.out(2);
  requireRank(x, 2, "input 0 (x)");
  requireRank(experts, 2, "input 1 (experts)");
  requireDType(experts, DType::i32, "input 1 (experts)");
  const int64_t T = x.dim(0), H = x.dim(1), k = experts.dim(1), E = c.integer("num_experts");
  const int64_t capacity = c.has("capacity") ? c.integer("capacity") : -1;
  requireDim(experts.dim(0), T, "experts vs tokens");
  const int64_t N = capacity < 0 ? T * k : rows.rows();
  requireOut(rows, x.dtype, N * H, "output 0 (rows)");
  requireOut(counts, DType::i32, E, "output 1 (counts)");
  requireOut(rowOf, DType::i32, T * k, "output 2 (row_of)");
  // drop policy probs: the routing weights [T, k] rank an expert's assignments
  const Tensor* weights = c.numIn() > 2 ? &c.in(2) : nullptr;
  const bool probs = c.has("drop_policy") && c.str("drop_policy") == "probs";
  if (probs != (weights != nullptr))
    throw OpError(probs ? "drop_policy probs needs the routing weights (input 2)"
                        : "input 2 (weights) is only for drop_policy probs");
  if (weights) {
    requireDType(*weights, x.dtype, "input 2 (weights)");
    requireNumel(*weights, T * k, "input 2 (weights)");
  }
  withReal(x, "input 0 (x)", [&](auto z) {
    using Real = decltype(z);
    cpu::moe_permute_forward<Real>(rows.as<Real>(), counts.as<int32_t>(), rowOf.as<int32_t>(), x.as<Real>(),
                                   experts.as<int32_t>(), T, H, k, E, N, capacity,
                                   weights ? weights->as<Real>() : nullptr);
  });
}

void run_grouped_linear(const Instr&, StepCtx& c) {
  // x [N, in], counts i32 [E], W_0 … W_{E−1} [out, in] → [N, out]
  const Tensor &x = c.in(0), &counts = c.in(1), &y = c.out(0);
  const GroupedArgs g = groupedArgs(c, x, counts, 2);
  requireOut(y, x.dtype, g.N * g.out, "output 0");
  withReal(x, "input 0 (x)", [&](auto z) {
    using Real = decltype(z);
    std::vector<const Real*> w = weightPointers<Real>(c, 2);
    cpu::grouped_linear_forward<Real>(y.as<Real>(), x.as<Real>(), counts.as<int32_t>(), w.data(), g.E, g.N,
                                      g.in, g.out);
  });
}

void run_moe_unpermute(const Instr&, StepCtx& c) {
  // rows [N, H], row_of i32 [T·k], weights [T, k] → [T, H]
  const Tensor &rows = c.in(0), &rowOf = c.in(1), &w = c.in(2), &y = c.out(0);
  requireRank(rows, 2, "input 0 (rows)");
  requireRank(w, 2, "input 2 (weights)");
  requireDType(rowOf, DType::i32, "input 1 (row_of)");
  const int64_t N = rows.dim(0), H = rows.dim(1), T = w.dim(0), k = w.dim(1);
  requireNumel(rowOf, T * k, "input 1 (row_of)");
  requireDType(w, rows.dtype, "input 2 (weights)");
  requireOut(y, rows.dtype, T * H, "output 0");
  withReal(rows, "input 0 (rows)", [&](auto z) {
    using Real = decltype(z);
    cpu::moe_unpermute_forward<Real>(y.as<Real>(), rows.as<Real>(), rowOf.as<int32_t>(), w.as<Real>(), T, k,
                                     N, H);
  });
}

void run_moe_aux_loss(const Instr&, StepCtx& c) {
  // probs [T, E], experts i32 [T, k], segments i32 [T] → scalar
  const Tensor &probs = c.in(0), &experts = c.in(1), &seg = c.in(2), &y = c.out(0);
  const AuxArgs a = auxArgs(probs, experts, seg);
  withReal(probs, "input 0 (probs)", [&](auto z) {
    using Real = decltype(z);
    const Real loss = cpu::moe_aux_loss_forward<Real>(probs.as<Real>(), experts.as<int32_t>(),
                                                      seg.as<int32_t>(), a.T, a.E, a.k, c.num("coeff"));
    setScalarValue(y, double(loss), "output 0");
  });
}

void run_cross_entropy(const Instr&, StepCtx& c) {
  // logits [T, V], labels i32 [T], mask u8 [T], loss_tokens [] → scalar
  const Tensor &logits = c.in(0), &labels = c.in(1), &mask = c.in(2), &count = c.in(3), &y = c.out(0);
  const CeArgs a = ceArgs(logits, labels, mask);
  const double lossTokens = scalarValue(count, "input 3 (loss_tokens)");
  withReal(logits, "input 0 (logits)", [&](auto z) {
    using Real = decltype(z);
    Real* lse = c.scratch().get<Real>(0, a.T);
    const Real loss = cpu::cross_entropy_forward<Real>(lse, logits.as<Real>(), labels.as<int32_t>(),
                                                       mask.as<uint8_t>(), lossTokens, a.T, a.V);
    setScalarValue(y, double(loss), "output 0");
  });
}

// ---- vocab-parallel cross-entropy pieces -----------------------------------------------------

void run_vocab_logsumexp(const Instr&, StepCtx& c) {
  const Tensor &logits = c.in(0), &lse = c.out(0);  // logits [T, Vl] → [T]
  requireRank(logits, 2, "input 0 (logits)");
  const int64_t T = logits.dim(0), V = logits.dim(1);
  requireOut(lse, logits.dtype, T, "output 0 (lse)");
  withReal(logits, "input 0 (logits)", [&](auto z) {
    using Real = decltype(z);
    cpu::vocab_logsumexp_forward<Real>(lse.as<Real>(), logits.as<Real>(), T, V);
  });
}

void run_lse_combine(const Instr&, StepCtx& c) {
  const Tensor &x = c.in(0), &y = c.out(0);  // x [P, T] → [T]
  requireRank(x, 2, "input 0 (x)");
  const int64_t P = x.dim(0), T = x.dim(1);
  requireOut(y, x.dtype, T, "output 0");
  withReal(x, "input 0 (x)", [&](auto z) {
    using Real = decltype(z);
    cpu::lse_combine_forward<Real>(y.as<Real>(), x.as<Real>(), P, T);
  });
}

void run_vocab_target_logit(const Instr&, StepCtx& c) {
  // logits [T, Vl], labels i32 [T], mask? u8 [T] → [T]
  const Tensor &logits = c.in(0), &labels = c.in(1), &y = c.out(0);
  const TargetArgs a = targetArgs(c, logits, labels);
  requireOut(y, logits.dtype, a.T, "output 0");
  withReal(logits, "input 0 (logits)", [&](auto z) {
    using Real = decltype(z);
    cpu::vocab_target_logit_forward<Real>(y.as<Real>(), logits.as<Real>(), labels.as<int32_t>(), a.mask, a.T,
                                          a.V, a.shard.rank * a.V, a.shard.size * a.V);
  });
}

void run_ce_from_stats(const Instr&, StepCtx& c) {
  // lse [T], target [T], mask u8 [T], loss_tokens [] → scalar
  const Tensor &lse = c.in(0), &target = c.in(1), &mask = c.in(2), &y = c.out(0);
  const int64_t T = lse.numel;
  requireSame(target, lse, "input 1 (target)");
  requireDType(mask, DType::u8, "input 2 (mask)");
  requireNumel(mask, T, "input 2 (mask)");
  const double lossTokens = scalarValue(c.in(3), "input 3 (loss_tokens)");
  withReal(lse, "input 0 (lse)", [&](auto z) {
    using Real = decltype(z);
    const Real loss =
        cpu::ce_from_stats_forward<Real>(lse.as<Real>(), target.as<Real>(), mask.as<uint8_t>(), lossTokens, T);
    setScalarValue(y, double(loss), "output 0");
  });
}

// ---- expert parallelism ------------------------------------------------------------------------

void run_moe_rank_counts(const Instr&, StepCtx& c) {
  const Tensor &counts = c.in(0), &y = c.out(0);  // counts i32 [E] → i32 [P]
  requireDType(counts, DType::i32, "input 0 (counts)");
  const int64_t E = counts.numel, P = c.integer("group_size");
  if (P < 1 || E % P != 0) throw OpError(cat(E, " experts are not a multiple of group_size ", P));
  requireOut(y, DType::i32, P, "output 0");
  cpu::moe_rank_counts(y.as<int32_t>(), counts.as<int32_t>(), E, P);
}

void run_moe_sort_chunks(const Instr&, StepCtx& c) {
  // rows [N, H], counts i32 [P, L] → [N, H]
  const Tensor &rows = c.in(0), &counts = c.in(1), &y = c.out(0);
  requireRank(rows, 2, "input 0 (rows)");
  requireRank(counts, 2, "input 1 (counts)");
  requireDType(counts, DType::i32, "input 1 (counts)");
  requireOut(y, rows.dtype, rows.numel, "output 0");
  withReal(rows, "input 0 (rows)", [&](auto z) {
    using Real = decltype(z);
    cpu::moe_sort_chunks<Real>(y.as<Real>(), rows.as<Real>(), counts.as<int32_t>(), counts.dim(0), counts.dim(1),
                               rows.dim(0), rows.dim(1), c.flag("inverse"));
  });
}

void run_moe_local_counts(const Instr&, StepCtx& c) {
  const Tensor &counts = c.in(0), &y = c.out(0);  // counts i32 [P, L] → i32 [L]
  requireRank(counts, 2, "input 0 (counts)");
  requireDType(counts, DType::i32, "input 0 (counts)");
  requireOut(y, DType::i32, counts.dim(1), "output 0");
  cpu::moe_local_counts(y.as<int32_t>(), counts.as<int32_t>(), counts.dim(0), counts.dim(1));
}

}  // namespace lfc::ops
