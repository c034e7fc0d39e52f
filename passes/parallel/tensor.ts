// Pass: tensor parallelism (Megatron-LM's, with sequence parallelism as an option), on the
// forward graph of one microbatch, before autodiff. After: one graph that every rank of a tp
// group runs; its parameters are the rank's pieces (`dist` says which), and the collectives the
// split needs are nodes whose gradient rules give the conjugate collective of the backward.
//
// Every value has a state over the tp group:
//   R  replicated: the same tensor on every rank; its gradient is the true gradient on every rank
//   P  partial: the true value is the sum over the ranks (a row-parallel product)
//   Q  sequence-split (--sequence-parallel): rank i holds block i of dim 0
//   S  split along `dim`: rank i holds piece i (a column-parallel product); with blocks > 1 the
//      dim is blocks equal blocks, each split (a fused q/k/v)
//   L  rank-local (the MoE dispatch under SP): each rank's own tensor, made from its own tokens
//      (their permuted rows, their counts); there is no whole tensor to convert it to
//   G  gathered (ibid.): whole on every rank, gathered by all_gather_v, whose conjugate sums the
//      arriving gradients; only column-parallel ops may read it (their input gradients are
//      partial, which is what that sum wants)
//
// Parameters: column-parallel (q/k/v, gate/up, fc1, fused qkv) split their output dim, row-parallel
// (o_proj, down_proj, fc2, attn.proj) their input dim, the embedding and lm_head their vocabulary;
// everything else is replicated. Ops ask for the input states they need (their rules: OP_RULES;
// an op without one needs whole inputs) and conversions insert:
//   P → R  all_reduce                      (gradient: identity)
//   P → Q  reduce_scatter                  (gradient: all_gather)
//   R → R  copy_to_group before a column-parallel op (gradient: all_reduce, the partial input
//          gradients of the column pieces summed)
//   Q → R  all_gather; before a column-parallel op its gradient is a reduce_scatter, elsewhere
//          the arriving gradient is replicated and it keeps its own block
//   R → Q  group_slice                     (gradient: all_gather)
// A row-parallel linear with a bias adds the bias after the sum (once, not tp times). Cross
// entropy over vocabulary-split logits is computed from per-rank statistics: local log-sum-exp
// gathered and combined, the target logit summed. The vision encoder never runs sequence-split
// (its patch count is data dependent); the decoder's residual stream does under SP.
//
// MoE under SP (dropless routing), Megatron-LM's all-to-all dispatcher with expert TP = TP: each
// rank routes its own S/tp tokens (router, auxiliary-loss statistics gathered, moe_permute: L),
// the expert-parallel exchange carries only those rows, and then, inside the tp group:
//   all_gather       the counts [ep, E/ep] of every tp rank → [tp·ep, E/ep]
//   all_gather_v     the rows (G), in tp-rank order, blocks (tp rank, source, expert)
//   moe_sort_chunks  to (expert, tp rank, source): the local experts' rows, column-parallel
//   …experts…        (P after the row-parallel down projection)
//   moe_sort_chunks⁻¹, reduce_scatter_v   each rank's own rows, summed (L)
// and the combine and moe_unpermute run on the rank's own tokens again (Q). Without expert
// parallelism the same gather follows moe_permute directly, and precedes moe_unpermute.
//
// Expert TP below TP (Megatron-LM's --expert-tensor-parallel-size): the gather, the split of the
// expert weights and the scatter back run on the `etp` groups (etp consecutive ranks of a tp
// group) instead. At expert TP 1 there is none of them: each rank runs its local experts whole
// on the rows it received, and the rows stay rank-local (L) from moe_permute to moe_unpermute.

import {
  GraphBuilder,
  type Graph,
  type Node,
  type ParamDecl,
  type ParamDist,
} from '../../ir/graph.js';
import { isFloat } from '../../ir/dtype.js';
import { formatType } from '../../ir/printer.js';
import {
  dimDiv,
  dimEq,
  dimMul,
  formatDim,
  formatShape,
  isSym,
  parseDim,
  type Dim,
  type Shape,
  type SymbolDecl,
} from '../../ir/shape.js';
import type { Attrs, TensorType } from '../../ir/types.js';
import type { OpKind } from '../../ir/ops.js';

export interface TensorParallelOptions {
  /** tensor-parallel size */
  readonly tp: number;
  /** --sequence-parallel */
  readonly sequenceParallel: boolean;
  /**
   * the vision encoder's (and projector's) TP size, dividing tp; default tp. Smaller: hetero TP
   * (level 1), its collectives on the `enc_tp` groups (blocks of encoderTp ranks inside each tp
   * group, each block a replica that encodes the same microbatch); 1: not split at all.
   */
  readonly encoderTp?: number;
  /**
   * the experts' TP size (--expert-tensor-parallel-size), dividing tp; default tp. Smaller: the
   * MoE dispatch's gather inside the tp group runs on the `etp` groups, and the expert weights
   * split over them (1: not split, no gather). Needs the dispatch under SP (dropless routing)
   */
  readonly expertTp?: number;
}

