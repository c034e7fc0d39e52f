// Emission of one program from a training-step graph: what one pipeline rank runs (every rank
// when there is no pipeline). Instructions in issue order:
//
//   for each action of the stage's schedule (a forward or backward pass of one microbatch
//   through one chunk; without a pipeline, forward then backward of each microbatch in turn):
//     p2p batch   on the comm stream: the previous pass's sends and this pass's recvs, posted
//                 together (Megatron's batched send/recv, so neighbours never wait on each
//                 other's order); it waits for the previous pass's compute, and this pass's
//                 compute waits for it
//     the pass's nodes on the compute stream (tensor/expert collectives included: their results
//     are needed at once)
//   gradient sums on the comm stream: buckets of about 4 MiB of gradients that share their sum
//   groups, each issued right after the compute instruction that last wrote it (overlapping the
//   rest of backward), an all_reduce per group (or a reduce_scatter over data parallelism with
//   the distributed optimizer)
//   the optimizer step: the weighted sum of squares of the local gradients, summed over every
//   rank, the clipping factor, AdamW per parameter (or per bucket shard, then an all_gather of
//   the updated parameters)
//
// Buffers: parameters, gradients and optimizer state in their persistent regions; data inputs per
// microbatch slot; step scalars; every other value in the arena, placed by the memory planner
// from lifetimes in issue order. A reshape (or copy_to_group, an identity) is a view of its input.

import { DTYPE_BYTES } from '../../ir/dtype.js';
import { valueTypes, type Graph, type Node, type ParamDecl } from '../../ir/graph.js';
import { OP_TABLE } from '../../ir/ops.js';
import { formatDim, numel } from '../../ir/shape.js';
import type { TensorType } from '../../ir/types.js';
import type { Transfer } from '../../passes/parallel/pipeline.js';
import type { Action } from '../schedule/pipeline.js';
import { isEncoderScope, type EncoderPlacement } from '../parallel/encoder.js';
import { applyActivationPolicy, type ActivationPolicy } from './activations.js';
import { offloadIdleEncoderBytes } from './encoder-offload.js';
import { numberProgram } from './number.js';
import { rootOf } from './rewrite.js';
import { ALIGN, align, planArena, type Lifetime } from './memory.js';
import {
  PROGRAM_FORMAT,
  PLAN_VERSION,
  type BufferRegion,
  type PlanBuffer,
  type PlanInstruction,
  type ProgramFile,
  type ProgramInput,
  batchSpans,
  type OptimizerShard,
  type ProgramParam,
  type StreamName,
} from './format.js';

export interface EmitPipeline {
  /** this program's pipeline rank */
  readonly stage: number;
  readonly pp: number;
  /** virtual stage of every node (-1: the optimizer step) */
  readonly chunkOf: readonly number[];
  readonly transfers: readonly Transfer[];
  /** the stage's schedule: forward and backward passes, chunk = local chunk index */
  readonly actions: readonly Action[];
  /** warm-up forwards of the schedule: the steady-state forward/backward pairs follow them */
  readonly warmup?: number;
}

export interface EmitOptions {
  readonly numMicrobatches: number;
  readonly id?: string;
  /** absent fields: one stage holding every node (an A2A-overlap schedule without a pipeline
   * gives only its actions) */
  readonly pipeline?: Partial<EmitPipeline>;
  /**
   * Sizes of the groups gradients are summed over, by kind (dp, edp, tp, …). Dense gradients
   * sum over `dp`, expert gradients over `edp`, plus the kinds in a parameter's dist.gradSum;
   * kinds of size 1 are skipped.
   */
  readonly groupSizes?: Readonly<Record<string, number>>;
  /** bucket size of gradient sums; default 4 MiB */
  readonly bucketBytes?: number;
  /** --use-distributed-optimizer: reduce-scatter gradients and shard the optimizer over dp */
  readonly distributedOptimizer?: boolean;
  /**
   * How many ranks of the world hold each copy of a parameter's gradient after the sums, by
   * parameter name: the gradient norm weighs each local sum of squares by 1/that, then sums over
   * `world`. Absent: 1. (Plain data, so emission can run in a worker.)
   */
  readonly copies?: Readonly<Record<string, number>>;
  /** ranks in the world (the gradient norm is summed over them when > 1) */
  readonly worldSize?: number;
  /**
   * --delay-wgrad-compute: in combined steps, the experts' weight gradients run after the next
   * all-to-all is issued (it does not need them), hiding it
   */
  readonly delayWgrad?: boolean;
  /**
   * encoder levels 2 and 3: the encoder and projector (`visual.*`) run apart from the decoder's
   * passes, on the ranks and at the times compiler/parallel/encoder.ts gives
   */
  readonly encoder?: EmitEncoder;
  /** --recompute-granularity/--recompute-modules, --offload-tensors (compiler/plan/activations.ts) */
  readonly activations?: ActivationPolicy;
}

export interface EmitEncoder {
  readonly placement: EncoderPlacement;
  /** this program's decoder TP index (programs differ by it at levels 2 and 3) */
  readonly tp: number;
  readonly tpSize: number;
  /** level 3, --full-hetero-dp-cpu-offload: what the encoder leaves on the device through the
   * decoder's pipeline waits on the host (compiler/plan/encoder-offload.ts) */
  readonly offload?: boolean;
  /** level 3, --full-hetero-dp-encoder-recompute: the encoder forward runs again before backward */
  readonly recompute?: boolean;
}

export const DEFAULT_BUCKET_BYTES = 4 * 2 ** 20;

/** Collectives that pass results between pipeline ranks or sum gradients run on the comm stream;
 * those inside a pass run where their result is needed, on compute. */
export function streamOf(node: Node): StreamName {
  const cat = OP_TABLE[node.op].category;
  if (cat === 'memory') return 'copy';
  return 'compute';
}

const VIEW_OPS = new Set(['reshape', 'copy_to_group']);

/** one pass of a schedule step: a chunk (global virtual stage), its phase, a microbatch */
interface PassRef {
  readonly chunk: number;
  readonly phase: 'forward' | 'backward';
  readonly mb: number;
}

