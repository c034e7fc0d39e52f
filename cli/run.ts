// lfc run DIR: execute a compiled plan, with the training flags. One rank runs in this process; a
// multi-rank plan is launched (runtime/launch.ts): this process hosts the store and spawns the
// ranks of its node, each a rank process (runtime/rank-main.ts) that finds its rank in the
// environment the launcher sets and trains as that rank. Under a cluster manager (torchrun-style
// variables, or Slurm's), `lfc run DIR` is itself one rank (runtime/rank.ts).

import { Option, type Command } from 'commander';
import { appendFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { makeDirs } from '../compiler/files.js';
import { UserError } from '../compiler/errors.js';
import type { PlanFile } from '../compiler/plan/format.js';
import type { CliIO } from './io.js';
import {
  checkOutputPath,
  nonNegativeInt,
  nonNegativeNumber,
  positiveInt,
  positiveNumber,
} from './options.js';
import { evalLine, snake, train, type DataOptions, type TrainOptions } from '../runtime/train.js';
import type { DataCounts } from '../runtime/data/loader.js';
import { parseDataPath, parseSplit } from '../runtime/data/sampler.js';
import { describeEval, describeStep, progressBar } from '../runtime/progress.js';
import { launch, type MergedStep } from '../runtime/launch.js';
import {
  DEFAULT_COLLECTIVE_TIMEOUT_S,
  DEFAULT_MASTER_PORT,
  rankFromEnv,
} from '../runtime/launch-rank.js';
import { runRank } from '../runtime/rank.js';
import { checkSources, describeHfLoad, HF_FLAGS, type HfSource } from '../runtime/hf/load.js';
import { readPlan, readPlanFile } from '../runtime/plan-io.js';
import { mergeTrace, traceFragment } from '../runtime/trace.js';

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
  loadHf?: string;
  loadHfEncoder?: string;
  loadHfDecoder?: string;
  batch?: string;
  shuffleImages?: boolean;
  metrics?: string;
  threads?: number;
  nprocPerNode?: number;
  nnodes?: number;
  nodeRank?: number;
  masterAddr?: string;
  masterPort?: number;
  collectiveTimeout?: number;
  rdzvBackend?: string;
  trace?: string;
  quiet?: boolean;
  dataPath?: string[];
  split?: string;
  evalInterval?: number;
  evalIters?: number;
  tokenizerModel?: string;
  trainingPhase?: 'sft' | 'pretrain';
  truncate?: boolean;
  strictData?: boolean;
  dataLog?: string;
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
    .option('--load-hf <dir>', 'start from a Hugging Face checkpoint: every parameter')
    .option(
      '--load-hf-encoder <dir>',
      "a Hugging Face checkpoint's vision encoder (and its merger and deepstack mergers, if there); the rest keeps its init",
    )
    .option(
      '--load-hf-decoder <dir>',
      "a Hugging Face checkpoint's decoder (embeddings, layers, final norm, lm_head); the rest keeps its init",
    )
    .option(
      '--data-path <datasets...>',
      'train on datasets: JSONL files or WebDataset shards (a .tar, or a directory of them); WEIGHT PATH pairs blend them',
    )
    .option(
      '--tokenizer-model <path>',
      "the datasets' tokenizer: a tokenizer.json, or a directory holding it beside tokenizer_config.json",
    )
    .addOption(
      new Option(
        '--training-phase <phase>',
        'sft: loss on the assistant replies only; pretrain: on every text token (default sft)',
      ).choices(['sft', 'pretrain']),
    )
    .option('--split <parts>', 'train,valid,test proportions of each dataset (default 100,0,0)')
    .option(
      '--eval-interval <n>',
      'every N steps and after the last, the loss on the validation split (forward only)',
      positiveInt('--eval-interval'),
    )
    .option(
      '--eval-iters <n>',
      'global batches of the validation split each evaluation reads (default 10)',
      positiveInt('--eval-iters'),
    )
    .option('--truncate', 'cut a sample longer than the sequence instead of dropping it')
    .option('--strict-data', 'a bad sample is an error (exit 2) instead of skipped and counted')
    .option(
      '--data-log <dir>',
      'each rank writes DIR/rank-R.jsonl: the samples (data position, dataset, index) it read each step',
    )
    .option('--batch <file>', 'replay this batch file (the --dump-step format) every step')
    .option('--shuffle-images', 'control run: move every image to another sample of the batch')
    .option('--metrics <file>', 'metrics JSONL (default: DIR/metrics.jsonl)')
    .option('--threads <n>', 'BLAS threads (default: all cores)', positiveInt('--threads'))
    .option(
      '--trace <file>',
      "the last step's timeline as a Chrome trace (open in Perfetto or chrome://tracing): a process per rank, a thread per stream",
    )
    .option('--quiet', 'no progress bar');
}

