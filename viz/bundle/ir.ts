// The IR after a graph pass (`lfc compile --save-ir` keeps them in DIR/ir/) as the graph view
// draws it (model.ts VizGraph): a node per IR node, an edge per value from its producer to each
// consumer. The IR is one rank's graph of one microbatch, before emission: no streams, no
// pipeline stages yet, and a collective names its group by kind (`tp`), not by the ranks in it.

import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { UserError } from '../../compiler/errors.js';
import { DTYPE_BYTES } from '../../ir/dtype.js';
import type { Graph } from '../../ir/graph.js';
import { graphFromJSON } from '../../ir/json.js';
import { nodeFlops } from '../../ir/ops.js';
import { formatDim, numel } from '../../ir/shape.js';
import type { TensorType } from '../../ir/types.js';
import type { VizGraph, VizNode } from '../model.js';
import { communicates } from './group.js';
import { partOf } from './part.js';

/** the id of the IR after `pass` among a plan's graphs (beside its programs' ids) */
export const irId = (pass: string): string => `ir:${pass}`;

/** the passes whose IR a plan directory keeps, in pass order: file names `NN-<pass>.json` */
export function savedPasses(dir: string): { pass: string; file: string }[] {
  let names: string[];
  try {
    names = readdirSync(join(dir, 'ir'));
  } catch {
    return [];
  }
  return names
    .filter((n) => /^\d+-.+\.json$/.test(n))
    .sort()
    .map((n) => ({
      pass: n.replace(/^\d+-/, '').replace(/\.json$/, ''),
      file: join(dir, 'ir', n),
    }));
}

export function readSavedIr(file: string): Graph {
  try {
    return graphFromJSON(readFileSync(file, 'utf8'));
  } catch (e) {
    throw new UserError(`${file}: ${(e as Error).message.split('\n')[0]}`);
  }
}

export function irGraph(g: Graph, pass: string): VizGraph {
  const expected = new Map(g.symbols.map((s) => [s.name, s.expected ?? s.bound]));
  const size = (s: string) => expected.get(s) ?? 0;
  const bytesOf = (t: TensorType) => numel(t.shape, size) * DTYPE_BYTES[t.dtype];
  const types = new Map<string, TensorType>();
  for (const v of [...g.inputs, ...g.params]) types.set(v.name, v.type);
  const producer = new Map<string, number>();
  const edges = new Map<number, [number, number, number]>();
  const nodes = g.nodes.map((n, i): VizNode => {
    for (const o of n.outputs) types.set(o.name, o.type);
    const ins = n.inputs.map((v) => types.get(v)!);
    const outs = n.outputs.map((o) => o.type);
    n.inputs.forEach((v, k) => {
      const from = producer.get(v);
      if (from === undefined) return; // a data input or a parameter
      const key = from * g.nodes.length + i;
      const e = edges.get(key) ?? [from, i, 0];
      e[2] += bytesOf(ins[k]);
      edges.set(key, e);
    });
    for (const o of n.outputs) producer.set(o.name, i);
    const group = n.attrs.group;
    return {
      op: n.op,
      scope: n.scope,
      phase: n.phase,
      stream: 'ir',
      count: 1,
      stage: -1,
      part: partOf(n),
      ...(communicates(n.op)
        ? {
            collective: {
              group: typeof group === 'string' ? group : 'world',
              ranks: [],
              ...(typeof n.attrs.root === 'number' ? { root: n.attrs.root } : {}),
              ...(typeof n.attrs.peer === 'number' ? { peer: n.attrs.peer } : {}),
            },
          }
        : {}),
      shapes: outs.map((t) => t.shape.map(formatDim)),
      dtypes: outs.map((t) => t.dtype),
      flops: nodeFlops(n.op, ins, outs, n.attrs, size),
      bytes: [...ins, ...outs].reduce((a, t) => a + bytesOf(t), 0),
    };
  });
  return { program: irId(pass), nodes, edges: [...edges.values()] };
}
