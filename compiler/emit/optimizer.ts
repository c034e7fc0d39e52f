// Emission pass 6, optimizer: the optimizer step after the last gradient sum.
//
// Holds before: every pass and gradient sum is issued (grad-sync).
// Holds after: the step's instructions on compute, the first waiting for the last instruction of
//   the comm stream (sends) and of the grad stream (sums): the weighted sum of squares of the
//   local gradients and this rank's shards (each weighed by 1 / the ranks that hold a copy of
//   it), summed over the world, the clipping factor, AdamW per parameter; with the distributed
//   optimizer, first this rank's block of each reduce-scattered gradient bucket sliced out, then
//   AdamW per bucket shard on this rank's slice of the parameters (from the fp32 master slice
//   under mixed precision), then an all_gather of the updated slices.

import type { DType } from '../../ir/dtype.js';
import { paramsByName, type Graph, type Node, type ParamDecl } from '../../ir/graph.js';
import { NodeLowering, ProgramBuilder, type ProgramDraft } from './draft.js';
import type { EmitOptions } from './options.js';
import type { Values } from './values.js';

const STEP = { microbatch: -1, phase: 'optimizer' as const, scope: 'optimizer' };

export function lowerOptimizerStep(d: ProgramDraft, g: Graph, opts: EmitOptions): ProgramDraft {
  const b = new ProgramBuilder(g, d);
  const nodes = NodeLowering.of(g, b, d);
  // the optimizer step waits for the comm stream's last instruction (sends) and the grad
  // stream's (sums)
  let stepWait = [...d.openWaits];
  const last = (['comm', 'grad'] as const).map((s) => b.lastOn(s)).filter((i) => i >= 0);
  if (last.length) stepWait = last.map((i) => b.record(i));
  const gradSlices = sliceGradients(b, d, opts, stepWait);
  if (gradSlices.length) stepWait = [];
  const stepLocal = nodes.values();
  const localNames = new Set(d.params.map((p) => p.name));
  const sharded = new Set(d.optimizerShards.flatMap((s) => s.params.map((p) => p.name)));
  const stepNodes = g.nodes.filter((n) => n.phase === 'optimizer');
  let coef = -1;
  for (const n of stepNodes) {
    if (n.op === 'sum_squares') {
      const c = { g, b, nodes, d, opts, stepLocal, localNames, sharded, gradSlices };
      sumOfSquares(n, c, stepWait);
      stepWait = [];
      continue;
    }
    if (n.op === 'adamw' && (!localNames.has(n.inputs[0]) || sharded.has(n.inputs[0]))) continue;
    const at = nodes.node(n, -1, stepLocal, stepWait);
    if (n.op === 'clip_coef') coef = b.instructions[at].outputs[0];
    stepWait = [];
  }
  shardedAdamW(b, d, opts, stepNodes, coef, gradSlices);
  return {
    ...d,
    regions: b.regionTop,
    buffers: b.buffers,
    events: b.events,
    instructions: b.instructions,
    scalars: nodes.scalars,
    outputs: nodes.outputs,
    openWaits: [],
  };
}

interface StepContext {
  readonly g: Graph;
  readonly b: ProgramBuilder;
  readonly nodes: NodeLowering;
  readonly d: ProgramDraft;
  readonly opts: EmitOptions;
  readonly stepLocal: Values;
  readonly localNames: ReadonlySet<string>;
  readonly sharded: ReadonlySet<string>;
  /** distributed optimizer: this rank's block of each summed gradient bucket */
  readonly gradSlices: readonly number[];
}

/**
 * distributed optimizer: each bucket's block of the sum, out of the bucket it was reduce-scattered
 * into (a step temporary: the gradient region keeps no second copy)
 */
