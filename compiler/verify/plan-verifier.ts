// The plan verifier: proves that the per-rank programs of a plan fit together before any rank
// runs them. The rules, in order (compiler/verify/problem.ts describes each):
//   structure         found while indexing the plan (plan-index.ts)
//   collective-match  check-collectives.ts
//   p2p-match         check-p2p.ts
//   event-order       check-events.ts
//   progress          check-progress.ts: a symbolic execution of all ranks together
// Ranks that share a program id share one index, so the cost is per distinct program except for
// the send/recv pairing and the simulation, which are linear in the instructions of all ranks.

import type { PlanFile, ProgramFile } from '../plan/format.js';
import { checkCollectives } from './check-collectives.js';
import { checkEvents } from './check-events.js';
import { checkP2p } from './check-p2p.js';
import { simulateStep } from './check-progress.js';
import { buildPlanIndex, type PlanIndex } from './plan-index.js';
import { formatPlanProblem, type PlanProblem, type PlanRule } from './problem.js';

export { formatPlanProblem, PLAN_RULES, type PlanProblem, type PlanRule } from './problem.js';

export interface PlanVerifyStats {
  readonly ranks: number;
  readonly programs: number;
  /** instructions of all ranks together */
  readonly instructions: number;
  /** instructions the simulation completed */
  readonly simulated: number;
  readonly p2pPairs: number;
  /** communicators: distinct rank lists of plan.groups */
  readonly communicators: number;
  /** wall time per stage: the index (which finds the structure problems), then each rule */
  readonly ms: Readonly<Record<'index' | Exclude<PlanRule, 'structure'>, number>>;
}

export interface PlanVerification {
  readonly problems: PlanProblem[];
  readonly stats: PlanVerifyStats;
  /** the plan's index the rules read (the simulator can replay on it: simulate.ts replaySetup) */
  readonly index: PlanIndex;
}

const RULES: readonly {
  readonly rule: Exclude<PlanRule, 'structure' | 'progress'>;
  readonly check: (ix: PlanIndex) => PlanProblem[];
}[] = [
  { rule: 'collective-match', check: checkCollectives },
  { rule: 'p2p-match', check: checkP2p },
  { rule: 'event-order', check: checkEvents },
];

/** Every rule over the plan; problems in rule order, with statistics. */
export function analyzePlan(
  plan: PlanFile,
  programs: ReadonlyMap<string, ProgramFile>,
): PlanVerification {
  let t = performance.now();
  const lap = () => {
    const now = performance.now();
    const ms = now - t;
    t = now;
    return ms;
  };
  const ix = buildPlanIndex(plan, programs);
  const ms: Record<'index' | Exclude<PlanRule, 'structure'>, number> = {
    index: lap(),
    'collective-match': 0,
    'p2p-match': 0,
    'event-order': 0,
    progress: 0,
  };
  const problems = [...ix.problems];
  for (const { rule, check } of RULES) {
    problems.push(...check(ix));
    ms[rule] = lap();
  }
  const sim = simulateStep(ix);
  problems.push(...sim.problems);
  ms.progress = lap();
  return {
    problems,
    index: ix,
    stats: {
      ranks: ix.world,
      programs: ix.programs.length,
      instructions: sim.total,
      simulated: sim.completed,
      p2pPairs: ix.pairs.count,
      communicators: ix.comms.length,
      ms,
    },
  };
}

/** The problems of a plan: empty when its programs fit together and the step finishes. */
export function verifyPlan(
  plan: PlanFile,
  programs: ReadonlyMap<string, ProgramFile>,
): PlanProblem[] {
  return analyzePlan(plan, programs).problems;
}

export class PlanVerifyError extends Error {
  override readonly name = 'PlanVerifyError';
  constructor(
    readonly problems: readonly PlanProblem[],
    shown = 5,
  ) {
    const more = problems.length > shown ? `\n… and ${problems.length - shown} more` : '';
    super(
      `plan verification found ${problems.length} problem${problems.length === 1 ? '' : 's'}:\n` +
        problems.slice(0, shown).map(formatPlanProblem).join('\n') +
        more,
    );
  }
}

/** Throws PlanVerifyError naming the first few problems; else the plan's index. */
export function assertPlanValid(
  plan: PlanFile,
  programs: ReadonlyMap<string, ProgramFile>,
  shown = 5,
): PlanIndex {
  const { problems, index } = analyzePlan(plan, programs);
  if (problems.length) throw new PlanVerifyError(problems, shown);
  return index;
}
