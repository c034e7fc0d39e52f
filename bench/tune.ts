// bench/tune: issue 17, item 3 — `lfc tune` on the article's setup against the article's base line.
//
//   npx tsx bench/tune.ts [--workers N] [--fit bound|expected]
//
// 1. Runs the command of item 3 as a user would (the compiled CLI, a process of its own, with
//    --json) and times it as a whole:
//      lfc tune qwen3-vl-30b-a3b --nnodes 4 --nproc-per-node 8 --hardware a800 --seq-length 32768
//        --global-batch-size 64 --bf16 --data-profile configs/data/article.yaml
//    Target: at most 60 s here.
// 2. Compiles the best layout's printed line with the plan verifier (as `lfc compile` does) and
//    checks that it gives the tokens/s and the peak memory the tuner printed, and that it fits at
//    the bounds.
// 3. Compiles item 1's base line (tp 4, pp 2, ep 4, the distributed optimizer, encoder TP 1) twice:
//    as written (lfc's split of the decoder, balanced by priced seconds on a800) and at the
//    article's split (Megatron's default 24 + 24), and prints the best's tokens/s over each.
//    Target: at least 1.25×.
// 4. Re-simulates the best and the base (both plans fixed) with each efficiency family of a800
//    moved ×0.8 and ×1.2, one at a time, and prints the ratio under each. Target: at least 1.15×
//    under every one.

import { execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { parseCompileArgs } from '../cli/compile.js';
import { compile } from '../compiler/pipeline.js';
import { deviceMemoryOf, memoryByProgram } from '../compiler/report/memory.js';
import { EFFICIENCY_FAMILIES, loadHardware, scaleEfficiency } from '../compiler/sim/hardware.js';
import type { HardwareProfile } from '../compiler/sim/hardware.js';
import { forecastStep } from '../compiler/sim/report.js';
import { setupOrExit } from '../scripts/setup.mjs';
import { lfcNodeFlags } from './node-flags.js';

const arg = (name: string, def: string) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : def;
};

const SETUP = [
  'qwen3-vl-30b-a3b',
  ...['--nnodes', '4', '--nproc-per-node', '8', '--hardware', 'a800'],
  ...['--seq-length', '32768', '--global-batch-size', '64', '--bf16'],
  ...['--data-profile', 'configs/data/article.yaml'],
];
const BASE = [
  ...SETUP,
  ...['--tp', '4', '--pp', '2', '--ep', '4', '--micro-batch-size', '1'],
  '--use-distributed-optimizer',
  'model.image_encoder.tensor_model_parallel_size=1',
];
const GPUS = 32;

setupOrExit('lfc'); // the tuner runs from the build, as the command does
const root = fileURLToPath(new URL('..', import.meta.url));
const workers = process.argv.includes('--workers') ? ['--workers', arg('workers', '2')] : [];
const t0 = performance.now();
const out = execFileSync(
  process.execPath,
  [
    ...lfcNodeFlags(),
    'bin/lfc.js',
    'tune',
    ...SETUP,
    ...workers,
    ...['--fit', arg('fit', 'bound'), '--top', '5', '--json'],
  ],
  { cwd: root, encoding: 'utf8', maxBuffer: 64 << 20 },
);
const wall = (performance.now() - t0) / 1000;
const tuned = JSON.parse(out) as {
  layouts: {
    name: string;
    compileLine: string;
    forecast: { tokensPerSecond: number; stepSeconds: number };
    memory: { peakBoundBytes: number };
  }[];
  enumerated: number;
  estimated: number;
  priced: number;
  seconds: number;
};
console.log(
  `lfc tune (item 3's command): ${wall.toFixed(1)} s as a process (${tuned.seconds.toFixed(1)} s searching): ${tuned.enumerated} layouts, ${tuned.estimated} estimated, ${tuned.priced} compiled and simulated; target ≤ 60 s`,
);
if (!tuned.layouts.length) {
  console.log('  no layout fits');
  process.exit(0);
}
const best = tuned.layouts[0];
console.log(`  best: ${best.name}`);
console.log(`  ${best.compileLine}`);

const hw = loadHardware('a800');
const device = deviceMemoryOf(hw);
/** a line's plan, and its tokens/s per GPU on a profile */
function plan(argv: readonly string[], verify: boolean) {
  const t = performance.now();
  const r = compile({ ...parseCompileArgs([...argv]).options, skipVerify: !verify });
  const programs = new Map(r.programs.map((p) => [p.id, p]));
  const perGpu = (h: HardwareProfile) =>
    forecastStep(r.modelForwardFlops, r.plan, programs, h).forecast.tokensPerSecond / GPUS;
  const memory = memoryByProgram(r, device);
  const peak = Math.max(...memory.map((m) => m.bound.deviceBytes));
  return {
    perGpu,
    peak,
    fits: memory.every((m) => m.fits),
    seconds: (performance.now() - t) / 1000,
  };
}

// 2. the printed line, verified
const words = best.compileLine.split(' ');
const line = words.slice(2, words.indexOf('-o'));
const mine = plan(line, true);
const at = mine.perGpu(hw);
const printed = best.forecast.tokensPerSecond / GPUS;
console.log(
  `  compiled with the verifier (${mine.seconds.toFixed(1)} s): ${at.toFixed(1)} tokens/s/GPU (tune printed ${printed.toFixed(1)}: ${at === printed ? 'the same' : 'DIFFERENT'}), ${(mine.peak / 2 ** 30).toFixed(2)} GiB at the bounds (tune printed ${(best.memory.peakBoundBytes / 2 ** 30).toFixed(2)}), ${mine.fits ? 'fits' : 'DOES NOT FIT'} ${hw.name}`,
);

// 3. the base line, at lfc's split and at the article's
const bases = {
  "lfc's split": plan(BASE, false),
  "the article's split (24 + 24)": plan(
    [...BASE, '--decoder-first-pipeline-num-layers', '24'],
    false,
  ),
};
for (const [name, b] of Object.entries(bases)) {
  const base = b.perGpu(hw);
  console.log(
    `  item 1's base line, ${name}: ${base.toFixed(0)} tokens/s/GPU, ${(b.peak / 2 ** 30).toFixed(1)} GiB at the bounds (${b.fits ? 'fits' : 'does not fit'}); best / base ${(at / base).toFixed(3)} (target ≥ 1.25)`,
  );
}

// 4. the ratio with each efficiency family moved
console.log(
  '  best / base with one efficiency family of a800 moved (the plans fixed; target ≥ 1.15):',
);
console.log(
  `    ${'family'.padEnd(12)} ${Object.keys(bases)
    .map((n) => `×0.8 ${n}`.padStart(36) + `×1.2`.padStart(8))
    .join('')}`,
);
for (const family of EFFICIENCY_FAMILIES) {
  const cells = Object.values(bases).flatMap((b) =>
    [0.8, 1.2].map((f) => {
      const h = scaleEfficiency(hw, family, f);
      return (mine.perGpu(h) / b.perGpu(h)).toFixed(3);
    }),
  );
  console.log(
    `    ${family.padEnd(12)} ${cells.map((c, k) => c.padStart(k % 2 ? 8 : 36)).join('')}`,
  );
}
