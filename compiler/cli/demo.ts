// lfc demo: the embedded default. Compiles the tiny VLM for one CPU rank, trains it on the
// synthetic task, then trains the same run with images shuffled across samples (the control),
// and compares their caption-token losses: captions are only predictable from the image, so a
// model that learned to see ends well below the control.

import type { Command } from 'commander';
import { join, resolve } from 'node:path';
import { compile, writePlan } from '../pipeline.js';
import type { CliIO } from './index.js';
import {
  addTrainingOptions,
  describeStep,
  runTraining,
  trainOptions,
  type RunFlags,
} from './run.js';
import { positiveInt } from './options.js';
import type { StepMetrics } from '../../runtime/train.js';

interface DemoFlags extends RunFlags {
  model: string;
  out: string;
  globalBatchSize: number;
  control: boolean;
}

/** Mean caption loss over the last quarter of a run: the figure the demo compares. */
export function finalCaptionLoss(steps: readonly StepMetrics[]): number {
  const tail = steps
    .slice(Math.floor((steps.length * 3) / 4))
    .filter((s) => s.captionLoss !== null);
  return tail.reduce((a, s) => a + s.captionLoss!, 0) / Math.max(tail.length, 1);
}

export function addDemoCommand(program: Command, io: CliIO, isTTY: () => boolean): void {
  addTrainingOptions(
    program
      .command('demo')
      .description(
        'the embedded default: train the tiny VLM on local CPU, against a shuffled-image control',
      )
      .argument('[overrides...]', 'Hydra-style overrides of the model preset')
      .option('--model <name>', 'tiny-vlm or tiny-vlm-moe', 'tiny-vlm')
      .option('--out <dir>', 'where the plan, metrics and checkpoints go', 'runs/demo')
      .option(
        '--global-batch-size <n>',
        'microbatches of 128 tokens per step',
        positiveInt('--global-batch-size'),
        4,
      )
      .option('--no-control', 'skip the shuffled-image control run'),
  ).action(async (overrides: string[], f: DemoFlags) => {
    const out = resolve(f.out);
    const planDir = join(out, 'plan');
    const compiled = compile({
      model: f.model,
      overrides,
      globalBatchSize: f.globalBatchSize,
      optimizer: { lr: f.lr ?? 2e-3 },
    });
    writePlan(planDir, compiled.plan, compiled.programs);
    const e = compiled.stats.emit;
    io.out(
      `lfc demo: ${compiled.config.name} on 1 CPU rank, ${f.globalBatchSize} microbatches × ${compiled.plan.training.seqLength} tokens per step\n` +
        `  plan ${planDir}: ${e.instructions} instructions, arena ${(e.arenaBytes / 2 ** 20).toFixed(1)} MiB\n`,
    );
    const iters = f.trainIters ?? f.steps ?? 600;
    const base = {
      ...f,
      trainIters: iters,
      lrWarmupIters: f.lrWarmupIters ?? 20,
      lrDecayStyle: f.lrDecayStyle ?? 'constant',
    };
    io.out(`training ${iters} steps (metrics: ${join(out, 'metrics.jsonl')})\n`);
    const main = await runTraining(
      trainOptions(planDir, { ...base, metrics: join(out, 'metrics.jsonl') }),
      io,
      !!f.quiet,
      isTTY(),
    );
    const mainCaption = finalCaptionLoss(main.steps);
    io.out(`  ${describeStep(main.steps[main.steps.length - 1])}\n`);
    if (!f.control) {
      io.out(`caption-token loss over the last quarter: ${mainCaption.toFixed(3)}\n`);
      return;
    }
    io.out(
      `control: the same run with images shuffled across samples (metrics: ${join(out, 'metrics-control.jsonl')})\n`,
    );
    const control = await runTraining(
      trainOptions(planDir, {
        ...base,
        shuffleImages: true,
        save: undefined,
        metrics: join(out, 'metrics-control.jsonl'),
      }),
      io,
      !!f.quiet,
      isTTY(),
    );
    const controlCaption = finalCaptionLoss(control.steps);
    io.out(
      `caption-token loss over the last quarter: ${mainCaption.toFixed(3)} with images, ${controlCaption.toFixed(3)} shuffled ` +
        `(ratio ${(mainCaption / controlCaption).toFixed(2)}${mainCaption < controlCaption / 2 ? ': the model reads the images' : ''})\n`,
    );
  });
}
