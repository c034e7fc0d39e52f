// The op table: every op kind of the IR, closed. One record per op gives its arity, attributes,
// shape rule, cost (matmul FLOPs by the project's convention, bytes moved), purity and kernel.
// Adding an op kind without a record here fails type checking (`satisfies Record<OpKind, OpInfo>`),
// and the per-op rule tables in passes/ (gradients, sharding) are keyed the same way.
//
// Dimension letters used in the shape comments:
//   T tokens of a microbatch (S, or Np for the encoder)   H hidden   V vocab   E experts
//   k top-k   N rows (tokens × k, permuted)   nh/nkv query/KV heads   d head dim   P group size

import { isFloat, isInt, type DType } from './dtype.js';
import {
  dimDiv,
  dimEq,
  dimMul,
  formatShape,
  parseDim,
  resolveShape,
  sameNumel,
  ShapeError,
  shapeEq,
  type Dim,
  type Shape,
} from './shape.js';
import type { Attrs, AttrValue, TensorType } from './types.js';

export const OP_KINDS = [
  // compute
  'embedding',
  'patch_embed',
  'linear',
  'layernorm',
  'rmsnorm',
  'rope',
  'attention',
  'gelu',
  'swiglu',
  'add',
  'merge_visual',
  'router_topk',
  'moe_permute',
  'grouped_linear',
  'moe_unpermute',
  'moe_aux_loss',
  'cross_entropy',
  // vocab-parallel cross-entropy and expert-parallel routing (emitted by the parallel passes)
  'vocab_logsumexp',
  'lse_combine',
  'vocab_target_logit',
  'ce_from_stats',
  'moe_rank_counts',
  'moe_sort_chunks',
  'moe_local_counts',
  // ViT data-parallel balance (passes/parallel/vit-balance.ts)
  'image_sizes',
  'vit_balance_route',
  'segment_offset',
  'gather_rows',
  // backward
  'embedding_grad',
  'linear_dgrad',
  'linear_wgrad',
  'layernorm_grad',
  'rmsnorm_grad',
  'rope_grad',
  'attention_grad',
  'gelu_grad',
  'swiglu_grad',
  'merge_visual_grad',
  'router_topk_grad',
  'moe_permute_grad',
  'grouped_linear_dgrad',
  'grouped_linear_wgrad',
  'linear_wgrad_accumulate',
  'grouped_linear_wgrad_accumulate',
  'moe_unpermute_grad',
  'moe_aux_loss_grad',
  'cross_entropy_grad',
  'vocab_logsumexp_grad',
  'lse_combine_grad',
  'vocab_target_logit_grad',
  'ce_from_stats_grad',
  'scatter_rows',
  // layout and constants
  'reshape',
  'split',
  'concat',
  'constant',
  // parallel-region boundaries (Megatron's copy_to / scatter_to regions): no communication
  // forward, a collective backward
  'copy_to_group',
  'group_slice',
  // optimizer (in place on persistent buffers)
  'grad_accumulate',
  'sum_squares',
  'clip_coef',
  'adamw',
  // collectives
  'all_reduce',
  'all_gather',
  'reduce_scatter',
  'broadcast',
  'all_to_all_v',
  'gather_v',
  'scatter_v',
  'all_gather_v',
  'reduce_scatter_v',
  'send',
  'recv',
  // memory
  'offload',
  'reload',
] as const;
export type OpKind = (typeof OP_KINDS)[number];

export type OpCategory = 'compute' | 'layout' | 'optimizer' | 'collective' | 'memory';

export type AttrType = 'number' | 'int' | 'bool' | 'string' | 'ints' | 'numbers' | 'dims' | 'dtype';
export interface AttrSpec {
  readonly type: AttrType;
  readonly required: boolean;
  readonly doc: string;
}

/**
 * How an op's matmul work runs on a GPU, for the cost model's efficiency curves
 * (compiler/sim/cost.ts). The op's FLOPs are this shape's (gemmCost, attentionCost).
 */
export type MatmulShape =
  /** `groups` GEMMs of m × n × k (a grouped GEMM: one per expert, m its mean rows) */
  | {
      readonly kind: 'gemm';
      readonly m: number;
      readonly n: number;
      readonly k: number;
      readonly groups: number;
    }
  /** flash attention: `tokens` queries over heads of `headDim`, each within `segment` tokens */
  | {
      readonly kind: 'attention';
      readonly backward: boolean;
      readonly causal: boolean;
      readonly tokens: number;
      readonly heads: number;
      readonly headDim: number;
      readonly segment: number;
    };

/** FLOPs of a matmul shape: 2·m·n·k per GEMM; attention 4·T·L·h·d forward (two GEMMs), twice
 * that backward, half of it causal */
export function matmulFlops(s: MatmulShape): number {
  if (s.kind === 'gemm') return 2 * s.m * s.n * s.k * s.groups;
  const forward = 4 * s.tokens * s.segment * s.heads * s.headDim;
  return ((s.backward ? 2 : 1) * forward) / (s.causal ? 2 : 1);
}

/** Resolved sizes of one node, for cost functions. */
export interface CostArgs {
  readonly inputs: readonly (readonly number[])[];
  readonly outputs: readonly (readonly number[])[];
  readonly attrs: Attrs;
}

export interface OpInfo {
  readonly summary: string;
  readonly category: OpCategory;
  /** [min, max] number of inputs; max Infinity for variadic */
  readonly inputs: readonly [number, number];
  readonly attrs: Readonly<Record<string, AttrSpec>>;
  /** output types from input types and attributes; throws ShapeError naming the problem */
  readonly shape: (inputs: readonly TensorType[], attrs: Attrs) => TensorType[];
  /** matmul FLOPs only (2·m·n·k), forward; causal attention at half the full work */
  readonly flops: (c: CostArgs) => number;
  /** how the matmul work runs, for the cost model's efficiency curves; absent: no matmul */
  readonly matmul?: (c: CostArgs) => MatmulShape;
  /** no side effects beyond its outputs (collectives, send/recv and memory moves are not pure) */
  readonly pure: boolean;
  /**
   * the inputs it updates in place, given its input count (the optimizer ops and the fused
   * weight-gradient accumulations, which have no outputs); absent: none
   */
  readonly updates?: (inputs: number) => readonly number[];
  readonly kernel: string;
}

// ---- helpers for shape rules ------------------------------------------------------------------

/** msg: the text, or a function that builds it (for checks on every node: built only on failure) */
function need(cond: boolean, msg: string | (() => string)): asserts cond {
  if (!cond) throw new ShapeError(typeof msg === 'string' ? msg : msg());
}

function floatT(t: TensorType, what: string): void {
  need(isFloat(t.dtype), () => `${what} must be a float tensor, got ${t.dtype}`);
}

function intT(t: TensorType, what: string): void {
  need(isInt(t.dtype), () => `${what} must be an integer tensor, got ${t.dtype}`);
}

/** all_gather_v, reduce_scatter_v: rows [n, H] and one count per group rank → [out_rows, H] */
function countedRowsShape(x: TensorType, counts: TensorType, attrs: Attrs): TensorType[] {
  need(x.shape.length === 2, () => `rows must have rank 2, got ${formatShape(x.shape)}`);
  intT(counts, 'counts');
  need(dimEq(counts.shape[0], num(attrs, 'group_size')), 'counts must have one entry per rank');
  const [rows] = dimsAttr(attrs, 'out_rows');
  return [{ dtype: x.dtype, shape: [rows, x.shape[1]] }];
}

function rank(t: TensorType, r: number, what: string): void {
  need(t.shape.length === r, () => `${what} must have rank ${r}, got ${formatShape(t.shape)}`);
}

function sameDim(a: Dim, b: Dim, what: string): void {
  need(dimEq(a, b), () => `${what}: ${formatShape([a])} ≠ ${formatShape([b])}`);
}

function last(s: Shape): Dim {
  return s[s.length - 1];
}

function num(attrs: Attrs, k: string): number {
  return attrs[k] as number;
}

function dimsAttr(attrs: Attrs, k: string): Dim[] {
  return (attrs[k] as readonly string[]).map(parseDim);
}

function elems(s: readonly number[]): number {
  return s.reduce((a, b) => a * b, 1);
}

const noFlops = (): number => 0;

/** an op's flops and matmul from its matmul shape */
function matmulCost(shape: (c: CostArgs) => MatmulShape): Pick<OpInfo, 'flops' | 'matmul'> {
  return { flops: (c) => matmulFlops(shape(c)), matmul: shape };
}

/** a plain GEMM of m × n × k */
const gemmCost = (f: (c: CostArgs) => readonly [number, number, number]) =>
  matmulCost((c) => {
    const [m, n, k] = f(c);
    return { kind: 'gemm', m, n, k, groups: 1 };
  });

/** a grouped GEMM over `counts`' experts: rows split among them, m × n × k each */
const groupedGemmCost = (
  f: (c: CostArgs) => { rows: number; experts: number; n: number; k: number; rowsAreK?: boolean },
) =>
  matmulCost((c) => {
    const { rows, experts, n, k, rowsAreK } = f(c);
    const per = rows / Math.max(1, experts);
    return rowsAreK
      ? { kind: 'gemm', m: n, n: k, k: per, groups: experts }
      : { kind: 'gemm', m: per, n, k, groups: experts };
  });

/** dW = dyᵀ·x: dy [..., out], x [..., in] (linear_wgrad, linear_wgrad_accumulate) */
const wgradCost = gemmCost(({ inputs: [dy, x] }) => [
  dy[dy.length - 1],
  x[x.length - 1],
  rowsOf(dy),
]);

/** dW_e = dy_eᵀ·x_e over counts' experts: dy [N, out], x [N, in], counts [E] (k: each expert's rows) */
const groupedWgradCost = groupedGemmCost(({ inputs: [dy, x, counts] }) => ({
  rows: dy[0],
  experts: counts[0],
  n: dy[1],
  k: x[1],
  rowsAreK: true,
}));

/** linear_wgrad's outputs: dW [out, in] (and db [out] with bias) of dy [..., out], x [..., in] */
function linearWgradShape([dy, x]: readonly TensorType[], attrs: Attrs): TensorType[] {
  floatT(dy, 'dy');
  floatT(x, 'x');
  need(sameNumel(dy.shape.slice(0, -1), x.shape.slice(0, -1)), 'dy and x rows differ');
  const dtype = dtypeOr(attrs, 'grad_dtype', dy.dtype);
  const out: TensorType[] = [{ dtype, shape: [last(dy.shape), last(x.shape)] }];
  if (attrs.bias) out.push({ dtype, shape: [last(dy.shape)] });
  return out;
}

