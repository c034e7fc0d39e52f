// lfc tune: its best layout against an exhaustive search written apart from it (flag
// combinations compiled one by one), its printed line compiled by `lfc compile` to the same
// figures, the time budget, and its user errors.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { parseCompileArgs } from '../../cli/compile.js';
import { compile, CompileStopped } from '../../compiler/pipeline.js';
import { UserError } from '../../compiler/errors.js';
import { deviceMemoryOf, fitsOn, memoryByProgram } from '../../compiler/report/memory.js';
import { loadHardware } from '../../compiler/sim/hardware.js';
import { forecastStep } from '../../compiler/sim/report.js';

import { cli, gpuSideProfile } from '../helpers.js';
import { LocalPricer } from '../../compiler/tune/search.js';
import { pricingRequestOf } from '../../cli/tune-pool.js';
import { projectRoot } from '../../compiler/paths.js';
import { layerParams, staticBytesLowerBound } from '../../compiler/tune/bounds.js';
import type { Layout } from '../../compiler/tune/space.js';
import { resolvePrecision } from '../../compiler/frontend/precision.js';

/** h800 without its host: the test's model is host-bound on a GPU, every layout alike */
const H800 = gpuSideProfile('h800');

// tiny-vlm-moe on 4 ranks of one node, the encoder at level 1 or 3, micro-batch 1 or 2, no
// recompute, no offload: a space small enough to price every point
const BASE = [
  'tiny-vlm-moe',
  '--nnodes',
  '1',
  '--nproc-per-node',
  '4',
  '--global-batch-size',
  '8',
  '--hardware',
  H800,
];
const SPACE = [
  ...['--fix', 'level=1|3', '--fix', 'encoder-tp=1', '--fix', 'mbs=1|2'],
  ...['--exclude', 'recompute', 'offload'],
];

/** lfc tune over the test's space, with `args` */
const tune = (...args: string[]) => cli('tune', ...BASE, ...SPACE, ...args);

interface TuneJson {
  layouts: {
    name: string;
    compileLine: string;
    fits: boolean;
    verified: boolean;
    forecast: { tokensPerSecond: number; stepSeconds: number };
    memory: { peakBoundBytes: number };
  }[];
  enumerated: number;
  estimated: number;
  priced: number;
  pastDevice: number;
  fitting: number;
  cannotFit: number;
  estimatedPastDevice: number;
  cannotWin: number;
  failed: { name: string; error: string }[];
  refused: number;
  unpriced: string[];
}

/** DIR/small.yaml: h800 with 11 MiB past its 6 GiB reserve, where the tiny presets do not fit */
function smallH800(dir: string): void {
  const profile = readFileSync(join(projectRoot(), 'configs/hardware/h800.yaml'), 'utf8')
    .replace(/^memory_gib: .*$/m, 'memory_gib: 6.011')
    .replace(/^name: .*$/m, 'name: h800-small');
  writeFileSync(join(dir, 'small.yaml'), profile);
}

const accounted = (j: TuneJson) =>
  j.cannotFit + j.refused + j.failed.length + j.estimatedPastDevice + j.cannotWin + j.priced;

/** the best tokens/s of every flag combination of the same space, each compiled here */
function exhaustiveBest(): { tokensPerSecond: number; flags: string[] } {
  const hw = loadHardware(H800);
  const device = deviceMemoryOf(hw);
  let best = { tokensPerSecond: -1, flags: [] as string[] };
  const compileArgs = BASE.filter((_, i) => i < 7); // without --hardware
  for (const tp of [1, 2, 4])
    for (const pp of [1, 2, 4])
      for (const vpp of pp > 1 ? [1, 2, 4] : [1])
        for (const ep of [1, 2, 4, 8])
          for (const etp of ep > 1 ? [1, 2, 4].filter((e) => e <= tp) : [tp])
            for (const mbs of [1, 2])
              for (const level of [[], ['--enable-full-hetero-dp']])
                for (const overlap of [
                  [],
                  ['--overlap-moe-expert-parallel-comm', '--delay-wgrad-compute'],
                ])
                  for (const distopt of [[], ['--use-distributed-optimizer']]) {
                    const flags = [
                      ...['--tp', `${tp}`, '--pp', `${pp}`, '--vpp', `${vpp}`, '--ep', `${ep}`],
                      ...(etp !== tp ? ['--expert-tensor-parallel-size', `${etp}`] : []),
                      ...(tp > 1 ? ['--sequence-parallel'] : []),
                      ...['--micro-batch-size', `${mbs}`],
                      ...level,
                      ...overlap,
                      ...distopt,
                    ];
                    let r;
                    try {
                      r = compile({
                        ...parseCompileArgs([...compileArgs, ...flags]).options,
                        skipVerify: true,
                      });
                    } catch (e) {
                      if (e instanceof UserError) continue;
                      throw e;
                    }
                    const peak = Math.max(
                      ...memoryByProgram(r, device).map((m) => m.bound.deviceBytes),
                    );
                    if (!fitsOn(peak, device)) continue;
                    const programs = new Map(r.programs.map((p) => [p.id, p]));
                    const { forecast } = forecastStep(r.modelForwardFlops, r.plan, programs, hw);
                    if (forecast.tokensPerSecond > best.tokensPerSecond)
                      best = { tokensPerSecond: forecast.tokensPerSecond, flags };
                  }
  return best;
}

