// Priced stage weights: what each pipeline piece (decoder layer, what sits before layer 0, what
// sits after the last) costs a rank per microbatch in seconds on a hardware profile, forward and
// backward, collectives included. The partition balances these when the compile has a profile
// (compiler/pipeline.ts); FLOPs alone miss that an MoE layer's time is mostly its expert
// exchange, which a FLOP-balanced split piles onto the stages with the most layers.
//
// Each node of the sharded, differentiated graph is priced as the simulator prices its
// instruction (compiler/sim/cost.ts): a kernel by its FLOPs, matmul shape and bytes, a collective
// by its bytes over its group as the group lies on the machines, taken for the first rank of the
// world (every stage's groups are shaped alike in the layouts lfc builds). Sizes are the
// symbols' expected ones, an expert dispatch without one at its bound over the group (balanced
// routing), as the cost model takes them. The optimizer phase is left out: it does not depend on
// the split.

import type { Graph } from '../../ir/graph.js';
import { valueTypes } from '../../ir/graph.js';
import { OP_TABLE, type MatmulShape, type OpInfo, type OpKind } from '../../ir/ops.js';
import { resolveShape } from '../../ir/shape.js';
import type { Attrs, TensorType } from '../../ir/types.js';
import type { GroupKind, Topology } from '../parallel/topology.js';
import {
  elementBytes,
  flexTopKOf,
  groupCollectiveSeconds,
  isMixed,
  kernelSeconds,
  type GroupShape,
} from '../sim/cost.js';
import type { HardwareProfile } from '../sim/hardware.js';
import { costSite } from './costs.js';

/** Seconds a rank spends per microbatch on each pipeline piece (forward and backward). */
export interface StageWeights {
  readonly layer: readonly number[];
  /** embedding and merge_visual */
  readonly embed: number;
  /** the encoder and projector, as a stage-0 rank runs them per microbatch */
  readonly encoder: number;
  /** final norm, lm_head and loss */
  readonly post: number;
}

export interface PricingContext {
  readonly hardware: HardwareProfile;
  readonly topology: Topology;
  readonly nprocPerNode: number;
  /** the encoder's share of a microbatch a stage-0 rank runs (1/tp under hetero DP) */
  readonly encoderShare: number;
}

/** What one graph node computes or moves at the sizes it was read at (graphWork). */
export interface NodeWork {
  /** its index in the graph's nodes */
  readonly node: number;
  readonly category: OpInfo['category'];
  readonly op: OpKind;
  /** a collective's group kind */
  readonly group?: string;
  /** an expert exchange of the flex dispatcher: its router's k, else 0 (cost.ts flexTopKOf) */
  readonly flexTopK?: number;
  /** compute: bytes read and written; collective: the larger of sent and received; memory: read */
  readonly bytes: number;
  readonly flops: number;
  readonly matmul?: MatmulShape;
}

/**
 * The symbol sizes the cost model takes (the simulator's, compiler/sim/cost.ts expectedSizes): each
 * symbol's expected size, an expert dispatch without one at its bound over the group.
 */
export function expectedGraphSizes(g: Graph): (sym: string) => number {
  const expected = new Map(g.symbols.map((s) => [s.name, s.expected ?? s.bound]));
  const stated = new Set(g.symbols.filter((s) => s.expected !== undefined).map((s) => s.name));
  for (const n of g.nodes) {
    if (n.op !== 'all_to_all_v') continue;
    const rows = (n.attrs.out_rows as string[] | undefined)?.[0];
    const P = n.attrs.group_size as number | undefined;
    const bound = g.symbols.find((s) => s.name === rows)?.bound;
    if (rows !== undefined && !stated.has(rows) && bound !== undefined && P)
      expected.set(rows, Math.ceil(bound / P));
  }
  return (sym) => expected.get(sym) ?? 0;
}

/**
 * Bytes of one element of a graph whose values have `types`, as the profile prices it: in an f32
 * graph (the CPU runtime's precision, standing for the GPU's) f32 at the profile's compute dtype
 * size; in a mixed-precision graph (cost.ts isMixed) f32 at 4 bytes.
 */
export function elementBytesOn(
  hw: HardwareProfile,
  types: Iterable<TensorType>,
): (t: TensorType) => number {
  const f32 = isMixed(types) ? 4 : hw.compute.dtypeBytes;
  return (t) => elementBytes(t.dtype, f32);
}

