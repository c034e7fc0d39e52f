// The plan format: what `lfc compile` writes and the native runtime executes.
//
// A plan is a directory:
//   plan.json            PlanFile: model summary, training settings, topology, groups, the
//                        parameters with their shard of the global tensor, and which program
//                        each rank runs
//   programs/<id>.json   ProgramFile: one per distinct rank behaviour (ranks that behave alike
//                        share one)
//
// A program is static: buffers with arena offsets and instructions in issue order per stream.
// Only symbolic sizes are resolved at run time, per microbatch, from the data (S tokens, Nv
// visual tokens). The C++ runtime's view of these declarations is generated from this file's
// constants (runtime-native/src/generated/schema.h, `npm run gen:native`); a test checks the
// generated header is current, so the two cannot drift.

import type { ParamDist } from '../../ir/graph.js';

export const PLAN_FORMAT = 'lfc-plan';
export const PROGRAM_FORMAT = 'lfc-program';
/** bump on any change a runtime must know about; runtimes refuse other versions */
export const PLAN_VERSION = 4;

/**
 * compute  kernels, and the collectives inside a pass whose results are needed at once (tensor
 *          and expert parallelism's)
 * comm     what crosses pipeline stages (send/recv batches), the encoder handoff, the all-to-alls
 *          of an overlapped step
 * copy     offload and reload between device and host memory
 * grad     the gradient sums and reduce-scatters of data parallelism, issued as backward finishes
 *          each bucket and run beside the rest of backward (as Megatron's gradient buffers
 *          reduce on their data-parallel group's own stream): on the comm stream they held up
 *          the pipeline's sends behind them (version 4)
 */
export const STREAMS = ['compute', 'comm', 'copy', 'grad'] as const;
export type StreamName = (typeof STREAMS)[number];

export const BUFFER_REGIONS = [
  'arena',
  'param',
  'grad',
  'optim',
  'data',
  'scalar',
  'host',
] as const;
/**
 * arena   activations and temporaries, placed by the memory planner (offset within the arena)
 * param   parameter storage (persistent; offset within the parameter region)
 * grad    accumulated gradients of trainable parameters (persistent, zeroed each step)
 * optim   optimizer state (AdamW m and v; persistent)
 * data    per-microbatch inputs the runtime fills from the data source (offset within the data
 *         region of that microbatch slot)
 * scalar  step scalars the runtime fills: loss_tokens, clip coefficient, …
 * host    activations offloaded between forward and backward (space 'host': pinned host memory
 *         on a GPU), placed by the memory planner from their lifetimes like the arena; only
 *         offload and reload (copy stream) touch it
 */
export type BufferRegion = (typeof BUFFER_REGIONS)[number];

/**
 * The regions of a program's memory: the buffers' regions, and `scratch`, which holds no buffers:
 * the temporaries the CPU runtime's kernels and ops take that the IR does not name (staged f32
 * copies of bf16 operands, norm statistics, attention's score tiles, a reduce-scatter's whole
 * sum), one slice per stream (ProgramFile.scratchBytes), planned by compiler/plan/scratch.ts.
 */
export const PROGRAM_REGIONS = [...BUFFER_REGIONS, 'scratch'] as const;
export type ProgramRegion = (typeof PROGRAM_REGIONS)[number];

export interface PlanBuffer {
  /** index in the program's buffer list */
  readonly id: number;
  /** the IR value it holds (for messages and dumps) */
  readonly name: string;
  readonly region: BufferRegion;
  readonly space: 'device' | 'host';
  readonly dtype: string;
  /** dims as text: numbers or symbolic (`S`, `4*Nv`), resolved per microbatch */
  readonly shape: readonly string[];
  /** byte offset within its region (arena: planned; others: laid out in order) */
  readonly offset: number;
  /** bytes at the declared bounds of its symbols */
  readonly bytes: number;
  /** for a view (reshape): the buffer whose bytes it shares; offset and bytes are that buffer's */
  readonly viewOf?: number;
  /** data buffers: which microbatch slot; arena buffers: which microbatch produced it (-1: step) */
  readonly microbatch: number;
}

export interface PlanInstruction {
  readonly stream: StreamName;
  /** op kind from the op table */
  readonly op: string;
  readonly inputs: readonly number[];
  readonly outputs: readonly number[];
  readonly attrs: Readonly<Record<string, unknown>>;
  /** events this instruction waits for before it starts, and records when it ends */
  readonly wait: readonly number[];
  readonly record: readonly number[];
  /** microbatch whose symbol sizes apply (-1: none, the optimizer step) */
  readonly microbatch: number;
  readonly phase: 'forward' | 'backward' | 'optimizer';
  readonly scope: string;
}

