// The program IR between emission passes: one rank's program (compiler/plan/format.ts
// ProgramFile) as the passes build it, with the little that later passes need and the file does
// not hold. A pass takes a draft and returns the next one. Drafts are linear: emitProgram hands
// each to the dump, then to the next pass, and never reads it again. So a pass copies only what it
// changes, and the two that change every buffer (number, memory-plan) do so in place: copying the
// 235B layout's 400k instructions and 430k buffers cost a second of its compile and 0.2 GiB.
//
// ProgramBuilder is how a pass adds to a draft: buffers (persistent regions laid out in the order
// they are made, arena and host ones placed later by the memory plan), instructions in issue
// order, and events (an event is recorded by one instruction and waited for by others).

import { DTYPE_BYTES, type DType } from '../../ir/dtype.js';
import type { Graph, Node } from '../../ir/graph.js';
import { OP_TABLE } from '../../ir/ops.js';
import { formatDim, numel } from '../../ir/shape.js';
import type { TensorType } from '../../ir/types.js';
import {
  instructionWith,
  PLAN_VERSION,
  PROGRAM_FORMAT,
  PROGRAM_REGIONS,
  STREAMS,
  type BufferRegion,
  type ProgramRegion,
  type OptimizerShard,
  type PlanInstruction,
  type ProgramFile,
  type StreamName,
} from '../plan/format.js';
import { align } from '../plan/memory.js';
import { rootOf, type MutableBuffer } from './rewrite.js';
import {
  EXP_AVG,
  EXP_AVG_SQ,
  GRAD,
  MASTER,
  PARAM,
  valueNumbering,
  Values,
  type ValueNumbering,
} from './values.js';

export interface ProgramOutput {
  readonly name: string;
  readonly buffer: number;
  readonly microbatch: number;
}

/** The program being built: the file's parts (arena, host and scratch 0 until the memory plan). */
export interface ProgramDraft extends Omit<
  ProgramFile,
  'format' | 'version' | 'optimizerShards' | 'scratchBytes'
> {
  readonly optimizerShards: readonly OptimizerShard[];
  /** set by the memory plan */
  readonly scratchBytes?: ProgramFile['scratchBytes'];
  // ---- for later passes only (not written to the plan) ----
  /** a comm unit's buffers stay allocated until an instruction waits for its event */
  readonly keepUntilWait: ReadonlyMap<number, readonly number[]>;
  /** events the next compute instruction must wait for, left open by lowering */
  readonly openWaits: readonly number[];
  /** distributed optimizer, by shard: the gradient bucket (reduce-scattered in place: this
   * rank's block holds its block of the sum) and the bucket's parameters */
  readonly shardBuffers: readonly { readonly bucket: number; readonly param: number }[];
  /** places between instructions where a later pass inserts (lowering's, in issue order) */
  readonly marks: readonly Mark[];
  /** buffers a pass reads that another rank's work fills (the encoder handoff resolves them) */
  readonly imports: readonly Import[];
  /** each microbatch slot's values at the end of lowering: buffer by value */
  readonly values: readonly Values[];
}

/**
 * A place in the instruction list: before instruction `pos`, after whatever earlier marks at the
 * same place insert. `wait`: events the first instruction inserted there waits for (what the next
 * compute instruction would have waited for; with nothing inserted, that one still does).
 */
export type Mark =
  /** the p2p batch before schedule step `step` (steps.length: after the last): the sends of the
   * step before, the recvs of this one (their buffers made by lowering) */
  | {
      readonly kind: 'p2p';
      readonly pos: number;
      readonly step: number;
      readonly sends: readonly Unscheduled[];
      readonly recvs: readonly Unscheduled[];
    }
  /** level 3 phase 1: after round `round`'s encoder run (`outputs`: this rank's, none for a mock
   * slot that does not encode) */
  | {
      readonly kind: 'encoded';
      readonly pos: number;
      readonly round: number;
      readonly outputs: ReadonlyMap<string, number>;
      readonly wait: readonly number[];
    }
  /** levels 2 and 3, stage 0: before microbatch mb's first decoder forward */
  | {
      readonly kind: 'decoder-forward';
      readonly pos: number;
      readonly mb: number;
      readonly wait: readonly number[];
    }
  /** level 3 phase 3: before round `round`'s encoder backward */
  | {
      readonly kind: 'encoder-backward';
      readonly pos: number;
      readonly round: number;
      readonly wait: readonly number[];
    };

/** A buffer lowering made for a value that arrives from elsewhere (an encoder output or its
 * gradient of microbatch slot mb); the handoff decides how it is filled, and names it so. */
