// One rank of bench/overlap, as its own process:
//   node --import tsx bench/overlap-rank.ts PLAN_DIR RANK WORLD STORE STEPS
// It trains the plan's steps as that rank (runtime/train.ts, the runtime's per-instruction timing
// on) and prints, per step, its step time and the busy time of all_to_all_v per stream, as JSON
// on stdout. With LFC_BENCH_TRACE=PREFIX it also writes the last step's every instruction (start,
// end, op, stream, scope, microbatch, phase) to PREFIX.rank<r>.json.

import { writeFileSync } from 'node:fs';
import { readPlan } from '../runtime/plan-io.js';
import { train } from '../runtime/train.js';

export interface OverlapRankStep {
  readonly stepMs: number;
  /** Σ all_to_all_v durations (ms) per stream */
  readonly a2aMs: Readonly<Record<string, number>>;
  readonly a2aCount: number;
}

const [planDir, rankText, worldText, store, stepsText] = process.argv.slice(2);
const rank = Number(rankText);
const loaded = readPlan(planDir);
const instructions = loaded.programs.get(loaded.plan.rankPrograms[rank])!.instructions;
const perStep: OverlapRankStep[] = [];
const timings = new Map<number, OverlapRankStep['a2aMs']>();
const counts = new Map<number, number>();
await train({
  planDir,
  trainIters: Number(stepsText),
  threads: 1,
  rank: {
    rank,
    worldSize: Number(worldText),
    localRank: rank,
    store,
    prefix: 'bench-overlap',
    host: '127.0.0.1',
    timeoutMs: 300_000,
    hostsStore: false,
    launched: false,
  },
  onTiming: (step, t) => {
    const byStream: Record<string, number> = {};
    let n = 0;
    t!.forEach(({ start, end }, i) => {
      const ins = instructions[i];
      if (ins.op !== 'all_to_all_v') return;
      byStream[ins.stream] = (byStream[ins.stream] ?? 0) + (end - start);
      n++;
    });
    timings.set(step, byStream);
    counts.set(step, n);
    if (process.env.LFC_BENCH_TRACE && step === Number(stepsText))
      writeFileSync(
        `${process.env.LFC_BENCH_TRACE}.rank${rank}.json`,
        JSON.stringify(
          t!.map((x, i) => ({
            ...x,
            op: instructions[i].op,
            stream: instructions[i].stream,
            scope: instructions[i].scope,
            mb: instructions[i].microbatch,
            phase: instructions[i].phase,
          })),
        ),
      );
  },
  onStep: (m) =>
    perStep.push({ stepMs: m.stepMs, a2aMs: timings.get(m.step)!, a2aCount: counts.get(m.step)! }),
});
process.stdout.write(JSON.stringify(perStep) + '\n');
