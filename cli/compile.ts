// lfc compile <model> [overrides…] -o DIR: plan + report. The flags are LoongForge's and
// Megatron-LM's; compileRequest turns them into CompileOptions, and parseCompileArgs runs that
// conversion on an argument list without compiling (the tests' view of the parser).

import { Command, InvalidArgumentError, Option } from 'commander';
import { OFFLOAD_TENSORS, RECOMPUTE_MODULES } from '../compiler/frontend/activation-names.js';
import {
  describePasses,
  compile,
  writePlan,
  type CompileOptions,
  type CompileResult,
} from '../compiler/pipeline.js';
import {
  deviceMemoryOf,
  memoryByProgram,
  type DeviceMemory,
  type ProgramMemory,
} from '../compiler/report/memory.js';
import { describeLayout } from '../compiler/schedule/partition.js';
import { describeEncoder } from '../compiler/parallel/encoder.js';
import { UserError } from '../compiler/errors.js';
import type { Graph } from '../ir/graph.js';
import { graphToJSON } from '../ir/json.js';
import { hfModelRequest, loadHfModelConfig } from '../compiler/frontend/hf-config.js';
import type { CliIO } from './io.js';
import { atLeastOne, checkOutputPath, positiveInt, positiveNumber } from './options.js';
import { loadHardware, listHardware } from '../compiler/sim/hardware.js';
import { listDataProfiles } from '../compiler/frontend/data-profile.js';
import { describePrecision } from '../compiler/frontend/precision.js';
import { remediesFor, type Remedy } from '../compiler/report/advice.js';
import { availableParallelism } from 'node:os';
import { describeForecast, forecastStep, type StepForecast } from '../compiler/sim/report.js';
import { replaySetup } from '../compiler/sim/simulate.js';
import { rankTrace, writeTrace } from '../runtime/trace.js';

interface CompileFlags {
  modelName?: string;
  hfConfig?: string;
  output?: string;
  seqLength?: number;
  microBatchSize?: number;
  globalBatchSize?: number;
  maxVisualTokens?: number;
  lr?: number;
  nnodes?: number;
  nodes?: number;
  nprocPerNode?: number;
  gpusPerNode?: number;
  dumpAfter?: string;
  saveIr?: boolean;
  dumpProgram?: string;
  listPasses?: boolean;
  json?: boolean;
  hardware?: string;
  attentionKernel?: string;
  simulate?: boolean;
  trace?: string;
  tensorModelParallelSize?: number;
  tp?: number;
  pipelineModelParallelSize?: number;
  pp?: number;
  numVirtualStagesPerPipelineRank?: number;
  vpp?: number;
  expertModelParallelSize?: number;
  ep?: number;
  expertTensorParallelSize?: number;
  contextParallelSize?: number;
  sequenceParallel?: boolean;
  useDistributedOptimizer?: boolean;
  bf16?: boolean;
  fp16?: boolean;
  gradReduceInBf16?: boolean;
  accumulateAllreduceGradsInFp32?: boolean;
  microbatchGroupSizePerVpStage?: number;
  decoderFirstPipelineNumLayers?: number;
  accountForEmbeddingInPipelineSplit?: boolean;
  accountForLossInPipelineSplit?: boolean;
  decoderLastPipelineNumLayers?: number;
  enableEncoderHeteroDp?: boolean;
  enableFullHeteroDp?: boolean;
  fullHeteroDpCpuOffload?: boolean;
  fullHeteroDpEncoderRecompute?: boolean;
  useVitDpBalance?: boolean;
  overlapMoeExpertParallelComm?: boolean;
  delayWgradCompute?: boolean;
  /** false with --no-gradient-accumulation-fusion */
  gradientAccumulationFusion?: boolean;
  recomputeGranularity?: 'full' | 'selective';
  recomputeModules?: string[];
  fineGrainedActivationOffloading?: boolean;
  offloadTensors?: string[];
  trainingPhase?: TrainingPhase;
  attentionBackend?: AttentionBackend;
  moeTokenDispatcherType?: 'alltoall' | 'flex';
  moeExpertCapacityFactor?: number;
  moeTokenDropPolicy?: TokenDropPolicy;
  moeRoutingImbalance?: number;
  moeExpectedImbalance?: number;
  dataProfile?: string;
  advice?: boolean;
}

const TRAINING_PHASES = ['pretrain', 'sft'] as const;
type TrainingPhase = (typeof TRAINING_PHASES)[number];
const ATTENTION_BACKENDS = ['flash', 'fused', 'unfused', 'local', 'auto'] as const;
type AttentionBackend = (typeof ATTENTION_BACKENDS)[number];
// Megatron's choices (its default: probs)
const TOKEN_DROP_POLICIES = ['position', 'probs'] as const;
type TokenDropPolicy = (typeof TOKEN_DROP_POLICIES)[number];

/**
 * Megatron's --moe-token-dispatcher-type: alltoall, or flex (DeepEP), which moves the same rows
 * and is priced with its node deduplication; allgather is not built.
 */
export function dispatcherType(v: string): 'alltoall' | 'flex' {
  if (v === 'alltoall' || v === 'flex') return v;
  throw new InvalidArgumentError(
    v === 'allgather'
      ? "--moe-token-dispatcher-type allgather is not built; lfc's expert parallelism runs the alltoall and flex dispatchers"
      : `--moe-token-dispatcher-type must be alltoall or flex (Megatron's allgather is not built), got '${v}'`,
  );
}

