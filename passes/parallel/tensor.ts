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
//
// Parameters: column-parallel (q/k/v, gate/up, fc1, fused qkv) split their output dim, row-parallel
// (o_proj, down_proj, fc2, attn.proj) their input dim, the embedding and lm_head their vocabulary;
// everything else is replicated. Ops ask for the input states they need and conversions insert:
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
  parseDim,
  type Shape,
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
}

/** A model the pass cannot split as asked: a UserError at the compile level. */
export class TensorParallelError extends Error {}

type State =
  | { readonly k: 'R' }
  | { readonly k: 'P' }
  | { readonly k: 'Q' }
  | { readonly k: 'S'; readonly dim: number; readonly blocks: number };

const R: State = { k: 'R' };
const P: State = { k: 'P' };
const Q: State = { k: 'Q' };

/** a region's TP context: the decoder's, or the encoder's under hetero TP */
interface Context {
  readonly tp: number;
  readonly group: string;
}

/** the encoder and its projector: `visual.*` parameters and scopes */
const isEncoderName = (name: string) => name === 'visual' || name.startsWith('visual.');

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

/**
 * ops linear in their first input that need no other float input's gradient through it: a partial
 * sum stays a partial sum through them (not moe_unpermute: its routing weights' gradient reads the
 * expert outputs, which must be whole, as Megatron-LM sums expert TP before the combine)
 */
const LINEAR_OPS: ReadonlySet<OpKind> = new Set<OpKind>([
  'reshape',
  'moe_sort_chunks',
  'all_to_all_v',
]);
/** ops that work row by row (per token): a sequence split passes through them */
const ROW_WISE: ReadonlySet<OpKind> = new Set<OpKind>([
  'layernorm',
  'rmsnorm',
  'add',
  'gelu',
  'swiglu',
]);