/** grouped_linear_wgrad's outputs: dW_e [out, in] per expert of counts [E], dy [N, out], x [N, in] */
function groupedWgradShape([dy, x, counts]: readonly TensorType[], attrs: Attrs): TensorType[] {
  floatT(dy, 'dy');
  sameDim(dy.shape[0], x.shape[0], 'rows of dy vs x');
  const e = counts.shape[0];
  need(typeof e === 'number', 'expert count must be a number');
  return Array.from({ length: e }, () => ({
    dtype: dtypeOr(attrs, 'grad_dtype', dy.dtype),
    shape: [dy.shape[1], x.shape[1]],
  }));
}

/**
 * A fused accumulation's buffers against the gradients its unfused op would give: each a float
 * tensor of that gradient's shape (its element type is the buffer's own: the main gradient's)
 */
function accumulatorsMatch(
  acc: readonly TensorType[],
  grads: readonly TensorType[],
  /** gradient i's name and its dims' names */
  what: (i: number) => readonly [string, string],
): void {
  grads.forEach((g, i) => {
    const [name, dim] = what(i);
    floatT(acc[i], name);
    need(
      shapeEq(acc[i].shape, g.shape),
      () => `${name} ${formatShape(acc[i].shape)} vs ${dim} ${formatShape(g.shape)}`,
    );
  });
}

/** y = x·Wᵀ: x [..., in], W [out, in] */
const linearCost = gemmCost(({ inputs: [x, w] }) => [rowsOf(x), w[0], w[1]]);

/** attention over q [T, nh, d]: each query within the expected (else longest) segment */
const attentionCost = (backward: boolean, qAt: number) =>
  matmulCost(({ inputs, attrs }) => {
    const [t, nh, d] = inputs[qAt];
    const seg = Math.min(
      t,
      (attrs.expected_segment as number | undefined) ||
        (attrs.max_segment as number | undefined) ||
        t,
    );
    return {
      kind: 'attention',
      backward,
      causal: Boolean(attrs.causal),
      tokens: t,
      heads: nh,
      headDim: d,
      segment: seg,
    };
  });

const scalarF32: TensorType = { dtype: 'f32', shape: [] };

function attr(type: AttrType, doc: string, required = true): AttrSpec {
  return { type, required, doc };
}

/**
 * Mixed precision: an op whose output element type differs from its input's says so. `dtype` sets
 * the output's (the fp32 MoE router's linear over bf16 inputs; the dgrad back to the input's
 * type), `grad_dtype` the weight gradients' (fp32 main gradients of bf16 weights, as Megatron's
 * gradient-accumulation fusion writes them). Kernels read any float input type and compute in f32.
 */
const outDtypeAttrs = {
  dtype: attr('dtype', "element type of the output (default: the first input's)", false),
};
const gradDtypeAttrs = {
  grad_dtype: attr(
    'dtype',
    "element type of the weight gradients (default: dy's / the weight's)",
    false,
  ),
};

/** per-row statistics of low-precision values (log-sum-exp, target logits) are kept in f32 */
function statsDtype(d: DType): DType {
  return d === 'f64' ? 'f64' : 'f32';
}

function dtypeOr(attrs: Attrs, key: 'dtype' | 'grad_dtype', fallback: DType): DType {
  return (attrs[key] as DType | undefined) ?? fallback;
}

const collectiveAttrs = {
  group: attr('string', 'name of the process group'),
  group_size: attr('int', 'number of ranks in the group'),
};

/** a vocabulary split over the ranks of a group: this rank holds block groupRank(shard_group) */
const vocabShardAttrs = {
  shard_group: attr('string', 'group kind whose ranks split the vocabulary (e.g. tp)'),
  group_size: attr('int', 'ranks in that group: the vocabulary is group_size blocks'),
};
const optionalVocabShardAttrs = {
  shard_group: attr('string', 'vocab-parallel: group kind whose ranks split the table', false),
  group_size: attr('int', 'vocab-parallel: ranks in that group (with shard_group)', false),
};

function shardAttrsTogether(attrs: Attrs): void {
  need(
    (attrs.shard_group === undefined) === (attrs.group_size === undefined),
    'shard_group and group_size go together',
  );
  if (attrs.group_size !== undefined)
    need(
      num(attrs, 'group_size') >= 1,
      () => `group_size must be ≥ 1, got ${num(attrs, 'group_size')}`,
    );
}

function groupSize(attrs: Attrs): number {
  const p = num(attrs, 'group_size');
  need(p >= 1, () => `group_size must be ≥ 1, got ${p}`);
  return p;
}

function elementwise(inputs: readonly TensorType[]): TensorType[] {
  const [a, ...rest] = inputs;
  floatT(a, 'input');
  for (const b of rest) {
    need(b.dtype === a.dtype, () => `dtype mismatch: ${a.dtype} vs ${b.dtype}`);
    need(
      shapeEq(a.shape, b.shape),
      () => `shape mismatch: ${formatShape(a.shape)} vs ${formatShape(b.shape)}`,
    );
  }
  return [{ dtype: a.dtype, shape: a.shape }];
}

/**
 * moe_permute's rows dim: T·k assignments (n), or with a capacity the out_rows dim, which must
 * hold min(T·k, E·capacity) rows where both are numbers (a symbol's bound is the builder's).
 */
function keptRows(attrs: Attrs, n: Dim, experts: number): Dim {
  need(
    (attrs.capacity === undefined) === (attrs.out_rows === undefined),
    'capacity and out_rows go together',
  );
  if (attrs.capacity === undefined) return n;
  const capacity = num(attrs, 'capacity');
  need(capacity >= 1, () => `capacity must be ≥ 1, got ${capacity}`);
  const rows = dimsAttr(attrs, 'out_rows');
  need(rows.length === 1, () => `out_rows must be one dim, got ${rows.length}`);
  const [r] = rows;
  if (typeof r === 'number' && typeof n === 'number') {
    const kept = Math.min(n, experts * capacity);
    need(r >= kept, () => `out_rows ${r} cannot hold min(T·k, E·capacity) = ${kept} rows`);
  }
  return r;
}

// ---- the table -------------------------------------------------------------------------------

