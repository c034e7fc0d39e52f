// One program's dataflow with its microbatches folded together (model.ts VizGraph): every
// microbatch runs the same instructions, so a node is the n-th instruction of a (scope, op,
// phase, stream) within its microbatch, and `count` how many times the step runs it. An edge is a
// buffer one node writes and a later one reads (views, and gradients inside their bucket, followed
// to the bytes they share).

import { stageOfRank, type PlanFile, type ProgramFile } from '../../compiler/plan/format.js';
import { layerOf } from '../../compiler/emit/rewrite.js';
import type { Work } from '../../compiler/sim/cost.js';
import type { VizGraph, VizNode } from '../model.js';
import { collectiveOf } from './group.js';
import { partOf } from './part.js';

export function programGraph(
  plan: PlanFile,
  program: ProgramFile,
  rank: number,
  work: readonly Work[],
): VizGraph {
  const { buffers, instructions } = program;
  const storage = storageOf(buffers);
  const root = (b: number) => storage[b];
  const stageOf = stageOfScope(plan, stageOfRank(plan, rank));
  const nodes: (VizNode & { count: number })[] = [];
  const nodeOf = new Int32Array(instructions.length);
  const byKey = new Map<string, number>();
  const ordinal = new Map<string, number>();
  instructions.forEach((x, i) => {
    const within = `${x.microbatch}\u0000${x.scope}\u0000${x.op}\u0000${x.phase}\u0000${x.stream}`;
    const n = ordinal.get(within) ?? 0;
    ordinal.set(within, n + 1);
    const key = `${x.scope}\u0000${x.op}\u0000${x.phase}\u0000${x.stream}\u0000${n}`;
    let at = byKey.get(key);
    if (at === undefined) {
      byKey.set(key, (at = nodes.length));
      const collective = collectiveOf(plan, rank, x);
      nodes.push({
        op: x.op,
        scope: x.scope,
        phase: x.phase,
        stream: x.stream,
        count: 0,
        stage: stageOf(x.scope),
        part: partOf(x),
        ...(collective ? { collective } : {}),
        shapes: x.outputs.map((b) => buffers[b].shape),
        dtypes: x.outputs.map((b) => buffers[b].dtype),
        flops: work[i].flops,
        bytes: work[i].bytes,
      });
    }
    nodes[at].count++;
    nodeOf[i] = at;
  });
  // edges: the last writer of each buffer to each later reader, bytes counted once per buffer
  const writer = new Int32Array(buffers.length).fill(-1);
  const edges = new Map<number, [number, number, number]>();
  const counted = new Set<string>();
  instructions.forEach((x, i) => {
    const to = nodeOf[i];
    for (const b of x.inputs) {
      const from = writer[root(b)];
      if (from < 0 || from === to) continue;
      const key = from * nodes.length + to;
      let e = edges.get(key);
      if (!e) edges.set(key, (e = [from, to, 0]));
      const name = `${key}\u0000${buffers[b].name}`;
      if (!counted.has(name)) {
        counted.add(name);
        e[2] += buffers[b].bytes;
      }
    }
    for (const b of x.outputs) writer[root(b)] = to;
  });
  return { program: program.id, nodes, edges: [...edges.values()] };
}

/**
 * Each buffer's storage: a view's base; in the regions laid out for the whole step (parameters,
 * gradients, optimizer state), the outermost buffer whose bytes hold it, so a gradient written
 * by backward meets the bucket its all-reduce reads. (Arena offsets are reused over the step, so
 * there only views share.)
 */
function storageOf(buffers: ProgramFile['buffers']): Int32Array {
  const out = Int32Array.from(buffers, (b) => b.viewOf ?? b.id);
  for (const region of ['param', 'grad', 'optim']) {
    const held = buffers
      .filter((b) => b.region === region && b.viewOf === undefined)
      .sort((a, b) => a.offset - b.offset || b.bytes - a.bytes);
    let outer = -1;
    let end = -Infinity;
    for (const b of held) {
      if (b.offset < end) out[b.id] = outer;
      else [outer, end] = [b.id, b.offset + b.bytes];
    }
  }
  for (const b of buffers) if (b.viewOf !== undefined) out[b.id] = out[b.viewOf];
  return out;
}

/**
 * The pipeline stage a scope's instruction belongs to: the program's stage, or, with virtual
 * stages (vpp > 1), a decoder layer's virtual stage s = chunk·pp + stage, so colouring by stage
 * tells a program's chunks apart.
 */
function stageOfScope(plan: PlanFile, stage: number): (scope: string) => number {
  const layers = plan.topology.pipelineLayers;
  if (!layers || plan.topology.sizes.vpp <= 1) return () => stage;
  const virtualOf: number[] = layers.flatMap((n, s) => Array<number>(n).fill(s));
  return (scope) => {
    const layer = layerOf(scope);
    return layer === undefined
      ? stage
      : (virtualOf[Number(layer.slice(layer.lastIndexOf('.') + 1))] ?? stage);
  };
}
