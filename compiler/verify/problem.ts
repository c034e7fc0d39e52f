// What the plan verifier reports: one problem names its rule, the ranks it concerns, and the
// instruction (program, index, stream, op, module scope) where it shows.

import type { StreamName } from '../plan/format.js';

/**
 * structure         the plan and programs are well formed: every rank has a program, ids in
 *                   range, known ops and streams, dims over declared symbols
 * collective-match  every member of a group issues the same collectives on it, in the same order,
 *                   with the same kind, root and static sizes, from one stream; group_size is the
 *                   group's size; the group (a name, or a kind resolved per rank through
 *                   plan.rankGroups) exists and holds the rank
 * p2p-match         every send has exactly one recv of the same dtype and shape, and vice versa
 * event-order       every event is recorded exactly once; every read of bytes another stream wrote,
 *                   and every write over bytes another stream read or wrote, is ordered after that
 *                   access by program order and record → wait edges
 * progress          all ranks together finish the step: no deadlock
 */
export const PLAN_RULES = [
  'structure',
  'collective-match',
  'p2p-match',
  'event-order',
  'progress',
] as const;
export type PlanRule = (typeof PLAN_RULES)[number];

export interface PlanProblem {
  readonly rule: PlanRule;
  /** the ranks it concerns: for a fault of a shared program, every rank that runs it */
  readonly ranks: readonly number[];
  /** program id ('' when the problem is in plan.json) */
  readonly program: string;
  /** instruction index in the program, -1 when the problem is not at one instruction */
  readonly instruction: number;
  readonly stream: StreamName | '';
  readonly op: string;
  readonly scope: string;
  readonly message: string;
}

export function formatRanks(ranks: readonly number[], max = 8): string {
  if (ranks.length === 0) return 'no rank';
  const shown = ranks.slice(0, max).join(', ');
  const more = ranks.length > max ? `, … (${ranks.length} ranks)` : '';
  return `${ranks.length === 1 ? 'rank' : 'ranks'} ${shown}${more}`;
}

export function formatPlanProblem(p: PlanProblem): string {
  const where = p.program ? ` program ${p.program}` : '';
  const at =
    p.instruction >= 0
      ? ` instruction ${p.instruction} (${p.op} on ${p.stream}${p.scope ? ` in ${p.scope}` : ''})`
      : '';
  return `[${p.rule}] ${formatRanks(p.ranks)}${where}${at}: ${p.message}`;
}
