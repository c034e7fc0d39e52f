// The cheaper model of lfc tune (compiler/tune/estimate.ts) against the compiler and simulator
// it stands in for: on a spread of layouts of two small MoE presets (one with deepstack taps, so
// that the reduced model keeps distinct first layers), the estimated step and memory lie near the
// priced ones, and the estimate orders the layouts as the simulator does: on the GPU's side alone,
// and with the framework's host as the GPU profiles price it.
import { describe, expect, it } from 'vitest';
import { parseCompileArgs } from '../../cli/compile.js';
import { loadModelConfig } from '../../compiler/frontend/config.js';
import { resolvePrecision } from '../../compiler/frontend/precision.js';
import { compile } from '../../compiler/pipeline.js';
import { deviceMemoryOf, memoryByProgram } from '../../compiler/report/memory.js';
import { loadHardware } from '../../compiler/sim/hardware.js';
import { forecastStep } from '../../compiler/sim/report.js';
import { Estimator } from '../../compiler/tune/estimate.js';
import { ESTIMATE_MEMORY_MARGIN, ESTIMATE_SLACK } from '../../compiler/tune/search.js';
import { enumerateLayouts, flagsOf, layoutName } from '../../compiler/tune/space.js';

/** Spearman's rank correlation (no ties expected) */
function spearman(a: readonly number[], b: readonly number[]): number {
  const rank = (x: readonly number[]) => {
    const r: number[] = [];
    [...x.keys()].sort((i, j) => x[i] - x[j]).forEach((i, k) => (r[i] = k));
    return r;
  };
  const ra = rank(a);
  const rb = rank(b);
  const n = a.length;
  const d2 = ra.reduce((s, v, i) => s + (v - rb[i]) ** 2, 0);
  return 1 - (6 * d2) / (n * (n * n - 1));
}

const h800 = loadHardware('h800');
/**
 * How far below the simulated step the estimate may fall. On the GPU alone, the search's slack.
 * Where the framework's host binds (these presets on a GPU profile), the estimate counts the rank
 * graph's nodes, and the plan holds more instructions (recompute, copies, gradient buckets) for
 * the host to issue: measured 0.85–1.05 of the simulated step, 0.8 allowed, the side on which it
 * cannot prune a layout that wins (search.ts).
 */
const BELOW = { gpu: 1 - ESTIMATE_SLACK, host: 0.8 };