function addLaunchOptions(cmd: Command): Command {
  return cmd
    .option(
      '--nproc-per-node <n>',
      "ranks to spawn on this node (default: the plan's ranks, on one node)",
      positiveInt('--nproc-per-node'),
    )
    .option('--nnodes <n>', 'nodes of the run (default 1)', positiveInt('--nnodes'))
    .option('--node-rank <n>', 'this node (0: hosts the store)', nonNegativeInt('--node-rank'))
    .option('--master-addr <host>', 'address of node 0, where the store runs (default 127.0.0.1)')
    .option(
      '--master-port <port>',
      `port of the store (default: ${DEFAULT_MASTER_PORT} on several nodes, any free one on one)`,
      positiveInt('--master-port'),
    )
    .option(
      '--collective-timeout <s>',
      `a collective that takes longer fails, naming its op and group (default ${DEFAULT_COLLECTIVE_TIMEOUT_S})`,
      positiveNumber('--collective-timeout'),
    )
    .option('--rdzv-backend <kind>', "tcp (the launcher's store) or file (one node)", 'tcp');
}

export function trainOptions(planDir: string, f: RunFlags): TrainOptions {
  if (f.rdzvBackend !== undefined && f.rdzvBackend !== 'tcp' && f.rdzvBackend !== 'file')
    throw new UserError(`--rdzv-backend must be tcp or file, got '${f.rdzvBackend}'`);
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
  const loadHf = hfSources(f);
  const starts = [
    ...(f.load ? ['--load'] : []),
    ...(f.weights ? ['--weights'] : []),
    ...(loadHf.length ? [loadHf.map((s) => HF_FLAGS[s.part]).join(' and ')] : []),
  ];
  if (starts.length > 1)
    throw new UserError(
      `${starts.slice(0, -1).join(', ')} and ${starts.at(-1)} ${starts.length > 2 ? 'all' : 'both'} set the starting parameters; give one`,
    );
  if (f.saveInterval && !f.save) throw new UserError('--save-interval needs --save DIR');
  // what the run writes, refused now rather than after its steps
  for (const [flag, path, kind] of [
    ['--save', f.save, 'dir'],
    ['--dump-step', f.dumpStep, 'dir'],
    ['--data-log', f.dataLog, 'dir'],
    ['--metrics', f.metrics, 'file'],
    ['--trace', f.trace, 'file'],
  ] as const)
    if (path !== undefined) checkOutputPath(flag, path, kind);
  if (f.evalIters !== undefined && f.evalInterval === undefined)
    throw new UserError('--eval-iters needs --eval-interval N');
  const data = dataOptions(f);
  if (f.evalInterval !== undefined && !data)
    throw new UserError(
      '--eval-interval evaluates on the validation split of --data-path (with --split, e.g. 98,2,0)',
    );
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
    ...(loadHf.length ? { loadHf } : {}),
    batch: f.batch,
    ...(data ? { data } : {}),
    ...(f.dataLog ? { dataLog: resolve(f.dataLog) } : {}),
    ...(f.evalInterval !== undefined
      ? { evalInterval: f.evalInterval, evalIters: f.evalIters ?? 10 }
      : {}),
    shuffleImages: f.shuffleImages,
    metricsPath: f.metrics ?? join(planDir, 'metrics.jsonl'),
    threads: f.threads,
    trace: f.trace === undefined ? undefined : resolve(f.trace),
  };
}