export const OP_TABLE = {
  embedding: {
    summary:
      'rows of a table at integer ids: ids [T], table [V, H] → [T, H]; vocab-parallel with ' +
      'shard_group: the table holds rows [r·V, (r+1)·V) of the vocabulary (r = the group rank), ' +
      'ids outside them give zero rows (Megatron VocabParallelEmbedding, before its all-reduce); ' +
      'with weights [T, K] and ids [T, K], the weighted sum of K rows (a bilinearly interpolated ' +
      'position table: K = 4)',
    category: 'compute',
    inputs: [2, 3],
    attrs: optionalVocabShardAttrs,
    shape: ([ids, table, weights], attrs) => {
      shardAttrsTogether(attrs);
      intT(ids, 'ids');
      floatT(table, 'table');
      rank(table, 2, 'table');
      if (!weights) return [{ dtype: table.dtype, shape: [...ids.shape, table.shape[1]] }];
      need(attrs.shard_group === undefined, 'a weighted embedding is not vocab-parallel');
      floatT(weights, 'weights');
      rank(ids, 2, 'ids');
      need(
        shapeEq(ids.shape, weights.shape),
        () => `ids ${formatShape(ids.shape)} and weights ${formatShape(weights.shape)} differ`,
      );
      return [{ dtype: table.dtype, shape: [ids.shape[0], table.shape[1]] }];
    },
    flops: noFlops,
    pure: true,
    kernel: 'embedding',
  },
  patch_embed: {
    summary: 'flattened patches to hidden: patches [Np, C], weight [H, C], bias? [H] → [Np, H]',
    category: 'compute',
    inputs: [2, 3],
    attrs: {},
    shape: ([x, w, b], attrs) => linearShape(x, w, b, attrs),
    ...linearCost,
    pure: true,
    kernel: 'linear',
  },
  linear: {
    summary: 'y = x·Wᵀ + b: x [..., in], W [out, in], b? [out] → [..., out]',
    category: 'compute',
    inputs: [2, 3],
    attrs: outDtypeAttrs,
    shape: ([x, w, b], attrs) => linearShape(x, w, b, attrs),
    ...linearCost,
    pure: true,
    kernel: 'linear',
  },
  layernorm: {
    summary: 'LayerNorm over the last dim with weight and bias: x [..., H], w [H], b [H]',
    category: 'compute',
    inputs: [3, 3],
    attrs: { eps: attr('number', 'added to the variance') },
    shape: ([x, w, b]) => {
      floatT(x, 'x');
      rank(w, 1, 'weight');
      rank(b, 1, 'bias');
      sameDim(w.shape[0], last(x.shape), 'weight size vs last dim of x');
      sameDim(b.shape[0], last(x.shape), 'bias size vs last dim of x');
      return [{ dtype: x.dtype, shape: x.shape }];
    },
    flops: noFlops,
    pure: true,
    kernel: 'layernorm',
  },
  rmsnorm: {
    summary: 'RMSNorm over the last dim with weight: x [..., H], w [H]',
    category: 'compute',
    inputs: [2, 2],
    attrs: { eps: attr('number', 'added to the mean square') },
    shape: ([x, w]) => {
      floatT(x, 'x');
      rank(w, 1, 'weight');
      sameDim(w.shape[0], last(x.shape), 'weight size vs last dim of x');
      return [{ dtype: x.dtype, shape: x.shape }];
    },
    flops: noFlops,
    pure: true,
    kernel: 'rmsnorm',
  },
  rope: {
    summary:
      'rotate-half RoPE over the head dim: x [T, nh, d], positions [T] or [T, sections] → x; ' +
      'section j rotates its share of the d/2 frequencies by positions[:, j]',
    category: 'compute',
    inputs: [2, 2],
    attrs: {
      theta: attr('number', 'base of the frequencies'),
      sections: attr('ints', 'frequencies per position section; sums to d/2'),
      layout: attr(
        'string',
        'which frequencies each section takes (kernels/cpu/rope.h): sectioned (absent; ' +
          'Qwen2.5-VL M-RoPE), interleaved (Qwen3-VL M-RoPE), per_axis (the ViTs’ 2-D RoPE)',
        false,
      ),
    },
    shape: ([x, pos], attrs) => ropeShape(x, pos, attrs),
    flops: noFlops,
    pure: true,
    kernel: 'rope',
  },
  attention: {
    summary:
      'scaled dot-product attention with GQA over packed segments: q [T, nh, d], k, v [T, nkv, d], ' +
      'segments [T] (−1 padding) → out [T, nh, d], lse f32 [T, nh] (log-sum-exp of the scores, for ' +
      'backward); causal within a segment, or block-diagonal; a padding token attends to itself',
    category: 'compute',
    inputs: [4, 4],
    attrs: {
      causal: attr('bool', 'causal inside each segment; otherwise bidirectional inside it'),
      scale: attr('number', 'multiplies q·k, usually 1/√d'),
      max_segment: attr('int', 'longest segment (window), for cost; 0 or absent: T', false),
      expected_segment: attr(
        'int',
        "the segment a query typically attends within (a data profile's packed samples), for " +
          'cost at the expected sizes; absent: max_segment',
        false,
      ),
      windows: attr(
        'bool',
        'the segments are attention windows, not contiguous runs (the kernels take their ' +
          'reference path: memory planning counts it)',
        false,
      ),
    },
    shape: ([q, k, v, seg]) => {
      for (const [t, n] of [
        [q, 'q'],
        [k, 'k'],
        [v, 'v'],
      ] as const) {
        floatT(t, n);
        rank(t, 3, n);
      }
      need(
        shapeEq(k.shape, v.shape),
        () => `k ${formatShape(k.shape)} and v ${formatShape(v.shape)} differ`,
      );
      sameDim(k.shape[0], q.shape[0], 'tokens of k vs q');
      sameDim(k.shape[2], q.shape[2], 'head dim of k vs q');
      const nh = q.shape[1];
      const nkv = k.shape[1];
      need(
        typeof nh === 'number' && typeof nkv === 'number' && nh % nkv === 0,
        () => `query heads ${String(nh)} must be a multiple of KV heads ${String(nkv)}`,
      );
      intT(seg, 'segments');
      rank(seg, 1, 'segments');
      sameDim(seg.shape[0], q.shape[0], 'segments vs tokens');
      return [
        { dtype: q.dtype, shape: q.shape },
        { dtype: 'f32', shape: [q.shape[0], nh] },
      ];
    },
    ...attentionCost(false, 0),
    pure: true,
    kernel: 'attention',
  },
  gelu: {
    summary: 'GELU: the tanh approximation, or exact (erf) with exact',
    category: 'compute',
    inputs: [1, 1],
    attrs: {
      exact: attr('bool', 'exact erf GELU (HF nn.GELU); absent: tanh approximation', false),
    },
    shape: elementwise,
    flops: noFlops,
    pure: true,
    kernel: 'gelu',
  },
  swiglu: {
    summary: 'silu(gate) · up, elementwise: gate, up [..., F] → [..., F]',
    category: 'compute',
    inputs: [2, 2],
    attrs: {},
    shape: elementwise,
    flops: noFlops,
    pure: true,
    kernel: 'swiglu',
  },
  add: {
    summary: 'a + b, same shapes',
    category: 'compute',
    inputs: [2, 2],
    attrs: {},
    shape: elementwise,
    flops: noFlops,
    pure: true,
    kernel: 'add',
  },
  merge_visual: {
    summary:
      'visual rows into the text at placeholder positions, in order: text [T, H], visual [Nv, H], ' +
      'tokens [T], image_token_id i32 [] (the microbatch’s placeholder) → [T, H]; mode replace ' +
      '(embeddings) or add (deepstack features)',
    category: 'compute',
    inputs: [4, 4],
    attrs: {
      mode: attr('string', "'replace' or 'add'"),
    },
    shape: ([text, vis, tokens, placeholder], attrs) => {
      intT(placeholder, 'image_token_id');
      rank(placeholder, 0, 'image_token_id');
      floatT(text, 'text');
      floatT(vis, 'visual');
      rank(text, 2, 'text');
      rank(vis, 2, 'visual');
      intT(tokens, 'tokens');
      rank(tokens, 1, 'tokens');
      sameDim(tokens.shape[0], text.shape[0], 'tokens vs text rows');
      sameDim(vis.shape[1], text.shape[1], 'visual hidden vs text hidden');
      need(vis.dtype === text.dtype, () => `dtype mismatch: ${vis.dtype} vs ${text.dtype}`);
      need(
        attrs.mode === 'replace' || attrs.mode === 'add',
        () => `mode must be replace or add, got ${String(attrs.mode)}`,
      );
      return [{ dtype: text.dtype, shape: text.shape }];
    },
    flops: noFlops,
    pure: true,
    kernel: 'merge_visual',
  },
  router_topk: {
    summary:
      'softmax over expert logits, top-k (ties to the lower index), weights renormalized to sum 1 ' +
      '(unless normalize is false: the top-k probabilities): ' +
      'logits [T, E] → probs [T, E], weights [T, k], experts i32 [T, k]',
    category: 'compute',
    inputs: [1, 1],
    attrs: {
      k: attr('int', 'experts per token'),
      normalize: attr('bool', 'renormalize the top-k probabilities (absent: true)', false),
    },
    shape: ([logits], attrs) => {
      floatT(logits, 'logits');
      rank(logits, 2, 'logits');
      const k = num(attrs, 'k');
      const e = logits.shape[1];
      need(
        typeof e === 'number' && k >= 1 && k <= e,
        () => `top-k ${k} must be in [1, ${String(e)}]`,
      );
      const t = logits.shape[0];
      return [
        { dtype: logits.dtype, shape: logits.shape },
        { dtype: logits.dtype, shape: [t, k] },
        { dtype: 'i32', shape: [t, k] },
      ];
    },
    flops: noFlops,
    pure: true,
    kernel: 'router_topk',
  },
  moe_permute: {
    summary:
      'rows grouped by expert (stable in token order): x [T, H], experts [T, k] → ' +
      'rows [T·k, H], counts i32 [E], row_of i32 [T·k] (row of assignment t·k+j). With capacity ' +
      "(Megatron's expert capacity): each expert keeps capacity of its assignments — drop policy " +
      'position: its first in assignment order (token, then choice j); probs: those of the ' +
      'highest routing weight (input 2), ties to the earlier — and drops the rest: counts ≤ ' +
      'capacity, row_of −1 for a dropped assignment (it adds nothing to its token and gets no ' +
      'gradient; the other weights are not renormalized), rows [out_rows, H] with the kept rows ' +
      'first and zeros after them',
    category: 'compute',
    inputs: [2, 3],
    attrs: {
      num_experts: attr('int', 'experts E (local to the rank after expert parallelism)'),
      capacity: attr('int', 'rows kept per expert; absent: no assignment is dropped', false),
      drop_policy: attr(
        'string',
        "with capacity: 'position' (default; the first assignments) or 'probs' (the highest " +
          'routing weights, given as input 2 [T, k]; ties to the earlier assignment)',
        false,
      ),
      out_rows: attr(
        'dims',
        'with capacity: the rows dim, one dim bounded by min(T·k, E·capacity) (a symbol the ' +
          'builder declares; the kernel checks the kept rows fit)',
        false,
      ),
    },
    shape: ([x, experts, weights], attrs) => {
      floatT(x, 'x');
      rank(x, 2, 'x');
      intT(experts, 'experts');
      rank(experts, 2, 'experts');
      sameDim(experts.shape[0], x.shape[0], 'experts vs tokens');
      const probs = attrs.drop_policy === 'probs';
      need(
        attrs.drop_policy === undefined || attrs.drop_policy === 'position' || probs,
        () => `drop_policy must be position or probs, got ${String(attrs.drop_policy)}`,
      );
      need(probs === (weights !== undefined), () =>
        probs
          ? 'drop_policy probs needs the routing weights [T, k] as input 2'
          : 'input 2 (routing weights) is only for drop_policy probs',
      );
      if (weights)
        need(shapeEq(weights.shape, experts.shape), 'weights must have the shape of experts');
      const k = experts.shape[1];
      need(typeof k === 'number', 'top-k must be a number');
      const e = num(attrs, 'num_experts');
      const n = dimMul(x.shape[0], k);
      return [
        { dtype: x.dtype, shape: [keptRows(attrs, n, e), x.shape[1]] },
        { dtype: 'i32', shape: [e] },
        { dtype: 'i32', shape: [n] },
      ];
    },
    flops: noFlops,
    pure: true,
    kernel: 'moe_permute',
  },
  grouped_linear: {
    summary:
      'one linear per expert over its consecutive rows: x [N, in], counts i32 [E], W_0 … W_{E−1} ' +
      '[out, in] → [N, out]',
    category: 'compute',
    inputs: [3, Infinity],
    attrs: {},
    shape: ([x, counts, ...ws]) => {
      floatT(x, 'x');
      rank(x, 2, 'x');
      intT(counts, 'counts');
      rank(counts, 1, 'counts');
      need(
        counts.shape[0] === ws.length,
        () => `counts has ${String(counts.shape[0])} experts, ${ws.length} weights given`,
      );
      const w0 = ws[0];
      rank(w0, 2, 'expert weight');
      for (const w of ws) {
        need(
          shapeEq(w.shape, w0.shape),
          () => `expert weights differ: ${formatShape(w.shape)} vs ${formatShape(w0.shape)}`,
        );
        need(w.dtype === x.dtype, () => `dtype mismatch: ${w.dtype} vs ${x.dtype}`);
      }
      sameDim(w0.shape[1], x.shape[1], 'expert weight in vs x');
      return [{ dtype: x.dtype, shape: [x.shape[0], w0.shape[0]] }];
    },
    ...groupedGemmCost(({ inputs: [x, counts, w] }) => ({
      rows: x[0],
      experts: counts[0],
      n: w[0],
      k: x[1],
    })),
    pure: true,
    kernel: 'grouped_linear',
  },
  moe_unpermute: {
    summary:
      "weighted sum of each token's expert rows: rows [N, H], row_of i32 [T·k], weights [T, k] → " +
      '[T, H]; an assignment with row_of −1 (dropped by capacity) adds nothing',
    category: 'compute',
    inputs: [3, 3],
    attrs: {},
    shape: ([rows, rowOf, w]) => {
      floatT(rows, 'rows');
      rank(rows, 2, 'rows');
      intT(rowOf, 'row_of');
      rank(w, 2, 'weights');
      const k = w.shape[1];
      need(typeof k === 'number', 'top-k must be a number');
      sameDim(rowOf.shape[0], dimMul(w.shape[0], k), 'row_of vs tokens·k');
      return [{ dtype: rows.dtype, shape: [w.shape[0], rows.shape[1]] }];
    },
    flops: noFlops,
    pure: true,
    kernel: 'moe_unpermute',
  },
  moe_aux_loss: {
    summary:
      'load-balancing loss coeff · E · Σₑ fₑ·Pₑ over non-padding tokens: probs [T, E], experts [T, k], ' +
      'segments [T] → scalar',
    category: 'compute',
    inputs: [3, 3],
    attrs: {
      coeff: attr('number', 'aux-loss coefficient divided by the microbatches of the global batch'),
    },
    shape: ([probs, experts, seg]) => {
      floatT(probs, 'probs');
      rank(probs, 2, 'probs');
      intT(experts, 'experts');
      sameDim(experts.shape[0], probs.shape[0], 'experts vs tokens');
      intT(seg, 'segments');
      sameDim(seg.shape[0], probs.shape[0], 'segments vs tokens');
      return [scalarF32];
    },
    flops: noFlops,
    pure: true,
    kernel: 'moe_aux_loss',
  },
  cross_entropy: {
    summary:
      'Σ over masked-in tokens of −log softmax(logits)[label], divided by the loss tokens of the ' +
      'global batch: logits [T, V], labels i32 [T], mask u8 [T], loss_tokens f32 [] → scalar',
    category: 'compute',
    inputs: [4, 4],
    attrs: {},
    shape: ([logits, labels, mask, count]) => {
      floatT(logits, 'logits');
      rank(logits, 2, 'logits');
      intT(labels, 'labels');
      intT(mask, 'mask');
      sameDim(labels.shape[0], logits.shape[0], 'labels vs tokens');
      sameDim(mask.shape[0], logits.shape[0], 'mask vs tokens');
      need(
        count.shape.length === 0,
        () => `loss_tokens must be a scalar, got ${formatShape(count.shape)}`,
      );
      return [scalarF32];
    },
    flops: noFlops,
    pure: true,
    kernel: 'cross_entropy',
  },
  // ---- vocab-parallel cross-entropy: logits are this rank's vocabulary block [T, Vl] -----------
  //   lse = lse_combine(all_gather(vocab_logsumexp(logits)))   target = all_reduce(vocab_target_logit)
  //   loss = ce_from_stats(lse, target, mask, loss_tokens)      (= cross_entropy on the whole vocab)
  vocab_logsumexp: {
    summary: "log-sum-exp of each row over this rank's vocabulary block: logits [T, Vl] → [T]",
    category: 'compute',
    inputs: [1, 1],
    attrs: {},
    shape: ([logits]) => {
      floatT(logits, 'logits');
      rank(logits, 2, 'logits');
      return [{ dtype: statsDtype(logits.dtype), shape: [logits.shape[0]] }];
    },
    flops: noFlops,
    pure: true,
    kernel: 'vocab_logsumexp',
  },
  lse_combine: {
    summary: 'log-sum-exp over dim 0 (the per-rank lse of every vocabulary block): x [P, T] → [T]',
    category: 'compute',
    inputs: [1, 1],
    attrs: {},
    shape: ([x]) => {
      floatT(x, 'x');
      rank(x, 2, 'x');
      return [{ dtype: x.dtype, shape: [x.shape[1]] }];
    },
    flops: noFlops,
    pure: true,
    kernel: 'lse_combine',
  },
  vocab_target_logit: {
    summary:
      "logits[t, labels[t] − r·Vl] where the label is in this rank's vocabulary block (r = the " +
      'group rank), else 0: logits [T, Vl], labels i32 [T], mask? u8 [T] → [T]; with the mask, ' +
      'masked-out rows give 0 unread and a masked-in label outside the vocabulary is an error',
    category: 'compute',
    inputs: [2, 3],
    attrs: vocabShardAttrs,
    shape: ([logits, labels, mask], attrs) => {
      groupSize(attrs);
      floatT(logits, 'logits');
      rank(logits, 2, 'logits');
      intT(labels, 'labels');
      rank(labels, 1, 'labels');
      sameDim(labels.shape[0], logits.shape[0], 'labels vs tokens');
      if (mask) {
        intT(mask, 'mask');
        rank(mask, 1, 'mask');
        sameDim(mask.shape[0], logits.shape[0], 'mask vs tokens');
      }
      return [{ dtype: statsDtype(logits.dtype), shape: [logits.shape[0]] }];
    },
    flops: noFlops,
    pure: true,
    kernel: 'vocab_target_logit',
  },
  ce_from_stats: {
    summary:
      'cross_entropy from its pieces: Σ over masked-in tokens of lse[t] − target[t], divided by the ' +
      'loss tokens of the global batch: lse [T], target [T], mask u8 [T], loss_tokens f32 [] → scalar',
    category: 'compute',
    inputs: [4, 4],
    attrs: {},
    shape: ([lse, target, mask, count]) => {
      floatT(lse, 'lse');
      rank(lse, 1, 'lse');
      floatT(target, 'target');
      need(
        shapeEq(target.shape, lse.shape),
        () => `target ${formatShape(target.shape)} vs lse ${formatShape(lse.shape)}`,
      );
      need(target.dtype === lse.dtype, () => `dtype mismatch: ${target.dtype} vs ${lse.dtype}`);
      intT(mask, 'mask');
      rank(mask, 1, 'mask');
      sameDim(mask.shape[0], lse.shape[0], 'mask vs tokens');
      need(
        count.shape.length === 0,
        () => `loss_tokens must be a scalar, got ${formatShape(count.shape)}`,
      );
      return [scalarF32];
    },
    flops: noFlops,
    pure: true,
    kernel: 'ce_from_stats',
  },
  // ---- expert parallelism: P ranks of the ep group, L = E/P local experts per rank ---------------
  moe_rank_counts: {
    summary:
      'rows for each rank of the ep group: counts i32 [E] → i32 [P], the sums of consecutive blocks ' +
      'of E/P experts (the send counts of the dispatch all_to_all_v)',
    category: 'compute',
    inputs: [1, 1],
    attrs: { group_size: attr('int', 'ranks P of the expert-parallel group') },
    shape: ([counts], attrs) => {
      intT(counts, 'counts');
      rank(counts, 1, 'counts');
      const p = groupSize(attrs);
      const e = counts.shape[0];
      need(
        typeof e === 'number' && e % p === 0,
        () => `experts ${formatShape([e])} must be a multiple of group_size ${p}`,
      );
      return [{ dtype: 'i32', shape: [p] }];
    },
    flops: noFlops,
    pure: true,
    kernel: 'moe_rank_counts',
  },
  moe_sort_chunks: {
    summary:
      'reorders blocks of rows: rows [N, H] arrive as blocks (source rank p, local expert l) in p-major ' +
      'order with counts[p, l] rows each and leave l-major (expert l, then p); inverse: the reverse. ' +
      'counts i32 [P, L]; rows past Σ counts pass through unchanged (Megatron sort_chunks_by_idxs)',
    category: 'compute',
    inputs: [2, 2],
    attrs: { inverse: attr('bool', 'rows arrive l-major and leave p-major') },
    shape: ([rows, counts]) => {
      floatT(rows, 'rows');
      rank(rows, 2, 'rows');
      intT(counts, 'counts');
      rank(counts, 2, 'counts');
      return [{ dtype: rows.dtype, shape: rows.shape }];
    },
    flops: noFlops,
    pure: true,
    kernel: 'moe_sort_chunks',
  },
  moe_local_counts: {
    summary:
      'rows per local expert over every source rank: counts i32 [P, L] → i32 [L] (column sums)',
    category: 'compute',
    inputs: [1, 1],
    attrs: {},
    shape: ([counts]) => {
      intT(counts, 'counts');
      rank(counts, 2, 'counts');
      return [{ dtype: 'i32', shape: [counts.shape[1]] }];
    },
    flops: noFlops,
    pure: true,
    kernel: 'moe_local_counts',
  },
  // ---- ViT data-parallel balance (DESIGN.md "Parallel topology"; passes/parallel/vit-balance.ts) -
  image_sizes: {
    summary:
      'patches of each image of a microbatch: segments i32 [N] (image index of each patch, images ' +
      'contiguous in index order) → i32 [images], zero past the last image',
    category: 'compute',
    inputs: [1, 1],
    attrs: { images: attr('int', 'images a microbatch may hold (the length of the output)') },
    shape: ([seg], attrs) => {
      intT(seg, 'segments');
      rank(seg, 1, 'segments');
      need(num(attrs, 'images') >= 1, () => `images must be ≥ 1, got ${num(attrs, 'images')}`);
      return [{ dtype: 'i32', shape: [num(attrs, 'images')] }];
    },
    flops: noFlops,
    pure: true,
    kernel: 'image_sizes',
  },
  vit_balance_route: {
    summary:
      'the balancing rule over the images of every rank of the group (all_sizes i32 [P·images], ' +
      "rank p's block p; segments i32 [N] this rank's patches): cost of an image = patches², " +
      'images by cost descending then global index, each to the rank with the least cost so far ' +
      '(ties to the lower rank) among ranks with room for its patches (≤ capacity rows each; ' +
      'none: every image stays home). → send i32 [P] patch rows to each rank, order i32 [N] this ' +
      "rank's patch rows in send order (by destination, then image), back i32 [P] visual tokens " +
      'to return to each rank, inverse i32 [N/merge] the row of each own visual token in the ' +
      'returned rows, moved f32 [] images of the group encoded away from home',
    category: 'compute',
    inputs: [2, 2],
    attrs: {
      ...collectiveAttrs,
      images: attr('int', 'images per rank in all_sizes'),
      merge: attr('int', 'patches per visual token (spatial merge²)'),
      capacity: attr('int', 'patch rows a rank may receive (the bound it was planned for)'),
    },
    shape: ([all, seg], attrs) => {
      intT(all, 'all_sizes');
      intT(seg, 'segments');
      rank(seg, 1, 'segments');
      const p = groupSize(attrs);
      sameDim(all.shape[0], p * num(attrs, 'images'), 'all_sizes vs group_size × images');
      const merge = num(attrs, 'merge');
      need(merge >= 1, () => `merge must be ≥ 1, got ${merge}`);
      return [
        { dtype: 'i32', shape: [p] },
        { dtype: 'i32', shape: seg.shape },
        { dtype: 'i32', shape: [p] },
        { dtype: 'i32', shape: [dimDiv(seg.shape[0], merge)] },
        scalarF32,
      ];
    },
    flops: noFlops,
    pure: true,
    kernel: 'vit_balance_route',
  },
  segment_offset: {
    summary:
      'segment ids unique over a group: x i32 [N] → x + r·stride where x ≥ 0 (r = the group rank), ' +
      '−1 (padding) unchanged',
    category: 'compute',
    inputs: [1, 1],
    attrs: { ...collectiveAttrs, stride: attr('int', 'ids a rank may use (> its largest id)') },
    shape: ([x], attrs) => {
      intT(x, 'segments');
      groupSize(attrs);
      return [{ dtype: x.dtype, shape: x.shape }];
    },
    flops: noFlops,
    pure: true,
    kernel: 'segment_offset',
  },
  gather_rows: {
    summary:
      'rows picked by index: x [N, ...] (any dtype), index i32 [M] → [M, ...], y[i] = x[index[i]]',
    category: 'compute',
    inputs: [2, 2],
    attrs: {},
    shape: ([x, index]) => {
      need(x.shape.length >= 1, 'gather_rows needs rank ≥ 1');
      intT(index, 'index');
      rank(index, 1, 'index');
      return [{ dtype: x.dtype, shape: [index.shape[0], ...x.shape.slice(1)] }];
    },
    flops: noFlops,
    pure: true,
    kernel: 'gather_rows',
  },
  // ---- backward ops: the grad rules in passes/grad-rules.ts emit these ---------------------------
  embedding_grad: {
    summary:
      'dtable [rows, H] = Σ over tokens of dy[t] at row ids[t]: dy [T, H], ids [T]; with ' +
      "shard_group, at row ids[t] − r·rows for the ids of this rank's block only; with weights " +
      '[T, K] (ids [T, K]), weights[t, k]·dy[t] at row ids[t, k]',
    category: 'compute',
    inputs: [2, 3],
    attrs: {
      rows: attr('int', 'rows of the table'),
      ...optionalVocabShardAttrs,
      ...gradDtypeAttrs,
    },
    shape: ([dy, ids], attrs) => {
      shardAttrsTogether(attrs);
      floatT(dy, 'dy');
      intT(ids, 'ids');
      sameDim(ids.shape[0], dy.shape[0], 'ids vs tokens of dy');
      const dtype = dtypeOr(attrs, 'grad_dtype', dy.dtype);
      return [{ dtype, shape: [num(attrs, 'rows'), last(dy.shape)] }];
    },
    flops: noFlops,
    pure: true,
    kernel: 'embedding_backward',
  },
  scatter_rows: {
    summary:
      "gather_rows' gradient: dx [rows, ...] = Σ over i of dy[i] at row index[i] (zero elsewhere): " +
      'dy [M, ...], index i32 [M]',
    category: 'compute',
    inputs: [2, 2],
    attrs: { rows: attr('dims', 'rows of dx, one dim') },
    shape: ([dy, index], attrs) => {
      floatT(dy, 'dy');
      intT(index, 'index');
      rank(index, 1, 'index');
      sameDim(index.shape[0], dy.shape[0], 'index vs rows of dy');
      const rows = dimsAttr(attrs, 'rows');
      need(rows.length === 1, () => `rows has ${rows.length} dims, want one`);
      return [{ dtype: dy.dtype, shape: [rows[0], ...dy.shape.slice(1)] }];
    },
    flops: noFlops,
    pure: true,
    kernel: 'scatter_rows',
  },
  linear_dgrad: {
    summary: 'dx = dy·W: dy [..., out], W [out, in] → [..., in]',
    category: 'compute',
    inputs: [2, 2],
    attrs: outDtypeAttrs,
    shape: ([dy, w], attrs) => {
      floatT(dy, 'dy');
      rank(w, 2, 'weight');
      sameDim(last(dy.shape), w.shape[0], 'dy features vs weight out-features');
      const dtype = dtypeOr(attrs, 'dtype', dy.dtype);
      return [{ dtype, shape: [...dy.shape.slice(0, -1), w.shape[1]] }];
    },
    ...gemmCost(({ inputs: [dy, w] }) => [rowsOf(dy), w[1], w[0]]),
    pure: true,
    kernel: 'linear_backward_data',
  },
  linear_wgrad: {
    summary: 'dW = dyᵀ·x [out, in] (and db = Σ dy [out] with bias): dy [..., out], x [..., in]',
    category: 'compute',
    inputs: [2, 2],
    attrs: { bias: attr('bool', 'also give the bias gradient'), ...gradDtypeAttrs },
    shape: linearWgradShape,
    ...wgradCost,
    pure: true,
    kernel: 'linear_backward_weight',
  },
  layernorm_grad: {
    summary: 'LayerNorm backward: dy, x, w → dx, dw, db',
    category: 'compute',
    inputs: [3, 3],
    attrs: { eps: attr('number', 'as in the forward'), ...gradDtypeAttrs },
    shape: ([dy, x, w], attrs) => {
      need(
        shapeEq(dy.shape, x.shape),
        () => `dy ${formatShape(dy.shape)} vs x ${formatShape(x.shape)}`,
      );
      const dtype = dtypeOr(attrs, 'grad_dtype', w.dtype);
      return [
        { dtype: x.dtype, shape: x.shape },
        { dtype, shape: w.shape },
        { dtype, shape: w.shape },
      ];
    },
    flops: noFlops,
    pure: true,
    kernel: 'layernorm_backward',
  },
  rmsnorm_grad: {
    summary: 'RMSNorm backward: dy, x, w → dx, dw',
    category: 'compute',
    inputs: [3, 3],
    attrs: { eps: attr('number', 'as in the forward'), ...gradDtypeAttrs },
    shape: ([dy, x, w], attrs) => {
      need(
        shapeEq(dy.shape, x.shape),
        () => `dy ${formatShape(dy.shape)} vs x ${formatShape(x.shape)}`,
      );
      return [
        { dtype: x.dtype, shape: x.shape },
        { dtype: dtypeOr(attrs, 'grad_dtype', w.dtype), shape: w.shape },
      ];
    },
    flops: noFlops,
    pure: true,
    kernel: 'rmsnorm_backward',
  },
  rope_grad: {
    summary: 'RoPE backward (rotation by the opposite angle): dy [T, nh, d], positions → dx',
    category: 'compute',
    inputs: [2, 2],
    attrs: {
      theta: attr('number', 'as in the forward'),
      sections: attr('ints', 'as in the forward'),
      layout: attr('string', 'as in the forward', false),
    },
    shape: ([dy, pos], attrs) => ropeShape(dy, pos, attrs),
    flops: noFlops,
    pure: true,
    kernel: 'rope_backward',
  },
  attention_grad: {
    summary: 'attention backward: dout, q, k, v, segments, out, lse → dq, dk, dv',
    category: 'compute',
    inputs: [7, 7],
    attrs: {
      causal: attr('bool', 'as in the forward'),
      scale: attr('number', 'as in the forward'),
      max_segment: attr('int', 'as in the forward', false),
      expected_segment: attr('int', 'as in the forward', false),
      windows: attr('bool', 'as in the forward', false),
    },
    shape: ([dout, q, k, v]) => {
      need(
        shapeEq(dout.shape, q.shape),
        () => `dout ${formatShape(dout.shape)} vs q ${formatShape(q.shape)}`,
      );
      return [q, k, v].map((t) => ({ dtype: t.dtype, shape: t.shape }));
    },
    ...attentionCost(true, 1),
    pure: true,
    kernel: 'attention_backward',
  },
  gelu_grad: {
    summary: 'GELU backward: dy, x → dx',
    category: 'compute',
    inputs: [2, 2],
    attrs: { exact: attr('bool', 'as in the forward', false) },
    shape: elementwise,
    flops: noFlops,
    pure: true,
    kernel: 'gelu_backward',
  },
  swiglu_grad: {
    summary: 'SwiGLU backward: dy, gate, up → dgate, dup',
    category: 'compute',
    inputs: [3, 3],
    attrs: {},
    shape: (inputs) => {
      const [t] = elementwise(inputs);
      return [t, t];
    },
    flops: noFlops,
    pure: true,
    kernel: 'swiglu_backward',
  },
  merge_visual_grad: {
    summary:
      'merge_visual backward: dy [T, H], tokens [T], image_token_id [] → dtext [T, H] (zero at ' +
      'replaced rows in replace mode), dvisual [visual_rows, H]',
    category: 'compute',
    inputs: [3, 3],
    attrs: {
      mode: attr('string', 'as in the forward'),
      visual_rows: attr('dims', 'rows of the visual input, one dim'),
    },
    shape: ([dy, tokens], attrs) => {
      floatT(dy, 'dy');
      rank(dy, 2, 'dy');
      intT(tokens, 'tokens');
      const [rows] = dimsAttr(attrs, 'visual_rows');
      return [
        { dtype: dy.dtype, shape: dy.shape },
        { dtype: dy.dtype, shape: [rows, dy.shape[1]] },
      ];
    },
    flops: noFlops,
    pure: true,
    kernel: 'merge_visual_backward',
  },
  router_topk_grad: {
    summary:
      'router backward with the selection held fixed: dprobs [T, E], dweights [T, k], probs [T, E], ' +
      'experts [T, k] → dlogits [T, E]',
    category: 'compute',
    inputs: [4, 4],
    attrs: { normalize: attr('bool', 'as in the forward', false) },
    shape: ([dprobs, dweights, probs, experts]) => {
      need(shapeEq(dprobs.shape, probs.shape), 'dprobs vs probs');
      need(shapeEq(dweights.shape, experts.shape), 'dweights vs experts');
      return [{ dtype: probs.dtype, shape: probs.shape }];
    },
    flops: noFlops,
    pure: true,
    kernel: 'router_topk_backward',
  },
  moe_permute_grad: {
    summary:
      'moe_permute backward: drows [N, H], row_of [T·k] → dx [T, H] (dx[t] = Σⱼ drows[row_of[t·k+j]] ' +
      'over the assignments not dropped, row_of ≥ 0)',
    category: 'compute',
    inputs: [2, 2],
    attrs: { k: attr('int', 'experts per token') },
    shape: ([drows, rowOf], attrs) => {
      floatT(drows, 'drows');
      rank(drows, 2, 'drows');
      intT(rowOf, 'row_of');
      rank(rowOf, 1, 'row_of');
      // N is T·k, or the kept rows under a capacity: the tokens come from row_of
      return [
        { dtype: drows.dtype, shape: [dimDiv(rowOf.shape[0], num(attrs, 'k')), drows.shape[1]] },
      ];
    },
    flops: noFlops,
    pure: true,
    kernel: 'moe_permute_backward',
  },
  grouped_linear_dgrad: {
    summary: 'grouped_linear backward for the rows: dy [N, out], counts [E], W_0 … → dx [N, in]',
    category: 'compute',
    inputs: [3, Infinity],
    attrs: {},
    shape: ([dy, counts, ...ws]) => {
      floatT(dy, 'dy');
      need(
        counts.shape[0] === ws.length,
        () => `counts has ${String(counts.shape[0])} experts, ${ws.length} weights given`,
      );
      sameDim(ws[0].shape[0], dy.shape[1], 'expert weight out vs dy');
      return [{ dtype: dy.dtype, shape: [dy.shape[0], ws[0].shape[1]] }];
    },
    ...groupedGemmCost(({ inputs: [dy, counts, w] }) => ({
      rows: dy[0],
      experts: counts[0],
      n: w[1],
      k: dy[1],
    })),
    pure: true,
    kernel: 'grouped_linear_backward_data',
  },
  grouped_linear_wgrad: {
    summary:
      'grouped_linear backward for the weights: dy [N, out], x [N, in], counts [E] → dW_0 … dW_{E−1}',
    category: 'compute',
    inputs: [3, 3],
    attrs: gradDtypeAttrs,
    shape: groupedWgradShape,
    ...groupedWgradCost,
    pure: true,
    kernel: 'grouped_linear_backward_weight',
  },
  // ---- weight gradients summed by their GEMM (the wgrad-accumulation pass) --------------------
  linear_wgrad_accumulate: {
    summary:
      "dW += dyᵀ·x (and db += Σ dy with bias): linear_wgrad summed into the step's gradient " +
      "buffers by the GEMM itself (Megatron's gradient-accumulation fusion): dy [..., out], " +
      'x [..., in], dW [out, in] (, db [out])',
    category: 'compute',
    inputs: [3, 4],
    attrs: { bias: attr('bool', 'also accumulate the bias gradient (a fourth input)') },
    shape: ([dy, x, ...acc], attrs) => {
      const grads = linearWgradShape([dy, x], attrs);
      need(acc.length === grads.length, 'a bias gradient is the fourth input, with bias');
      accumulatorsMatch(acc, grads, (i) => (i === 0 ? ['dW', '[out, in]'] : ['db', '[out]']));
      return [];
    },
    ...wgradCost,
    pure: false,
    updates: (n) => (n === 4 ? [2, 3] : [2]),
    kernel: 'linear_backward_weight',
  },
  grouped_linear_wgrad_accumulate: {
    summary:
      "dW_e += dy_eᵀ·x_e for each expert e: grouped_linear_wgrad summed into the step's gradient " +
      'buffers by the grouped GEMM: dy [N, out], x [N, in], counts [E], dW_0 … dW_{E−1} [out, in]',
    category: 'compute',
    inputs: [4, Infinity],
    attrs: {},
    shape: ([dy, x, counts, ...dws], attrs) => {
      floatT(x, 'x');
      intT(counts, 'counts');
      const grads = groupedWgradShape([dy, x, counts], attrs);
      need(
        dws.length === grads.length,
        () =>
          `counts has ${formatShape(counts.shape)} experts, ${dws.length} gradient buffers given`,
      );
      accumulatorsMatch(dws, grads, () => ['dW', '[out, in]']);
      return [];
    },
    ...groupedWgradCost,
    pure: false,
    updates: (n) => Array.from({ length: n - 3 }, (_, i) => 3 + i),
    kernel: 'grouped_linear_backward_weight',
  },
  moe_unpermute_grad: {
    summary:
      'moe_unpermute backward: dy [T, H], rows [N, H], row_of, weights [T, k] → drows [N, H] (zero ' +
      'at rows no assignment reads), dweights [T, k] (0 where row_of is −1)',
    category: 'compute',
    inputs: [4, 4],
    attrs: {},
    shape: ([dy, rows, , w]) => {
      floatT(dy, 'dy');
      sameDim(dy.shape[1], rows.shape[1], 'hidden of dy vs rows');
      return [
        { dtype: rows.dtype, shape: rows.shape },
        { dtype: w.dtype, shape: w.shape },
      ];
    },
    flops: noFlops,
    pure: true,
    kernel: 'moe_unpermute_backward',
  },
  moe_aux_loss_grad: {
    summary: 'auxiliary-loss backward: dloss [], probs [T, E], experts, segments → dprobs [T, E]',
    category: 'compute',
    inputs: [4, 4],
    attrs: { coeff: attr('number', 'as in the forward') },
    shape: ([dloss, probs]) => {
      need(dloss.shape.length === 0, 'dloss must be a scalar');
      return [{ dtype: probs.dtype, shape: probs.shape }];
    },
    flops: noFlops,
    pure: true,
    kernel: 'moe_aux_loss_backward',
  },
  cross_entropy_grad: {
    summary: 'cross-entropy backward: dloss [], logits, labels, mask, loss_tokens → dlogits',
    category: 'compute',
    inputs: [5, 5],
    attrs: {},
    shape: ([dloss, logits]) => {
      need(dloss.shape.length === 0, 'dloss must be a scalar');
      return [{ dtype: logits.dtype, shape: logits.shape }];
    },
    flops: noFlops,
    pure: true,
    kernel: 'cross_entropy_backward',
  },
  vocab_logsumexp_grad: {
    summary:
      'vocab_logsumexp backward: dy [T], logits [T, Vl], lse [T] → dlogits = dy·exp(logits − lse)',
    category: 'compute',
    inputs: [3, 3],
    attrs: {},
    shape: ([dy, logits, lse]) => {
      floatT(dy, 'dy');
      rank(logits, 2, 'logits');
      for (const [t, n] of [
        [dy, 'dy'],
        [lse, 'lse'],
      ] as const) {
        rank(t, 1, n);
        sameDim(t.shape[0], logits.shape[0], `${n} vs tokens`);
      }
      return [{ dtype: logits.dtype, shape: logits.shape }];
    },
    flops: noFlops,
    pure: true,
    kernel: 'vocab_logsumexp_backward',
  },
  lse_combine_grad: {
    summary: 'lse_combine backward: dy [T], x [P, T], y [T] → dx = dy·exp(x − y) [P, T]',
    category: 'compute',
    inputs: [3, 3],
    attrs: {},
    shape: ([dy, x, y]) => {
      floatT(dy, 'dy');
      rank(x, 2, 'x');
      for (const [t, n] of [
        [dy, 'dy'],
        [y, 'y'],
      ] as const) {
        rank(t, 1, n);
        sameDim(t.shape[0], x.shape[1], `${n} vs tokens`);
      }
      return [{ dtype: x.dtype, shape: x.shape }];
    },
    flops: noFlops,
    pure: true,
    kernel: 'lse_combine_backward',
  },
  vocab_target_logit_grad: {
    summary:
      'vocab_target_logit backward: dy [T], labels i32 [T], mask? → dlogits [T, columns], dy[t] at ' +
      "the label's column where it is in this rank's block, 0 elsewhere",
    category: 'compute',
    inputs: [2, 3],
    attrs: {
      ...vocabShardAttrs,
      columns: attr('int', "vocabulary columns Vl of the logits (this rank's block)"),
      ...outDtypeAttrs,
    },
    shape: ([dy, labels], attrs) => {
      groupSize(attrs);
      floatT(dy, 'dy');
      rank(dy, 1, 'dy');
      intT(labels, 'labels');
      sameDim(labels.shape[0], dy.shape[0], 'labels vs tokens');
      const dtype = dtypeOr(attrs, 'dtype', dy.dtype);
      return [{ dtype, shape: [dy.shape[0], num(attrs, 'columns')] }];
    },
    flops: noFlops,
    pure: true,
    kernel: 'vocab_target_logit_backward',
  },
  ce_from_stats_grad: {
    summary:
      'ce_from_stats backward: dloss [], lse [T], mask u8 [T], loss_tokens [] → dlse = ' +
      'dloss·mask/loss_tokens, dtarget = −dlse',
    category: 'compute',
    inputs: [4, 4],
    attrs: {},
    shape: ([dloss, lse, mask]) => {
      need(dloss.shape.length === 0, 'dloss must be a scalar');
      floatT(lse, 'lse');
      rank(lse, 1, 'lse');
      intT(mask, 'mask');
      sameDim(mask.shape[0], lse.shape[0], 'mask vs tokens');
      return [
        { dtype: lse.dtype, shape: lse.shape },
        { dtype: lse.dtype, shape: lse.shape },
      ];
    },
    flops: noFlops,
    pure: true,
    kernel: 'ce_from_stats_backward',
  },
  // ---- layout and constants ---------------------------------------------------------------------
  reshape: {
    summary: 'same elements, new shape (row-major); the output is a view of the input',
    category: 'layout',
    inputs: [1, 1],
    attrs: { shape: attr('dims', 'the new shape') },
    shape: ([x], attrs) => {
      const shape = dimsAttr(attrs, 'shape');
      need(
        sameNumel(x.shape, shape),
        () => `cannot reshape ${formatShape(x.shape)} to ${formatShape(shape)}`,
      );
      return [{ dtype: x.dtype, shape }];
    },
    flops: noFlops,
    pure: true,
    kernel: 'reshape',
  },
  split: {
    summary: 'split along the last dim into parts of the given sizes',
    category: 'layout',
    inputs: [1, 1],
    attrs: { sizes: attr('ints', 'size of each part along the last dim') },
    shape: ([x], attrs) => {
      const sizes = attrs.sizes as readonly number[];
      const total = sizes.reduce((a, b) => a + b, 0);
      need(
        dimEq(last(x.shape), total),
        () => `parts sum to ${total}, last dim is ${formatShape([last(x.shape)])}`,
      );
      return sizes.map((s) => ({ dtype: x.dtype, shape: [...x.shape.slice(0, -1), s] }));
    },
    flops: noFlops,
    pure: true,
    kernel: 'split',
  },
  concat: {
    summary: 'concatenate along the last dim (the inverse of split)',
    category: 'layout',
    inputs: [1, Infinity],
    attrs: {},
    shape: (inputs) => {
      const [a] = inputs;
      let total = 0;
      for (const t of inputs) {
        need(t.dtype === a.dtype, () => `dtype mismatch: ${t.dtype} vs ${a.dtype}`);
        need(shapeEq(t.shape.slice(0, -1), a.shape.slice(0, -1)), 'leading dims differ');
        const l = last(t.shape);
        need(typeof l === 'number', 'the concatenated dim must be a number');
        total += l;
      }
      return [{ dtype: a.dtype, shape: [...a.shape.slice(0, -1), total] }];
    },
    flops: noFlops,
    pure: true,
    kernel: 'concat',
  },
  constant: {
    summary: 'a tensor filled with one value',
    category: 'layout',
    inputs: [0, 0],
    attrs: {
      value: attr('number', 'every element'),
      dtype: attr('dtype', 'element type'),
      shape: attr('dims', 'shape'),
    },
    shape: (_inputs, attrs) => [{ dtype: attrs.dtype as DType, shape: dimsAttr(attrs, 'shape') }],
    flops: noFlops,
    pure: true,
    kernel: 'fill',
  },
  copy_to_group: {
    summary:
      'enters a parallel region: the identity forward; backward all-reduces the gradient over the ' +
      "group (Megatron's copy_to_tensor_model_parallel_region)",
    category: 'layout',
    inputs: [1, 1],
    attrs: collectiveAttrs,
    shape: ([x], attrs) => {
      groupSize(attrs);
      return [{ dtype: x.dtype, shape: x.shape }];
    },
    flops: noFlops,
    pure: true,
    kernel: 'copy',
  },
  group_slice: {
    summary:
      'keeps block r of dim 0 (r = this rank in the group) of a replicated tensor: [P·n, ...] → ' +
      "[n, ...]; backward all-gathers (Megatron's scatter_to_sequence_parallel_region)",
    category: 'layout',
    inputs: [1, 1],
    attrs: collectiveAttrs,
    shape: ([x], attrs) => {
      need(x.shape.length >= 1, 'group_slice needs rank ≥ 1');
      return [
        { dtype: x.dtype, shape: [dimDiv(x.shape[0], groupSize(attrs)), ...x.shape.slice(1)] },
      ];
    },
    flops: noFlops,
    pure: true,
    kernel: 'group_slice',
  },
  // ---- optimizer step: in place on persistent buffers, so no outputs --------------------------
  grad_accumulate: {
    summary: "acc += g: a microbatch's gradient into the step's gradient buffer (a grad parameter)",
    category: 'optimizer',
    inputs: [2, 2],
    attrs: {},
    shape: ([g, acc]) => {
      need(
        shapeEq(g.shape, acc.shape),
        () => `gradient ${formatShape(g.shape)} vs buffer ${formatShape(acc.shape)}`,
      );
      return [];
    },
    flops: noFlops,
    pure: false,
    updates: () => [1],
    kernel: 'accumulate',
  },
  sum_squares: {
    summary:
      'Σ_i scales[i] · Σ x_i² over every element of every input (global gradient norm²; a rank ' +
      "weighs each gradient by 1 / its copies in the world before the world's sum)",
    category: 'optimizer',
    inputs: [1, Infinity],
    attrs: { scales: attr('numbers', 'weight of each input (default 1 each)', false) },
    shape: (inputs, attrs) => {
      for (const t of inputs) floatT(t, 'input');
      const scales = attrs.scales as readonly number[] | undefined;
      need(
        scales === undefined || scales.length === inputs.length,
        () => `scales has ${scales?.length} entries for ${inputs.length} inputs`,
      );
      return [scalarF32];
    },
    flops: noFlops,
    pure: true,
    kernel: 'sum_squares',
  },
  clip_coef: {
    summary: 'min(1, max_norm / (√sumsq + 1e-6)): the clipping factor of clip_grad_norm_',
    category: 'optimizer',
    inputs: [1, 1],
    attrs: { max_norm: attr('number', 'largest gradient norm kept') },
    shape: ([s]) => {
      need(s.shape.length === 0, 'sumsq must be a scalar');
      return [scalarF32];
    },
    flops: noFlops,
    pure: true,
    kernel: 'clip_coef',
  },
  adamw: {
    summary:
      'AdamW in place with clipping: param, grad, m, v, clip_coef [] (g ← g·clip_coef); lr and step ' +
      'come from the schedule at run time; with a sixth input, the fp32 master weights (mixed ' +
      'precision): the update runs on master and param becomes master rounded to its type',
    category: 'optimizer',
    inputs: [5, 6],
    attrs: {
      beta1: attr('number', 'first-moment decay'),
      beta2: attr('number', 'second-moment decay'),
      eps: attr('number', 'added to √v̂'),
      weight_decay: attr('number', 'decoupled weight decay'),
    },
    shape: ([p, g, m, v, c, master]) => {
      floatT(p, 'param');
      need(
        master !== undefined || p.dtype === 'f32' || p.dtype === 'f64',
        () => `a ${p.dtype} param needs its fp32 master weights (a sixth input)`,
      );
      if (master) need(master.dtype === 'f32', () => `master must be f32, got ${master.dtype}`);
      for (const [t, n] of [
        [g, 'grad'],
        [m, 'm'],
        [v, 'v'],
        ...(master ? [[master, 'master'] as const] : []),
      ] as const) {
        need(
          shapeEq(t.shape, p.shape),
          () => `${n} ${formatShape(t.shape)} vs param ${formatShape(p.shape)}`,
        );
        floatT(t, n);
      }
      need(c.shape.length === 0, 'clip_coef must be a scalar');
      return [];
    },
    flops: noFlops,
    pure: false,
    // param, grad (scaled by clip_coef), m, v, and the master weights when given
    updates: (n) => (n === 6 ? [0, 1, 2, 3, 5] : [0, 1, 2, 3]),
    kernel: 'adamw',
  },
  all_reduce: {
    summary: 'sum over the group, result on every rank',
    category: 'collective',
    inputs: [1, 1],
    attrs: collectiveAttrs,
    shape: ([x]) => [{ dtype: x.dtype, shape: x.shape }],
    flops: noFlops,
    pure: false,
    kernel: 'all_reduce',
  },
  all_gather: {
    summary: "concatenate every rank's block along dim 0, in group order",
    category: 'collective',
    inputs: [1, 1],
    attrs: {
      ...collectiveAttrs,
      grad: attr(
        'string',
        "its backward: 'reduce_scatter' (default; the arriving gradient is partial per rank, " +
          "Megatron's gather_from_sequence_parallel_region) or 'slice' (it is replicated: group_slice)",
        false,
      ),
    },
    shape: ([x], attrs) => {
      need(x.shape.length >= 1, 'all_gather needs rank ≥ 1');
      need(
        attrs.grad === undefined || attrs.grad === 'reduce_scatter' || attrs.grad === 'slice',
        () => `grad must be reduce_scatter or slice, got ${String(attrs.grad)}`,
      );
      return [
        {
          dtype: x.dtype,
          shape: [dimMul(x.shape[0], num(attrs, 'group_size')), ...x.shape.slice(1)],
        },
      ];
    },
    flops: noFlops,
    pure: false,
    kernel: 'all_gather',
  },
  reduce_scatter: {
    summary: 'sum over the group, rank i keeps block i along dim 0',
    category: 'collective',
    inputs: [1, 1],
    attrs: collectiveAttrs,
    shape: ([x], attrs) => {
      need(x.shape.length >= 1, 'reduce_scatter needs rank ≥ 1');
      return [
        {
          dtype: x.dtype,
          shape: [dimDiv(x.shape[0], num(attrs, 'group_size')), ...x.shape.slice(1)],
        },
      ];
    },
    flops: noFlops,
    pure: false,
    kernel: 'reduce_scatter',
  },
  broadcast: {
    summary: "the root's tensor on every rank of the group",
    category: 'collective',
    inputs: [1, 1],
    attrs: { ...collectiveAttrs, root: attr('int', 'group rank that sends') },
    shape: ([x]) => [{ dtype: x.dtype, shape: x.shape }],
    flops: noFlops,
    pure: false,
    kernel: 'broadcast',
  },
  all_to_all_v: {
    summary:
      'rows [N, H] sent in consecutive blocks of send_counts i32 [P] to each rank (counts exchanged ' +
      'first) → received rows [out_rows, H] (a bounded symbolic dim), recv_counts i32 [P]',
    category: 'collective',
    inputs: [2, 2],
    attrs: {
      ...collectiveAttrs,
      out_rows: attr('dims', 'received rows, one dim (bounded)'),
      dispatcher: attr(
        'string',
        "an expert dispatch's token dispatcher on a GPU machine: flex (DeepEP), which sends a " +
          'token once to each node that holds one of its experts; priced so, run alike',
        false,
      ),
      top_k: attr('int', "with dispatcher: the rows a token is routed to (the router's k)", false),
    },
    shape: ([x, counts], attrs) => {
      need(x.shape.length === 2, () => `rows must have rank 2, got ${formatShape(x.shape)}`);
      intT(counts, 'send_counts');
      need(
        dimEq(counts.shape[0], num(attrs, 'group_size')),
        'send_counts must have one entry per rank',
      );
      const [rows] = dimsAttr(attrs, 'out_rows');
      return [
        { dtype: x.dtype, shape: [rows, x.shape[1]] },
        { dtype: 'i32', shape: counts.shape },
      ];
    },
    flops: noFlops,
    pure: false,
    kernel: 'all_to_all_v',
  },
  gather_v: {
    summary:
      'variable-row blocks from every group rank to the root (row counts exchanged first): x [n, H] ' +
      '→ on the root either [out_rows, H] (blocks concatenated in group order, one out_rows dim) ' +
      "or one output per group rank (out_rows lists each block's rows); other ranks' outputs " +
      'are not written',
    category: 'collective',
    inputs: [1, 1],
    attrs: {
      ...collectiveAttrs,
      root: attr('int', 'group rank that receives'),
      out_rows: attr('dims', 'rows on the root: one dim (bounded), or one per group rank'),
    },
    shape: ([x], attrs) => {
      need(x.shape.length === 2, () => `rows must have rank 2, got ${formatShape(x.shape)}`);
      const rows = dimsAttr(attrs, 'out_rows');
      need(
        rows.length === 1 || rows.length === num(attrs, 'group_size'),
        () => `out_rows has ${rows.length} dims: one, or one per group rank`,
      );
      return rows.map((r) => ({ dtype: x.dtype, shape: [r, x.shape[1]] }));
    },
    flops: noFlops,
    pure: false,
    kernel: 'gather_v',
  },
  scatter_v: {
    summary:
      "the root's rows in variable blocks, block i to group rank i (row counts sent first): on the " +
      'root x [n, H] (blocks concatenated in group order) or one input per group rank → ' +
      "[out_rows, H]; other ranks' inputs are not read",
    category: 'collective',
    inputs: [1, Infinity],
    attrs: {
      ...collectiveAttrs,
      root: attr('int', 'group rank that sends'),
      out_rows: attr('dims', 'rows received, one dim (bounded)'),
    },
    shape: (xs, attrs) => {
      need(
        xs.length === 1 || xs.length === num(attrs, 'group_size'),
        () => `scatter_v has ${xs.length} inputs: one, or one per group rank`,
      );
      for (const x of xs) {
        need(x.shape.length === 2, () => `rows must have rank 2, got ${formatShape(x.shape)}`);
        sameDim(x.shape[1], xs[0].shape[1], 'blocks of one row width');
      }
      const [rows] = dimsAttr(attrs, 'out_rows');
      return [{ dtype: xs[0].dtype, shape: [rows, xs[0].shape[1]] }];
    },
    flops: noFlops,
    pure: false,
    kernel: 'scatter_v',
  },
  all_gather_v: {
    summary:
      "every group rank's rows, concatenated in group order: x [n, H], counts i32 [P] (each group " +
      "rank's rows, the same list on every rank) → [out_rows, H] (Σ counts rows written); the " +
      "expert-TP gather of Megatron-LM's all-to-all dispatcher under sequence parallelism",
    category: 'collective',
    inputs: [2, 2],
    attrs: { ...collectiveAttrs, out_rows: attr('dims', 'rows gathered, one dim (bounded)') },
    shape: ([x, counts], attrs) => countedRowsShape(x, counts, attrs),
    flops: noFlops,
    pure: false,
    kernel: 'all_gather_v',
  },
  reduce_scatter_v: {
    summary:
      'sum over the group of x [N, H] (every rank the same layout: consecutive blocks of counts ' +
      'i32 [P] rows), group rank r keeping block r → [out_rows, H] (counts[r] rows written); ' +
      "all_gather_v's conjugate",
    category: 'collective',
    inputs: [2, 2],
    attrs: { ...collectiveAttrs, out_rows: attr('dims', "this rank's block, one dim (bounded)") },
    shape: ([x, counts], attrs) => {
      floatT(x, 'rows');
      return countedRowsShape(x, counts, attrs);
    },
    flops: noFlops,
    pure: false,
    kernel: 'reduce_scatter_v',
  },
  send: {
    summary: 'point-to-point send to a peer rank of a group (pipeline stages)',
    category: 'collective',
    inputs: [1, 1],
    attrs: {
      group: attr('string', 'group kind of the pair (e.g. pp)'),
      peer: attr('int', 'index in that group of the rank that receives'),
      tag: attr('int', 'matches the recv'),
      batch: attr(
        'int',
        'consecutive sends and recvs of one stream with the same batch are posted together',
        false,
      ),
    },
    shape: (_inputs, attrs) => {
      need(num(attrs, 'peer') >= 0, () => `peer must be ≥ 0, got ${num(attrs, 'peer')}`);
      return [];
    },
    flops: noFlops,
    pure: false,
    kernel: 'send',
  },
  recv: {
    summary: 'point-to-point receive from a peer rank of a group, of a declared type',
    category: 'collective',
    inputs: [0, 0],
    attrs: {
      group: attr('string', 'group kind of the pair (e.g. pp)'),
      peer: attr('int', 'index in that group of the rank that sends'),
      tag: attr('int', 'matches the send'),
      batch: attr('int', 'as for send: posted together with the batch it names', false),
      dtype: attr('dtype', 'element type received'),
      shape: attr('dims', 'shape received'),
    },
    shape: (_inputs, attrs) => {
      need(num(attrs, 'peer') >= 0, () => `peer must be ≥ 0, got ${num(attrs, 'peer')}`);
      return [{ dtype: attrs.dtype as DType, shape: dimsAttr(attrs, 'shape') }];
    },
    flops: noFlops,
    pure: false,
    kernel: 'recv',
  },
  offload: {
    summary: 'copy a device tensor to host memory (copy stream)',
    category: 'memory',
    inputs: [1, 1],
    attrs: {},
    shape: ([x]) => {
      need((x.space ?? 'device') === 'device', 'offload reads a device tensor');
      return [{ dtype: x.dtype, shape: x.shape, space: 'host' }];
    },
    flops: noFlops,
    pure: false,
    kernel: 'copy',
  },
  reload: {
    summary: 'copy a host tensor back to device memory (copy stream)',
    category: 'memory',
    inputs: [1, 1],
    attrs: {},
    shape: ([x]) => {
      need(x.space === 'host', 'reload reads a host tensor');
      return [{ dtype: x.dtype, shape: x.shape }];
    },
    flops: noFlops,
    pure: false,
    kernel: 'copy',
  },
} as const satisfies Record<OpKind, OpInfo>;

