// The group a collective or p2p instruction names, as one rank sees it: its `group` attribute is
// a plan group by name (`enc.mp[0]`) or a kind of plan.rankGroups (`tp`), resolved per rank.

import type { PlanFile, PlanInstruction } from '../../compiler/plan/format.js';
import { OP_TABLE, type OpKind } from '../../ir/ops.js';
import type { VizNode } from '../model.js';

/** the op table's collectives (send and recv among them) */
export const communicates = (op: string): boolean =>
  OP_TABLE[op as OpKind]?.category === 'collective';

export function collectiveOf(
  plan: PlanFile,
  rank: number,
  x: PlanInstruction,
): VizNode['collective'] | undefined {
  if (!communicates(x.op)) return undefined;
  const named = typeof x.attrs.group === 'string' ? x.attrs.group : undefined;
  const byKind = named !== undefined ? plan.rankGroups[named]?.[rank] : undefined;
  const group =
    byKind !== undefined ? plan.groups[byKind] : plan.groups.find((g) => g.name === named);
  // the plan names a group once, by the first kind that has its ranks: an mp group that is a tp
  // group is `tp[0]`; the label keeps the kind the instruction asked for (`mp=tp[0]`)
  const name = group?.name ?? named ?? 'world';
  const label = byKind !== undefined && !name.startsWith(`${named}[`) ? `${named}=${name}` : name;
  const out: { group: string; ranks: readonly number[]; root?: number; peer?: number } = {
    group: label,
    ranks: group?.ranks ?? [],
  };
  if (typeof x.attrs.root === 'number') out.root = x.attrs.root;
  if (typeof x.attrs.peer === 'number') out.peer = x.attrs.peer;
  return out;
}
