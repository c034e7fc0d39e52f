// A generator of valid multi-rank plans for the plan verifier's tests: pp pipeline stages × dp
// replicas, replicas grouped in blocks that share one program.
//
//   rank r = d + dp·s           d replica, s stage; block b = ⌊d / block⌋, j = d mod block
//   dp[s]        the dp replicas of stage s: gradient all_reduce, broadcast, all_gather,
//                all_to_all_v (per microbatch), gather_v, reduce_scatter
//   tp[s·nb+b]   the block at stage s (when block > 1): an all_reduce per layer, both ways
//   pipe[b]      block b at every stage: one broadcast from group rank 0 at the step start
//
// Each rank of block (s, b) sends its activation to every rank of block (s+1, b) and its
// gradient to every rank of block (s−1, b): with block 1 that is the usual pipeline, with larger
// blocks the programs of a block stay identical (peers are global ranks), so ranks share programs.
// Microbatches run in 1F1B order on the compute stream. Forward send/recv and the collectives are
// on the comm stream, backward send/recv on the copy stream, so that each stream's transfers to a
// neighbour are in microbatch order (blocking send/recv in one stream would deadlock 1F1B).
// Every cross-stream read waits for an event recorded by its writer (or transitively after it).

import type { DType } from '../../ir/dtype.js';
import { ProgramBuilder, type InstrOptions } from '../runtime/program-builder.js';
import {
  PLAN_FORMAT,
  PLAN_VERSION,
  type BufferRegion,
  type PlanFile,
  type ProgramFile,
  type StreamName,
} from '../../compiler/plan/format.js';

export interface GenOptions {
  readonly seed: number;
  readonly pp: number;
  readonly dp: number;
  /** replicas per block: divides dp */
  readonly block: number;
  readonly microbatches: number;
  /** layers per stage */
  readonly layers: number;
  readonly hidden?: number;
  /**
   * How collectives name their group: a plan group ('dp[1]'), or a group kind ('dp') that
   * plan.rankGroups resolves per rank
   */
  readonly groupRefs?: 'names' | 'kinds';
}

export interface GeneratedPlan {
  readonly plan: PlanFile;
  readonly programs: Map<string, ProgramFile>;
}

export const SYMBOLS = [
  { name: 'S', bound: 64, doc: 'tokens of a microbatch' },
  { name: 'Nv', bound: 16, doc: 'visual tokens of a microbatch' },
] as const;
const BOUNDS: Record<string, number> = { S: 64, Nv: 16 };

/** Small deterministic hash of integers, for choices every member of a group must agree on. */
export function mix(...keys: number[]): number {
  let h = 0x9e3779b9;
  for (const k of keys) {
    h = Math.imul(h ^ (k >>> 0), 0x85ebca6b);
    h ^= h >>> 13;
    h = Math.imul(h, 0xc2b2ae35);
    h ^= h >>> 16;
  }
  return h >>> 0;
}

/** mulberry32: a seeded random stream. */
export function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * A program under construction for the verifier's tests: the runtime tests' builder at this
 * file's symbol bounds, with step-level defaults (no microbatch, no scope) and event helpers.
 */
export class ProgramDraft extends ProgramBuilder {
  constructor(id: string) {
    super(id, BOUNDS);
    // never run, and its ops are schematic (a moe_permute without experts): no scratch to plan
    this.planScratch = false;
  }

  buf(
    name: string,
    region: BufferRegion,
    dtype: DType,
    shape: readonly (string | number)[],
    microbatch = -1,
  ): number {
    return this.buffer(name, region, dtype, shape, { microbatch });
  }

  add(
    stream: StreamName,
    op: string,
    inputs: readonly number[],
    outputs: readonly number[],
    attrs: Record<string, unknown> = {},
    o: InstrOptions = {},
  ): number {
    return this.instr(stream, op, inputs, outputs, attrs, { microbatch: -1, scope: '', ...o });
  }

