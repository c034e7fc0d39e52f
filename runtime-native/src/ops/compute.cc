// Forward compute ops → the kernels' entry points (kernels/cpu). Shapes in the comments use the
// letters of ir/ops.ts. Float operands are checked to be float, not to share a dtype: each may be
// f32 or bf16 (or every one f64), and each output is written in its own buffer's dtype.
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

void run_embedding(const Instr&, StepCtx& c) {
  // ids [T], table [V, H] → [T, H]; or ids [T, K], table, weights [T, K] → Σ_k weights·table[ids]
  const Tensor &ids = c.in(0), &table = c.in(1), &y = c.out(0);
  requireDType(ids, DType::i32, "input 0 (ids)");
  requireRank(table, 2, "input 1 (table)");
  requireFloat(table, "input 1 (table)");
  const int64_t V = table.dim(0), H = table.dim(1);
  if (c.numIn() > 2) {
    const Tensor& w = c.in(2);
    const int64_t T = y.rows(), K = ids.numel / std::max<int64_t>(T, 1);
    requireNumel(ids, T * K, "input 0 (ids)");
    requireFloat(w, T * K, "input 2 (weights)");
    requireFloat(y, T * H, "output 0");
    cpu::embedding_bag_forward(dst(y), ids.as<int32_t>(), src(w), src(table), T, K, V, H);
    return;
  }
  const int64_t T = ids.numel;
  requireFloat(y, T * H, "output 0");
  if (const std::optional<GroupPos> shard = vocabShard(c))  // this rank's rows [r·V, (r+1)·V) of P·V
    cpu::embedding_shard_forward(dst(y), ids.as<int32_t>(), src(table), T, V, H, shard->rank * V, shard->size * V);
  else
    cpu::embedding_forward(dst(y), ids.as<int32_t>(), src(table), T, V, H);
}

void run_linear(const Instr&, StepCtx& c) {
  // x [..., in], W [out, in], b? [out] → [..., out]
  const Tensor &x = c.in(0), &w = c.in(1), &y = c.out(0);
  const Tensor* b = c.numIn() > 2 ? &c.in(2) : nullptr;
  requireRank(w, 2, "input 1 (weight)");
  const int64_t N = x.rows(), in = x.last(), out = w.dim(0);
  requireDim(w.dim(1), in, "weight in-features vs last dim of x");
  requireFloat(x, "input 0 (x)");
  requireFloat(w, "input 1 (weight)");
  if (b) requireFloat(*b, out, "input 2 (bias)");
  requireFloat(y, N * out, "output 0");
  cpu::linear_forward(dst(y), src(x), src(w), b ? src(*b) : cpu::Src{}, N, in, out);
}

void run_patch_embed(const Instr& in, StepCtx& c) { run_linear(in, c); }

void run_layernorm(const Instr&, StepCtx& c) {
  const Tensor &x = c.in(0), &w = c.in(1), &b = c.in(2), &y = c.out(0);  // x [..., H], w, b [H]
  const int64_t R = x.rows(), H = x.last();
  requireFloat(x, "input 0 (x)");
  requireFloat(w, H, "input 1 (weight)");
  requireFloat(b, H, "input 2 (bias)");
  requireFloat(y, x.numel, "output 0");
  const DType acc = computeDType(x);
  cpu::layernorm_forward(dst(y), scratchOf(c, R, acc), scratchOf(c, R, acc), src(x),
                         src(w), src(b), R, H, c.num("eps"));
}

void run_rmsnorm(const Instr&, StepCtx& c) {
  const Tensor &x = c.in(0), &w = c.in(1), &y = c.out(0);  // x [..., H], w [H]
  const int64_t R = x.rows(), H = x.last();
  requireFloat(x, "input 0 (x)");
  requireFloat(w, H, "input 1 (weight)");
  requireFloat(y, x.numel, "output 0");
  cpu::rmsnorm_forward(dst(y), scratchOf(c, R, computeDType(x)), src(x), src(w), R, H, c.num("eps"));
}

