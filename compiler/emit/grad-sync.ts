// Emission pass 5, grad-sync: gradient sums over the groups that hold copies, and the distributed
// optimizer's shards.
//
// Holds before: the lowered program; gradient buffers are written only in place, by
//   grad_accumulate or a fused weight-gradient accumulation (the op table's `updates`).
// Holds after: buckets of about 4 MiB of gradients that share their sum groups (a parameter's
//   gradSum kinds, embd for a tied weight on two stages, and its replicas), in the order
//   backward finishes them, each contiguous in the gradient region (the rest of the region after
//   them); an all_reduce per group on the grad stream, issued right after the instruction that
//   last writes the bucket (overlapping the rest of backward) and waiting for it. With
//   --use-distributed-optimizer a bucket over a data-parallel group of more than one rank is
//   reduce-scattered in place instead (this rank's block of the bucket holds its block of the
//   sum, as Megatron's): it is padded to a multiple of the shard count, its parameters laid out
//   in the same order in the parameter region (at their own element size), and this rank's slice
//   of the AdamW state, and under mixed precision of the fp32 master weights, get buffers of
//   their own (optimizerShards, shardBuffers).

import { DTYPE_BYTES, type DType } from '../../ir/dtype.js';
import { paramsByName, type Graph, type ParamDecl } from '../../ir/graph.js';
import { updatedInputs, type OpKind } from '../../ir/ops.js';
import {
  bufferWith,
  type OptimizerShard,
  type PlanBuffer,
  type PlanInstruction,
} from '../plan/format.js';
import { ALIGN, align } from '../plan/memory.js';
import type { MutableBuffer } from './rewrite.js';
import { ProgramBuilder, scheduled, type ProgramDraft, type Unscheduled } from './draft.js';
import { DEFAULT_BUCKET_BYTES, shardable, type EmitOptions } from './options.js';

interface Bucket {
  /** group kinds summed over: an all_reduce each (a reduce_scatter for shardOver) */
  readonly groups: string[];
  readonly grads: { p: ParamDecl; buf: PlanBuffer }[];
  /** distributed optimizer: the data-parallel kind it is sharded over, else undefined */
  readonly shardOver?: string;
}

