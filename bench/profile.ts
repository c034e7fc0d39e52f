// bench/profile: where a training step's time goes, per op kind, from the runtime's own
// per-instruction timestamps (one rank, the committed fixture batch).
//
//   npx tsx bench/profile.ts [--model tiny-vlm-moe] [--steps 10] [--threads 2]

import { join } from 'node:path';
import { compile, writePlan } from '../compiler/pipeline.js';
import { projectRoot } from '../compiler/paths.js';
import { readBatchFile, captionMask, countOnes } from '../runtime/batch.js';
import { loadNative } from '../runtime/native.js';
import { readPlan } from '../runtime/plan-io.js';
import { RankState } from '../runtime/state.js';
import { loadWeights } from '../runtime/checkpoint.js';
import { benchDir } from './temp-dir.js';
import { setupOrExit } from '../scripts/setup.mjs';

// the Debian packages and the native runtime this bench needs (scripts/setup.mjs)
setupOrExit('bench native');

const argOf = (name: string, def: string) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : def;
};
const model = argOf('model', 'tiny-vlm-moe');
const steps = Number(argOf('steps', '10'));
const threads = Number(argOf('threads', '2'));

const dir = benchDir('lfc-profile-');
const { plan, programs } = compile({ model, globalBatchSize: 3 });
writePlan(dir, plan, programs);
const loaded = readPlan(dir);
const program = loaded.programs.get('p0')!;
const rt = new (loadNative().Runtime)(loaded.programTexts.get('p0')!, { threads, timing: true });
const fixtures = join(projectRoot(), 'test/fixtures', model);
loadWeights(join(fixtures, 'weights.safetensors'), new RankState(program, rt));
const mbs = readBatchFile(join(fixtures, 'batch.safetensors'));
mbs.forEach((mb, j) => rt.setMicrobatch(j, { ...mb, captionMask: captionMask(mb) }));
rt.setScalar(
  'loss_tokens',
  mbs.reduce((a, mb) => a + countOnes(mb.lossMask), 0),
);
if ('caption_tokens' in program.scalars) rt.setScalar('caption_tokens', 1);

const perOp = new Map<string, number[]>();
const stepMs: number[] = [];
for (let s = 1; s <= steps; s++) {
  const r = await rt.step({ lr: 1e-3, step: s });
  stepMs.push(r.stepMs);
  if (s <= 2) continue; // warm-up
  const acc = new Map<string, number>();
  r.perInstruction!.forEach((t, i) => {
    const op = program.instructions[i].op;
    acc.set(op, (acc.get(op) ?? 0) + (t.end - t.start));
  });
  for (const [op, ms] of acc) perOp.set(op, [...(perOp.get(op) ?? []), ms]);
}
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const rows = [...perOp].map(([op, xs]) => [op, median(xs)] as const).sort((a, b) => b[1] - a[1]);
const total = median(stepMs.slice(2));
console.log(
  `bench/profile ${model}: step median ${total.toFixed(1)} ms (${threads} threads); per op kind, median ms per step:`,
);
for (const [op, ms] of rows.slice(0, 20))
  console.log(
    `  ${op.padEnd(28)} ${ms.toFixed(2).padStart(8)}  ${((100 * ms) / total).toFixed(1).padStart(5)}%`,
  );
