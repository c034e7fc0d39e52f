// Emission pass 2, lower: the schedule as instructions over buffers.
//
// Holds before: the program's schedule (pass 1).
// Holds after: persistent buffers (parameters, gradients, AdamW state unless the distributed
//   optimizer shards it, step scalars), the data inputs of every microbatch slot this rank reads,
//   and every step's instructions in issue order: its passes on the compute stream
//   (tensor/expert collectives included: their results are needed at once); a combined step (A2A
//   overlap) interleaves its two passes layer by layer, the expert all-to-alls on the comm stream
//   (compiler/emit/combined.ts); at encoder levels 2 and 3 the encoder's runs where the level puts
//   them (compiler/emit/encoder-runs.ts). What crosses ranks is left to later passes, at marks:
//   a p2p mark before each step (and after the last) holds the sends of the step before and the
//   recvs of this one, whose buffers the passes read (p2p batches them); in plain 1F1B, a mark
//   before each pass of a step instead (Megatron's send_forward_recv_backward between a steady
//   step's forward and backward); the handoff marks say
//   where encoder outputs and their gradients move, and the buffers they fill are imports (the
//   encoder-handoff pass). What the last step leaves for the next compute instruction to wait
//   for is the draft's openWaits.

import { paramsByName, type Graph, type Node } from '../../ir/graph.js';
import { formatDim } from '../../ir/shape.js';
import type { TensorType } from '../../ir/types.js';
import type { Transfer } from '../../passes/parallel/pipeline.js';
import type { PlanInstruction, ProgramInput, ProgramParam } from '../plan/format.js';
import { emitCombined } from './combined.js';
import {
  NO_EVENTS,
  NodeLowering,
  ProgramBuilder,
  type Import,
  type Mark,
  type ProgramDraft,
  type Unscheduled,
} from './draft.js';
import { EncoderRuns } from './encoder-runs.js';
import { shardable, type EmitOptions } from './options.js';
import { passesOf, passKey, type PassRef, type ProgramSchedule } from './schedule.js';
import { EXP_AVG, EXP_AVG_SQ, GRAD, MASTER, PARAM, valueNumbering, Values } from './values.js';

/** a mark of any kind before it has a place (distributes over the union) */
type Unplaced<M> = M extends Mark ? Omit<M, 'pos'> : never;

/** The lowering of one program: the builder, the values of each microbatch slot, the p2p state. */
export class Lowering {
  readonly b: ProgramBuilder;
  readonly nodes: NodeLowering;
  readonly global: Values;
  readonly params: ProgramParam[] = [];
  readonly inputs: ProgramInput[] = [];
  /** each microbatch slot's values: buffer by value */
  locals: Values[] = [];
  /** the number of slots: microbatches, and the mock slots that encode under the ViT balance */
  slots: number;
  readonly keepUntilWait = new Map<number, number[]>();
  /** the last compute instruction issued (-1: none) */
  lastCompute = -1;
  /** events the next compute instruction waits for */
  readonly computeWait: number[] = [];
  /** the sends of the last step, posted with the next batch */
  pendingSends: Unscheduled[] = [];
  readonly marks: Mark[] = [];
  readonly imports: Import[] = [];
  readonly encoder: EncoderRuns;

  constructor(
    readonly g: Graph,
    readonly opts: EmitOptions,
    readonly s: ProgramSchedule,
  ) {
    this.b = new ProgramBuilder(g);
    this.global = new Values(valueNumbering(g));
    this.nodes = NodeLowering.of(g, this.b, { params: [], scalars: {}, outputs: [] }, this.global);
    this.slots = opts.numMicrobatches;
    this.encoder = new EncoderRuns(this);
  }

  get m(): number {
    return this.opts.numMicrobatches;
  }

  /** virtual stages per pipeline rank (vpp; 1 without interleaving): every step asks */
  get chunksPerStage(): number {
    if (this.chunks === undefined) {
      let last = 0;
      for (const c of this.s.pipe.chunkOf) if (c > last) last = c;
      this.chunks = Math.max(1, Math.ceil((last + 1) / this.s.pipe.pp));
    }
    return this.chunks;
  }
  private chunks?: number;

  /** Runs nodes for microbatch mb on the compute stream, each waiting for what is pending. */
  runNodes(nodes: readonly Node[], mb: number, local: Values): void {
    for (const n of nodes)
      this.lastCompute = this.nodes.node(
        n,
        mb,
        local,
        this.computeWait.length ? this.computeWait.splice(0) : NO_EVENTS,
      );
  }

  /** A mark at the end of the instruction list (the p2p kind has no waits of its own). */
  mark(m: Unplaced<Mark>): void {
    this.marks.push({ ...m, pos: this.b.instructions.length } as Mark);
  }

