// Every op's shape rule: one valid case with its expected output types, one invalid case with
// the message it must give. The case table is keyed by OpKind, so a new op without cases fails
// type checking here too.
import { describe, expect, it } from 'vitest';
import { inferTypes, OP_KINDS, OP_TABLE, nodeFlops, type OpKind } from '../../ir/ops.js';
import { parseType, formatType } from '../../ir/index.js';
import type { Attrs } from '../../ir/types.js';

interface Case {
  inputs: string[];
  attrs?: Attrs;
  out: string[];
  bad: { inputs: string[]; attrs?: Attrs; error: RegExp };
}

const CASES: Record<OpKind, Case> = {
  embedding: {
    inputs: ['i32[S]', 'f32[512, 128]'],
    out: ['f32[S, 128]'],
    bad: { inputs: ['f32[S]', 'f32[512, 128]'], error: /ids must be an integer tensor/ },
  },
  patch_embed: {
    inputs: ['f32[4*Nv, 48]', 'f32[64, 48]', 'f32[64]'],
    out: ['f32[4*Nv, 64]'],
    bad: { inputs: ['f32[4*Nv, 47]', 'f32[64, 48]'], error: /in-features vs last dim/ },
  },
  linear: {
    inputs: ['f32[S, 8, 128]', 'f32[64, 128]'],
    out: ['f32[S, 8, 64]'],
    bad: {
      inputs: ['f32[S, 128]', 'f32[64, 128]', 'f32[32]'],
      error: /bias size vs weight out-features/,
    },
  },
  layernorm: {
    inputs: ['f32[Nv, 64]', 'f32[64]', 'f32[64]'],
    attrs: { eps: 1e-6 },
    out: ['f32[Nv, 64]'],
    bad: {
      inputs: ['f32[Nv, 64]', 'f32[64]', 'f32[63]'],
      attrs: { eps: 1e-6 },
      error: /bias size vs last dim/,
    },
  },
  rmsnorm: {
    inputs: ['f32[S, 8, 16]', 'f32[16]'],
    attrs: { eps: 1e-6 },
    out: ['f32[S, 8, 16]'],
    bad: { inputs: ['f32[S, 8, 16]', 'f32[16]'], error: /missing attribute 'eps'/ },
  },
  rope: {
    inputs: ['f32[S, 8, 128]', 'i32[S, 3]'],
    attrs: { theta: 1e6, sections: [24, 20, 20] },
    out: ['f32[S, 8, 128]'],
    bad: {
      inputs: ['f32[S, 8, 128]', 'i32[S, 3]'],
      attrs: { theta: 1e6, sections: [24, 20, 21] },
      error: /sections sum to 65, head dim\/2 is 64/,
    },
  },
  attention: {
    inputs: ['f32[S, 8, 16]', 'f32[S, 4, 16]', 'f32[S, 4, 16]', 'i32[S]'],
    attrs: { causal: true, scale: 0.25 },
    out: ['f32[S, 8, 16]', 'f32[S, 8]'],
    bad: {
      inputs: ['f32[S, 6, 16]', 'f32[S, 4, 16]', 'f32[S, 4, 16]', 'i32[S]'],
      attrs: { causal: true, scale: 0.25 },
      error: /query heads 6 must be a multiple of KV heads 4/,
    },
  },
  gelu: {
    inputs: ['f32[S, 256]'],
    out: ['f32[S, 256]'],
    bad: { inputs: ['i32[S, 256]'], error: /must be a float tensor/ },
  },
  swiglu: {
    inputs: ['f32[2*S, 128]', 'f32[2*S, 128]'],
    out: ['f32[2*S, 128]'],
    bad: { inputs: ['f32[2*S, 128]', 'f32[S, 128]'], error: /shape mismatch/ },
  },
  add: {
    inputs: ['f32[]', 'f32[]'],
    out: ['f32[]'],
    bad: { inputs: ['f32[S]', 'f64[S]'], error: /dtype mismatch/ },
  },
  merge_visual: {
    inputs: ['f32[S, 128]', 'f32[Nv, 128]', 'i32[S]', 'i32[]'],
    attrs: { mode: 'replace' },
    out: ['f32[S, 128]'],
    bad: {
      inputs: ['f32[S, 128]', 'f32[Nv, 64]', 'i32[S]', 'i32[]'],
      attrs: { mode: 'replace' },
      error: /visual hidden vs text hidden/,
    },
  },
  router_topk: {
    inputs: ['f32[S, 8]'],
    attrs: { k: 2 },
    out: ['f32[S, 8]', 'f32[S, 2]', 'i32[S, 2]'],
    bad: { inputs: ['f32[S, 8]'], attrs: { k: 9 }, error: /top-k 9 must be in \[1, 8\]/ },
  },
  moe_permute: {
    inputs: ['f32[S, 128]', 'i32[S, 2]'],
    attrs: { num_experts: 8 },
    out: ['f32[2*S, 128]', 'i32[8]', 'i32[2*S]'],
    bad: {
      inputs: ['f32[S, 128]', 'i32[Nv, 2]'],
      attrs: { num_experts: 8 },
      error: /experts vs tokens/,
    },
  },
  grouped_linear: {
    inputs: ['f32[2*S, 128]', 'i32[2]', 'f32[64, 128]', 'f32[64, 128]'],
    out: ['f32[2*S, 64]'],
    bad: {
      inputs: ['f32[2*S, 128]', 'i32[3]', 'f32[64, 128]', 'f32[64, 128]'],
      error: /counts has 3 experts, 2 weights given/,
    },
  },
  moe_unpermute: {
    inputs: ['f32[2*S, 128]', 'i32[2*S]', 'f32[S, 2]'],
    out: ['f32[S, 128]'],
    bad: { inputs: ['f32[2*S, 128]', 'i32[S]', 'f32[S, 2]'], error: /row_of vs tokens·k/ },
  },
  moe_aux_loss: {
    inputs: ['f32[S, 8]', 'i32[S, 2]', 'i32[S]'],
    attrs: { coeff: 0.001 },
    out: ['f32[]'],
    bad: {
      inputs: ['f32[S, 8]', 'i32[S, 2]', 'i32[Nv]'],
      attrs: { coeff: 0.001 },
      error: /segments vs tokens/,
    },
  },
  cross_entropy: {
    inputs: ['f32[S, 512]', 'i32[S]', 'u8[S]', 'f32[]'],
    out: ['f32[]'],
    bad: {
      inputs: ['f32[S, 512]', 'i32[S]', 'u8[S]', 'f32[1]'],
      error: /loss_tokens must be a scalar/,
    },
  },
  vocab_logsumexp: {
    inputs: ['f32[S, 256]'],
    out: ['f32[S]'],
    bad: { inputs: ['f32[256]'], error: /logits must have rank 2/ },
  },
  lse_combine: {
    inputs: ['f32[2, S]'],
    out: ['f32[S]'],
    bad: { inputs: ['i32[2, S]'], error: /x must be a float tensor/ },
  },
  vocab_target_logit: {
    inputs: ['f32[S, 256]', 'i32[S]', 'u8[S]'],
    attrs: { shard_group: 'tp', group_size: 2 },
    out: ['f32[S]'],
    bad: {
      inputs: ['f32[S, 256]', 'i32[Nv]'],
      attrs: { shard_group: 'tp', group_size: 2 },
      error: /labels vs tokens/,
    },
  },
  ce_from_stats: {
    inputs: ['f32[S]', 'f32[S]', 'u8[S]', 'f32[]'],
    out: ['f32[]'],
    bad: {
      inputs: ['f32[S]', 'f32[Nv]', 'u8[S]', 'f32[]'],
      error: /target \[Nv\] vs lse \[S\]/,
    },
  },
  moe_rank_counts: {
    inputs: ['i32[8]'],
    attrs: { group_size: 4 },
    out: ['i32[4]'],
    bad: {
      inputs: ['i32[6]'],
      attrs: { group_size: 4 },
      error: /experts \[6\] must be a multiple of group_size 4/,
    },
  },
  image_sizes: {
    inputs: ['i32[4*Nv]'],
    attrs: { images: 16 },
    out: ['i32[16]'],
    bad: { inputs: ['f32[4*Nv]'], attrs: { images: 16 }, error: /segments must be an integer/ },
  },
  vit_balance_route: {
    inputs: ['i32[32]', 'i32[4*Nv]'],
    attrs: { group: 'dp', group_size: 2, images: 16, merge: 4, capacity: 64 },
    out: ['i32[2]', 'i32[4*Nv]', 'i32[2]', 'i32[Nv]', 'f32[]'],
    bad: {
      inputs: ['i32[30]', 'i32[4*Nv]'],
      attrs: { group: 'dp', group_size: 2, images: 16, merge: 4, capacity: 64 },
      error: /all_sizes vs group_size × images: \[30\] ≠ \[32\]/,
    },
  },
  segment_offset: {
    inputs: ['i32[4*Nv]'],
    attrs: { group: 'world', group_size: 8, stride: 64 },
    out: ['i32[4*Nv]'],
    bad: {
      inputs: ['f32[4*Nv]'],
      attrs: { group: 'world', group_size: 8, stride: 64 },
      error: /segments must be an integer/,
    },
  },
  gather_rows: {
    inputs: ['i32[4*Nv, 2]', 'i32[4*Nv]'],
    out: ['i32[4*Nv, 2]'],
    bad: { inputs: ['f32[Nv, 64]', 'f32[Nv]'], error: /index must be an integer/ },
  },
  scatter_rows: {
    inputs: ['f32[Nv, 64]', 'i32[Nv]'],
    attrs: { rows: ['Nv'] },
    out: ['f32[Nv, 64]'],
    bad: {
      inputs: ['f32[Nv, 64]', 'i32[S]'],
      attrs: { rows: ['Nv'] },
      error: /index vs rows of dy/,
    },
  },
  moe_sort_chunks: {
    inputs: ['f32[8*S, 128]', 'i32[4, 2]'],
    attrs: { inverse: false },
    out: ['f32[8*S, 128]'],
    bad: {
      inputs: ['f32[8*S, 128]', 'i32[8]'],
      attrs: { inverse: false },
      error: /counts must have rank 2/,
    },
  },
  moe_local_counts: {
    inputs: ['i32[4, 2]'],
    out: ['i32[2]'],
    bad: { inputs: ['f32[4, 2]'], error: /counts must be an integer tensor/ },
  },
  embedding_grad: {
    inputs: ['f32[S, 128]', 'i32[S]'],
    attrs: { rows: 512 },
    out: ['f32[512, 128]'],
    bad: { inputs: ['f32[S, 128]', 'i32[Nv]'], attrs: { rows: 512 }, error: /ids vs tokens of dy/ },
  },
  linear_dgrad: {
    inputs: ['f32[S, 64]', 'f32[64, 128]'],
    out: ['f32[S, 128]'],
    bad: { inputs: ['f32[S, 63]', 'f32[64, 128]'], error: /dy features vs weight out-features/ },
  },
  linear_wgrad: {
    inputs: ['f32[S, 64]', 'f32[S, 128]'],
    attrs: { bias: true },
    out: ['f32[64, 128]', 'f32[64]'],
    bad: {
      inputs: ['f32[S, 64]', 'f32[Nv, 128]'],
      attrs: { bias: false },
      error: /dy and x rows differ/,
    },
  },
  layernorm_grad: {
    inputs: ['f32[Nv, 64]', 'f32[Nv, 64]', 'f32[64]'],
    attrs: { eps: 1e-6 },
    out: ['f32[Nv, 64]', 'f32[64]', 'f32[64]'],
    bad: {
      inputs: ['f32[Nv, 64]', 'f32[S, 64]', 'f32[64]'],
      attrs: { eps: 1e-6 },
      error: /dy \[Nv, 64\] vs x \[S, 64\]/,
    },
  },
  rmsnorm_grad: {
    inputs: ['f32[S, 128]', 'f32[S, 128]', 'f32[128]'],
    attrs: { eps: 1e-6 },
    out: ['f32[S, 128]', 'f32[128]'],
    bad: {
      inputs: ['f32[S, 128]', 'f32[S, 64]', 'f32[128]'],
      attrs: { eps: 1e-6 },
      error: /dy \[S, 128\] vs x/,
    },
  },
  rope_grad: {
    inputs: ['f32[S, 8, 16]', 'i32[S]'],
    attrs: { theta: 1e6, sections: [8] },
    out: ['f32[S, 8, 16]'],
    bad: {
      inputs: ['f32[S, 8, 16]', 'i32[S]'],
      attrs: { theta: 1e6, sections: [7] },
      error: /sections sum to 7/,
    },
  },
  attention_grad: {
    inputs: [
      'f32[S, 8, 16]',
      'f32[S, 8, 16]',
      'f32[S, 4, 16]',
      'f32[S, 4, 16]',
      'i32[S]',
      'f32[S, 8, 16]',
      'f32[S, 8]',
    ],
    attrs: { causal: true, scale: 0.25 },
    out: ['f32[S, 8, 16]', 'f32[S, 4, 16]', 'f32[S, 4, 16]'],
    bad: {
      inputs: [
        'f32[S, 4, 16]',
        'f32[S, 8, 16]',
        'f32[S, 4, 16]',
        'f32[S, 4, 16]',
        'i32[S]',
        'f32[S, 8, 16]',
        'f32[S, 8]',
      ],
      attrs: { causal: true, scale: 0.25 },
      error: /dout \[S, 4, 16\] vs q/,
    },
  },
  gelu_grad: {
    inputs: ['f32[S, 256]', 'f32[S, 256]'],
    out: ['f32[S, 256]'],
    bad: { inputs: ['f32[S, 256]', 'f32[S, 128]'], error: /shape mismatch/ },
  },
  swiglu_grad: {
    inputs: ['f32[S, 384]', 'f32[S, 384]', 'f32[S, 384]'],
    out: ['f32[S, 384]', 'f32[S, 384]'],
    bad: { inputs: ['f32[S, 384]', 'f32[S, 384]', 'f32[S, 38]'], error: /shape mismatch/ },
  },
  merge_visual_grad: {
    inputs: ['f32[S, 128]', 'i32[S]', 'i32[]'],
    attrs: { mode: 'replace', visual_rows: ['Nv'] },
    out: ['f32[S, 128]', 'f32[Nv, 128]'],
    bad: {
      inputs: ['f32[S, 128]', 'i32[S]', 'i32[]'],
      attrs: { mode: 'replace' },
      error: /missing attribute 'visual_rows'/,
    },
  },
  router_topk_grad: {
    inputs: ['f32[S, 8]', 'f32[S, 2]', 'f32[S, 8]', 'i32[S, 2]'],
    out: ['f32[S, 8]'],
    bad: {
      inputs: ['f32[S, 8]', 'f32[S, 3]', 'f32[S, 8]', 'i32[S, 2]'],
      error: /dweights vs experts/,
    },
  },
  moe_permute_grad: {
    // the rows kept under an expert capacity (Nk0), fewer than the assignments of row_of
    inputs: ['f32[Nk0, 128]', 'i32[2*S]'],
    attrs: { k: 2 },
    out: ['f32[S, 128]'],
    bad: {
      inputs: ['f32[2*S, 128]', 'i32[S, 2]'],
      attrs: { k: 2 },
      error: /row_of must have rank 1/,
    },
  },
  grouped_linear_dgrad: {
    inputs: ['f32[2*S, 64]', 'i32[2]', 'f32[64, 128]', 'f32[64, 128]'],
    out: ['f32[2*S, 128]'],
    bad: {
      inputs: ['f32[2*S, 64]', 'i32[2]', 'f32[64, 128]'],
      error: /counts has 2 experts, 1 weights given/,
    },
  },
  grouped_linear_wgrad: {
    inputs: ['f32[2*S, 64]', 'f32[2*S, 128]', 'i32[2]'],
    out: ['f32[64, 128]', 'f32[64, 128]'],
    bad: { inputs: ['f32[2*S, 64]', 'f32[S, 128]', 'i32[2]'], error: /rows of dy vs x/ },
  },
  linear_wgrad_accumulate: {
    inputs: ['bf16[S, 64]', 'bf16[S, 128]', 'f32[64, 128]', 'f32[64]'],
    attrs: { bias: true },
    out: [],
    bad: {
      inputs: ['f32[S, 64]', 'f32[S, 128]', 'f32[128, 64]'],
      attrs: { bias: false },
      error: /dW \[128, 64\] vs \[out, in\] \[64, 128\]/,
    },
  },
  grouped_linear_wgrad_accumulate: {
    inputs: ['f32[2*S, 64]', 'f32[2*S, 128]', 'i32[2]', 'f32[64, 128]', 'f32[64, 128]'],
    out: [],
    bad: {
      inputs: ['f32[2*S, 64]', 'f32[2*S, 128]', 'i32[2]', 'f32[64, 128]'],
      error: /counts has \[2\] experts, 1 gradient buffers given/,
    },
  },
  moe_unpermute_grad: {
    inputs: ['f32[S, 128]', 'f32[2*S, 128]', 'i32[2*S]', 'f32[S, 2]'],
    out: ['f32[2*S, 128]', 'f32[S, 2]'],
    bad: {
      inputs: ['f32[S, 64]', 'f32[2*S, 128]', 'i32[2*S]', 'f32[S, 2]'],
      error: /hidden of dy vs rows/,
    },
  },
  moe_aux_loss_grad: {
    inputs: ['f32[]', 'f32[S, 8]', 'i32[S, 2]', 'i32[S]'],
    attrs: { coeff: 0.001 },
    out: ['f32[S, 8]'],
    bad: {
      inputs: ['f32[S]', 'f32[S, 8]', 'i32[S, 2]', 'i32[S]'],
      attrs: { coeff: 0.001 },
      error: /dloss must be a scalar/,
    },
  },
  cross_entropy_grad: {
    inputs: ['f32[]', 'f32[S, 512]', 'i32[S]', 'u8[S]', 'f32[]'],
    out: ['f32[S, 512]'],
    bad: {
      inputs: ['f32[2]', 'f32[S, 512]', 'i32[S]', 'u8[S]', 'f32[]'],
      error: /dloss must be a scalar/,
    },
  },
  vocab_logsumexp_grad: {
    inputs: ['f32[S]', 'f32[S, 256]', 'f32[S]'],
    out: ['f32[S, 256]'],
    bad: { inputs: ['f32[S]', 'f32[S, 256]', 'f32[Nv]'], error: /lse vs tokens/ },
  },
  lse_combine_grad: {
    inputs: ['f32[S]', 'f32[2, S]', 'f32[S]'],
    out: ['f32[2, S]'],
    bad: { inputs: ['f32[S]', 'f32[S, 2]', 'f32[S]'], error: /dy vs tokens/ },
  },
  vocab_target_logit_grad: {
    inputs: ['f32[S]', 'i32[S]'],
    attrs: { shard_group: 'tp', group_size: 2, columns: 256 },
    out: ['f32[S, 256]'],
    bad: {
      inputs: ['f32[S]', 'i32[S]'],
      attrs: { shard_group: 'tp', group_size: 2 },
      error: /missing attribute 'columns'/,
    },
  },
  ce_from_stats_grad: {
    inputs: ['f32[]', 'f32[S]', 'u8[S]', 'f32[]'],
    out: ['f32[S]', 'f32[S]'],
    bad: { inputs: ['f32[S]', 'f32[S]', 'u8[S]', 'f32[]'], error: /dloss must be a scalar/ },
  },
  reshape: {
    inputs: ['f32[4*Nv, 64]'],
    attrs: { shape: ['Nv', '256'] },
    out: ['f32[Nv, 256]'],
    bad: { inputs: ['f32[4*Nv, 64]'], attrs: { shape: ['Nv', '128'] }, error: /cannot reshape/ },
  },
  split: {
    inputs: ['f32[Nv, 192]'],
    attrs: { sizes: [64, 64, 64] },
    out: ['f32[Nv, 64]', 'f32[Nv, 64]', 'f32[Nv, 64]'],
    bad: { inputs: ['f32[Nv, 192]'], attrs: { sizes: [64, 64] }, error: /parts sum to 128/ },
  },
  concat: {
    inputs: ['f32[Nv, 64]', 'f32[Nv, 128]'],
    out: ['f32[Nv, 192]'],
    bad: { inputs: ['f32[Nv, 64]', 'f32[S, 64]'], error: /leading dims differ/ },
  },
  constant: {
    inputs: [],
    attrs: { value: 1, dtype: 'f32', shape: [] },
    out: ['f32[]'],
    bad: {
      inputs: [],
      attrs: { value: 'one', dtype: 'f32', shape: [] },
      error: /'value' must be number/,
    },
  },
  copy_to_group: {
    inputs: ['f32[S, 128]'],
    attrs: { group: 'tp', group_size: 2 },
    out: ['f32[S, 128]'],
    bad: {
      inputs: ['f32[S, 128]'],
      attrs: { group: 'tp' },
      error: /missing attribute 'group_size'/,
    },
  },
  group_slice: {
    inputs: ['f32[S, 128]'],
    attrs: { group: 'tp', group_size: 2 },
    out: ['f32[S/2, 128]'],
    bad: {
      inputs: ['f32[7, 128]'],
      attrs: { group: 'tp', group_size: 2 },
      error: /7 is not divisible by 2/,
    },
  },
  grad_accumulate: {
    inputs: ['f32[64, 48]', 'f32[64, 48]'],
    out: [],
    bad: {
      inputs: ['f32[64, 48]', 'f32[48, 64]'],
      error: /gradient \[64, 48\] vs buffer \[48, 64\]/,
    },
  },
  sum_squares: {
    inputs: ['f32[64, 48]', 'f32[64]'],
    out: ['f32[]'],
    bad: { inputs: ['i32[64]'], error: /must be a float tensor/ },
  },
  clip_coef: {
    inputs: ['f32[]'],
    attrs: { max_norm: 1 },
    out: ['f32[]'],
    bad: { inputs: ['f32[2]'], attrs: { max_norm: 1 }, error: /sumsq must be a scalar/ },
  },
  adamw: {
    inputs: ['f32[64, 48]', 'f32[64, 48]', 'f32[64, 48]', 'f32[64, 48]', 'f32[]'],
    attrs: { beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1 },
    out: [],
    bad: {
      inputs: ['f32[64, 48]', 'f32[64, 47]', 'f32[64, 48]', 'f32[64, 48]', 'f32[]'],
      attrs: { beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1 },
      error: /grad \[64, 47\] vs param/,
    },
  },
  all_reduce: {
    inputs: ['f32[S, 128]'],
    attrs: { group: 'tp', group_size: 2 },
    out: ['f32[S, 128]'],
    bad: {
      inputs: ['f32[S, 128]'],
      attrs: { group: 'tp' },
      error: /missing attribute 'group_size'/,
    },
  },
  all_gather: {
    inputs: ['f32[S, 64]'],
    attrs: { group: 'tp', group_size: 2 },
    out: ['f32[2*S, 64]'],
    bad: { inputs: ['f32[]'], attrs: { group: 'tp', group_size: 2 }, error: /needs rank ≥ 1/ },
  },
  reduce_scatter: {
    inputs: ['f32[S, 64]'],
    attrs: { group: 'tp', group_size: 2 },
    out: ['f32[S/2, 64]'],
    bad: {
      inputs: ['f32[7, 64]'],
      attrs: { group: 'tp', group_size: 2 },
      error: /7 is not divisible by 2/,
    },
  },
  broadcast: {
    inputs: ['f32[Nv, 128]'],
    attrs: { group: 'tp', group_size: 2, root: 0 },
    out: ['f32[Nv, 128]'],
    bad: {
      inputs: ['f32[Nv, 128]'],
      attrs: { group: 'tp', group_size: 2, root: 'zero' },
      error: /'root' must be int/,
    },
  },
  all_to_all_v: {
    inputs: ['f32[2*S, 128]', 'i32[4]'],
    attrs: { group: 'ep', group_size: 4, out_rows: ['8*S'] },
    out: ['f32[8*S, 128]', 'i32[4]'],
    bad: {
      inputs: ['f32[2*S, 128]', 'i32[2]'],
      attrs: { group: 'ep', group_size: 4, out_rows: ['8*S'] },
      error: /one entry per rank/,
    },
  },
  gather_v: {
    inputs: ['f32[Nv, 128]'],
    attrs: { group: 'mp', group_size: 4, root: 0, out_rows: ['4*Nv'] },
    out: ['f32[4*Nv, 128]'],
    bad: {
      inputs: ['f32[Nv]'],
      attrs: { group: 'mp', group_size: 4, root: 0, out_rows: ['4*Nv'] },
      error: /rows must have rank 2/,
    },
  },
  scatter_v: {
    inputs: ['f32[4*Nv, 128]'],
    attrs: { group: 'mp', group_size: 4, root: 0, out_rows: ['Nv'] },
    out: ['f32[Nv, 128]'],
    bad: {
      inputs: ['f32[4*Nv, 128]'],
      attrs: { group: 'mp', group_size: 4, root: 0, out_rows: 'Nv' },
      error: /'out_rows' must be dims/,
    },
  },
  all_gather_v: {
    inputs: ['bf16[Rx, 128]', 'i32[4]'],
    attrs: { group: 'tp', group_size: 4, out_rows: ['Rg'] },
    out: ['bf16[Rg, 128]'],
    bad: {
      inputs: ['bf16[Rx, 128]', 'f32[4]'],
      attrs: { group: 'tp', group_size: 4, out_rows: ['Rg'] },
      error: /counts must be an integer tensor/,
    },
  },
  reduce_scatter_v: {
    inputs: ['f32[Rg, 128]', 'i32[2]'],
    attrs: { group: 'tp', group_size: 2, out_rows: ['Rx'] },
    out: ['f32[Rx, 128]'],
    bad: {
      inputs: ['f32[Rg, 128]', 'i32[4]'],
      attrs: { group: 'tp', group_size: 2, out_rows: ['Rx'] },
      error: /one entry per rank/,
    },
  },
  send: {
    inputs: ['f32[S, 128]'],
    attrs: { group: 'pp', peer: 1, tag: 3 },
    out: [],
    bad: {
      inputs: ['f32[S, 128]'],
      attrs: { peer: 1, tag: 3 },
      error: /missing attribute 'group'/,
    },
  },
  recv: {
    inputs: [],
    attrs: { group: 'pp', peer: 0, tag: 3, dtype: 'f32', shape: ['S', '128'] },
    out: ['f32[S, 128]'],
    bad: {
      inputs: [],
      attrs: { group: 'pp', peer: -1, tag: 3, dtype: 'f32', shape: ['S', '128'] },
      error: /peer must be ≥ 0, got -1/,
    },
  },
  offload: {
    inputs: ['f32[Nv, 128]'],
    out: ['f32@host[Nv, 128]'],
    bad: { inputs: ['f32@host[Nv, 128]'], error: /offload reads a device tensor/ },
  },
  reload: {
    inputs: ['f32@host[Nv, 128]'],
    out: ['f32[Nv, 128]'],
    bad: { inputs: ['f32[Nv, 128]'], error: /reload reads a host tensor/ },
  },
};