/** A model the pass cannot split as asked: a UserError at the compile level. */
export class TensorParallelError extends Error {}

type State =
  | { readonly k: 'R' }
  | { readonly k: 'P' }
  | { readonly k: 'Q' }
  | { readonly k: 'L' }
  | { readonly k: 'G' }
  | { readonly k: 'S'; readonly dim: number; readonly blocks: number };

const R: State = { k: 'R' };
const P: State = { k: 'P' };
const Q: State = { k: 'Q' };
const L: State = { k: 'L' };
const G: State = { k: 'G' };
const stateText = (s: State) => (s.k === 'S' ? `split(dim ${s.dim})` : s.k);

/** a region's TP context: the decoder's, or the encoder's under hetero TP */
interface Context {
  readonly tp: number;
  readonly group: string;
}

/** one MoE layer's gather inside the tp group (the MoE dispatch under SP) */
interface TpDispatch {
  /** every tp rank's counts: [tp·ep, E/ep] (ep 1: [tp, E]), blocks (tp rank, source) */
  readonly countsAll: string;
  /** rows of each tp rank: i32 [tp] */
  readonly rowsOf: string;
  /** dim 0 of this rank's own rows (what the reduce_scatter_v gives back) */
  readonly ownRows: string;
}

/** the encoder and its projector: `visual.*` parameters and scopes */
const isEncoderName = (name: string) => name === 'visual' || name.startsWith('visual.');
/** a routed expert's parameter (model.layers.<i>.mlp.experts.<e or {}>.<name>) */
const isExpertParam = (name: string) => /\.experts\.[^.]+\./.test(name);

type ParamRole =
  | { readonly kind: 'column'; readonly blocks: number }
  | { readonly kind: 'row' }
  | { readonly kind: 'vocab' }
  | { readonly kind: 'replicated' };

/** How tensor parallelism splits a parameter, from its checkpoint name. */
export function tensorParallelRole(name: string): ParamRole {
  if (/^(model\.embed_tokens|lm_head)\.weight$/.test(name)) return { kind: 'vocab' };
  if (/\.attn\.qkv\.(weight|bias)$/.test(name)) return { kind: 'column', blocks: 3 };
  if (/\.(q_proj|k_proj|v_proj|gate_proj|up_proj|fc1)\.(weight|bias)$/.test(name))
    return { kind: 'column', blocks: 1 };
  if (/\.(o_proj|down_proj|fc2|attn\.proj)\.weight$/.test(name)) return { kind: 'row' };
  return { kind: 'replicated' };
}

export function tensorParallel(g: Graph, o: TensorParallelOptions): Graph {
  if (o.tp === 1) return g;
  const t = new TensorParallelRewrite(g, o);
  for (const i of g.inputs) t.replicatedInput(i.name, i.type, i.doc);
  // parameters split by role, declared in order; gradSum gains tp once the walk knows which meet
  // split values
  const declared = new Map<string, ParamDecl>();
  for (const p of g.params) declared.set(p.name, t.splitParam(p));
  for (const p of declared.values()) t.b.declare(p);
  for (const n of g.nodes) t.rewriteNode(n);
  // the graph's outputs whole, gathered on the decoder's group
  t.cur = t.decoder;
  for (const out of g.outputs) t.b.output(out.label, t.convert(t.name.get(out.value)!, 'R'));
  return t.build();
}

/** The state of one run of the pass: the graph being built and what it knows of each value. */
class TensorParallelRewrite {
  readonly decoder: Context;
  readonly encoder: Context;
  /** the routed experts' context: the decoder's, or the etp groups' under expert TP < TP */
  readonly expert: Context;
  /** the context of the node being rewritten (the walk sets it per node) */
  cur: Context;
  readonly b: GraphBuilder;
  readonly name = new Map<string, string>(); // old value → new value
  readonly state = new Map<string, State>(); // new value → state
  readonly role = new Map<string, ParamRole>(); // parameter → its role
  /**
   * replicated parameters applied to split values (sequence-split under SP, or head-split: the
   * q/k norms): each rank's gradient covers its piece, so the gradient sums over tp
   */
  readonly gradOverSeq = new Set<string>();
  readonly paramNames: ReadonlySet<string>;
  /** MoE scopes whose dispatch crosses the ep group (the expert-parallel pass's moe_sort_chunks) */
  readonly expertParallelScopes: ReadonlySet<string>;
  /** MoE scope → its moe_permute's rows dim, whole (before this pass) and the rank's own */
  readonly ownRows = new Map<string, { whole: string; own: string }>();
  /** MoE scope → its gather inside the tp group, once made */
  readonly dispatch = new Map<string, TpDispatch>();
  private readonly symbols: ReadonlyMap<string, SymbolDecl>;
  /** conversions already made: value, wanted state, consumer kind, group → converted value */
  private readonly cache = new Map<string, string>();

