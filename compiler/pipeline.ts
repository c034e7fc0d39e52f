// The compiler pipeline: the ordered list of passes (PASSES), and compile(), a short driver that
// runs them and assembles the plan. Each pass is a pure function of its input with its invariants
// in its header comment; `dumpAfter` prints the IR (graph passes) or one program (emission passes,
// `dumpProgram`, default the first) after it, and the graph verifier runs after every graph pass.
//
//   graph passes     build → expert-parallel → tensor-parallel → encoder-data-parallel →
//                    vit-dp-balance → autodiff → pipeline          (ir/, passes/)
//   emission passes  schedule → lower → encoder-handoff → p2p → grad-sync → optimizer → number →
//                    activations → encoder-offload → memory-plan   (compiler/emit/, per program)
//   verify           the plan over all ranks (compiler/verify/): memory reuse, collectives,
//                    sends and receives, events, a symbolic run of the step

import {
  closeSync,
  existsSync,
  openSync,
  readdirSync,
  renameSync,
  rmSync,
  writeFileSync,
  writeSync,
} from 'node:fs';
import { basename, dirname, join } from 'node:path';
import { getHeapStatistics } from 'node:v8';
import { makeDirs } from './files.js';
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
import { fuseWgradAccumulation } from '../passes/wgrad-accumulation.js';
import { UserError } from './errors.js';
import { forwardCosts, type ForwardCosts } from './schedule/costs.js';
import { partitionPipeline, type PipelineLayout } from './schedule/partition.js';
import { schedule1F1B, scheduleInterleaved } from './schedule/pipeline.js';
import { buildForwardGraph } from './frontend/build.js';
import { loadModelConfig, type DecoderConfig, type ModelConfig } from './frontend/config.js';
import { countParams, forwardFlops } from './inspect.js';
import { resolveSizes, type ParallelSizes } from './parallel/sizes.js';
import { validateParallel, type MoeOverlapOptions } from './parallel/validate.js';
import type { RecomputeOptions } from './frontend/activation-names.js';
import { buildTopology, GROUP_KINDS } from './parallel/topology.js';
import { pricedStageWeights } from './schedule/priced.js';
import type { HardwareProfile } from './sim/hardware.js';
import {
  encoderPlacement,
  isEncoderScope,
  type EncoderOptions,
  type EncoderPlacement,
} from './parallel/encoder.js';
import { encoderDataParallel } from '../passes/parallel/encoder.js';
import { vitDpBalance } from '../passes/parallel/vit-balance.js';
import { checkMemoryReuse } from './plan/check-memory.js';
import { assertPlanValid } from './verify/plan-verifier.js';
import type { PlanIndex } from './verify/plan-index.js';
import {
  EMIT_PASSES,
  emitProgram,
  lapTimer,
  printSchedule,
  type PassClock,
} from './emit/passes.js';
import { printProgram } from './plan/program-text.js';
import { programJsons } from './plan/program-json.js';
import { relabeledProgram, siblingSlots, templateTp } from './emit/alike-programs.js';
import { activationPolicyOf } from './emit/activations.js';
import { PLAN_FORMAT, PLAN_VERSION, type PlanFile, type ProgramFile } from './plan/format.js';
import { programFileOf, type ProgramDraft } from './emit/draft.js';
import type { ProgramSchedule } from './emit/schedule.js';
import { resolvePrecision, type Precision, type PrecisionFlags } from './frontend/precision.js';
import {
  loadDataProfile,
  profileSizes,
  type DataProfile,
  type ProfileSizes,
} from './frontend/data-profile.js';

export interface PassInfo {
  readonly name: string;
  readonly summary: string;
  /** what --dump-after prints: the graph IR, one program, or nothing (the verifier) */
  readonly dumps: 'graph' | 'program' | 'none';
}

/** Every pass compile() runs, in order (`lfc compile --list-passes`). */
export const PASSES: readonly PassInfo[] = [
  {
    name: 'build',
    summary: 'forward graph of one microbatch from the model config',
    dumps: 'graph',
  },
  {
    name: 'expert-parallel',
    summary: 'experts split over ep, all-to-all dispatch and combine',
    dumps: 'graph',
  },
  {
    name: 'tensor-parallel',
    summary: 'column/row-parallel linears, heads, vocabulary-parallel embedding and loss, SP',
    dumps: 'graph',
  },
  {
    name: 'encoder-data-parallel',
    summary: 'encoder gradients summed over the ranks that encode distinct data (levels 2, 3)',
    dumps: 'graph',
  },
  {
    name: 'vit-dp-balance',
    summary: 'images pooled over the encoder gradient group, encoded by cost, tokens sent home',
    dumps: 'graph',
  },
  {
    name: 'autodiff',
    summary: 'backward graph, gradient accumulation, clipping and AdamW',
    dumps: 'graph',
  },
  {
    name: 'wgrad-accumulation',
    summary: 'weight gradients summed into their buffers by the wgrad GEMM itself',
    dumps: 'graph',
  },
  {
    name: 'pipeline',
    summary: 'every node to its virtual stage; values that cross stages',
    dumps: 'graph',
  },
  ...EMIT_PASSES.map((p) => ({ ...p, dumps: 'program' as const })),
  {
    name: 'verify',
    summary:
      'the plan over all ranks: memory reuse, collectives, send/recv, events, a symbolic run',
    dumps: 'none',
  },
];