describe('op table shape rules', () => {
  it('has a case for every op kind', () => {
    expect(Object.keys(CASES).sort()).toEqual([...OP_KINDS].sort());
  });
  for (const kind of OP_KINDS) {
    const c = CASES[kind];
    it(`${kind}: derives ${c.out.join(', ') || 'no outputs'}`, () => {
      const outs = inferTypes(kind, c.inputs.map(parseType), c.attrs ?? {});
      expect(outs.map(formatType)).toEqual(c.out);
    });
    it(`${kind}: rejects a broken case`, () => {
      expect(() => inferTypes(kind, c.bad.inputs.map(parseType), c.bad.attrs ?? {})).toThrow(
        c.bad.error,
      );
    });
  }
});

describe('parallel attributes', () => {
  const infer = (kind: OpKind, inputs: string[], attrs: Attrs) =>
    inferTypes(kind, inputs.map(parseType), attrs).map(formatType);
  it('embedding and embedding_grad take shard_group and group_size together', () => {
    const shard = { shard_group: 'tp', group_size: 2 };
    expect(infer('embedding', ['i32[S]', 'f32[256, 64]'], shard)).toEqual(['f32[S, 64]']);
    expect(infer('embedding_grad', ['f32[S, 64]', 'i32[S]'], { rows: 256, ...shard })).toEqual([
      'f32[256, 64]',
    ]);
    expect(() => infer('embedding', ['i32[S]', 'f32[256, 64]'], { shard_group: 'tp' })).toThrow(
      /shard_group and group_size go together/,
    );
  });
  it("all_gather's grad is reduce_scatter or slice", () => {
    for (const grad of ['reduce_scatter', 'slice'])
      expect(infer('all_gather', ['f32[1, S]'], { group: 'tp', group_size: 4, grad })).toEqual([
        'f32[4, S]',
      ]);
    expect(() =>
      infer('all_gather', ['f32[1, S]'], { group: 'tp', group_size: 4, grad: 'sum' }),
    ).toThrow(/grad must be reduce_scatter or slice, got sum/);
  });
  it('all_to_all_v exchanges integer rows (the expert counts matrix)', () => {
    expect(
      infer('all_to_all_v', ['i32[4, 2]', 'i32[4]'], {
        group: 'ep',
        group_size: 4,
        out_rows: ['4'],
      }),
    ).toEqual(['i32[4, 2]', 'i32[4]']);
  });
  it('moe_permute with a capacity: rows over out_rows, given together, room for every kept row', () => {
    const inputs = ['f32[S, 128]', 'i32[S, 2]'];
    expect(
      infer('moe_permute', inputs, { num_experts: 8, capacity: 16, out_rows: ['Nk0'] }),
    ).toEqual(['f32[Nk0, 128]', 'i32[8]', 'i32[2*S]']);
    expect(() => infer('moe_permute', inputs, { num_experts: 8, capacity: 16 })).toThrow(
      /capacity and out_rows go together/,
    );
    expect(() =>
      infer('moe_permute', inputs, { num_experts: 8, capacity: 0, out_rows: ['Nk0'] }),
    ).toThrow(/capacity must be ≥ 1, got 0/);
    // T = 100 numeric: min(T·k, E·capacity) = min(200, 128) rows must fit
    const numeric = ['f32[100, 128]', 'i32[100, 2]'];
    expect(
      infer('moe_permute', numeric, { num_experts: 8, capacity: 16, out_rows: ['128'] }),
    ).toEqual(['f32[128, 128]', 'i32[8]', 'i32[200]']);
    expect(() =>
      infer('moe_permute', numeric, { num_experts: 8, capacity: 16, out_rows: ['127'] }),
    ).toThrow(/out_rows 127 cannot hold min\(T·k, E·capacity\) = 128 rows/);
  });
  it('vocab_target_logit takes an optional mask; group_slice keeps symbolic fractions', () => {
    const shard = { shard_group: 'tp', group_size: 2 };
    expect(infer('vocab_target_logit', ['f32[S, 64]', 'i32[S]'], shard)).toEqual(['f32[S]']);
    expect(() => infer('vocab_target_logit', ['f32[S, 64]', 'i32[S]', 'u8[Nv]'], shard)).toThrow(
      /mask vs tokens/,
    );
    expect(infer('group_slice', ['f32[2*S, 8]'], { group: 'tp', group_size: 4 })).toEqual([
      'f32[S/2, 8]',
    ]);
  });
});

