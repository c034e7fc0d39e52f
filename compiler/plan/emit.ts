// Emission of one rank's program from a training-step graph: every forward and backward node
// once per microbatch (forward then backward, which keeps activations of one microbatch live at
// a time), then the optimizer step once. Buffers: parameters, gradients and optimizer state in
// their persistent regions; data inputs per microbatch slot; step scalars; every other value in
// the arena, placed by the memory planner. A reshape is a view of its input.

import { DTYPE_BYTES } from '../../ir/dtype.js';
import type { Graph, Node } from '../../ir/graph.js';
import { OP_TABLE } from '../../ir/ops.js';
import { formatDim, numel } from '../../ir/shape.js';
import type { TensorType } from '../../ir/types.js';
import { align, planArena, type Lifetime } from './memory.js';
import {
  PROGRAM_FORMAT,
  PLAN_VERSION,
  type BufferRegion,
  type PlanBuffer,
  type PlanInstruction,
  type ProgramFile,
  type ProgramInput,
  type ProgramParam,
  type StreamName,
} from './format.js';

export interface EmitOptions {
  readonly numMicrobatches: number;
  readonly id?: string;
  /**
   * Data parallelism: gradients are summed over the rank's `dp` group (the group kind, resolved
   * per rank through plan.rankGroups, so every data-parallel replica shares one program), in
   * buckets of about `bucketBytes` on the comm stream as soon as backward finished them.
   */
  readonly dataParallel?: { readonly size: number; readonly bucketBytes?: number };
}

export const DEFAULT_BUCKET_BYTES = 4 * 2 ** 20;

export function streamOf(node: Node): StreamName {
  const cat = OP_TABLE[node.op].category;
  if (cat === 'collective') return 'comm';
  if (cat === 'memory') return 'copy';
  return 'compute';
}