  constructor(
    g: Graph,
    readonly o: TensorParallelOptions,
  ) {
    this.decoder = { tp: o.tp, group: 'tp' };
    const encTp = o.encoderTp ?? o.tp;
    this.encoder = encTp === o.tp ? this.decoder : { tp: encTp, group: 'enc_tp' };
    const etp = o.expertTp ?? o.tp;
    this.expert = etp === o.tp ? this.decoder : { tp: etp, group: 'etp' };
    this.cur = this.decoder;
    this.b = new GraphBuilder(g.name);
    for (const s of g.symbols) this.b.declareSymbol(s);
    this.paramNames = new Set(g.params.map((p) => p.name));
    this.expertParallelScopes = new Set(
      g.nodes.filter((n) => n.op === 'moe_sort_chunks').map((n) => n.scope),
    );
    this.symbols = new Map(g.symbols.map((x) => [x.name, x]));
  }

  /** a dim's bound and expected size, from the symbol table */
  dimSizes(d: Dim): { bound: number; expected: number } {
    if (!isSym(d)) return { bound: d, expected: d };
    const decl = this.symbols.get(d.sym);
    if (!decl) throw new Error(`tensor parallelism: undeclared symbol ${d.sym}`);
    const scale = (v: number) => Math.ceil((v * d.num) / d.den);
    return { bound: scale(decl.bound), expected: scale(decl.expected ?? decl.bound) };
  }

  /**
   * The gather of an MoE layer's rows inside the tp group: every tp rank's counts [sources, L]
   * and rows (rank-local) → the rows of the local experts, whole (G), sorted by expert, and their
   * counts per expert. The gathered rows are a symbol of their own (Rg<layer>) when each rank
   * receives its own count (ep > 1), else tp × the rank's rows.
   */
  gatherDispatch(
    scope: string,
    rows: string,
    counts: string,
    layer: number,
  ): { sorted: string; local: string } {
    const coll = this.coll(this.expert);
    const tp = this.expert.tp;
    const [sources, experts] = this.typeOf(counts).shape as number[];
    const [countsAll] = this.emit('all_gather', [counts], { ...coll, grad: 'slice' }, [R]);
    const [flat] = this.emit('reshape', [countsAll], { shape: [String(tp * sources * experts)] }, [
      R,
    ]);
    const [rowsOf] = this.emit('moe_rank_counts', [flat], { group_size: tp }, [R]);
    const own = this.typeOf(rows).shape[0];
    let gathered: Dim;
    if (!this.expertParallelScopes.has(scope)) {
      gathered = dimMul(own, tp);
    } else {
      const { bound, expected } = this.dimSizes(own);
      gathered = this.b.symbol(
        `Rg${layer}`,
        tp * bound,
        `rows ${scope}'s experts take: its expert dispatch's rows (${formatDim(own)}) of every ${this.expert.group} rank`,
        tp * expected,
      );
    }
    const [all] = this.emit(
      'all_gather_v',
      [rows, rowsOf],
      { ...coll, out_rows: [formatDim(gathered)] },
      [G],
    );
    const [sorted] = this.emit('moe_sort_chunks', [all, countsAll], { inverse: false }, [G]);
    const [local] = this.emit('moe_local_counts', [countsAll], {}, [R]);
    this.dispatch.set(scope, { countsAll, rowsOf, ownRows: formatDim(own) });
    return { sorted, local };
  }

  /** the experts' partial output rows back to each rank's own rows, summed over tp (L) */
  scatterDispatch(scope: string, y: string): string {
    const d = this.dispatch.get(scope)!;
    const [unsorted] = this.emit('moe_sort_chunks', [y, d.countsAll], { inverse: true }, [P]);
    const [own] = this.emit(
      'reduce_scatter_v',
      [unsorted, d.rowsOf],
      { ...this.coll(this.expert), out_rows: [d.ownRows] },
      [L],
    );
    return own;
  }

  contextOf(name: string): Context {
    return isEncoderName(name) ? this.encoder : this.decoder;
  }

  /** a parameter's context: its region's, or the experts' */
  paramContextOf(name: string): Context {
    return isExpertParam(name) ? this.expert : this.contextOf(name);
  }

  fail(msg: string): never {
    const { o, encoder, decoder } = this;
    throw new TensorParallelError(
      `tensor parallelism (tp ${o.tp}${encoder !== decoder ? `, encoder tp ${encoder.tp}` : ''}): ${msg}`,
    );
  }