function ropeShape(x: TensorType, pos: TensorType, attrs: Attrs): TensorType[] {
  floatT(x, 'x');
  rank(x, 3, 'x');
  intT(pos, 'positions');
  sameDim(pos.shape[0], x.shape[0], 'positions vs tokens of x');
  const sections = attrs.sections as readonly number[];
  const want = pos.shape.length === 1 ? 1 : pos.shape[1];
  need(
    pos.shape.length <= 2,
    () => `positions must have rank 1 or 2, got ${formatShape(pos.shape)}`,
  );
  need(
    sections.length === want,
    () => `${sections.length} sections for ${String(want)} position columns`,
  );
  const d = x.shape[2];
  need(
    typeof d === 'number' && d % 2 === 0,
    () => `head dim must be an even number, got ${String(d)}`,
  );
  const half = sections.reduce((a, b) => a + b, 0);
  need(half === d / 2, () => `sections sum to ${half}, head dim/2 is ${d / 2}`);
  return [{ dtype: x.dtype, shape: x.shape }];
}

function linearShape(
  x: TensorType,
  w: TensorType,
  b: TensorType | undefined,
  attrs: Attrs,
): TensorType[] {
  floatT(x, 'x');
  floatT(w, 'weight');
  rank(w, 2, 'weight');
  need(x.shape.length >= 1, 'x must have rank ≥ 1');
  need(w.dtype === x.dtype, () => `dtype mismatch: weight ${w.dtype} vs x ${x.dtype}`);
  sameDim(w.shape[1], last(x.shape), 'weight in-features vs last dim of x');
  if (b) {
    rank(b, 1, 'bias');
    sameDim(b.shape[0], w.shape[0], 'bias size vs weight out-features');
  }
  return [
    { dtype: dtypeOr(attrs, 'dtype', x.dtype), shape: [...x.shape.slice(0, -1), w.shape[0]] },
  ];
}

