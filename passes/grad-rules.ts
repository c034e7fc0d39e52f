// The gradient table: one entry per op kind (exhaustive by type). The autodiff pass reads it.
//   none     no gradient flows through this op (integer outputs, optimizer, data movement that
//            the parallel passes place after autodiff, with their own backward)
//   not_yet  differentiable in the listed inputs; the rule is not written yet (autodiff refuses
//            a graph that needs it, naming the op)

import type { OpKind } from '../ir/ops.js';

export type GradEntry =
  | { readonly kind: 'none'; readonly why: string }
  | { readonly kind: 'not_yet'; readonly differentiable: readonly number[] };

const AFTER_AUTODIFF = 'inserted by the parallel passes after autodiff, each with its own backward';

export const GRAD_RULES = {
  embedding: { kind: 'not_yet', differentiable: [1] },
  patch_embed: { kind: 'not_yet', differentiable: [0, 1, 2] },
  linear: { kind: 'not_yet', differentiable: [0, 1, 2] },
  layernorm: { kind: 'not_yet', differentiable: [0, 1, 2] },
  rmsnorm: { kind: 'not_yet', differentiable: [0, 1] },
  rope: { kind: 'not_yet', differentiable: [0] },
  attention: { kind: 'not_yet', differentiable: [0, 1, 2] },
  gelu: { kind: 'not_yet', differentiable: [0] },
  swiglu: { kind: 'not_yet', differentiable: [0, 1] },
  add: { kind: 'not_yet', differentiable: [0, 1] },
  merge_visual: { kind: 'not_yet', differentiable: [0, 1] },
  router_topk: { kind: 'not_yet', differentiable: [0] },
  moe_permute: { kind: 'not_yet', differentiable: [0] },
  grouped_linear: { kind: 'not_yet', differentiable: [0] },
  moe_unpermute: { kind: 'not_yet', differentiable: [0, 2] },
  moe_aux_loss: { kind: 'not_yet', differentiable: [0] },
  cross_entropy: { kind: 'not_yet', differentiable: [0] },
  reshape: { kind: 'not_yet', differentiable: [0] },
  split: { kind: 'not_yet', differentiable: [0] },
  adamw: { kind: 'none', why: 'the optimizer step runs after the backward pass' },
  all_reduce: { kind: 'none', why: AFTER_AUTODIFF },
  all_gather: { kind: 'none', why: AFTER_AUTODIFF },
  reduce_scatter: { kind: 'none', why: AFTER_AUTODIFF },
  broadcast: { kind: 'none', why: AFTER_AUTODIFF },
  all_to_all_v: { kind: 'none', why: AFTER_AUTODIFF },
  gather_v: { kind: 'none', why: AFTER_AUTODIFF },
  scatter_v: { kind: 'none', why: AFTER_AUTODIFF },
  send: { kind: 'none', why: AFTER_AUTODIFF },
  recv: { kind: 'none', why: AFTER_AUTODIFF },
  offload: { kind: 'none', why: 'memory moves are placed after autodiff' },
  reload: { kind: 'none', why: 'memory moves are placed after autodiff' },
} as const satisfies Record<OpKind, GradEntry>;