/** What a compile command line asks for: the compile options and where the result goes. */
export interface CompileRequest {
  readonly options: CompileOptions;
  readonly output?: string;
  readonly json?: boolean;
  /** flags accepted for LoongForge/Megatron compatibility that change nothing in the plan */
  readonly compatibility: {
    readonly trainingPhase?: TrainingPhase;
    readonly attentionBackend?: AttentionBackend;
  };
}

/** A Hydra-style override (key=value, +key=value, ~key): never an activation or module name. */
const isOverride = (arg: string): boolean => arg.includes('=') || /^[+~]/.test(arg);

/** One value from a flag and its alias; both given and different is an error. */
function either(
  long: string,
  a: number | undefined,
  short: string,
  b: number | undefined,
): number | undefined {
  if (a !== undefined && b !== undefined && a !== b)
    throw new UserError(`${long} ${a} and ${short} ${b} disagree; give one`);
  return a ?? b;
}

/** bytes in the largest binary unit that keeps the number ≥ 1 (MiB at least) */
export function mib(bytes: number): string {
  const units = ['MiB', 'GiB', 'TiB', 'PiB'];
  let k = 0;
  while (k + 1 < units.length && bytes >= 2 ** (20 + 10 * (k + 1))) k++;
  return `${(bytes / 2 ** (20 + 10 * k)).toFixed(2)} ${units[k]}`;
}

/**
 * The report's parallel sizes: `tp 1, pp 2 × vpp 2, dp 2, ep 2 (expert dp 1)`; expert TP where it
 * is not tp: `ep 8 (expert tp 1, expert dp 4)`.
 */
export function describeSizes(
  result: CompileResult,
  o: Pick<CompileOptions, 'distributedOptimizer'>,
): string {
  const sz = result.plan.topology.sizes;
  return [
    `tp ${sz.tp}${result.sequenceParallel && sz.tp > 1 ? ' (sequence parallel)' : ''}`,
    `pp ${sz.pp}${sz.vpp > 1 ? ` × vpp ${sz.vpp}` : ''}`,
    `dp ${sz.dp}`,
    ...(sz.ep > 1
      ? [`ep ${sz.ep} (${sz.etp !== undefined ? `expert tp ${sz.etp}, ` : ''}expert dp ${sz.edp})`]
      : []),
    ...(o.distributedOptimizer && sz.dp > 1 ? ['distributed optimizer'] : []),
  ].join(', ');
}

/** The report's lines on where things run: each pipeline stage's layers, then the encoder. */
export function describePlacement(result: CompileResult): string[] {
  const route = result.graph.nodes.find((n) => n.op === 'vit_balance_route');
  const balance = route
    ? [
        `ViT DP balance: each round's images pooled over ${String(route.attrs.group)} (${String(route.attrs.group_size)} ranks), spread by patches², tokens sent home`,
      ]
    : [];
  return [
    ...(result.layout ? describeLayout(result.layout) : []),
    describeEncoder(result.placement),
    ...balance,
  ];
}

/**
 * The simulated step (compiler/sim) for the report, and the predicted timeline when asked for;
 * a plan over SIMULATE_BUDGET rank-instructions only with --simulate.
 */
function simulateReport(
  result: CompileResult,
  f: CompileFlags,
  starting: () => void = () => {},
): { forecast?: StepForecast; lines: string[]; writeTraceFile?: () => void } {
  const hw = hardwareOf(f);
  if (f.simulate === false) {
    if (f.trace) throw new UserError('--trace needs the simulation; drop --no-simulate');
    return { lines: [] };
  }
  const programs = new Map(result.programs.map((p) => [p.id, p]));
  // a symmetric plan replays a rank per program or class of alike programs (compiler/sim/
  // symmetry.ts), any other every rank; on the verifier's index of the plan where it made one
  const setup = replaySetup(result.plan, programs, 'alike', result.planIndex);
  const work = setup.rankInstructions;
  const forced = f.simulate === true || f.trace !== undefined;
  if (work > SIMULATE_BUDGET && !forced)
    return {
      lines: [
        `simulation skipped: ${(work / 1e6).toFixed(1)}M instructions to replay on ${setup.ranks} of ${setup.ix.world} ranks (over ${SIMULATE_BUDGET / 1e6}M); --simulate runs it`,
      ],
    };
  starting();
  const { forecast, simulation } = forecastStep(
    result.modelForwardFlops,
    result.plan,
    programs,
    hw,
    setup,
  );
  // written once the plan is (a trace inside the plan directory would go with the old one)
  const writeTraceFile = () => {
    if (!f.trace) return;
    const parts = simulation.ranks.map((r) =>
      rankTrace(
        result.plan,
        programs.get(r.program)!,
        r.rank,
        1,
        0,
        Array.from(r.start, (s, i) => ({ start: s * 1e3, end: r.end[i] * 1e3 })),
      ),
    );
    writeTrace(f.trace, parts, { model: result.config.name, simulated: hw.name, output: f.output });
  };
  return {
    writeTraceFile,
    forecast,
    lines: [
      ...describeForecast(forecast, hw),
      ...(f.trace ? [`trace: ${f.trace} (simulated)`] : []),
    ],
  };
}

/**
 * The report's memory table: a row per program (at most `rows`), GiB per rank, at the bounds, with
 * the typical step's total and, against a device, whether it fits.
 */