/** rows of a [..., features] tensor */
function rowsOf(s: readonly number[]): number {
  return elems(s) / s[s.length - 1];
}

export function opInfo(kind: OpKind): OpInfo {
  return OP_TABLE[kind];
}

const NONE_UPDATED: readonly number[] = Object.freeze([]);

/** The inputs instruction or node `op` with `inputs` inputs updates in place (OpInfo.updates). */
export function updatedInputs(op: OpKind, inputs: number): readonly number[] {
  return (OP_TABLE[op] as OpInfo).updates?.(inputs) ?? NONE_UPDATED;
}

export function isOpKind(s: string): s is OpKind {
  return Object.prototype.hasOwnProperty.call(OP_TABLE, s);
}

/** Groups derived from the table, never listed again. */
export const COLLECTIVE_OPS: readonly OpKind[] = OP_KINDS.filter(
  (k) => OP_TABLE[k].category === 'collective',
);
export const MATMUL_OPS: readonly OpKind[] = [
  'linear',
  'patch_embed',
  'grouped_linear',
  'attention',
];

/** Checks attribute presence and types against the table; returns problems (empty when fine). */
export function checkAttrs(kind: OpKind, attrs: Attrs): string[] {
  const specs = OP_TABLE[kind].attrs as Readonly<Record<string, AttrSpec>>;
  const problems: string[] = [];
  for (const [name, spec] of Object.entries(specs)) {
    const v = attrs[name];
    if (v === undefined) {
      if (spec.required) problems.push(`missing attribute '${name}' (${spec.doc})`);
      continue;
    }
    if (!attrTypeOk(spec.type, v))
      problems.push(`attribute '${name}' must be ${spec.type}, got ${JSON.stringify(v)}`);
  }
  for (const name of Object.keys(attrs)) {
    if (!(name in specs)) problems.push(`unknown attribute '${name}' for ${kind}`);
  }
  return problems;
}