describe('op table costs', () => {
  const sizes = (s: string) => ({ S: 128, Nv: 16 })[s] ?? 0;
  it('linear is 2·m·n·k', () => {
    const x = parseType('f32[S, 8, 128]');
    const w = parseType('f32[64, 128]');
    expect(nodeFlops('linear', [x, w], [parseType('f32[S, 8, 64]')], {}, sizes)).toBe(
      2 * 128 * 8 * 64 * 128,
    );
  });
  it('causal attention is half of 4·T²·nh·d; a window caps the segment', () => {
    const q = parseType('f32[S, 8, 16]');
    const kv = parseType('f32[S, 4, 16]');
    const args = [q, kv, kv, parseType('i32[S]')];
    expect(nodeFlops('attention', args, [q], { causal: true, scale: 1 }, sizes)).toBe(
      (4 * 128 * 128 * 8 * 16) / 2,
    );
    expect(nodeFlops('attention', args, [q], { causal: false, scale: 1 }, sizes)).toBe(
      4 * 128 * 128 * 8 * 16,
    );
    expect(
      nodeFlops('attention', args, [q], { causal: false, scale: 1, max_segment: 64 }, sizes),
    ).toBe(4 * 128 * 64 * 8 * 16);
  });
  it('grouped_linear counts every row once', () => {
    const x = parseType('f32[2*S, 128]');
    const w = parseType('f32[64, 128]');
    expect(
      nodeFlops(
        'grouped_linear',
        [x, parseType('i32[2]'), w, w],
        [parseType('f32[2*S, 64]')],
        {},
        sizes,
      ),
    ).toBe(2 * 256 * 128 * 64);
  });
  it('collectives are flagged from the table, not a list', () => {
    const coll = OP_KINDS.filter((k) => OP_TABLE[k].category === 'collective');
    expect(coll).toContain('all_to_all_v');
    expect(coll).not.toContain('linear');
    for (const k of coll) expect(OP_TABLE[k].pure).toBe(false);
  });
});
