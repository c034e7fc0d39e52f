// The training loop of one rank: data in (synthetic or a replayed batch file), the native
// runtime's step, the learning-rate schedule, metrics (JSONL), checkpoints, and the step dump of
// tiny-vlm.md. The CLI (`lfc run`, `lfc demo`) and the tests call train().
//
// A rank of a multi-rank plan (options.rank) connects to the others first, runs the microbatches
// of its data-parallel index (slot j holds global microbatch dpIndex · m + j), and sums over every
// rank what describes the global batch: its loss tokens before the step (the loss is normalized by
// the whole batch's count) and the losses after it, each microbatch counted once
// (launch-rank.ts: speaksForItsData). Checkpoints and the step dump hold whole tensors: every rank
// writes its share to a shared directory and rank 0 assembles them (gatherAtRank0).

import { appendFileSync, existsSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { makeDirs } from '../compiler/files.js';
import { UserError } from '../compiler/errors.js';
import type { ModelConfig } from '../compiler/frontend/config.js';
import type { PlanFile, ProgramFile } from '../compiler/plan/format.js';
import {
  batchTensors,
  captionMask,
  countOnes,
  readBatchFile,
  shuffleImages,
  inContractForm,
  visionOptions,
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
import { imageProcessorOf } from '../compiler/frontend/data-profile.js';
import type { DataCounts, StepData, TrainingPhase } from './data/loader.js';
import { PrefetchingLoader } from './data/prefetch.js';
import type { DataSource } from './data/sampler.js';
import { assembleDump, captureGrads, captureWeights, writeDump, type DumpShare } from './dump.js';
import { loadHfWeights, type HfSource } from './hf/load.js';
import { commConfig, speaksForItsData, type RankContext } from './launch-rank.js';
import { groupRanksOf, pieceOf } from './shard.js';
import {
  loadNative,
  type NativeCommunicatorInfo,
  type NativeRuntime,
  type NativeStepError,
  type NativeStepResult,
  type NativeParamInit,
} from './native.js';
import type { EvalMetrics, StepMetrics } from './metrics.js';
import { readPlan } from './plan-io.js';
import { readSafetensors, serializeSafetensors, writeFileAtomic } from './safetensors.js';
import { lrAt, type LrSchedule } from './schedule.js';
import { RankState } from './state.js';
import { rankTrace, traceFragment, writeRankTrace, writeTrace } from './trace.js';

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
  /** Hugging Face checkpoints over the initializer: every parameter, or the encoder and/or
   * the decoder (runtime/hf/load.ts) */
  readonly loadHf?: readonly HfSource[];
  /** replay this batch file every step instead of the synthetic data */
  readonly batch?: string;
  /** train on datasets instead of the synthetic data (runtime/data/loader.ts) */
  readonly data?: DataOptions;
  /** a run on datasets: each rank writes DIR/rank-R.jsonl, the samples it read each step */
  readonly dataLog?: string;
  /** a run on datasets: every step's data read before the first step (bench/data.ts: the same
   * batches as a run that loads them as it goes, with no loading in the steps) */
  readonly preloadData?: boolean;
  /** a run on datasets: every evalInterval steps (and after the last), the loss of the first
   * evalIters global batches of the validation split, forward only (--eval-interval) */
  readonly evalInterval?: number;
  /** global batches an evaluation reads (--eval-iters; default 10) */
  readonly evalIters?: number;
  readonly onEval?: (e: EvalMetrics) => void;
  /** the control run: images moved across samples */
  readonly shuffleImages?: boolean;
  readonly metricsPath?: string;
  readonly threads?: number;
  /** this process is one rank of a multi-rank run */
  readonly rank?: RankContext;
  readonly onStep?: (m: StepMetrics) => void;
  /** once connected (multi-rank): this rank's communicators and how each moves data */
  readonly onConnected?: (communicators: readonly NativeCommunicatorInfo[]) => void;
  /** each step's per-instruction start/end (ms since the step began, by instruction index), from
   * the runtime's timing option: set only when given (benchmarks) */
  readonly onTiming?: (step: number, perInstruction: NativeStepResult['perInstruction']) => void;
  /** write the last step's timeline here as a Chrome trace (runtime/trace.ts); a rank of a
   * multi-rank run writes its fragment beside it, for the launcher to merge */
  readonly trace?: string;
}

/** The data of a run on datasets: lfc run's --data-path and the flags beside it. */
export interface DataOptions {
  readonly sources: readonly DataSource[];
  /** train, valid, test proportions (--split) */
  readonly split: readonly [number, number, number];
  /** a tokenizer.json, or a directory holding it (--tokenizer-model) */
  readonly tokenizer: string;
  readonly phase: TrainingPhase;
  readonly truncate?: boolean;
  readonly strict?: boolean;
}

export type { EvalMetrics, StepMetrics } from './metrics.js';

export interface TrainResult {
  readonly steps: StepMetrics[];
  readonly evals: EvalMetrics[];
  readonly finalStep: number;
  readonly plan: PlanFile;
  /** parameters after the run, whole tensors */
  readonly params: Map<string, Float32Array>;
  /** a run on datasets: what this rank's loader met (bad, dropped, shrunk samples) */
  readonly data?: DataCounts;
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
  const programId = plan.rankPrograms[rank];
  const program = loaded.programs.get(programId)!;
  const native = loadNative();
  const model = plan.model.config as unknown as ModelConfig['model'];
  const dpIndex = plan.dataParallel?.rankIndex[rank] ?? 0;
  const dpSize = plan.dataParallel?.size ?? 1;
  const seed = o.seed ?? 1234;
  const m = plan.training.numMicrobatches;
  const padded = plan.training.seqLength * plan.training.microBatchSize;
  const loader = o.data ? await openLoader(o, o.data, plan, program, dpIndex, seed) : undefined;
  if (o.evalInterval !== undefined && !o.data)
    throw new UserError(
      '--eval-interval evaluates on the validation split of --data-path; this run has no --data-path',
    );
  if (o.evalInterval !== undefined && o.data && !(o.data.split[1] > 0))
    throw new UserError(
      `--eval-interval needs a validation split: the split gives it nothing (train ${+(100 * o.data.split[0]).toFixed(2)}%, test ${+(100 * o.data.split[2]).toFixed(2)}%); e.g. --split 98,2,0`,
    );
  const evalLoader =
    o.evalInterval !== undefined && o.data
      ? await openLoader(o, o.data, plan, program, dpIndex, seed, 'valid')
      : undefined;
  const replay = o.batch ? readBatchFile(o.batch) : undefined;
  // the model's image token follows the tokenizer's placeholder, or a replayed batch's
  const batchToken = replay?.find((mb) => mb.imageTokenId !== undefined)?.imageTokenId;
  const vision = {
    ...visionOptions(model),
    ...(loader?.image ? { imageTokenId: loader.image.id } : {}),
    ...(batchToken !== undefined ? { imageTokenId: batchToken } : {}),
  };
  // the runtime validates the program before anything runs; a bad program is the user's file
  const rt: NativeRuntime = userErrors(
    join(o.planDir, 'programs', `${programId}.json`),
    () =>
      new native.Runtime(loaded.programTexts.get(programId)!, {
        threads: o.threads,
        ...vision,
        collectives: o.rank !== undefined,
        timing: o.onTiming !== undefined || o.trace !== undefined,
        symbols: plan.symbols,
      }),
  );
  if (o.rank) {
    const r = o.rank;
    await rt.connect(commConfig(plan, loaded.programs, r)).catch((e: Error) => {
      throw new UserError(`rank ${r.rank}: ${e.message}`);
    });
    o.onConnected?.(rt.info().communicators ?? []);
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
  const state = new RankState(program, rt);
  const vocab = (plan.model.config as { text_decoder: { vocab_size: number } }).text_decoder
    .vocab_size;

  // parameters: a checkpoint, given weights, or the deterministic initializer
  let startStep = 0;
  if (o.load) {
    const meta = loadCheckpoint(o.load, state, plan, program, rank);
    startStep = meta.step;
    if (loader) {
      if (!meta.data)
        throw new UserError(
          `--load ${o.load}: a checkpoint of a run on synthetic data has no data position; start the run on --data-path without --load, or from its weights (--weights)`,
        );
      await loader.seek(meta.data.position);
    }
  } else {
    // whole tensors, or this rank's pieces of them (tensor and expert parallelism)
    const groupRank = groupRanksOf(plan, rank);
    const byName = new Map(plan.params.map((p) => [p.name, p]));
    const planPath = join(o.planDir, 'plan.json');
    const planParam = (name: string) => {
      const p = byName.get(name);
      if (!p) throw new UserError(`${planPath}: param ${name} of the program is not in params`);
      return p;
    };
    const inits = program.params.map((q): NativeParamInit => {
      if (!q.dist) {
        const p = planParam(q.name);
        return { name: p.name, init: p.init, shape: p.shape, shard: p.shape.map((d) => [0, d]) };
      }
      const piece = pieceOf(q.dist, groupRank);
      return {
        name: q.name,
        key: piece.name,
        init: planParam(piece.name).init,
        shape: piece.shape,
        index: piece.index,
      };
    });
    // the plan's params against the program's buffers: a mismatch is the plan's
    userErrors(planPath, () => rt.initParams(seed, inits));
    if (o.weights) loadWeights(o.weights, state);
    // this rank's pieces of a Hugging Face checkpoint, over the init of what it does not load
    if (o.loadHf?.length) loadHfWeights(o.loadHf, state, plan, program, rank);
    // mixed precision: the distributed optimizer's fp32 master slices from those parameters
    state.initShardMasters(groupRank);
  }
  if (loader && (o.batch || o.shuffleImages))
    throw new UserError(
      `--data-path and ${o.batch ? '--batch' : '--shuffle-images'} both choose the data; give one (the control of a dataset is a copy with its images shuffled, as lfc demo makes)`,
    );
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
  if (metricsPath) makeDirs(join(metricsPath, '..'));

  // mock slots that encode under the ViT balance (their data slots follow the real ones): an
  // empty microbatch, no text and no image, the same every step
  const dataSlots = Math.max(m, ...program.inputs.map((i) => i.microbatch + 1));
  for (let j = m; j < dataSlots; j++)
    rt.setMicrobatch(j, {
      tokens: new Int32Array(padded),
      labels: new Int32Array(padded),
      lossMask: new Uint8Array(padded),
      positions: new Int32Array(padded * (vision.positionRows ?? 1)),
      segments: new Int32Array(padded).fill(-1),
      images: [],
      captionMask: new Uint8Array(padded),
    });
  /** The microbatches into the runtime, and the global batch's token counts as its scalars. */
  const setBatch = async (mbs: readonly Microbatch[], what: string) => {
    const captions = mbs.map((mb) => mb.captionMask ?? captionMask(mb));
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
      throw new UserError(`${what}: the global batch has no loss token (every loss_mask is 0)`);
    // pipeline stages without the loss have no loss scalars
    if ('loss_tokens' in program.scalars) rt.setScalar('loss_tokens', lossTokens);
    if ('caption_tokens' in program.scalars)
      rt.setScalar('caption_tokens', Math.max(1, captionTokens));
    return { lossTokens, captionTokens, tokens };
  };
  /** The program's outputs summed over the ranks that speak for them. */
  const outputSums = async (r: NativeStepResult) => {
    // the ViT balance's count is the same on every rank of a balancing group, and rank 0's
    // groups see every image: rank 0 speaks for it
    const OUTPUTS = ['loss', 'ce_loss', 'aux_loss', 'caption_loss', 'vit_images_moved'];
    const sums = await globalSum(
      OUTPUTS.flatMap((name) => {
        const weight = name === 'vit_images_moved' ? +(rank === 0) : lossWeight;
        const mine = r.outputs.filter((x) => x.name === name);
        return [weight * mine.reduce((a, x) => a + x.value, 0), weight * +!!mine.length];
      }),
    );
    return {
      sum: (name: string) => sums[2 * OUTPUTS.indexOf(name)],
      has: (name: string) => sums[2 * OUTPUTS.indexOf(name) + 1] > 0,
    };
  };
  /** The validation loss after a step: the first evalIters global batches, forward only. */
  const evalIters = o.evalIters ?? 10;
  const evals: EvalMetrics[] = [];
  const evaluate = async (after: number): Promise<void> => {
    await evalLoader!.seek(0);
    let loss = 0;
    let ceLoss = 0;
    let captionLoss = 0;
    let captioned = 0;
    let lossTokens = 0;
    for (let k = 0; k < evalIters; k++) {
      const d = await evalLoader!.nextStep();
      const what = `the evaluation after step ${after}, batch ${k + 1}`;
      const counts = await setBatch(d.microbatches, what);
      const r = await rt
        .step({ lr: 0, step: Math.max(1, after), forwardOnly: true })
        .catch((e: NativeStepError) => {
          throw stepError(e, plan, after);
        });
      const { sum, has } = await outputSums(r);
      loss += sum('loss');
      ceLoss += has('ce_loss') ? sum('ce_loss') : sum('loss');
      if (has('caption_loss') && counts.captionTokens > 0) {
        captionLoss += sum('caption_loss');
        captioned++;
      }
      lossTokens += counts.lossTokens;
    }
    const e: EvalMetrics = {
      step: after,
      loss: loss / evalIters,
      ceLoss: ceLoss / evalIters,
      captionLoss: captioned ? captionLoss / captioned : null,
      batches: evalIters,
      lossTokens,
    };
    evals.push(e);
    if (metricsPath) appendFileSync(metricsPath, JSON.stringify(evalLine(e)) + '\n');
    o.onEval?.(e);
  };
  const steps: StepMetrics[] = [];
  // a run on datasets: the next step's data is read while this step runs (decoded whole for the
  // step dump, which holds every image); its failure surfaces where it is awaited, not as an
  // unhandled rejection meanwhile. preloadData: every step's data read first, then served.
  const prefetch = (decodeAll = false) => {
    const p = loader!.nextStep({ decodeAll });
    p.catch(() => undefined);
    return p;
  };
  const preloaded: StepData[] = [];
  if (loader && o.preloadData)
    for (let step = startStep + 1; step <= o.trainIters; step++)
      preloaded.push(await prefetch(!!o.dumpStep && step === startStep + 1));
  const following = (step: number): Promise<StepData> | undefined => {
    if (o.preloadData) return preloaded.length ? Promise.resolve(preloaded.shift()!) : undefined;
    return step < o.trainIters ? prefetch(step === startStep && !!o.dumpStep) : undefined;
  };
  let nextData = loader ? following(startStep) : undefined;
  for (let step = startStep + 1; step <= o.trainIters; step++) {
    // 1. this rank's microbatches of the global batch
    let mbs: Microbatch[];
    let data: StepData | undefined;
    if (nextData) {
      data = await nextData;
      mbs = data.microbatches;
      if (o.dataLog) {
        makeDirs(o.dataLog);
        appendFileSync(
          join(o.dataLog, `rank-${rank}.jsonl`),
          JSON.stringify({ step, replica: dpIndex, samples: data.samples }) + '\n',
        );
      }
      nextData = following(step);
    } else if (replay) mbs = replay.slice(dpIndex * m, (dpIndex + 1) * m);
    else {
      // the control moves images across the whole global batch: each rank synthesizes all of it
      // (a pure function of seed, step and index), shuffles it alike, and keeps its own share
      const first = o.shuffleImages ? 0 : dpIndex * m;
      const count = o.shuffleImages ? m * dpSize : m;
      mbs = [];
      for (let g = first; g < first + count; g++) {
        rt.synthesize(g % m, seed, step - 1, g, {
          seqLength: plan.training.seqLength * plan.training.microBatchSize,
          vocab,
          // the plan's bound, not this program's buffers: a rank that does not encode a
          // microbatch (encoder levels 2, 3) has no patches buffer for it, and must see the
          // same data as the rank that does
          maxVisualTokens: plan.training.maxVisualTokens,
        });
        mbs.push(rt.getMicrobatch(g % m));
      }
      if (o.shuffleImages)
        mbs = shuffleImages(mbs, seed * 1_000_003 + step).slice(dpIndex * m, (dpIndex + 1) * m);
    }
    const { lossTokens, captionTokens, tokens } = await setBatch(mbs, `step ${step}`);

    const dumping = o.dumpStep !== undefined && step === startStep + 1;
    const dumpShare = dumping ? captureWeights(state) : undefined;

    // 2. the step
    const lr = lrAt(schedule, step);
    const r = await rt.step({ lr, step }).catch((e: NativeStepError) => {
      throw stepError(e, plan, step);
    });
    o.onTiming?.(step, r.perInstruction);
    if (o.trace && step === o.trainIters) {
      const part = rankTrace(plan, program, rank, step, r.startWallMs!, r.perInstruction ?? []);
      if (world === 1) writeTrace(o.trace, [part], { plan: o.planDir, model: plan.model.name });
      else writeRankTrace(traceFragment(o.trace, rank), part);
    }
    const { sum, has } = await outputSums(r);
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
      deviceHighBytes: r.memory.deviceHighBytes,
      scratchHighBytes: Object.values(r.memory.scratchHighBytes).reduce((a, b) => a + b, 0),
      ...(has('vit_images_moved') ? { vitImagesMoved: sum('vit_images_moved') } : {}),
      ...(data ? { dataPosition: data.endPosition } : {}),
    };
    steps.push(metrics);
    if (metricsPath) appendFileSync(metricsPath, JSON.stringify(snake(metrics)) + '\n');
    if (dumpShare) {
      captureGrads(dumpShare, state, program, groupRanksOf(plan, rank));
      // the Qwen presets' batch in the contract's form (patches, grids, windows)
      const contract = (vision.temporalPatch ?? 1) > 1;
      const dumped = contract ? mbs.map((mb) => inContractForm(mb, vision, native)) : mbs;
      const share = { rank, dpIndex, dumpShare, mbs: dumped };
      await dumpGathered(o.dumpStep!, metrics, lossTokens, loaded.programs, plan, share, globalSum);
    }
    o.onStep?.(metrics);
    if (evalLoader && (step % o.evalInterval! === 0 || step === o.trainIters)) await evaluate(step);

    // 3. checkpoints: whole tensors, gathered from every rank's share
    const last = step === o.trainIters;
    if (o.save && ((o.saveInterval && step % o.saveInterval === 0) || last)) {
      const meta = {
        model: plan.model.name,
        step,
        seed,
        dataStep: step,
        lr: { ...schedule },
        ...(data && o.data
          ? { data: { position: data.endPosition, sources: o.data.sources.map((s) => s.path) } }
          : {}),
      };
      if (world === 1) saveCheckpoint(o.save, plan, program, state, meta);
      else await saveGathered(o.save, meta, loaded.programs, plan, program, state, rank, globalSum);
    }
  }
  const params = new Map(state.names().map((n) => [n, state.read(n, 'param')]));
  const counts = loader ? await loader.counts() : undefined;
  await loader?.close();
  await evalLoader?.close();
  return {
    steps,
    evals,
    finalStep: o.trainIters,
    plan,
    params,
    ...(counts ? { data: counts } : {}),
  };
}

/**
 * This rank's loader, in its worker thread: the plan's microbatch sizes, its replica's share of
 * the global batch, and the slots whose images its program encodes (the others get their grids
 * alone).
 */
async function openLoader(
  o: TrainOptions,
  d: DataOptions,
  plan: PlanFile,
  program: ProgramFile,
  replica: number,
  seed: number,
  part: 'train' | 'valid' = 'train',
): Promise<PrefetchingLoader> {
  const model = plan.model.config as unknown as ModelConfig['model'];
  const m = plan.training.numMicrobatches;
  return PrefetchingLoader.open({
    sources: d.sources,
    split: d.split,
    part,
    tokenizer: d.tokenizer,
    phase: d.phase,
    seed: o.seed ?? seed,
    bounds: {
      seqLength: plan.training.seqLength * plan.training.microBatchSize,
      maxVisualTokens: plan.training.maxVisualTokens,
    },
    globalMicrobatches: m * (plan.dataParallel?.size ?? 1),
    perReplica: m,
    replica,
    processor: imageProcessorOf(model.image_encoder),
    vocabSize: model.text_decoder.vocab_size,
    encodes: Array.from({ length: m }, (_, slot) =>
      program.inputs.some((i) => i.microbatch === slot && i.name === 'patches'),
    ),
    rope: model.text_decoder.mrope_section.length > 1,
    truncate: d.truncate,
    strict: d.strict,
  });
}

/**
 * A step that failed in a collective: a check on this rank, or another rank's failure, which the
 * message names with its check. The run's failure rather than lfc's, so one line and exit code 1.
 */
export class StepFailure extends UserError {
  readonly exitCode = 1;
}

/**
 * A failed step as the run reports it. More rows than a run-time symbol's bound (an expert
 * dispatch past its planned imbalance): a user error saying which bound and how to raise it (the
 * symbol's doc). A failed collective: StepFailure (exit 1). An instruction the runtime refused
 * (its operands against the data or the program): a user error. Other errors as they are.
 */
function stepError(e: NativeStepError, plan: PlanFile, step: number): Error {
  const m = /past the bound \d+ of (\w+)|the bound of its out_rows (\w+)/.exec(e.message);
  const name = m?.[1] ?? m?.[2];
  const symbol = name === undefined ? undefined : plan.symbols.find((s) => s.name === name);
  if (symbol)
    return new UserError(
      `step ${step}: ${e.message}: ${symbol.doc}; compile the plan again with a larger bound`,
    );
  // a collective that failed (a check on this rank, or another rank's failure): exit 1
  if (e.collective) return new StepFailure(`step ${step}: ${e.message}`);
  // the runtime's checks of an instruction's operands against the step's data and the program
  // (an id outside a table, operands whose sizes disagree): the user's data or plan, one line
  if (/^step( failed at|:)/.test(e.message)) return new UserError(`step ${step}: ${e.message}`);
  return e;
}

/**
 * Every rank's files into `dir` (one every rank reaches: a shared file system across nodes);
 * then, on rank 0 only, the path of a file by name. The world sums are the barriers.
 */
async function gatherAtRank0(
  dir: string,
  rank: number,
  files: ReadonlyMap<string, Buffer>,
  barrier: (values: number[]) => Promise<number[]>,
  flag: string,
): Promise<((name: string) => string) | undefined> {
  if (rank === 0) {
    rmSync(dir, { recursive: true, force: true });
    makeDirs(dir);
  }
  await barrier([0]);
  for (const [name, data] of files) writeFileAtomic(join(dir, name), data);
  await barrier([0]);
  if (rank !== 0) return undefined;
  return (name) => {
    const path = join(dir, name);
    if (!existsSync(path))
      throw new UserError(
        `${flag}: ${name} is not in ${dir}; every rank must reach that directory (a shared file system)`,
      );
    return path;
  };
}

/** A checkpoint of a multi-rank run: every rank's share, assembled by rank 0. */
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
  const file = (r: number) => `rank-${r}.safetensors`;
  const mine = new Map([[file(rank), serializeSafetensors(rankShare(state, program))]]);
  const path = await gatherAtRank0(shares, rank, mine, barrier, `--save ${save}`);
  if (!path) return;
  // read-only shares: the file's bytes, not copies
  const whole = assembleCheckpoint(
    plan,
    programs,
    (r) => readSafetensors(path(file(r)), true).tensors,
  );
  writeCheckpoint(save, whole, meta);
  rmSync(shares, { recursive: true, force: true });
}