function sliceGradients(
  b: ProgramBuilder,
  d: ProgramDraft,
  opts: EmitOptions,
  wait: number[],
): number[] {
  return d.optimizerShards.map((s, k) => {
    const bucket = d.shardBuffers[k].bucket;
    const n = (opts.groupSizes ?? {})[s.group];
    const type = { dtype: b.buffers[bucket].dtype as DType, shape: [s.elements / n] };
    const slice = b.addBuffer(`grad_shard${k}`, type, 'arena', -1);
    b.push(
      {
        stream: 'compute',
        op: 'group_slice',
        inputs: [bucket],
        outputs: [slice],
        attrs: { group: s.group, group_size: n },
        ...STEP,
      },
      k === 0 ? wait : [],
    );
    return slice;
  });
}

/** the norm: whole local gradients and this rank's shards, each weighed by 1 / its copies */
function sumOfSquares(n: Node, c: StepContext, wait: number[]): void {
  const { b, d, opts } = c;
  const byName = paramsByName(c.g);
  const groupSizes = opts.groupSizes ?? {};
  const ins = n.inputs.filter((v) => {
    const p = v.replace(/^grad\./, '');
    return c.localNames.has(p) && !c.sharded.has(p);
  });
  const weight = (p: ParamDecl) => 1 / (opts.copies?.[p.name] ?? 1);
  const scales = ins.map((v) => weight(byName.get(v.replace(/^grad\./, ''))!));
  const shardIns = c.gradSlices;
  const shardScales = d.optimizerShards.map(
    (s) => weight(byName.get(s.params[0].name)!) * groupSizes[s.group],
  );
  const all = [...scales, ...shardScales];
  const out = n.outputs[0];
  const name = c.nodes.stepOutputs.get(out.name);
  const sumsq = name
    ? (c.nodes.scalars[name] = b.addBuffer(name, out.type, 'scalar', -1))
    : b.addBuffer(out.name, out.type, 'arena', -1);
  c.stepLocal.set(out.name, sumsq);
  const grads = ins.map((v) => c.nodes.global.get(v)!);
  b.push(
    {
      stream: 'compute',
      op: 'sum_squares',
      inputs: [...grads, ...shardIns],
      outputs: [sumsq],
      attrs: all.some((x) => x !== 1) ? { ...n.attrs, scales: all } : n.attrs,
      ...STEP,
    },
    wait,
  );
  const world = opts.worldSize ?? 1;
  if (world > 1)
    b.push({
      stream: 'compute',
      op: 'all_reduce',
      inputs: [sumsq],
      outputs: [sumsq],
      attrs: { group: 'world', group_size: world },
      ...STEP,
    });
}

/** sharded AdamW: update this rank's slice of each bucket, then gather the updated parameters */
function shardedAdamW(
  b: ProgramBuilder,
  d: ProgramDraft,
  opts: EmitOptions,
  stepNodes: readonly Node[],
  coef: number,
  gradSlices: readonly number[],
): void {
  d.optimizerShards.forEach((s, k) => {
    const x = d.shardBuffers[k];
    const n = (opts.groupSizes ?? {})[s.group];
    const dtype = b.buffers[x.param].dtype as DType;
    const slice = b.addBuffer(
      `param_shard${x.param}`,
      { dtype, shape: [s.elements / n] },
      'arena',
      -1,
    );
    const coll = { group: s.group, group_size: n };
    // with master weights AdamW writes the whole slice from them: nothing to read first
    if (s.master === undefined)
      b.push({
        stream: 'compute',
        op: 'group_slice',
        inputs: [x.param],
        outputs: [slice],
        attrs: coll,
        ...STEP,
      });
    const adamw = stepNodes.find((t) => t.op === 'adamw' && t.inputs[0] === s.params[0].name)!;
    const master = s.master !== undefined ? [s.master] : [];
    b.push({
      stream: 'compute',
      op: 'adamw',
      inputs: [slice, gradSlices[k], s.expAvg, s.expAvgSq, coef, ...master],
      outputs: [],
      attrs: adamw.attrs,
      ...STEP,
    });
    b.push({
      stream: 'compute',
      op: 'all_gather',
      inputs: [slice],
      outputs: [x.param],
      attrs: coll,
      ...STEP,
    });
  });
}