export interface PlanParam {
  /** checkpoint name (whole tensor) */
  readonly name: string;
  readonly dtype: string;
  readonly shape: readonly number[];
  readonly init: string;
  readonly trainable: boolean;
  readonly module: string;
  readonly weightDecay: number;
}

export interface ProgramParam {
  readonly name: string;
  readonly buffer: number;
  readonly grad?: number;
  readonly expAvg?: number;
  readonly expAvgSq?: number;
  /** mixed precision: the fp32 master weights AdamW updates (the parameter is their rounding) */
  readonly master?: number;
  /** this rank's slice of the global tensor: per dim [start, length] (without dist) */
  readonly shard: readonly (readonly [number, number])[];
  /**
   * set when the parameter is a piece of a whole tensor split over groups (tensor or expert
   * parallelism): the whole tensor's name and shape, and how the rank's group indices pick its
   * piece (ir/graph.ts ParamDist)
   */
  readonly dist?: ParamDist;
}

export interface ProgramInput {
  /** the data field: tokens, labels, loss_mask, positions, segments, patches, … */
  readonly name: string;
  readonly buffer: number;
  readonly microbatch: number;
}

export interface ProgramFile {
  readonly format: typeof PROGRAM_FORMAT;
  readonly version: number;
  readonly id: string;
  /** bytes of each region, at symbol bounds */
  readonly regions: Readonly<Record<ProgramRegion, number>>;
  /**
   * Each stream's slice of the scratch region, in STREAMS order (multiples of 64, summing to
   * regions.scratch): the most scratch one of the stream's instructions takes at the bounds
   * (compiler/plan/scratch.ts). The runtime resets a stream's slice after every instruction and
   * fails an instruction that would take more.
   */
  readonly scratchBytes: Readonly<Record<StreamName, number>>;
  /** the most bytes of the arena live at once at declared bounds, for the planner's report */
  readonly arenaLowerBoundBytes: number;
  /**
   * at the symbols' expected sizes (a data profile's means, balanced routing), where some differs
   * from its bound: the most arena bytes live at once, and the data region's bytes
   */
  readonly expectedBytes?: { readonly arena: number; readonly data: number };
  readonly buffers: readonly PlanBuffer[];
  readonly params: readonly ProgramParam[];
  readonly inputs: readonly ProgramInput[];
  /** step scalars: loss_tokens (filled before the step), clip_coef (computed by the plan) */
  readonly scalars: Readonly<Record<string, number>>;
  /** outputs the runtime reports per microbatch: loss, ce_loss, aux_loss */
  readonly outputs: readonly {
    readonly name: string;
    readonly buffer: number;
    readonly microbatch: number;
  }[];
  readonly events: number;
  readonly instructions: readonly PlanInstruction[];
  /**
   * --use-distributed-optimizer: AdamW state of flat gradient buckets, each split in `parts`
   * equal slices over a data-parallel group (rank i of the group holds slice i)
   */
  readonly optimizerShards?: readonly OptimizerShard[];
}

export interface OptimizerShard {
  /** group kind the bucket is sharded over (dp, or edp for experts) */
  readonly group: string;
  readonly parts: number;
  /** f32 elements of the whole bucket (a multiple of parts) */
  readonly elements: number;
  /** buffers of this rank's slice of exp_avg and exp_avg_sq */
  readonly expAvg: number;
  readonly expAvgSq: number;
  /** mixed precision: this rank's slice of the fp32 master weights */
  readonly master?: number;
  /** the parameters laid out in the bucket: element offset and count */
  readonly params: readonly {
    readonly name: string;
    readonly offset: number;
    readonly elements: number;
  }[];
}