void run_rope(const Instr&, StepCtx& c) {
  const Tensor &x = c.in(0), &pos = c.in(1), &y = c.out(0);  // x [T, nh, d], positions [T] or [T, P]
  requireRank(x, 3, "input 0 (x)");
  requireFloat(x, "input 0 (x)");
  requireFloat(y, x.numel, "output 0");
  const RopeArgs r = ropeArgs(c, x, pos);
  cpu::rope_forward(dst(y), src(x), pos.as<int32_t>(), r.sections.data(), r.P, x.dim(0), x.dim(1), x.dim(2),
                    c.num("theta"), r.layout);
}

void run_attention(const Instr&, StepCtx& c) {
  // q [T, nh, d], k, v [T, nkv, d], segments [T] → out [T, nh, d], lse [T, nh]
  const Tensor &q = c.in(0), &k = c.in(1), &v = c.in(2), &seg = c.in(3);
  const Tensor &out = c.out(0), &lse = c.out(1);
  const AttnArgs a = attnArgs(q, k, v, seg);
  requireFloat(out, q.numel, "output 0 (out)");
  requireFloat(lse, a.T * a.nh, "output 1 (lse)");
  cpu::attention_forward(dst(out), dst(lse), src(q), src(k), src(v), seg.as<int32_t>(), a.T, a.nh, a.nkv, a.d,
                         c.num("scale"), c.flag("causal"));
}

void run_gelu(const Instr&, StepCtx& c) {
  const Tensor &x = c.in(0), &y = c.out(0);
  requireFloat(x, "input 0 (x)");
  requireFloat(y, x.numel, "output 0");
  if (c.has("exact") && c.flag("exact")) cpu::gelu_exact_forward(dst(y), src(x), x.numel);
  else cpu::gelu_forward(dst(y), src(x), x.numel);
}

void run_swiglu(const Instr&, StepCtx& c) {
  const Tensor &gate = c.in(0), &up = c.in(1), &y = c.out(0);  // gate, up [..., F]
  requireFloat(gate, "input 0 (gate)");
  requireFloat(up, gate.numel, "input 1 (up)");
  requireFloat(y, gate.numel, "output 0");
  cpu::swiglu_forward(dst(y), src(gate), src(up), gate.numel);
}

void run_add(const Instr&, StepCtx& c) {
  const Tensor &a = c.in(0), &b = c.in(1), &y = c.out(0);
  requireFloat(a, "input 0 (a)");
  requireFloat(b, a.numel, "input 1 (b)");
  requireFloat(y, a.numel, "output 0");
  cpu::add_forward(dst(y), src(a), src(b), a.numel);
}

void run_merge_visual(const Instr&, StepCtx& c) {
  // text [T, H], visual [Nv, H], tokens [T], image_token_id [] → [T, H]
  const Tensor &text = c.in(0), &vis = c.in(1), &tokens = c.in(2), &y = c.out(0);
  requireRank(text, 2, "input 0 (text)");
  requireRank(vis, 2, "input 1 (visual)");
  requireDType(tokens, DType::i32, "input 2 (tokens)");
  const int64_t T = text.dim(0), H = text.dim(1), Nv = vis.dim(0);
  requireNumel(tokens, T, "input 2 (tokens)");
  requireDim(vis.dim(1), H, "visual hidden vs text hidden");
  requireFloat(text, "input 0 (text)");
  requireFloat(vis, "input 1 (visual)");
  requireFloat(y, text.numel, "output 0");
  cpu::merge_visual_forward(dst(y), src(text), src(vis), tokens.as<int32_t>(), imageTokenId(c.in(3), "input 3"),
                            mergeMode(c), T, Nv, H);
}

void run_router_topk(const Instr&, StepCtx& c) {
  // logits [T, E] → probs [T, E], weights [T, k], experts i32 [T, k]
  const Tensor &logits = c.in(0), &probs = c.out(0), &weights = c.out(1), &experts = c.out(2);
  requireRank(logits, 2, "input 0 (logits)");
  requireFloat(logits, "input 0 (logits)");
  const int64_t T = logits.dim(0), E = logits.dim(1), k = c.integer("k");
  requireFloat(probs, T * E, "output 0 (probs)");
  requireFloat(weights, T * k, "output 1 (weights)");
  requireOut(experts, DType::i32, T * k, "output 2 (experts)");
  cpu::router_topk_forward(dst(probs), dst(weights), experts.as<int32_t>(), src(logits), T, E, k, normalizeTopk(c));
}

