// A combined forward-backward step (--overlap-moe-expert-parallel-comm), part of lowering.
//
// A pass's nodes, cut at its expert all-to-alls: compute segments and comm units alternate,
// starting with a compute segment. A unit is one all_to_all_v, or the counts exchange, the
// per-rank counts and the rows (a dispatch). Megatron's combined 1F1B (reference/anchors.md),
// layer by layer of the paired forward F and backward B, the units on the comm stream:
//   B's compute up to its combine       | (comm idle or the last unit)
//   F's compute up to its dispatch      | B combine
//   B's experts (dgrad)                 | F dispatch
//   B's experts' weight gradients       | B dispatch (with --delay-wgrad-compute)
//   F's experts                         |
//   B's router, attention …             | F combine
// Each unit waits for the compute issued before it and its consumer waits for it; the bytes it
// reads or writes stay allocated until that wait.

import type { Node } from '../../ir/graph.js';
import type { Lowering } from './lower.js';
import { passKey, type PassRef } from './schedule.js';

/** a pass's nodes cut at its all-to-alls: [compute, unit, compute, unit, …, compute] */
function pieces(nodes: readonly Node[]): Node[][] {
  const out: Node[][] = [[]];
  for (let i = 0; i < nodes.length; i++) {
    if (nodes[i].op !== 'all_to_all_v') {
      out[out.length - 1].push(nodes[i]);
      continue;
    }
    const unit = [nodes[i]];
    if (nodes[i + 1]?.op === 'moe_rank_counts' && nodes[i + 2]?.op === 'all_to_all_v')
      unit.push(nodes[++i], nodes[++i]);
    out.push(unit, []);
  }
  return out;
}

/**
 * A segment's nodes in two lists: now, and the weight gradients delayed past the next unit, with
 * what reads them (their accumulations).
 */
function splitDelayed(nodes: readonly Node[], delay: boolean): [Node[], Node[]] {
  if (!delay) return [[...nodes], []];
  const late = new Set<string>();
  const now: Node[] = [];
  const later: Node[] = [];
  for (const n of nodes) {
    const delayed = /_wgrad(_accumulate)?$/.test(n.op) || n.inputs.some((v) => late.has(v));
    if (delayed) n.outputs.forEach((o) => late.add(o.name));
    (delayed ? later : now).push(n);
  }
  return [now, later];
}

/** Lowers the forward pass f and the backward pass b interleaved (see the header). */
export function emitCombined(lo: Lowering, f: PassRef, b: PassRef): void {
  const fp = pieces(lo.s.passNodes.get(passKey(f.chunk, f.phase)) ?? []);
  const bp = pieces(lo.s.passNodes.get(passKey(b.chunk, b.phase)) ?? []);
  const pending = new Map<Node[], number>(); // unit → its completion event
  const compute = (nodes: readonly Node[], x: PassRef) => lo.runNodes(nodes, x.mb, lo.locals[x.mb]);
  const issue = (unit: Node[], x: PassRef) => {
    let wait = lo.lastCompute >= 0 ? [lo.b.record(lo.lastCompute)] : [];
    let last = -1;
    for (const n of unit) {
      last = lo.nodes.node(n, x.mb, lo.locals[x.mb], wait, 'comm');
      wait = [];
    }
    const e = lo.b.record(last);
    const touched = unit.flatMap((n) =>
      [...n.inputs, ...n.outputs.map((o) => o.name)].map(
        (v) => lo.locals[x.mb].get(v) ?? lo.global.get(v)!,
      ),
    );
    lo.keepUntilWait.set(e, touched);
    pending.set(unit, e);
  };
  /** the compute segment after unit k of a pass waits for that unit */
  const awaitUnit = (list: Node[][], k: number) => {
    const e = pending.get(list[k]);
    if (e === undefined) return;
    lo.computeWait.push(e);
    pending.delete(list[k]);
  };
  const delay = lo.opts.delayWgrad === true;
  let fi = 0; // next F compute segment (even index)
  let bi = 0;
  while (fi < fp.length || bi < bp.length) {
    // B up to its next unit (its combine), then that unit on comm
    if (bi < bp.length) {
      if (bi > 0) awaitUnit(bp, bi - 1);
      compute(bp[bi], b);
      if (bi + 1 < bp.length) issue(bp[bi + 1], b);
    }
    // F up to its next unit (its dispatch) while B's unit runs, then F's unit
    if (fi < fp.length) {
      if (fi > 0) awaitUnit(fp, fi - 1);
      compute(fp[fi], f);
      if (fi + 1 < fp.length) issue(fp[fi + 1], f);
    }
    // B's experts while F's dispatch runs; their weight gradients after B's next unit is issued
    if (bi + 2 < bp.length) {
      awaitUnit(bp, bi + 1);
      const [now, later] = splitDelayed(bp[bi + 2], delay);
      compute(now, b);
      if (bi + 3 < bp.length) issue(bp[bi + 3], b);
      compute(later, b);
      bi += 4;
    } else bi = bp.length;
    // F's experts while B's dispatch runs, then F's combine
    if (fi + 2 < fp.length) {
      awaitUnit(fp, fi + 1);
      compute(fp[fi + 2], f);
      if (fi + 3 < fp.length) issue(fp[fi + 3], f);
      fi += 4;
    } else fi = fp.length;
  }
  // the last units' consumers are in later steps: whatever computes next waits for them
  lo.computeWait.push(...pending.values());
}
