// bench/overlap: what the MoE all-to-all overlap hides, on 2 local ranks (ep 2, each rank one
// BLAS thread: 2 ranks on this machine's 2 cores). tiny-vlm-moe is scaled by overrides until the
// expert all-to-all is a visible share of the step; the same layout is compiled with the overlap
// off (1F1B: every all_to_all_v on the compute stream, in line) and on
// (`--overlap-moe-expert-parallel-comm --delay-wgrad-compute`: combined forward/backward steps,
// the expert all_to_all_v on the comm stream). From the runtime's own per-instruction timestamps
// (its timing option), per step: T = the slowest rank's step time, T_a2a = Σ all_to_all_v
// durations on a rank (the larger of the two). Medians over the steps after the warm-up; the
// hidden fraction is (T_off − T_on) / T_a2a(off).
//
// Both transports, each off and on: tcp (LFC_COMM_SHM=0, Gloo over loopback: the stand-in for
// expert parallelism across machines, where an all-to-all is mostly waiting on the network) and
// shared memory (the ranks' own memcpy: on 2 busy cores that is compute-bound work of its own,
// which a second stream cannot hide).
//
//   npx tsx bench/overlap.ts [--steps 10] [--warmup 3] [--seq-length 1024] [--micro-batch-size 1]
//                            [--global-batch-size 16] [--transport tcp|shm|both] [--rounds 2]
//                            [overrides…]
//
// Each transport runs off, on, off, on, … (--rounds pairs; the machine's drift falls on both
// alike) and takes medians over the steps of all its runs.
//
// Default scale: 2 decoder layers (each an MoE layer), hidden 256, 8 experts of FFN 64, top-4;
// sequences of 1024 tokens, 8 microbatches per rank (so the overlap's steady state dominates).
// Each a2a then moves 1024 × 4 rows of 1 KiB, half of them to the other rank; at this scale it
// is about a fifth of the step with the overlap off.

import { spawn } from 'node:child_process';
import { benchDir } from './temp-dir.js';

import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import { compile, writePlan, type CompileOptions } from '../compiler/pipeline.js';
import { StoreServer } from '../runtime/store.js';
import type { OverlapRankStep } from './overlap-rank.js';
import { setupOrExit } from '../scripts/setup.mjs';

// the Debian packages and the native runtime this bench needs (scripts/setup.mjs)
setupOrExit('bench native');

const RANKS = 2;
const DEFAULT_OVERRIDES = [
  'model.text_decoder.num_layers=2',
  'model.text_decoder.hidden_size=256',
  'model.text_decoder.num_experts=8',
  'model.text_decoder.moe_router_topk=4',
  'model.text_decoder.moe_ffn_hidden_size=64',
];

function flag(name: string, fallback: string): string {
  const i = process.argv.indexOf(name);
  return i >= 0 ? process.argv[i + 1] : fallback;
}
const STEPS = Number(flag('--steps', '10'));
const WARMUP = Number(flag('--warmup', '3'));
const SEQ = Number(flag('--seq-length', '1024'));
const MBS = Number(flag('--micro-batch-size', '1'));
const GBS = Number(flag('--global-batch-size', '16'));
const TRANSPORT = flag('--transport', 'both');
const ROUNDS = Number(flag('--rounds', '2'));
if (!['tcp', 'shm', 'both'].includes(TRANSPORT)) throw new Error('--transport: tcp, shm or both');
const valued = new Set([
  '--steps',
  '--warmup',
  '--seq-length',
  '--micro-batch-size',
  '--global-batch-size',
  '--transport',
  '--rounds',
]);
const given = process.argv
  .slice(2)
  .filter((a, i, all) => a.includes('=') && !valued.has(all[i - 1]));
const OVERRIDES = given.length ? given : DEFAULT_OVERRIDES;

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

interface Mode {
  readonly name: string;
  readonly overlap: boolean;
  readonly shm: boolean;
}

interface Figures {
  readonly stepMs: number;
  readonly a2aMs: Readonly<Record<string, number>>;
  readonly a2aTotalMs: number;
  readonly a2aCount: number;
}

const dirs = new Map<boolean, string>();
/** the plan of one mode (compiled once) */
function planDir(overlap: boolean): string {
  if (!dirs.has(overlap)) {
    const options: CompileOptions = {
      model: 'tiny-vlm-moe',
      overrides: OVERRIDES,
      nprocPerNode: RANKS,
      parallel: { ep: RANKS },
      seqLength: SEQ,
      microBatchSize: MBS,
      globalBatchSize: GBS,
      moeOverlap: overlap ? { overlap: true, delayWgrad: true } : undefined,
    };
    const compiled = compile(options);
    const dir = benchDir(`lfc-overlap-${overlap ? 'on' : 'off'}-`);
    writePlan(dir, compiled.plan, compiled.programs);
    dirs.set(overlap, dir);
  }
  return dirs.get(overlap)!;
}

