// lfc demo: the embedded default. Compiles tiny-vlm-moe for 4 local CPU ranks with full
// encoder/decoder separation (level 3) and MoE all-to-all overlap, trains it through the data
// path on the synthetic task's dataset (PNG files and a JSONL of captions, made once in
// runs/demo-data: runtime/data/demo-dataset.ts), with the project's tiny tokenizer and its chat
// template, then trains the same run on the control (the same JSONL with its image files
// shuffled across samples), and compares their caption losses: captions are only predictable
// from the image, so a model that learned to see ends well below the control. Flags change the
// model, the ranks and the layout.

import type { Command } from 'commander';
import { UserError } from '../compiler/errors.js';
import { join, relative, resolve } from 'node:path';
import { configsDir, projectRoot } from '../compiler/paths.js';
import { demoDataset } from '../runtime/data/demo-dataset.js';
import { compile, writePlan, type CompileOptions } from '../compiler/pipeline.js';
import { loadModelConfig } from '../compiler/frontend/config.js';
import type { CliIO } from './io.js';
import { describePlacement, describeSizes } from './compile.js';
import {
  addTrainingOptions,
  launchTraining,
  runTraining,
  trainOptions,
  type RunFlags,
} from './run.js';
import { checkOutputPath, positiveInt } from './options.js';
import { describeStep } from '../runtime/progress.js';
import type { StepMetrics } from '../runtime/train.js';

interface DemoFlags extends RunFlags {
  model: string;
  out: string;
  globalBatchSize?: number;
  control: boolean;
  bf16?: boolean;
  nprocPerNode: number;
  tp?: number;
  pp?: number;
  vpp?: number;
  ep?: number;
  fullHeteroDp: boolean;
  overlap: boolean;
  dataDir: string;
}

/** The demo's defaults: what trains fastest here among layouts that show the article's features. */
export const DEMO_DEFAULTS = {
  model: 'tiny-vlm-moe',
  ranks: 4,
  lr: 2e-3,
  warmupIters: 20,
  trainIters: 300,
  /** microbatches of one sequence per step, at least (rounded up to what the layout needs) */
  minGlobalBatch: 8,
  /** samples of the demo's dataset: more than the default run reads (about 13k), so no epoch repeats */
  samples: 16384,
} as const;

/** A layout of the demo: the parallel sizes and the features on. */
export interface DemoLayout {
  readonly tp: number;
  readonly pp: number;
  readonly vpp: number;
  readonly ep: number;
  readonly fullHeteroDp: boolean;
  readonly overlap: boolean;
  readonly globalBatchSize: number;
}

/**
 * The demo's layout for `ranks` local ranks; a size given is kept, the others follow. MoE models
 * get ep 2 when the ranks allow it; 4 ranks or more a pipeline of 2 stages × 2 virtual chunks
 * (the all-to-all overlap needs vpp > 1 under a pipeline); full separation wherever there are
 * several ranks, the all-to-all overlap wherever its rules hold (ep > 1, vpp > 1 when pp > 1).
 * The global batch is the smallest multiple of what the interleaved schedule needs per
 * data-parallel rank (pp microbatches) that reaches minGlobalBatch.
 */