export function describeMemory(
  memory: readonly ProgramMemory[],
  rows = 8,
  device?: DeviceMemory,
): string[] {
  // GiB, or MiB for a plan whose largest rank needs under 1 GiB (the tiny models)
  const [unit, shift] =
    Math.max(0, ...memory.map((m) => m.device)) >= 2 ** 30 ? ['GiB', 30] : ['MiB', 20];
  const gib = (b: number) => (b / 2 ** shift).toFixed(2);
  const anyHost = memory.some((m) => m.host > 0);
  const anyExpected = memory.some((m) => m.expected.deviceBytes !== m.device);
  // a GPU device counts no CPU scratch (memoryByProgram): the column goes
  const anyScratch = memory.some((m) => m.scratch > 0);
  const head = [
    'program',
    'parameters',
    'gradients',
    'optimizer',
    'batch',
    'activations',
    ...(anyScratch ? ['scratch'] : []),
    'device total',
    ...(anyExpected ? ['expected'] : []),
    ...(anyHost ? ['host'] : []),
    ...(device ? [`fits ${device.name}`] : []),
  ];
  const body = memory.slice(0, rows).map((m) => {
    const stages = m.stages.length === 1 ? `stage ${m.stages[0]}` : `${m.stages.length} stages`;
    return [
      `${m.program} (${m.ranks} rank${m.ranks > 1 ? 's' : ''}, ${stages})`,
      ...[m.parameters, m.gradients, m.optimizer, m.batch, m.activations].map(gib),
      ...(anyScratch ? [gib(m.scratch)] : []),
      gib(m.device),
      ...(anyExpected ? [gib(m.expected.deviceBytes)] : []),
      ...(anyHost ? [gib(m.host)] : []),
      ...(device ? [m.fits ? 'yes' : 'NO'] : []),
    ];
  });
  const width = head.map((h, c) => Math.max(h.length, ...body.map((row) => row[c].length)));
  const line = (cells: readonly string[]) =>
    cells.map((x, c) => (c === 0 ? x.padEnd(width[c]) : x.padStart(width[c]))).join('  ');
  const more = memory.length - rows;
  const fitsNote = device
    ? `; fits: device total + ${(device.reserveBytes / 2 ** 30).toFixed(1)} GiB reserve ≤ ${(device.bytes / 2 ** 30).toFixed(0)} GiB`
    : '';
  return [
    `memory per rank, ${unit} (planned at the bounds of every size${anyScratch ? "; scratch: the CPU runtime's temporaries, per stream" : device?.runtime === 'gpu' ? "; the CPU runtime's scratch not counted: a GPU runtime's workspaces are in the reserve" : ''}${anyExpected ? '; expected: a typical step' : ''}${anyHost ? '; host: pinned, offloaded activations' : ''}${fitsNote}):`,
    `  ${line(head)}`,
    ...body.map((row) => `  ${line(row)}`),
    ...(more > 0 ? [`  … and ${more} program${more > 1 ? 's' : ''} more, smaller`] : []),
  ];
}