/**
 * The step dump (runtime/dump.ts), written once: on one rank from its own share; on several by
 * rank 0, from every rank's share and each data-parallel index's microbatches (sent by its lowest
 * rank).
 */
async function dumpGathered(
  dir: string,
  metrics: StepMetrics,
  lossTokens: number,
  programs: ReadonlyMap<string, ProgramFile>,
  plan: PlanFile,
  mine: { rank: number; dpIndex: number; dumpShare: DumpShare; mbs: readonly Microbatch[] },
  barrier: (values: number[]) => Promise<number[]>,
): Promise<void> {
  if (plan.topology.worldSize === 1) {
    const dump = assembleDump(
      plan,
      programs,
      () => mine.dumpShare,
      () => mine.mbs,
    );
    writeDump(dir, dump, metrics, plan, lossTokens);
    return;
  }
  const shares = join(dir, '.shares');
  const share = (r: number) => `rank-${r}.safetensors`;
  const batch = (d: number) => `batch-${d}.safetensors`;
  const files = new Map([[share(mine.rank), serializeSafetensors(mine.dumpShare)]]);
  if (plan.dataParallel.rankIndex.indexOf(mine.dpIndex) === mine.rank)
    files.set(batch(mine.dpIndex), serializeSafetensors(batchTensors(mine.mbs)));
  const path = await gatherAtRank0(shares, mine.rank, files, barrier, `--dump-step ${dir}`);
  if (!path) return;
  const dump = assembleDump(
    plan,
    programs,
    (r) => readSafetensors(path(share(r))).tensors,
    (d) => readBatchFile(path(batch(d))),
  );
  writeDump(dir, dump, metrics, plan, lossTokens);
  rmSync(shares, { recursive: true, force: true });
}

/** An evaluation's line in the metrics file (beside the steps' lines, which have `step`). */
export function evalLine(e: EvalMetrics): Record<string, number | null> {
  return {
    eval_after_step: e.step,
    validation_loss: e.loss,
    validation_ce_loss: e.ceLoss,
    validation_caption_loss: e.captionLoss,
    validation_batches: e.batches,
    validation_loss_tokens: e.lossTokens,
  };
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
    device_high_bytes: m.deviceHighBytes,
    scratch_high_bytes: m.scratchHighBytes,
    ...(m.vitImagesMoved === undefined ? {} : { vit_images_moved: m.vitImagesMoved }),
  };
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
