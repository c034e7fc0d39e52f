// bench/data: what reading real data costs a training step (issue 19, acceptance 6).
//
//   npx tsx bench/data.ts [--rounds 6] [--steps 40] [--warmup 4] [--samples 2048] [--jpegs 64]
//
// 1. The step with data against the step without. tiny-vlm-moe on one rank (8 microbatches of
//    128 tokens a step) trains on the demo's dataset (PNG images at the demo's sizes, captions in
//    the chat template; runtime/data/demo-dataset.ts) through the loader in its worker thread,
//    which prefetches the next step while this one runs; then on the same steps' batches
//    preloaded (every step's data read before the first step: no loading in the steps). Runs
//    alternate, A B A B … (this machine is shared: drift hits both alike), and each step's wall
//    time is taken from one progress callback to the next, the first --warmup steps of a run left
//    out (start-up, and the worker's code not yet compiled: a long training run has neither).
//    Printed: the median step of each, and data − preloaded as a share of the step (the target:
//    under 5%), with the range of the rounds' own medians. Also the loader alone, in this thread,
//    with nothing to overlap: its time per step and CPU per sample, which the worker hides.
// 2. Decode + process throughput: 448×448 JPEGs (quality 90, photo-like noise) through sharp's
//    decoder and Qwen2.5-VL's processor (smart_resize to 448×448, Pillow's bicubic, normalize),
//    on this thread: images per second on one core.

import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import sharp from 'sharp';
import { setupOrExit } from '../scripts/setup.mjs';
import { imageProcessorOf } from '../compiler/frontend/data-profile.js';
import { loadModelConfig } from '../compiler/frontend/config.js';
import { configsDir } from '../compiler/paths.js';
import { compile, writePlan } from '../compiler/pipeline.js';
import { demoDataset } from '../runtime/data/demo-dataset.js';
import { processImage } from '../runtime/data/image-processor.js';
import { decodeImage } from '../runtime/data/images.js';
import { DataLoader } from '../runtime/data/loader.js';
import { train, type TrainOptions } from '../runtime/train.js';
import { benchDir } from './temp-dir.js';

setupOrExit('bench native');