/** The arguments and options of `lfc compile`, declared on `cmd`. */
function defineCompileCommand(cmd: Command): Command {
  return cmd
    .description('compile one training step of a model into an execution plan per rank')
    .argument('[model]', 'preset name, LoongForge alias or YAML file')
    .argument('[overrides...]', 'Hydra-style overrides: key=value, +key=value, ~key')
    .option(
      '--model-name <name>',
      'the model, by preset or LoongForge name (instead of the argument)',
    )
    .option(
      '--hf-config <file>',
      'the model from a Hugging Face config.json (or its directory); a preset given too supplies what config.json lacks (training keys, tensor_model_parallel_size, freeze, …)',
    )
    .option(
      '-o, --output <dir>',
      'plan directory to write (replaced atomically if it holds a plan)',
    )
    .option(
      '--seq-length <n>',
      "tokens per sequence (default: the preset's)",
      positiveInt('--seq-length'),
    )
    .option(
      '--micro-batch-size <n>',
      'sequences per microbatch (packed)',
      positiveInt('--micro-batch-size'),
    )
    .option(
      '--global-batch-size <n>',
      'sequences per step over all data-parallel ranks',
      positiveInt('--global-batch-size'),
    )
    .option(
      '--data-profile <name|file>',
      `what a packed microbatch holds (configs/data: ${listDataProfiles().join(', ')}, or a YAML file); memory is planned at its visual-token cap and reported at its expected sizes (default: the preset's training.data_profile)`,
    )
    .option(
      '--max-visual-tokens <n>',
      "bound of visual tokens per microbatch (default: the data profile's cap)",
      positiveInt('--max-visual-tokens'),
    )
    .option(
      '--lr <x>',
      'peak learning rate (stored in the plan; lfc run can override)',
      positiveNumber('--lr'),
    )
    .option('--nnodes <n>', 'nodes in the cluster', positiveInt('--nnodes'))
    .option('--nodes <n>', 'alias of --nnodes', positiveInt('--nodes'))
    .option('--nproc-per-node <n>', 'ranks per node', positiveInt('--nproc-per-node'))
    .option('--gpus-per-node <n>', 'alias of --nproc-per-node', positiveInt('--gpus-per-node'))
    .option(
      '--tensor-model-parallel-size <n>',
      'decoder tensor parallelism (--tp)',
      positiveInt('--tensor-model-parallel-size'),
    )
    .option('--tp <n>', 'alias of --tensor-model-parallel-size', positiveInt('--tp'))
    .option(
      '--pipeline-model-parallel-size <n>',
      'pipeline stages (--pp)',
      positiveInt('--pipeline-model-parallel-size'),
    )
    .option('--pp <n>', 'alias of --pipeline-model-parallel-size', positiveInt('--pp'))
    .option(
      '--num-virtual-stages-per-pipeline-rank <n>',
      'model chunks per stage, interleaved schedule (--vpp)',
      positiveInt('--num-virtual-stages-per-pipeline-rank'),
    )
    .option('--vpp <n>', 'alias of --num-virtual-stages-per-pipeline-rank', positiveInt('--vpp'))
    .option(
      '--expert-model-parallel-size <n>',
      'expert parallelism (--ep)',
      positiveInt('--expert-model-parallel-size'),
    )
    .option('--ep <n>', 'alias of --expert-model-parallel-size', positiveInt('--ep'))
    .option(
      '--expert-tensor-parallel-size <n>',
      'tensor parallelism inside experts (default: --tp)',
      positiveInt('--expert-tensor-parallel-size'),
    )
    .option(
      '--context-parallel-size <n>',
      'context parallelism (only 1 is built)',
      positiveInt('--context-parallel-size'),
    )
    .option(
      '--use-distributed-optimizer',
      'shard AdamW state over data-parallel ranks (reduce-scatter gradients, all-gather parameters)',
    )
    .option(
      '--bf16',
      'mixed precision: bf16 activations and weights, fp32 main gradients, fp32 master weights and AdamW state',
    )
    .option('--fp16', 'fp16 mixed precision (not built: it needs loss scaling; use --bf16)')
    .option(
      '--accumulate-allreduce-grads-in-fp32',
      "with --bf16: fp32 main gradients, accumulated and summed in fp32 (Megatron's default)",
    )
    .option('--grad-reduce-in-bf16', 'with --bf16: keep the main gradients and their sums in bf16')
    .option(
      '--sequence-parallel',
      'shard activations along the sequence between tensor-parallel regions',
    )
    .option(
      '--microbatch-group-size-per-vp-stage <n>',
      'interleaved schedule: microbatches per group (default: --pp)',
      positiveInt('--microbatch-group-size-per-vp-stage'),
    )
    .option(
      '--decoder-first-pipeline-num-layers <n>',
      'decoder layers on the first pipeline stage',
      positiveInt('--decoder-first-pipeline-num-layers'),
    )
    .option(
      '--decoder-last-pipeline-num-layers <n>',
      'decoder layers on the last pipeline stage',
      positiveInt('--decoder-last-pipeline-num-layers'),
    )
    .option(
      '--account-for-embedding-in-pipeline-split',
      "Megatron's even split with the embedding counted as a layer: the first virtual stage holds one layer fewer",
    )
    .option(
      '--account-for-loss-in-pipeline-split',
      "Megatron's even split with lm_head and the loss counted as a layer: the last virtual stage holds one layer fewer",
    )
    .option(
      '--enable-encoder-hetero-dp',
      'level 2, hetero DP: each decoder TP rank encodes its own microbatches (encoder TP 1)',
    )
    .option(
      '--enable-full-hetero-dp',
      'level 3, full separation: every rank encodes before the decoder pipeline (encoder TP 1, cp 1)',
    )
    .option(
      '--full-hetero-dp-cpu-offload',
      'level 3: keep encoder outputs on the host until the decoder needs them',
    )
    .option(
      '--full-hetero-dp-encoder-recompute',
      'level 3: drop encoder activations after phase 1, recompute them before its backward',
    )
    .option(
      '--use-vit-dp-balance',
      "balance images over the encoder's data-parallel group by cost (patches²)",
    )
    .option(
      '--overlap-moe-expert-parallel-comm',
      "MoE all-to-all overlap: one microbatch's forward paired with another's backward (ep > 1; vpp > 1 when pp > 1)",
    )
    .option(
      '--delay-wgrad-compute',
      'with the all-to-all overlap: weight gradients later, to hide communication',
    )
    .option(
      '--no-gradient-accumulation-fusion',
      'weight-gradient GEMMs write a temporary that a separate kernel adds into the gradient (default: the GEMM adds into it)',
    )
    .addOption(
      new Option(
        '--recompute-granularity <granularity>',
        'recompute activations in backward',
      ).choices(['full', 'selective']),
    )
    .option(
      '--recompute-modules <names...>',
      `with --recompute-granularity selective, the modules to recompute: ${Object.keys(RECOMPUTE_MODULES).join(', ')}`,
    )
    .option(
      '--fine-grained-activation-offloading',
      'keep the activations named by --offload-tensors on the host between forward and backward',
    )
    .option(
      '--offload-tensors <names...>',
      `the activations to offload: ${Object.keys(OFFLOAD_TENSORS).join(', ')}`,
    )
    .addOption(
      new Option(
        '--training-phase <phase>',
        "LoongForge's trainer (accepted for compatibility: lfc compiles the same step for both)",
      ).choices(TRAINING_PHASES),
    )
    .addOption(
      new Option(
        '--attention-backend <backend>',
        "Megatron's attention kernels (accepted for compatibility: lfc's kernels are its own)",
      ).choices(ATTENTION_BACKENDS),
    )
    .option(
      '--moe-token-dispatcher-type <type>',
      'MoE token dispatcher: alltoall (default), or flex (DeepEP: a token crosses to each node that holds one of its experts once, and is forwarded there over NVLink; the same rows move here, the step is priced so)',
      dispatcherType,
    )
    .option(
      '--moe-expert-capacity-factor <c>',
      "token dropping: each expert keeps at most ceil(C·T·k/E) of a microbatch's T·k assignments (default: model.text_decoder.moe_expert_capacity_factor, else none dropped)",
      positiveNumber('--moe-expert-capacity-factor'),
    )
    .option(
      '--moe-routing-imbalance <f>',
      "without a capacity factor: plan each rank's expert dispatch for up to f × the rows balanced routing gives it, refused at run time beyond (default: model.text_decoder.moe_routing_imbalance, else the dropless worst case)",
      atLeastOne('--moe-routing-imbalance'),
    )
    .option(
      '--moe-expected-imbalance <f>',
      "the busiest expert-parallel rank's share of a typical step's routing, as a multiple of balanced routing's rows: the simulator prices each rank's expert dispatch at it (default: model.text_decoder.moe_expected_imbalance, else 1, balanced)",
      atLeastOne('--moe-expected-imbalance'),
    )
    .addOption(
      new Option(
        '--moe-token-drop-policy <policy>',
        "which assignments an expert over capacity keeps: probs, those of the highest routing weight (Megatron's default); position, the earliest in token order",
      ).choices(TOKEN_DROP_POLICIES),
    )
    .option(
      '--dump-after <pass>',
      `print the IR after a pass, or after an emission pass one program (--list-passes lists them)`,
    )
    .option(
      '--dump-program <id>',
      'the program --dump-after prints after an emission pass (p0, p1.t0, …; default: the first)',
    )
    .option(
      '--save-ir',
      "keep the IR after each graph pass in DIR/ir/ (lfc viz's graph view shows it beside the programs)",
    )
    .option('--list-passes', 'print the passes compile runs, in order, and exit')
    .option('--json', 'print the report as JSON')
    .option(
      '--hardware <name|file>',
      `the hardware profile the step is simulated on: ${listHardware().join(', ')}, or a YAML file (default h800)`,
    )
    .option(
      '--attention-kernel <name>',
      "the attention kernel the step is priced with, one the profile has figures for: flash2, flash3, cudnn on Hopper, flash2 on Ampere (default: the profile's)",
    )
    .option(
      '--simulate',
      `simulate the step even when the plan has over ${SIMULATE_BUDGET / 1e6}M rank-instructions`,
    )
    .option('--no-simulate', 'skip the simulated step in the report')
    .option('--no-advice', 'when the plan does not fit, skip planning the changes that would')
    .option(
      '--trace <file>',
      "the simulated step's timeline as a Chrome trace (the first rank of each distinct program)",
    );
}