export function emitProgram(g: Graph, opts: EmitOptions): ProgramFile {
  const m = opts.numMicrobatches;
  if (!Number.isInteger(m) || m < 1)
    throw new Error(`numMicrobatches must be a positive integer, got ${m}`);
  const bound = new Map(g.symbols.map((s) => [s.name, s.bound]));
  const bytesOf = (t: TensorType) => numel(t.shape, (s) => bound.get(s)!) * DTYPE_BYTES[t.dtype];

  const buffers: PlanBuffer[] = [];
  const regionTop: Record<BufferRegion, number> = {
    arena: 0,
    param: 0,
    grad: 0,
    optim: 0,
    data: 0,
    scalar: 0,
  };
  const addBuffer = (
    name: string,
    t: TensorType,
    region: BufferRegion,
    microbatch: number,
    viewOf?: number,
  ): number => {
    const id = buffers.length;
    const bytes = bytesOf(t);
    let offset = 0;
    if (viewOf !== undefined) offset = buffers[viewOf].offset;
    else if (region !== 'arena') {
      offset = regionTop[region];
      regionTop[region] += align(Math.max(bytes, 1));
    }
    buffers.push({
      id,
      name,
      region: viewOf !== undefined ? buffers[viewOf].region : region,
      space: t.space ?? 'device',
      dtype: t.dtype,
      shape: t.shape.map(formatDim),
      offset,
      bytes,
      ...(viewOf !== undefined ? { viewOf } : {}),
      microbatch,
    });
    return id;
  };

  // persistent buffers
  const global = new Map<string, number>();
  const params: ProgramParam[] = [];
  const regionOfRole = { param: 'param', grad: 'grad', optimizer_state: 'optim' } as const;
  for (const p of g.params) global.set(p.name, addBuffer(p.name, p.type, regionOfRole[p.role], -1));
  for (const p of g.params.filter((q) => q.role === 'param')) {
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
    });
  }
  const scalars: Record<string, number> = {};
  // scalar inputs (loss_tokens, caption_tokens) are step scalars the runtime fills, shared by
  // every microbatch
  const isStepScalar = (i: { type: TensorType }) => i.type.shape.length === 0;
  for (const i of g.inputs.filter(isStepScalar)) {
    scalars[i.name] = addBuffer(i.name, i.type, 'scalar', -1);
    global.set(i.name, scalars[i.name]);
  }

  const stepNodes = g.nodes.filter((n) => n.phase === 'optimizer');
  const mbNodes = g.nodes.filter((n) => n.phase !== 'optimizer');
  const producedInStep = new Set(stepNodes.flatMap((n) => n.outputs.map((o) => o.name)));
  const mbOutputs = new Map(
    g.outputs.filter((o) => !producedInStep.has(o.value)).map((o) => [o.value, o.label]),
  );
  const stepOutputs = new Map(
    g.outputs.filter((o) => producedInStep.has(o.value)).map((o) => [o.value, o.label]),
  );

  const inputs: ProgramInput[] = [];
  const outputs: { name: string; buffer: number; microbatch: number }[] = [];
  const instructions: PlanInstruction[] = [];
  const lastUse = new Map<number, number>();
  const firstDef = new Map<number, number>();
  const root = (id: number): number => buffers[id].viewOf ?? id;

  const emitNode = (n: Node, mb: number, local: Map<string, number>) => {
    const lookup = (v: string) => {
      const id = local.get(v) ?? global.get(v);
      if (id === undefined)
        throw new Error(`emit: value ${v} has no buffer (node ${n.op} in ${n.scope})`);
      return id;
    };
    const ins = n.inputs.map(lookup);
    const outs = n.outputs.map((o) => {
      let id: number;
      if (n.op === 'reshape') id = addBuffer(o.name, o.type, 'arena', mb, root(ins[0]));
      else if (mbOutputs.has(o.name)) {
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
    const idx = instructions.length;
    for (const id of ins) lastUse.set(root(id), idx);
    for (const id of outs) {
      if (!firstDef.has(root(id))) firstDef.set(root(id), idx);
      lastUse.set(root(id), Math.max(lastUse.get(root(id)) ?? idx, idx));
    }
    instructions.push({
      stream: streamOf(n),
      op: n.op,
      inputs: ins,
      outputs: outs,
      attrs: n.attrs,
      wait: [],
      record: [],
      microbatch: mb,
      phase: n.phase,
      scope: n.scope,
    });
  };

  for (let mb = 0; mb < m; mb++) {
    const local = new Map<string, number>();
    for (const i of g.inputs) {
      if (isStepScalar(i)) continue;
      const id = addBuffer(`${i.name}.mb${mb}`, i.type, 'data', mb);
      local.set(i.name, id);
      inputs.push({ name: i.name, buffer: id, microbatch: mb });
    }
    for (const n of mbNodes) emitNode(n, mb, local);
  }
  let events = 0;
  if (opts.dataParallel && opts.dataParallel.size > 1) {
    events = emitGradientSync(
      opts.dataParallel.size,
      opts.dataParallel.bucketBytes ?? DEFAULT_BUCKET_BYTES,
    );
  }
  const stepLocal = new Map<string, number>();
  const firstStep = instructions.length;
  for (const n of stepNodes) emitNode(n, -1, stepLocal);
  if (events > 0 && instructions.length > firstStep) {
    // the optimizer step reads every summed gradient: wait for the comm stream's last bucket
    instructions[firstStep] = { ...instructions[firstStep], wait: [events - 1] };
  }

  /**
   * Gradient buckets: consecutive grad buffers (in reverse declaration order, the order backward
   * finishes them) of about bucketBytes each, one all_reduce per bucket over a buffer spanning
   * them, issued on the comm stream after the compute instruction that last wrote any of them.
   * Returns the number of events used.
   */
  function emitGradientSync(dpSize: number, bucketBytes: number): number {
    const grads = params.filter((p) => p.grad !== undefined).map((p) => buffers[p.grad!]);
    grads.sort((a, b) => b.offset - a.offset);
    // gradient buffers are written only by grad_accumulate (in place, its second input)
    const lastWrite = new Map<number, number>();
    instructions.forEach((ins, i) => {
      if (ins.op === 'grad_accumulate') lastWrite.set(ins.inputs[1], i);
    });
    const buckets: PlanBuffer[][] = [];
    let cur: PlanBuffer[] = [];
    let curBytes = 0;
    for (const g of grads) {
      cur.push(g);
      curBytes += align(g.bytes);
      if (curBytes >= bucketBytes) {
        buckets.push(cur);
        cur = [];
        curBytes = 0;
      }
    }
    if (cur.length) buckets.push(cur);
    let event = 0;
    const syncs: PlanInstruction[] = [];
    for (const bucket of buckets) {
      const lo = Math.min(...bucket.map((b) => b.offset));
      const hi = Math.max(...bucket.map((b) => b.offset + align(b.bytes)));
      const id = buffers.length;
      buffers.push({
        id,
        name: `grad_bucket${syncs.length}`,
        region: 'grad',
        space: 'device',
        dtype: 'f32',
        shape: [String((hi - lo) / 4)],
        offset: lo,
        bytes: hi - lo,
        microbatch: -1,
      });
      const ready = Math.max(...bucket.map((b) => lastWrite.get(b.id) ?? -1));
      const recordEvent = event++;
      if (ready >= 0)
        instructions[ready] = {
          ...instructions[ready],
          record: [...instructions[ready].record, recordEvent],
        };
      syncs.push({
        stream: 'comm',
        op: 'all_reduce',
        inputs: [id],
        outputs: [id],
        attrs: { group: 'dp', group_size: dpSize },
        wait: ready >= 0 ? [recordEvent] : [],
        record: [],
        microbatch: -1,
        phase: 'backward',
        scope: 'data_parallel',
      });
    }
    // the last sync records the event the optimizer waits for
    const done = event++;
    syncs[syncs.length - 1] = { ...syncs[syncs.length - 1], record: [done] };
    instructions.push(...syncs);
    return event;
  }

  // the arena: planned from lifetimes of the non-view arena buffers
  const lifetimes: Lifetime[] = buffers
    .filter((b) => b.region === 'arena' && b.viewOf === undefined)
    .map((b) => ({
      id: b.id,
      bytes: b.bytes,
      start: firstDef.get(b.id) ?? 0,
      end: lastUse.get(b.id) ?? firstDef.get(b.id) ?? 0,
    }));
  const plan = planArena(lifetimes);
  const placed = buffers.map((b) => {
    if (b.region !== 'arena') return b;
    const base = b.viewOf ?? b.id;
    return { ...b, offset: plan.offsets.get(base)! };
  });
  regionTop.arena = plan.sizeBytes;

  return {
    format: PROGRAM_FORMAT,
    version: PLAN_VERSION,
    id: opts.id ?? 'p0',
    regions: regionTop,
    arenaLowerBoundBytes: plan.lowerBoundBytes,
    buffers: placed,
    params,
    inputs,
    scalars,
    outputs,
    events,
    instructions,
  };
}
