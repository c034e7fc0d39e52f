// Pieces of whole tensors: which elements of a checkpoint tensor a rank's parameter holds, from
// the parameter's dist (ir/graph.ts ParamDist) and the rank's index in each of its groups.

import type { ParamDist } from '../ir/graph.js';
import type { PlanFile } from '../compiler/plan/format.js';

export interface ParamPiece {
  /** the whole tensor's checkpoint name (an expert's own index filled in) */
  readonly name: string;
  /** the whole tensor's shape */
  readonly shape: readonly number[];
  /** per dim, the global index of each local index */
  readonly index: readonly (readonly number[])[];
}

const range = (start: number, length: number) => Array.from({ length }, (_, i) => start + i);

export function pieceOf(dist: ParamDist, groupRank: (kind: string) => number): ParamPiece {
  const name = dist.expert
    ? dist.name.replace(
        '{}',
        String(groupRank(dist.expert.group) * dist.expert.perRank + dist.expert.local),
      )
    : dist.name;
  const index = dist.shape.map((n, d) => {
    const s = dist.split[d];
    if (!s) return range(0, n);
    const block = n / s.blocks;
    const piece = block / s.parts;
    const r = groupRank(s.group);
    return Array.from({ length: s.blocks }, (_, b) => range(b * block + r * piece, piece)).flat();
  });
  return { name, shape: dist.shape, index };
}

/** A rank's index in its group of each kind (plan.rankGroups). */
export function groupRanksOf(plan: PlanFile, rank: number): (kind: string) => number {
  return (kind) => {
    const groups = plan.rankGroups[kind];
    if (!groups) throw new Error(`plan.rankGroups has no kind '${kind}'`);
    return plan.groups[groups[rank]].ranks.indexOf(rank);
  };
}