/** The datasets of --data-path and the flags beside it; undefined: the synthetic task. */
function dataOptions(f: RunFlags): DataOptions | undefined {
  if (!f.dataPath) {
    const stray = (
      [
        ['--tokenizer-model', f.tokenizerModel],
        ['--training-phase', f.trainingPhase],
        ['--split', f.split],
        ['--truncate', f.truncate],
        ['--strict-data', f.strictData],
        ['--data-log', f.dataLog],
      ] as const
    ).find(([, v]) => v !== undefined);
    if (stray) throw new UserError(`${stray[0]} needs --data-path`);
    return undefined;
  }
  if (!f.tokenizerModel)
    throw new UserError(
      '--data-path needs --tokenizer-model PATH (a tokenizer.json, or its directory; the tiny models take configs/tokenizers/tiny)',
    );
  return {
    sources: parseDataPath(f.dataPath).map((s) => ({ ...s, path: resolve(s.path) })),
    split: parseSplit(f.split ?? '100,0,0'),
    tokenizer: resolve(f.tokenizerModel),
    phase: f.trainingPhase ?? 'sft',
    ...(f.truncate ? { truncate: true } : {}),
    ...(f.strictData ? { strict: true } : {}),
  };
}

/** The Hugging Face checkpoints of --load-hf, --load-hf-encoder and --load-hf-decoder. */
function hfSources(f: RunFlags): HfSource[] {
  const sources: HfSource[] = [
    ...(f.loadHf ? [{ dir: f.loadHf, part: 'all' as const }] : []),
    ...(f.loadHfEncoder ? [{ dir: f.loadHfEncoder, part: 'encoder' as const }] : []),
    ...(f.loadHfDecoder ? [{ dir: f.loadHfDecoder, part: 'decoder' as const }] : []),
  ];
  checkSources(sources);
  return sources;
}

/** What the loader met: samples packed, and those skipped, dropped, cut or shrunk. */
export function describeData(c: DataCounts, position: number): string {
  const parts = [
    `${c.packed} samples packed (data position ${position})`,
    `${c.bad} bad sample${c.bad === 1 ? '' : 's'} skipped`,
    `${c.dropped} dropped for not fitting a microbatch`,
    ...(c.truncated ? [`${c.truncated} cut to the sequence`] : []),
    ...(c.shrunk ? [`${c.shrunk} images shrunk to the visual-token bound`] : []),
  ];
  return `data: ${parts.join(', ')}\n${c.examples.map((e) => `  ${e}\n`).join('')}`;
}

function describeRanks(m: MergedStep): string {
  const mib = (b: number) => `${(b / 2 ** 20).toFixed(0)}`;
  return `peak memory per rank (MiB): ${m.ranks.map((r) => `r${r.rank} ${mib(r.peakRssBytes)}`).join(', ')}`;
}

export async function runTraining(opts: TrainOptions, io: CliIO, quiet: boolean, isTTY: boolean) {
  const bar = progressBar(opts.trainIters, io.err, isTTY);
  const result = await train({
    ...opts,
    onStep: (m) => quiet || bar.update(m.step, describeStep(m)),
    onEval: (e) => quiet || bar.note(describeEval(e)),
  });
  if (!quiet) bar.done();
  return result;
}

