// The gradient table: one entry per op kind (exhaustive by type), read by passes/autodiff.ts.
// A rule receives the forward node, the gradients of its outputs and which inputs need one, and
// emits backward nodes through the builder; it returns one gradient (or undefined) per input.
// Weight ops split their backward into dgrad (inputs) and wgrad (weights) nodes, so a schedule
// can delay weight gradients. The tensor/expert-parallel passes run before autodiff (Megatron
// style), so the collectives and region boundaries they place have conjugate rules here:
// copy_to_group ↔ all_reduce, group_slice ↔ all_gather(grad slice), all_gather ↔ reduce_scatter,
// all_to_all_v ↔ all_to_all_v with the received counts, all_gather_v ↔ reduce_scatter_v.

import type { GraphBuilder, Node } from '../ir/graph.js';
import type { DType } from '../ir/dtype.js';
import type { OpKind } from '../ir/ops.js';
import { formatDim } from '../ir/shape.js';
import type { Attrs, TensorType } from '../ir/types.js';

export interface GradCtx {
  readonly b: GraphBuilder;
  readonly node: Node;
  /** gradient of output i; undefined when nothing downstream needs it */
  dOut(i: number): string | undefined;
  /** gradient of output i, or zeros of its type when none flows */
  dOutOrZero(i: number): string;
  /** whether input i needs a gradient */
  needs(i: number): boolean;
  /**
   * the element type input i's gradient must have: a trainable parameter's is the main-gradient
   * type (fp32 under bf16, as Megatron's main_grad), anything else's its own type
   */
  gradType(i: number): DType;
}

export type GradRule = (c: GradCtx) => (string | undefined)[];

export type GradEntry =
  | { readonly kind: 'rule'; readonly rule: GradRule }
  | { readonly kind: 'none'; readonly why: string };

const none = (why: string): GradEntry => ({ kind: 'none', why });
const rule = (r: GradRule): GradEntry => ({ kind: 'rule', rule: r });

const BACKWARD = 'a backward op; lfc does not differentiate twice';
const AFTER_AUTODIFF = 'inserted by the parallel passes after autodiff, each with its own backward';
const STEP = 'part of the optimizer step, after the backward pass';
const INTEGER = 'integer outputs carry no gradient';

export function zerosLike(b: GraphBuilder, t: TensorType): string {
  return b.op1('constant', [], { value: 0, dtype: t.dtype, shape: t.shape.map(formatDim) });
}

/** attrs with `key: want` added where want is not the type the op would give anyway */
function typed(attrs: Attrs, key: 'dtype' | 'grad_dtype', want: DType, otherwise: DType): Attrs {
  return want === otherwise ? attrs : { ...attrs, [key]: want };
}

function weightOp(c: GradCtx): (string | undefined)[] {
  const { b, node } = c;
  const [x, w, bias] = node.inputs;
  const dy = c.dOut(0)!;
  const dyType = b.typeOf(dy).dtype;
  const dx = c.needs(0)
    ? b.op1('linear_dgrad', [dy, w], typed({}, 'dtype', c.gradType(0), dyType))
    : undefined;
  if (!c.needs(1) && !(bias && c.needs(2))) return [dx];
  const attrs = typed({ bias: bias !== undefined }, 'grad_dtype', c.gradType(1), dyType);
  const [dw, db] = b.op('linear_wgrad', [dy, x], attrs);
  return [dx, dw, db];
}

/** a norm's backward, its weight gradients in the main-gradient type */
function normGrad(c: GradCtx, op: 'layernorm_grad' | 'rmsnorm_grad'): string[] {
  const [x, w] = c.node.inputs;
  const attrs = typed(c.node.attrs, 'grad_dtype', c.gradType(1), c.b.typeOf(w).dtype);
  return c.b.op(op, [c.dOut(0)!, x, w], attrs);
}

