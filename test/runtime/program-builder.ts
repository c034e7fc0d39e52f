// Hand-written programs for the native runtime's tests: a small builder that lays buffers out in
// their regions (64-byte aligned, sized at the symbols' bounds) the way the plan emitter does, and
// returns a ProgramFile of compiler/plan/format.ts, its scratch planned by compiler/plan/scratch.ts
// as the memory-plan pass plans it (so every runtime test runs its ops on exactly the planned
// scratch, and a rule that under-counts fails the test that runs the op).

import { scratchByStream } from '../../compiler/plan/scratch.js';
import {
  PLAN_VERSION,
  PROGRAM_FORMAT,
  type BufferRegion,
  type PlanBuffer,
  type PlanInstruction,
  type ProgramFile,
  type ProgramInput,
  type ProgramParam,
  type StreamName,
} from '../../compiler/plan/format.js';

const DTYPE_BYTES: Record<string, number> = {
  f32: 4,
  f64: 8,
  i32: 4,
  i64: 8,
  u8: 1,
  bf16: 2,
  f16: 2,
};

/** Value of a dim text at the given symbol sizes (the same rule as ir/shape.ts). */
export function resolveDim(d: string, sizes: Record<string, number>): number {
  if (/^\d+$/.test(d)) return Number(d);
  const m = /^(?:(\d+)\*)?([A-Za-z_]\w*)(?:\/(\d+))?$/.exec(d);
  if (!m) throw new Error(`bad dim ${d}`);
  const size = sizes[m[2]];
  if (size === undefined) throw new Error(`no size for ${m[2]}`);
  return Math.floor((size * Number(m[1] ?? 1)) / Number(m[3] ?? 1));
}

type Dims = readonly (string | number)[];

export interface InstrOptions {
  readonly wait?: readonly number[];
  readonly record?: readonly number[];
  readonly microbatch?: number;
  readonly phase?: PlanInstruction['phase'];
  readonly scope?: string;
}

export class ProgramBuilder {
  readonly buffers: PlanBuffer[] = [];
  readonly params: ProgramParam[] = [];
  readonly inputs: ProgramInput[] = [];
  readonly outputs: { name: string; buffer: number; microbatch: number }[] = [];
  readonly scalars: Record<string, number> = {};
  readonly instructions: PlanInstruction[] = [];
  private readonly used: Record<BufferRegion, number> = {
    arena: 0,
    param: 0,
    grad: 0,
    optim: 0,
    data: 0,
    scalar: 0,
    host: 0,
  };
  private eventCount = 0;
  /** plan the streams' scratch (false: a program that is never run, its ops schematic) */
  protected planScratch = true;

  constructor(
    readonly id: string,
    /** symbol bounds: buffers are planned at these sizes */
    readonly bounds: Record<string, number> = { S: 8, Nv: 4 },
  ) {}

  /** A buffer at the next 64-byte boundary of its region, planned at the bounds. */
  buffer(
    name: string,
    region: BufferRegion,
    dtype: string,
    shape: Dims,
    opts: { microbatch?: number; space?: 'device' | 'host' } = {},
  ): number {
    const dims = shape.map(String);
    const elems = dims.reduce((n, d) => n * resolveDim(d, this.bounds), 1);
    const bytes = elems * DTYPE_BYTES[dtype];
    // data buffers are laid out per slot in the runtime, but one offset space is fine for both
    const offset = Math.ceil(this.used[region] / 64) * 64;
    this.used[region] = offset + bytes;
    const id = this.buffers.length;
    this.buffers.push({
      id,
      name,
      region,
      space: opts.space ?? 'device',
      dtype,
      shape: dims,
      offset,
      bytes,
      microbatch:
        opts.microbatch ?? (region === 'arena' && dims.some((d) => !/^\d+$/.test(d)) ? 0 : -1),
    });
    return id;
  }

  /** A view (reshape output) sharing the bytes of `of`. */
  view(name: string, of: number, shape: Dims): number {
    const base = this.buffers[of];
    const id = this.buffers.length;
    this.buffers.push({ ...base, id, name, shape: shape.map(String), viewOf: of });
    return id;
  }

  arena(name: string, dtype: string, shape: Dims, microbatch?: number): number {
    return this.buffer(name, 'arena', dtype, shape, { microbatch });
  }

  /** A data field of a microbatch slot (ProgramInput). */
  input(field: string, dtype: string, shape: Dims, microbatch = 0): number {
    const id = this.buffer(`mb${microbatch}.${field}`, 'data', dtype, shape, { microbatch });
    this.inputs.push({ name: field, buffer: id, microbatch });
    return id;
  }