  replicatedInput(name: string, type: TensorType, doc: string | undefined): void {
    this.name.set(name, this.b.input(name, type.dtype, type.shape, doc));
    this.state.set(name, R);
  }

  /** p as one rank declares it: its piece of the dim its role splits, `dist` saying which */
  splitParam(p: ParamDecl): ParamDecl {
    const ctx = this.paramContextOf(p.dist?.name ?? p.name);
    const tp = ctx.tp;
    const r: ParamRole =
      tp === 1 ? { kind: 'replicated' } : tensorParallelRole(p.dist?.name ?? p.name);
    this.role.set(p.name, r);
    const shape = p.type.shape as readonly number[];
    let split: ParamDist['split'] = p.dist?.split ?? shape.map(() => null);
    let local = shape;
    const splitDim = (dim: number, blocks: number) => {
      if (shape[dim] % (tp * blocks) !== 0)
        this.fail(
          `${p.name} ${JSON.stringify(shape)}: dim ${dim} (${shape[dim]}) is not divisible by tp${blocks > 1 ? ` × ${blocks} blocks` : ''}`,
        );
      split = split.map((s, d) => (d === dim ? { group: ctx.group, parts: tp, blocks } : s));
      local = shape.map((n, d) => (d === dim ? n / tp : n));
    };
    if (r.kind === 'column') splitDim(0, r.blocks);
    else if (r.kind === 'row' && shape.length === 2) splitDim(1, 1);
    else if (r.kind === 'vocab') splitDim(0, 1);
    const dist: ParamDist = {
      name: p.dist?.name ?? p.name,
      shape: p.dist?.shape ?? shape,
      split,
      ...(p.dist?.expert ? { expert: p.dist.expert } : {}),
      gradSum: p.dist?.gradSum ?? [],
      replicas: p.dist?.replicas ?? 'dp',
    };
    this.name.set(p.name, p.name);
    this.state.set(
      p.name,
      r.kind === 'replicated' || (r.kind === 'row' && shape.length === 1)
        ? R
        : { k: 'S', dim: r.kind === 'row' ? 1 : 0, blocks: r.kind === 'column' ? r.blocks : 1 },
    );
    return { ...p, type: { ...p.type, shape: local }, dist };
  }

  /** n rewritten by its op's rule, in its own scope, phase and TP context */
  rewriteNode(n: Node): void {
    const ins = n.inputs.map((v) => {
      const m = this.name.get(v);
      if (m === undefined) throw new Error(`tensor parallelism: undefined value ${v}`);
      return m;
    });
    this.cur = this.contextOf(n.scope);
    this.b.at(n.scope, n.phase, () => {
      const outs = (OP_RULES[n.op] ?? wholeRule)(this, n, ins);
      n.outputs.forEach((o, i) => this.name.set(o.name, outs[i]));
    });
  }

  stateOf(v: string): State {
    return this.state.get(v)!;
  }

  typeOf(v: string): TensorType {
    return this.b.typeOf(v);
  }

  isFloatValue(v: string): boolean {
    return isFloat(this.typeOf(v).dtype);
  }

  /** a collective's attributes on a context's group (default: the current one) */
  coll(ctx: Context = this.cur): Attrs {
    return { group: ctx.group, group_size: ctx.tp };
  }

  /** a node whose outputs take the states `st` (the last one repeats) */
  emit(kind: OpKind, inputs: string[], attrs: Attrs, st: State[]): string[] {
    const outs = this.b.op(kind, inputs, attrs);
    outs.forEach((v, i) => this.state.set(v, st[Math.min(i, st.length - 1)]));
    return outs;
  }

  /** n's own op on the rewritten inputs, its outputs in the states `st` */
  emitNode(n: Node, inputs: string[], attrs: Attrs, st: State[]): string[] {
    return this.emit(n.op, inputs, attrs, st);
  }