describe('the static-memory bound', () => {
  // each layout's bound against its plan's weights, gradients and optimizer state on the busiest rank
  it.each([
    ['tiny-vlm-moe', ['--tp', '2', '--pp', '2', '--ep', '2', '--use-distributed-optimizer']],
    ['tiny-vlm-moe', ['--pp', '4', '--bf16']],
    ['qwen3-vl-moe-tiny', ['--tp', '2', '--ep', '4', '--bf16', '--use-distributed-optimizer']],
    ['qwen3-vl-moe-tiny', ['--ep', '2', '--pp', '2', '--bf16']],
    [
      'qwen3-vl-moe-tiny',
      [
        '--tp',
        '2',
        '--ep',
        '2',
        '--expert-tensor-parallel-size',
        '1',
        '--use-distributed-optimizer',
      ],
    ],
  ] as const)('%s %j: at most the plan', (model, flags) => {
    const args = [
      model,
      '--nnodes',
      '1',
      '--nproc-per-node',
      '8',
      '--global-batch-size',
      '8',
      ...flags,
    ];
    const { options } = parseCompileArgs(args);
    const r = compile({ ...options, skipVerify: true });
    const planned = Math.max(
      ...memoryByProgram(r).map((m) => m.parameters + m.gradients + m.optimizer),
    );
    const p = options.parallel!;
    const layout: Layout = {
      tp: p.tp ?? 1,
      pp: p.pp ?? 1,
      vpp: 1,
      ep: p.ep ?? 1,
      etp: p.etp ?? p.tp ?? 1,
      mbs: 1,
      level: 1,
      encoderTp: 1,
      overlap: false,
      recompute: 'none',
      offload: false,
      distopt: options.distributedOptimizer ?? false,
    };
    const bound = staticBytesLowerBound(
      layerParams(r.config),
      layout,
      8,
      resolvePrecision(options.precision),
    );
    expect(bound).toBeGreaterThan(0);
    expect(bound).toBeLessThanOrEqual(planned);
  });
});

