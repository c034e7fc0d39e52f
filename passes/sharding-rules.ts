// The sharding table: how each op kind splits under tensor / expert / sequence parallelism
// (exhaustive by type). The parallel passes read it.
//   follows    elementwise or row-wise: output shards are the input shards, no communication
//   replicate  needs whole tensors; the pass gathers its inputs first
//   collective the op is itself communication, inserted by the passes
//   not_yet    the rule is not written yet (the pass refuses to shard it, naming the op)

import type { OpKind } from '../ir/ops.js';

export type ShardEntry =
  | { readonly kind: 'follows' }
  | { readonly kind: 'replicate'; readonly why: string }
  | { readonly kind: 'collective' }
  | { readonly kind: 'not_yet'; readonly plan: string };

export const SHARDING_RULES = {
  embedding: {
    kind: 'not_yet',
    plan: 'vocab-parallel: rows of the table per TP rank, all-reduce of the masked lookup',
  },
  patch_embed: { kind: 'not_yet', plan: 'column-parallel like linear' },
  linear: {
    kind: 'not_yet',
    plan: 'column-parallel (split out) or row-parallel (split in, all-reduce)',
  },
  layernorm: { kind: 'follows' },
  rmsnorm: { kind: 'follows' },
  rope: { kind: 'follows' },
  attention: {
    kind: 'not_yet',
    plan: 'split query heads and KV heads together, respecting GQA groups',
  },
  gelu: { kind: 'follows' },
  swiglu: { kind: 'follows' },
  add: { kind: 'follows' },
  merge_visual: { kind: 'replicate', why: 'placeholder positions index the whole sequence' },
  router_topk: { kind: 'replicate', why: 'top-k needs every expert logit of a token' },
  moe_permute: {
    kind: 'not_yet',
    plan: 'expert-parallel: permute to local buffers, all_to_all_v dispatch',
  },
  grouped_linear: { kind: 'not_yet', plan: 'experts split over ep; expert TP like linear' },
  moe_unpermute: { kind: 'not_yet', plan: 'all_to_all_v combine, then the weighted sum' },
  moe_aux_loss: {
    kind: 'not_yet',
    plan: 'statistics reduced over the ranks that split the tokens',
  },
  cross_entropy: {
    kind: 'not_yet',
    plan: 'vocab-parallel: max, sum-exp and target logit all-reduced',
  },
  // the vocab-parallel cross-entropy pieces are already per shard: row-wise over tokens
  vocab_logsumexp: { kind: 'follows' },
  lse_combine: { kind: 'follows' },
  vocab_target_logit: { kind: 'follows' },
  ce_from_stats: {
    kind: 'not_yet',
    plan: 'tokens split (sequence parallel): partial sums all-reduced, like cross_entropy',
  },
  moe_rank_counts: { kind: 'replicate', why: 'sums blocks of every expert count' },
  moe_sort_chunks: { kind: 'follows' },
  moe_local_counts: { kind: 'follows' },
  // the ViT balance is placed after tensor parallelism, on whole rows of each rank's images
  image_sizes: { kind: 'replicate', why: 'counts every patch of the microbatch' },
  vit_balance_route: { kind: 'replicate', why: 'decides over every image of the group' },
  segment_offset: { kind: 'follows' },
  gather_rows: { kind: 'follows' },
  embedding_grad: { kind: 'not_yet', plan: 'as embedding' },
  scatter_rows: { kind: 'follows' },
  linear_dgrad: { kind: 'not_yet', plan: 'as linear, with the dual collective' },
  linear_wgrad: { kind: 'follows' },
  layernorm_grad: { kind: 'follows' },
  rmsnorm_grad: { kind: 'follows' },
  rope_grad: { kind: 'follows' },
  attention_grad: { kind: 'not_yet', plan: 'as attention' },
  gelu_grad: { kind: 'follows' },
  swiglu_grad: { kind: 'follows' },
  merge_visual_grad: { kind: 'replicate', why: 'as merge_visual' },
  router_topk_grad: { kind: 'replicate', why: 'as router_topk' },
  moe_permute_grad: { kind: 'not_yet', plan: 'as moe_permute' },
  grouped_linear_dgrad: { kind: 'not_yet', plan: 'as grouped_linear' },
  grouped_linear_wgrad: { kind: 'not_yet', plan: 'as grouped_linear' },
  // made after autodiff from a wgrad and its accumulation (passes/wgrad-accumulation.ts)
  linear_wgrad_accumulate: { kind: 'follows' },
  grouped_linear_wgrad_accumulate: { kind: 'not_yet', plan: 'as grouped_linear' },
  moe_unpermute_grad: { kind: 'not_yet', plan: 'as moe_unpermute' },
  moe_aux_loss_grad: { kind: 'not_yet', plan: 'as moe_aux_loss' },
  cross_entropy_grad: { kind: 'not_yet', plan: 'as cross_entropy' },
  vocab_logsumexp_grad: { kind: 'follows' },
  lse_combine_grad: { kind: 'follows' },
  vocab_target_logit_grad: { kind: 'follows' },
  ce_from_stats_grad: { kind: 'follows' },
  reshape: { kind: 'follows' },
  split: { kind: 'not_yet', plan: 'split per shard when parts are shard-aligned' },
  concat: { kind: 'follows' },
  constant: { kind: 'follows' },
  // region boundaries the passes insert (no forward communication; a collective backward)
  copy_to_group: { kind: 'collective' },
  group_slice: { kind: 'collective' },
  grad_accumulate: { kind: 'follows' },
  sum_squares: {
    kind: 'not_yet',
    plan: 'partial sums all-reduced; a replicated parameter counted once',
  },
  clip_coef: { kind: 'follows' },
  adamw: { kind: 'follows' },
  all_reduce: { kind: 'collective' },
  all_gather: { kind: 'collective' },
  reduce_scatter: { kind: 'collective' },
  broadcast: { kind: 'collective' },
  all_to_all_v: { kind: 'collective' },
  gather_v: { kind: 'collective' },
  scatter_v: { kind: 'collective' },
  all_gather_v: { kind: 'collective' },
  reduce_scatter_v: { kind: 'collective' },
  send: { kind: 'collective' },
  recv: { kind: 'collective' },
  offload: { kind: 'follows' },
  reload: { kind: 'follows' },
} as const satisfies Record<OpKind, ShardEntry>;