/** The pass list as `lfc compile --list-passes` prints it (and the README shows it). */
export function describePasses(): string {
  const width = Math.max(...PASSES.map((p) => p.name.length));
  return (
    PASSES.map(
      (p, i) => `${String(i + 1).padStart(2)}. ${p.name.padEnd(width)}  ${p.summary}`,
    ).join('\n') + '\n'
  );
}

// the option types CompileOptions is made of, defined where the rules that read them are
export type { EncoderOptions, MoeOverlapOptions, RecomputeOptions };

/** What compile() throws where CompileOptions.stopAfter holds for a program just emitted. */
export class CompileStopped extends Error {
  constructor(readonly program: ProgramFile) {
    super(`compile stopped after program ${program.id}`);
  }
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
  /** --account-for-embedding-in-pipeline-split: the embedding takes a layer's place in the split */
  readonly accountForEmbeddingInPipelineSplit?: boolean;
  /** --account-for-loss-in-pipeline-split: lm_head and the loss take a layer's place */
  readonly accountForLossInPipelineSplit?: boolean;
  /** --use-distributed-optimizer */
  readonly distributedOptimizer?: boolean;
  /** --bf16, --grad-reduce-in-bf16, …: compiler/frontend/precision.ts */
  readonly precision?: PrecisionFlags;
  readonly optimizer?: Partial<OptimizerSettings>;
  /** the encoder levels (DESIGN.md "Parallel topology"); level 1 follows from the encoder's TP */
  readonly encoder?: EncoderOptions;
  /** --overlap-moe-expert-parallel-comm / --delay-wgrad-compute */
  readonly moeOverlap?: MoeOverlapOptions;
  /** --recompute-granularity / --recompute-modules */
  readonly recompute?: RecomputeOptions;
  /**
   * weight-gradient GEMMs add into the gradient buffers (Megatron's gradient-accumulation fusion,
   * passes/wgrad-accumulation.ts); false: --no-gradient-accumulation-fusion (default true)
   */
  readonly gradientAccumulationFusion?: boolean;
  /** --fine-grained-activation-offloading --offload-tensors … */
  readonly offloadTensors?: readonly string[];
  /** --moe-expert-capacity-factor (default: model.text_decoder.moe_expert_capacity_factor) */
  readonly moeExpertCapacityFactor?: number;
  /** --moe-routing-imbalance (default: model.text_decoder.moe_routing_imbalance) */
  readonly moeRoutingImbalance?: number;
  /** --moe-expected-imbalance (default: model.text_decoder.moe_expected_imbalance, else 1) */
  readonly moeExpectedImbalance?: number;
  /** --data-profile: a name under configs/data or a YAML file (default: training.data_profile) */
  readonly dataProfile?: string;
  /**
   * the hardware the plan is for (--hardware): the pipeline partition balances each piece's
   * priced seconds on it (compiler/schedule/priced.ts); absent: forward FLOPs
   */
  readonly hardware?: HardwareProfile;
  /**
   * --moe-token-dispatcher-type: alltoall (default) or flex, DeepEP's, priced with its node
   * deduplication (passes/parallel/expert.ts, compiler/sim/cost.ts); the plan's rows move alike
   */
  readonly moeTokenDispatcher?: 'alltoall' | 'flex';
  /** --moe-token-drop-policy (default: model.text_decoder.moe_token_drop_policy) */
  readonly moeTokenDropPolicy?: DecoderConfig['moe_token_drop_policy'];
  /** print the IR (or, after an emission pass, one program) after this pass */
  readonly dumpAfter?: string;
  /** which program --dump-after prints after an emission pass (default: the first) */
  readonly dumpProgram?: string;
  readonly onDump?: (text: string) => void;
  /** given the IR after each graph pass (build … autodiff), as the pass left it (--save-ir) */
  readonly onGraph?: (pass: string, graph: Graph) => void;
  /** called as compilation moves on: the phase it enters ("emitting program p1 (2 of 8)") */
  readonly onProgress?: (phase: string) => void;
  /**
   * skip the checks of the IR after each pass, of memory reuse and the plan verifier (the fits
   * advice plans alternatives of a verified plan only for their memory)
   */
  readonly skipVerify?: boolean;
  /**
   * emit every program through every pass, also those made by relabeling a sibling's
   * (compiler/emit/alike-programs.ts): the test that compares the two
   */
  readonly emitEveryProgram?: boolean;
  /**
   * a search's early exit (lfc tune: a plan past the device need not be finished): called with
   * each distinct program once emitted, stage 0's first; where it holds, compile() stops there
   * and throws CompileStopped with that program
   */
  readonly stopAfter?: (program: ProgramFile) => boolean;
}