export function emitProgram(g: Graph, opts: EmitOptions): ProgramFile {
  const m = opts.numMicrobatches;
  if (!Number.isInteger(m) || m < 1)
    throw new Error(`numMicrobatches must be a positive integer, got ${m}`);
  const bound = new Map(g.symbols.map((s) => [s.name, s.bound]));
  // a value's type object is shared by its buffers of every microbatch: size and shape text once
  const typeInfo = new WeakMap<TensorType, { bytes: number; shape: string[] }>();
  const infoOf = (t: TensorType) => {
    let i = typeInfo.get(t);
    if (!i) {
      i = {
        bytes: numel(t.shape, (s) => bound.get(s)!) * DTYPE_BYTES[t.dtype],
        shape: t.shape.map(formatDim),
      };
      typeInfo.set(t, i);
    }
    return i;
  };
  const groupSizes = opts.groupSizes ?? {};
  const bucketBytes = opts.bucketBytes ?? DEFAULT_BUCKET_BYTES;
  // without a pipeline: one stage holding every node, forward then backward of each microbatch
  const pipe: EmitPipeline = {
    stage: 0,
    pp: 1,
    chunkOf: g.nodes.map((n) => (n.phase === 'optimizer' ? -1 : 0)),
    transfers: [],
    actions: Array.from({ length: m }, (_, mb) => [
      { kind: 'F' as const, microbatch: mb, chunk: 0 },
      { kind: 'B' as const, microbatch: mb, chunk: 0 },
    ]).flat(),
    ...opts.pipeline,
  };
  const mine = (chunk: number) => chunk >= 0 && chunk % pipe.pp === pipe.stage;

  // ---- buffers ------------------------------------------------------------------------------
  // built here, offsets set in place by the layouts below
  const buffers: { -readonly [K in keyof PlanBuffer]: PlanBuffer[K] }[] = [];
  const regionTop: Record<BufferRegion, number> = {
    arena: 0,
    param: 0,
    grad: 0,
    optim: 0,
    data: 0,
    scalar: 0,
    host: 0,
  };
  const addBuffer = (
    name: string,
    t: TensorType,
    region: BufferRegion,
    microbatch: number,
    viewOf?: number,
  ): number => {
    const id = buffers.length;
    const { bytes, shape } = infoOf(t);
    let offset = 0;
    if (viewOf !== undefined) offset = buffers[viewOf].offset;
    else if (region !== 'arena' && region !== 'host') {
      offset = regionTop[region];
      regionTop[region] += align(Math.max(bytes, 1));
    }
    buffers.push({
      id,
      name,
      region: viewOf !== undefined ? buffers[viewOf].region : region,
      space: t.space ?? 'device',
      dtype: t.dtype,
      shape,
      offset,
      bytes,
      ...(viewOf !== undefined ? { viewOf } : {}),
      microbatch,
    });
    return id;
  };
  const root = (id: number): number => rootOf(buffers, id);

  // the nodes of each of this rank's passes, and the parameters they touch
  const passNodes = new Map<string, Node[]>();
  const passKey = (chunk: number, phase: string) => `${chunk}:${phase}`;
  const used = new Set<string>();
  // levels 2 and 3: the encoder's forward and backward nodes, emitted apart (below); every rank
  // of its gradient group holds its parameters, encoding or not
  const enc = opts.encoder;
  const encoderForward: Node[] = [];
  const encoderBackward: Node[] = [];
  const runsEncoder = enc !== undefined && (enc.placement.level === 3 || pipe.stage === 0);
  g.nodes.forEach((n, i) => {
    const c = pipe.chunkOf[i];
    if (enc && n.phase !== 'optimizer' && isEncoderScope(n.scope)) {
      if (!runsEncoder) return;
      (n.phase === 'forward' ? encoderForward : encoderBackward).push(n);
      for (const v of n.inputs) used.add(v);
      return;
    }
    if (!mine(c)) return;
    const k = passKey(c, n.phase);
    let list = passNodes.get(k);
    if (!list) passNodes.set(k, (list = []));
    list.push(n);
    for (const v of n.inputs) used.add(v);
  });
  const localParams = g.params.filter((p) => p.role === 'param' && used.has(p.name));
  const localNames = new Set(localParams.map((p) => p.name));

  // persistent buffers
  const global = new Map<string, number>();
  const params: ProgramParam[] = [];
  const byName = new Map(g.params.map((p) => [p.name, p]));
  for (const p of localParams) global.set(p.name, addBuffer(p.name, p.type, 'param', -1));
  const trainable = localParams.filter((p) => byName.has(`grad.${p.name}`));
  for (const p of trainable) {
    const grad = `grad.${p.name}`;
    global.set(grad, addBuffer(grad, byName.get(grad)!.type, 'grad', -1));
  }
  const dist = opts.distributedOptimizer === true && (groupSizes.dp ?? 1) > 1;
  // AdamW state per parameter; with the distributed optimizer, per bucket shard (below), for the
  // parameters whose gradients are summed over a data-parallel group of more than one rank
  const shardable = (p: ParamDecl) => dist && (groupSizes[p.dist?.replicas ?? 'dp'] ?? 1) > 1;
  for (const p of trainable.filter((q) => !shardable(q))) {
    for (const s of [`exp_avg.${p.name}`, `exp_avg_sq.${p.name}`]) {
      const decl = byName.get(s);
      if (decl) global.set(s, addBuffer(s, decl.type, 'optim', -1));
    }
  }
  for (const p of localParams) {
    const has = (n: string) => global.get(n);
    params.push({
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
  const scalars: Record<string, number> = {};
  // scalar inputs (loss_tokens, caption_tokens) are step scalars the runtime fills, shared by
  // every microbatch
  const isStepScalar = (i: { type: TensorType }) => i.type.shape.length === 0;
  for (const i of g.inputs.filter(isStepScalar)) {
    if (!used.has(i.name)) continue;
    scalars[i.name] = addBuffer(i.name, i.type, 'scalar', -1);
    global.set(i.name, scalars[i.name]);
  }

  const producedInStep = new Set(
    g.nodes.filter((n) => n.phase === 'optimizer').flatMap((n) => n.outputs.map((o) => o.name)),
  );
  const mbOutputs = new Map(
    g.outputs.filter((o) => !producedInStep.has(o.value)).map((o) => [o.value, o.label]),
  );
  const stepOutputs = new Map(
    g.outputs.filter((o) => producedInStep.has(o.value)).map((o) => [o.value, o.label]),
  );

  // ---- instructions -------------------------------------------------------------------------
  const inputs: ProgramInput[] = [];
  const outputs: { name: string; buffer: number; microbatch: number }[] = [];
  const instructions: PlanInstruction[] = [];
  let events = 0;
  /** buffers a comm-stream unit touches, by its completion event: allocated until that wait */
  const keepUntilWait = new Map<number, number[]>();
  const record = (idx: number): number => {
    const e = events++;
    instructions[idx] = { ...instructions[idx], record: [...instructions[idx].record, e] };
    return e;
  };
  const push = (ins: Omit<PlanInstruction, 'wait' | 'record'>, wait: number[] = []): number => {
    instructions.push({
      stream: ins.stream,
      op: ins.op,
      inputs: ins.inputs,
      outputs: ins.outputs,
      attrs: ins.attrs,
      wait,
      record: [],
      microbatch: ins.microbatch,
      phase: ins.phase,
      scope: ins.scope,
    });
    return instructions.length - 1;
  };

  const dataInputs = g.inputs.filter((i) => !isStepScalar(i) && used.has(i.name));
  // inputs only the encoder reads (patches, …) are loaded for the microbatches this rank encodes
  const decoderReads = new Set<string>();
  for (const list of passNodes.values())
    for (const n of list) for (const v of n.inputs) decoderReads.add(v);
  const encodes = new Set(enc ? enc.placement.slotsOf(enc.tp, pipe.stage) : []);
  // under the ViT balance a mock slot (levels 2, 3) takes part in the image exchange: it encodes
  // an empty microbatch of its own data slot, and whatever images the rule gives it
  const mocksEncode = encoderForward.some((n) => n.op === 'vit_balance_route');
  const slots = enc && mocksEncode ? Math.max(m, enc.placement.slots) : m;
  const locals = Array.from({ length: slots }, (_, mb) => {
    const local = new Map<string, number>();
    for (const i of dataInputs) {
      if (enc && !decoderReads.has(i.name) && !encodes.has(mb)) continue;
      if (mb >= m && decoderReads.has(i.name)) continue; // a mock slot never reaches the decoder
      const id = addBuffer(`${i.name}.mb${mb}`, i.type, 'data', mb);
      local.set(i.name, id);
      inputs.push({ name: i.name, buffer: id, microbatch: mb });
    }
    return local;
  });

  const emitNode = (
    n: Node,
    mb: number,
    local: Map<string, number>,
    wait: number[],
    stream: StreamName = streamOf(n),
  ) => {
    const lookup = (v: string) => {
      const id = local.get(v) ?? global.get(v);
      if (id === undefined)
        throw new Error(`emit: value ${v} has no buffer (node ${n.op} in ${n.scope})`);
      return id;
    };
    const ins = n.inputs.map(lookup);
    const outs = n.outputs.map((o) => {
      let id: number;
      if (VIEW_OPS.has(n.op)) id = addBuffer(o.name, o.type, 'arena', mb, root(ins[0]));
      // a reported output once per microbatch: a recomputed forward (the encoder under
      // --full-hetero-dp-encoder-recompute) writes a fresh buffer instead
      else if (
        mbOutputs.has(o.name) &&
        !outputs.some((x) => x.name === mbOutputs.get(o.name) && x.microbatch === mb)
      ) {
        const name = mbOutputs.get(o.name)!;
        id = addBuffer(`${name}.mb${mb}`, o.type, 'scalar', mb);
        outputs.push({ name, buffer: id, microbatch: mb });
      } else if (stepOutputs.has(o.name)) {
        const name = stepOutputs.get(o.name)!;
        id = scalars[name] = addBuffer(name, o.type, 'scalar', -1);
      } else id = addBuffer(o.name, o.type, 'arena', mb);
      local.set(o.name, id);
      return id;
    });
    return push(
      {
        stream,
        op: n.op,
        inputs: ins,
        outputs: outs,
        attrs: n.attrs,
        microbatch: mb,
        phase: n.phase,
        scope: n.scope,
      },
      wait,
    );
  };

  // ---- the encoder apart (levels 2 and 3; compiler/parallel/encoder.ts) ----------------------
  // its outputs: values its forward makes that the decoder reads; their gradients: values the
  // decoder's backward makes that its backward reads
  const valueType = valueTypes(g);
  const encoderMade = new Set(encoderForward.flatMap((n) => n.outputs.map((o) => o.name)));
  const encoderOutputs = [
    ...new Set(
      g.nodes
        .filter((n) => n.phase === 'forward' && !isEncoderScope(n.scope))
        .flatMap((n) => n.inputs.filter((v) => encoderMade.has(v))),
    ),
  ];
  const decoderMade = new Set(
    g.nodes.filter((n) => !isEncoderScope(n.scope)).flatMap((n) => n.outputs.map((o) => o.name)),
  );
  const outputGrads = [
    ...new Set(encoderBackward.flatMap((n) => n.inputs.filter((v) => decoderMade.has(v)))),
  ];
  const level = enc?.placement.level ?? 0;
  const T = enc?.tpSize ?? 1;
  const M = enc?.placement.encoders ?? 1;
  /** model-parallel group rank (level 3's gather and scatter root is 0) */
  const mpRank = pipe.stage * T + (enc?.tp ?? 0);
  const handoff = { phase: 'forward' as const, scope: 'encoder_handoff' };
  const runNodes = (nodes: readonly Node[], mb: number, local: Map<string, number>) => {
    for (const n of nodes) lastCompute = emitNode(n, mb, local, computeWait.splice(0));
  };
  /** a zero-row block of a value's width: a mock slot's part in gather_v / scatter_v */
  const mockRows = (v: string): number => {
    const t = valueType.get(v)!;
    return addBuffer(`${v}.mock`, { ...t, shape: [0, t.shape[1]] }, 'arena', -1);
  };
  const collective = (
    op: 'broadcast' | 'gather_v' | 'scatter_v',
    ins: number[],
    outs: number[],
    attrs: Record<string, unknown>,
    mb: number,
    phase: 'forward' | 'backward',
  ) => {
    lastCompute = push(
      {
        stream: 'compute',
        op,
        inputs: ins,
        outputs: outs,
        attrs,
        microbatch: mb,
        phase,
        scope: handoff.scope,
      },
      computeWait.splice(0),
    );
  };
  /** stage 0, before microbatch mb's first decoder forward: encode (level 2), hand over */
  const beforeDecoderForward = (mb: number) => {
    if (!enc || level < 2) return;
    if (level === 2 && mb % T === 0) {
      // the group's first microbatch: every TP rank encodes its own one of the group
      const j = mb + enc.tp;
      if (j < slots) runNodes(encoderForward, j, locals[j]);
    }
    if (T === 1) return;
    const root = level === 2 ? mb % T : 0;
    for (const v of encoderOutputs) {
      const own = locals[mb].get(v);
      const id = own ?? addBuffer(`${v}.broadcast`, valueType.get(v)!, 'arena', mb);
      locals[mb].set(v, id);
      collective('broadcast', [id], [id], { group: 'tp', group_size: T, root }, mb, 'forward');
    }
  };
  /** stage 0, after microbatch mb's last decoder backward: level 2's deferred encoder backward */
  const afterDecoderBackward = (mb: number) => {
    if (!enc || level !== 2 || !encoderBackward.length) return;
    if (mb % T !== T - 1 && mb !== m - 1) return;
    const j = mb - (mb % T) + enc.tp;
    if (j >= slots) return;
    // a mock slot's outputs reach no decoder: their gradients are empty
    if (j >= m) for (const v of outputGrads) locals[j].set(v, mockRows(v));
    runNodes(encoderBackward, j, locals[j]);
  };
  /** the index of the last instruction on a stream, -1 if none */
  const lastOn = (stream: StreamName) => {
    let k = instructions.length - 1;
    while (k >= 0 && instructions[k].stream !== stream) k--;
    return k;
  };
  /** level 3, phase 1: each round, encode this rank's slot, gather the outputs to rank 0 */
  const encoderPhase1 = () => {
    if (!enc || level !== 3) return;
    for (let r = 0; r < enc.placement.slots / M; r++) {
      const slot = r * M + mpRank;
      const encodes = slot < slots; // a real slot, or a mock one under the ViT balance
      if (encodes) runNodes(encoderForward, slot, locals[slot]);
      for (const v of encoderOutputs) {
        const x = encodes ? locals[slot].get(v)! : mockRows(v);
        const outs =
          mpRank === 0
            ? Array.from({ length: M }, (_, i) => {
                const k = r * M + i;
                if (k >= m) return mockRows(v);
                const id = addBuffer(`${v}.gathered`, valueType.get(v)!, 'arena', k);
                locals[k].set(v, id);
                return id;
              })
            : [mockRows(v)];
        const rows = outs.map((id) => buffers[id].shape[0]);
        collective(
          'gather_v',
          [x],
          outs,
          { group: 'mp', group_size: M, root: 0, out_rows: rows },
          -1, // its blocks are of different microbatches: each buffer's own sizes
          'forward',
        );
      }
    }
  };
  /** level 3, phase 3: each round, scatter the output gradients back, run the encoder backward */
  function encoderPhase3() {
    if (!enc || level !== 3 || !encoderBackward.length) return;
    for (let r = 0; r < enc.placement.slots / M; r++) {
      const slot = r * M + mpRank;
      const encodes = slot < slots;
      const local = encodes ? locals[slot] : undefined;
      for (const v of outputGrads) {
        const ins =
          mpRank === 0
            ? Array.from({ length: M }, (_, i) => {
                const k = r * M + i;
                return k < m ? locals[k].get(v)! : mockRows(v);
              })
            : [mockRows(v)];
        const out = encodes
          ? addBuffer(`${v}.scattered`, valueType.get(v)!, 'arena', slot)
          : mockRows(v);
        collective(
          'scatter_v',
          ins,
          [out],
          { group: 'mp', group_size: M, root: 0, out_rows: [buffers[out].shape[0]] },
          -1, // its blocks are of different microbatches: each buffer's own sizes
          'backward',
        );
        local?.set(v, out);
      }
      if (!encodes) continue;
      // --full-hetero-dp-encoder-recompute: phase 1's activations are gone; the forward again
      if (enc.recompute) runNodes(encoderForward, slot, local!);
      runNodes(encoderBackward, slot, local!);
    }
  }

  // the schedule's passes, with batched p2p between them
  const peerGroup = { group: 'pp' };
  let pendingSends: Omit<PlanInstruction, 'wait' | 'record'>[] = [];
  let lastCompute = -1;
  /** events the next compute instruction waits for (the batch before it) */
  const computeWait: number[] = [];
  let batches = 0;
  /** the batch before a step: pending sends, and the recvs of each of its passes (by microbatch) */
  const flushRecvs = (recvsByPass: Transfer[][], mbs: number[]): number[] => {
    if (!pendingSends.length && !recvsByPass.some((r) => r.length)) return [];
    const batch = batches++;
    const list: Omit<PlanInstruction, 'wait' | 'record'>[] = pendingSends.map((s) => ({
      ...s,
      attrs: { ...s.attrs, batch },
    }));
    for (const [k, recvs] of recvsByPass.entries())
      for (const t of recvs) {
        const mb = mbs[k];
        const id = addBuffer(`${t.value}.recv`, t.type, 'arena', mb);
        locals[mb].set(t.value, id);
        list.push({
          stream: 'comm',
          op: 'recv',
          inputs: [],
          outputs: [id],
          attrs: {
            ...peerGroup,
            peer: t.from.chunk % pipe.pp,
            tag: t.tag + mb,
            dtype: t.type.dtype,
            shape: t.type.shape.map(formatDim),
            batch,
          },
          microbatch: mb,
          phase: t.to.phase,
          scope: 'pipeline',
        });
      }
    pendingSends = [];
    const wait = lastCompute >= 0 ? [record(lastCompute)] : [];
    let last = -1;
    list.forEach((ins, i) => (last = push(ins, i === 0 ? wait : [])));
    return [record(last)];
  };
  // steps: each warm-up forward alone, each steady-state forward with its backward, each
  // cool-down backward alone; the batch between two steps carries everything the first sends and
  // the second receives (Megatron's send_forward_backward_recv_forward_backward)
  const steps: Action[][] = [];
  const w = pipe.warmup ?? pipe.actions.length;
  pipe.actions.forEach((a, i) => {
    const paired =
      i > w &&
      i < pipe.actions.length &&
      (i - w) % 2 === 1 &&
      a.kind === 'B' &&
      pipe.actions[i - 1].kind === 'F';
    if (paired) steps[steps.length - 1].push(a);
    else steps.push([a]);
  });
  const passOf = (kind: 'F' | 'B', a: { chunk: number; microbatch: number }): PassRef => ({
    chunk: a.chunk * pipe.pp + pipe.stage,
    phase: kind === 'F' ? 'forward' : 'backward',
    mb: a.microbatch,
  });
  const passesOf = (a: Action): PassRef[] =>
    a.kind === 'FB' ? [passOf('F', a.f), passOf('B', a.b)] : [passOf(a.kind, a)];

  // ---- combined forward-backward steps (--overlap-moe-expert-parallel-comm) -----------------
  // A pass's nodes, cut at its expert all-to-alls: compute segments and comm units alternate,
  // starting with a compute segment. A unit is one all_to_all_v, or the counts exchange, the
  // per-rank counts and the rows (a dispatch). Megatron's combined 1F1B (reference/anchors.md),
  // layer by layer of the paired forward F and backward B, the units on the comm stream:
  //   B's compute up to its combine       | (comm idle or the last unit)
  //   F's compute up to its dispatch      | B combine
  //   B's experts (dgrad)                 | F dispatch
  //   B's experts' weight gradients       | B dispatch (with --delay-wgrad-compute)
  //   F's experts                         |
  //   B's router, attention …             | F combine
  // Each unit waits for the compute issued before it and its consumer waits for it; the bytes it
  // reads or writes stay allocated until that wait.
  const pieces = (nodes: readonly Node[]) => {
    const out: Node[][] = [[]];
    for (let i = 0; i < nodes.length; i++) {
      if (nodes[i].op !== 'all_to_all_v') {
        out[out.length - 1].push(nodes[i]);
        continue;
      }
      const unit = [nodes[i]];
      if (nodes[i + 1]?.op === 'moe_rank_counts' && nodes[i + 2]?.op === 'all_to_all_v')
        unit.push(nodes[++i], nodes[++i]);
      out.push(unit, []);
    }
    return out;
  };
  const emitCombined = (f: PassRef, b: PassRef) => {
    const fp = pieces(passNodes.get(passKey(f.chunk, f.phase)) ?? []);
    const bp = pieces(passNodes.get(passKey(b.chunk, b.phase)) ?? []);
    const pending = new Map<Node[], number>(); // unit → its completion event
    const compute = (nodes: readonly Node[], x: PassRef) => runNodes(nodes, x.mb, locals[x.mb]);
    const issue = (unit: Node[], x: PassRef) => {
      let wait = lastCompute >= 0 ? [record(lastCompute)] : [];
      let last = -1;
      for (const n of unit) {
        last = emitNode(n, x.mb, locals[x.mb], wait, 'comm');
        wait = [];
      }
      const e = record(last);
      const touched = unit.flatMap((n) =>
        [...n.inputs, ...n.outputs.map((o) => o.name)].map(
          (v) => locals[x.mb].get(v) ?? global.get(v)!,
        ),
      );
      keepUntilWait.set(e, touched);
      pending.set(unit, e);
    };
    /** the compute segment after unit k of a pass waits for that unit */
    const awaitUnit = (list: Node[][], k: number) => {
      const e = pending.get(list[k]);
      if (e === undefined) return;
      computeWait.push(e);
      pending.delete(list[k]);
    };
    /** a segment's nodes in two lists: now, and the weight gradients delayed past the next
     * unit, with what reads them (their accumulations) */
    const splitDelayed = (nodes: readonly Node[]): [Node[], Node[]] => {
      if (opts.delayWgrad !== true) return [[...nodes], []];
      const late = new Set<string>();
      const now: Node[] = [];
      const later: Node[] = [];
      for (const n of nodes) {
        const delayed = /_wgrad$/.test(n.op) || n.inputs.some((v) => late.has(v));
        if (delayed) n.outputs.forEach((o) => late.add(o.name));
        (delayed ? later : now).push(n);
      }
      return [now, later];
    };
    let fi = 0; // next F compute segment (even index)
    let bi = 0;
    while (fi < fp.length || bi < bp.length) {
      // B up to its next unit (its combine), then that unit on comm
      if (bi < bp.length) {
        if (bi > 0) awaitUnit(bp, bi - 1);
        compute(bp[bi], b);
        if (bi + 1 < bp.length) issue(bp[bi + 1], b);
      }
      // F up to its next unit (its dispatch) while B's unit runs, then F's unit
      if (fi < fp.length) {
        if (fi > 0) awaitUnit(fp, fi - 1);
        compute(fp[fi], f);
        if (fi + 1 < fp.length) issue(fp[fi + 1], f);
      }
      // B's experts while F's dispatch runs; their weight gradients after B's next unit is issued
      if (bi + 2 < bp.length) {
        awaitUnit(bp, bi + 1);
        const [now, later] = splitDelayed(bp[bi + 2]);
        compute(now, b);
        if (bi + 3 < bp.length) issue(bp[bi + 3], b);
        compute(later, b);
        bi += 4;
      } else bi = bp.length;
      // F's experts while B's dispatch runs, then F's combine
      if (fi + 2 < fp.length) {
        awaitUnit(fp, fi + 1);
        compute(fp[fi + 2], f);
        if (fi + 3 < fp.length) issue(fp[fi + 3], f);
        fi += 4;
      } else fi = fp.length;
    }
    // the last units' consumers are in later steps: whatever computes next waits for them
    computeWait.push(...pending.values());
  };

  encoderPhase1();
  for (const step of steps) {
    const passes = step.flatMap(passesOf);
    // recvs of every pass of the step, before its first pass
    const recvsByPass = passes.map((x) =>
      pipe.transfers.filter((t) => t.to.chunk === x.chunk && t.to.phase === x.phase),
    );
    const batchMbs = passes.map((x) => x.mb);
    computeWait.push(...flushRecvs(recvsByPass, batchMbs));
    const combined = step.length === 1 && step[0].kind === 'FB';
    if (combined) {
      const [f, b] = passes;
      if (f.chunk === 0) beforeDecoderForward(f.mb);
      emitCombined(f, b);
      if (b.chunk === 0) afterDecoderBackward(b.mb);
    }
    for (const x of passes) {
      const local = locals[x.mb];
      if (!combined) {
        if (x.chunk === 0 && x.phase === 'forward') beforeDecoderForward(x.mb);
        for (const n of passNodes.get(passKey(x.chunk, x.phase)) ?? [])
          lastCompute = emitNode(n, x.mb, local, computeWait.splice(0));
        if (x.chunk === 0 && x.phase === 'backward') afterDecoderBackward(x.mb);
      }
      for (const t of pipe.transfers) {
        if (t.from.chunk !== x.chunk || t.from.phase !== x.phase) continue;
        pendingSends.push({
          stream: 'comm',
          op: 'send',
          inputs: [local.get(t.value)!],
          outputs: [],
          attrs: { ...peerGroup, peer: t.to.chunk % pipe.pp, tag: t.tag + x.mb },
          microbatch: x.mb,
          phase: x.phase,
          scope: 'pipeline',
        });
      }
    }
  }
  // the last batch's sends; whatever runs on compute after them (level 3's phase 3) waits
  computeWait.push(...flushRecvs([], []));
  encoderPhase3();

  // ---- gradient sums ------------------------------------------------------------------------
  const gradBuffers = trainable.map((p) => ({ p, buf: buffers[global.get(`grad.${p.name}`)!] }));
  const sumGroups = (p: ParamDecl) =>
    [...(p.dist?.gradSum ?? []), p.dist?.replicas ?? 'dp'].filter((k) => (groupSizes[k] ?? 1) > 1);
  // gradient buffers are written only by grad_accumulate (in place, its second input)
  const lastWrite = new Map<number, number>();
  instructions.forEach((ins, i) => {
    if (ins.op === 'grad_accumulate') lastWrite.set(ins.inputs[1], i);
  });
  interface Bucket {
    /** group kinds summed over: an all_reduce each (a reduce_scatter for shardOver) */
    readonly groups: string[];
    readonly grads: { p: ParamDecl; buf: PlanBuffer }[];
    /** distributed optimizer: the data-parallel kind it is sharded over, else undefined */
    readonly shardOver?: string;
  }
  const buckets: Bucket[] = [];
  {
    // in the order backward finishes them: by last write, latest first
    const order = [...gradBuffers].sort(
      (x, y) => (lastWrite.get(y.buf.id) ?? -1) - (lastWrite.get(x.buf.id) ?? -1),
    );
    const open = new Map<string, { bucket: Bucket; bytes: number }>();
    for (const gb of order) {
      const groups = sumGroups(gb.p);
      if (!groups.length) continue;
      const shardOver = shardable(gb.p) ? (gb.p.dist?.replicas ?? 'dp') : undefined;
      // a shard is updated by one AdamW and weighed once in the norm: its parameters share the
      // weight decay and the copy count
      const key = `${groups.join(',')}|${shardOver ? `${weightDecayKey(gb.p)}|${opts.copies?.[gb.p.name] ?? 1}` : ''}`;
      let cur = open.get(key);
      if (!cur) {
        cur = { bucket: { groups, grads: [], shardOver }, bytes: 0 };
        open.set(key, cur);
        buckets.push(cur.bucket);
      }
      cur.bucket.grads.push(gb);
      cur.bytes += align(gb.buf.bytes);
      if (cur.bytes >= bucketBytes) open.delete(key);
    }
  }
  // sums go after the instruction that completes their bucket; the comm stream keeps that order
  const after = new Map<number, PlanInstruction[]>();
  const syncs: PlanInstruction[] = [];
  // buckets must be contiguous in the grad region (and, sharded, in the param region, padded to
  // a multiple of the shard count): lay them out anew, bucket by bucket
  const spans = relayoutBuckets(buckets);
  const shards: OptimizerShard[] = [];
  const shardBuffers: { bucket: Bucket; grad: number; param: number; m: number; v: number }[] = [];
  buckets.forEach((bucket, k) => {
    const { lo, hi, paramLo } = spans[k];
    const flat = (name: string, region: BufferRegion, offset: number, bytes: number) => {
      const id = buffers.length;
      buffers.push({
        id,
        name,
        region,
        space: 'device',
        dtype: 'f32',
        shape: [String(bytes / 4)],
        offset,
        bytes,
        microbatch: -1,
      });
      return id;
    };
    const whole = flat(`grad_bucket${k}`, 'grad', lo, hi - lo);
    const ready = Math.max(...bucket.grads.map((x) => lastWrite.get(x.buf.id) ?? -1));
    let wait = ready >= 0 ? [record(ready)] : [];
    const issue = (ins: Omit<PlanInstruction, 'wait' | 'record'>) => {
      // in push()'s key order, like every other instruction (the program's text form assumes it)
      const full: PlanInstruction = {
        stream: ins.stream,
        op: ins.op,
        inputs: ins.inputs,
        outputs: ins.outputs,
        attrs: ins.attrs,
        wait,
        record: [],
        microbatch: ins.microbatch,
        phase: ins.phase,
        scope: ins.scope,
      };
      wait = [];
      syncs.push(full);
      const list = after.get(ready) ?? [];
      list.push(full);
      after.set(ready, list);
    };
    const sync = {
      stream: 'comm' as const,
      microbatch: -1,
      phase: 'backward' as const,
      scope: 'gradient_sync',
    };
    for (const kind of bucket.groups) {
      if (kind === bucket.shardOver) continue;
      issue({
        ...sync,
        op: 'all_reduce',
        inputs: [whole],
        outputs: [whole],
        attrs: { group: kind, group_size: groupSizes[kind] },
      });
    }
    if (!bucket.shardOver) return;
    // distributed optimizer: this rank's shard of the summed bucket, its AdamW state
    const n = groupSizes[bucket.shardOver];
    const shardBytes = (hi - lo) / n;
    const grad = flat(`grad_shard${k}`, 'grad', regionTop.grad, shardBytes);
    regionTop.grad += shardBytes;
    issue({
      ...sync,
      op: 'reduce_scatter',
      inputs: [whole],
      outputs: [grad],
      attrs: { group: bucket.shardOver, group_size: n },
    });
    const param = flat(`param_bucket${k}`, 'param', paramLo, hi - lo);
    const m = flat(`exp_avg_shard${k}`, 'optim', regionTop.optim, shardBytes);
    regionTop.optim += shardBytes;
    const v = flat(`exp_avg_sq_shard${k}`, 'optim', regionTop.optim, shardBytes);
    regionTop.optim += shardBytes;
    shardBuffers.push({ bucket, grad, param, m, v });
    shards.push({
      group: bucket.shardOver,
      parts: n,
      elements: (hi - lo) / 4,
      expAvg: m,
      expAvgSq: v,
      params: bucket.grads.map((x) => ({
        name: x.p.name,
        offset: (buffers[x.buf.id].offset - lo) / 4,
        elements: x.buf.bytes / 4,
      })),
    });
  });
  if (syncs.length) {
    // merge: each sum right after its ready instruction (or at the end when never written)
    const merged: PlanInstruction[] = [];
    const lead = after.get(-1) ?? [];
    instructions.forEach((ins, i) => {
      merged.push(ins);
      for (const s of after.get(i) ?? []) merged.push(s);
    });
    merged.push(...lead);
    instructions.length = 0;
    for (const ins of merged) instructions.push(ins);
  }
  // the optimizer step waits for the comm stream's last instruction (sums and sends)
  let stepWait: number[] = computeWait.splice(0);
  const lastComm = lastOn('comm');
  if (lastComm >= 0) stepWait = [record(lastComm)];

  // ---- the optimizer step -------------------------------------------------------------------
  const stepLocal = new Map<string, number>();
  const stepNodes = g.nodes.filter((n) => n.phase === 'optimizer');
  const world = opts.worldSize ?? 1;
  const sharded = new Set(shardBuffers.flatMap((x) => x.bucket.grads.map((y) => y.p.name)));
  const step = { microbatch: -1, phase: 'optimizer' as const, scope: 'optimizer' };
  let coef = -1;
  for (const n of stepNodes) {
    if (n.op === 'sum_squares') {
      // the norm: whole local gradients and this rank's shards, each weighed by 1 / its copies
      const ins = n.inputs.filter((v) => {
        const p = v.replace(/^grad\./, '');
        return localNames.has(p) && !sharded.has(p);
      });
      const weight = (p: ParamDecl) => 1 / (opts.copies?.[p.name] ?? 1);
      const scales = ins.map((v) => weight(byName.get(v.replace(/^grad\./, ''))!));
      const shardIns = shardBuffers.map((x) => x.grad);
      const shardScales = shardBuffers.map(
        (x) => weight(x.bucket.grads[0].p) * groupSizes[x.bucket.shardOver!],
      );
      const all = [...scales, ...shardScales];
      const out = n.outputs[0];
      const name = stepOutputs.get(out.name);
      const sumsq = name
        ? (scalars[name] = addBuffer(name, out.type, 'scalar', -1))
        : addBuffer(out.name, out.type, 'arena', -1);
      stepLocal.set(out.name, sumsq);
      push(
        {
          stream: 'compute',
          op: 'sum_squares',
          inputs: [...ins.map((v) => global.get(v)!), ...shardIns],
          outputs: [sumsq],
          attrs: all.some((x) => x !== 1) ? { ...n.attrs, scales: all } : n.attrs,
          ...step,
        },
        stepWait,
      );
      stepWait = [];
      if (world > 1)
        push({
          stream: 'compute',
          op: 'all_reduce',
          inputs: [sumsq],
          outputs: [sumsq],
          attrs: { group: 'world', group_size: world },
          ...step,
        });
      continue;
    }
    if (n.op === 'adamw' && (!localNames.has(n.inputs[0]) || sharded.has(n.inputs[0]))) continue;
    const at = emitNode(n, -1, stepLocal, stepWait);
    if (n.op === 'clip_coef') coef = instructions[at].outputs[0];
    stepWait = [];
  }
  // sharded AdamW: update this rank's slice of each bucket, then gather the updated parameters
  for (const x of shardBuffers) {
    const kind = x.bucket.shardOver!;
    const n = groupSizes[kind];
    const slice = addBuffer(
      `param_shard${x.param}`,
      { dtype: 'f32', shape: [buffers[x.grad].bytes / 4] },
      'arena',
      -1,
    );
    const coll = { group: kind, group_size: n };
    push({
      stream: 'compute',
      op: 'group_slice',
      inputs: [x.param],
      outputs: [slice],
      attrs: coll,
      ...step,
    });
    const p0 = x.bucket.grads[0].p;
    const adamw = stepNodes.find((s) => s.op === 'adamw' && s.inputs[0] === p0.name)!;
    push({
      stream: 'compute',
      op: 'adamw',
      inputs: [slice, x.grad, x.m, x.v, coef],
      outputs: [],
      attrs: adamw.attrs,
      ...step,
    });
    push({
      stream: 'compute',
      op: 'all_gather',
      inputs: [slice],
      outputs: [x.param],
      attrs: coll,
      ...step,
    });
  }

  /**
   * Lays the gradient region out bucket by bucket (each contiguous; a sharded bucket padded to a
   * multiple of its shard count), and the parameters of sharded buckets in the same order in
   * the parameter region. Returns each bucket's byte span in the grad region and, when
   * sharded, where its parameters start.
   */
  function relayoutBuckets(list: readonly Bucket[]) {
    let top = 0;
    let paramTop = 0;
    const placed = new Set<number>();
    const placedParams = new Set<number>();
    const out = list.map((b) => {
      const lo = top;
      const paramLo = paramTop;
      for (const { p, buf } of b.grads) {
        buffers[buf.id].offset = top;
        if (b.shardOver) {
          const pid = global.get(p.name)!;
          buffers[pid].offset = paramLo + (top - lo);
          placedParams.add(pid);
        }
        top += align(Math.max(buf.bytes, 1));
        placed.add(buf.id);
      }
      if (b.shardOver) {
        const unit = ALIGN * groupSizes[b.shardOver];
        top = lo + Math.ceil((top - lo) / unit) * unit;
        paramTop = paramLo + (top - lo);
      }
      return { lo, hi: top, paramLo };
    });
    for (const b of buffers)
      if (b.region === 'grad' && b.viewOf === undefined && !placed.has(b.id)) {
        b.offset = top;
        top += align(Math.max(b.bytes, 1));
      }
    regionTop.grad = top;
    if (placedParams.size) {
      for (const b of buffers)
        if (b.region === 'param' && b.viewOf === undefined && !placedParams.has(b.id)) {
          b.offset = paramTop;
          paramTop += align(Math.max(b.bytes, 1));
        }
      regionTop.param = paramTop;
    }
    // views (a reshaped bias, a bucket) follow the buffer they view
    for (const b of buffers)
      if (b.viewOf !== undefined && b.region !== 'arena') b.offset = buffers[b.viewOf].offset;
    return out;
  }

  // ids by first appearance (compiler/plan/number.ts), so the memory plan does not depend on the
  // order buffers were made in
  {
    const r = numberProgram({
      buffers,
      instructions,
      params,
      inputs,
      scalars,
      outputs,
      optimizerShards: shards,
      keepUntilWait,
      events,
    });
    const refill = <T>(list: T[], items: readonly T[]) => {
      list.length = 0;
      for (const x of items) list.push(x);
    };
    refill(buffers, r.buffers as typeof buffers);
    refill(instructions, r.instructions);
    refill(params, r.params);
    refill(inputs, r.inputs);
    refill(outputs, r.outputs);
    refill(shards, r.optimizerShards);
    for (const k of Object.keys(scalars)) scalars[k] = r.scalars[k];
    keepUntilWait.clear();
    for (const [e, ids] of r.keepUntilWait) keepUntilWait.set(e, [...ids]);
    events = r.events;
  }
  events = applyActivationPolicy({ instructions, buffers, events }, opts.activations);
  if (level === 3 && enc?.offload) {
    const { arena } = lifetimesOf(instructions, buffers, keepUntilWait);
    const r = offloadIdleEncoderBytes({ instructions, buffers, events }, arena);
    events = r.events;
    for (const [e, ids] of r.keep) keepUntilWait.set(e, [...(keepUntilWait.get(e) ?? []), ...ids]);
  }

  // ---- the arena, and the host region of offloaded activations: planned from lifetimes ---------
  const lifetimes = lifetimesOf(instructions, buffers, keepUntilWait);
  const placeByLifetime = (region: 'arena' | 'host') => {
    const plan = planArena(lifetimes[region]);
    for (const b of buffers) if (b.region === region) b.offset = plan.offsets[b.viewOf ?? b.id];
    regionTop[region] = plan.sizeBytes;
    return plan;
  };
  const plan = placeByLifetime('arena');
  placeByLifetime('host');

  return {
    format: PROGRAM_FORMAT,
    version: PLAN_VERSION,
    id: opts.id ?? 'p0',
    regions: regionTop,
    arenaLowerBoundBytes: plan.lowerBoundBytes,
    buffers,
    params,
    inputs,
    scalars,
    outputs,
    events,
    instructions,
    ...(shards.length ? { optimizerShards: shards } : {}),
  };
}

/**
 * The lifetimes of the planned regions' buffers (views count for the buffer they view), in issue
 * order: a batched send/recv runs from its batch's first instruction to its last, so what it sends
 * stays live to the end and what it receives is written from the start; a comm unit's bytes stay
 * allocated until an instruction waits for its event (`keepUntilWait`).
 */
function lifetimesOf(
  instructions: readonly PlanInstruction[],
  buffers: readonly PlanBuffer[],
  keepUntilWait: ReadonlyMap<number, readonly number[]>,
): Record<'arena' | 'host', Lifetime[]> {
  const root = (id: number) => rootOf(buffers, id);
  const span = batchSpans(instructions);
  const firstDef = new Int32Array(buffers.length).fill(-1);
  const lastUse = new Int32Array(buffers.length).fill(-1);
  for (let idx = 0; idx < instructions.length; idx++) {
    const ins = instructions[idx];
    const last = span.last[idx];
    for (const id of ins.inputs) {
      const r = root(id);
      if (lastUse[r] < last) lastUse[r] = last;
    }
    for (const e of ins.wait)
      for (const id of keepUntilWait.get(e) ?? []) {
        const r = root(id);
        if (lastUse[r] < idx) lastUse[r] = idx;
      }
    for (const id of ins.outputs) {
      const r = root(id);
      if (firstDef[r] < 0) firstDef[r] = span.first[idx];
      if (lastUse[r] < last) lastUse[r] = last;
    }
  }
  const lifetimes: Record<'arena' | 'host', Lifetime[]> = { arena: [], host: [] };
  for (const b of buffers)
    if ((b.region === 'arena' || b.region === 'host') && b.viewOf === undefined)
      lifetimes[b.region].push({
        id: b.id,
        bytes: b.bytes,
        start: Math.max(firstDef[b.id], 0),
        end: lastUse[b.id] >= 0 ? lastUse[b.id] : Math.max(firstDef[b.id], 0),
      });
  return lifetimes;
}

function weightDecayKey(p: ParamDecl): string {
  return p.type.shape.length >= 2 ? 'wd' : 'no-wd';
}
