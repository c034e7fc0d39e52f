// The compiler pipeline: the ordered list of passes, and compile() that runs them and emits the
// plan. Each pass is a pure function of its input; with `dumpAfter` the IR after that pass is
// printed. The verifier runs after every graph pass.
//
//   1 build      forward graph of one microbatch from the model config
//   2 autodiff   backward (dgrad/wgrad split), gradient accumulation, clipping + AdamW
//   3 emit       one program per rank: schedule (forward then backward per microbatch, then the
//                optimizer step), streams, buffers, memory plan
//   4 verify     the emitted plan: memory reuse checker, then the plan verifier over all ranks
//                (compiler/verify: collectives, send/recv, events, a symbolic run to the end)

import { mkdirSync, renameSync, rmSync, writeFileSync, existsSync, readdirSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';
import type { Graph } from '../ir/graph.js';
import { formatNode, printGraph } from '../ir/printer.js';
import { assertValid } from '../ir/verify.js';
import {
  autodiff,
  DEFAULT_OPTIMIZER,
  weightDecayOf,
  type OptimizerSettings,
} from '../passes/autodiff.js';
import { ExpertParallelError, expertParallel } from '../passes/parallel/expert.js';
import { PipelineError, splitPipeline, type PipelineSplit } from '../passes/parallel/pipeline.js';
import { TensorParallelError, tensorParallel } from '../passes/parallel/tensor.js';
import { UserError } from './errors.js';
import { forwardCosts } from './schedule/costs.js';
import { partitionPipeline, type PipelineLayout } from './schedule/partition.js';
import { schedule1F1B, scheduleInterleaved } from './schedule/pipeline.js';
import { buildForwardGraph } from './frontend/build.js';
import { loadModelConfig, type DecoderConfig, type ModelConfig } from './frontend/config.js';
import { countParams } from './inspect.js';
import { resolveSizes, type ParallelSizes } from './parallel/sizes.js';
import { validateParallel } from './parallel/validate.js';
import { buildTopology, GROUP_KINDS } from './parallel/topology.js';
import { encoderPlacement, isEncoderScope, type EncoderPlacement } from './parallel/encoder.js';
import { encoderDataParallel } from '../passes/parallel/encoder.js';
import { vitDpBalance } from '../passes/parallel/vit-balance.js';
import { checkMemoryReuse } from './plan/check-memory.js';
import { assertPlanValid } from './verify/plan-verifier.js';
import { emitProgram } from './plan/emit.js';
import { activationPolicyOf } from './plan/activations.js';
import { PLAN_FORMAT, PLAN_VERSION, type PlanFile, type ProgramFile } from './plan/format.js';

export interface PassInfo {
  readonly name: string;
  readonly summary: string;
}

export const PASSES: readonly PassInfo[] = [
  { name: 'build', summary: 'forward graph of one microbatch from the model config' },
  { name: 'expert-parallel', summary: 'experts split over ep, all-to-all dispatch and combine' },
  {
    name: 'tensor-parallel',
    summary: 'column/row-parallel linears, heads, vocabulary-parallel embedding and loss, SP',
  },
  {
    name: 'encoder-data-parallel',
    summary: 'encoder gradients summed over the ranks that encode distinct data (levels 2, 3)',
  },
  {
    name: 'vit-dp-balance',
    summary: 'images pooled over the encoder gradient group, encoded by cost, tokens sent home',
  },
  { name: 'autodiff', summary: 'backward graph, gradient accumulation, clipping and AdamW' },
  { name: 'pipeline', summary: 'every node to its virtual stage; values that cross stages' },
];

export interface EncoderOptions {
  /** --enable-encoder-hetero-dp (level 2) */
  readonly heteroDp?: boolean;
  /** --enable-full-hetero-dp (level 3) */
  readonly fullHeteroDp?: boolean;
  /** --full-hetero-dp-cpu-offload: level 3's encoder outputs wait on the host */
  readonly cpuOffload?: boolean;
  /** --full-hetero-dp-encoder-recompute: level 3 drops encoder activations, recomputes them */
  readonly recompute?: boolean;
  /** --use-vit-dp-balance */
  readonly vitDpBalance?: boolean;
}

export interface CompileOptions {
  readonly model: string;
  readonly overrides?: readonly string[];
  readonly seqLength?: number;
  readonly microBatchSize?: number;
  readonly globalBatchSize?: number;
  readonly maxVisualTokens?: number;
  readonly nnodes?: number;
  readonly nprocPerNode?: number;
  /** parallel sizes beyond the cluster shape (tp, pp, vpp, ep, etp, cp); default 1 each */
  readonly parallel?: Partial<Omit<ParallelSizes, 'nnodes' | 'nprocPerNode'>>;
  readonly sequenceParallel?: boolean;
  readonly microbatchGroupSize?: number;
  readonly decoderFirstPipelineNumLayers?: number;
  readonly decoderLastPipelineNumLayers?: number;
  /** --use-distributed-optimizer */
  readonly distributedOptimizer?: boolean;
  readonly optimizer?: Partial<OptimizerSettings>;
  /** the encoder levels (DESIGN.md "Parallel topology"); level 1 follows from the encoder's TP */
  readonly encoder?: EncoderOptions;
  /** --overlap-moe-expert-parallel-comm / --delay-wgrad-compute */
  readonly moeOverlap?: { readonly overlap?: boolean; readonly delayWgrad?: boolean };
  /** --recompute-granularity / --recompute-modules */
  readonly recompute?: {
    readonly granularity: 'full' | 'selective';
    readonly modules?: readonly string[];
  };
  /** --fine-grained-activation-offloading --offload-tensors … */
  readonly offloadTensors?: readonly string[];
  /** --moe-expert-capacity-factor (default: model.text_decoder.moe_expert_capacity_factor) */
  readonly moeExpertCapacityFactor?: number;
  /** --moe-token-drop-policy (default: model.text_decoder.moe_token_drop_policy) */
  readonly moeTokenDropPolicy?: DecoderConfig['moe_token_drop_policy'];
  /** print the IR after this pass */
  readonly dumpAfter?: string;
  readonly onDump?: (text: string) => void;
}

export interface CompileResult {
  readonly config: ModelConfig;
  readonly graph: Graph;
  readonly plan: PlanFile;
  readonly programs: readonly ProgramFile[];
  /** the pipeline partition (pp > 1) */
  readonly layout?: PipelineLayout;
  /** where the encoder runs (compiler/parallel/encoder.ts) */
  readonly placement: EncoderPlacement;
  readonly stats: Record<string, Record<string, number>>;
}

export function compile(o: CompileOptions): CompileResult {
  if (o.dumpAfter !== undefined && !PASSES.some((p) => p.name === o.dumpAfter)) {
    throw new UserError(
      `--dump-after ${o.dumpAfter}: no such pass; passes: ${PASSES.map((p) => p.name).join(', ')}`,
    );
  }
  const cfg = withTokenDropping(loadModelConfig(o.model, o.overrides ?? []), o);
  const seqLength = o.seqLength ?? cfg.training.seq_length;
  const mbs = o.microBatchSize ?? 1;
  const sizes: ParallelSizes = {
    nnodes: o.nnodes ?? 1,
    nprocPerNode: o.nprocPerNode ?? 1,
    tp: o.parallel?.tp ?? 1,
    pp: o.parallel?.pp ?? 1,
    vpp: o.parallel?.vpp ?? 1,
    ep: o.parallel?.ep ?? 1,
    etp: o.parallel?.etp,
    cp: o.parallel?.cp ?? 1,
    encoderTp: cfg.model.image_encoder.tensor_model_parallel_size,
  };
  const { world, dp } = resolveSizes(sizes);
  const gbs = o.globalBatchSize ?? mbs * Math.max(1, Math.floor(dp));
  // every layout rule, each with its own message (compiler/parallel/validate.ts)
  validateParallel({
    sizes,
    config: cfg,
    seqLength,
    microBatchSize: mbs,
    globalBatchSize: gbs,
    microbatchGroupSize: o.microbatchGroupSize,
    decoderFirstPipelineNumLayers: o.decoderFirstPipelineNumLayers,
    decoderLastPipelineNumLayers: o.decoderLastPipelineNumLayers,
    sequenceParallel: o.sequenceParallel,
    encoder: o.encoder,
    moeOverlap: o.moeOverlap,
    recompute: o.recompute,
    offloadTensors: o.offloadTensors,
  });
  if ((sizes.etp ?? sizes.tp) !== sizes.tp)
    throw new UserError(
      `--expert-tensor-parallel-size ${sizes.etp} differs from --tp ${sizes.tp}; only expert TP equal to TP is built`,
    );
  const topology = buildTopology(sizes);
  const ranks = Array.from({ length: world }, (_, r) => r);
  const numMicrobatches = gbs / (mbs * dp);
  // where the encoder runs and whose gradients it sums (compiler/parallel/encoder.ts)
  const placement = encoderPlacement({
    tp: sizes.tp,
    pp: sizes.pp,
    encoderTp: sizes.encoderTp!,
    heteroDp: o.encoder?.heteroDp,
    fullHeteroDp: o.encoder?.fullHeteroDp,
    microbatches: numMicrobatches,
  });
  const optimizer = { ...DEFAULT_OPTIMIZER, ...o.optimizer };
  const dump = (pass: string, g: Graph) => {
    if (o.dumpAfter === pass) o.onDump?.(printGraph(g));
  };
  const passError = (e: unknown): never => {
    if (
      e instanceof TensorParallelError ||
      e instanceof ExpertParallelError ||
      e instanceof PipelineError
    )
      throw new UserError(e.message);
    throw e;
  };

  // the auxiliary loss is a mean over every microbatch of the global batch (all replicas)
  const forward = buildForwardGraph(cfg, {
    seqLength,
    microBatchSize: mbs,
    maxVisualTokens: o.maxVisualTokens,
    numMicrobatches: gbs / mbs,
  });
  assertValid(forward, 'after pass build');
  dump('build', forward);
  let sharded = forward;
  try {
    sharded = expertParallel(sharded, { ep: sizes.ep });
    assertValid(sharded, 'after pass expert-parallel');
    dump('expert-parallel', sharded);
    sharded = tensorParallel(sharded, {
      tp: sizes.tp,
      sequenceParallel: o.sequenceParallel ?? false,
      encoderTp: placement.encoderTp,
    });
    assertValid(sharded, 'after pass tensor-parallel');
    dump('tensor-parallel', sharded);
    sharded = encoderDataParallel(sharded, placement);
    assertValid(sharded, 'after pass encoder-data-parallel');
    dump('encoder-data-parallel', sharded);
    if (o.encoder?.vitDpBalance) {
      const group = placement.gradGroup;
      const merge = cfg.model.image_encoder.spatial_merge_size ** 2;
      const groupSize = { dp, tp_dp_cp: world / sizes.pp, world }[group];
      sharded = vitDpBalance(sharded, { group, groupSize, merge });
      assertValid(sharded, 'after pass vit-dp-balance');
    }
    dump('vit-dp-balance', sharded);
  } catch (e) {
    passError(e);
  }
  const { graph, stats: adStats } = autodiff(sharded, optimizer);
  assertValid(
    graph,
    'after pass autodiff (passes run: build, expert-parallel, tensor-parallel, autodiff)',
  );
  dump('autodiff', graph);

  // pipeline: stages from the partition, passes in the schedule's order
  const layout =
    sizes.pp > 1
      ? partitionPipeline(forwardCosts(forward), {
          pp: sizes.pp,
          vpp: sizes.vpp,
          // full separation encodes before the pipeline, on every rank: not in stage 0's chunk
          encoderOnStage0: placement.level < 3,
          firstStageLayers: o.decoderFirstPipelineNumLayers,
          lastStageLayers: o.decoderLastPipelineNumLayers,
        })
      : undefined;
  let split: PipelineSplit | undefined;
  try {
    split = layout
      ? splitPipeline(
          graph,
          { pp: sizes.pp, vpp: sizes.vpp, firstLayerOf: layout.virtualStageFirstLayer },
          numMicrobatches,
        )
      : undefined;
  } catch (e) {
    passError(e);
  }
  if (split && o.dumpAfter === 'pipeline') o.onDump?.(printChunks(graph, split));
  // A2A overlap pairs each steady-state forward with a backward as one combined step, one extra
  // warm-up forward apart (reference/schedules.md); without a pipeline that is F0, F1+B0, …
  const a2aOverlap = o.moeOverlap?.overlap === true;
  const schedule =
    sizes.pp === 1
      ? a2aOverlap
        ? scheduleInterleaved(1, 1, numMicrobatches, 1, { a2aOverlap })
        : undefined
      : sizes.vpp > 1
        ? scheduleInterleaved(
            sizes.pp,
            sizes.vpp,
            numMicrobatches,
            o.microbatchGroupSize ?? sizes.pp,
            { a2aOverlap },
          )
        : schedule1F1B(sizes.pp, numMicrobatches);

  const groupSizes: Record<string, number> = {
    tp: sizes.tp,
    dp,
    edp: topology.edp,
    ep: sizes.ep,
    pp: sizes.pp,
    world,
    mp: world / dp,
    enc_tp: placement.encoderTp,
    tp_dp_cp: world / sizes.pp,
  };
  // copies of each gradient in the world after the sums (the gradient norm's weights)
  const copies: Record<string, number> = {};
  for (const p of graph.params) {
    if (p.role !== 'param') continue;
    const parts = (p.dist?.split ?? []).reduce((n, x) => n * (x ? x.parts : 1), 1);
    const expertParts = p.dist?.expert ? sizes.ep : 1;
    // the encoder at level 3 lives on every stage, its gradient summed over every rank
    copies[p.name] =
      placement.level === 3 && isEncoderScope(p.dist?.name ?? p.name)
        ? world
        : world / sizes.pp / parts / expertParts;
  }
  // one program per pipeline stage; at levels 2 and 3 the ranks of a stage's TP group encode
  // different microbatches, so those stages get one program per TP index
  const perTpIndex = (stage: number) =>
    sizes.tp > 1 && (placement.level === 3 || (placement.level === 2 && stage === 0));
  const programId = (stage: number, tp: number) =>
    perTpIndex(stage) ? `p${stage}.t${tp}` : `p${stage}`;
  const programs: ProgramFile[] = [];
  const activations = activationPolicyOf(o);
  for (let stage = 0; stage < sizes.pp; stage++)
    for (let tpIndex = 0; tpIndex < (perTpIndex(stage) ? sizes.tp : 1); tpIndex++) {
      const program = emitProgram(graph, {
        numMicrobatches,
        id: programId(stage, tpIndex),
        ...(placement.level >= 2
          ? {
              encoder: {
                placement,
                tp: tpIndex,
                tpSize: sizes.tp,
                offload: o.encoder?.cpuOffload,
                recompute: o.encoder?.recompute,
              },
            }
          : {}),
        ...(schedule
          ? {
              pipeline: {
                stage,
                pp: sizes.pp,
                ...(split ? { chunkOf: split.chunkOf, transfers: split.transfers } : {}),
                actions: schedule.stages[stage].actions,
                warmup: schedule.stages[stage].warmup,
              },
            }
          : {}),
        groupSizes,
        copies,
        worldSize: world,
        delayWgrad: o.moeOverlap?.delayWgrad,
        distributedOptimizer: o.distributedOptimizer,
        activations,
      });
      const clobbered = checkMemoryReuse(program);
      if (clobbered.length) {
        const c = clobbered[0];
        throw new Error(
          `memory plan of ${program.id}: instruction ${c.instruction} reads ${c.buffer} after ${c.clobberedBy} reused its bytes`,
        );
      }
      programs.push(program);
    }
  const counts = countParams(forward, cfg);
  const plan: PlanFile = {
    format: PLAN_FORMAT,
    version: PLAN_VERSION,
    createdBy: 'lfc 0.1.0',
    model: { name: cfg.name, config: cfg.model, paramsTotal: counts.total.total },
    training: {
      seqLength,
      microBatchSize: mbs,
      globalBatchSize: gbs,
      numMicrobatches,
      maxVisualTokens: forward.symbols.find((s) => s.name === 'Nv')!.bound,
      optimizer,
    },
    topology: {
      worldSize: world,
      nnodes: sizes.nnodes,
      nprocPerNode: sizes.nprocPerNode,
      sizes: {
        tp: sizes.tp,
        pp: sizes.pp,
        vpp: sizes.vpp,
        dp,
        ep: sizes.ep,
        edp: topology.edp,
        cp: sizes.cp,
      },
      ...(layout ? { pipelineLayers: layout.virtualStageLayers } : {}),
    },
    groups: topology.groups.map((g) => ({ name: g.names[0], ranks: g.ranks })),
    rankGroups: Object.fromEntries(
      GROUP_KINDS.filter((k) => k !== 'embd').map((k) => [
        k,
        ranks.map((r) => topology.groupOf(k, r)!.id),
      ]),
    ),
    dataParallel: { size: dp, rankIndex: ranks.map((r) => topology.coords(r).dp) },
    symbols: graph.symbols,
    params: forward.params.map((p) => ({
      name: p.name,
      dtype: p.type.dtype,
      shape: p.type.shape as number[],
      init: p.init,
      trainable: p.trainable,
      module: p.module,
      weightDecay: p.trainable ? weightDecayOf(p, optimizer) : 0,
    })),
    rankPrograms: ranks.map((r) => {
      const c = topology.coords(r);
      return programId(c.pp, c.tp);
    }),
  };
  // the plan verifier: collectives match per group, sends meet receives, every cross-stream
  // read is ordered by an event, and all ranks together finish the step
  const verifyStart = performance.now();
  assertPlanValid(plan, new Map(programs.map((p) => [p.id, p])));
  const verifyMs = performance.now() - verifyStart;
  const sum = (f: (p: ProgramFile) => number) => Math.max(...programs.map(f));
  return {
    config: cfg,
    graph,
    plan,
    programs,
    layout,
    placement,
    stats: {
      autodiff: { ...adStats },
      emit: {
        programs: programs.length,
        instructions: sum((p) => p.instructions.length),
        buffers: sum((p) => p.buffers.length),
        arenaBytes: sum((p) => p.regions.arena),
        arenaLowerBoundBytes: sum((p) => p.arenaLowerBoundBytes),
        /** host bytes of offloaded tensors (--offload-tensors, --full-hetero-dp-cpu-offload) */
        hostBytes: sum((p) => p.regions.host ?? 0),
      },
      verify: { ms: verifyMs },
    },
  };
}

/**
 * The config with --moe-expert-capacity-factor / --moe-token-drop-policy in its decoder: the flags
 * win over the keys of the same name, and the plan records what was compiled.
 */
function withTokenDropping(cfg: ModelConfig, o: CompileOptions): ModelConfig {
  if (o.moeExpertCapacityFactor === undefined && o.moeTokenDropPolicy === undefined) return cfg;
  const d = cfg.model.text_decoder;
  const text_decoder: DecoderConfig = {
    ...d,
    moe_expert_capacity_factor: o.moeExpertCapacityFactor ?? d.moe_expert_capacity_factor,
    moe_token_drop_policy: o.moeTokenDropPolicy ?? d.moe_token_drop_policy,
  };
  return { ...cfg, model: { ...cfg.model, text_decoder } };
}

/** The pipeline pass's dump: every node after its virtual stage, then the transfers. */
function printChunks(g: Graph, split: PipelineSplit): string {
  const params = new Set(g.params.map((p) => p.name));
  const lines = g.nodes.map((n, i) => {
    const c = split.chunkOf[i];
    return `${c < 0 ? 'step' : `chunk ${c}`}  ${formatNode(n, (v) => params.has(v))}`;
  });
  for (const t of split.transfers)
    lines.push(
      `transfer %${t.value}: chunk ${t.from.chunk} → ${t.to.chunk} (${t.from.phase}), tags ${t.tag}…`,
    );
  return lines.join('\n') + '\n';
}

/**
 * Writes a plan directory atomically: into a temporary sibling, then renamed over DIR. An
 * existing DIR is replaced only when it holds an lfc plan (nothing else is ever deleted).
 */
export function writePlan(dir: string, plan: PlanFile, programs: readonly ProgramFile[]): void {
  if (existsSync(dir)) {
    const entries = readdirSync(dir);
    if (entries.length && !entries.includes('plan.json')) {
      throw new UserError(`${dir} exists and is not an lfc plan directory; choose another -o`);
    }
  }
  const tmp = join(dirname(dir), `.${basename(dir)}.tmp-${process.pid}`);
  rmSync(tmp, { recursive: true, force: true });
  mkdirSync(join(tmp, 'programs'), { recursive: true });
  writeFileSync(join(tmp, 'plan.json'), JSON.stringify(plan, null, 1) + '\n');
  for (const p of programs)
    writeFileSync(join(tmp, 'programs', `${p.id}.json`), JSON.stringify(p) + '\n');
  if (existsSync(dir)) {
    const old = `${tmp}-old`;
    renameSync(dir, old);
    renameSync(tmp, dir);
    rmSync(old, { recursive: true, force: true });
  } else {
    mkdirSync(dirname(dir), { recursive: true });
    renameSync(tmp, dir);
  }
}