export interface Import {
  readonly buffer: number;
  readonly value: string;
  readonly mb: number;
}

/**
 * The instruction list with `inserts` (by index into `marks`) placed at their marks, and the marks
 * moved to where their inserts begin.
 */
export function insertAtMarks(
  instructions: readonly PlanInstruction[],
  marks: readonly Mark[],
  inserts: ReadonlyMap<number, readonly PlanInstruction[]>,
): { instructions: PlanInstruction[]; marks: Mark[] } {
  const out: PlanInstruction[] = [];
  const moved: Mark[] = [];
  let k = 0;
  for (let i = 0; i <= instructions.length; i++) {
    for (; k < marks.length && marks[k].pos === i; k++) {
      moved.push({ ...marks[k], pos: out.length });
      for (const x of inserts.get(k) ?? []) out.push(x);
    }
    if (i < instructions.length) out.push(instructions[i]);
  }
  return { instructions: out, marks: moved };
}

/**
 * The first instruction at or after `pos` that is not on the comm stream (what lowering hands
 * pending waits to: the comm stream's units wait on events of their own), -1 if none.
 */
export function nextNonComm(instructions: readonly PlanInstruction[], pos: number): number {
  for (let i = pos; i < instructions.length; i++) if (instructions[i].stream !== 'comm') return i;
  return -1;
}

/** The last instruction before `pos` that is not on the comm stream, -1 if none. */
export function lastNonComm(instructions: readonly PlanInstruction[], pos: number): number {
  for (let i = pos - 1; i >= 0; i--) if (instructions[i].stream !== 'comm') return i;
  return -1;
}

/** A copy of instruction x that waits for `wait` before what it waited for. */
export const waitingFirst = (x: PlanInstruction, wait: readonly number[]): PlanInstruction =>
  wait.length ? instructionWith(x, { wait: [...wait, ...x.wait] }) : x;

/** The plan's program file of a finished draft. */
export function programFileOf(d: ProgramDraft): ProgramFile {
  return {
    format: PROGRAM_FORMAT,
    version: PLAN_VERSION,
    id: d.id,
    regions: d.regions,
    scratchBytes: d.scratchBytes ?? NO_SCRATCH,
    arenaLowerBoundBytes: d.arenaLowerBoundBytes,
    ...(d.expectedBytes ? { expectedBytes: d.expectedBytes } : {}),
    buffers: d.buffers,
    params: d.params,
    inputs: d.inputs,
    scalars: d.scalars,
    outputs: d.outputs,
    events: d.events,
    instructions: d.instructions,
    ...(d.optimizerShards.length ? { optimizerShards: d.optimizerShards } : {}),
  };
}

const EMPTY_REGIONS = Object.fromEntries(PROGRAM_REGIONS.map((r) => [r, 0])) as Readonly<
  Record<ProgramRegion, number>
>;
const NO_SCRATCH = Object.fromEntries(STREAMS.map((s) => [s, 0])) as ProgramFile['scratchBytes'];

/** An instruction before its events: what push() is given. */
export type Unscheduled = Omit<PlanInstruction, 'wait' | 'record'>;

/** a tensor type's bytes at the bounds and its shape text, by the symbols it is sized by */
interface TypeInfo {
  readonly bytes: number;
  readonly shape: string[];
}
const typeInfos = new WeakMap<Graph['symbols'], WeakMap<TensorType, TypeInfo>>();

/** Adds buffers, instructions and events to (a copy of) a draft's lists. */
export class ProgramBuilder {
  readonly buffers: MutableBuffer[];
  readonly instructions: PlanInstruction[];
  readonly regionTop: Record<ProgramRegion, number>;
  events: number;
  private readonly bound: Map<string, number>;
  // a value's type object is shared by its buffers of every microbatch: size and shape text once,
  // for every program of the graph (the cost model knows alike operands by their shape text)
  private readonly typeInfo: WeakMap<TensorType, TypeInfo>;

  constructor(g: Pick<Graph, 'symbols'>, from?: ProgramDraft) {
    this.bound = new Map(g.symbols.map((s) => [s.name, s.bound]));
    let types = typeInfos.get(g.symbols);
    if (!types) typeInfos.set(g.symbols, (types = new WeakMap()));
    this.typeInfo = types;
    this.buffers = from ? [...from.buffers] : [];
    this.instructions = from ? [...from.instructions] : [];
    this.regionTop = { ...(from?.regions ?? EMPTY_REGIONS) };
    this.events = from?.events ?? 0;
  }