  /** v converted to `want`; forColumn: the consumer is column-parallel (its input gradient is partial) */
  convert(v: string, want: 'R' | 'Q', forColumn = false): string {
    const s = this.stateOf(v);
    const key = `${v}\u0000${want}${forColumn ? 'c' : ''}\u0000${this.cur.group}`;
    const coll = this.coll();
    const hit = this.cache.get(key);
    if (hit) return hit;
    let out: string;
    if (s.k === 'L')
      return this.fail(`a rank-local value ${formatType(this.typeOf(v))} has no whole tensor`);
    if (s.k === 'G') {
      if (want === 'R' && forColumn) return v;
      return this.fail(
        `gathered rows ${formatType(this.typeOf(v))} feed only column-parallel experts`,
      );
    }
    if (want === 'Q') {
      if (s.k === 'Q') return v;
      if (s.k === 'P') [out] = this.emit('reduce_scatter', [v], coll, [Q]);
      else if (s.k === 'R') [out] = this.emit('group_slice', [v], coll, [Q]);
      else
        return this.fail(
          `cannot sequence-split a ${stateText(s)} value ${formatType(this.typeOf(v))}`,
        );
    } else if (s.k === 'R') {
      if (!forColumn) return v;
      [out] = this.emit('copy_to_group', [v], coll, [R]);
    } else if (s.k === 'P') {
      [out] = this.emit('all_reduce', [v], coll, [R]);
      if (forColumn) [out] = this.emit('copy_to_group', [out], coll, [R]);
    } else if (s.k === 'Q') {
      const grad = forColumn ? 'reduce_scatter' : 'slice';
      [out] = this.emit('all_gather', [v], { ...coll, grad }, [R]);
    } else {
      return this.fail(
        `a value split along dim ${s.dim} ${formatType(this.typeOf(v))} cannot be gathered (only dim 0 can)`,
      );
    }
    this.cache.set(key, out);
    return out;
  }

  /** replicated parameters among `inputs` sum their gradient over tp when a data input is split */
  noteSeqParams(inputs: string[]): void {
    const split = inputs.some((v) => {
      const k = this.stateOf(v).k;
      return !this.paramNames.has(v) && (k === 'Q' || k === 'S');
    });
    if (split) for (const v of inputs) if (this.paramNames.has(v)) this.gradOverSeq.add(v);
  }

  /** the graph built, the parameters that met split values summing their gradient over tp */
  build(): Graph {
    const built = this.b.build();
    return {
      ...built,
      params: built.params.map((p) =>
        this.gradOverSeq.has(p.name) && p.dist
          ? {
              ...p,
              dist: { ...p.dist, gradSum: [...p.dist.gradSum, this.contextOf(p.dist.name).group] },
            }
          : p,
      ),
    };
  }
}

// ---- the rules: one per op, each n's new outputs from its rewritten inputs ----------------------

type OpRule = (t: TensorParallelRewrite, n: Node, ins: string[]) => string[];

/** linear and grouped_linear: column-, row-parallel or replicated by the weight's role */
const linearRule: OpRule = (t, n, ins) => {
  const w = n.inputs[n.op === 'linear' ? 1 : 2];
  const r = t.role.get(w) ?? { kind: 'replicated' };
  if (r.kind === 'column' || r.kind === 'vocab') {
    const x = t.convert(ins[0], 'R', true);
    const blocks = r.kind === 'column' ? r.blocks : 1;
    const last = t.typeOf(ins[0]).shape.length - 1;
    return t.emitNode(n, [x, ...ins.slice(1)], n.attrs, [{ k: 'S', dim: last, blocks }]);
  }
  if (r.kind === 'row') return rowParallelLinear(t, n, ins);
  // replicated weight (router gate, patch projection): row by row, so a sequence-split input
  // stays split (its weight's gradient then sums over tp); otherwise a replicated input. A
  // rank-local input: the rows this rank's experts received (expert TP 1), whose gradients the
  // expert-data-parallel ranks sum
  if (t.stateOf(ins[0]).k === 'L') return t.emitNode(n, ins, n.attrs, [L]);
  if (t.stateOf(ins[0]).k === 'Q') {
    t.noteSeqParams(ins);
    return t.emitNode(n, ins, n.attrs, [Q]);
  }
  return t.emitNode(n, [t.convert(ins[0], 'R'), ...ins.slice(1)], n.attrs, [R]);
};

function rowParallelLinear(t: TensorParallelRewrite, n: Node, ins: string[]): string[] {
  const s = t.stateOf(ins[0]);
  const last = t.typeOf(ins[0]).shape.length - 1;
  if (s.k !== 'S' || s.dim !== last || s.blocks !== 1)
    t.fail(
      `${n.scope}: a row-parallel ${n.op} needs its input split along the last dim, got ${stateText(s)}`,
    );
  const bias = n.op === 'linear' ? ins[2] : undefined;
  if (bias === undefined) return t.emitNode(n, ins, n.attrs, [P]);
  // the bias once, after the sum: y = Σ_ranks x·Wᵀ + 1·biasᵀ
  const [y] = t.emit('linear', [ins[0], ins[1]], n.attrs, [P]);
  const sum = t.convert(y, 'R');
  const rows = t.typeOf(sum).shape[0];
  // ones in the bias's dtype (bf16 under --bf16): the bias row added once to every row
  const dtype = t.typeOf(bias).dtype;
  const [ones] = t.emit('constant', [], { value: 1, dtype, shape: [formatDim(rows), '1'] }, [R]);
  const width = t.typeOf(bias).shape[0] as number;
  const [b2] = t.emit('reshape', [bias], { shape: [String(width), '1'] }, [R]);
  const [yb] = t.emit('linear', [ones, b2], {}, [R]);
  return t.emit('add', [sum, yb], {}, [R]);
}

