// The routing imbalance an expert-parallel layout will see, measured before it runs: a one-rank
// plan of the same model and global batch trains the steps the layout's run will, on the same
// synthetic data, in this process (runtime/one-rank.ts; the layouts route alike:
// test/multirank/equivalence.test.ts), and every forward moe_permute's per-expert counts are
// read after each step. For an expert-parallel group of `ep` ranks, each holding E/ep experts,
// the global microbatches a group routes together at one all-to-all are those runtime/train.ts
// gives its data-parallel ranks at the same local index (d·m + j, d < ep); a rank receives the
// rows routed to its experts. The figure is the mean, over steps, layers and local microbatches,
// of the busiest rank's rows over the group's mean: what --moe-expected-imbalance takes, so that
// the simulator prices each rank's dispatch at the rank the others wait for.

import { stepOneRank } from '../runtime/one-rank.js';
import { readPlan } from '../runtime/plan-io.js';

/**
 * The mean busiest-rank imbalance of `ep`-way expert parallelism over steps `from`…`to` (the
 * router drifts as it trains: on the bench's model at 8 microbatches and ep 2, 1.25 at step 1 and
 * 1.35 over steps 1-3).
 */
export async function measuredImbalance(
  onePlanDir: string,
  ep: number,
  from: number,
  to: number,
  seed = 1234,
): Promise<number> {
  const M = readPlan(onePlanDir).plan.training.numMicrobatches;
  if (M % ep) throw new Error(`${M} microbatches do not split over ${ep} ranks`);
  const m = M / ep;
  // per step and layer (scope): each global microbatch's rows per expert
  const counts = new Map<string, Int32Array[]>();
  await stepOneRank(
    onePlanDir,
    to,
    seed,
    (x) => (x.op === 'moe_permute' && x.phase === 'forward' ? [x.outputs[1]] : []),
    (rt, x, step) => {
      if (step < from) return;
      const key = `${step}|${x.scope}`;
      const per = counts.get(key) ?? [];
      per[x.microbatch] = new Int32Array(rt.readBuffer(x.outputs[1]));
      counts.set(key, per);
    },
  );
  if (!counts.size) throw new Error(`${onePlanDir}: no moe_permute to measure routing with`);
  const ratios: number[] = [];
  for (const per of counts.values())
    for (let j = 0; j < m; j++) {
      const E = per[j].length;
      const loads = Array<number>(ep).fill(0);
      for (let d = 0; d < ep; d++)
        per[d * m + j].forEach((rows, e) => (loads[Math.floor((e * ep) / E)] += rows));
      const mean = loads.reduce((a, b) => a + b, 0) / ep;
      if (mean > 0) ratios.push(Math.max(...loads) / mean);
    }
  return ratios.reduce((a, b) => a + b, 0) / ratios.length;
}