  /** instruction i also records event e */
  recordAt(i: number, e: number): void {
    const ins = this.instructions[i];
    this.instructions[i] = { ...ins, record: [...ins.record, e] };
  }

  /** the last instruction also records a new event, returned */
  recordAfterLast(): number {
    const e = this.event();
    this.recordAt(this.instructions.length - 1, e);
    return e;
  }
}

/** 1F1B order of one stage: warm-up forwards, alternating F/B, cool-down backwards. */
export function oneFOneB(pp: number, s: number, m: number): { pass: 'F' | 'B'; mb: number }[] {
  const warm = Math.min(pp - 1 - s, m);
  const order: { pass: 'F' | 'B'; mb: number }[] = [];
  let f = 0;
  let b = 0;
  while (f < warm) order.push({ pass: 'F', mb: f++ });
  while (f < m) {
    order.push({ pass: 'F', mb: f++ });
    order.push({ pass: 'B', mb: b++ });
  }
  while (b < m) order.push({ pass: 'B', mb: b++ });
  return order;
}

function stageProgram(o: GenOptions, s: number, b: number, id: string): ProgramFile {
  const { pp, dp, block, layers: L } = o;
  const H = o.hidden ?? 16;
  const nb = dp / block;
  const rankOf = (stage: number, d: number) => d + dp * stage;
  const blockRanks = (stage: number) =>
    Array.from({ length: block }, (_, j) => rankOf(stage, b * block + j));
  const prev = s > 0 ? blockRanks(s - 1) : [];
  const next = s < pp - 1 ? blockRanks(s + 1) : [];
  // attribute objects are shared between instructions: never edited in place
  const byKind = o.groupRefs === 'kinds';
  const dpGroup = { group: byKind ? 'dp' : `dp[${s}]`, group_size: dp };
  const tpGroup = { group: byKind ? 'tp' : `tp[${s * nb + b}]`, group_size: block };
  const pipeGroup = { group: byKind ? 'pipe' : `pipe[${b}]`, group_size: block * pp };
  // choices every member of a group agrees on: they depend on the seed and the stage only
  const dpRoot = mix(o.seed, s, 1) % dp;
  const gatherRoot = mix(o.seed, s, 2) % dp;
  // per-layer output width; stages exchange [S, H]
  const width = (l: number) => (l === L - 1 ? H : H * (1 + (mix(o.seed, s, l, 3) % 3)));
  // sizes that differ per block (variable-size collectives)
  const a2aRows = `${1 + (b % 3)}*S`;
  const statsRows = `${1 + (b % 2)}*Nv`;

  const P = new ProgramDraft(id);
  const scope = (what: string) => `stage${s}.${what}`;
  // parameters: layer l maps [S, in_l] → [S, width(l)], in_0 = H
  const inW = (l: number) => (l === 0 ? H : width(l - 1));
  const W: number[] = [];
  const G: number[] = [];
  const Mo: number[] = [];
  const V: number[] = [];
  const R: number[] = [];
  for (let l = 0; l < L; l++) {
    const shape = [width(l), inW(l)];
    W.push(P.buf(scope(`layer${l}.w`), 'param', 'bf16', shape));
    G.push(P.buf(scope(`layer${l}.w.grad`), 'grad', 'bf16', shape));
    Mo.push(P.buf(scope(`layer${l}.w.exp_avg`), 'optim', 'f32', shape));
    V.push(P.buf(scope(`layer${l}.w.exp_avg_sq`), 'optim', 'f32', shape));
    R.push(P.buf(scope(`layer${l}.w.grad.reduced`), 'arena', 'bf16', shape));
  }
  const Hout = width(L - 1);

  // ---- step start (comm): broadcasts and a parameter all_gather ------------------------------
  const cfg = P.buf('cfg', 'data', 'i32', [4]);
  const cfgB = P.buf('cfg.bcast', 'arena', 'i32', [4]);
  const eCfg = P.event();
  P.add(
    'comm',
    'broadcast',
    [cfg],
    [cfgB],
    { ...pipeGroup, root: 0 },
    { record: [eCfg], scope: 'step.cfg' },
  );
  const bias = P.buf('bias', 'data', 'f32', [H]);
  const biasB = P.buf('bias.bcast', 'arena', 'f32', [H]);
  const eBias = P.event();
  P.add(
    'comm',
    'broadcast',
    [bias],
    [biasB],
    { ...dpGroup, root: dpRoot },
    { record: [eBias], scope: 'step.bias' },
  );
  const shard = P.buf(scope('embed.shard'), 'param', 'bf16', [H]);
  const full = P.buf(scope('embed.full'), 'arena', 'bf16', [dp * H]);
  const eFull = P.event();
  P.add('comm', 'all_gather', [shard], [full], dpGroup, { record: [eFull], scope: scope('embed') });
  const emb = P.buf(scope('embed.out'), 'arena', 'bf16', [H]);
  P.add(
    'compute',
    'embedding',
    [cfgB, biasB, full],
    [emb],
    {},
    { wait: [eCfg, eBias, eFull], scope: scope('embed') },
  );

  // ---- microbatches ----------------------------------------------------------------------------
  const acts: number[][] = []; // [mb][l] input of layer l
  const outs: number[] = [];
  for (const { pass, mb } of oneFOneB(pp, s, o.microbatches)) {
    const at = { microbatch: mb, phase: pass === 'F' ? 'forward' : 'backward' } as const;
    const tp = (stream: 'comm', x: number, shape: (string | number)[], what: string) => {
      // all_reduce over the block: compute records, comm reduces, compute waits
      const e1 = P.recordAfterLast();
      const e2 = P.event();
      const y = P.buf(`${what}.tp`, 'arena', 'bf16', shape, mb);
      P.add(stream, 'all_reduce', [x], [y], tpGroup, {
        ...at,
        wait: [e1],
        record: [e2],
        scope: what,
      });
      return { y, wait: [e2] };
    };
    if (pass === 'F') {
      let x: number;
      let wait: number[] = [];
      if (s === 0) x = P.buf(`tokens.mb${mb}`, 'data', 'bf16', ['S', H], mb);
      else {
        const ins = prev.map((peer, j) => {
          const buf = P.buf(`act.in.mb${mb}.${j}`, 'arena', 'bf16', ['S', H], mb);
          const e = j === prev.length - 1 ? [P.event()] : [];
          P.add(
            'comm',
            'recv',
            [],
            [buf],
            { peer, tag: 2 * mb, dtype: 'bf16', shape: ['S', String(H)] },
            { ...at, record: e, scope: scope('recv') },
          );
          wait = e;
          return buf;
        });
        x = P.buf(`act.mb${mb}`, 'arena', 'bf16', ['S', H], mb);
        P.add('compute', 'concat', ins, [x], {}, { ...at, wait, scope: scope('recv') });
        wait = [];
      }
      const x0 = P.buf(`act.mb${mb}.emb`, 'arena', 'bf16', ['S', H], mb);
      P.add('compute', 'add', [x, emb], [x0], {}, { ...at, wait, scope: scope('embed') });
      x = x0;
      acts[mb] = [];
      for (let l = 0; l < L; l++) {
        const sc = scope(`layer${l}`);
        acts[mb][l] = x;
        const h = P.buf(`${sc}.h.mb${mb}`, 'arena', 'bf16', ['S', width(l)], mb);
        P.add('compute', 'linear', [x, W[l]], [h], {}, { ...at, scope: sc });
        let y = h;
        wait = [];
        if (block > 1) ({ y, wait } = tp('comm', h, ['S', width(l)], `${sc}.mb${mb}`));
        const g = P.buf(`${sc}.act.mb${mb}`, 'arena', 'bf16', ['S', width(l)], mb);
        P.add('compute', 'gelu', [y], [g], {}, { ...at, wait, scope: sc });
        x = g;
        if (l === 0) {
          // expert dispatch: rows per rank vary, counts exchanged first
          const rows = P.buf(`${sc}.rows.mb${mb}`, 'arena', 'bf16', [a2aRows, width(l)], mb);
          const counts = P.buf(`${sc}.counts.mb${mb}`, 'arena', 'i32', [dp], mb);
          const e1 = P.event();
          P.add(
            'compute',
            'moe_permute',
            [g],
            [rows, counts],
            {},
            { ...at, record: [e1], scope: sc },
          );
          const got = P.buf(
            `${sc}.rows.recv.mb${mb}`,
            'arena',
            'bf16',
            [`${3 * dp}*S`, width(l)],
            mb,
          );
          const gotCounts = P.buf(`${sc}.counts.recv.mb${mb}`, 'arena', 'i32', [dp], mb);
          const e2 = P.event();
          P.add(
            'comm',
            'all_to_all_v',
            [rows, counts],
            [got, gotCounts],
            { ...dpGroup, out_rows: [`${3 * dp}*S`] },
            { ...at, wait: [e1], record: [e2], scope: sc },
          );
          const u = P.buf(`${sc}.moe.mb${mb}`, 'arena', 'bf16', ['S', width(l)], mb);
          P.add(
            'compute',
            'moe_unpermute',
            [got, gotCounts, g],
            [u],
            {},
            { ...at, wait: [e2], scope: sc },
          );
          x = u;
        }
      }
      outs[mb] = x;
      if (next.length) {
        const e = P.recordAfterLast();
        next.forEach((peer, j) =>
          P.add(
            'comm',
            'send',
            [x],
            [],
            { peer, tag: 2 * mb },
            { ...at, wait: j === 0 ? [e] : [], scope: scope('send') },
          ),
        );
      } else {
        const loss = P.buf(`loss.mb${mb}`, 'scalar', 'f32', [], mb);
        const labels = P.buf(`labels.mb${mb}`, 'data', 'i32', ['S'], mb);
        P.add('compute', 'cross_entropy', [x, labels], [loss], {}, { ...at, scope: 'loss' });
      }
      continue;
    }
    // backward
    let dy: number;
    let wait: number[] = [];
    if (next.length) {
      const ins = next.map((peer, j) => {
        const buf = P.buf(`grad.in.mb${mb}.${j}`, 'arena', 'bf16', ['S', Hout], mb);
        const e = j === next.length - 1 ? [P.event()] : [];
        P.add(
          'copy',
          'recv',
          [],
          [buf],
          { peer, tag: 2 * mb + 1, dtype: 'bf16', shape: ['S', String(Hout)] },
          { ...at, record: e, scope: scope('recv') },
        );
        wait = e;
        return buf;
      });
      dy = P.buf(`grad.mb${mb}`, 'arena', 'bf16', ['S', Hout], mb);
      P.add('compute', 'concat', ins, [dy], {}, { ...at, wait, scope: scope('recv') });
    } else {
      dy = P.buf(`grad.mb${mb}`, 'arena', 'bf16', ['S', Hout], mb);
      P.add('compute', 'cross_entropy_grad', [outs[mb]], [dy], {}, { ...at, scope: 'loss' });
    }
    for (let l = L - 1; l >= 0; l--) {
      const sc = scope(`layer${l}`);
      const dx = P.buf(`${sc}.dx.mb${mb}`, 'arena', 'bf16', ['S', inW(l)], mb);
      P.add('compute', 'linear_dgrad', [dy, W[l]], [dx], {}, { ...at, scope: sc });
      const dw = P.buf(`${sc}.dw.mb${mb}`, 'arena', 'bf16', [width(l), inW(l)], mb);
      P.add('compute', 'linear_wgrad', [dy, acts[mb][l]], [dw], {}, { ...at, scope: sc });
      P.add('compute', 'grad_accumulate', [dw, G[l]], [], {}, { ...at, scope: sc });
      dy = dx;
      if (block > 1) {
        const { y, wait: w } = tp('comm', dx, ['S', inW(l)], `${sc}.dgrad.mb${mb}`);
        const d2 = P.buf(`${sc}.dx.sum.mb${mb}`, 'arena', 'bf16', ['S', inW(l)], mb);
        P.add('compute', 'add', [y, dx], [d2], {}, { ...at, wait: w, scope: sc });
        dy = d2;
      }
    }
    if (prev.length) {
      const e = P.recordAfterLast();
      prev.forEach((peer, j) =>
        P.add(
          'copy',
          'send',
          [dy],
          [],
          { peer, tag: 2 * mb + 1 },
          { ...at, wait: j === 0 ? [e] : [], scope: scope('send') },
        ),
      );
    }
  }

  // ---- gradient reduction (comm) after the last backward ----------------------------------------
  const at = { phase: 'optimizer', microbatch: -1 } as const;
  const reduced: number[] = [];
  for (let l = L - 1; l >= 0; l--) {
    // the last write of G[l] is the last grad_accumulate of layer l: record there
    let last = P.instructions.length - 1;
    while (P.instructions[last].op !== 'grad_accumulate' || P.instructions[last].inputs[1] !== G[l])
      last--;
    const e = P.event();
    P.recordAt(last, e);
    const done = P.event();
    P.add('comm', 'all_reduce', [G[l]], [R[l]], dpGroup, {
      ...at,
      wait: [e],
      record: [done],
      scope: scope(`layer${l}`),
    });
    reduced.push(done);
  }
  // variable rows gathered on a root, and a reduce_scatter of a flat buffer
  const stats = P.buf(scope('stats'), 'arena', 'bf16', [statsRows, H]);
  const flat = P.buf(scope('flat'), 'arena', 'bf16', [dp * H]);
  const eStats = P.event();
  P.add(
    'compute',
    'constant',
    [],
    [stats, flat],
    {},
    { ...at, record: [eStats], scope: scope('stats') },
  );
  const gathered = P.buf(scope('stats.gathered'), 'arena', 'bf16', [`${2 * dp}*Nv`, H]);
  const eGather = P.event();
  P.add(
    'comm',
    'gather_v',
    [stats],
    [gathered],
    { ...dpGroup, root: gatherRoot, out_rows: [`${2 * dp}*Nv`] },
    { ...at, wait: [eStats], record: [eGather], scope: scope('stats') },
  );
  const shardGrad = P.buf(scope('embed.shard.grad'), 'arena', 'bf16', [H]);
  const eRs = P.event();
  P.add('comm', 'reduce_scatter', [flat], [shardGrad], dpGroup, {
    ...at,
    record: [eRs],
    scope: scope('embed'),
  });

  // ---- optimizer (compute): waits for every reduction once, then runs in stream order ------------
  const sumsq = P.buf('sumsq', 'scalar', 'f32', []);
  P.add(
    'compute',
    'sum_squares',
    [...R, shardGrad, gathered],
    [sumsq],
    {},
    { ...at, wait: [...reduced, eGather, eRs], scope: 'optimizer' },
  );
  const clip = P.buf('clip_coef', 'scalar', 'f32', []);
  P.add('compute', 'clip_coef', [sumsq], [clip], { max_norm: 1 }, { ...at, scope: 'optimizer' });
  const adam = { beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1 };
  for (let l = 0; l < L; l++)
    P.add('compute', 'adamw', [W[l], R[l], Mo[l], V[l], clip], [], adam, {
      ...at,
      scope: scope(`layer${l}`),
    });
  const mS = P.buf(scope('embed.shard.exp_avg'), 'optim', 'f32', [H]);
  const vS = P.buf(scope('embed.shard.exp_avg_sq'), 'optim', 'f32', [H]);
  P.add('compute', 'adamw', [shard, shardGrad, mS, vS, clip], [], adam, {
    ...at,
    scope: scope('embed'),
  });
  return P.build();
}