export function tensorParallel(g: Graph, o: TensorParallelOptions): Graph {
  if (o.tp === 1) return g;
  const decoder: Context = { tp: o.tp, group: 'tp' };
  const encTp = o.encoderTp ?? o.tp;
  const encoder: Context = encTp === o.tp ? decoder : { tp: encTp, group: 'enc_tp' };
  const contextOf = (name: string) => (isEncoderName(name) ? encoder : decoder);
  /** the context of the node being rewritten (the walk below sets it per node) */
  let cur = decoder;
  const b = new GraphBuilder(g.name);
  for (const s of g.symbols) b.declareSymbol(s);
  const name = new Map<string, string>(); // old value → new value
  const state = new Map<string, State>(); // new value → state
  const fail = (msg: string): never => {
    throw new TensorParallelError(
      `tensor parallelism (tp ${o.tp}${encoder !== decoder ? `, encoder tp ${encTp}` : ''}): ${msg}`,
    );
  };
  for (const i of g.inputs) {
    name.set(i.name, b.input(i.name, i.type.dtype, i.type.shape, i.doc));
    state.set(i.name, R);
  }

  // ---- parameters: split by role ----------------------------------------------------------
  const role = new Map<string, ParamRole>();
  // replicated parameters applied to split values (sequence-split under SP, or head-split: the
  // q/k norms): each rank's gradient covers its piece, so the gradient sums over tp
  const gradOverSeq = new Set<string>();
  const declared = new Map<string, ParamDecl>();
  for (const p of g.params) {
    const ctx = contextOf(p.dist?.name ?? p.name);
    const tp = ctx.tp;
    const r: ParamRole =
      tp === 1 ? { kind: 'replicated' } : tensorParallelRole(p.dist?.name ?? p.name);
    role.set(p.name, r);
    const shape = p.type.shape as readonly number[];
    let split: ParamDist['split'] = p.dist?.split ?? shape.map(() => null);
    let local = shape;
    const splitDim = (dim: number, blocks: number) => {
      if (shape[dim] % (tp * blocks) !== 0)
        fail(
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
    declared.set(p.name, { ...p, type: { ...p.type, shape: local }, dist });
    name.set(p.name, p.name);
    state.set(
      p.name,
      r.kind === 'replicated' || (r.kind === 'row' && shape.length === 1)
        ? R
        : { k: 'S', dim: r.kind === 'row' ? 1 : 0, blocks: r.kind === 'column' ? r.blocks : 1 },
    );
  }
  const paramNames = new Set(g.params.map((p) => p.name));

  // ---- conversions ------------------------------------------------------------------------
  const cache = new Map<string, string>();
  const typeOf = (v: string): TensorType => b.typeOf(v);
  const emit = (kind: OpKind, inputs: string[], attrs: Attrs, st: State[]): string[] => {
    const outs = b.op(kind, inputs, attrs);
    outs.forEach((v, i) => state.set(v, st[Math.min(i, st.length - 1)]));
    return outs;
  };
  const collOf = () => ({ group: cur.group, group_size: cur.tp });
  const stateText = (s: State) => (s.k === 'S' ? `split(dim ${s.dim})` : s.k);
  /** v converted to `want`; forColumn: the consumer is column-parallel (its input gradient is partial) */
  const convert = (v: string, want: 'R' | 'Q', forColumn = false): string => {
    const s = state.get(v)!;
    const key = `${v}\u0000${want}${forColumn ? 'c' : ''}\u0000${cur.group}`;
    const coll = collOf();
    const hit = cache.get(key);
    if (hit) return hit;
    let out: string;
    if (want === 'Q') {
      if (s.k === 'Q') return v;
      if (s.k === 'P') [out] = emit('reduce_scatter', [v], coll, [Q]);
      else if (s.k === 'R') [out] = emit('group_slice', [v], coll, [Q]);
      else return fail(`cannot sequence-split a ${stateText(s)} value ${formatType(typeOf(v))}`);
    } else if (s.k === 'R') {
      if (!forColumn) return v;
      [out] = emit('copy_to_group', [v], coll, [R]);
    } else if (s.k === 'P') {
      [out] = emit('all_reduce', [v], coll, [R]);
      if (forColumn) [out] = emit('copy_to_group', [out], coll, [R]);
    } else if (s.k === 'Q') {
      [out] = emit('all_gather', [v], { ...coll, grad: forColumn ? 'reduce_scatter' : 'slice' }, [
        R,
      ]);
    } else {
      return fail(
        `a value split along dim ${s.dim} ${formatType(typeOf(v))} cannot be gathered (only dim 0 can)`,
      );
    }
    cache.set(key, out);
    return out;
  };
  const isFloatValue = (v: string) => isFloat(typeOf(v).dtype);

  // ---- the walk ---------------------------------------------------------------------------
  // parameters declared in order; gradSum gains tp once the walk knows which meet split values
  for (const p of declared.values()) b.declare(p);
  const decoderStream = (n: Node) =>
    n.scope === 'model.merge_visual' || n.scope.endsWith('.deepstack');

  for (const n of g.nodes) {
    const ins = n.inputs.map((v) => {
      const m = name.get(v);
      if (m === undefined) throw new Error(`tensor parallelism: undefined value ${v}`);
      return m;
    });
    const st = ins.map((v) => state.get(v)!);
    const out = (outs: string[]) => n.outputs.forEach((o, i) => name.set(o.name, outs[i]));
    cur = contextOf(n.scope);
    const { tp, group: GROUP } = cur;
    const coll = collOf();
    b.at(n.scope, n.phase, () => {
      const run = (inputs: string[], attrs: Attrs, states: State[]) =>
        out(emit(n.op, inputs, attrs, states));
      const noteSeqParams = (inputs: string[]) => {
        const split = inputs.some((v) => {
          const k = state.get(v)!.k;
          return !paramNames.has(v) && (k === 'Q' || k === 'S');
        });
        if (split) for (const v of inputs) if (paramNames.has(v)) gradOverSeq.add(v);
      };
      switch (n.op) {
        case 'linear':
        case 'grouped_linear': {
          const wAt = n.op === 'linear' ? 1 : 2;
          const w = n.inputs[wAt];
          const r = role.get(w) ?? { kind: 'replicated' };
          if (r.kind === 'column' || r.kind === 'vocab') {
            const x = convert(ins[0], 'R', true);
            const blocks = r.kind === 'column' ? r.blocks : 1;
            const last = typeOf(ins[0]).shape.length - 1;
            return run([x, ...ins.slice(1)], n.attrs, [{ k: 'S', dim: last, blocks }]);
          }
          if (r.kind === 'row') {
            const s = st[0];
            const last = typeOf(ins[0]).shape.length - 1;
            if (s.k !== 'S' || s.dim !== last || s.blocks !== 1)
              fail(
                `${n.scope}: a row-parallel ${n.op} needs its input split along the last dim, got ${stateText(s)}`,
              );
            const bias = n.op === 'linear' ? ins[2] : undefined;
            if (bias === undefined) return run(ins, n.attrs, [P]);
            // the bias once, after the sum: y = Σ_ranks x·Wᵀ + 1·biasᵀ
            const [y] = emit('linear', [ins[0], ins[1]], n.attrs, [P]);
            const sum = convert(y, 'R');
            const rows = typeOf(sum).shape[0];
            const [ones] = emit(
              'constant',
              [],
              { value: 1, dtype: 'f32', shape: [formatDim(rows), '1'] },
              [R],
            );
            const width = typeOf(bias).shape[0] as number;
            const [b2] = emit('reshape', [bias], { shape: [String(width), '1'] }, [R]);
            const [yb] = emit('linear', [ones, b2], {}, [R]);
            return out(emit('add', [sum, yb], {}, [R]));
          }
          // replicated weight (router gate, patch projection): replicated input
          return run([convert(ins[0], 'R'), ...ins.slice(1)], n.attrs, [R]);
        }
        case 'embedding': {
          const r = role.get(n.inputs[1]);
          if (r?.kind === 'vocab')
            return run(ins, { ...n.attrs, shard_group: GROUP, group_size: tp }, [P]);
          return run(ins, n.attrs, [R]);
        }
        case 'cross_entropy': {
          const s = st[0];
          if (s.k !== 'S')
            return run(
              ins.map((v) => convert(v, 'R')),
              n.attrs,
              [R],
            );
          const [logits, mask, count] = [ins[0], ins[2], ins[3]];
          const labels = convert(ins[1], 'R');
          const vocab = { shard_group: GROUP, group_size: tp };
          const [lseLocal] = emit('vocab_logsumexp', [logits], {}, [R]);
          const rows = typeOf(lseLocal).shape[0];
          const [row] = emit('reshape', [lseLocal], { shape: ['1', formatDim(rows)] }, [R]);
          const [all] = emit('all_gather', [row], { ...coll, grad: 'slice' }, [R]);
          const [lse] = emit('lse_combine', [all], {}, [R]);
          const [tLocal] = emit('vocab_target_logit', [logits, labels, convert(mask, 'R')], vocab, [
            P,
          ]);
          const target = convert(tLocal, 'R');
          return out(emit('ce_from_stats', [lse, target, convert(mask, 'R'), count], {}, [R]));
        }
        case 'merge_visual': {
          const inputs = ins.map((v) => convert(v, 'R'));
          const [y] = emit('merge_visual', inputs, n.attrs, [R]);
          const z = o.sequenceParallel && decoderStream(n) ? convert(y, 'Q') : y;
          return out([z]);
        }
        case 'split': {
          const s = st[0];
          if (s.k === 'R' || s.k === 'Q') return run(ins, n.attrs, [s, s, s]);
          const parts = (n.attrs.sizes as number[]).length;
          const last = typeOf(ins[0]).shape.length - 1;
          if (s.k !== 'S' || s.dim !== last || s.blocks !== parts)
            fail(`${n.scope}: split of a ${stateText(s)} value into ${parts} parts`);
          const sizes = (n.attrs.sizes as number[]).map((x) => x / tp);
          const piece: State = { k: 'S', dim: last, blocks: 1 };
          return run(
            ins,
            { ...n.attrs, sizes },
            sizes.map(() => piece),
          );
        }
        case 'reshape': {
          const s = st[0];
          const target = (n.attrs.shape as string[]).map(parseDim);
          const from = typeOf(ins[0]).shape;
          if (s.k === 'R' || s.k === 'P') return run(ins, n.attrs, [s]);
          if (s.k === 'Q') {
            if (!dimEq(from[0], target[0]))
              fail(`${n.scope}: reshape of a sequence-split value changes dim 0`);
            return run(ins, { shape: [formatDim(from[0]), ...target.slice(1).map(formatDim)] }, [
              Q,
            ]);
          }
          // a split dim keeps its place when the dims before it are the same
          const d = target.findIndex(
            (_, i) => prefixText(target, i) === prefixText(globalShape(from, s, tp), s.dim),
          );
          if (d < 0 || (target[d] as number) % tp !== 0)
            fail(
              `${n.scope}: reshape ${formatShape(from)} → ${formatShape(target)} moves the split dim`,
            );
          const local = target.map((x, i) => (i === d ? dimDiv(x, tp) : x));
          return run(ins, { shape: local.map(formatDim) }, [{ k: 'S', dim: d, blocks: s.blocks }]);
        }
        case 'attention': {
          const [q, k, v, seg] = ins;
          for (const [x, label] of [
            [q, 'q'],
            [k, 'k'],
            [v, 'v'],
          ] as const) {
            const s = state.get(x)!;
            if (!(s.k === 'S' && s.dim === 1) && s.k !== 'R')
              fail(`${n.scope}: attention ${label} must be split by heads, got ${stateText(s)}`);
          }
          const sq = state.get(q)!;
          if (sq.k === 'R') return run([q, k, v, convert(seg, 'R')], n.attrs, [R, R]);
          return run([q, k, v, convert(seg, 'R')], n.attrs, [sq, sq]);
        }
        case 'rope':
          return run([ins[0], convert(ins[1], 'R')], n.attrs, [st[0]]);
        case 'moe_aux_loss':
        case 'moe_permute':
        case 'router_topk': {
          const inputs = ins.map((v) => convert(v, 'R'));
          return run(
            inputs,
            n.attrs,
            n.outputs.map(() => R),
          );
        }
        default:
          break;
      }
      if (ROW_WISE.has(n.op)) {
        // sequence-split wins; a sum of partials stays partial; pieces of one split stay split;
        // anything else is replicated
        const data = ins.filter((v) => !paramNames.has(v) && isFloatValue(v));
        const ks = new Set(data.map((v) => state.get(v)!.k));
        const split = data.map((v) => state.get(v)!).find((s) => s.k === 'S');
        const target: State = ks.has('Q')
          ? Q
          : ks.size === 1 && ks.has('P') && n.op === 'add'
            ? P
            : split && ks.size === 1
              ? split
              : R;
        if (split && target !== split)
          fail(`${n.scope}: ${n.op} mixes a split value with ${[...ks].join(', ')} values`);
        if (target.k === 'S') {
          const last = typeOf(ins[0]).shape.length - 1;
          for (const v of data) {
            const s = state.get(v)!;
            if (s.k !== 'S' || s.dim !== target.dim)
              fail(`${n.scope}: ${n.op} of values split along different dims`);
          }
          if ((n.op === 'layernorm' || n.op === 'rmsnorm') && target.dim === last)
            fail(`${n.scope}: ${n.op} over a split last dim`);
        }
        const inputs = ins.map((v) =>
          paramNames.has(v) || !isFloatValue(v) || target.k === 'S' || target.k === 'P'
            ? v
            : convert(v, target.k),
        );
        noteSeqParams(inputs);
        return run(
          inputs,
          n.attrs,
          n.outputs.map(() => target),
        );
      }
      if (LINEAR_OPS.has(n.op)) {
        const s = st[0];
        return run(
          ins.map((v, i) => (i === 0 ? v : convert(v, 'R'))),
          n.attrs,
          n.outputs.map((_, i) => (i === 0 ? s : R)),
        );
      }
      // anything else needs whole tensors
      return run(
        ins.map((v) => convert(v, 'R')),
        n.attrs,
        n.outputs.map(() => R),
      );
    });
  }
  cur = decoder;
  for (const out of g.outputs) {
    const v = name.get(out.value)!;
    b.output(out.label, convert(v, 'R'));
  }
  const built = b.build();
  return {
    ...built,
    params: built.params.map((p) =>
      gradOverSeq.has(p.name) && p.dist
        ? {
            ...p,
            dist: { ...p.dist, gradSum: [...p.dist.gradSum, contextOf(p.dist.name).group] },
          }
        : p,
    ),
  };
}

function prefixText(s: Shape, upTo: number): string {
  return s.slice(0, upTo).map(formatDim).join('·');
}

/** the whole (unsplit) shape of a split value */
function globalShape(local: Shape, s: State, tp: number): Shape {
  if (s.k !== 'S') return local;
  return local.map((d, i) => (i === s.dim ? dimMul(d, tp) : d));
}