/**
 * When some program does not fit: which, by how much, and whether the advice follows (the single
 * changes that would make it fit: planAdvice, describeAdvice).
 */
function describeFit(
  memory: readonly ProgramMemory[],
  device: DeviceMemory,
  advised: boolean,
): string[] {
  const over = memory.filter((m) => m.fits === false);
  if (!over.length) return [];
  const worst = over[0];
  return [
    `does not fit ${device.name}: ${over.map((m) => m.program).join(', ')} need${over.length > 1 ? '' : 's'} up to ${gibText(worst.device)} + ${gibText(device.reserveBytes)} reserve of ${gibText(device.bytes)}`,
    ...(advised
      ? [
          'the single changes that would make it fit: planned below, after the report (--no-advice skips them)',
        ]
      : []),
  ];
}

/** The fits advice: the changes that fit, each planned for its memory, or, with none, the closest three. */
function describeAdvice({ remedies, seconds, workers }: Advice): string[] {
  const fitting = remedies.filter((r) => r.fits);
  const shown = fitting.length ? fitting : remedies.slice(0, 3);
  return [
    fitting.length
      ? 'single changes that fit (each planned; largest program at the bounds):'
      : 'no single change fits; the closest (each planned; largest program at the bounds):',
    ...shown.map(
      (r) => `  ${r.change}: ${gibText(r.deviceBytes)}${r.fits ? '' : ' (does not fit)'}`,
    ),
    `  (planned ${remedies.length} alternatives in ${seconds.toFixed(1)} s on ${workers} thread${workers > 1 ? 's' : ''}; --no-advice skips them)`,
  ];
}

/**
 * Where no single change fits: the `lfc tune` line that searches whole layouts of the same model,
 * cluster, hardware, sequence, batch, precision and data (the compile's overrides kept, but those
 * that set a module's tensor parallelism, a knob the tuner searches).
 */
function tuneHint(
  advice: Advice,
  model: string | undefined,
  overrides: readonly string[],
  request: CompileRequest,
  f: CompileFlags,
): string[] {
  if (advice.remedies.some((r) => r.fits) || !model) return [];
  const o = request.options;
  const words = [
    'lfc tune',
    model,
    ...['--nnodes', String(o.nnodes ?? 1), '--nproc-per-node', String(o.nprocPerNode ?? 1)],
    ...(f.hardware ? ['--hardware', f.hardware] : []),
    ...(f.attentionKernel ? ['--attention-kernel', f.attentionKernel] : []),
    ...(o.seqLength ? ['--seq-length', String(o.seqLength)] : []),
    ...(o.globalBatchSize ? ['--global-batch-size', String(o.globalBatchSize)] : []),
    ...(f.bf16 ? ['--bf16'] : []),
    ...(f.dataProfile ? ['--data-profile', f.dataProfile] : []),
    ...(f.moeTokenDispatcherType ? ['--moe-token-dispatcher-type', f.moeTokenDispatcherType] : []),
    ...overrides.filter((x) => !/tensor_model_parallel_size/.test(x)),
  ];
  return [
    'whole layouts of this model and cluster, searched for one that fits:',
    `  ${words.join(' ')}`,
  ];
}