export function addRunCommand(program: Command, io: CliIO, isTTY: () => boolean): void {
  addLaunchOptions(
    addTrainingOptions(
      program
        .command('run')
        .description('execute a compiled plan: train on this process, or launch its ranks')
        .argument('<dir>', 'plan directory written by lfc compile'),
    ),
  ).action(async (dir: string, f: RunFlags) => {
    const opts = trainOptions(dir, f);
    const launching =
      f.nprocPerNode !== undefined || f.nnodes !== undefined || f.nodeRank !== undefined;
    const rank = launching ? undefined : await rankFromEnv();
    if (rank) return runRank(opts, rank, io, !!f.quiet, isTTY());
    const plan = readPlanJson(dir);
    if (opts.loadHf && !f.quiet) io.err(`${describeHfLoad(opts.loadHf, plan)}\n`);
    const nnodes = f.nnodes ?? 1;
    const nprocPerNode =
      f.nprocPerNode ?? Math.max(1, Math.floor(plan.topology.worldSize / nnodes));
    if (plan.topology.worldSize === 1 && nnodes * nprocPerNode === 1) {
      const r = await runTraining(opts, io, !!f.quiet, isTTY());
      const last = r.steps[r.steps.length - 1];
      if (last)
        io.out(
          `trained ${r.plan.model.name} to step ${last.step}: ${describeStep(last)}\nmetrics: ${opts.metricsPath}\n` +
            (opts.trace ? `trace: ${opts.trace}\n` : '') +
            (r.evals.length ? `${describeEval(r.evals[r.evals.length - 1])}\n` : '') +
            (r.data ? describeData(r.data, last.dataPosition ?? 0) : ''),
        );
      return;
    }
    const steps = await launchTraining(dir, plan, opts, f, io, isTTY(), nnodes, nprocPerNode);
    const last = steps[steps.length - 1];
    if (!last || (f.nodeRank ?? 0) !== 0) return;
    io.out(
      `trained ${plan.model.name} on ${plan.topology.worldSize} ranks to step ${last.step}: ${describeStep(last)}\n${describeRanks(last)}\nmetrics: ${opts.metricsPath}\nlogs: ${join(dir, 'logs')}\n`,
    );
    if (opts.trace) {
      const about = { plan: dir, model: plan.model.name };
      const missing = mergeTrace(opts.trace, plan.topology.worldSize, about);
      const elsewhere = missing.length
        ? ` (ranks ${missing.join(', ')} left theirs as ${traceFragment(opts.trace, missing[0])} … on their own nodes)`
        : '';
      io.out(`trace: ${opts.trace}${elsewhere}\n`);
    }
  });
}

/**
 * A multi-rank plan's run from this node: launches its ranks with the training options, shows one
 * progress line and writes the merged metrics (node 0). The steps as the launcher merged them.
 */
export async function launchTraining(
  dir: string,
  plan: PlanFile,
  opts: TrainOptions,
  f: RunFlags,
  io: CliIO,
  isTTY: boolean,
  nnodes = f.nnodes ?? 1,
  nprocPerNode = f.nprocPerNode ?? Math.max(1, Math.floor(plan.topology.worldSize / nnodes)),
): Promise<MergedStep[]> {
  readPlan(dir); // every program present and readable before any rank starts
  const metricsPath = opts.metricsPath!;
  const nodeRank = f.nodeRank ?? 0;
  const bar = progressBar(opts.trainIters, io.err, isTTY);
  const quiet = !!f.quiet || nodeRank !== 0;
  makeDirs(join(metricsPath, '..'));
  let data: { counts: DataCounts; position: number } | undefined;
  const steps = await launch({
    onData: (rank, counts, position) => {
      if (rank === 0) data = { counts, position };
    },
    planDir: dir,
    plan,
    nnodes,
    nprocPerNode,
    nodeRank,
    masterAddr: f.masterAddr ?? '127.0.0.1',
    masterPort: f.masterPort,
    collectiveTimeoutS: f.collectiveTimeout ?? DEFAULT_COLLECTIVE_TIMEOUT_S,
    rendezvous: (f.rdzvBackend ?? 'tcp') as 'tcp' | 'file',
    rankOptions: opts,
    logDir: join(dir, 'logs'),
    onStep: (m) => {
      if (nodeRank === 0) {
        const { ranks, ...global } = m;
        appendFileSync(
          metricsPath,
          JSON.stringify({
            ...snake(global),
            peak_rss_mb_per_rank: ranks.map((r) => r.peakRssBytes / 2 ** 20),
            device_high_bytes_per_rank: ranks.map((r) => r.deviceHighBytes),
            scratch_high_bytes_per_rank: ranks.map((r) => r.scratchHighBytes),
          }) + '\n',
        );
      }
      if (!quiet) bar.update(m.step, describeStep(m));
    },
    onEval: (e) => {
      if (nodeRank === 0) appendFileSync(metricsPath, JSON.stringify(evalLine(e)) + '\n');
      if (!quiet) bar.note(describeEval(e));
    },
  });
  if (!quiet) bar.done();
  if (data && nodeRank === 0) io.out(describeData(data.counts, data.position));
  return steps;
}

function readPlanJson(dir: string): PlanFile {
  return readPlanFile(dir); // plan.json alone, checked; its error names the problem
}