export interface PlanFile {
  readonly format: typeof PLAN_FORMAT;
  readonly version: number;
  readonly createdBy: string;
  readonly model: {
    readonly name: string;
    /** the resolved model config (encoder, projector, decoder) */
    readonly config: unknown;
    readonly paramsTotal: number;
  };
  readonly training: {
    readonly seqLength: number;
    readonly microBatchSize: number;
    readonly globalBatchSize: number;
    /** microbatches per step on one data-parallel rank */
    readonly numMicrobatches: number;
    readonly maxVisualTokens: number;
    /**
     * mixed precision (--bf16): the element type of activations and parameters, and of the main
     * gradients; absent: f32 throughout
     */
    readonly precision?: { readonly compute: string; readonly grad: string };
    readonly optimizer: {
      readonly lr: number;
      readonly beta1: number;
      readonly beta2: number;
      readonly eps: number;
      readonly weightDecay: number;
      readonly clipNorm: number;
    };
  };
  readonly topology: {
    readonly worldSize: number;
    readonly nnodes: number;
    readonly nprocPerNode: number;
    readonly sizes: Readonly<Record<string, number>>;
    /** decoder layers of each virtual stage s = chunk·pp + stage (pipelines only) */
    readonly pipelineLayers?: readonly number[];
  };
  readonly groups: readonly { readonly name: string; readonly ranks: readonly number[] }[];
  /**
   * Per group kind (tp, dp, pp, ep, …), the index into `groups` of each rank's group. A
   * collective's `group` attribute names a kind, so ranks that behave alike share one program.
   */
  readonly rankGroups: Readonly<Record<string, readonly number[]>>;
  /** data parallelism: global microbatch of slot j on a rank = dpIndex · numMicrobatches + j */
  readonly dataParallel: { readonly size: number; readonly rankIndex: readonly number[] };
  readonly symbols: readonly {
    readonly name: string;
    readonly bound: number;
    readonly doc: string;
    /** what a typical step sees (data profile, balanced routing); absent: the bound */
    readonly expected?: number;
  }[];
  readonly params: readonly PlanParam[];
  /** program id of each rank, by rank */
  readonly rankPrograms: readonly string[];
}

/** The pipeline stage of a rank: pp is the slowest dim of every rank grid. */
export function stageOfRank(plan: PlanFile, rank: number): number {
  const { worldSize, sizes } = plan.topology;
  return Math.floor(rank / (worldSize / sizes.pp));
}

/**
 * A copy of x with `change`, in the key order every instruction the compiler makes has (draft.ts
 * scheduled writes the same literal). V8 then gives all of a program's instructions one hidden
 * class, and the loops over them (passes, memory plan, verifier, simulator) stay monomorphic; a
 * spread copy (`{ ...x, wait }`) makes a class of its own, and code optimized for the first class
 * is thrown away and optimized again when it meets a few of those.
 */
export function instructionWith(
  x: PlanInstruction,
  change: Partial<PlanInstruction>,
): PlanInstruction {
  return {
    stream: change.stream ?? x.stream,
    op: change.op ?? x.op,
    inputs: change.inputs ?? x.inputs,
    outputs: change.outputs ?? x.outputs,
    attrs: change.attrs ?? x.attrs,
    wait: change.wait ?? x.wait,
    record: change.record ?? x.record,
    microbatch: change.microbatch ?? x.microbatch,
    phase: change.phase ?? x.phase,
    scope: change.scope ?? x.scope,
  };
}

/**
 * A copy of b with `change`, in the key order every buffer the compiler makes has (draft.ts
 * addBuffer), for the reason instructionWith gives: `viewOf` is always a key, undefined on a
 * buffer that is not a view (JSON leaves it out); `viewOf: undefined` in `change` makes a copy of a
 * view a buffer of its own.
 */
export function bufferWith(b: PlanBuffer, change: Partial<PlanBuffer>): PlanBuffer {
  return {
    id: change.id ?? b.id,
    name: change.name ?? b.name,
    region: change.region ?? b.region,
    space: change.space ?? b.space,
    dtype: change.dtype ?? b.dtype,
    shape: change.shape ?? b.shape,
    offset: change.offset ?? b.offset,
    bytes: change.bytes ?? b.bytes,
    viewOf: 'viewOf' in change ? change.viewOf : b.viewOf,
    microbatch: change.microbatch ?? b.microbatch,
  };
}

/**
 * For each instruction, the first and last instruction of its batch (consecutive instructions of
 * one stream with the same `batch` attribute, posted together); itself when not batched.
 */
export function batchSpans(instructions: readonly PlanInstruction[]): {
  first: Int32Array;
  last: Int32Array;
} {
  const n = instructions.length;
  const first = new Int32Array(n);
  const last = new Int32Array(n);
  const batchOf = (i: number) => {
    const b = instructions[i].attrs.batch;
    return typeof b === 'number' ? b : -1;
  };
  for (let i = 0; i < n;) {
    const b = batchOf(i);
    let j = i + 1;
    if (b >= 0)
      while (j < n && batchOf(j) === b && instructions[j].stream === instructions[i].stream) j++;
    for (let k = i; k < j; k++) {
      first[k] = i;
      last[k] = j - 1;
    }
    i = j;
  }
  return { first, last };
}