  private infoOf(t: TensorType) {
    let i = this.typeInfo.get(t);
    if (!i) {
      i = {
        bytes: numel(t.shape, (s) => this.bound.get(s)!) * DTYPE_BYTES[t.dtype],
        shape: t.shape.map(formatDim),
      };
      this.typeInfo.set(t, i);
    }
    return i;
  }

  /** A buffer for a value; a view shares the bytes (and region) of the buffer it views. */
  addBuffer(
    name: string,
    t: TensorType,
    region: BufferRegion,
    microbatch: number,
    viewOf?: number,
  ): number {
    const id = this.buffers.length;
    const { bytes, shape } = this.infoOf(t);
    let offset = 0;
    if (viewOf !== undefined) offset = this.buffers[viewOf].offset;
    else if (region !== 'arena' && region !== 'host') {
      offset = this.regionTop[region];
      this.regionTop[region] += align(Math.max(bytes, 1));
    }
    const space = t.space ?? 'device';
    const dtype = t.dtype;
    // format.ts bufferWith's key order, written out (not a spread): a program has tens of thousands
    this.buffers.push({
      id,
      name,
      region: viewOf !== undefined ? this.buffers[viewOf].region : region,
      space,
      dtype,
      shape,
      offset,
      bytes,
      viewOf,
      microbatch,
    });
    return id;
  }

  /** A flat f32 buffer of a region at a given offset (gradient buckets and their shards). */
  addFlat(
    name: string,
    region: BufferRegion,
    offset: number,
    bytes: number,
    dtype: DType = 'f32',
  ): number {
    const id = this.buffers.length;
    this.buffers.push({
      id,
      name,
      region,
      space: 'device',
      dtype,
      shape: [String(bytes / DTYPE_BYTES[dtype])],
      offset,
      bytes,
      viewOf: undefined,
      microbatch: -1,
    });
    return id;
  }

  root(id: number): number {
    return rootOf(this.buffers, id);
  }

  /** Appends an instruction waiting for `wait`; returns its index. */
  push(ins: Unscheduled, wait: readonly number[] = NO_EVENTS): number {
    this.instructions.push(scheduled(ins, wait));
    return this.instructions.length - 1;
  }

  /** A new event recorded when instruction idx ends. */
  record(idx: number): number {
    const e = this.events++;
    const x = this.instructions[idx];
    this.instructions[idx] = instructionWith(x, { record: [...x.record, e] });
    return e;
  }

  /** the index of the last instruction on a stream, -1 if none */
  lastOn(stream: StreamName): number {
    let k = this.instructions.length - 1;
    while (k >= 0 && this.instructions[k].stream !== stream) k--;
    return k;
  }
}

/**
 * The empty event list every instruction without waits or records shares: most have neither, and
 * a list each was two arrays an instruction (690k on the article's level-3 line) for the garbage
 * collector to move. Event lists are never changed in place once an instruction has them
 * (a pass that adds an event makes a new list), so sharing is safe; numbering renames non-empty
 * lists in place, each its instruction's own.
 */
export const NO_EVENTS: readonly number[] = [];

/** An instruction with its events, in the key order every instruction of a program has. */
export function scheduled(ins: Unscheduled, wait: readonly number[]): PlanInstruction {
  return {
    stream: ins.stream,
    op: ins.op,
    inputs: ins.inputs,
    outputs: ins.outputs,
    attrs: ins.attrs,
    wait: wait.length ? wait : NO_EVENTS,
    record: NO_EVENTS,
    microbatch: ins.microbatch,
    phase: ins.phase,
    scope: ins.scope,
  };
}

/** Collectives that pass results between pipeline ranks run on the comm stream and gradient sums
 * on the grad stream (both placed by their passes); those inside a pass run where their result is
 * needed, on compute. */
function streamOf(node: Node): StreamName {
  return OP_TABLE[node.op].category === 'memory' ? 'copy' : 'compute';
}

const VIEW_OPS = new Set(['reshape', 'copy_to_group']);

/**
 * Lowers graph nodes to instructions: each input from the microbatch's values or the program's
 * persistent ones, each output a new buffer (a view for a reshape; a reported output or a step
 * scalar in the scalar region).
 */
export class NodeLowering {
  readonly numbering: ValueNumbering;
  /** graph outputs reported per microbatch / per step: their label by value number */
  private readonly mbLabel: (string | undefined)[] = [];
  private readonly stepLabel: (string | undefined)[] = [];

