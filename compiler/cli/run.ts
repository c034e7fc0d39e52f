// lfc run DIR: execute a compiled plan (one rank for now), with the training flags.

import type { Command } from 'commander';
import { join } from 'node:path';
import { UserError } from '../errors.js';
import type { CliIO } from './index.js';
import { nonNegativeInt, nonNegativeNumber, positiveInt, positiveNumber } from './options.js';
import { train, type StepMetrics, type TrainOptions } from '../../runtime/train.js';
import { progressBar } from '../../runtime/progress.js';

export interface RunFlags {
  trainIters?: number;
  steps?: number;
  lr?: number;
  minLr?: number;
  lrWarmupIters?: number;
  lrDecayStyle?: string;
  seed?: number;
  save?: string;
  saveInterval?: number;
  load?: string;
  dumpStep?: string;
  weights?: string;
  batch?: string;
  shuffleImages?: boolean;
  metrics?: string;
  threads?: number;
  nprocPerNode?: number;
  quiet?: boolean;
}

export function addTrainingOptions(cmd: Command): Command {
  return cmd
    .option('--train-iters <n>', 'steps to train (default 10)', positiveInt('--train-iters'))
    .option('--steps <n>', 'alias of --train-iters', positiveInt('--steps'))
    .option('--lr <x>', "peak learning rate (default: the plan's)", positiveNumber('--lr'))
    .option(
      '--min-lr <x>',
      'learning rate at the end of cosine decay (default 0)',
      nonNegativeNumber('--min-lr'),
    )
    .option('--lr-warmup-iters <n>', 'linear warm-up steps', nonNegativeInt('--lr-warmup-iters'))
    .option('--lr-decay-style <style>', 'constant or cosine', 'constant')
    .option('--seed <n>', 'seed of parameter init and synthetic data', nonNegativeInt('--seed'))
    .option('--save <dir>', 'checkpoint directory')
    .option(
      '--save-interval <n>',
      'save every n steps (and at the end)',
      positiveInt('--save-interval'),
    )
    .option('--load <dir>', 'resume from a checkpoint (its directory or the save directory)')
    .option(
      '--dump-step <dir>',
      'write weights, batch, grads and step.json of the first step (tiny-vlm.md)',
    )
    .option('--weights <file>', 'start from these weights (safetensors) instead of the initializer')
    .option('--batch <file>', 'replay this batch file (the --dump-step format) every step')
    .option('--shuffle-images', 'control run: move every image to another sample of the batch')
    .option('--metrics <file>', 'metrics JSONL (default: DIR/metrics.jsonl)')
    .option('--threads <n>', 'BLAS threads (default: all cores)', positiveInt('--threads'))
    .option('--quiet', 'no progress bar');
}

export function trainOptions(planDir: string, f: RunFlags): TrainOptions {
  if (
    f.lrDecayStyle !== undefined &&
    f.lrDecayStyle !== 'constant' &&
    f.lrDecayStyle !== 'cosine'
  ) {
    throw new UserError(`--lr-decay-style must be constant or cosine, got '${f.lrDecayStyle}'`);
  }
  if (f.trainIters !== undefined && f.steps !== undefined && f.trainIters !== f.steps) {
    throw new UserError('--steps and --train-iters disagree; give one');
  }
  if (f.load && f.weights)
    throw new UserError('--load and --weights both set the starting parameters; give one');
  if (f.saveInterval && !f.save) throw new UserError('--save-interval needs --save DIR');
  return {
    planDir,
    trainIters: f.trainIters ?? f.steps ?? 10,
    lr: f.lr,
    minLr: f.minLr,
    lrWarmupIters: f.lrWarmupIters,
    lrDecayStyle: f.lrDecayStyle as 'constant' | 'cosine' | undefined,
    seed: f.seed,
    save: f.save,
    saveInterval: f.saveInterval,
    load: f.load,
    dumpStep: f.dumpStep,
    weights: f.weights,
    batch: f.batch,
    shuffleImages: f.shuffleImages,
    metricsPath: f.metrics ?? join(planDir, 'metrics.jsonl'),
    threads: f.threads,
  };
}

export function describeStep(m: StepMetrics): string {
  const caption = m.captionLoss === null ? '' : ` caption ${m.captionLoss.toFixed(3)}`;
  const aux = m.auxLoss ? ` aux ${m.auxLoss.toFixed(4)}` : '';
  return `loss ${m.loss.toFixed(4)}${caption}${aux} | ${(m.tokensPerSecond / 1000).toFixed(1)}k tok/s | ${m.stepMs.toFixed(0)} ms`;
}

export async function runTraining(opts: TrainOptions, io: CliIO, quiet: boolean, isTTY: boolean) {
  const bar = progressBar(opts.trainIters, io.err, isTTY);
  const result = await train({
    ...opts,
    onStep: (m) => quiet || bar.update(m.step, describeStep(m)),
  });
  if (!quiet) bar.done();
  return result;
}

export function addRunCommand(program: Command, io: CliIO, isTTY: () => boolean): void {
  addTrainingOptions(
    program
      .command('run')
      .description('execute a compiled plan: train on local ranks (one rank for now)')
      .argument('<dir>', 'plan directory written by lfc compile')
      .option(
        '--nproc-per-node <n>',
        'local ranks to spawn (the plan decides how many it needs)',
        positiveInt('--nproc-per-node'),
      ),
  ).action(async (dir: string, f: RunFlags) => {
    if (f.nprocPerNode !== undefined && f.nprocPerNode !== 1) {
      throw new UserError(
        `--nproc-per-node ${f.nprocPerNode}: multi-rank execution is not built yet; this runner runs one rank`,
      );
    }
    const opts = trainOptions(dir, f);
    const r = await runTraining(opts, io, !!f.quiet, isTTY());
    const last = r.steps[r.steps.length - 1];
    if (last)
      io.out(
        `trained ${r.plan.model.name} to step ${last.step}: ${describeStep(last)}\nmetrics: ${opts.metricsPath}\n`,
      );
  });
}