export function demoLayout(
  ranks: number,
  decoder: { readonly num_layers: number; readonly num_experts: number },
  given: Partial<Omit<DemoLayout, 'fullHeteroDp' | 'overlap'>> & {
    readonly fullHeteroDp?: boolean;
    readonly overlap?: boolean;
  } = {},
  minGlobalBatch: number = DEMO_DEFAULTS.minGlobalBatch,
): DemoLayout {
  const tp = given.tp ?? 1;
  const fits = (n: number) => ranks % n === 0;
  const ep = given.ep ?? (decoder.num_experts > 1 && fits(2 * tp) ? 2 : 1);
  const pp = given.pp ?? (ranks >= 4 && fits(2 * tp * ep) ? 2 : 1);
  const vpp = given.vpp ?? (pp > 1 && decoder.num_layers % (2 * pp) === 0 ? 2 : 1);
  const dp = Math.max(1, Math.floor(ranks / (tp * pp)));
  const unit = dp * (vpp > 1 ? pp : 1);
  const globalBatchSize = given.globalBatchSize ?? unit * Math.ceil(minGlobalBatch / unit);
  return {
    tp,
    pp,
    vpp,
    ep,
    fullHeteroDp: (given.fullHeteroDp ?? true) && ranks > 1,
    overlap: (given.overlap ?? true) && ep > 1 && (pp === 1 || vpp > 1),
    globalBatchSize,
  };
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
        'the embedded default: train tiny-vlm-moe on 4 local CPU ranks (full separation, A2A overlap), against a shuffled-image control',
      )
      .argument('[overrides...]', 'Hydra-style overrides of the model preset')
      .option('--model <name>', 'tiny-vlm-moe or tiny-vlm', DEMO_DEFAULTS.model)
      .option(
        '--nproc-per-node <n>',
        'local CPU ranks',
        positiveInt('--nproc-per-node'),
        DEMO_DEFAULTS.ranks,
      )
      .option('--tp <n>', 'tensor parallelism (default 1)', positiveInt('--tp'))
      .option('--pp <n>', 'pipeline stages (default: 2 from 4 ranks)', positiveInt('--pp'))
      .option(
        '--vpp <n>',
        'virtual chunks per stage (default: 2 when pp > 1)',
        positiveInt('--vpp'),
      )
      .option('--ep <n>', 'expert parallelism (default: 2 for a MoE model)', positiveInt('--ep'))
      .option('--no-full-hetero-dp', 'no full encoder/decoder separation (level 3)')
      .option('--no-overlap', 'no MoE all-to-all overlap (nor delayed wgrad)')
      .option('--out <dir>', 'where the plan, metrics and checkpoints go', 'runs/demo')
      .option(
        '--global-batch-size <n>',
        'microbatches of 128 tokens per step (default: 8, or what the layout needs)',
        positiveInt('--global-batch-size'),
      )
      .option('--no-control', 'skip the shuffled-image control run')
      .option(
        '--data-dir <dir>',
        "where the demo's dataset is made once and reused",
        join(projectRoot(), 'runs', 'demo-data'),
      )
      .option(
        '--bf16',
        'mixed precision: bf16 activations and weights, fp32 main gradients and master weights',
      ),
  ).action(async (overrides: string[], f: DemoFlags) => {
    checkOutputPath('--out', f.out, 'dir');
    const out = resolve(f.out);
    const planDir = join(out, 'plan');
    const ranks = f.nprocPerNode;
    const decoder = loadModelConfig(f.model, overrides).model.text_decoder;
    const layout = demoLayout(ranks, decoder, f);
    const options: CompileOptions = {
      model: f.model,
      overrides,
      nprocPerNode: ranks,
      parallel: { tp: layout.tp, pp: layout.pp, vpp: layout.vpp, ep: layout.ep },
      globalBatchSize: layout.globalBatchSize,
      microBatchSize: 1,
      optimizer: { lr: f.lr ?? DEMO_DEFAULTS.lr },
      encoder: layout.fullHeteroDp ? { fullHeteroDp: true } : undefined,
      moeOverlap: layout.overlap ? { overlap: true, delayWgrad: true } : undefined,
      precision: f.bf16 ? { bf16: true } : undefined,
    };
    const compiled = compile(options);
    writePlan(planDir, compiled.plan, compiled.programs);
    const e = compiled.stats.emit;
    const t = compiled.plan.training;
    io.out(
      [
        `lfc demo: ${compiled.config.name} on ${ranks} local CPU rank${ranks > 1 ? 's' : ''} (${describeSizes(compiled, options)}), ${layout.globalBatchSize} microbatches × ${t.seqLength} tokens per step`,
        ...describePlacement(compiled).map((l) => `  ${l}`),
        `  MoE all-to-all overlap: ${layout.overlap ? "on (one microbatch's forward paired with another's backward, expert all_to_all_v on the comm stream, delayed wgrad)" : 'off'}`,
        `  plan ${planDir}: ${e.instructions} instructions${compiled.programs.length > 1 ? ' (largest program)' : ''}, arena ${(e.arenaBytes / 2 ** 20).toFixed(1)} MiB`,
        '',
      ].join('\n'),
    );
    if (f.dataPath)
      throw new UserError(
        'lfc demo trains on its own dataset and its control; train on yours with lfc compile and lfc run --data-path',
      );
    const iters = f.trainIters ?? f.steps ?? DEMO_DEFAULTS.trainIters;
    const t0 = performance.now();
    const data = await demoDataset(resolve(f.dataDir), DEMO_DEFAULTS.samples);
    const inside = relative(process.cwd(), data.dir);
    const shown = inside && !inside.startsWith('..') ? inside : data.dir;
    io.out(
      `data: ${shown}: ${data.samples} PNG images with a caption each (train.jsonl; control.jsonl has the images shuffled), ` +
        (data.made ? `made in ${((performance.now() - t0) / 1000).toFixed(0)} s` : 'made before') +
        '; tokenizer configs/tokenizers/tiny, sft\n',
    );
    const base: RunFlags = {
      ...f,
      dataPath: [data.train],
      tokenizerModel: f.tokenizerModel ?? configsDir('tokenizers', 'tiny'),
      trainingPhase: f.trainingPhase ?? 'sft',
      trainIters: iters,
      steps: undefined,
      lrWarmupIters: f.lrWarmupIters ?? DEMO_DEFAULTS.warmupIters,
      lrDecayStyle: f.lrDecayStyle ?? 'constant',
    };
    const train = async (flags: RunFlags): Promise<{ steps: StepMetrics[]; s: number }> => {
      const t0 = performance.now();
      const opts = trainOptions(planDir, flags);
      const steps =
        ranks > 1
          ? await launchTraining(planDir, compiled.plan, opts, flags, io, isTTY(), 1, ranks)
          : (await runTraining(opts, io, !!flags.quiet, isTTY())).steps;
      return { steps, s: (performance.now() - t0) / 1000 };
    };
    io.out(`training ${iters} steps (metrics: ${join(out, 'metrics.jsonl')})\n`);
    const main = await train({ ...base, metrics: join(out, 'metrics.jsonl') });
    const mainCaption = finalCaptionLoss(main.steps);
    io.out(`  ${describeStep(main.steps[main.steps.length - 1])} | ${main.s.toFixed(0)} s\n`);
    if (!f.control) {
      io.out(`caption-token loss over the last quarter: ${mainCaption.toFixed(3)}\n`);
      return;
    }
    io.out(
      `control: the same run with images shuffled across samples (metrics: ${join(out, 'metrics-control.jsonl')})\n`,
    );
    const control = await train({
      ...base,
      dataPath: [data.control],
      save: undefined,
      saveInterval: undefined,
      metrics: join(out, 'metrics-control.jsonl'),
    });
    const controlCaption = finalCaptionLoss(control.steps);
    io.out(
      `  ${describeStep(control.steps[control.steps.length - 1])} | ${control.s.toFixed(0)} s\n` +
        `caption-token loss over the last quarter: ${mainCaption.toFixed(3)} with images, ${controlCaption.toFixed(3)} shuffled ` +
        `(ratio ${(mainCaption / controlCaption).toFixed(2)}${mainCaption < controlCaption / 2 ? ': the model reads the images' : ''}; ${(main.s + control.s).toFixed(0)} s)\n`,
    );
  });
}