/** One run of a mode: per step after the warm-up, each rank's record. */
async function runOnce(mode: Mode): Promise<OverlapRankStep[][]> {
  const dir = planDir(mode.overlap);
  const server = await StoreServer.listen(0, '127.0.0.1');
  const tsx = createRequire(import.meta.url).resolve('tsx');
  const worker = fileURLToPath(new URL('./overlap-rank.ts', import.meta.url));
  const store = `tcp:127.0.0.1:${server.port}`;
  const perRank = await Promise.all(
    Array.from({ length: RANKS }, (_, rank) => {
      const argv = [worker, dir, String(rank), String(RANKS), store, String(STEPS)];
      const child = spawn(process.execPath, ['--import', tsx, ...argv], {
        stdio: ['ignore', 'pipe', 'inherit'],
        env: { ...process.env, OPENBLAS_NUM_THREADS: '1', LFC_COMM_SHM: mode.shm ? '1' : '0' },
      });
      let out = '';
      child.stdout.on('data', (c: Buffer) => (out += c.toString()));
      return new Promise<OverlapRankStep[]>((resolve, reject) =>
        child.on('close', (code) =>
          code === 0
            ? resolve(JSON.parse(out) as OverlapRankStep[])
            : reject(new Error(`${mode.name}: rank ${rank} exited ${code}`)),
        ),
      );
    }),
  );
  await server.close();
  return Array.from({ length: STEPS - WARMUP }, (_, k) => perRank.map((r) => r[k + WARMUP]));
}

/** Medians over every step of every run (the slowest rank's figure per step). */
function figuresOf(steps: readonly OverlapRankStep[][]): Figures {
  const total = (s: OverlapRankStep) => Object.values(s.a2aMs).reduce((a, b) => a + b, 0);
  const streams = [
    ...new Set(steps.flatMap((ranks) => ranks.flatMap((s) => Object.keys(s.a2aMs)))),
  ];
  const slowest = (f: (s: OverlapRankStep) => number) =>
    median(steps.map((ranks) => Math.max(...ranks.map(f))));
  return {
    stepMs: slowest((s) => s.stepMs),
    a2aTotalMs: slowest(total),
    a2aMs: Object.fromEntries(streams.map((st) => [st, slowest((s) => s.a2aMs[st] ?? 0)])),
    a2aCount: steps[0][0].a2aCount,
  };
}

console.log(
  `bench/overlap: tiny-vlm-moe on ${RANKS} ranks, ep ${RANKS}, sequence ${SEQ} × micro-batch ${MBS}, global batch ${GBS}; ${OVERRIDES.join(' ')}`,
);
console.log(
  `medians of ${ROUNDS} runs × ${STEPS - WARMUP} steps after ${WARMUP} warm-up steps; ms per step`,
);
const transports = TRANSPORT === 'both' ? [false, true] : [TRANSPORT === 'shm'];
for (const shm of transports) {
  const pooled = new Map<string, OverlapRankStep[][]>([
    ['off', []],
    ['on', []],
  ]);
  for (let round = 0; round < ROUNDS; round++)
    for (const overlap of [false, true]) {
      const name = overlap ? 'on' : 'off';
      pooled
        .get(name)!
        .push(...(await runOnce({ name: `${shm ? 'shm' : 'tcp'}-${name}`, overlap, shm })));
    }
  const figures = new Map([...pooled].map(([name, steps]) => [name, figuresOf(steps)]));
  console.log(`${shm ? 'shared memory' : 'tcp'}:`);
  console.log(
    `  ${'overlap'.padEnd(8)} ${'step'.padStart(8)} ${'a2a total'.padStart(10)} ${'on compute'.padStart(11)} ${'on comm'.padStart(8)} ${'a2a share'.padStart(10)} ${'a2a ops'.padStart(8)}`,
  );
  for (const [name, f] of figures) {
    console.log(
      `  ${name.padEnd(8)} ${f.stepMs.toFixed(1).padStart(8)} ${f.a2aTotalMs.toFixed(1).padStart(10)} ${(f.a2aMs.compute ?? 0).toFixed(1).padStart(11)} ${(f.a2aMs.comm ?? 0).toFixed(1).padStart(8)} ${`${((100 * f.a2aTotalMs) / f.stepMs).toFixed(1)}%`.padStart(10)} ${String(f.a2aCount).padStart(8)}`,
    );
  }
  const off = figures.get('off')!;
  const on = figures.get('on')!;
  console.log(
    `  hidden fraction (T_off − T_on) / T_a2a(off) = (${off.stepMs.toFixed(1)} − ${on.stepMs.toFixed(1)}) / ${off.a2aTotalMs.toFixed(1)} = ${((off.stepMs - on.stepMs) / off.a2aTotalMs).toFixed(2)}`,
  );
}