export interface CompileResult {
  readonly config: ModelConfig;
  readonly graph: Graph;
  /**
   * the model's forward matmul FLOPs of one microbatch (unsharded, at the sequence and the data
   * profile's expected visual tokens): MFU's model FLOPs, the same for every layout
   */
  readonly modelForwardFlops: number;
  readonly plan: PlanFile;
  readonly programs: readonly ProgramFile[];
  /** the pipeline partition (pp > 1) */
  readonly layout?: PipelineLayout;
  /** where the encoder runs (compiler/parallel/encoder.ts) */
  readonly placement: EncoderPlacement;
  /** sequence parallelism, as asked or by default (MoE with tp and ep above 1) */
  readonly sequenceParallel: boolean;
  readonly precision: Precision;
  /** the data profile planned for, and its sizes of one microbatch */
  readonly data: { readonly profile: string; readonly sizes: ProfileSizes };
  readonly stats: Record<string, Record<string, number>>;
  /** the verifier's index of the plan and programs (absent under skipVerify): the simulation
   * replays on it (compiler/sim/simulate.ts replaySetup) instead of indexing them again */
  readonly planIndex?: PlanIndex;
}

export function compile(o: CompileOptions): CompileResult {
  checkDumpRequest(o);
  o.onProgress?.('graph passes');
  // wall time by phase, and by emission pass over every program (stats.ms)
  const ms: Record<string, number> = {};
  const clock = (phase: string, t: number) => (ms[phase] = (ms[phase] ?? 0) + t);
  let lap = lapTimer(clock);
  const layout = resolveLayout(o);
  const { forward, sharded } = runShardingPasses(o, layout);
  lap('build+sharding');
  // the model's FLOPs, for MFU: the unsharded forward at the expected visual tokens
  const modelForwardFlops = forwardFlops(
    forward,
    ['image_encoder', 'image_projector', 'text_decoder'],
    {
      Nv: Math.min(
        layout.data.sizes.expected.visualTokens,
        o.maxVisualTokens ?? layout.data.sizes.bound.visualTokens,
      ),
    },
  );
  const { graph: trained, stats: adStats } = autodiff(
    sharded,
    layout.optimizer,
    layout.precision.grad,
  );
  if (!o.skipVerify)
    assertValid(
      trained,
      'after pass autodiff (passes run: build, expert-parallel, tensor-parallel, autodiff)',
    );
  dumpGraph(o, 'autodiff', trained);
  lap('autodiff');
  const graph = wgradAccumulation(o, trained);
  if (!o.skipVerify)
    assertValid(
      graph,
      'after pass wgrad-accumulation (passes run: build, expert-parallel, tensor-parallel, autodiff, wgrad-accumulation)',
    );
  dumpGraph(o, 'wgrad-accumulation', graph);
  lap('wgrad-accumulation');
  const pipeline = splitStages(o, layout, forward, graph);
  lap('pipeline');
  const programs = emitPrograms(o, layout, graph, pipeline, clock);
  lap = lapTimer(clock); // emission timed itself, pass by pass
  const plan = planFileOf(o, layout, forward, graph, pipeline);
  lap('plan');
  // the plan verifier: collectives match per group, sends meet receives, every cross-stream
  // read is ordered by an event, and all ranks together finish the step
  const verifyStart = performance.now();
  if (!o.skipVerify) o.onProgress?.(`verifying the plan (${programs.length} programs)`);
  const planIndex = o.skipVerify
    ? undefined
    : assertPlanValid(plan, new Map(programs.map((p) => [p.id, p])));
  const verifyMs = performance.now() - verifyStart;
  const most = (f: (p: ProgramFile) => number) => Math.max(...programs.map(f));
  return {
    config: layout.cfg,
    graph,
    modelForwardFlops,
    plan,
    programs,
    layout: pipeline.partition,
    placement: layout.placement,
    sequenceParallel: layout.sequenceParallel,
    precision: layout.precision,
    data: { profile: layout.data.profile.name, sizes: layout.data.sizes },
    stats: {
      autodiff: { ...adStats },
      emit: {
        programs: programs.length,
        instructions: most((p) => p.instructions.length),
        buffers: most((p) => p.buffers.length),
        arenaBytes: most((p) => p.regions.arena),
        arenaLowerBoundBytes: most((p) => p.arenaLowerBoundBytes),
        /** host bytes of offloaded tensors (--offload-tensors, --full-hetero-dp-cpu-offload) */
        hostBytes: most((p) => p.regions.host ?? 0),
      },
      verify: { ms: verifyMs },
      ms: { ...ms, verify: verifyMs },
    },
    ...(planIndex ? { planIndex } : {}),
  };
}