const embeddingRule: OpRule = (t, n, ins) => {
  const r = t.role.get(n.inputs[1]);
  if (r?.kind === 'vocab')
    return t.emitNode(n, ins, { ...n.attrs, shard_group: t.cur.group, group_size: t.cur.tp }, [P]);
  return t.emitNode(n, ins, n.attrs, [R]);
};

/** over vocabulary-split logits: the local log-sum-exps gathered, the target logit summed */
const crossEntropyRule: OpRule = (t, n, ins) => {
  if (t.stateOf(ins[0]).k !== 'S')
    return t.emitNode(
      n,
      ins.map((v) => t.convert(v, 'R')),
      n.attrs,
      [R],
    );
  const [logits, mask, count] = [ins[0], ins[2], ins[3]];
  const labels = t.convert(ins[1], 'R');
  const vocab = { shard_group: t.cur.group, group_size: t.cur.tp };
  const [lseLocal] = t.emit('vocab_logsumexp', [logits], {}, [R]);
  const rows = t.typeOf(lseLocal).shape[0];
  const [row] = t.emit('reshape', [lseLocal], { shape: ['1', formatDim(rows)] }, [R]);
  const [all] = t.emit('all_gather', [row], { ...t.coll(), grad: 'slice' }, [R]);
  const [lse] = t.emit('lse_combine', [all], {}, [R]);
  const [tLocal] = t.emit('vocab_target_logit', [logits, labels, t.convert(mask, 'R')], vocab, [P]);
  const target = t.convert(tLocal, 'R');
  return t.emit('ce_from_stats', [lse, target, t.convert(mask, 'R'), count], {}, [R]);
};

/** the decoder's residual stream: merge_visual into the embeddings and the deepstack merges */
const decoderStream = (n: Node) =>
  n.scope === 'model.merge_visual' || n.scope.endsWith('.deepstack');

const mergeVisualRule: OpRule = (t, n, ins) => {
  const inputs = ins.map((v) => t.convert(v, 'R'));
  const [y] = t.emit('merge_visual', inputs, n.attrs, [R]);
  return [t.o.sequenceParallel && decoderStream(n) ? t.convert(y, 'Q') : y];
};

const splitRule: OpRule = (t, n, ins) => {
  const s = t.stateOf(ins[0]);
  if (s.k === 'R' || s.k === 'Q') return t.emitNode(n, ins, n.attrs, [s, s, s]);
  const parts = (n.attrs.sizes as number[]).length;
  const last = t.typeOf(ins[0]).shape.length - 1;
  if (s.k !== 'S' || s.dim !== last || s.blocks !== parts)
    t.fail(`${n.scope}: split of a ${stateText(s)} value into ${parts} parts`);
  const sizes = (n.attrs.sizes as number[]).map((x) => x / t.cur.tp);
  const piece: State = { k: 'S', dim: last, blocks: 1 };
  return t.emitNode(
    n,
    ins,
    { ...n.attrs, sizes },
    sizes.map(() => piece),
  );
};

const reshapeRule: OpRule = (t, n, ins) => {
  const s = t.stateOf(ins[0]);
  const tp = t.cur.tp;
  const target = (n.attrs.shape as string[]).map(parseDim);
  const from = t.typeOf(ins[0]).shape;
  if (s.k === 'R' || s.k === 'P' || s.k === 'L') return t.emitNode(n, ins, n.attrs, [s]);
  if (s.k === 'Q') {
    if (!dimEq(from[0], target[0]))
      t.fail(`${n.scope}: reshape of a sequence-split value changes dim 0`);
    const shape = [formatDim(from[0]), ...target.slice(1).map(formatDim)];
    return t.emitNode(n, ins, { shape }, [Q]);
  }
  if (s.k === 'G') return t.fail(`${n.scope}: reshape of gathered expert rows`);
  // a split dim keeps its place when the dims before it are the same
  const d = target.findIndex(
    (_, i) => prefixText(target, i) === prefixText(globalShape(from, s, tp), s.dim),
  );
  if (d < 0 || (target[d] as number) % tp !== 0)
    t.fail(`${n.scope}: reshape ${formatShape(from)} → ${formatShape(target)} moves the split dim`);
  const local = target.map((x, i) => (i === d ? dimDiv(x, tp) : x));
  return t.emitNode(n, ins, { shape: local.map(formatDim) }, [
    { k: 'S', dim: d, blocks: s.blocks },
  ]);
};

