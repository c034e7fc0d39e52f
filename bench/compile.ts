// bench/compile: wall time and peak memory of `lfc compile` (every pass, emission of every
// stage's program, the memory checker and the plan verifier over all ranks) for large layouts,
// the simulated step's time (as `lfc compile` runs it by default: one rank per program where the
// plan is symmetric, compiler/sim/simulate.ts), and the plan's size on disk and time to write.
// Each layout runs in a fresh process, so peak memory is its own; the median of --runs runs is
// printed. The compiler runs from its build (dist/, built first when stale), as `lfc compile`
// runs it: not through tsx's on-the-fly transpiler, and under lfc's node flags (bin/lfc.js's
// first line).
//
//   npx tsx bench/compile.ts [--runs 3] [--layout 235b|30b-ep8|30b-tp4|30b-distopt|30b-level3|all]
//
// Targets:
// - qwen3-vl-235b-a22b on 1024 GPUs (128 nodes × 8), tp 4, pp 8, vpp 2, ep 16, global batch 1024,
//   sequence 32768: compile under 10 s and 4 GiB (the parallel-compilation issue), and a simulated
//   step without --simulate in under 20 s all told (issue 17, "fast enough to search");
// - 30b-level3, the article's level-3 line (issue 17, item 1: Qwen3-VL-30B-A3B, 32 a800, tp 4,
//   pp 2, ep 4, full separation): compile + simulate in at most 2 s (issue 17); the tuner
//   compiles without the verifier, so that figure is printed apart: "unverified+simulate", from
//   runs of their own with skipVerify (no plan verifier, memory checker or IR checks between
//   passes), alternated with the verified ones. Each of those processes then compiles and
//   simulates the layout 3 times more, as the tuner does after its search (its code warm), and
//   the median of those is printed too.

import { execFileSync } from 'node:child_process';
import { mkdtempSync, readdirSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import type { CompileOptions } from '../compiler/pipeline.js';
import { setupOrExit } from '../scripts/setup.mjs';
import { lfcNodeFlags } from './node-flags.js';

/** the issue's Qwen3-VL-30B-A3B layouts: 4 nodes × 8, sequence 32768, global batch 64 */
const Q30: CompileOptions = {
  model: 'qwen3-vl-30b-a3b',
  nnodes: 4,
  nprocPerNode: 8,
  seqLength: 32768,
  microBatchSize: 1,
  globalBatchSize: 64,
};

const LAYOUTS: Record<string, CompileOptions> = {
  '235b': {
    model: 'qwen3-vl-235b-a22b',
    nnodes: 128,
    nprocPerNode: 8,
    seqLength: 32768,
    microBatchSize: 1,
    globalBatchSize: 1024,
    parallel: { tp: 4, pp: 8, vpp: 2, ep: 16 },
  },
  '30b-ep8': { ...Q30, parallel: { tp: 1, pp: 2, ep: 8, vpp: 2 } },
  '30b-tp4': { ...Q30, parallel: { tp: 4, pp: 2, ep: 4 } },
  '30b-distopt': { ...Q30, parallel: { tp: 1, pp: 2, ep: 8, vpp: 2 }, distributedOptimizer: true },
  '30b-level3': {
    ...Q30,
    parallel: { tp: 4, pp: 2, ep: 4 },
    overrides: ['model.image_encoder.tensor_model_parallel_size=1'],
    distributedOptimizer: true,
    precision: { bf16: true },
    dataProfile: 'article',
    encoder: { fullHeteroDp: true },
  },
};
/** the profile each layout is priced on (the pipeline split and the simulated step) */
const HARDWARE: Record<string, string> = { '30b-level3': 'a800' };

/** unverified runs: how many more times the child compiles and simulates in the same process */
const WARM_AGAIN = 3;

function arg(name: string, def: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : def;
}

function duSync(dir: string): number {
  let bytes = 0;
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    bytes += e.isDirectory() ? duSync(p) : statSync(p).size;
  }
  return bytes;
}

/** one run in this process: prints one JSON line; `unverified`: as the tuner compiles (skipVerify:
 * no plan verifier, memory checker or IR checks between passes), and no plan written */