export function syncGradients(d: ProgramDraft, g: Graph, opts: EmitOptions): ProgramDraft {
  if (d.marks.length) throw new Error(`grad-sync: ${d.marks.length} marks left by earlier passes`);
  const b = new ProgramBuilder(g, d);
  // the bucket relayout moves gradient and parameter buffers: work on copies of them
  for (let i = 0; i < b.buffers.length; i++) {
    const x = b.buffers[i];
    if (x.region === 'grad' || x.region === 'param') b.buffers[i] = bufferWith(x, {});
  }
  const groupSizes = opts.groupSizes ?? {};
  const byName = paramsByName(g);
  const gradBuffers = d.params
    .filter((p) => p.grad !== undefined)
    .map((p) => ({ p: byName.get(p.name)!, buf: b.buffers[p.grad!] as PlanBuffer }));
  // [buffer] the last instruction that updates it in place, -1: none
  const lastWrite = new Int32Array(b.buffers.length).fill(-1);
  for (let i = 0; i < d.instructions.length; i++) {
    const ins = d.instructions[i];
    const updated = updatedInputs(ins.op as OpKind, ins.inputs.length);
    for (let k = 0; k < updated.length; k++) lastWrite[ins.inputs[updated[k]]] = i;
  }
  const buckets = bucketsOf(gradBuffers, lastWrite, opts);
  // buckets must be contiguous in the grad region (and, sharded, in the param region, padded to
  // a multiple of the shard count): lay them out anew, bucket by bucket
  const params = new Map(d.params.map((p) => [p.name, p.buffer]));
  const spans = relayoutBuckets(b, buckets, params, groupSizes);
  // sums go after the instruction that completes their bucket; the grad stream keeps that order
  const after = new Map<number, PlanInstruction[]>();
  const shards: OptimizerShard[] = [];
  const shardBuffers: { bucket: number; param: number }[] = [];
  const readyOf = (bucket: Bucket) => Math.max(...bucket.grads.map((x) => lastWrite[x.buf.id]));
  // a tied weight's sum over embd (first and last stage) goes after the whole backward, every
  // other sum, as Megatron's finalize_model_grads all-reduces the embedding gradients after the
  // data-parallel sync: its two stages finish their buckets in different orders, and a sum over
  // groups that span stages (the encoder's under full separation) issued after it on one stage
  // and before it on the other would deadlock the grad stream
  //
  // The encoder's sums under levels 2 and 3 (over tp_dp_cp, world) go there too, after the tied
  // ones: the ranks of those groups run different programs (each encodes its own microbatches, a
  // mock slot encodes nothing), so their encoder backward ends at different points of the step,
  // and a group kind whose ranks coincide with another's (tp_dp_cp is tp when dp is 1) shares its
  // communicator, on which every member must issue the same sums in the same order
  const deferred: PlanInstruction[] = [];
  const deferredEncoder: PlanInstruction[] = [];
  buckets.forEach((bucket, k) => {
    const { lo, hi, paramLo } = spans[k];
    const whole = b.addFlat(`grad_bucket${k}`, 'grad', lo, hi - lo);
    const ready = readyOf(bucket);
    const tiedSum = bucket.groups.includes('embd');
    const encoderSum = bucket.groups.some((kind) => ENCODER_SUM_KINDS.has(kind));
    let wait = ready >= 0 ? [b.record(ready)] : [];
    const issue = (ins: Omit<Unscheduled, 'stream' | 'microbatch' | 'phase' | 'scope'>) => {
      const sync = { stream: 'grad' as const, microbatch: -1, phase: 'backward' as const };
      const full = scheduled({ ...sync, ...ins, scope: 'gradient_sync' }, wait);
      wait = [];
      if (tiedSum || encoderSum) {
        (tiedSum ? deferred : deferredEncoder).push(full);
        return;
      }
      const list = after.get(ready) ?? [];
      list.push(full);
      after.set(ready, list);
    };
    for (const kind of bucket.groups) {
      if (kind === bucket.shardOver) continue;
      const attrs = { group: kind, group_size: groupSizes[kind] };
      issue({ op: 'all_reduce', inputs: [whole], outputs: [whole], attrs });
    }
    if (!bucket.shardOver) return;
    // distributed optimizer: this rank's shard of the summed bucket, its AdamW state (f32), and
    // under mixed precision its fp32 master weights
    const n = groupSizes[bucket.shardOver];
    const { grad: gradType, param: paramType } = elementTypes(bucket);
    const elements = (hi - lo) / DTYPE_BYTES[gradType];
    // in place, as Megatron's: this rank's block of the bucket holds its block of the sum (the
    // optimizer step reads it from there); the gradient region holds no second copy
    const attrs = { group: bucket.shardOver, group_size: n };
    issue({ op: 'reduce_scatter', inputs: [whole], outputs: [whole], attrs });
    const paramBytes = elements * DTYPE_BYTES[paramType];
    const param = b.addFlat(`param_bucket${k}`, 'param', paramLo, paramBytes, paramType);
    const f32Shard = (name: string) => {
      const id = b.addFlat(name, 'optim', b.regionTop.optim, (elements / n) * 4);
      b.regionTop.optim += (elements / n) * 4;
      return id;
    };
    const m = f32Shard(`exp_avg_shard${k}`);
    const v = f32Shard(`exp_avg_sq_shard${k}`);
    const master = paramType === 'f32' ? undefined : f32Shard(`master_shard${k}`);
    shardBuffers.push({ bucket: whole, param });
    shards.push({
      group: bucket.shardOver,
      parts: n,
      elements,
      expAvg: m,
      expAvgSq: v,
      ...(master !== undefined ? { master } : {}),
      params: bucket.grads.map((x) => ({
        name: x.p.name,
        offset: (b.buffers[x.buf.id].offset - lo) / DTYPE_BYTES[gradType],
        elements: x.buf.bytes / DTYPE_BYTES[gradType],
      })),
    });
  });
  const last = [...deferred, ...deferredEncoder];
  if (last.length) after.set(-1, [...(after.get(-1) ?? []), ...last]);
  return {
    ...d,
    regions: b.regionTop,
    buffers: b.buffers,
    events: b.events,
    instructions: after.size ? merged(b.instructions, after) : b.instructions,
    optimizerShards: shards,
    shardBuffers,
  };
}

/** the sum groups of the encoder's gradients at levels 2 and 3 (compiler/parallel/encoder.ts) */
const ENCODER_SUM_KINDS: ReadonlySet<string> = new Set(['tp_dp_cp', 'world']);

/** each sum right after its ready instruction (or at the end when never written) */
function merged(
  instructions: readonly PlanInstruction[],
  after: ReadonlyMap<number, PlanInstruction[]>,
): PlanInstruction[] {
  const out: PlanInstruction[] = [];
  instructions.forEach((ins, i) => {
    out.push(ins);
    for (const s of after.get(i) ?? []) out.push(s);
  });
  out.push(...(after.get(-1) ?? []));
  return out;
}