  /** A buffer for value v of slot mb that another rank's work fills (see Import). */
  importOf(v: string, mb: number, t: TensorType): number {
    const id = this.b.addBuffer(`${v}.import`, t, 'arena', mb);
    this.imports.push({ buffer: id, value: v, mb });
    return id;
  }
}

/** The lowered program (see the header). */
export function lowerProgram(g: Graph, opts: EmitOptions, s: ProgramSchedule): ProgramDraft {
  const lo = new Lowering(g, opts, s);
  persistentBuffers(lo);
  dataInputs(lo);
  lo.encoder.phase1();
  s.steps.forEach((step, k) =>
    lowerStep(
      lo,
      k,
      step.flatMap((a) => passesOf(s, a)),
      step,
    ),
  );
  // the last batch's sends
  lo.mark({ kind: 'p2p', step: s.steps.length, sends: lo.pendingSends, recvs: [] });
  lo.encoder.phase3();
  return {
    id: opts.id ?? 'p0',
    regions: lo.b.regionTop,
    arenaLowerBoundBytes: 0,
    buffers: lo.b.buffers,
    params: lo.params,
    inputs: lo.inputs,
    scalars: lo.nodes.scalars,
    outputs: lo.nodes.outputs,
    events: lo.b.events,
    instructions: lo.b.instructions,
    optimizerShards: [],
    keepUntilWait: lo.keepUntilWait,
    openWaits: lo.computeWait,
    shardBuffers: [],
    marks: lo.marks,
    imports: lo.imports,
    values: lo.locals,
  };
}

/** Parameters this rank reads, their gradients and AdamW state, and the step scalars. */
function persistentBuffers(lo: Lowering): void {
  const { g, b, global } = lo;
  const { numbering } = global;
  const localParams = g.params.filter((p) => p.role === 'param' && lo.s.used.has(p.name));
  const byName = paramsByName(g);
  // the buffers in the plan text's order: every parameter, then the gradients, then AdamW state
  // per parameter (with the distributed optimizer, per bucket shard: grad-sync)
  for (const p of localParams)
    global.put(numbering.stateOf(p.name).numbers[PARAM], b.addBuffer(p.name, p.type, 'param', -1));
  const trainable = localParams.filter((p) => byName.has(numbering.stateOf(p.name).names[GRAD]));
  for (const p of trainable) {
    const { names, numbers } = numbering.stateOf(p.name);
    global.put(numbers[GRAD], b.addBuffer(names[GRAD], byName.get(names[GRAD])!.type, 'grad', -1));
  }
  for (const p of trainable.filter((q) => !shardable(lo.opts, q))) {
    const { names, numbers } = numbering.stateOf(p.name);
    for (const s of [EXP_AVG, EXP_AVG_SQ, MASTER]) {
      const decl = byName.get(names[s]);
      if (decl) global.put(numbers[s], b.addBuffer(names[s], decl.type, 'optim', -1));
    }
  }
  for (const p of localParams) {
    const { numbers } = numbering.stateOf(p.name);
    // the keys in this order: the plan's text
    const entry: { -readonly [K in keyof ProgramParam]: ProgramParam[K] } = {
      name: p.name,
      buffer: global.at(numbers[PARAM]),
    } as ProgramParam;
    const grad = global.at(numbers[GRAD]);
    if (grad >= 0) entry.grad = grad;
    const expAvg = global.at(numbers[EXP_AVG]);
    if (expAvg >= 0) entry.expAvg = expAvg;
    const expAvgSq = global.at(numbers[EXP_AVG_SQ]);
    if (expAvgSq >= 0) entry.expAvgSq = expAvgSq;
    const master = global.at(numbers[MASTER]);
    if (master >= 0) entry.master = master;
    entry.shard = p.type.shape.map((d) => [0, d as number] as const);
    if (p.dist) entry.dist = p.dist;
    lo.params.push(entry);
  }
  // scalar inputs (loss_tokens, caption_tokens) are step scalars the runtime fills, shared by
  // every microbatch
  for (const i of g.inputs.filter(isStepScalar)) {
    if (!lo.s.used.has(i.name)) continue;
    const id = (lo.nodes.scalars[i.name] = b.addBuffer(i.name, i.type, 'scalar', -1));
    global.set(i.name, id);
  }
}

const isStepScalar = (i: { type: TensorType }) => i.type.shape.length === 0;