/**
 * The layout rules alone (compiler/parallel/validate.ts): throws the UserError a compile would.
 * `config`: the model as loadModelConfig(o.model, o.overrides) gives it, when the caller has it
 * (lfc tune checks thousands of layouts of one model).
 */
export function checkLayout(o: CompileOptions, config?: ModelConfig): void {
  resolveLayout(o, config);
}

/**
 * The graph passes alone (build, the parallel rewrites, autodiff): the training-step graph of one
 * rank, without the pipeline split or emission. lfc tune prices its pieces on this
 * (compiler/tune/estimate.ts). Unverified, like a compile with skipVerify.
 */
export function trainingGraph(o: CompileOptions): Graph {
  const layout = resolveLayout(o);
  const { sharded } = runShardingPasses({ ...o, skipVerify: true }, layout);
  return wgradAccumulation(o, autodiff(sharded, layout.optimizer, layout.precision.grad).graph);
}

/** The wgrad-accumulation pass, unless --no-gradient-accumulation-fusion. */
const wgradAccumulation = (o: CompileOptions, g: Graph): Graph =>
  o.gradientAccumulationFusion === false ? g : fuseWgradAccumulation(g);

function checkDumpRequest(o: CompileOptions): void {
  if (
    o.dumpAfter !== undefined &&
    !PASSES.some((p) => p.name === o.dumpAfter && p.dumps !== 'none')
  )
    throw new UserError(
      `--dump-after ${o.dumpAfter}: no such pass; passes: ${PASSES.filter((p) => p.dumps !== 'none')
        .map((p) => p.name)
        .join(', ')}`,
    );
  if (
    o.dumpProgram !== undefined &&
    PASSES.find((p) => p.name === o.dumpAfter)?.dumps !== 'program'
  )
    throw new UserError(
      `--dump-program ${o.dumpProgram} needs --dump-after with an emission pass (${EMIT_PASSES.map((p) => p.name).join(', ')})`,
    );
}

const dumpGraph = (o: CompileOptions, pass: string, g: Graph) => {
  if (o.dumpAfter === pass) o.onDump?.(printGraph(g));
  o.onGraph?.(pass, g);
};

/** The resolved model, sizes, topology and encoder placement of a compile request. */
interface Layout {
  readonly cfg: ModelConfig;
  /**
   * --sequence-parallel, on by default for MoE with tp and ep both above 1: Megatron-LM requires
   * it there (ModelParallelConfig), and its MoE dispatch relies on it (passes/parallel/tensor.ts)
   */
  readonly sequenceParallel: boolean;
  readonly seqLength: number;
  readonly mbs: number;
  readonly gbs: number;
  readonly sizes: ParallelSizes;
  readonly world: number;
  readonly dp: number;
  readonly numMicrobatches: number;
  readonly topology: ReturnType<typeof buildTopology>;
  readonly placement: EncoderPlacement;
  readonly optimizer: OptimizerSettings;
  readonly precision: Precision;
  /** the data profile's sizes of one microbatch (compiler/frontend/data-profile.ts) */
  readonly data: { readonly profile: DataProfile; readonly sizes: ProfileSizes };
}

function resolveLayout(o: CompileOptions, loaded?: ModelConfig): Layout {
  const cfg = withTokenDropping(loaded ?? loadModelConfig(o.model, o.overrides ?? []), o);
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
  const sequenceParallel =
    o.sequenceParallel ??
    (cfg.model.text_decoder.num_experts > 0 &&
      sizes.tp > 1 &&
      (sizes.ep > 1 || (sizes.etp ?? sizes.tp) < sizes.tp));
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
    accountForEmbeddingInPipelineSplit: o.accountForEmbeddingInPipelineSplit,
    accountForLossInPipelineSplit: o.accountForLossInPipelineSplit,
    sequenceParallel,
    moeTokenDispatcher: o.moeTokenDispatcher,
    encoder: o.encoder,
    moeOverlap: o.moeOverlap,
    recompute: o.recompute,
    offloadTensors: o.offloadTensors,
  });
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
  const precision = resolvePrecision(o.precision);
  const profile = loadDataProfile(o.dataProfile ?? cfg.training.data_profile);
  const data = {
    profile,
    sizes: profileSizes(profile, cfg.model.image_encoder, seqLength * mbs, seqLength),
  };
  const topology = buildTopology(sizes);
  return {
    cfg,
    sequenceParallel,
    seqLength,
    mbs,
    gbs,
    sizes,
    world,
    dp,
    numMicrobatches,
    topology,
    placement,
    optimizer,
    precision,
    data,
  };
}

