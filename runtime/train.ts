// The training loop of one rank: data in (synthetic or a replayed batch file), the native
// runtime's step, the learning-rate schedule, metrics (JSONL), checkpoints, and the step dump of
// tiny-vlm.md. The CLI (`lfc run`, `lfc demo`) and the tests call train().
//
// A rank of a multi-rank plan (options.rank) connects to the others first, runs the microbatches
// of its data-parallel index (slot j holds global microbatch dpIndex · m + j), and sums over every
// rank what describes the global batch: its loss tokens before the step (the loss is normalized by
// the whole batch's count) and the losses after it, each microbatch counted once
// (launch-rank.ts: speaksForItsData).

import { appendFileSync, existsSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { UserError } from '../compiler/errors.js';
import type { PlanFile, ProgramFile } from '../compiler/plan/format.js';
import {
  captionMask,
  countOnes,
  readBatchFile,
  shuffleImages,
  writeBatchFile,
  type Microbatch,
} from './batch.js';
import {
  assembleCheckpoint,
  iterDir,
  loadCheckpoint,
  loadWeights,
  rankShare,
  saveCheckpoint,
  writeCheckpoint,
  type CheckpointMeta,
} from './checkpoint.js';
import { commConfig, speaksForItsData, type RankContext } from './launch-rank.js';
import { groupRanksOf, pieceOf } from './shard.js';
import { loadNative, type NativeRuntime } from './native.js';
import { readPlan } from './plan-io.js';
import {
  readSafetensors,
  serializeSafetensors,
  writeFileAtomic,
  writeSafetensors,
  type Tensor,
} from './safetensors.js';
import { lrAt, type LrSchedule } from './schedule.js';
import { RankState } from './state.js';

export interface TrainOptions {
  readonly planDir: string;
  readonly trainIters: number;
  readonly lr?: number;
  readonly minLr?: number;
  readonly lrWarmupIters?: number;
  readonly lrDecayStyle?: 'constant' | 'cosine';
  readonly seed?: number;
  readonly save?: string;
  readonly saveInterval?: number;
  readonly load?: string;
  /** write weights, batch, grads and step.json of the first step run here */
  readonly dumpStep?: string;
  /** start from these weights instead of the initializer */
  readonly weights?: string;
  /** replay this batch file every step instead of the synthetic data */
  readonly batch?: string;
  /** the control run: images moved across samples */
  readonly shuffleImages?: boolean;
  readonly metricsPath?: string;
  readonly threads?: number;
  /** this process is one rank of a multi-rank run */
  readonly rank?: RankContext;
  readonly onStep?: (m: StepMetrics) => void;
}

export interface StepMetrics {
  readonly step: number;
  readonly loss: number;
  readonly ceLoss: number;
  readonly auxLoss: number;
  readonly captionLoss: number | null;
  readonly gradNorm: number;
  readonly lr: number;
  readonly tokens: number;
  readonly lossTokens: number;
  readonly stepMs: number;
  readonly tokensPerSecond: number;
  /** this process's peak resident memory so far */
  readonly peakRssBytes: number;
}

export interface TrainResult {
  readonly steps: StepMetrics[];
  readonly finalStep: number;
  readonly plan: PlanFile;
  /** parameters after the run, whole tensors */
  readonly params: Map<string, Float32Array>;
}

export async function train(o: TrainOptions): Promise<TrainResult> {
  const loaded = readPlan(o.planDir);
  const plan = loaded.plan;
  const world = plan.topology.worldSize;
  const rank = o.rank?.rank ?? 0;
  if ((o.rank?.worldSize ?? 1) !== world) {
    throw new UserError(
      `${o.planDir} is a plan for ${world} rank${world === 1 ? '' : 's'}; ` +
        (o.rank
          ? `this run has ${o.rank.worldSize}`
          : `start it with lfc run ${o.planDir} --nproc-per-node ${plan.topology.nprocPerNode}` +
            (plan.topology.nnodes > 1 ? ` --nnodes ${plan.topology.nnodes}` : '')),
    );
  }
  if (world > 1 && o.dumpStep) throw new UserError('--dump-step runs on one rank');
  if (world > 1 && o.shuffleImages) throw new UserError('--shuffle-images runs on one rank');
  const programId = plan.rankPrograms[rank];
  const program = loaded.programs.get(programId)!;
  const native = loadNative();
  const enc = (
    plan.model.config as { image_encoder: { patch_size: number; spatial_merge_size: number } }
  ).image_encoder;
  // the runtime validates the program before anything runs; a bad program is the user's file
  const rt: NativeRuntime = userErrors(
    join(o.planDir, 'programs', `${programId}.json`),
    () =>
      new native.Runtime(loaded.programTexts.get(programId)!, {
        threads: o.threads,
        patchSize: enc.patch_size,
        mergeSize: enc.spatial_merge_size,
        collectives: o.rank !== undefined,
        symbols: plan.symbols,
      }),
  );
  if (o.rank) {
    const r = o.rank;
    await rt.connect(commConfig(plan, loaded.programs, r)).catch((e: Error) => {
      throw new UserError(`rank ${r.rank}: ${e.message}`);
    });
  }
  // sums over the global batch: each rank adds its share, weighted 1 where it speaks for its data
  const dataWeight = speaksForItsData(plan, loaded.programs, rank, (p) =>
    p.inputs.some((i) => i.name === 'loss_mask'),
  )
    ? 1
    : 0;
  const lossWeight = speaksForItsData(plan, loaded.programs, rank, (p) =>
    p.outputs.some((x) => x.name === 'loss'),
  )
    ? 1
    : 0;
  const globalSum = async (values: number[]): Promise<number[]> =>
    o.rank ? [...(await rt.worldSum(Float64Array.from(values)))] : values;
  const dpIndex = plan.dataParallel?.rankIndex[rank] ?? 0;
  const dpSize = plan.dataParallel?.size ?? 1;
  const state = new RankState(program, rt);
  const seed = o.seed ?? 1234;
  const m = plan.training.numMicrobatches;
  const vocab = (plan.model.config as { text_decoder: { vocab_size: number } }).text_decoder
    .vocab_size;

  // parameters: a checkpoint, given weights, or the deterministic initializer
  let startStep = 0;
  if (o.load) {
    const meta = loadCheckpoint(o.load, state, plan, program, rank);
    startStep = meta.step;
  } else {
    // whole tensors, or this rank's pieces of them (tensor and expert parallelism)
    const groupRank = groupRanksOf(plan, rank);
    const byName = new Map(plan.params.map((p) => [p.name, p]));
    rt.initParams(
      seed,
      program.params.map((q) => {
        if (!q.dist) {
          const p = byName.get(q.name)!;
          return { name: p.name, init: p.init, shape: p.shape, shard: p.shape.map((d) => [0, d]) };
        }
        const piece = pieceOf(q.dist, groupRank);
        return {
          name: q.name,
          key: piece.name,
          init: byName.get(piece.name)!.init,
          shape: piece.shape,
          index: piece.index,
        };
      }),
    );
    if (o.weights) loadWeights(o.weights, state);
  }
  const replay = o.batch ? readBatchFile(o.batch) : undefined;
  if (replay && replay.length !== m * dpSize) {
    throw new UserError(
      `${o.batch} holds ${replay.length} microbatches; the plan takes ${m * dpSize} per step (compile with --global-batch-size ${replay.length})`,
    );
  }
  if (o.trainIters <= startStep) {
    throw new UserError(
      `--train-iters ${o.trainIters} is not past the loaded checkpoint's step ${startStep}`,
    );
  }
  const schedule: LrSchedule = {
    lr: o.lr ?? plan.training.optimizer.lr,
    minLr: o.minLr ?? 0,
    warmupIters: o.lrWarmupIters ?? 0,
    decayStyle: o.lrDecayStyle ?? 'constant',
    totalIters: o.trainIters,
  };
  // every rank sees the same global figures: rank 0 writes them
  const metricsPath = rank === 0 ? o.metricsPath : undefined;
  if (metricsPath) mkdirSync(join(metricsPath, '..'), { recursive: true });

  const steps: StepMetrics[] = [];
  for (let step = startStep + 1; step <= o.trainIters; step++) {
    // 1. this rank's microbatches of the global batch
    let mbs: Microbatch[];
    if (replay) mbs = replay.slice(dpIndex * m, (dpIndex + 1) * m);
    else {
      mbs = [];
      for (let j = 0; j < m; j++) {
        rt.synthesize(j, seed, step - 1, dpIndex * m + j, {
          seqLength: plan.training.seqLength * plan.training.microBatchSize,
          vocab,
        });
        mbs.push(rt.getMicrobatch(j));
      }
      if (o.shuffleImages) mbs = shuffleImages(mbs, seed * 1_000_003 + step);
    }
    const captions = mbs.map(captionMask);
    mbs.forEach((mb, j) =>
      userErrors(o.batch ?? 'synthetic data', () =>
        rt.setMicrobatch(j, { ...mb, captionMask: captions[j] }),
      ),
    );
    const [lossTokens, captionTokens, tokens] = await globalSum([
      dataWeight * mbs.reduce((a, mb) => a + countOnes(mb.lossMask), 0),
      dataWeight * captions.reduce((a, c) => a + countOnes(c), 0),
      dataWeight * mbs.reduce((a, mb) => a + mb.tokens.length, 0),
    ]);
    if (lossTokens === 0)
      throw new UserError(
        `step ${step}: the global batch has no loss token (every loss_mask is 0)`,
      );
    // pipeline stages without the loss have no loss scalars
    if ('loss_tokens' in program.scalars) rt.setScalar('loss_tokens', lossTokens);
    if ('caption_tokens' in program.scalars)
      rt.setScalar('caption_tokens', Math.max(1, captionTokens));

    const dumping = o.dumpStep !== undefined && step === startStep + 1;
    if (dumping) dumpBefore(o.dumpStep!, state, mbs);

    // 2. the step
    const lr = lrAt(schedule, step);
    const r = await rt.step({ lr, step });
    const OUTPUTS = ['loss', 'ce_loss', 'aux_loss', 'caption_loss'];
    const sums = await globalSum(
      OUTPUTS.flatMap((name) => {
        const mine = r.outputs.filter((x) => x.name === name);
        return [lossWeight * mine.reduce((a, x) => a + x.value, 0), lossWeight * +!!mine.length];
      }),
    );
    const sum = (name: string) => sums[2 * OUTPUTS.indexOf(name)];
    const has = (name: string) => sums[2 * OUTPUTS.indexOf(name) + 1] > 0;
    const loss = sum('loss');
    const metrics: StepMetrics = {
      step,
      loss,
      ceLoss: has('ce_loss') ? sum('ce_loss') : loss,
      auxLoss: has('aux_loss') ? sum('aux_loss') : 0,
      captionLoss: has('caption_loss') && captionTokens > 0 ? sum('caption_loss') : null,
      gradNorm: Math.sqrt(r.scalars.grad_norm_sq),
      lr,
      tokens,
      lossTokens,
      stepMs: r.stepMs,
      tokensPerSecond: (tokens * 1000) / Math.max(r.stepMs, 1e-3),
      peakRssBytes: process.resourceUsage().maxRSS * 1024,
    };
    steps.push(metrics);
    if (metricsPath) appendFileSync(metricsPath, JSON.stringify(snake(metrics)) + '\n');
    if (dumping) dumpAfter(o.dumpStep!, state, metrics, plan, lossTokens);
    o.onStep?.(metrics);

    // 3. checkpoints: whole tensors, gathered from every rank's share
    const last = step === o.trainIters;
    if (o.save && ((o.saveInterval && step % o.saveInterval === 0) || last)) {
      const meta = { model: plan.model.name, step, seed, dataStep: step, lr: { ...schedule } };
      if (world === 1) saveCheckpoint(o.save, plan, program, state, meta);
      else await saveGathered(o.save, meta, loaded.programs, plan, program, state, rank, globalSum);
    }
  }
  const params = new Map(state.names().map((n) => [n, state.view(n, 'param').slice()]));
  return { steps, finalStep: o.trainIters, plan, params };
}

/**
 * A checkpoint of a multi-rank run: every rank writes its share into `<iter>.shares/` (the save
 * directory must be one every rank reaches: a shared file system across nodes), and rank 0
 * assembles the whole tensors once all have (the world sums are the barriers).
 */
async function saveGathered(
  save: string,
  meta: CheckpointMeta,
  programs: ReadonlyMap<string, ProgramFile>,
  plan: PlanFile,
  program: ProgramFile,
  state: RankState,
  rank: number,
  barrier: (values: number[]) => Promise<number[]>,
): Promise<void> {
  const shares = `${iterDir(save, meta.step)}.shares`;
  const file = (r: number) => join(shares, `rank-${r}.safetensors`);
  if (rank === 0) {
    rmSync(shares, { recursive: true, force: true });
    mkdirSync(shares, { recursive: true });
  }
  await barrier([0]);
  writeFileAtomic(file(rank), serializeSafetensors(rankShare(state, program)));
  await barrier([0]);
  if (rank !== 0) return;
  const whole = assembleCheckpoint(plan, programs, (r) => {
    if (!existsSync(file(r)))
      throw new UserError(
        `--save ${save}: rank ${r}'s share is not in ${shares}; every rank must reach the save directory (a shared file system)`,
      );
    return readSafetensors(file(r)).tensors;
  });
  writeCheckpoint(save, whole, meta);
  rmSync(shares, { recursive: true, force: true });
}

export function snake(m: StepMetrics): Record<string, number | null> {
  return {
    step: m.step,
    loss: m.loss,
    ce_loss: m.ceLoss,
    aux_loss: m.auxLoss,
    caption_loss: m.captionLoss,
    grad_norm: m.gradNorm,
    lr: m.lr,
    tokens: m.tokens,
    loss_tokens: m.lossTokens,
    step_ms: m.stepMs,
    tokens_per_s: m.tokensPerSecond,
    peak_rss_mb: m.peakRssBytes / 2 ** 20,
  };
}

function dumpBefore(dir: string, state: RankState, mbs: readonly Microbatch[]): void {
  mkdirSync(dir, { recursive: true });
  const w = new Map<string, Tensor>();
  for (const n of state.names())
    w.set(n, { dtype: 'F32', shape: state.shape(n), data: state.view(n, 'param').slice() });
  writeSafetensors(join(dir, 'weights.safetensors'), w);
  writeBatchFile(join(dir, 'batch.safetensors'), mbs);
}

function dumpAfter(
  dir: string,
  state: RankState,
  m: StepMetrics,
  plan: PlanFile,
  lossTokens: number,
): void {
  const g = new Map<string, Tensor>();
  for (const n of state.names()) {
    if (state.has(n, 'grad'))
      g.set(n, { dtype: 'F32', shape: state.shape(n), data: state.view(n, 'grad').slice() });
  }
  writeSafetensors(join(dir, 'grads.safetensors'), g);
  const o = plan.training.optimizer;
  writeJsonFile(join(dir, 'step.json'), {
    loss: m.loss,
    ce_loss: m.ceLoss,
    aux_loss: m.auxLoss,
    loss_tokens: lossTokens,
    grad_norm: m.gradNorm,
    optimizer: {
      lr: m.lr,
      beta1: o.beta1,
      beta2: o.beta2,
      eps: o.eps,
      weight_decay: o.weightDecay,
      clip_norm: o.clipNorm,
    },
  });
}

/** Runs fn, turning the native runtime's refusals (a bad program, bad data) into user errors. */
function userErrors<T>(what: string, fn: () => T): T {
  try {
    return fn();
  } catch (e) {
    if (e instanceof UserError) throw e;
    throw new UserError(`${what}: ${(e as Error).message}`);
  }
}

function writeJsonFile(path: string, value: unknown): void {
  writeFileSync(path, JSON.stringify(value, null, 1) + '\n');
}