const gibText = (b: number) => `${(b / 2 ** 30).toFixed(1)} GiB`;

/** the fits advice: the changes planned, in how long, on how many threads */
interface Advice {
  readonly remedies: readonly Remedy[];
  readonly seconds: number;
  readonly workers: number;
}

/**
 * the threads the changes are planned on, each one change at a time with a compile's memory:
 * the cores, at most 4; LFC_ADVICE_THREADS sets another number (1: on the main thread)
 */
const ADVICE_WORKERS =
  Number(process.env.LFC_ADVICE_THREADS) >= 1
    ? Math.floor(Number(process.env.LFC_ADVICE_THREADS))
    : Math.min(availableParallelism(), 4);

/** plans the fits advice where some program does not fit and it is wanted (not --no-advice) */
async function planAdvice(
  result: CompileResult,
  request: CompileRequest,
  f: CompileFlags,
  progress: (text: string) => void,
): Promise<Advice | undefined> {
  const device = deviceMemoryOf(hardwareOf(f));
  if (
    f.advice === false ||
    f.json ||
    memoryByProgram(result, device).every((m) => m.fits !== false)
  )
    return undefined;
  const started = performance.now();
  progress('planning the changes that would fit');
  const remedies = await remediesFor(request.options, result.plan.topology.worldSize, device, {
    workers: ADVICE_WORKERS,
    onEach: (done, of) => progress(`planning the changes that would fit (${done} of ${of} done)`),
  });
  return { remedies, seconds: (performance.now() - started) / 1000, workers: ADVICE_WORKERS };
}

/** the profile --hardware names (default h800), its attention priced as --attention-kernel's */
const hardwareOf = (f: CompileFlags) => loadHardware(f.hardware ?? 'h800', f.attentionKernel);

/** rank-instructions to replay (Σ over the replayed ranks of their program's length: one rank per
 * program where the plan is symmetric) simulated without --simulate */
export const SIMULATE_BUDGET = 4e6;

/** The request of a parsed command line: flags → CompileOptions. Throws a UserError for a flag
 * that needs another; compile()'s layout rules check the combinations. */
export function compileRequest(
  model: string | undefined,
  overrides: readonly string[],
  f: CompileFlags,
): CompileRequest {
  // a list flag takes every argument up to the next flag: overrides after it stay overrides
  const lists = [...(f.recomputeModules ?? []), ...(f.offloadTensors ?? [])];
  const names = (list: string[] | undefined) => list?.filter((n) => !isOverride(n));
  const recomputeModules = names(f.recomputeModules);
  const offloadTensors = names(f.offloadTensors);
  let all = [...overrides, ...lists.filter(isOverride)];
  // with --hf-config the model argument is optional: an override in its place stays an override
  if (f.hfConfig && model !== undefined && !f.modelName && isOverride(model)) {
    all = [model, ...all];
    model = undefined;
  }
  let ref = f.modelName ?? model;
  if (f.modelName && model) all = [model, ...all];
  if (f.hfConfig) {
    // config.json's keys over the preset (or its family's base), the command line's over both
    loadHfModelConfig(f.hfConfig, ref, all);
    const hf = hfModelRequest(f.hfConfig, ref);
    ref = hf.model;
    all = [...hf.overrides, ...all];
  }
  if (!ref)
    throw new UserError('compile: name a model (a preset, a LoongForge name or a YAML file)');
  if (recomputeModules?.length && f.recomputeGranularity === undefined)
    throw new UserError(
      `--recompute-modules ${recomputeModules.join(' ')} needs --recompute-granularity selective`,
    );
  if (f.fineGrainedActivationOffloading && !offloadTensors?.length)
    throw new UserError(
      '--fine-grained-activation-offloading needs --offload-tensors <names...> (the activations to offload)',
    );
  if (offloadTensors?.length && !f.fineGrainedActivationOffloading)
    throw new UserError(
      `--offload-tensors ${offloadTensors.join(' ')} needs --fine-grained-activation-offloading`,
    );
  const encoder = {
    heteroDp: f.enableEncoderHeteroDp,
    fullHeteroDp: f.enableFullHeteroDp,
    cpuOffload: f.fullHeteroDpCpuOffload,
    recompute: f.fullHeteroDpEncoderRecompute,
    vitDpBalance: f.useVitDpBalance,
  };
  const moeOverlap = { overlap: f.overlapMoeExpertParallelComm, delayWgrad: f.delayWgradCompute };
  const precision = {
    bf16: f.bf16,
    fp16: f.fp16,
    gradReduceInBf16: f.gradReduceInBf16,
    accumulateAllreduceGradsInFp32: f.accumulateAllreduceGradsInFp32,
  };
  const anyGiven = (o: object): boolean => Object.values(o).some((v) => v !== undefined);
  return {
    options: {
      model: ref,
      overrides: all,
      seqLength: f.seqLength,
      microBatchSize: f.microBatchSize,
      globalBatchSize: f.globalBatchSize,
      maxVisualTokens: f.maxVisualTokens,
      nnodes: f.nnodes ?? f.nodes,
      nprocPerNode: f.nprocPerNode ?? f.gpusPerNode,
      parallel: {
        tp: either('--tensor-model-parallel-size', f.tensorModelParallelSize, '--tp', f.tp),
        pp: either('--pipeline-model-parallel-size', f.pipelineModelParallelSize, '--pp', f.pp),
        vpp: either(
          '--num-virtual-stages-per-pipeline-rank',
          f.numVirtualStagesPerPipelineRank,
          '--vpp',
          f.vpp,
        ),
        ep: either('--expert-model-parallel-size', f.expertModelParallelSize, '--ep', f.ep),
        etp: f.expertTensorParallelSize,
        cp: f.contextParallelSize,
      },
      sequenceParallel: f.sequenceParallel,
      distributedOptimizer: f.useDistributedOptimizer,
      ...(f.gradientAccumulationFusion === false ? { gradientAccumulationFusion: false } : {}),
      precision: anyGiven(precision) ? precision : undefined,
      microbatchGroupSize: f.microbatchGroupSizePerVpStage,
      decoderFirstPipelineNumLayers: f.decoderFirstPipelineNumLayers,
      decoderLastPipelineNumLayers: f.decoderLastPipelineNumLayers,
      accountForEmbeddingInPipelineSplit: f.accountForEmbeddingInPipelineSplit,
      accountForLossInPipelineSplit: f.accountForLossInPipelineSplit,
      optimizer: f.lr !== undefined ? { lr: f.lr } : {},
      encoder: anyGiven(encoder) ? encoder : undefined,
      moeOverlap: anyGiven(moeOverlap) ? moeOverlap : undefined,
      recompute: f.recomputeGranularity
        ? { granularity: f.recomputeGranularity, modules: recomputeModules }
        : undefined,
      offloadTensors,
      moeExpertCapacityFactor: f.moeExpertCapacityFactor,
      moeTokenDropPolicy: f.moeTokenDropPolicy,
      moeTokenDispatcher: f.moeTokenDispatcherType,
      moeRoutingImbalance: f.moeRoutingImbalance,
      moeExpectedImbalance: f.moeExpectedImbalance,
      dataProfile: f.dataProfile,
      hardware: hardwareOf(f),
      dumpAfter: f.dumpAfter,
      dumpProgram: f.dumpProgram,
    },
    output: f.output,
    json: f.json,
    compatibility: {
      trainingPhase: f.trainingPhase,
      attentionBackend: f.attentionBackend,
    },
  };
}