async function child(name: string, unverified: boolean): Promise<void> {
  const built = join(fileURLToPath(new URL('..', import.meta.url)), 'dist/compiler/pipeline.js');
  const { compile, writePlan } = (await import(
    pathToFileURL(built).href
  )) as typeof import('../compiler/pipeline.js');
  const { loadHardware } = (await import(
    pathToFileURL(built.replace('pipeline.js', 'sim/hardware.js')).href
  )) as typeof import('../compiler/sim/hardware.js');
  const { forecastStep } = (await import(
    pathToFileURL(built.replace('pipeline.js', 'sim/report.js')).href
  )) as typeof import('../compiler/sim/report.js');
  const { replaySetup } = (await import(
    pathToFileURL(built.replace('pipeline.js', 'sim/simulate.js')).href
  )) as typeof import('../compiler/sim/simulate.js');
  const hardware = loadHardware(HARDWARE[name] ?? 'h800');
  // a compile and its simulated step, timed; the result is dropped before the next (the tuner
  // keeps only figures)
  const once = (skipVerify: boolean) => {
    const t0 = performance.now();
    const r = compile({ ...LAYOUTS[name], hardware, skipVerify });
    const ms = performance.now() - t0;
    const t1 = performance.now();
    const programs = new Map(r.programs.map((p) => [p.id, p]));
    // on the verifier's plan index where it made one, as lfc compile simulates
    const setup = replaySetup(r.plan, programs, 'alike', r.planIndex);
    const { forecast } = forecastStep(r.modelForwardFlops, r.plan, programs, hardware, setup);
    return { r, forecast, ms, simulateMs: performance.now() - t1 };
  };
  if (unverified) {
    // figures only: each run's compile result is garbage once timed
    const figures = () => {
      const x = once(true);
      return { ms: x.ms, simulateMs: x.simulateMs, phases: x.r.stats.ms };
    };
    const { ms, simulateMs, phases } = figures();
    // the same layout again in this process, as the tuner prices its top layouts after its
    // search: its code compiled and optimized by then
    const warm = Array.from({ length: WARM_AGAIN }, () => {
      const again = figures();
      return again.ms + again.simulateMs;
    });
    process.stdout.write(JSON.stringify({ ms, simulateMs, warm, phases }) + '\n');
    return;
  }
  const { r, forecast, ms, simulateMs } = once(false);
  const peak = process.resourceUsage().maxRSS * 1024;
  const dir = mkdtempSync(join(tmpdir(), 'lfc-bench-compile-'));
  try {
    const w0 = performance.now();
    writePlan(join(dir, 'plan'), r.plan, r.programs);
    const writeMs = performance.now() - w0;
    const disk = duSync(join(dir, 'plan'));
    const e = r.stats.emit;
    process.stdout.write(
      JSON.stringify({
        ms,
        verifyMs: r.stats.verify.ms,
        simulateMs,
        step: forecast.stepSeconds,
        peak,
        disk,
        writeMs,
        ranks: r.plan.topology.worldSize,
        programs: e.programs,
        instructions: r.programs.reduce((n, p) => n + p.instructions.length, 0),
        phases: r.stats.ms,
      }) + '\n',
    );
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

if (process.argv.includes('--child')) {
  await child(arg('child', '235b'), process.argv.includes('--unverified'));
} else {
  setupOrExit('lfc'); // the children run the compiled CLI
  const runs = Number(arg('runs', '3'));
  const which = arg('layout', '235b');
  const names = which === 'all' ? Object.keys(LAYOUTS) : [which];
  const self = fileURLToPath(import.meta.url);
  const gib = (b: number) => `${(b / 2 ** 30).toFixed(2)} GiB`;
  const nodeFlags = lfcNodeFlags(); // the children run under lfc's node flags
  console.log(
    'layout        ranks  programs  instructions  compile+verify (median)  verify  simulate  all told  unverified+simulate  peak RSS  plan on disk',
  );
  for (const name of names) {
    if (!LAYOUTS[name])
      throw new Error(`unknown layout ${name}; layouts: ${Object.keys(LAYOUTS).join(', ')}, all`);
    const run = (unverified: boolean) => {
      const flags = unverified ? ['--unverified'] : [];
      const out = execFileSync(
        process.execPath,
        [...process.execArgv, ...nodeFlags, self, '--child', name, ...flags],
        { encoding: 'utf8', maxBuffer: 1 << 20 },
      );
      return JSON.parse(out.trim().split('\n').pop()!) as Record<string, number> & {
        phases: Record<string, number>;
        warm?: number[];
      };
    };
    // verified and unverified runs alternate, so that a machine's drift falls on both alike
    const results: ReturnType<typeof run>[] = [];
    const unverified: ReturnType<typeof run>[] = [];
    for (let i = 0; i < runs; i++) {
      results.push(run(false));
      unverified.push(run(true));
    }
    const m = (k: string) => median(results.map((x) => x[k]));
    console.log(
      [
        name.padEnd(13),
        String(results[0].ranks).padStart(5),
        String(results[0].programs).padStart(9),
        String(results[0].instructions).padStart(13),
        `${(m('ms') / 1000).toFixed(2)} s`.padStart(24),
        `${(m('verifyMs') / 1000).toFixed(2)} s`.padStart(7),
        `${(m('simulateMs') / 1000).toFixed(2)} s`.padStart(9),
        `${(median(results.map((x) => x.ms + x.simulateMs)) / 1000).toFixed(2)} s`.padStart(9),
        `${(median(unverified.map((x) => x.ms + x.simulateMs)) / 1000).toFixed(2)} s`.padStart(20),
        gib(m('peak')).padStart(9),
        `${(results[0].disk / 2 ** 20).toFixed(1)} MiB`.padStart(13),
      ].join(' '),
    );
    console.log(
      `  the plan written (lfc compile -o) in ${(m('writeMs') / 1000).toFixed(2)} s (median; ${results.map((x) => (x.writeMs / 1000).toFixed(2)).join(', ')})`,
    );
    console.log(
      `  compile by phase (median ms): ${Object.keys(results[0].phases)
        .map((k) => `${k} ${median(results.map((x) => x.phases[k])).toFixed(0)}`)
        .join(', ')}`,
    );
    console.log(
      `  unverified by phase (median ms): ${Object.keys(unverified[0].phases)
        .filter((k) => unverified.some((x) => x.phases[k] >= 0.5))
        .map((k) => `${k} ${median(unverified.map((x) => x.phases[k])).toFixed(0)}`)
        .join(', ')}`,
    );
    console.log(
      `  unverified runs (compile, simulate): ${unverified.map((x) => `${(x.ms / 1000).toFixed(2)} + ${(x.simulateMs / 1000).toFixed(2)}`).join(', ')} s`,
    );
    const warm = unverified.flatMap((x) => x.warm ?? []);
    console.log(
      `  unverified+simulate again in the same process (the tuner's case), median of ${warm.length}: ${(median(warm) / 1000).toFixed(2)} s (${warm.map((t) => (t / 1000).toFixed(2)).join(', ')})`,
    );
    console.log(
      `  runs (compile, simulate): ${results.map((x) => `${(x.ms / 1000).toFixed(2)} + ${(x.simulateMs / 1000).toFixed(2)}`).join(', ')} s; simulated step ${results[0].step.toFixed(2)} s on ${HARDWARE[name] ?? 'h800'}`,
    );
  }
}