function attrTypeOk(t: AttrType, v: AttrValue): boolean {
  switch (t) {
    case 'number':
      return typeof v === 'number' && Number.isFinite(v);
    case 'int':
      return typeof v === 'number' && Number.isInteger(v);
    case 'bool':
      return typeof v === 'boolean';
    case 'string':
    case 'dtype':
      return typeof v === 'string';
    case 'ints':
      return Array.isArray(v) && v.every((x) => typeof x === 'number' && Number.isInteger(x));
    case 'numbers':
      return Array.isArray(v) && v.every((x) => typeof x === 'number' && Number.isFinite(x));
    case 'dims':
      return Array.isArray(v) && v.every((x) => typeof x === 'string');
  }
}

/** Output types of a node; throws ShapeError when the inputs break the op's rule. */
export function inferTypes(
  kind: OpKind,
  inputs: readonly TensorType[],
  attrs: Attrs,
): TensorType[] {
  const info: OpInfo = OP_TABLE[kind];
  const [lo, hi] = info.inputs;
  if (inputs.length < lo || inputs.length > hi) {
    throw new ShapeError(
      `${kind} takes ${lo === hi ? lo : `${lo}–${hi}`} inputs, got ${inputs.length}`,
    );
  }
  const problems = checkAttrs(kind, attrs);
  if (problems.length) throw new ShapeError(problems.join('; '));
  return info.shape(inputs, attrs);
}

/** Matmul FLOPs of one forward node at given symbol sizes. */
export function nodeFlops(
  kind: OpKind,
  inputs: readonly TensorType[],
  outputs: readonly TensorType[],
  attrs: Attrs,
  sizes: (sym: string) => number,
): number {
  return OP_TABLE[kind].flops({
    inputs: inputs.map((t) => resolveShape(t.shape, sizes)),
    outputs: outputs.map((t) => resolveShape(t.shape, sizes)),
    attrs,
  });
}
