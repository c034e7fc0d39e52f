// bench/step: time per training step of tiny-vlm and tiny-vlm-moe, lfc's CPU runtime against
// the same model in PyTorch written as a user would (bench/step_torch.py), on the same batch
// (the committed fixture: 3 microbatches of 128 tokens), the same weights and the same thread
// count, in one script. Prints medians and the ratio lfc / PyTorch (lower is better for lfc), and
// lfc's step with --no-gradient-accumulation-fusion against its default (the wgrad GEMMs adding
// into the gradients), run first.
//
//   npx tsx bench/step.ts [--steps 20] [--warmup 3] [--threads 2]

import { execFileSync } from 'node:child_process';
import { benchDir } from './temp-dir.js';

import { join } from 'node:path';
import { compile, writePlan } from '../compiler/pipeline.js';
import { projectRoot } from '../compiler/paths.js';
import { train } from '../runtime/train.js';
import { setupOrExit } from '../scripts/setup.mjs';

// the Debian packages and the native runtime this bench needs (scripts/setup.mjs)
setupOrExit('bench step');

function arg(name: string, def: number): number {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : def;
}

const steps = arg('steps', 20);
const warmup = arg('warmup', 3);
const threads = arg('threads', 2);
const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

const rows: string[] = [];
for (const model of ['tiny-vlm', 'tiny-vlm-moe']) {
  const fixtures = join(projectRoot(), 'test/fixtures', model);
  const dir = benchDir(`lfc-bench-${model}-`);
  /** lfc's steps of the plan compiled with `fusion` (the wgrad-accumulation pass) or without */
  const lfcRun = async (fusion: boolean) => {
    const planDir = join(dir, fusion ? 'plan' : 'plan-unfused');
    const { plan, programs } = compile({
      model,
      globalBatchSize: 3,
      gradientAccumulationFusion: fusion,
    });
    writePlan(planDir, plan, programs);
    return train({
      planDir,
      trainIters: warmup + steps,
      weights: join(fixtures, 'weights.safetensors'),
      batch: join(fixtures, 'batch.safetensors'),
      threads,
    });
  };
  const unfused = await lfcRun(false);
  const lfc = await lfcRun(true);
  const lfcMs = median(lfc.steps.slice(warmup).map((s) => s.stepMs));
  const unfusedMs = median(unfused.steps.slice(warmup).map((s) => s.stepMs));
  const torchOut = execFileSync(
    '/usr/bin/python3',
    [
      join(projectRoot(), 'bench/step_torch.py'),
      '--model',
      model,
      '--weights',
      join(fixtures, 'weights.safetensors'),
      '--batch',
      join(fixtures, 'batch.safetensors'),
      '--steps',
      String(steps),
      '--warmup',
      String(warmup),
      '--threads',
      String(threads),
    ],
    { encoding: 'utf8', env: { ...process.env, OMP_NUM_THREADS: String(threads) } },
  );
  const torch = JSON.parse(torchOut.trim().split('\n').pop()!) as {
    median_ms: number;
    loss_first: number;
  };
  rows.push(
    `${model.padEnd(13)} lfc ${lfcMs.toFixed(1).padStart(7)} ms   PyTorch ${torch.median_ms.toFixed(1).padStart(7)} ms   ` +
      `ratio ${(lfcMs / torch.median_ms).toFixed(2)}   (first loss lfc ${lfc.steps[0].loss.toFixed(5)}, torch ${torch.loss_first.toFixed(5)})`,
    `${''.padEnd(13)} lfc --no-gradient-accumulation-fusion ${unfusedMs.toFixed(1)} ms: fused / unfused ${(lfcMs / unfusedMs).toFixed(3)}`,
  );
}
console.log(
  `bench/step: median of ${steps} steps after ${warmup} warm-up, ${threads} threads, 3 microbatches × 128 tokens`,
);
for (const r of rows) console.log(r);