/** Parses the arguments after `lfc compile` into a request without compiling; commander's usage
 * errors throw as CommanderError, the request's own as UserError. */
export function parseCompileArgs(argv: readonly string[]): CompileRequest {
  let request: CompileRequest | undefined;
  defineCompileCommand(new Command('compile'))
    .exitOverride()
    .configureOutput({ writeOut: () => {}, writeErr: () => {} })
    .action((model: string | undefined, overrides: string[], f: CompileFlags) => {
      request = compileRequest(model, overrides, f);
    })
    .parse([...argv], { from: 'user' });
  return request!;
}

/**
 * On a terminal, one status line on stderr that names the phase a compile is in, redrawn as it
 * moves on and cleared at the end; elsewhere nothing (logs and pipes get the report alone).
 */
function compileStatus(io: CliIO, isTTY: boolean): { phase(text: string): void; done(): void } {
  const start = performance.now();
  let shown = false;
  return {
    phase(text) {
      if (!isTTY) return;
      const s = ((performance.now() - start) / 1000).toFixed(1);
      io.err(`\r\x1b[2Klfc compile: ${text}… (${s} s)`);
      shown = true;
    },
    done() {
      if (shown) io.err('\r\x1b[2K');
      shown = false;
    },
  };
}

export function addCompileCommand(program: Command, io: CliIO, isTTY: () => boolean): void {
  defineCompileCommand(program.command('compile')).action(
    async (model: string | undefined, overrides: string[], f: CompileFlags) => {
      if (f.listPasses) return io.out(describePasses());
      const request = compileRequest(model, overrides, f);
      if (!f.output && !f.dumpAfter)
        throw new UserError('compile: say where to write the plan with -o DIR');
      if (f.saveIr && !f.output)
        throw new UserError('--save-ir keeps the IR in the plan: give -o DIR');
      if (f.output) checkOutputPath('-o', f.output, 'dir');
      if (f.trace) checkOutputPath('--trace', f.trace, 'file');
      const status = compileStatus(io, isTTY() && !f.dumpAfter);
      // the IR after each graph pass, numbered in pass order (--save-ir): ir/03-tensor-parallel.json
      const ir: Record<string, string> = {};
      try {
        const result = compile({
          ...request.options,
          onDump: (text) => io.out(text),
          onProgress: (phase) => status.phase(phase),
          ...(f.saveIr
            ? {
                onGraph: (pass: string, g: Graph) => {
                  const n = String(Object.keys(ir).length + 1).padStart(2, '0');
                  ir[`ir/${n}-${pass}.json`] = graphToJSON(g) + '\n';
                },
              }
            : {}),
        });
        if (f.dumpAfter) {
          if (f.output) {
            status.phase(`writing ${f.output}`);
            writePlan(f.output, result.plan, result.programs, ir);
          }
          return;
        }
        const simulated = simulateReport(result, f, () => status.phase('simulating the step'));
        if (f.output) {
          status.phase(`writing ${f.output}`);
          // the report beside the plan, for lfc compare
          const json =
            JSON.stringify(reportJson(result, request.options, f, simulated), null, 2) + '\n';
          writePlan(f.output, result.plan, result.programs, { [REPORT_FILE]: json, ...ir });
        }
        simulated.writeTraceFile?.();
        status.done();
        // the report first: the advice plans a compile per change (seconds each), so it follows
        report(io, result, request, f, simulated);
        const advice = await planAdvice(result, request, f, (text) => status.phase(text));
        status.done();
        if (advice)
          io.out(
            [...describeAdvice(advice), ...tuneHint(advice, model, overrides, request, f)]
              .map((l) => `  ${l}`)
              .join('\n') + '\n',
          );
      } finally {
        status.done();
      }
    },
  );
}