describe('lfc tune', () => {
  it('finds the exhaustive best; its line compiles to the same figures', async () => {
    const r = await tune('--top', '3', '--verify', '--json');
    expect(r.err).toBe('');
    expect(r.code).toBe(0);
    const j = JSON.parse(r.out) as TuneJson;
    expect(j.unpriced).toEqual([]);
    // every layout is accounted for once: skipped, refused, failed, estimated out, or priced
    expect(accounted(j)).toBe(j.enumerated);
    expect(j.estimated).toBe(j.priced + j.estimatedPastDevice + j.cannotWin);
    // what was compiled either fits or is past the device, and then it was not simulated
    expect(j.pastDevice + j.fitting).toBe(j.priced);
    expect(j.failed).toEqual([]);
    expect(j.layouts).toHaveLength(3);
    const speeds = j.layouts.map((l) => l.forecast.tokensPerSecond);
    expect([...speeds].sort((a, b) => b - a)).toEqual(speeds);
    expect(j.layouts.every((l) => l.fits && l.verified)).toBe(true);

    const best = exhaustiveBest();
    expect(best.tokensPerSecond).toBeGreaterThan(0);
    expect(j.layouts[0].forecast.tokensPerSecond).toBeCloseTo(best.tokensPerSecond, 6);

    // the printed line, run as a user would (less its program name and the output directory)
    const line = j.layouts[0].compileLine.split(' ');
    expect(line.slice(0, 2)).toEqual(['lfc', 'compile']);
    const args = line.slice(2, line.indexOf('-o'));
    const dir = mkdtempSync(join(tmpdir(), 'lfc-tune-'));
    try {
      const c = await cli('compile', ...args, '-o', join(dir, 'plan'), '--no-advice', '--json');
      expect(c.code).toBe(0);
      const report = JSON.parse(c.out) as {
        forecast: { tokensPerSecond: number };
        memory: { programs: { bound: { deviceBytes: number } }[] };
      };
      expect(report.forecast.tokensPerSecond).toBe(j.layouts[0].forecast.tokensPerSecond);
      const peak = Math.max(...report.memory.programs.map((m) => m.bound.deviceBytes));
      expect(peak).toBe(j.layouts[0].memory.peakBoundBytes);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 300_000);

  it('--sensitivity: the best re-simulated with each efficiency family ±20%, slower down, faster up', async () => {
    const fixed = ['--fix', 'tp=2', '--fix', 'pp=1', '--fix', 'ep=2', '--fix', 'mbs=1'];
    const r = await tune(...fixed, '--top', '1', '--sensitivity', '--json');
    expect(r.code).toBe(0);
    const j = JSON.parse(r.out) as TuneJson & {
      sensitivity: { family: string; factor: number; tokensPerSecond: number }[];
    };
    const at = j.layouts[0].forecast.tokensPerSecond;
    const families = [...new Set(j.sensitivity.map((s) => s.family))];
    expect(families).toEqual([
      'gemm',
      'attention',
      'memory',
      'nvlink',
      'network',
      'all-to-all',
      'overlap',
    ]);
    for (const s of j.sensitivity)
      if (s.factor < 1) expect(s.tokensPerSecond).toBeLessThanOrEqual(at * (1 + 1e-9));
      else expect(s.tokensPerSecond).toBeGreaterThanOrEqual(at * (1 - 1e-9));
    // a tp 2 × ep 2 layout on one node: its GEMMs and NVLink matter, the network does not
    const of = (family: string, factor: number) =>
      j.sensitivity.find((s) => s.family === family && s.factor === factor)!.tokensPerSecond;
    expect(of('gemm', 0.8)).toBeLessThan(at);
    expect(of('nvlink', 0.8)).toBeLessThan(at);
    expect(of('network', 0.8)).toBe(at);
    const text = await tune(...fixed, '--top', '1', '--sensitivity');
    expect(text.out).toMatch(/sensitivity of #1 \(the plan fixed\)/);
    expect(text.out).toMatch(/\n {4}gemm +\d+ \(-\d/);
  }, 300_000);

  it('--attention-kernel prices every layout with that kernel and goes into the compile line', async () => {
    const fixed = ['--fix', 'tp=2', '--fix', 'pp=1', '--fix', 'ep=2', '--fix', 'mbs=1'];
    const best = async (...more: string[]) => {
      const r = await tune(...fixed, '--top', '1', ...more, '--json');
      expect(r.code).toBe(0);
      return (JSON.parse(r.out) as TuneJson).layouts[0];
    };
    const [fa3, fa2] = [await best(), await best('--attention-kernel', 'flash2')];
    expect(fa3.compileLine).not.toMatch(/--attention-kernel/);
    expect(fa2.compileLine).toMatch(/ --attention-kernel flash2 /);
    expect(fa2.forecast.tokensPerSecond).toBeLessThan(fa3.forecast.tokensPerSecond);
  }, 300_000);

  it('--moe-token-dispatcher-type flex prices expert parallelism over nodes as DeepEP, in the compile line too', async () => {
    // 2 nodes of 2: ep 4 crosses the nodes
    const fixed = ['--nnodes', '2', '--nproc-per-node', '2'];
    const pin = ['--fix', 'tp=1', '--fix', 'pp=1', '--fix', 'ep=4', '--fix', 'mbs=1'];
    const best = async (...more: string[]) => {
      const r = await tune(...fixed, ...pin, '--top', '1', ...more, '--json');
      expect(r.code).toBe(0);
      return (JSON.parse(r.out) as TuneJson).layouts[0];
    };
    const [plain, flex] = [await best(), await best('--moe-token-dispatcher-type', 'flex')];
    expect(plain.compileLine).not.toMatch(/--moe-token-dispatcher-type/);
    expect(flex.compileLine).toMatch(/ --moe-token-dispatcher-type flex /);
    expect(flex.forecast.tokensPerSecond).toBeGreaterThan(plain.forecast.tokensPerSecond);
  }, 300_000);

  it('--moe-expected-imbalance prices every layout at the busiest expert rank, --moe-routing-imbalance plans its memory, both in the compile line', async () => {
    const fixed = ['--fix', 'tp=1', '--fix', 'pp=1', '--fix', 'ep=2', '--fix', 'mbs=1'];
    const best = async (...more: string[]) => {
      const r = await tune(...fixed, '--top', '1', ...more, '--json');
      expect(r.code).toBe(0);
      return (JSON.parse(r.out) as TuneJson).layouts[0];
    };
    const [balanced, skewed] = [await best(), await best('--moe-expected-imbalance', '1.5')];
    expect(balanced.compileLine).not.toMatch(/--moe-expected-imbalance/);
    expect(skewed.compileLine).toMatch(/ --moe-expected-imbalance 1\.5 /);
    expect(skewed.forecast.tokensPerSecond).toBeLessThan(balanced.forecast.tokensPerSecond);
    // the memory side: the bound of the rows an expert rank receives
    const planned = await best('--moe-routing-imbalance', '1.5');
    expect(planned.compileLine).toMatch(/ --moe-routing-imbalance 1\.5 /);
    expect(planned.memory.peakBoundBytes).toBeLessThan(balanced.memory.peakBoundBytes);
    const bad = await tune(...fixed, '--moe-expected-imbalance', '0.5');
    expect(bad.code).toBe(2);
    expect(bad.err).toMatch(/--moe-expected-imbalance/);
    // on a dense decoder every layout is refused, and the search says by which rule
    const dense = await cli(
      'tune',
      ...['tiny-vlm', '--nnodes', '1', '--nproc-per-node', '2'],
      ...['--moe-expected-imbalance', '1.5'],
    );
    expect(dense.out).toMatch(
      /no layout could be priced\n {2}refused \d+ layouts: invalid layout \(moe-expected-imbalance\): .* needs an MoE decoder; tiny-vlm is dense/,
    );
    // a pin no layout of the cluster has: said so, not "could not be priced"
    const none = await cli(
      'tune',
      ...['tiny-vlm-moe', '--nnodes', '1', '--nproc-per-node', '2', '--fix', 'tp=4'],
    );
    expect(none.code).toBe(0);
    expect(none.out).toMatch(/: 0 layouts\n/);
    expect(none.out).toMatch(
      /no layout of this cluster has the knob values --fix and --exclude leave/,
    );
  }, 300_000);

  it('where no layout priced fits at the bounds, the closest are shown with the hint of --fit expected', async () => {
    // h800 with 11 MiB past its 6 GiB reserve: some layouts compile, none fits at the bounds
    const dir = mkdtempSync(join(tmpdir(), 'lfc-tune-'));
    try {
      smallH800(dir);
      const r = await cli(
        'tune',
        ...BASE,
        ...['--hardware', join(dir, 'small.yaml'), '--fix', 'level=1', '--top', '2'],
        ...['--exclude', 'recompute', 'offload'],
      );
      expect(r.code, r.err).toBe(0);
      // none was simulated in the search; the closest were, after it
      const compiled = /(\d+) compiled, 0 fit \(the (\d+) past the device not simulated\)/.exec(
        r.out,
      );
      expect(compiled, r.out).not.toBeNull();
      expect(compiled![2]).toBe(compiled![1]);
      expect(r.out).toMatch(/no layout priced fits; the smallest at the bounds:\n/);
      // each with its simulated step
      const rows = r.out.split('\n').filter((l) => /^\s+[12]\s+\d+\s+\d+\s+[\d.]+ m?s\s/.test(l));
      expect(rows, r.out).toHaveLength(2);
      expect(r.out).toMatch(/--fit expected ranks by the memory of a typical step/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 300_000);

  it('a candidate past the device is not simulated, its compile stopped after the first program past it', () => {
    // h800 with 11 MiB past its 6 GiB reserve: tiny-vlm-moe's stage 0 is past it
    const dir = mkdtempSync(join(tmpdir(), 'lfc-tune-'));
    try {
      smallH800(dir);
      const spec = {
        model: 'tiny-vlm-moe',
        overrides: [],
        base: [
          ...['tiny-vlm-moe', '--nnodes', '1', '--nproc-per-node', '4'],
          ...['--hardware', join(dir, 'small.yaml'), '--global-batch-size', '8'],
        ],
        bf16: false,
        nnodes: 1,
        nprocPerNode: 4,
        globalBatchSize: 8,
        fit: 'bound' as const,
      };
      const pricer = new LocalPricer(pricingRequestOf(spec));
      const layout: Layout = {
        ...{ tp: 1, pp: 2, vpp: 1, ep: 2, etp: 1, mbs: 1, level: 1, encoderTp: 1 },
        ...{ overlap: false, recompute: 'none', offload: false, distopt: false },
      };
      const e = pricer.estimateOne(layout);
      if (!('estimate' in e)) throw new Error(JSON.stringify(e));
      const past = pricer.priceOne(layout, e.estimate, { simulatePastDevice: false });
      const whole = pricer.priceOne(layout, e.estimate, {});
      if (!('pastDevice' in past) || !('forecast' in whole)) throw new Error('not priced so');
      expect(past.stoppedAt).toBe('p0');
      expect(whole.fits).toBe(false);
      // the stopped compile's need is its first program's: at most the plan's largest
      const p0 = whole.memory.find((m) => m.program === 'p0')!;
      expect(past.peakBound).toBe(p0.bound.deviceBytes);
      expect(past.peakBound).toBeLessThanOrEqual(whole.peakBound);
      expect(whole.forecast.stepSeconds).toBeGreaterThan(0);

      // the compiler's early exit itself: it throws with the program it stopped after
      const { options } = parseCompileArgs([...spec.base, '--pp', '2', '--ep', '2']);
      let stopped: unknown;
      try {
        compile({ ...options, skipVerify: true, stopAfter: (p) => p.id === 'p0' });
      } catch (x) {
        stopped = x;
      }
      expect(stopped).toBeInstanceOf(CompileStopped);
      expect((stopped as CompileStopped).program.id).toBe('p0');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 120_000);

  it('a layout of many microbatches is sketched from two smaller batches; what tune prints is compiled whole', async () => {
    // 4 ranks, tp 1: 64 or more microbatches per pipeline, so the search sketches (search.ts)
    const gbs = 256;
    const spec = {
      model: 'tiny-vlm-moe',
      overrides: [],
      base: [
        ...['tiny-vlm-moe', '--nnodes', '1', '--nproc-per-node', '4', '--hardware', 'h800'],
        ...['--global-batch-size', String(gbs)],
      ],
      bf16: false,
      nnodes: 1,
      nprocPerNode: 4,
      globalBatchSize: gbs,
      fit: 'bound' as const,
    };
    const pricer = new LocalPricer(pricingRequestOf(spec));
    const one: Layout = {
      ...{ tp: 1, pp: 2, vpp: 2, ep: 1, etp: 1, mbs: 1, level: 1, encoderTp: 1 },
      ...{ overlap: false, recompute: 'none', offload: false, distopt: false },
    };
    const layouts: Layout[] = [one, { ...one, pp: 1, vpp: 1, ep: 2 }, { ...one, vpp: 1, level: 3 }];
    for (const layout of layouts) {
      const e = pricer.estimateOne(layout);
      if (!('estimate' in e)) throw new Error(JSON.stringify(e));
      const sketch = pricer.priceOne(layout, e.estimate, { sketch: true });
      const whole = pricer.priceOne(layout, e.estimate, {});
      if (!('forecast' in sketch) || !('forecast' in whole)) throw new Error('not priced');
      expect(sketch.sketched).toBe(true);
      expect(whole.sketched).toBeUndefined();
      // the step is linear in the microbatches; the arena's placement at the bounds is not quite
      expect(sketch.forecast.stepSeconds / whole.forecast.stepSeconds).toBeCloseTo(1, 6);
      expect(sketch.forecast.tokensPerSecond / whole.forecast.tokensPerSecond).toBeCloseTo(1, 6);
      expect(sketch.forecast.mfu / whole.forecast.mfu).toBeCloseTo(1, 6);
      expect(sketch.peakExpected / whole.peakExpected).toBeCloseTo(1, 3);
      expect(Math.abs(sketch.peakBound / whole.peakBound - 1)).toBeLessThan(0.02);
    }

    const r = await cli(
      'tune',
      ...BASE,
      ...['--global-batch-size', String(gbs), '--fix', 'tp=1', '--fix', 'mbs=1'],
      ...['--fix', 'level=1', '--fix', 'encoder-tp=1', '--exclude', 'recompute', 'offload'],
      ...['--top', '1', '--json'],
    );
    expect(r.code, r.err).toBe(0);
    const best = (JSON.parse(r.out) as TuneJson).layouts[0];
    expect(best).not.toHaveProperty('sketched');
    const line = best.compileLine.split(' ');
    const c = compile({
      ...parseCompileArgs(line.slice(2, line.indexOf('-o'))).options,
      skipVerify: true,
    });
    const programs = new Map(c.programs.map((p) => [p.id, p]));
    const { forecast } = forecastStep(c.modelForwardFlops, c.plan, programs, loadHardware(H800));
    expect(forecast.tokensPerSecond).toBe(best.forecast.tokensPerSecond);
  }, 300_000);

  it('--plans compiles the printed layouts for lfc viz, each with the figures tune printed', async () => {
    const fixed = ['--fix', 'tp=2', '--fix', 'pp=1', '--fix', 'ep=2'];
    const dir = mkdtempSync(join(tmpdir(), 'lfc-tune-plans-'));
    try {
      const r = await tune(...fixed, '--top', '2', '--json', '--plans', dir);
      expect(r.code).toBe(0);
      const j = JSON.parse(r.out) as TuneJson;
      expect(j.layouts).toHaveLength(2);
      j.layouts.forEach((l, k) => {
        const report = JSON.parse(
          readFileSync(join(dir, String(k + 1), 'report.json'), 'utf8'),
        ) as {
          forecast: { tokensPerSecond: number };
        };
        expect(report.forecast.tokensPerSecond).toBeCloseTo(l.forecast.tokensPerSecond, 6);
      });
      const text = await tune(...fixed, '--top', '1', '--plans', join(dir, 'again'));
      expect(text.out).toMatch(/wrote 1 plan: \S+again\/1\nsee them with: lfc viz \S+again\/1\n$/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 300_000);

  it('gives the same result on this thread and on worker threads', async () => {
    const run = async (workers: string) => {
      const r = await tune('--top', '2', '--workers', workers, '--json');
      expect(r.err).toBe('');
      expect(r.code).toBe(0);
      const j = JSON.parse(r.out) as Record<string, unknown>;
      // how long it took, and how many reduced models each thread built for itself, may differ
      delete j.seconds;
      delete j.estimateGraphs;
      return j;
    };
    const one = await run('1');
    expect((one.layouts as unknown[]).length).toBe(2);
    expect(await run('3')).toEqual(one);
  }, 300_000);

  it('names what the time budget leaves unpriced', async () => {
    const r = await tune('--time-budget', '0.000001', '--json');
    expect(r.code).toBe(0);
    const j = JSON.parse(r.out) as TuneJson;
    expect(j.unpriced.length).toBeGreaterThan(0);
    expect(accounted(j) + j.unpriced.length).toBe(j.enumerated);
    const text = await tune('--time-budget', '0.000001');
    expect(text.out).toMatch(/not priced within --time-budget: \d+ layouts/);
  }, 120_000);

  it.each([
    [['--fix', 'bogus=1'], /--fix bogus=1: no knob bogus/],
    [['--fix', 'tp=four'], /--fix tp=four: four is not a value of tp/],
    [['--exclude', 'warp-drive'], /--exclude warp-drive: no such feature/],
    [['--fit', 'roughly'], /--fit/],
    [['model.image_encoder.tensor_model_parallel_size=2'], /use --fix encoder-tp=N/],
    [['--data-profile', 'nowhere'], /nowhere/],
    [['--hardware', 'h80'], /did you mean 'h800'/],
    [['--workers', '0'], /--workers/],
    [['--attention-kernel', 'flash9'], /--attention-kernel flash9: h800 has no figures for it/],
  ])('%j is a user error', async (extra, message) => {
    const r = await cli('tune', ...BASE, ...extra);
    expect(r.code).toBe(2);
    expect(r.err).toMatch(message);
    expect(r.err.trim().split('\n')).toHaveLength(1);
    expect(r.out).toBe('');
  });
});
