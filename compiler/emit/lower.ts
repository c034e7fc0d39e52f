// Emission pass 2, lower: the schedule as instructions over buffers.
//
// Holds before: the program's schedule (pass 1).
// Holds after: persistent buffers (parameters, gradients, AdamW state unless the distributed
//   optimizer shards it, step scalars), the data inputs of every microbatch slot this rank reads,
//   and every step's instructions in issue order:
//     p2p batch  on the comm stream: the previous step's sends and this step's recvs, posted
//                together (Megatron's batched send/recv, so neighbours never wait on each other's
//                order); it waits for the last compute instruction before it, and the step's first
//                compute instruction waits for it
//     the step's passes on the compute stream (tensor/expert collectives included: their results
//     are needed at once); a combined step (A2A overlap) interleaves its two passes layer by layer,
//     the expert all-to-alls on the comm stream (compiler/emit/combined.ts)
//   and at encoder levels 2 and 3 the encoder's runs and the handoff of its outputs and their
//   gradients (compiler/emit/encoder-handoff.ts). What the last step leaves for the next compute
//   instruction to wait for is the draft's openWaits.

import type { Graph, Node, ParamDecl } from '../../ir/graph.js';
import { formatDim } from '../../ir/shape.js';
import type { TensorType } from '../../ir/types.js';
import type { Transfer } from '../../passes/parallel/pipeline.js';
import type { PlanInstruction, ProgramInput, ProgramParam } from '../plan/format.js';
import { emitCombined } from './combined.js';
import { NodeLowering, ProgramBuilder, type ProgramDraft, type Unscheduled } from './draft.js';
import { EncoderHandoff } from './encoder-handoff.js';
import type { EmitOptions } from './options.js';
import { passesOf, passKey, type PassRef, type ProgramSchedule } from './schedule.js';

/** The lowering of one program: the builder, the values of each microbatch slot, the p2p state. */
export class Lowering {
  readonly b: ProgramBuilder;
  readonly nodes: NodeLowering;
  readonly global = new Map<string, number>();
  readonly params: ProgramParam[] = [];
  readonly inputs: ProgramInput[] = [];
  /** each microbatch slot's values: buffer by value name */
  locals: Map<string, number>[] = [];
  /** the number of slots: microbatches, and the mock slots that encode under the ViT balance */
  slots: number;
  readonly keepUntilWait = new Map<number, number[]>();
  /** the last compute instruction issued (-1: none) */
  lastCompute = -1;
  /** events the next compute instruction waits for */
  readonly computeWait: number[] = [];
  /** the sends of the last step, posted with the next batch */
  pendingSends: Unscheduled[] = [];
  /** p2p batches so far */
  batches = 0;
  readonly handoff: EncoderHandoff;

  constructor(
    readonly g: Graph,
    readonly opts: EmitOptions,
    readonly s: ProgramSchedule,
  ) {
    this.b = new ProgramBuilder(g);
    this.nodes = NodeLowering.of(g, this.b, { params: [], scalars: {}, outputs: [] }, this.global);
    this.slots = opts.numMicrobatches;
    this.handoff = new EncoderHandoff(this);
  }

  get m(): number {
    return this.opts.numMicrobatches;
  }

  /** Runs nodes for microbatch mb on the compute stream, each waiting for what is pending. */
  runNodes(nodes: readonly Node[], mb: number, local: Map<string, number>): void {
    for (const n of nodes)
      this.lastCompute = this.nodes.node(n, mb, local, this.computeWait.splice(0));
  }

  /** Appends an instruction on compute that waits for what is pending. */
  pushCompute(ins: Unscheduled): void {
    this.lastCompute = this.b.push(ins, this.computeWait.splice(0));
  }
}

/** The lowered program (see the header). */
export function lowerProgram(g: Graph, opts: EmitOptions, s: ProgramSchedule): ProgramDraft {
  const lo = new Lowering(g, opts, s);
  persistentBuffers(lo);
  dataInputs(lo);
  lo.handoff.encoderPhase1();
  for (const step of s.steps)
    lowerStep(
      lo,
      step.flatMap((a) => passesOf(s, a)),
      step,
    );
  // the last batch's sends; whatever runs on compute after them (level 3's phase 3) waits
  lo.computeWait.push(...flushBatch(lo, [], []));
  lo.handoff.encoderPhase3();
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
  };
}

/** Whether the distributed optimizer shards a parameter's AdamW state (by its gradient group). */
export function shardable(opts: EmitOptions, p: ParamDecl): boolean {
  const groupSizes = opts.groupSizes ?? {};
  const dist = opts.distributedOptimizer === true && (groupSizes.dp ?? 1) > 1;
  return dist && (groupSizes[p.dist?.replicas ?? 'dp'] ?? 1) > 1;
}