/** build, then the parallel rewrites of the forward graph (a rewrite's refusal is a user error) */
function runShardingPasses(o: CompileOptions, l: Layout): { forward: Graph; sharded: Graph } {
  const { cfg, sizes, placement } = l;
  // the auxiliary loss is a mean over every microbatch of the global batch (all replicas)
  const forward = buildForwardGraph(cfg, {
    seqLength: l.seqLength,
    microBatchSize: l.mbs,
    maxVisualTokens: o.maxVisualTokens ?? l.data.sizes.bound.visualTokens,
    expectedVisualTokens: l.data.sizes.expected.visualTokens,
    expectedSampleTokens: l.data.sizes.expected.sampleTokens,
    numMicrobatches: l.gbs / l.mbs,
    dtype: l.precision.compute,
  });
  const passes: [string, (g: Graph) => Graph][] = [
    [
      'expert-parallel',
      (g) =>
        expertParallel(g, {
          ep: sizes.ep,
          imbalance: cfg.model.text_decoder.moe_routing_imbalance,
          expectedImbalance: cfg.model.text_decoder.moe_expected_imbalance,
          tokenSplit: l.sequenceParallel ? sizes.tp : 1,
          dispatcher: o.moeTokenDispatcher,
          topK: cfg.model.text_decoder.moe_router_topk,
        }),
    ],
    [
      'tensor-parallel',
      (g) =>
        tensorParallel(g, {
          tp: sizes.tp,
          sequenceParallel: l.sequenceParallel,
          encoderTp: placement.encoderTp,
          expertTp: sizes.etp ?? sizes.tp,
        }),
    ],
    ['encoder-data-parallel', (g) => encoderDataParallel(g, placement)],
    ['vit-dp-balance', (g) => (o.encoder?.vitDpBalance ? balanced(g, l) : g)],
  ];
  if (!o.skipVerify) assertValid(forward, 'after pass build');
  dumpGraph(o, 'build', forward);
  let sharded = forward;
  for (const [name, pass] of passes) {
    try {
      const next = pass(sharded);
      if (next !== sharded && !o.skipVerify) assertValid(next, `after pass ${name}`);
      sharded = next;
    } catch (e) {
      passError(e);
    }
    dumpGraph(o, name, sharded);
  }
  return { forward, sharded };
}

function balanced(g: Graph, l: Layout): Graph {
  const group = l.placement.gradGroup;
  const merge = l.cfg.model.image_encoder.spatial_merge_size ** 2;
  const groupSize = { dp: l.dp, tp_dp_cp: l.world / l.sizes.pp, world: l.world }[group];
  return vitDpBalance(g, { group, groupSize, merge });
}

const passError = (e: unknown): never => {
  if (
    e instanceof TensorParallelError ||
    e instanceof ExpertParallelError ||
    e instanceof PipelineError
  )
    throw new UserError(e.message);
  throw e;
};

interface Stages {
  /** the pipeline partition (pp > 1) */
  readonly partition?: PipelineLayout;
  readonly split?: PipelineSplit;
  readonly schedule?: ReturnType<typeof schedule1F1B>;
  /** decoder parameters read on more than one stage: the tied embedding and output weight */
  readonly tied: readonly string[];
}

/**
 * Parameters the decoder reads on two pipeline stages: with tied embeddings the first stage's
 * embedding and the last stage's output layer share one weight, and each stage's gradient is a
 * part of its gradient (summed over the embd group: first and last stage).
 */
function tiedAcrossStages(graph: Graph, split: PipelineSplit | undefined, pp: number): string[] {
  if (!split) return [];
  const params = new Set(graph.params.filter((p) => p.role === 'param').map((p) => p.name));
  const stages = new Map<string, Set<number>>();
  graph.nodes.forEach((n, i) => {
    const chunk = split.chunkOf[i];
    if (chunk < 0 || n.phase === 'optimizer' || isEncoderScope(n.scope)) return;
    for (const v of n.inputs) {
      if (!params.has(v)) continue;
      let set = stages.get(v);
      if (!set) stages.set(v, (set = new Set()));
      set.add(chunk % pp);
    }
  });
  return [...stages].filter(([, set]) => set.size > 1).map(([name]) => name);
}

/**
 * What the partition balances: a stage-0 rank's forward work per microbatch, in the decoder's
 * unsharded FLOPs (every decoder piece is split tp ways alike), at the data profile's expected
 * visual tokens. The encoder weighs tp / encoder TP at levels 0–1 (its replicas inside the tp
 * group each encode the whole microbatch) and 1 at level 2 (each of the tp ranks encodes one
 * microbatch in tp); at level 3 it is off the pipeline.
 */
function stageCosts(o: CompileOptions, l: Layout, forward: Graph): ForwardCosts {
  const { placement, sizes, data } = l;
  const Nv = Math.min(
    data.sizes.expected.visualTokens,
    o.maxVisualTokens ?? data.sizes.bound.visualTokens,
  );
  const costs = forwardCosts(forward, { Nv });
  const share = placement.level === 2 ? sizes.tp : placement.encoderTp;
  return { ...costs, encoderFlops: (costs.encoderFlops * sizes.tp) / share };
}