const attentionRule: OpRule = (t, n, ins) => {
  const [q, k, v, seg] = ins;
  for (const [x, label] of [
    [q, 'q'],
    [k, 'k'],
    [v, 'v'],
  ] as const) {
    const s = t.stateOf(x);
    if (!(s.k === 'S' && s.dim === 1) && s.k !== 'R')
      t.fail(`${n.scope}: attention ${label} must be split by heads, got ${stateText(s)}`);
  }
  const sq = t.stateOf(q);
  if (sq.k === 'R') return t.emitNode(n, [q, k, v, t.convert(seg, 'R')], n.attrs, [R, R]);
  return t.emitNode(n, [q, k, v, t.convert(seg, 'R')], n.attrs, [sq, sq]);
};

const ropeRule: OpRule = (t, n, ins) =>
  t.emitNode(n, [ins[0], t.convert(ins[1], 'R')], n.attrs, [t.stateOf(ins[0])]);

/**
 * ops that work row by row (per token): a sequence split passes through them. Sequence-split
 * wins; a sum of partials stays partial; pieces of one split stay split; anything else is
 * replicated
 */
const rowWiseRule: OpRule = (t, n, ins) => {
  const data = ins.filter((v) => !t.paramNames.has(v) && t.isFloatValue(v));
  const ks = new Set(data.map((v) => t.stateOf(v).k));
  // between the experts of expert TP 1: rank-local rows
  if (ks.size === 1 && ks.has('L')) return t.emitNode(n, ins, n.attrs, [L]);
  const split = data.map((v) => t.stateOf(v)).find((s) => s.k === 'S');
  const target: State = ks.has('Q')
    ? Q
    : ks.size === 1 && ks.has('P') && n.op === 'add'
      ? P
      : split && ks.size === 1
        ? split
        : R;
  if (split && target !== split)
    t.fail(`${n.scope}: ${n.op} mixes a split value with ${[...ks].join(', ')} values`);
  if (target.k === 'S') {
    const last = t.typeOf(ins[0]).shape.length - 1;
    for (const v of data) {
      const s = t.stateOf(v);
      if (s.k !== 'S' || s.dim !== target.dim)
        t.fail(`${n.scope}: ${n.op} of values split along different dims`);
    }
    if ((n.op === 'layernorm' || n.op === 'rmsnorm') && target.dim === last)
      t.fail(`${n.scope}: ${n.op} over a split last dim`);
  }
  const inputs = ins.map((v) =>
    t.paramNames.has(v) || !t.isFloatValue(v) || target.k === 'S' || target.k === 'P'
      ? v
      : t.convert(v, target.k),
  );
  t.noteSeqParams(inputs);
  return t.emitNode(
    n,
    inputs,
    n.attrs,
    n.outputs.map(() => target),
  );
};

/**
 * ops linear in their first input that need no other float input's gradient through it: a partial
 * sum stays a partial sum through them (not moe_unpermute: its routing weights' gradient reads the
 * expert outputs, which must be whole, as Megatron-LM sums expert TP before the combine)
 */
const linearInFirstRule: OpRule = (t, n, ins) => {
  const s = t.stateOf(ins[0]);
  return t.emitNode(
    n,
    ins.map((v, i) => (i === 0 ? v : t.convert(v, 'R'))),
    n.attrs,
    n.outputs.map((_, i) => (i === 0 ? s : R)),
  );
};

/** anything else needs whole tensors */
const wholeRule: OpRule = (t, n, ins) =>
  t.emitNode(
    n,
    ins.map((v) => t.convert(v, 'R')),
    n.attrs,
    n.outputs.map(() => R),
  );

// ---- the MoE dispatch under SP (the header) ----------------------------------------------------

/** decoder MoE layer index of a scope (model.layers.<i>.mlp) */
const layerOf = (scope: string) => Number(/layers\.(\d+)\./.exec(`${scope}.`)?.[1] ?? 0);

/** router_topk row by row: sequence-split logits give sequence-split choices */
const routerRule: OpRule = (t, n, ins) =>
  t.stateOf(ins[0]).k === 'Q' ? t.emitNode(n, ins, n.attrs, [Q, Q, Q]) : wholeRule(t, n, ins);

/**
 * moe_permute of a rank's own tokens (SP, dropless): its rows and counts are rank-local; without
 * expert parallelism the gather inside the tp group follows at once
 */