/** Every node's work at `size` (reshapes, which move nothing, left out). */
export function graphWork(
  g: Graph,
  size: (sym: string) => number,
  elementBytes: (t: TensorType) => number,
): NodeWork[] {
  const types = valueTypes(g);
  const out: NodeWork[] = [];
  g.nodes.forEach((n, node) => {
    if (n.op === 'reshape') return;
    const info: OpInfo = OP_TABLE[n.op as OpKind];
    const ins = n.inputs.map((i) => types.get(i)!);
    const outs = n.outputs.map((o) => o.type);
    const dims = (ts: readonly TensorType[]) => ts.map((t) => resolveShape(t.shape, size));
    const bytes = (ts: readonly TensorType[]) =>
      ts.reduce(
        (a, t) => a + resolveShape(t.shape, size).reduce((p, d) => p * d, 1) * elementBytes(t),
        0,
      );
    const common = { node, category: info.category, op: n.op as OpKind };
    if (info.category === 'collective')
      out.push({
        ...common,
        group: String(n.attrs.group),
        bytes: Math.max(bytes(ins), bytes(outs)),
        flops: 0,
        flexTopK: flexTopKOf(n.attrs),
      });
    else if (info.category === 'memory') out.push({ ...common, bytes: bytes(ins), flops: 0 });
    else {
      const args = { inputs: dims(ins), outputs: dims(outs), attrs: n.attrs as Attrs };
      const flops = info.flops(args);
      const matmul = flops > 0 ? info.matmul?.(args) : undefined;
      out.push({
        ...common,
        bytes: bytes(ins) + bytes(outs),
        flops,
        ...(matmul ? { matmul } : {}),
      });
    }
  });
  return out;
}

/** One node's seconds as the simulator prices its instruction; `shape`: a collective's group. */
export function workSeconds(w: NodeWork, hw: HardwareProfile, shape?: GroupShape): number {
  if (w.category === 'collective')
    return groupCollectiveSeconds(
      w.op,
      shape!,
      w.bytes,
      hw.links,
      hw.efficiency?.allToAll,
      w.flexTopK,
    );
  if (w.category === 'memory') {
    const link = hw.links.host;
    return link.latencyUs * 1e-6 + w.bytes / (link.gbps * 1e9);
  }
  return kernelSeconds(w.flops, w.bytes, hw, w.matmul);
}

/** How the group of `kind` holding rank 0 lies on the machines. */
export function groupShapes(
  topology: Topology,
  nprocPerNode: number,
): (kind: string) => GroupShape {
  const node = (r: number) => Math.floor(r / nprocPerNode);
  const shapes = new Map<string, GroupShape>();
  return (kind) => {
    let s = shapes.get(kind);
    if (s === undefined) {
      const group = topology.groupOf(kind as Exclude<GroupKind, 'embd'>, 0);
      const ranks = group?.ranks ?? [0];
      s = {
        size: ranks.length,
        nodes: new Set(ranks.map(node)).size,
        local: ranks.filter((r) => node(r) === node(0)).length,
      };
      shapes.set(kind, s);
    }
    return s;
  };
}

/** The graph's pieces priced on the profile (the header's model). */
export function pricedStageWeights(g: Graph, ctx: PricingContext): StageWeights {
  const { hardware: hw } = ctx;
  const shapeOf = groupShapes(ctx.topology, ctx.nprocPerNode);
  const layer: number[] = [];
  let embed = 0;
  let encoder = 0;
  let post = 0;
  const bytes = elementBytesOn(hw, valueTypes(g).values());
  for (const w of graphWork(g, expectedGraphSizes(g), bytes)) {
    const n = g.nodes[w.node];
    if (n.phase === 'optimizer' || n.op === 'send' || n.op === 'recv') continue;
    const seconds = workSeconds(w, hw, w.group === undefined ? undefined : shapeOf(w.group));
    const site = costSite(n.scope);
    if (site === 'embed') embed += seconds;
    else if (site === 'encoder') encoder += seconds;
    else if (site === 'post') post += seconds;
    else layer[site.layer] = (layer[site.layer] ?? 0) + seconds;
  }
  for (let i = 0; i < layer.length; i++) layer[i] ??= 0;
  return { layer, embed, encoder: encoder * ctx.encoderShare, post };
}
