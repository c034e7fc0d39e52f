// bench/dist-opt: the distributed optimizer's training step on dp 2 (2 local ranks, one thread
// each), this checkout against other checkouts of lfc (older commits), alternated in one run.
//
//   npx tsx bench/dist-opt.ts --against DIR[,DIR…] [--rounds 4] [--steps 12] [--warmup 3]
//                             [--transport shm|tcp] [--global-batch-size 2] [overrides…]
//
// Each checkout compiles the same layout with its own CLI (`DIR/lfc compile … -o PLAN`), once;
// then every round runs `DIR/lfc run PLAN --steps N` for each checkout in turn (this one first,
// then the others, the order turning each round), so that drift on a shared machine falls on
// every checkout alike. A run's figure is its step_ms (metrics.jsonl: the slowest rank's step)
// over the steps after the warm-up; each checkout's figure is the median over all its rounds'
// steps, printed with the ratio against this checkout (above 1: the other is slower).
//
// The default layout makes the optimizer's collectives a visible share of the step: tiny-vlm
// with a decoder of 4 layers × 1024, FFN 4096 (about 55M parameters, nearly all in the decoder),
// one microbatch of 128 tokens per rank (--global-batch-size 2), `--use-distributed-optimizer`
// (gradients reduce-scattered in buckets, parameters all-gathered). The checkouts need their setup done (their `./lfc demo`
// or `npm ci` and a native build); a checkout whose compile or run fails is named and the bench
// exits 1.

import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { benchDir } from './temp-dir.js';
import { setupOrExit } from '../scripts/setup.mjs';

setupOrExit('bench native');

const HERE = resolve(fileURLToPath(new URL('..', import.meta.url)));
const DEFAULT_OVERRIDES = [
  'model.text_decoder.num_layers=4',
  'model.text_decoder.hidden_size=1024',
  'model.text_decoder.ffn_hidden_size=4096',
];

function flag(name: string, fallback: string): string {
  const i = process.argv.indexOf(name);
  return i >= 0 ? process.argv[i + 1] : fallback;
}
const valued = new Set([
  '--against',
  '--rounds',
  '--steps',
  '--warmup',
  '--transport',
  '--global-batch-size',
]);
const AGAINST = flag('--against', '')
  .split(',')
  .filter(Boolean)
  .map((d) => resolve(d));
const ROUNDS = Number(flag('--rounds', '4'));
const STEPS = Number(flag('--steps', '12'));
const WARMUP = Number(flag('--warmup', '3'));
const TRANSPORT = flag('--transport', 'shm');
const GBS = flag('--global-batch-size', '2');
if (AGAINST.length === 0) {
  console.error('bench/dist-opt: --against DIR (another checkout of lfc, set up) is required');
  process.exit(2);
}
if (!['shm', 'tcp'].includes(TRANSPORT)) {
  console.error('bench/dist-opt: --transport is shm or tcp');
  process.exit(2);
}
for (const dir of AGAINST)
  if (!existsSync(join(dir, 'lfc'))) {
    console.error(`bench/dist-opt: ${dir} is not a checkout of lfc (no ./lfc there)`);
    process.exit(2);
  }
const given = process.argv
  .slice(2)
  .filter((a, i, all) => a.includes('=') && !valued.has(all[i - 1]));
const OVERRIDES = given.length ? given : DEFAULT_OVERRIDES;

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const work = benchDir('lfc-dist-opt-');
const env = {
  ...process.env,
  OPENBLAS_NUM_THREADS: '1',
  LFC_COMM_SHM: TRANSPORT === 'shm' ? '1' : '0',
};

function lfc(checkout: string, args: string[]): string {
  const r = spawnSync(join(checkout, 'lfc'), args, { cwd: checkout, env, encoding: 'utf8' });
  if (r.status !== 0) {
    console.error(`bench/dist-opt: ${checkout}: lfc ${args[0]} failed (exit ${r.status})`);
    console.error((r.stderr || r.stdout).split('\n').slice(-12).join('\n'));
    process.exit(1);
  }
  return r.stdout;
}

const checkouts = [HERE, ...AGAINST];
const label = (dir: string) => {
  const head = spawnSync('git', ['-C', dir, 'log', '-1', '--format=%h %s'], { encoding: 'utf8' });
  return head.status === 0 ? head.stdout.trim().slice(0, 70) : dir;
};
const plans = checkouts.map((dir, k) => {
  const plan = join(work, `plan-${k}`);
  lfc(dir, [
    'compile',
    'tiny-vlm',
    '--nproc-per-node',
    '2',
    '--micro-batch-size',
    '1',
    '--global-batch-size',
    GBS,
    '--use-distributed-optimizer',
    ...OVERRIDES,
    '-o',
    plan,
  ]);
  return plan;
});

console.log(
  `dist-opt on dp 2 (${TRANSPORT}), ${OVERRIDES.join(' ')}; ${ROUNDS} rounds of ${STEPS} steps, ` +
    `${WARMUP} warm-up`,
);
const steps: number[][] = checkouts.map(() => []);
for (let round = 0; round < ROUNDS; round++) {
  const order = checkouts.map((_, k) => (k + round) % checkouts.length);
  for (const k of order) {
    const metrics = join(work, `metrics-${k}-${round}.jsonl`);
    lfc(checkouts[k], [
      'run',
      plans[k],
      '--steps',
      String(STEPS),
      '--threads',
      '1',
      '--metrics',
      metrics,
    ]);
    const ms = readFileSync(metrics, 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { step: number; step_ms: number })
      .filter((m) => m.step > WARMUP)
      .map((m) => m.step_ms);
    steps[k].push(...ms);
    console.log(
      `  round ${round + 1}, ${label(checkouts[k]).slice(0, 9)}: median ${median(ms).toFixed(1)} ms`,
    );
  }
}
console.log(
  '\ncheckout                                                                 step (ms)   / this',
);
checkouts.forEach((dir, k) => {
  const m = median(steps[k]);
  console.log(
    `${label(dir).padEnd(72)} ${m.toFixed(1).padStart(9)}   ${(m / median(steps[0])).toFixed(2).padStart(6)}`,
  );
});