describe.each([
  ['tiny-vlm-moe', 8, 'the GPU alone', { ...h800, host: undefined }, BELOW.gpu],
  ['qwen3-vl-moe-tiny', 8, 'the GPU alone', { ...h800, host: undefined }, BELOW.gpu],
  ['tiny-vlm-moe', 8, 'the host as h800 prices it', h800, BELOW.host],
  ['qwen3-vl-moe-tiny', 8, 'the host as h800 prices it', h800, BELOW.host],
] as const)('the estimate of %s on %i ranks, %s', (model, world, _, hw, below) => {
  it('lies near compile + simulate, and ranks layouts alike', () => {
    const base = [
      model,
      ...['--nnodes', '2', '--nproc-per-node', String(world / 2)],
      ...['--global-batch-size', '16', '--bf16', '--hardware', 'h800'],
    ];
    const config = loadModelConfig(model, []);
    const space = { config, nnodes: 2, nprocPerNode: world / 2, globalBatchSize: 16 };
    const all = enumerateLayouts(space);
    // every 23rd layout: a spread over every knob the space has
    const sample = all.filter((_, i) => i % 23 === 5);
    const estimator = new Estimator({
      space,
      hardware: hw,
      precision: resolvePrecision({ bf16: true }),
    });
    const rows: { name: string; step: [number, number]; bound: [number, number] }[] = [];
    for (const l of sample) {
      const options = parseCompileArgs([...base, ...flagsOf(l, 1)]).options;
      let r;
      try {
        r = compile({ ...options, skipVerify: true });
      } catch {
        continue; // refused by a layout rule: the tuner never estimates it
      }
      const e = estimator.estimate(l, options);
      const programs = new Map(r.programs.map((p) => [p.id, p]));
      const { forecast } = forecastStep(r.modelForwardFlops, r.plan, programs, hw);
      const peak = Math.max(
        ...memoryByProgram(r, deviceMemoryOf(hw)).map((m) => m.bound.deviceBytes),
      );
      rows.push({
        name: layoutName(l),
        step: [e.stepSeconds, forecast.stepSeconds],
        bound: [e.peakBound, peak],
      });
    }
    expect(rows.length).toBeGreaterThanOrEqual(40);
    for (const r of rows) {
      const step = r.step[0] / r.step[1];
      const bound = r.bound[0] / r.bound[1];
      // what the search's pruning rests on (compiler/tune/search.ts): the estimate understates
      // tokens/s (overstates the step) by less than ESTIMATE_SLACK, and overstates memory by less
      // than ESTIMATE_MEMORY_MARGIN; the other way, within the same bands
      expect(
        step,
        `${r.name}: step estimated ${r.step[0]} s, simulated ${r.step[1]} s`,
      ).toBeLessThan(1 / (1 - ESTIMATE_SLACK));
      expect(
        step,
        `${r.name}: step estimated ${r.step[0]} s, simulated ${r.step[1]} s`,
      ).toBeGreaterThan(below);
      expect(
        bound,
        `${r.name}: memory estimated ${r.bound[0]}, planned ${r.bound[1]}`,
      ).toBeLessThan(ESTIMATE_MEMORY_MARGIN);
      expect(
        bound,
        `${r.name}: memory estimated ${r.bound[0]}, planned ${r.bound[1]}`,
      ).toBeGreaterThan(0.65);
    }
    expect(
      spearman(
        rows.map((r) => r.step[0]),
        rows.map((r) => r.step[1]),
      ),
    ).toBeGreaterThan(0.98);
    expect(
      spearman(
        rows.map((r) => r.bound[0]),
        rows.map((r) => r.bound[1]),
      ),
    ).toBeGreaterThan(0.9);
  }, 120_000);
});

// The encoder's static memory from level 2 on: its distributed optimizer state is sharded over the
// ranks that encode (stage 0's tp·dp at level 2, every rank at level 3), and a level-2 rank holds
// the inputs of the slots it encodes only. Estimated as at level 1, these layouts came out 1.16–1.21
// of their plans, past the search's margin, where the tuner could skip a layout that fits.
it.each(['tp4 pp1 ep2 mbs1 L2 distopt', 'tp4 pp1 mbs1 L2 distopt', 'tp2 pp2 ep2 mbs1 L3 distopt'])(
  'qwen3-vl-moe-tiny %s: the estimated memory is within 5% of the plan',
  (name) => {
    const model = 'qwen3-vl-moe-tiny';
    const base = [model, '--nnodes', '2', '--nproc-per-node', '4', '--global-batch-size', '16'];
    const config = loadModelConfig(model, []);
    const space = { config, nnodes: 2, nprocPerNode: 4, globalBatchSize: 16 };
    const layout = enumerateLayouts(space).find((l) => layoutName(l) === name)!;
    const options = parseCompileArgs([
      ...base,
      '--bf16',
      '--hardware',
      'h800',
      ...flagsOf(layout, 1),
    ]).options;
    const estimator = new Estimator({
      space,
      hardware: h800,
      precision: resolvePrecision({ bf16: true }),
    });
    const e = estimator.estimate(layout, options);
    const memory = memoryByProgram(compile({ ...options, skipVerify: true }), deviceMemoryOf(h800));
    const bound = Math.max(...memory.map((m) => m.bound.deviceBytes));
    const expected = Math.max(...memory.map((m) => m.expected.deviceBytes));
    expect(e.peakBound / bound).toBeGreaterThan(0.95);
    expect(e.peakBound / bound).toBeLessThan(1.05);
    expect(e.peakExpected / expected).toBeGreaterThan(0.95);
    expect(e.peakExpected / expected).toBeLessThan(1.05);
  },
  60_000,
);