/** Parameters this rank reads, their gradients and AdamW state, and the step scalars. */
function persistentBuffers(lo: Lowering): void {
  const { g, b, global } = lo;
  const localParams = g.params.filter((p) => p.role === 'param' && lo.s.used.has(p.name));
  const byName = new Map(g.params.map((p) => [p.name, p]));
  for (const p of localParams) global.set(p.name, b.addBuffer(p.name, p.type, 'param', -1));
  const trainable = localParams.filter((p) => byName.has(`grad.${p.name}`));
  for (const p of trainable) {
    const grad = `grad.${p.name}`;
    global.set(grad, b.addBuffer(grad, byName.get(grad)!.type, 'grad', -1));
  }
  // AdamW state per parameter; with the distributed optimizer, per bucket shard (grad-sync)
  for (const p of trainable.filter((q) => !shardable(lo.opts, q))) {
    for (const s of [`exp_avg.${p.name}`, `exp_avg_sq.${p.name}`]) {
      const decl = byName.get(s);
      if (decl) global.set(s, b.addBuffer(s, decl.type, 'optim', -1));
    }
  }
  for (const p of localParams) {
    const has = (n: string) => global.get(n);
    lo.params.push({
      name: p.name,
      buffer: global.get(p.name)!,
      ...(has(`grad.${p.name}`) !== undefined ? { grad: has(`grad.${p.name}`) } : {}),
      ...(has(`exp_avg.${p.name}`) !== undefined ? { expAvg: has(`exp_avg.${p.name}`) } : {}),
      ...(has(`exp_avg_sq.${p.name}`) !== undefined
        ? { expAvgSq: has(`exp_avg_sq.${p.name}`) }
        : {}),
      shard: p.type.shape.map((d) => [0, d as number] as const),
      ...(p.dist ? { dist: p.dist } : {}),
    });
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
  lo.locals = Array.from({ length: lo.slots }, (_, mb) => {
    const local = new Map<string, number>();
    for (const i of dataInputs) {
      if (enc && !decoderReads.has(i.name) && !encodes.has(mb)) continue;
      if (mb >= m && decoderReads.has(i.name)) continue; // a mock slot never reaches the decoder
      const id = lo.b.addBuffer(`${i.name}.mb${mb}`, i.type, 'data', mb);
      local.set(i.name, id);
      lo.inputs.push({ name: i.name, buffer: id, microbatch: mb });
    }
    return local;
  });
}

/** One step: the batch before it, its passes (combined or one by one), the sends they make. */
function lowerStep(lo: Lowering, passes: PassRef[], step: readonly { kind: string }[]): void {
  const { s } = lo;
  // recvs of every pass of the step, before its first pass
  const recvsByPass = passes.map((x) =>
    s.pipe.transfers.filter((t) => t.to.chunk === x.chunk && t.to.phase === x.phase),
  );
  lo.computeWait.push(
    ...flushBatch(
      lo,
      recvsByPass,
      passes.map((x) => x.mb),
    ),
  );
  const combined = step.length === 1 && step[0].kind === 'FB';
  if (combined) {
    const [f, b] = passes;
    if (f.chunk === 0) lo.handoff.beforeDecoderForward(f.mb);
    emitCombined(lo, f, b);
    if (b.chunk === 0) lo.handoff.afterDecoderBackward(b.mb);
  }
  for (const x of passes) {
    const local = lo.locals[x.mb];
    if (!combined) {
      if (x.chunk === 0 && x.phase === 'forward') lo.handoff.beforeDecoderForward(x.mb);
      lo.runNodes(s.passNodes.get(passKey(x.chunk, x.phase)) ?? [], x.mb, local);
      if (x.chunk === 0 && x.phase === 'backward') lo.handoff.afterDecoderBackward(x.mb);
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

/**
 * The batch before a step: the pending sends, and the recvs of each of its passes (mbs: their
 * microbatches). Returns the batch's completion event (none when the batch is empty).
 */
function flushBatch(lo: Lowering, recvsByPass: Transfer[][], mbs: number[]): number[] {
  const sends = lo.pendingSends;
  if (!sends.length && !recvsByPass.some((r) => r.length)) return [];
  const batch = lo.batches++;
  const list: Unscheduled[] = sends.map((x) => ({ ...x, attrs: { ...x.attrs, batch } }));
  for (const [k, recvs] of recvsByPass.entries())
    for (const t of recvs) list.push(recvOf(lo, t, mbs[k], batch));
  lo.pendingSends = [];
  const wait = lo.lastCompute >= 0 ? [lo.b.record(lo.lastCompute)] : [];
  let last = -1;
  list.forEach((ins, i) => (last = lo.b.push(ins, i === 0 ? wait : [])));
  return [lo.b.record(last)];
}

function recvOf(lo: Lowering, t: Transfer, mb: number, batch: number): Unscheduled {
  const id = lo.b.addBuffer(`${t.value}.recv`, t.type, 'arena', mb);
  lo.locals[mb].set(t.value, id);
  const attrs: PlanInstruction['attrs'] = {
    group: 'pp',
    peer: t.from.chunk % lo.s.pipe.pp,
    tag: t.tag + mb,
    dtype: t.type.dtype,
    shape: t.type.shape.map(formatDim),
    batch,
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