void run_moe_permute(const Instr&, StepCtx& c) {
  // x [T, H], experts [T, k] → rows [N, H], counts i32 [E], row_of i32 [T·k]; N = T·k, or with
  // capacity the bounded out_rows dim (the kernel checks the kept rows fit)
  const Tensor &x = c.in(0), &experts = c.in(1);
  const Tensor &rows = c.out(0), &counts = c.out(1), &rowOf = c.out(2);
  requireRank(x, 2, "input 0 (x)");
  requireFloat(x, "input 0 (x)");
  requireRank(experts, 2, "input 1 (experts)");
  requireDType(experts, DType::i32, "input 1 (experts)");
  const int64_t T = x.dim(0), H = x.dim(1), k = experts.dim(1), E = c.integer("num_experts");
  const int64_t capacity = c.has("capacity") ? c.integer("capacity") : -1;
  requireDim(experts.dim(0), T, "experts vs tokens");
  const int64_t N = capacity < 0 ? T * k : rows.rows();
  requireFloat(rows, N * H, "output 0 (rows)");
  requireOut(counts, DType::i32, E, "output 1 (counts)");
  requireOut(rowOf, DType::i32, T * k, "output 2 (row_of)");
  // drop policy probs: the routing weights [T, k] rank an expert's assignments
  const Tensor* weights = c.numIn() > 2 ? &c.in(2) : nullptr;
  const bool probs = c.has("drop_policy") && c.str("drop_policy") == "probs";
  if (probs != (weights != nullptr))
    throw OpError(probs ? "drop_policy probs needs the routing weights (input 2)"
                        : "input 2 (weights) is only for drop_policy probs");
  if (weights) requireFloat(*weights, T * k, "input 2 (weights)");
  cpu::moe_permute_forward(dst(rows), counts.as<int32_t>(), rowOf.as<int32_t>(), src(x), experts.as<int32_t>(), T,
                           H, k, E, N, capacity, weights ? src(*weights) : cpu::Src{});
}

void run_grouped_linear(const Instr&, StepCtx& c) {
  // x [N, in], counts i32 [E], W_0 … W_{E−1} [out, in] → [N, out]
  const Tensor &x = c.in(0), &counts = c.in(1), &y = c.out(0);
  const GroupedArgs g = groupedArgs(c, x, counts, 2);
  requireFloat(y, g.N * g.out, "output 0");
  cpu::grouped_linear_forward(dst(y), src(x), counts.as<int32_t>(), weightSrcs(c, 2), g.N, g.in, g.out);
}

void run_moe_unpermute(const Instr&, StepCtx& c) {
  // rows [N, H], row_of i32 [T·k], weights [T, k] → [T, H]
  const Tensor &rows = c.in(0), &rowOf = c.in(1), &w = c.in(2), &y = c.out(0);
  requireRank(rows, 2, "input 0 (rows)");
  requireRank(w, 2, "input 2 (weights)");
  requireDType(rowOf, DType::i32, "input 1 (row_of)");
  const int64_t N = rows.dim(0), H = rows.dim(1), T = w.dim(0), k = w.dim(1);
  requireNumel(rowOf, T * k, "input 1 (row_of)");
  requireFloat(rows, "input 0 (rows)");
  requireFloat(w, "input 2 (weights)");
  requireFloat(y, T * H, "output 0");
  cpu::moe_unpermute_forward(dst(y), src(rows), rowOf.as<int32_t>(), src(w), T, k, N, H);
}

void run_moe_aux_loss(const Instr&, StepCtx& c) {
  // probs [T, E], experts i32 [T, k], segments i32 [T] → scalar
  const Tensor &probs = c.in(0), &experts = c.in(1), &seg = c.in(2), &y = c.out(0);
  const AuxArgs a = auxArgs(probs, experts, seg);
  const double loss = cpu::moe_aux_loss_forward(src(probs), experts.as<int32_t>(), seg.as<int32_t>(), a.T, a.E, a.k,
                                                c.num("coeff"));
  setScalarValue(y, loss, "output 0");
}