/** Each slot's data inputs; those only the encoder reads, for the slots this rank encodes. */
function dataInputs(lo: Lowering): void {
  const { g, s, m } = lo;
  const enc = lo.opts.encoder;
  const dataInputs = g.inputs.filter((i) => !isStepScalar(i) && s.used.has(i.name));
  const decoderReads = new Set<string>();
  for (const list of s.passNodes.values())
    for (const n of list) for (const v of n.inputs) decoderReads.add(v);
  const encodes = new Set(enc ? enc.placement.slotsOf(enc.tp, s.pipe.stage) : []);
  // under the ViT balance a mock slot (levels 2, 3) takes part in the image exchange: it encodes
  // an empty microbatch of its own data slot, and whatever images the rule gives it
  const mocksEncode = s.encoderForward.some((n) => n.op === 'vit_balance_route');
  lo.slots = enc && mocksEncode ? Math.max(m, enc.placement.slots) : m;
  lo.locals = Array.from({ length: lo.slots }, () => lo.nodes.values());
  const add = (i: (typeof dataInputs)[number], mb: number) => {
    const id = lo.b.addBuffer(`${i.name}.mb${mb}`, i.type, 'data', mb);
    lo.locals[mb].set(i.name, id);
    lo.inputs.push({ name: i.name, buffer: id, microbatch: mb });
  };
  // the decoder's inputs of every slot; at levels 2 and 3 the encoder's own after them, for the
  // slots this rank encodes in order: so the TP ranks' programs differ in which slots those are,
  // not in where their buffers fall (compiler/emit/alike-programs.ts)
  for (let mb = 0; mb < lo.slots; mb++)
    for (const i of dataInputs) {
      if (enc && !decoderReads.has(i.name)) continue;
      if (mb >= m && decoderReads.has(i.name)) continue; // a mock slot never reaches the decoder
      add(i, mb);
    }
  if (!enc) return;
  for (let mb = 0; mb < lo.slots; mb++)
    if (encodes.has(mb)) for (const i of dataInputs) if (!decoderReads.has(i.name)) add(i, mb);
}

/** One step: its p2p mark, its passes (combined or one by one), the sends they make. */
function lowerStep(
  lo: Lowering,
  k: number,
  passes: PassRef[],
  step: readonly { kind: string }[],
): void {
  const { s } = lo;
  const recvsOf = (x: PassRef) =>
    s.pipe.transfers
      .filter((t) => t.to.chunk === x.chunk && t.to.phase === x.phase)
      .map((t) => recvOf(lo, t, x.mb));
  const combined = step.length === 1 && step[0].kind === 'FB';
  // Plain 1F1B (Megatron's schedule without interleaving): a mark before each pass, so that a
  // steady step's forward output goes with the backward's input gradient, between the two
  // (send_forward_recv_backward), and the forward never waits on the gradient. A combined step
  // needs both inputs first; interleaved 1F1B exchanges once per step, after its pair, as
  // Megatron does (its warm-up makes what each step receives ready a step ahead).
  const perPass = !combined && lo.chunksPerStage === 1 && s.pipe.pp > 1;
  const markBefore = (xs: PassRef[]) => {
    lo.mark({ kind: 'p2p', step: k, sends: lo.pendingSends, recvs: xs.flatMap(recvsOf) });
    lo.pendingSends = [];
  };
  if (!perPass) markBefore(passes);
  if (combined) {
    const [f, b] = passes;
    if (f.chunk === 0) lo.encoder.beforeDecoderForward(f.mb);
    emitCombined(lo, f, b);
    if (b.chunk === 0) lo.encoder.afterDecoderBackward(b.mb);
  }
  for (const x of passes) {
    const local = lo.locals[x.mb];
    if (perPass) markBefore([x]);
    if (!combined) {
      if (x.chunk === 0 && x.phase === 'forward') lo.encoder.beforeDecoderForward(x.mb);
      lo.runNodes(s.passNodes.get(passKey(x.chunk, x.phase)) ?? [], x.mb, local);
      if (x.chunk === 0 && x.phase === 'backward') lo.encoder.afterDecoderBackward(x.mb);
    }
    for (const t of s.pipe.transfers) {
      if (t.from.chunk !== x.chunk || t.from.phase !== x.phase) continue;
      lo.pendingSends.push({
        stream: 'comm',
        op: 'send',
        inputs: [local.get(t.value)!],
        outputs: [],
        attrs: { group: 'pp', peer: t.to.chunk % s.pipe.pp, tag: t.tag + x.mb },
        microbatch: x.mb,
        phase: x.phase,
        scope: 'pipeline',
      });
    }
  }
}

/** A recv of transfer t for microbatch mb into a new buffer, which the step's passes read. */
function recvOf(lo: Lowering, t: Transfer, mb: number): Unscheduled {
  const id = lo.b.addBuffer(`${t.value}.recv`, t.type, 'arena', mb);
  lo.locals[mb].set(t.value, id);
  const attrs: PlanInstruction['attrs'] = {
    group: 'pp',
    peer: t.from.chunk % lo.s.pipe.pp,
    tag: t.tag + mb,
    dtype: t.type.dtype,
    shape: t.type.shape.map(formatDim),
  };
  return {
    stream: 'comm',
    op: 'recv',
    inputs: [],
    outputs: [id],
    attrs,
    microbatch: mb,
    phase: t.to.phase,
    scope: 'pipeline',
  };
}