/** A plan.json around given programs, groups and rank → program map. */
export function planFile(
  rankPrograms: readonly string[],
  groups: readonly { name: string; ranks: readonly number[] }[],
  opts: {
    sizes?: Record<string, number>;
    numMicrobatches?: number;
    rankGroups?: Record<string, readonly number[]>;
  } = {},
): PlanFile {
  const world = rankPrograms.length;
  const numMicrobatches = opts.numMicrobatches ?? 1;
  return {
    format: PLAN_FORMAT,
    version: PLAN_VERSION,
    createdBy: 'test/verify/plan-gen.ts',
    model: { name: 'synthetic', config: {}, paramsTotal: 0 },
    training: {
      seqLength: 64,
      microBatchSize: 1,
      globalBatchSize: numMicrobatches,
      numMicrobatches,
      maxVisualTokens: 16,
      optimizer: { lr: 1e-3, beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0.1, clipNorm: 1 },
    },
    topology: { worldSize: world, nnodes: 1, nprocPerNode: world, sizes: opts.sizes ?? {} },
    groups: groups.map((g) => ({ name: g.name, ranks: [...g.ranks] })),
    rankGroups: opts.rankGroups ?? {},
    dataParallel: { size: world, rankIndex: rankPrograms.map((_, r) => r) },
    symbols: SYMBOLS.map((s) => ({ ...s })),
    params: [],
    rankPrograms: [...rankPrograms],
  };
}