void run_cross_entropy(const Instr&, StepCtx& c) {
  // logits [T, V], labels i32 [T], mask u8 [T], loss_tokens [] → scalar
  const Tensor &logits = c.in(0), &labels = c.in(1), &mask = c.in(2), &count = c.in(3), &y = c.out(0);
  const CeArgs a = ceArgs(logits, labels, mask);
  const double lossTokens = scalarValue(count, "input 3 (loss_tokens)");
  const double loss =
      cpu::cross_entropy_forward(scratchOf(c, a.T, computeDType(logits)), src(logits),
                                 labels.as<int32_t>(), mask.as<uint8_t>(), lossTokens, a.T, a.V);
  setScalarValue(y, loss, "output 0");
}

// ---- vocab-parallel cross-entropy pieces -----------------------------------------------------

void run_vocab_logsumexp(const Instr&, StepCtx& c) {
  const Tensor &logits = c.in(0), &lse = c.out(0);  // logits [T, Vl] → [T]
  requireRank(logits, 2, "input 0 (logits)");
  requireFloat(logits, "input 0 (logits)");
  const int64_t T = logits.dim(0), V = logits.dim(1);
  requireFloat(lse, T, "output 0 (lse)");
  cpu::vocab_logsumexp_forward(dst(lse), src(logits), T, V);
}

void run_lse_combine(const Instr&, StepCtx& c) {
  const Tensor &x = c.in(0), &y = c.out(0);  // x [P, T] → [T]
  requireRank(x, 2, "input 0 (x)");
  requireFloat(x, "input 0 (x)");
  const int64_t P = x.dim(0), T = x.dim(1);
  requireFloat(y, T, "output 0");
  cpu::lse_combine_forward(dst(y), src(x), P, T);
}

void run_vocab_target_logit(const Instr&, StepCtx& c) {
  // logits [T, Vl], labels i32 [T], mask? u8 [T] → [T]
  const Tensor &logits = c.in(0), &labels = c.in(1), &y = c.out(0);
  const TargetArgs a = targetArgs(c, logits, labels);
  requireFloat(logits, "input 0 (logits)");
  requireFloat(y, a.T, "output 0");
  cpu::vocab_target_logit_forward(dst(y), src(logits), labels.as<int32_t>(), a.mask, a.T, a.V, a.shard.rank * a.V,
                                  a.shard.size * a.V);
}

void run_ce_from_stats(const Instr&, StepCtx& c) {
  // lse [T], target [T], mask u8 [T], loss_tokens [] → scalar
  const Tensor &lse = c.in(0), &target = c.in(1), &mask = c.in(2), &y = c.out(0);
  const int64_t T = lse.numel;
  requireFloat(lse, "input 0 (lse)");
  requireFloat(target, T, "input 1 (target)");
  requireDType(mask, DType::u8, "input 2 (mask)");
  requireNumel(mask, T, "input 2 (mask)");
  const double lossTokens = scalarValue(c.in(3), "input 3 (loss_tokens)");
  setScalarValue(y, cpu::ce_from_stats_forward(src(lse), src(target), mask.as<uint8_t>(), lossTokens, T), "output 0");
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
  requireFloat(rows, "input 0 (rows)");
  requireFloat(y, rows.numel, "output 0");
  cpu::moe_sort_chunks(dst(y), src(rows), counts.as<int32_t>(), counts.dim(0), counts.dim(1), rows.dim(0),
                       rows.dim(1), c.flag("inverse"));
}

void run_moe_local_counts(const Instr&, StepCtx& c) {
  const Tensor &counts = c.in(0), &y = c.out(0);  // counts i32 [P, L] → i32 [L]
  requireRank(counts, 2, "input 0 (counts)");
  requireDType(counts, DType::i32, "input 0 (counts)");
  requireOut(y, DType::i32, counts.dim(1), "output 0");
  cpu::moe_local_counts(y.as<int32_t>(), counts.as<int32_t>(), counts.dim(0), counts.dim(1));
}

}  // namespace lfc::ops