function arg(name: string, def: string): number {
  const i = process.argv.indexOf(`--${name}`);
  return Number(i > 0 ? process.argv[i + 1] : def);
}
const median = (xs: readonly number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

const STEPS = arg('steps', '40');
const WARMUP = arg('warmup', '4');
const ROUNDS = arg('rounds', '6');
const SAMPLES = arg('samples', '2048');
const JPEGS = arg('jpegs', '64');
const dir = benchDir('lfc-bench-data-');
const tokenizer = configsDir('tokenizers', 'tiny');

// ---- 1. the step with data against the same batches preloaded -------------------------------

const data = await demoDataset(join(dir, 'demo'), SAMPLES);
const planDir = join(dir, 'plan');
const { plan, programs } = compile({
  model: 'tiny-vlm-moe',
  globalBatchSize: 8,
  microBatchSize: 1,
  optimizer: { lr: 2e-3 },
});
writePlan(planDir, plan, programs);
const dataOptions = {
  sources: [{ weight: 1, path: data.train }],
  split: [1, 0, 0] as const,
  tokenizer,
  phase: 'sft' as const,
};

/** each step's wall time (ms), between consecutive step callbacks */
async function stepTimes(o: TrainOptions): Promise<number[]> {
  const times: number[] = [];
  let last = performance.now();
  await train({
    ...o,
    onStep: () => {
      const now = performance.now();
      times.push(now - last);
      last = now;
    },
  });
  // the first steps pay the start-up, and the worker's code is not yet compiled (JIT)
  return times.slice(WARMUP);
}

const withData: number[] = [];
const preloaded: number[] = [];
const rounds: number[] = [];
for (let round = 0; round < ROUNDS; round++) {
  const a = await stepTimes({ planDir, trainIters: STEPS, data: dataOptions, seed: 1 });
  const b = await stepTimes({
    planDir,
    trainIters: STEPS,
    data: dataOptions,
    preloadData: true,
    seed: 1,
  });
  withData.push(...a);
  preloaded.push(...b);
  rounds.push((median(a) - median(b)) / median(b));
}
const a = median(withData);
const b = median(preloaded);

// the loader alone, in this thread, nothing overlapping it
const model = loadModelConfig('tiny-vlm-moe', []).model;
const loader = await DataLoader.open({
  ...dataOptions,
  part: 'train',
  seed: 1,
  bounds: { seqLength: 128, maxVisualTokens: plan.training.maxVisualTokens },
  globalMicrobatches: 8,
  perReplica: 8,
  replica: 0,
  processor: imageProcessorOf(model.image_encoder),
  vocabSize: model.text_decoder.vocab_size,
  encodes: () => true,
});
/** CPU time of this (the main) thread so far, in ms: /proc's clock ticks of 10 ms */
const threadCpuMs = (): number => {
  const stat = readFileSync(`/proc/self/task/${process.pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return (Number(fields[11]) + Number(fields[12])) * 10;
};
const loads: number[] = [];
let cpuMs = 0;
let cpuSamples = 0;
for (let k = 0; k < STEPS; k++) {
  const t = performance.now();
  const c = threadCpuMs();
  const before = loader.counts.packed;
  await loader.nextStep();
  if (k < WARMUP) continue;
  loads.push(performance.now() - t);
  cpuMs += threadCpuMs() - c;
  cpuSamples += loader.counts.packed - before;
}

console.log(
  `tiny-vlm-moe, one rank, 8 microbatches × 128 tokens a step, ${ROUNDS} rounds of ${STEPS - WARMUP} steps each after ${WARMUP} of warm-up (median):`,
);
console.log(`  step with data (loader in its worker, prefetching)  ${a.toFixed(1)} ms`);
console.log(`  step with the same batches preloaded               ${b.toFixed(1)} ms`);
const pct = (x: number) => `${(100 * x).toFixed(1)}%`;
console.log(
  `  data − preloaded: ${(a - b).toFixed(1)} ms = ${pct((a - b) / b)} of the step (target < 5%); rounds ${pct(Math.min(...rounds))} … ${pct(Math.max(...rounds))}, median ${pct(median(rounds))}`,
);
console.log(
  `  the loader alone, on this thread, after ${WARMUP} steps of warm-up: ${median(loads).toFixed(1)} ms a step, ${((1000 * cpuMs) / cpuSamples).toFixed(0)} µs of this thread's CPU a sample (${loader.counts.packed} samples packed), hidden by the worker`,
);

// ---- 2. decode + process throughput of 448×448 JPEGs ----------------------------------------

const qwen = imageProcessorOf(loadModelConfig('qwen2.5-vl-7b', []).model.image_encoder);
const jpegs: Buffer[] = [];
for (let i = 0; i < 8; i++) {
  const rgb = Buffer.alloc(448 * 448 * 3);
  for (let p = 0; p < rgb.length; p++)
    rgb[p] = ((p % 1344) * 0.19 + Math.floor(p / 1344) * 0.4 + 97 * Math.random() + i * 13) & 255;
  jpegs.push(
    await sharp(rgb, { raw: { width: 448, height: 448, channels: 3 } })
      .jpeg({ quality: 90 })
      .toBuffer(),
  );
}
const times: number[] = [];
for (let k = 0; k < JPEGS; k++) {
  const t = performance.now();
  const rgb = await decodeImage(jpegs[k % jpegs.length], `jpeg ${k}`);
  processImage(rgb, qwen, [448, 448]);
  times.push(performance.now() - t);
}
const ms = median(times);
console.log(
  `448×448 JPEG (quality 90, ${(jpegs[0].length / 1024).toFixed(0)} KiB) decode + process (Qwen2.5-VL): ${ms.toFixed(2)} ms each, ${(1000 / ms).toFixed(0)} images/s on one core (median of ${JPEGS})`,
);
