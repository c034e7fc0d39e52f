// The simulator's shared cores (compiler/sim/simulate.ts, runOnSharedCores): a CPU profile's
// gpus_per_node is the cores of a node, and ranks beyond them share the cores. Checked against
// what processor sharing must give, independently of the iteration that finds it:
//   - ranks that run alike the whole step (dp) on C cores, R = 2C ranks: every instruction runs
//     with all R at once, so each takes at least R / C = 2 times as long (more while a rank's two
//     streams run together), and the step about twice the unshared
//   - two pipeline stages on one core: that core runs both ranks' kernels, so the step is at least
//     the sum of their compute-stream kernel times, and at most twice the unshared step (every
//     instruction slowed at most 2×)
//   - ranks within the cores, or a GPU profile: the plain replay's step, to the bit

import { describe, expect, it } from 'vitest';
import { compile, type CompileOptions } from '../../compiler/pipeline.js';
import { loadHardware, type HardwareProfile } from '../../compiler/sim/hardware.js';
import { simulatePlan } from '../../compiler/sim/simulate.js';

const gpu = loadHardware('h800');
/** a profile like lfc calibrate's of a small machine: kernels, not latencies, make the step */
const cpuWith = (cores: number): HardwareProfile => ({
  ...gpu,
  host: undefined, // lfc calibrate's profile: the host is its kernels' launch
  runtime: 'cpu',
  gpusPerNode: cores,
  compute: {
    ...gpu.compute,
    matmulTflops: 0.05,
    matmulEfficiency: 1,
    matmulHalfGflop: 0.001,
    memoryGbps: 8,
    memoryEfficiency: 1,
    launchUs: 10,
    dtypeBytes: 4,
    gradDtypeBytes: 4,
  },
  links: {
    intraNode: { gbps: 4, latencyUs: 20 },
    interNode: { gbps: 4, latencyUs: 20 },
    host: { gbps: 8, latencyUs: 10 },
  },
});

function planOf(options: Partial<CompileOptions>) {
  const { plan, programs } = compile({ model: 'tiny-vlm-moe', ...options });
  return { plan, programs: new Map(programs.map((p) => [p.id, p])) };
}

describe('ranks sharing cores', () => {
  it('4 dp ranks on 2 cores: every instruction twice as long, the step twice the unshared', () => {
    const { plan, programs } = planOf({ nprocPerNode: 4, globalBatchSize: 8 });
    const own = simulatePlan(plan, programs, cpuWith(4)).stepSeconds;
    const shared = simulatePlan(plan, programs, cpuWith(2)).stepSeconds;
    // at least 2: whenever an instruction runs, so do the other ranks' copies of it; a little
    // more where a rank's two streams run at once (its gradient all-reduce beside its backward)
    expect(shared / own).toBeGreaterThanOrEqual(2 * (1 - 1e-9));
    expect(shared / own).toBeLessThan(2.1);
  });

  it('pp 2 on one core: at least both ranks’ work, at most twice the unshared step', () => {
    const { plan, programs } = planOf({ nprocPerNode: 2, parallel: { pp: 2 }, globalBatchSize: 8 });
    const own = simulatePlan(plan, programs, cpuWith(2));
    const shared = simulatePlan(plan, programs, cpuWith(1)).stepSeconds;
    // one core runs every kernel of both ranks: at least their compute-stream kernel time
    const kernels = own.ranks.reduce((a, r) => a + r.computeBusy, 0);
    expect(shared).toBeGreaterThanOrEqual(kernels * 0.999);
    expect(shared).toBeGreaterThan(own.stepSeconds * 1.2);
    expect(shared).toBeLessThanOrEqual(own.stepSeconds * 2 * 1.001);
  });

  it('ranks within the cores, or on a GPU profile: the plain replay', () => {
    const { plan, programs } = planOf({ nprocPerNode: 2, parallel: { pp: 2 }, globalBatchSize: 8 });
    const plain = cpuWith(2);
    expect(simulatePlan(plan, programs, plain).stepSeconds).toBe(
      simulatePlan(plan, programs, { ...plain, runtime: 'gpu' }).stepSeconds,
    );
    const dp = planOf({ nprocPerNode: 4, globalBatchSize: 8 });
    expect(simulatePlan(dp.plan, dp.programs, { ...gpu, gpusPerNode: 2 }).stepSeconds).toBe(
      simulatePlan(dp.plan, dp.programs, gpu).stepSeconds,
    );
  });
});

// --moe-expected-imbalance f prices every rank of an expert-parallel group at the busiest rank's
// rows. Ranks sharing cores hand a waiting rank's core to the busy ones, so the group's expert
// work takes about max(its total over the cores, the busiest alone): balanced routing's time while
// f ≤ ranks / cores (the total is the larger), f · cores / ranks of it beyond.
describe('routing imbalance on shared cores', () => {
  const step = (f: number, cores: number) => {
    const { plan, programs } = planOf({
      nprocPerNode: 4,
      parallel: { ep: 2 },
      globalBatchSize: 8,
      moeExpectedImbalance: f,
    });
    return simulatePlan(plan, programs, cpuWith(cores)).stepSeconds;
  };

  it('f up to ranks / cores prices balanced routing; beyond, more; on own cores, every f', () => {
    // 4 ranks on 2 cores: f ≤ 2 (ep 2 can be no busier) is all balanced
    expect(step(1.8, 2)).toBe(step(1, 2));
    // on 3 cores: 1.2 · 3 / 4 < 1, balanced; 1.8 · 3 / 4 > 1, more
    expect(step(1.2, 3)).toBe(step(1, 3));
    expect(step(1.8, 3)).toBeGreaterThan(step(1, 3) * 1.001);
    // ranks on cores of their own wait for the busiest: f prices every rank
    expect(step(1.8, 4)).toBeGreaterThan(step(1, 4) * 1.001);
  });
});