const permuteRule: OpRule = (t, n, ins) => {
  const own =
    t.o.sequenceParallel &&
    n.attrs.capacity === undefined &&
    t.stateOf(ins[0]).k === 'Q' &&
    t.stateOf(ins[1]).k === 'Q';
  if (!own && t.expert !== t.decoder)
    t.fail(
      `${n.scope}: expert TP ${t.expert.tp} below tp needs the MoE dispatch under sequence parallelism, with dropless routing`,
    );
  if (!own) return wholeRule(t, n, ins);
  const [rows, counts, rowOf] = t.emitNode(n, ins, n.attrs, [L]);
  t.ownRows.set(n.scope, {
    whole: formatDim(n.outputs[0].type.shape[0]),
    own: formatDim(t.typeOf(rows).shape[0]),
  });
  if (t.expertParallelScopes.has(n.scope) || t.expert.tp === 1) return [rows, counts, rowOf];
  const E = t.typeOf(counts).shape[0];
  const [byRank] = t.emit('reshape', [counts], { shape: ['1', formatDim(E)] }, [L]);
  const { sorted, local } = t.gatherDispatch(n.scope, rows, byRank, layerOf(n.scope));
  return [sorted, local, rowOf];
};

const isLocal = (t: TensorParallelRewrite, ins: string[]) =>
  ins.some((v) => t.stateOf(v).k === 'L');

/**
 * the expert-parallel exchange of rank-local rows and counts: rank-local; the combine's
 * all_to_all_v returns the rank's own rows (the whole sequence's before this pass)
 */
const localOr =
  (other: OpRule): OpRule =>
  (t, n, ins) => {
    if (!isLocal(t, ins)) return other(t, n, ins);
    const rows = t.ownRows.get(n.scope);
    const out = n.attrs.out_rows as string[] | undefined;
    const attrs = rows && out?.[0] === rows.whole ? { ...n.attrs, out_rows: [rows.own] } : n.attrs;
    return t.emitNode(n, ins, attrs, [L]);
  };

/**
 * moe_sort_chunks: after the expert-parallel dispatch of rank-local rows, the gather inside the
 * tp group and the sort of every tp rank's rows; its inverse after the experts, the scatter back
 */
const sortChunksRule: OpRule = (t, n, ins) => {
  if (n.attrs.inverse !== true && isLocal(t, ins) && t.expert.tp > 1)
    return [t.gatherDispatch(n.scope, ins[0], ins[1], layerOf(n.scope)).sorted];
  if (n.attrs.inverse === true && t.dispatch.has(n.scope))
    return [t.scatterDispatch(n.scope, ins[0])];
  if (isLocal(t, ins)) return t.emitNode(n, ins, n.attrs, [L]); // expert TP 1: no gather
  return linearInFirstRule(t, n, ins);
};

/** rows per local expert: over every tp (etp) rank's sources once they are gathered */
const localCountsRule: OpRule = (t, n, ins) => {
  const d = t.dispatch.get(n.scope);
  if (d && isLocal(t, ins)) return t.emit('moe_local_counts', [d.countsAll], {}, [R]);
  if (isLocal(t, ins)) return t.emitNode(n, ins, n.attrs, [L]); // expert TP 1: its own rows'
  return wholeRule(t, n, ins);
};

/** moe_unpermute of a rank's own rows (after the scatter back): its own tokens, sequence-split */
const unpermuteRule: OpRule = (t, n, ins) => {
  const rows =
    t.dispatch.has(n.scope) && t.stateOf(ins[0]).k === 'P'
      ? t.scatterDispatch(n.scope, ins[0])
      : ins[0];
  if (t.stateOf(rows).k !== 'L') return wholeRule(t, n, ins);
  return t.emitNode(n, [rows, ins[1], ins[2]], n.attrs, [Q]);
};

/** each op's rule; an op without one needs whole inputs (wholeRule) */
const OP_RULES: { readonly [K in OpKind]?: OpRule } = {
  linear: linearRule,
  grouped_linear: linearRule,
  embedding: embeddingRule,
  cross_entropy: crossEntropyRule,
  merge_visual: mergeVisualRule,
  split: splitRule,
  reshape: reshapeRule,
  attention: attentionRule,
  rope: ropeRule,
  // the auxiliary loss's statistics need every token: the router's outputs gathered
  moe_aux_loss: wholeRule,
  moe_permute: permuteRule,
  router_topk: routerRule,
  moe_unpermute: unpermuteRule,
  moe_rank_counts: localOr(wholeRule),
  moe_local_counts: localCountsRule,
  layernorm: rowWiseRule,
  rmsnorm: rowWiseRule,
  add: rowWiseRule,
  gelu: rowWiseRule,
  swiglu: rowWiseRule,
  moe_sort_chunks: sortChunksRule,
  all_to_all_v: localOr(linearInFirstRule),
};

function prefixText(s: Shape, upTo: number): string {
  return s.slice(0, upTo).map(formatDim).join('·');
}

/** the whole (unsplit) shape of a split value */
function globalShape(local: Shape, s: State, tp: number): Shape {
  if (s.k !== 'S') return local;
  return local.map((d, i) => (i === s.dim ? dimMul(d, tp) : d));
}