export const GRAD_RULES = {
  embedding: rule((c) => {
    const dy = c.dOut(0)!;
    const attrs = { rows: rowsOf(c, 1), ...pick(c.node.attrs, 'shard_group', 'group_size') };
    const typedAttrs = typed(attrs, 'grad_dtype', c.gradType(1), c.b.typeOf(dy).dtype);
    // the weighted bag (an interpolated position table) scales each row's gradient by its weight
    const [ids, , weights] = c.node.inputs;
    const args = weights === undefined ? [dy, ids] : [dy, ids, weights];
    return [undefined, c.b.op1('embedding_grad', args, typedAttrs)];
  }),
  patch_embed: rule(weightOp),
  linear: rule(weightOp),
  layernorm: rule((c) => normGrad(c, 'layernorm_grad')),
  rmsnorm: rule((c) => normGrad(c, 'rmsnorm_grad')),
  rope: rule((c) => [c.b.op1('rope_grad', [c.dOut(0)!, c.node.inputs[1]], c.node.attrs)]),
  attention: rule((c) => {
    const [out, lse] = c.node.outputs.map((o) => o.name);
    return c.b.op('attention_grad', [c.dOut(0)!, ...c.node.inputs, out, lse], c.node.attrs);
  }),
  gelu: rule((c) => [c.b.op1('gelu_grad', [c.dOut(0)!, c.node.inputs[0]], c.node.attrs)]),
  swiglu: rule((c) => c.b.op('swiglu_grad', [c.dOut(0)!, ...c.node.inputs])),
  add: rule((c) => [c.dOut(0), c.dOut(0)]),
  merge_visual: rule((c) => {
    const [, vis, tokens, placeholder] = c.node.inputs;
    const rows = c.b.typeOf(vis).shape[0];
    const [dtext, dvis] = c.b.op('merge_visual_grad', [c.dOut(0)!, tokens, placeholder], {
      ...c.node.attrs,
      visual_rows: [formatDim(rows)],
    });
    return [dtext, c.needs(1) ? dvis : undefined];
  }),
  router_topk: rule((c) => {
    const [probs, , experts] = c.node.outputs.map((o) => o.name);
    const attrs = pick(c.node.attrs, 'normalize');
    return [c.b.op1('router_topk_grad', [c.dOutOrZero(0), c.dOutOrZero(1), probs, experts], attrs)];
  }),
  moe_permute: rule((c) => {
    const k = c.b.typeOf(c.node.inputs[1]).shape[1] as number;
    return [c.b.op1('moe_permute_grad', [c.dOut(0)!, c.node.outputs[2].name], { k })];
  }),
  grouped_linear: rule((c) => {
    const [x, counts, ...ws] = c.node.inputs;
    const dy = c.dOut(0)!;
    const dx = c.needs(0) ? c.b.op1('grouped_linear_dgrad', [dy, counts, ...ws]) : undefined;
    const wantW = ws.some((_, i) => c.needs(i + 2));
    const attrs = typed({}, 'grad_dtype', c.gradType(2), c.b.typeOf(dy).dtype);
    const dws = wantW
      ? c.b.op('grouped_linear_wgrad', [dy, x, counts], attrs)
      : ws.map(() => undefined);
    return [dx, undefined, ...dws];
  }),
  moe_unpermute: rule((c) => {
    const [drows, dweights] = c.b.op('moe_unpermute_grad', [c.dOut(0)!, ...c.node.inputs]);
    return [drows, undefined, dweights];
  }),
  moe_aux_loss: rule((c) => [
    c.b.op1('moe_aux_loss_grad', [c.dOut(0)!, ...c.node.inputs], c.node.attrs),
  ]),
  cross_entropy: rule((c) => [c.b.op1('cross_entropy_grad', [c.dOut(0)!, ...c.node.inputs])]),
  vocab_logsumexp: rule((c) => [
    c.b.op1('vocab_logsumexp_grad', [c.dOut(0)!, c.node.inputs[0], c.node.outputs[0].name]),
  ]),
  lse_combine: rule((c) => [
    c.b.op1('lse_combine_grad', [c.dOut(0)!, c.node.inputs[0], c.node.outputs[0].name]),
  ]),
  vocab_target_logit: rule((c) => {
    const [logits, ...labelsAndMask] = c.node.inputs;
    const columns = c.b.typeOf(logits).shape[1] as number;
    const dy = c.dOut(0)!;
    const attrs = typed({ ...c.node.attrs, columns }, 'dtype', c.gradType(0), c.b.typeOf(dy).dtype);
    return [c.b.op1('vocab_target_logit_grad', [dy, ...labelsAndMask], attrs)];
  }),
  ce_from_stats: rule((c) => {
    const [lse, , mask, count] = c.node.inputs;
    return c.b.op('ce_from_stats_grad', [c.dOut(0)!, lse, mask, count]);
  }),
  moe_rank_counts: none(INTEGER),
  moe_sort_chunks: rule((c) => [
    c.b.op1('moe_sort_chunks', [c.dOut(0)!, c.node.inputs[1]], {
      inverse: !c.node.attrs.inverse,
    }),
  ]),
  moe_local_counts: none(INTEGER),
  image_sizes: none(INTEGER),
  vit_balance_route: none('integer routing decisions (its image count is a metric)'),
  segment_offset: none(INTEGER),
  // the rows go back where they were picked from
  gather_rows: rule((c) => [
    c.b.op1('scatter_rows', [c.dOut(0)!, c.node.inputs[1]], { rows: [rowsDim(c, 0)] }),
    undefined,
  ]),
  embedding_grad: none(BACKWARD),
  linear_dgrad: none(BACKWARD),
  linear_wgrad: none(BACKWARD),
  layernorm_grad: none(BACKWARD),
  rmsnorm_grad: none(BACKWARD),
  rope_grad: none(BACKWARD),
  attention_grad: none(BACKWARD),
  gelu_grad: none(BACKWARD),
  swiglu_grad: none(BACKWARD),
  merge_visual_grad: none(BACKWARD),
  router_topk_grad: none(BACKWARD),
  moe_permute_grad: none(BACKWARD),
  grouped_linear_dgrad: none(BACKWARD),
  grouped_linear_wgrad: none(BACKWARD),
  linear_wgrad_accumulate: none(BACKWARD),
  grouped_linear_wgrad_accumulate: none(BACKWARD),
  moe_unpermute_grad: none(BACKWARD),
  moe_aux_loss_grad: none(BACKWARD),
  cross_entropy_grad: none(BACKWARD),
  vocab_logsumexp_grad: none(BACKWARD),
  lse_combine_grad: none(BACKWARD),
  vocab_target_logit_grad: none(BACKWARD),
  ce_from_stats_grad: none(BACKWARD),
  scatter_rows: none(BACKWARD),
  reshape: rule((c) => {
    const shape = c.b.typeOf(c.node.inputs[0]).shape.map(formatDim);
    return [c.b.op1('reshape', [c.dOut(0)!], { shape })];
  }),
  split: rule((c) => [
    c.b.op1(
      'concat',
      c.node.outputs.map((_, i) => c.dOutOrZero(i)),
    ),
  ]),
  concat: rule((c) => {
    const sizes = c.node.inputs.map((i) => {
      const s = c.b.typeOf(i).shape;
      return s[s.length - 1] as number;
    });
    return c.b.op('split', [c.dOut(0)!], { sizes });
  }),
  constant: none('a constant has no inputs'),
  // Megatron's conjugate pairs: the forward of one is the backward of the other
  copy_to_group: rule((c) => [c.b.op1('all_reduce', [c.dOut(0)!], groupOf(c))]),
  group_slice: rule((c) => [c.b.op1('all_gather', [c.dOut(0)!], { ...groupOf(c), grad: 'slice' })]),
  grad_accumulate: none(STEP),
  sum_squares: none(STEP),
  clip_coef: none(STEP),
  adamw: none(STEP),
  // Collectives placed on the forward graph (before autodiff), Megatron style: a value after a
  // sum is replicated, and its gradient is the true gradient on every rank.
  all_reduce: rule((c) => [c.dOut(0)]),
  all_gather: rule((c) =>
    c.node.attrs.grad === 'slice'
      ? [c.b.op1('group_slice', [c.dOut(0)!], groupOf(c))]
      : [c.b.op1('reduce_scatter', [c.dOut(0)!], groupOf(c))],
  ),
  reduce_scatter: rule((c) => [
    c.b.op1('all_gather', [c.dOut(0)!], { ...groupOf(c), grad: 'reduce_scatter' }),
  ]),
  // rows go back the way they came: blocks of recv_counts to each source rank
  all_to_all_v: rule((c) => {
    const [rows] = c.node.inputs;
    const recvCounts = c.node.outputs[1].name;
    const { dispatcher, top_k } = c.node.attrs;
    const [drows] = c.b.op('all_to_all_v', [c.dOut(0)!, recvCounts], {
      ...groupOf(c),
      out_rows: [formatDim(c.b.typeOf(rows).shape[0])],
      ...(dispatcher === undefined ? {} : { dispatcher, top_k }),
    });
    return [drows, undefined];
  }),
  // each rank's rows gathered / its block of the sum: the conjugate pair over the same counts
  all_gather_v: rule((c) => {
    const [x, counts] = c.node.inputs;
    const [dx] = c.b.op('reduce_scatter_v', [c.dOut(0)!, counts], {
      ...groupOf(c),
      out_rows: [formatDim(c.b.typeOf(x).shape[0])],
    });
    return [dx, undefined];
  }),
  reduce_scatter_v: rule((c) => {
    const [x, counts] = c.node.inputs;
    const [dx] = c.b.op('all_gather_v', [c.dOut(0)!, counts], {
      ...groupOf(c),
      out_rows: [formatDim(c.b.typeOf(x).shape[0])],
    });
    return [dx, undefined];
  }),
  broadcast: none(AFTER_AUTODIFF),
  gather_v: none(AFTER_AUTODIFF),
  scatter_v: none(AFTER_AUTODIFF),
  send: none(AFTER_AUTODIFF),
  recv: none(AFTER_AUTODIFF),
  offload: none('memory moves are placed after autodiff'),
  reload: none('memory moves are placed after autodiff'),
} as const satisfies Record<OpKind, GradEntry>;

/** dim 0 of input i, as text */
function rowsDim(c: GradCtx, i: number): string {
  return formatDim(c.b.typeOf(c.node.inputs[i]).shape[0]);
}

/** the group attributes of a collective or region boundary, for its conjugate */
function groupOf(c: GradCtx): { group: string; group_size: number } {
  return { group: c.node.attrs.group as string, group_size: c.node.attrs.group_size as number };
}

function pick(attrs: Attrs, ...names: string[]): Attrs {
  return Object.fromEntries(names.filter((n) => attrs[n] !== undefined).map((n) => [n, attrs[n]]));
}

function rowsOf(c: GradCtx, input: number): number {
  return c.b.typeOf(c.node.inputs[input]).shape[0] as number;
}