/**
 * What the partition balances on a hardware profile: a rank's priced seconds per piece, the
 * encoder at its share of a microbatch on a stage-0 rank (all of it at level 1, where each encoder
 * TP group encodes the whole microbatch; 1/tp at level 2; off the pipeline at level 3).
 */
function pricedWeights(l: Layout, graph: Graph, hardware: HardwareProfile) {
  const { placement, sizes } = l;
  const w = pricedStageWeights(graph, {
    hardware,
    topology: l.topology,
    nprocPerNode: sizes.nprocPerNode,
    encoderShare: placement.level === 2 ? 1 / sizes.tp : 1,
  });
  return { layer: w.layer, pre: w.embed + (placement.level < 3 ? w.encoder : 0), post: w.post };
}

/** pipeline: stages from the partition, passes in the schedule's order */
function splitStages(o: CompileOptions, l: Layout, forward: Graph, graph: Graph): Stages {
  const { sizes, placement, numMicrobatches } = l;
  const partition =
    sizes.pp > 1
      ? partitionPipeline(stageCosts(o, l, forward), {
          pp: sizes.pp,
          vpp: sizes.vpp,
          // full separation encodes before the pipeline, on every rank: not in stage 0's chunk
          encoderOnStage0: placement.level < 3,
          firstStageLayers: o.decoderFirstPipelineNumLayers,
          lastStageLayers: o.decoderLastPipelineNumLayers,
          accountForEmbedding: o.accountForEmbeddingInPipelineSplit,
          accountForLoss: o.accountForLossInPipelineSplit,
          weights:
            o.hardware &&
            o.decoderFirstPipelineNumLayers === undefined &&
            o.decoderLastPipelineNumLayers === undefined &&
            !o.accountForEmbeddingInPipelineSplit &&
            !o.accountForLossInPipelineSplit
              ? pricedWeights(l, graph, o.hardware)
              : undefined,
        })
      : undefined;
  let split: PipelineSplit | undefined;
  try {
    split = partition
      ? splitPipeline(
          graph,
          { pp: sizes.pp, vpp: sizes.vpp, firstLayerOf: partition.virtualStageFirstLayer },
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
  return { partition, split, schedule, tied: tiedAcrossStages(graph, split, sizes.pp) };
}

/** one program per pipeline stage; at levels 2 and 3 the ranks of a stage's TP group encode
 * different microbatches, so those stages get one program per TP index */
function programIdOf(l: Layout): (stage: number, tp: number) => string {
  const perTpIndex = (stage: number) =>
    l.sizes.tp > 1 && (l.placement.level === 3 || (l.placement.level === 2 && stage === 0));
  return (stage, tp) => (perTpIndex(stage) ? `p${stage}.t${tp}` : `p${stage}`);
}

/** The emission passes for every distinct program, each checked for memory reuse. */
function emitPrograms(
  o: CompileOptions,
  l: Layout,
  graph: Graph,
  st: Stages,
  clock: PassClock,
): ProgramFile[] {
  const { sizes, placement, world, dp } = l;
  const groupSizes: Record<string, number> = {
    tp: sizes.tp,
    dp,
    edp: l.topology.edp,
    ep: sizes.ep,
    pp: sizes.pp,
    world,
    mp: world / dp,
    enc_tp: placement.encoderTp,
    tp_dp_cp: world / sizes.pp,
    // the first and last stage: where a tied embedding's two gradients meet
    ...(st.tied.length ? { embd: 2 } : {}),
  };
  const copies = gradientCopies(graph, l, st.tied);
  const programId = programIdOf(l);
  const activations = activationPolicyOf(o);
  const programs: ProgramFile[] = [];
  const dumpAt = PASSES.find((p) => p.name === o.dumpAfter)?.dumps === 'program';
  // one program per stage, or per stage and TP index where the encoder levels make TP ranks differ
  const slots: { stage: number; tpIndex: number }[] = [];
  for (let stage = 0; stage < sizes.pp; stage++)
    for (let tpIndex = 0; tpIndex < (programId(stage, 0) === `p${stage}` ? 1 : sizes.tp); tpIndex++)
      slots.push({ stage, tpIndex });
  const heapAtStart = process.memoryUsage().heapUsed;
  for (const { stage, tpIndex } of slots) {
    const id = programId(stage, tpIndex);
    o.onProgress?.(`emitting program ${id} (stage ${stage + 1} of ${sizes.pp})`);
    const dump =
      dumpAt && (o.dumpProgram ?? (programs.length === 0 ? id : undefined)) === id
        ? (pass: string, x: Parameters<typeof printStage>[0]) =>
            pass === o.dumpAfter && o.onDump?.(printStage(x))
        : undefined;
    // a level-3 TP rank: its stage's template relabeled (alike-programs.ts; the ViT balance's
    // mock slots are left to emission)
    const sibling =
      placement.level === 3 && !o.emitEveryProgram && !o.encoder?.vitDpBalance && !dump
        ? siblingSlots(placement, stage, tpIndex, l.numMicrobatches)
        : undefined;
    const template = sibling && programs.find((p) => p.id === programId(stage, templateTp(stage)));
    const program = template
      ? relabeledProgram(template, id, sibling)
      : emitProgram(
          graph,
          {
            numMicrobatches: l.numMicrobatches,
            id,
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
            ...(st.schedule
              ? {
                  pipeline: {
                    stage,
                    pp: sizes.pp,
                    ...(st.split
                      ? { chunkOf: st.split.chunkOf, transfers: st.split.transfers }
                      : {}),
                    actions: st.schedule.stages[stage].actions,
                    warmup: st.schedule.stages[stage].warmup,
                  },
                }
              : {}),
            groupSizes,
            copies,
            worldSize: world,
            delayWgrad: o.moeOverlap?.delayWgrad,
            distributedOptimizer: o.distributedOptimizer,
            activations,
            ...(st.tied.length ? { tied: st.tied } : {}),
          },
          dump,
          clock,
        );
    const t = performance.now();
    // a relabeled program's memory plan is its template's, checked already
    const clobbered = o.skipVerify || template ? [] : checkMemoryReuse(program);
    if (clobbered.length) {
      const c = clobbered[0];
      throw new Error(
        `memory plan of ${program.id}: instruction ${c.instruction} reads ${c.buffer} after ${c.clobberedBy} reused its bytes`,
      );
    }
    clock('memory-check', performance.now() - t);
    programs.push(program);
    if (programs.length === 1)
      checkPlanFitsHeap(program, slots.length, heapAtStart, l.numMicrobatches);
    if (o.stopAfter?.(program)) throw new CompileStopped(program);
  }
  if (o.dumpProgram !== undefined && !programs.some((p) => p.id === o.dumpProgram))
    throw new UserError(
      `--dump-program ${o.dumpProgram}: no such program; programs: ${programs.map((p) => p.id).join(', ')}`,
    );
  return programs;
}

/**
 * A plan too large for this process's heap is refused after its first program, with what it
 * would take, instead of running minutes into V8's out-of-memory abort: every instruction of
 * every microbatch is emitted, so the programs grow with the microbatches per step.
 */
function checkPlanFitsHeap(
  first: ProgramFile,
  programs: number,
  heapAtStart: number,
  microbatches: number,
): void {
  const limit = getHeapStatistics().heap_size_limit;
  const used = process.memoryUsage().heapUsed;
  const perProgram = Math.max(0, used - heapAtStart);
  // the verifier and the simulator after emission: measured on the article's level-3 line (8
  // programs of 82k instructions), the heap peaked under 1.5 × its programs' share
  const need = heapAtStart + 1.5 * perProgram * programs;
  if (need <= 0.95 * limit) return;
  const gib = (b: number) => `${(b / 2 ** 30).toFixed(1)} GiB`;
  throw new UserError(
    `the plan is too large for this process's memory: program ${first.id} holds ` +
      `${first.instructions.length} instructions (${microbatches} microbatches a step) and took ` +
      `${gib(perProgram)} of the heap; its ${programs} programs would need about ${gib(need)} of ` +
      `the ${gib(limit)} node allows. Lower --global-batch-size (fewer microbatches per step), ` +
      `or raise node's heap: NODE_OPTIONS=--max-old-space-size=${Math.ceil((1.2 * need) / 2 ** 20)}`,
  );
}

function printStage(x: ProgramSchedule | ProgramDraft): string {
  return 'steps' in x ? printSchedule(x) : printProgram(programFileOf(x));
}

/** copies of each gradient in the world after the sums (the gradient norm's weights) */
function gradientCopies(graph: Graph, l: Layout, tied: readonly string[]): Record<string, number> {
  const { sizes, world } = l;
  const copies: Record<string, number> = {};
  for (const p of graph.params) {
    if (p.role !== 'param') continue;
    const parts = (p.dist?.split ?? []).reduce((n, x) => n * (x ? x.parts : 1), 1);
    const expertParts = p.dist?.expert ? sizes.ep : 1;
    // the encoder at level 3 lives on every stage, its gradient summed over every rank
    copies[p.name] =
      l.placement.level === 3 && isEncoderScope(p.dist?.name ?? p.name)
        ? world
        : (world / sizes.pp / parts / expertParts) * (tied.includes(p.name) ? 2 : 1);
  }
  return copies;
}

/** plan.json: the model, training settings, topology, groups, parameters, program of each rank */
function planFileOf(
  o: CompileOptions,
  l: Layout,
  forward: Graph,
  graph: Graph,
  { partition, tied }: Stages,
): PlanFile {
  const { cfg, sizes, topology, world } = l;
  const ranks = Array.from({ length: world }, (_, r) => r);
  const counts = countParams(forward, cfg);
  const programId = programIdOf(l);
  return {
    format: PLAN_FORMAT,
    version: PLAN_VERSION,
    createdBy: 'lfc 0.1.0',
    model: { name: cfg.name, config: cfg.model, paramsTotal: counts.total.total },
    training: {
      seqLength: l.seqLength,
      microBatchSize: l.mbs,
      globalBatchSize: l.gbs,
      numMicrobatches: l.numMicrobatches,
      maxVisualTokens: forward.symbols.find((s) => s.name === 'Nv')!.bound,
      ...(l.precision.compute !== 'f32' ? { precision: l.precision } : {}),
      optimizer: l.optimizer,
    },
    topology: {
      worldSize: world,
      nnodes: sizes.nnodes,
      nprocPerNode: sizes.nprocPerNode,
      sizes: {
        tp: sizes.tp,
        pp: sizes.pp,
        vpp: sizes.vpp,
        dp: l.dp,
        ep: sizes.ep,
        // expert TP where it is not tp (absent: tp)
        ...(topology.sizes.etp !== sizes.tp ? { etp: topology.sizes.etp } : {}),
        edp: topology.edp,
        cp: sizes.cp,
      },
      ...(partition ? { pipelineLayers: partition.virtualStageLayers } : {}),
    },
    groups: topology.groups.map((g) => ({ name: g.names[0], ranks: g.ranks })),
    // embd only where a tied weight spans stages (-1: a middle stage, in no embd group)
    rankGroups: Object.fromEntries(
      GROUP_KINDS.filter((k) => k !== 'embd' || tied.length).map((k) => [
        k,
        ranks.map((r) =>
          k === 'embd' ? (topology.groupOf(k, r)?.id ?? -1) : topology.groupOf(k, r).id,
        ),
      ]),
    ),
    dataParallel: { size: l.dp, rankIndex: ranks.map((r) => topology.coords(r).dp) },
    symbols: graph.symbols,
    params: forward.params.map((p) => ({
      name: p.name,
      dtype: p.type.dtype,
      shape: p.type.shape as number[],
      init: p.init,
      trainable: p.trainable,
      module: p.module,
      weightDecay: p.trainable ? weightDecayOf(p, l.optimizer) : 0,
    })),
    rankPrograms: ranks.map((r) => {
      const c = topology.coords(r);
      return programId(c.pp, c.tp);
    }),
  };
}

/**
 * The config with --moe-expert-capacity-factor / --moe-token-drop-policy in its decoder: the flags
 * win over the keys of the same name, and the plan records what was compiled.
 */
function withTokenDropping(cfg: ModelConfig, o: CompileOptions): ModelConfig {
  if (
    o.moeExpertCapacityFactor === undefined &&
    o.moeTokenDropPolicy === undefined &&
    o.moeRoutingImbalance === undefined &&
    o.moeExpectedImbalance === undefined
  )
    return cfg;
  const d = cfg.model.text_decoder;
  const text_decoder: DecoderConfig = {
    ...d,
    moe_expert_capacity_factor: o.moeExpertCapacityFactor ?? d.moe_expert_capacity_factor,
    moe_token_drop_policy: o.moeTokenDropPolicy ?? d.moe_token_drop_policy,
    moe_routing_imbalance: o.moeRoutingImbalance ?? d.moe_routing_imbalance,
    moe_expected_imbalance: o.moeExpectedImbalance ?? d.moe_expected_imbalance,
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
/**
 * Writes a plan directory, replacing one that holds a plan at once (a new one is built beside and
 * renamed); `extra` files (the compile report) go in with it.
 */
export function writePlan(
  dir: string,
  plan: PlanFile,
  programs: readonly ProgramFile[],
  extra: Readonly<Record<string, string>> = {},
): void {
  if (existsSync(dir)) {
    const entries = readdirSync(dir);
    if (entries.length && !entries.includes('plan.json')) {
      throw new UserError(`${dir} exists and is not an lfc plan directory; choose another -o`);
    }
  }
  const tmp = join(dirname(dir), `.${basename(dir)}.tmp-${process.pid}`);
  rmSync(tmp, { recursive: true, force: true });
  makeDirs(join(tmp, 'programs'));
  writeFileSync(join(tmp, 'plan.json'), JSON.stringify(plan, null, 1) + '\n');
  // JSON.stringify's bytes, a relabeled program's made from its template's text (program-json.ts)
  for (const [p, pieces] of programJsons(programs)) {
    const fd = openSync(join(tmp, 'programs', `${p.id}.json`), 'w');
    try {
      for (const piece of pieces) writeSync(fd, piece);
      writeSync(fd, '\n');
    } finally {
      closeSync(fd);
    }
  }
  for (const [name, text] of Object.entries(extra)) {
    makeDirs(dirname(join(tmp, name)));
    writeFileSync(join(tmp, name), text);
  }
  if (existsSync(dir)) {
    const old = `${tmp}-old`;
    renameSync(dir, old);
    renameSync(tmp, dir);
    rmSync(old, { recursive: true, force: true });
  } else {
    makeDirs(dirname(dir));
    renameSync(tmp, dir);
  }
}