  /** A parameter, with gradient and AdamW state buffers when trainable. */
  param(
    name: string,
    shape: readonly number[],
    opts: {
      dtype?: string;
      trainable?: boolean;
      shard?: readonly (readonly [number, number])[];
    } = {},
  ): { buffer: number; grad: number; m: number; v: number } {
    const dtype = opts.dtype ?? 'f32';
    const local = opts.shard ? opts.shard.map(([, len]) => len) : shape;
    const buffer = this.buffer(name, 'param', dtype, local);
    let grad = -1;
    let m = -1;
    let v = -1;
    if (opts.trainable ?? true) {
      grad = this.buffer(`${name}.grad`, 'grad', dtype, local);
      m = this.buffer(`${name}.exp_avg`, 'optim', dtype, local);
      v = this.buffer(`${name}.exp_avg_sq`, 'optim', dtype, local);
    }
    this.params.push({
      name,
      buffer,
      ...(grad >= 0 ? { grad, expAvg: m, expAvgSq: v } : {}),
      shard: opts.shard ?? shape.map((d) => [0, d] as const),
    });
    return { buffer, grad, m, v };
  }

  scalar(name: string, dtype = 'f32'): number {
    const id = this.buffer(name, 'scalar', dtype, []);
    this.scalars[name] = id;
    return id;
  }

  event(): number {
    return this.eventCount++;
  }

  instr(
    stream: StreamName,
    op: string,
    inputs: readonly number[],
    outputs: readonly number[],
    attrs: Record<string, unknown> = {},
    opts: InstrOptions = {},
  ): number {
    this.instructions.push({
      stream,
      op,
      inputs,
      outputs,
      attrs,
      wait: opts.wait ?? [],
      record: opts.record ?? [],
      microbatch: opts.microbatch ?? 0,
      phase: opts.phase ?? 'forward',
      scope: opts.scope ?? `test.${op}`,
    });
    return this.instructions.length - 1;
  }

  output(name: string, buffer: number, microbatch = 0): void {
    this.outputs.push({ name, buffer, microbatch });
  }

  build(): ProgramFile {
    const used = { ...this.used };
    for (const k of Object.keys(used) as BufferRegion[]) used[k] = Math.ceil(used[k] / 64) * 64;
    const scratchBytes = this.planScratch
      ? scratchByStream(this.instructions, this.buffers, (s) => {
          const bound = this.bounds[s];
          if (bound === undefined) throw new Error(`no bound for symbol ${s}`);
          return bound;
        })
      : { compute: 0, comm: 0, copy: 0, grad: 0 };
    const regions = {
      ...used,
      scratch: scratchBytes.compute + scratchBytes.comm + scratchBytes.copy,
    };
    return {
      format: PROGRAM_FORMAT,
      version: PLAN_VERSION,
      id: this.id,
      regions,
      scratchBytes,
      arenaLowerBoundBytes: regions.arena,
      buffers: this.buffers,
      params: this.params,
      inputs: this.inputs,
      scalars: this.scalars,
      outputs: this.outputs,
      events: this.eventCount,
      instructions: this.instructions,
    };
  }

  json(): string {
    return JSON.stringify(this.build());
  }
}

/** Typed views of a buffer inside a region's ArrayBuffer. */
export function f32At(region: ArrayBuffer, b: PlanBuffer, n?: number): Float32Array {
  return new Float32Array(region, b.offset, n ?? b.bytes / 4);
}

export function f64At(region: ArrayBuffer, b: PlanBuffer, n?: number): Float64Array {
  return new Float64Array(region, b.offset, n ?? b.bytes / 8);
}

/** A microbatch without images from plain token lists (labels/mask follow the packing rule). */
export function textMicrobatch(samples: readonly (readonly number[])[], seqLength: number) {
  const tokens: number[] = [];
  const labels: number[] = [];
  const mask: number[] = [];
  const positions: number[] = [];
  const segments: number[] = [];
  samples.forEach((s, si) => {
    s.forEach((t, i) => {
      const next = i + 1 < s.length ? s[i + 1] : 0;
      const text = next >= 2;
      tokens.push(t);
      labels.push(text ? next : 0);
      mask.push(text ? 1 : 0);
      positions.push(i);
      segments.push(si);
    });
  });
  while (tokens.length < seqLength) {
    tokens.push(0);
    labels.push(0);
    mask.push(0);
    positions.push(0);
    segments.push(-1);
  }
  return {
    tokens: Int32Array.from(tokens),
    labels: Int32Array.from(labels),
    lossMask: Uint8Array.from(mask),
    positions: Int32Array.from(positions),
    segments: Int32Array.from(segments),
    images: [] as { height: number; width: number; pixels: Float32Array }[],
  };
}
