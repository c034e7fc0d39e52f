// Views of a rank's persistent state (parameters, gradients, AdamW moments, fp32 master weights)
// inside the native runtime's regions, by program parameter name (a rank's parameters may be
// pieces of whole tensors: checkpoint.ts maps them), and of other persistent buffers by id (the
// distributed optimizer's bucket slices).
//
// Values cross as f32 whatever the buffer holds: a bf16 buffer is read exactly and written
// rounded to nearest even. Under mixed precision a parameter's value is its fp32 master weight
// where the rank holds one: `read(p, 'param')` gives the master, and `write(p, 'param', v)` sets
// the master to v and the bf16 parameter to v rounded, as Megatron's optimizer keeps the two.

import type { ProgramFile, ProgramParam } from '../compiler/plan/format.js';
import { bf16ToF32, f32ToBf16 } from './bf16.js';

export type StateKind = 'param' | 'grad' | 'expAvg' | 'expAvgSq' | 'master';

export interface RegionSource {
  region(name: 'param' | 'grad' | 'optim' | 'scalar'): ArrayBuffer;
}

const PERSISTENT = new Set(['param', 'grad', 'optim']);

export class RankState {
  private readonly byName: Map<string, ProgramParam>;

  constructor(
    private readonly program: ProgramFile,
    private readonly rt: RegionSource,
  ) {
    this.byName = new Map(program.params.map((p) => [p.name, p]));
  }

  names(): string[] {
    return [...this.byName.keys()];
  }

  has(name: string, kind: StateKind): boolean {
    const p = this.byName.get(name);
    return p !== undefined && (kind === 'param' ? true : p[kind] !== undefined);
  }

  shape(name: string): number[] {
    return this.program.params.find((p) => p.name === name)!.shard.map(([, len]) => len);
  }

  /** A persistent f32 buffer (param, grad or optim region) by id, over the runtime's memory. */
  buffer(id: number): Float32Array {
    const b = this.program.buffers[id];
    if (!b || b.dtype !== 'f32' || !PERSISTENT.has(b.region))
      throw new Error(`program ${this.program.id}: buffer ${id} is not a persistent f32 buffer`);
    return new Float32Array(this.rt.region(b.region as 'param'), b.offset, b.bytes / 4);
  }

  /** A persistent buffer's values as f32 (a copy; bf16 read exactly). */
  readBuffer(id: number): Float32Array {
    const b = this.persistent(id);
    if (b.dtype === 'f32') return this.buffer(id).slice();
    return bf16ToF32(new Uint16Array(this.rt.region(b.region as 'param'), b.offset, b.bytes / 2));
  }

  /** Writes f32 values into a persistent buffer (bf16: rounded to nearest even). */
  writeBuffer(id: number, values: Float32Array, at = 0): void {
    const b = this.persistent(id);
    if (b.dtype === 'f32') {
      this.buffer(id).set(values, at);
      return;
    }
    const bits = new Uint16Array(this.rt.region(b.region as 'param'), b.offset, b.bytes / 2);
    f32ToBf16(values, bits.subarray(at, at + values.length));
  }

  /**
   * A parameter's state as f32 values (a copy). For 'param', its fp32 master weights where this
   * rank holds them, else the parameter itself.
   */
  read(name: string, kind: StateKind): Float32Array {
    const p = this.param(name);
    if (kind === 'param' && p.master !== undefined) return this.readBuffer(p.master);
    return this.readBuffer(this.idOf(p, kind));
  }

  /** Sets a parameter's state; for 'param' also its master weights (the parameter rounded). */
  write(name: string, kind: StateKind, values: Float32Array): void {
    const p = this.param(name);
    if (kind === 'param' && p.master !== undefined) this.writeBuffer(p.master, values);
    this.writeBuffer(this.idOf(p, kind), values);
  }

  /**
   * The distributed optimizer's fp32 master slices from the parameters they update (the rank's
   * block of each bucket, upcast exactly), as Megatron's optimizer starts them: after the
   * parameters were initialized or loaded without their master weights. `groupRank` gives this
   * rank's index in a group kind.
   */
  initShardMasters(groupRank: (kind: string) => number): void {
    for (const [k, s] of (this.program.optimizerShards ?? []).entries()) {
      if (s.master === undefined) continue;
      const bucket = this.paramBucketOf(k);
      const length = s.elements / s.parts;
      const at = groupRank(s.group) * length;
      this.writeBuffer(s.master, this.readBuffer(bucket).subarray(at, at + length));
    }
  }

  /** bucket k's parameters, where the all_gather after its AdamW puts the updated slices */
  private paramBucketOf(k: number): number {
    const s = this.program.optimizerShards![k];
    const ins = this.program.instructions;
    const adamw = ins.find((i) => i.op === 'adamw' && i.inputs[2] === s.expAvg);
    const gather = ins.find((i) => i.op === 'all_gather' && i.inputs[0] === adamw?.inputs[0]);
    if (!gather)
      throw new Error(
        `program ${this.program.id}: no all_gather follows optimizer bucket ${k}'s adamw`,
      );
    return gather.outputs[0];
  }

  private param(name: string): ProgramParam {
    const p = this.byName.get(name);
    if (!p) throw new Error(`no parameter ${name} in program ${this.program.id}`);
    return p;
  }

  private idOf(p: ProgramParam, kind: StateKind): number {
    const id = kind === 'param' ? p.buffer : p[kind];
    if (id === undefined) throw new Error(`parameter ${p.name} has no ${kind} (frozen?)`);
    return id;
  }

  private persistent(id: number) {
    const b = this.program.buffers[id];
    if (!b || !PERSISTENT.has(b.region) || (b.dtype !== 'f32' && b.dtype !== 'bf16'))
      throw new Error(
        `program ${this.program.id}: buffer ${id} is not a persistent f32 or bf16 buffer`,
      );
    return b;
  }
}
