// Emission pass 6, optimizer: the optimizer step after the last gradient sum.
//
// Holds before: every pass and gradient sum is issued (grad-sync).
// Holds after: the step's instructions on compute, the first waiting for the comm stream's last
//   instruction (sums and sends): the weighted sum of squares of the local gradients and this
//   rank's shards (each weighed by 1 / the ranks that hold a copy of it), summed over the world,
//   the clipping factor, AdamW per parameter; with the distributed optimizer, AdamW per bucket
//   shard on this rank's slice of the parameters, then an all_gather of the updated slices.

import type { Graph, Node, ParamDecl } from '../../ir/graph.js';
import { NodeLowering, ProgramBuilder, type ProgramDraft } from './draft.js';
import type { EmitOptions } from './options.js';

const STEP = { microbatch: -1, phase: 'optimizer' as const, scope: 'optimizer' };

export function lowerOptimizerStep(d: ProgramDraft, g: Graph, opts: EmitOptions): ProgramDraft {
  const b = new ProgramBuilder(g, d);
  const nodes = NodeLowering.of(g, b, d);
  // the optimizer step waits for the comm stream's last instruction (sums and sends)
  let stepWait = [...d.openWaits];
  const lastComm = b.lastOn('comm');
  if (lastComm >= 0) stepWait = [b.record(lastComm)];
  const stepLocal = new Map<string, number>();
  const localNames = new Set(d.params.map((p) => p.name));
  const sharded = new Set(d.optimizerShards.flatMap((s) => s.params.map((p) => p.name)));
  const stepNodes = g.nodes.filter((n) => n.phase === 'optimizer');
  let coef = -1;
  for (const n of stepNodes) {
    if (n.op === 'sum_squares') {
      sumOfSquares(n, { g, b, nodes, d, opts, stepLocal, localNames, sharded }, stepWait);
      stepWait = [];
      continue;
    }
    if (n.op === 'adamw' && (!localNames.has(n.inputs[0]) || sharded.has(n.inputs[0]))) continue;
    const at = nodes.node(n, -1, stepLocal, stepWait);
    if (n.op === 'clip_coef') coef = b.instructions[at].outputs[0];
    stepWait = [];
  }
  shardedAdamW(b, d, opts, stepNodes, coef);
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
  readonly stepLocal: Map<string, number>;
  readonly localNames: ReadonlySet<string>;
  readonly sharded: ReadonlySet<string>;
}

/** the norm: whole local gradients and this rank's shards, each weighed by 1 / its copies */
function sumOfSquares(n: Node, c: StepContext, wait: number[]): void {
  const { b, d, opts } = c;
  const byName = new Map(c.g.params.map((p) => [p.name, p]));
  const groupSizes = opts.groupSizes ?? {};
  const ins = n.inputs.filter((v) => {
    const p = v.replace(/^grad\./, '');
    return c.localNames.has(p) && !c.sharded.has(p);
  });
  const weight = (p: ParamDecl) => 1 / (opts.copies?.[p.name] ?? 1);
  const scales = ins.map((v) => weight(byName.get(v.replace(/^grad\./, ''))!));
  const shardIns = d.shardBuffers.map((x) => x.grad);
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
): void {
  d.optimizerShards.forEach((s, k) => {
    const x = d.shardBuffers[k];
    const n = (opts.groupSizes ?? {})[s.group];
    const slice = b.addBuffer(
      `param_shard${x.param}`,
      { dtype: 'f32', shape: [b.buffers[x.grad].bytes / 4] },
      'arena',
      -1,
    );
    const coll = { group: s.group, group_size: n };
    b.push({
      stream: 'compute',
      op: 'group_slice',
      inputs: [x.param],
      outputs: [slice],
      attrs: coll,
      ...STEP,
    });
    const adamw = stepNodes.find((t) => t.op === 'adamw' && t.inputs[0] === s.params[0].name)!;
    b.push({
      stream: 'compute',
      op: 'adamw',
      inputs: [slice, x.grad, s.expAvg, s.expAvgSq, coef],
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
