// The training loop of one rank: data in (synthetic or a replayed batch file), the native
// runtime's step, the learning-rate schedule, metrics (JSONL), checkpoints, and the step dump of
// tiny-vlm.md. The CLI (`lfc run`, `lfc demo`) and the tests call train().

import { appendFileSync, mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { UserError } from '../compiler/errors.js';
import type { PlanFile } from '../compiler/plan/format.js';
import {
  captionMask,
  countOnes,
  readBatchFile,
  shuffleImages,
  writeBatchFile,
  type Microbatch,
} from './batch.js';
import { loadCheckpoint, loadWeights, saveCheckpoint } from './checkpoint.js';
import { loadNative, type NativeRuntime } from './native.js';
import { readPlan } from './plan-io.js';
import { writeSafetensors, type Tensor } from './safetensors.js';
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
  if (plan.topology.worldSize !== 1) {
    throw new UserError(
      `${o.planDir} is a plan for ${plan.topology.worldSize} ranks; this runner runs one rank`,
    );
  }
  const programId = plan.rankPrograms[0];
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
      }),
  );
  const state = new RankState(program, rt);
  const seed = o.seed ?? 1234;
  const m = plan.training.numMicrobatches;
  const vocab = (plan.model.config as { text_decoder: { vocab_size: number } }).text_decoder
    .vocab_size;

  // parameters: a checkpoint, given weights, or the deterministic initializer
  let startStep = 0;
  if (o.load) {
    const meta = loadCheckpoint(o.load, state, plan.model.name);
    startStep = meta.step;
  } else {
    rt.initParams(
      seed,
      plan.params.map((p) => ({
        name: p.name,
        init: p.init,
        shape: p.shape,
        shard: p.shape.map((d) => [0, d]),
      })),
    );
    if (o.weights) loadWeights(o.weights, state);
  }
  const replay = o.batch ? readBatchFile(o.batch) : undefined;
  if (replay && replay.length !== m) {
    throw new UserError(
      `${o.batch} holds ${replay.length} microbatches; the plan takes ${m} per step (compile with --global-batch-size ${replay.length})`,
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
  if (o.metricsPath) mkdirSync(join(o.metricsPath, '..'), { recursive: true });

  const steps: StepMetrics[] = [];
  for (let step = startStep + 1; step <= o.trainIters; step++) {
    // 1. the global batch of this step
    let mbs: Microbatch[];
    if (replay) mbs = replay;
    else {
      mbs = [];
      for (let j = 0; j < m; j++) {
        rt.synthesize(j, seed, step - 1, j, {
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
    const lossTokens = mbs.reduce((a, mb) => a + countOnes(mb.lossMask), 0);
    if (lossTokens === 0)
      throw new UserError(
        `step ${step}: the global batch has no loss token (every loss_mask is 0)`,
      );
    const captionTokens = captions.reduce((a, c) => a + countOnes(c), 0);
    rt.setScalar('loss_tokens', lossTokens);
    if ('caption_tokens' in program.scalars)
      rt.setScalar('caption_tokens', Math.max(1, captionTokens));

    const dumping = o.dumpStep !== undefined && step === startStep + 1;
    if (dumping) dumpBefore(o.dumpStep!, state, mbs);

    // 2. the step
    const lr = lrAt(schedule, step);
    const r = await rt.step({ lr, step });
    const sum = (name: string) =>
      r.outputs.filter((x) => x.name === name).reduce((a, x) => a + x.value, 0);
    const has = (name: string) => r.outputs.some((x) => x.name === name);
    const loss = sum('loss');
    const metrics: StepMetrics = {
      step,
      loss,
      ceLoss: has('ce_loss') ? sum('ce_loss') : loss,
      auxLoss: has('aux_loss') ? sum('aux_loss') : 0,
      captionLoss: has('caption_loss') && captionTokens > 0 ? sum('caption_loss') : null,
      gradNorm: Math.sqrt(r.scalars.grad_norm_sq),
      lr,
      tokens: mbs.reduce((a, mb) => a + mb.tokens.length, 0),
      lossTokens,
      stepMs: r.stepMs,
      tokensPerSecond:
        (mbs.reduce((a, mb) => a + mb.tokens.length, 0) * 1000) / Math.max(r.stepMs, 1e-3),
    };
    steps.push(metrics);
    if (o.metricsPath) appendFileSync(o.metricsPath, JSON.stringify(snake(metrics)) + '\n');
    if (dumping) dumpAfter(o.dumpStep!, state, metrics, plan, lossTokens);
    o.onStep?.(metrics);

    // 3. checkpoints
    const last = step === o.trainIters;
    if (o.save && ((o.saveInterval && step % o.saveInterval === 0) || last)) {
      saveCheckpoint(o.save, state, {
        model: plan.model.name,
        step,
        seed,
        dataStep: step,
        lr: { ...schedule },
      });
    }
  }
  const params = new Map(state.names().map((n) => [n, state.view(n, 'param').slice()]));
  return { steps, finalStep: o.trainIters, plan, params };
}

function snake(m: StepMetrics): Record<string, number | null> {
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
