// bench/simulate: the simulated step against the measured one, on this machine. Calibrates a
// profile (lfc calibrate, one BLAS thread per rank), then for layouts the calibration did not
// run compiles the plan, predicts its step with that profile and trains it, and prints the
// predicted and the measured median step time (steps after the first) and their ratio.
//
//   npx tsx bench/simulate.ts [--steps 8] [--profile FILE (skip calibration)]
//
// Ranks beyond the machine's cores share them, which the simulator does not model (it gives
// every rank its own device): only layouts with ranks ≤ cores are run.

import { readFileSync } from 'node:fs';
import { cpus } from 'node:os';
import { join } from 'node:path';
import { run as lfc, type CliIO } from '../cli/index.js';
import { median } from '../compiler/sim/calibrate.js';
import { loadHardware } from '../compiler/sim/hardware.js';
import { simulatePlan } from '../compiler/sim/simulate.js';
import { readPlan } from '../runtime/plan-io.js';
import { benchDir } from './temp-dir.js';
import { setupOrExit } from '../scripts/setup.mjs';

// the Debian packages and the native runtime this bench needs (scripts/setup.mjs)
setupOrExit('bench native');

const argOf = (name: string, def: string) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : def;
};
const steps = Number(argOf('steps', '8'));
const dir = benchDir('lfc-bench-sim-');
const quiet: CliIO = { out: () => {}, err: () => {} };
const must = async (...argv: string[]) => {
  let err = '';
  const code = await lfc(argv, { out: () => {}, err: (t) => (err += t) });
  if (code !== 0) throw new Error(`lfc ${argv.join(' ')}: ${err}`);
};

let profile = argOf('profile', '');
if (!profile) {
  profile = join(dir, 'local.yaml');
  console.log('calibrating (lfc calibrate --threads 1)…');
  await lfc(['calibrate', '--threads', '1', '-o', profile], quiet);
}
const hw = loadHardware(profile);
console.log(readFileSync(profile, 'utf8').split('\n').slice(0, 1).join(''));

const LAYOUTS: [string, string[]][] = [
  ['tiny-vlm, 1 rank, seq 128, 4 microbatches', ['tiny-vlm', '--global-batch-size', '4']],
  [
    'tiny-vlm-moe, 1 rank, seq 256, 2 microbatches',
    ['tiny-vlm-moe', '--seq-length', '256', '--global-batch-size', '2'],
  ],
  [
    'tiny-vlm-moe, 2 ranks, dp 2',
    ['tiny-vlm-moe', '--nproc-per-node', '2', '--global-batch-size', '4'],
  ],
  [
    'tiny-vlm-moe, 2 ranks, pp 2',
    ['tiny-vlm-moe', '--nproc-per-node', '2', '--pp', '2', '--global-batch-size', '4'],
  ],
  [
    'tiny-vlm-moe, 2 ranks, ep 2',
    ['tiny-vlm-moe', '--nproc-per-node', '2', '--ep', '2', '--global-batch-size', '4'],
  ],
];

console.log('| layout | predicted ms | measured ms (median) | predicted / measured |');
console.log('|---|---|---|---|');
for (const [name, argv] of LAYOUTS) {
  const plan = join(dir, name.replace(/\W+/g, '-'));
  await must('compile', ...argv, '--no-simulate', '-o', plan);
  const loaded = readPlan(plan);
  const ranks = loaded.plan.topology.worldSize;
  if (ranks > cpus().length) continue;
  const predicted = simulatePlan(loaded.plan, loaded.programs, hw).stepSeconds * 1e3;
  const metrics = join(plan, 'bench.jsonl');
  const launch = ranks > 1 ? ['--nproc-per-node', String(ranks)] : [];
  await must(
    'run',
    plan,
    ...launch,
    '--steps',
    String(steps),
    '--threads',
    '1',
    '--metrics',
    metrics,
    '--quiet',
  );
  const times = readFileSync(metrics, 'utf8')
    .trim()
    .split('\n')
    .map((l) => (JSON.parse(l) as { step_ms: number }).step_ms)
    .slice(1);
  const measured = median(times);
  console.log(
    `| ${name} | ${predicted.toFixed(2)} | ${measured.toFixed(2)} | ${(predicted / measured).toFixed(2)} |`,
  );
}