/** A valid plan: one program per (stage, block), shared by the block's ranks. */
export function generatePlan(o: GenOptions): GeneratedPlan {
  const { pp, dp, block } = o;
  if (dp % block !== 0) throw new Error(`block ${block} must divide dp ${dp}`);
  const nb = dp / block;
  const world = pp * dp;
  const programs = new Map<string, ProgramFile>();
  const rankPrograms: string[] = [];
  for (let s = 0; s < pp; s++)
    for (let b = 0; b < nb; b++) {
      const id = `s${s}.b${b}`;
      programs.set(id, stageProgram(o, s, b, id));
    }
  for (let r = 0; r < world; r++) {
    const s = Math.floor(r / dp);
    const d = r % dp;
    rankPrograms.push(`s${s}.b${Math.floor(d / block)}`);
  }
  const groups: { name: string; ranks: number[] }[] = [];
  for (let s = 0; s < pp; s++)
    groups.push({ name: `dp[${s}]`, ranks: Array.from({ length: dp }, (_, d) => d + dp * s) });
  for (let s = 0; s < pp; s++)
    for (let b = 0; b < nb; b++)
      groups.push({
        name: `tp[${s * nb + b}]`,
        ranks: Array.from({ length: block }, (_, j) => b * block + j + dp * s),
      });
  for (let b = 0; b < nb; b++) {
    const ranks: number[] = [];
    for (let s = 0; s < pp; s++) for (let j = 0; j < block; j++) ranks.push(b * block + j + dp * s);
    groups.push({ name: `pipe[${b}]`, ranks });
  }
  // kind → [rank] index in groups of the rank's group of that kind
  const kindOf = (name: string) => name.slice(0, name.indexOf('['));
  const rankGroups: Record<string, number[]> = { dp: [], tp: [], pipe: [] };
  groups.forEach((g, gi) => {
    for (const r of g.ranks) rankGroups[kindOf(g.name)][r] = gi;
  });
  const plan = planFile(rankPrograms, groups, {
    sizes: { dp, pp, block },
    numMicrobatches: o.microbatches,
    rankGroups,
  });
  return { plan, programs };
}