/** the compile report's file in the plan directory (what lfc compare reads) */
export const REPORT_FILE = 'report.json';

/** The report as `--json` prints it and the plan directory keeps it (report.json). */
export interface CompileReportJson {
  readonly output?: string;
  readonly training: CompileResult['plan']['training'];
  readonly topology: CompileResult['plan']['topology'];
  readonly model: string;
  /** the encoder's level (0: none) and TP */
  readonly encoder: { readonly level: number; readonly tp: number };
  /** the features beyond the sizes, as flags: --use-distributed-optimizer, --recompute-granularity full, … */
  readonly features: readonly string[];
  readonly stats: CompileResult['stats'];
  readonly memory: { readonly device: DeviceMemory; readonly programs: ProgramMemory[] };
  readonly forecast?: StepForecast;
}

function reportJson(
  result: CompileResult,
  o: CompileOptions,
  f: CompileFlags,
  simulated: ReturnType<typeof simulateReport>,
): CompileReportJson {
  const device = deviceMemoryOf(hardwareOf(f));
  const features = [
    ...(result.sequenceParallel ? ['--sequence-parallel'] : []),
    ...(o.distributedOptimizer ? ['--use-distributed-optimizer'] : []),
    ...(o.moeOverlap?.overlap ? ['--overlap-moe-expert-parallel-comm'] : []),
    ...(o.recompute
      ? [
          `--recompute-granularity ${o.recompute.granularity}${o.recompute.modules?.length ? ` --recompute-modules ${o.recompute.modules.join(' ')}` : ''}`,
        ]
      : []),
    ...(o.offloadTensors?.length ? [`--offload-tensors ${o.offloadTensors.join(' ')}`] : []),
    ...(o.encoder?.cpuOffload ? ['--full-hetero-dp-cpu-offload'] : []),
    ...(o.encoder?.recompute ? ['--full-hetero-dp-encoder-recompute'] : []),
    ...(result.precision.compute === 'bf16' ? ['--bf16'] : []),
    ...(o.gradientAccumulationFusion === false ? ['--no-gradient-accumulation-fusion'] : []),
    ...(o.moeTokenDispatcher === 'flex' ? ['--moe-token-dispatcher-type flex'] : []),
  ];
  return {
    output: f.output,
    model: result.config.name,
    encoder: { level: result.placement.level, tp: result.placement.encoderTp },
    features,
    training: result.plan.training,
    topology: result.plan.topology,
    stats: result.stats,
    memory: { device, programs: memoryByProgram(result, device) },
    forecast: simulated.forecast,
  };
}

/**
 * The compile report on stdout: the plan's figures, memory (and whether it fits) and the
 * simulated step; the fits advice, where some program does not fit, follows it (describeAdvice).
 */
function report(
  io: CliIO,
  result: ReturnType<typeof compile>,
  request: CompileRequest,
  f: CompileFlags,
  simulated: ReturnType<typeof simulateReport>,
): void {
  const e = result.stats.emit;
  const t = result.plan.training;
  const device = deviceMemoryOf(hardwareOf(f));
  const memory = memoryByProgram(result, device);
  if (f.json) {
    io.out(JSON.stringify(reportJson(result, request.options, f, simulated), null, 2) + '\n');
    return;
  }
  const world = result.plan.topology.worldSize;
  const programs = result.programs.length;
  io.out(
    [
      `compiled ${result.config.name} for ${world} rank${world > 1 ? 's' : ''} (${describeSizes(result, request.options)}; ${programs} distinct program${programs > 1 ? 's' : ''}) → ${f.output}`,
      ...describePlacement(result).map((l) => `  ${l}`),
      `  sequence ${t.seqLength} × micro-batch ${t.microBatchSize}, ${t.numMicrobatches} microbatches per step per data-parallel rank, ≤ ${t.maxVisualTokens} visual tokens each (data profile ${result.data.profile}: ${result.data.sizes.expected.visualTokens} expected)`,
      `  precision: ${describePrecision(result.precision)}`,
      ...(request.options.moeTokenDispatcher === 'flex'
        ? [
            "  MoE dispatcher: flex (DeepEP's): the expert exchanges priced with its node deduplication; the rows move as the all-to-all's",
          ]
        : []),
      `  graph: ${result.graph.nodes.length} nodes (${result.stats.autodiff.backwardNodes} backward, ${result.stats.autodiff.optimizerNodes} optimizer), ${result.stats.autodiff.trainableParams} trainable tensors on each rank`,
      `  program${programs > 1 ? 's (largest)' : ''}: ${e.instructions} instructions, ${e.buffers} buffers; plan verified in ${(result.stats.verify.ms / 1000).toFixed(2)} s`,
      `  activation arena ${mib(e.arenaBytes)} (liveness lower bound ${mib(e.arenaLowerBoundBytes)}, ×${(e.arenaBytes / e.arenaLowerBoundBytes).toFixed(3)})`,
      ...(e.hostBytes
        ? [`  host region ${mib(e.hostBytes)} (offloaded tensors, pinned host memory)`]
        : []),
      ...describeMemory(memory, 8, device).map((l) => `  ${l}`),
      ...describeFit(memory, device, f.advice !== false).map((l) => `  ${l}`),
      ...simulated.lines.map((l) => `  ${l}`),
      '',
    ].join('\n'),
  );
}