/** Buckets in the order backward finishes them: by last write, latest first. */
function bucketsOf(
  gradBuffers: readonly { p: ParamDecl; buf: PlanBuffer }[],
  lastWrite: Int32Array,
  opts: EmitOptions,
): Bucket[] {
  const groupSizes = opts.groupSizes ?? {};
  const bucketBytes = opts.bucketBytes ?? DEFAULT_BUCKET_BYTES;
  const tied = new Set(opts.tied ?? []);
  const sumGroups = (p: ParamDecl) =>
    [
      ...(p.dist?.gradSum ?? []),
      ...(tied.has(p.name) ? ['embd'] : []),
      p.dist?.replicas ?? 'dp',
    ].filter((k) => (groupSizes[k] ?? 1) > 1);
  const buckets: Bucket[] = [];
  // the encoder's sums under levels 2 and 3 come last, in one order on every rank: the reverse of
  // the declaration order (its backward's), not this program's last writes (a rank with only mock
  // slots never writes them)
  const encoderSum = (p: ParamDecl) => sumGroups(p).some((k) => ENCODER_SUM_KINDS.has(k));
  const decoder = gradBuffers.filter((x) => !encoderSum(x.p));
  const order = [
    ...decoder.sort((x, y) => lastWrite[y.buf.id] - lastWrite[x.buf.id]),
    ...gradBuffers.filter((x) => encoderSum(x.p)).reverse(),
  ];
  const open = new Map<string, { bucket: Bucket; bytes: number }>();
  for (const gb of order) {
    const groups = sumGroups(gb.p);
    if (!groups.length) continue;
    const shardOver = shardable(opts, gb.p) ? (gb.p.dist?.replicas ?? 'dp') : undefined;
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
  return buckets;
}

/** the one gradient and parameter element type of a sharded bucket */
function elementTypes(bucket: Bucket): { grad: DType; param: DType } {
  const grad = bucket.grads[0].buf.dtype as DType;
  const param = bucket.grads[0].p.type.dtype;
  for (const x of bucket.grads)
    if (x.buf.dtype !== grad || x.p.type.dtype !== param)
      throw new Error(`grad-sync: a sharded bucket mixes element types (${x.p.name})`);
  return { grad, param };
}

function weightDecayKey(p: ParamDecl): string {
  return p.type.shape.length >= 2 ? 'wd' : 'no-wd';
}

/**
 * Lays the gradient region out bucket by bucket (each contiguous; a sharded bucket padded to a
 * multiple of its shard count), and the parameters of sharded buckets in the same order in the
 * parameter region. Returns each bucket's byte span in the grad region and, when sharded, where
 * its parameters start.
 */
function relayoutBuckets(
  b: ProgramBuilder,
  list: readonly Bucket[],
  params: ReadonlyMap<string, number>,
  groupSizes: Readonly<Record<string, number>>,
) {
  const buffers: MutableBuffer[] = b.buffers;
  let top = 0;
  let paramTop = 0;
  const placed = new Set<number>();
  const placedParams = new Set<number>();
  const out = list.map((bucket) => {
    const lo = top;
    const paramLo = paramTop;
    // a parameter's element may be smaller than its gradient's (bf16 weights, f32 gradients):
    // its offset in the parameter bucket is the gradient's, scaled
    const types = bucket.shardOver ? elementTypes(bucket) : undefined;
    const scale = types ? DTYPE_BYTES[types.param] / DTYPE_BYTES[types.grad] : 1;
    for (const { p, buf } of bucket.grads) {
      buffers[buf.id].offset = top;
      if (bucket.shardOver) {
        const pid = params.get(p.name)!;
        buffers[pid].offset = paramLo + (top - lo) * scale;
        placedParams.add(pid);
      }
      top += align(Math.max(buf.bytes, 1));
      placed.add(buf.id);
    }
    if (bucket.shardOver) {
      const unit = ALIGN * groupSizes[bucket.shardOver];
      top = lo + Math.ceil((top - lo) / unit) * unit;
      paramTop = paramLo + (top - lo) * scale;
    }
    return { lo, hi: top, paramLo };
  });
  for (let k = 0; k < buffers.length; k++) {
    const x = buffers[k];
    if (x.region === 'grad' && x.viewOf === undefined && !placed.has(x.id)) {
      x.offset = top;
      top += align(Math.max(x.bytes, 1));
    }
  }
  b.regionTop.grad = top;
  if (placedParams.size) {
    for (let k = 0; k < buffers.length; k++) {
      const x = buffers[k];
      if (x.region === 'param' && x.viewOf === undefined && !placedParams.has(x.id)) {
        x.offset = paramTop;
        paramTop += align(Math.max(x.bytes, 1));
      }
    }
    b.regionTop.param = paramTop;
  }
  // views (a reshaped bias, a bucket) follow the buffer they view
  for (let k = 0; k < buffers.length; k++) {
    const x = buffers[k];
    if (x.viewOf !== undefined && (x.region === 'grad' || x.region === 'param'))
      x.offset = buffers[x.viewOf].offset;
  }
  return out;
}