  constructor(
    readonly b: ProgramBuilder,
    /** parameters, gradients, optimizer state and step scalars */
    readonly global: Values,
    readonly outputs: ProgramOutput[],
    readonly scalars: Record<string, number>,
    /** graph outputs reported per microbatch / per step, by value: their label */
    mbOutputs: ReadonlyMap<string, string>,
    readonly stepOutputs: ReadonlyMap<string, string>,
  ) {
    this.numbering = global.numbering;
    for (const [v, label] of mbOutputs) this.mbLabel[this.numbering.of(v)] = label;
    for (const [v, label] of stepOutputs) this.stepLabel[this.numbering.of(v)] = label;
  }

  /** For a draft's program; `global` (default: the draft's persistent values) may be shared. */
  static of(
    g: Graph,
    b: ProgramBuilder,
    d: Pick<ProgramDraft, 'params' | 'scalars' | 'outputs'>,
    global: Values = globalsOf(g, d),
  ): NodeLowering {
    const producedInStep = new Set(
      g.nodes.filter((n) => n.phase === 'optimizer').flatMap((n) => n.outputs.map((o) => o.name)),
    );
    const label = (step: boolean) =>
      new Map(
        g.outputs
          .filter((o) => producedInStep.has(o.value) === step)
          .map((o) => [o.value, o.label]),
      );
    return new NodeLowering(b, global, [...d.outputs], { ...d.scalars }, label(false), label(true));
  }

  /** Values of one microbatch (or of the step), empty. */
  values(): Values {
    return new Values(this.numbering);
  }

  /** Emits node n for microbatch mb; returns the instruction's index. */
  node(
    n: Node,
    mb: number,
    local: Values,
    wait: readonly number[],
    stream: StreamName = streamOf(n),
  ): number {
    const { ins: vin, outs: vout } = this.numbering.node(n);
    const ins: number[] = new Array<number>(vin.length);
    for (let k = 0; k < vin.length; k++) {
      let id = local.at(vin[k]);
      if (id < 0) id = this.global.at(vin[k]);
      if (id < 0)
        throw new Error(`emit: value ${n.inputs[k]} has no buffer (node ${n.op} in ${n.scope})`);
      ins[k] = id;
    }
    const outs: number[] = new Array<number>(vout.length);
    for (let k = 0; k < vout.length; k++) {
      const o = n.outputs[k];
      const id = this.outputBuffer(n, o.name, vout[k], o.type, mb, ins);
      local.put(vout[k], id);
      outs[k] = id;
    }
    const { op, attrs, phase, scope } = n;
    return this.b.push(
      { stream, op, inputs: ins, outputs: outs, attrs, microbatch: mb, phase, scope },
      wait,
    );
  }

  private outputBuffer(
    n: Node,
    v: string,
    k: number,
    t: TensorType,
    mb: number,
    ins: number[],
  ): number {
    const b = this.b;
    if (VIEW_OPS.has(n.op)) return b.addBuffer(v, t, 'arena', mb, b.root(ins[0]));
    // a reported output once per microbatch: a recomputed forward (the encoder under
    // --full-hetero-dp-encoder-recompute) writes a fresh buffer instead
    const label = this.mbLabel[k];
    if (label !== undefined && !this.outputs.some((x) => x.name === label && x.microbatch === mb)) {
      const id = b.addBuffer(`${label}.mb${mb}`, t, 'scalar', mb);
      this.outputs.push({ name: label, buffer: id, microbatch: mb });
      return id;
    }
    const step = this.stepLabel[k];
    if (step !== undefined) return (this.scalars[step] = b.addBuffer(step, t, 'scalar', -1));
    return b.addBuffer(v, t, 'arena', mb);
  }
}

/** The persistent values of a draft by name: parameters, gradients, AdamW state, step inputs. */
function globalsOf(g: Graph, d: Pick<ProgramDraft, 'params' | 'scalars'>): Values {
  const numbering = valueNumbering(g);
  const global = new Values(numbering);
  for (const p of d.params) {
    const { numbers } = numbering.stateOf(p.name);
    global.put(numbers[PARAM], p.buffer);
    if (p.grad !== undefined) global.put(numbers[GRAD], p.grad);
    if (p.expAvg !== undefined) global.put(numbers[EXP_AVG], p.expAvg);
    if (p.expAvgSq !== undefined) global.put(numbers[EXP_AVG_SQ], p.expAvgSq);
    if (p.master !== undefined) global.put(numbers[MASTER], p.master);
  }
  const stepInputs = new Set(g.inputs.map((i) => i.name));
  for (const [name, id] of Object.entries(d.scalars))
    if (stepInputs.has(name)) global.set(name, id);
  return global;
}
