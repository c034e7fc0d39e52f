// Helpers for rewrites of one emitted program (compiler/emit/activations.ts,
// compiler/emit/encoder-offload.ts): the program being rewritten, copies of its buffers, an index
// of who writes and reads each buffer, and the assembly of the new instruction list.

import {
  bufferWith,
  instructionWith,
  type PlanBuffer,
  type PlanInstruction,
} from '../plan/format.js';

export interface Ctx {
  ins: PlanInstruction[];
  readonly buffers: PlanBuffer[];
  events: number;
}

export type MutableBuffer = { -readonly [K in keyof PlanBuffer]: PlanBuffer[K] };

const DECODER_LAYER = /^model\.layers\.\d+(?=\.|$)/;

/** the decoder layer a scope belongs to (`model.layers.3`), or undefined */
export function layerOf(scope: string): string | undefined {
  return DECODER_LAYER.exec(scope)?.[0];
}

export function under(scope: string, prefix: string): boolean {
  return scope === prefix || scope.startsWith(`${prefix}.`);
}

/** the buffer whose bytes a buffer uses: the one a view views, or itself */
export function rootOf(buffers: readonly PlanBuffer[], id: number): number {
  return buffers[id].viewOf ?? id;
}

/** an event recorded when instruction i ends (one it records already, or a new one) */
export function eventAt(ctx: Ctx, i: number): number {
  const x = ctx.ins[i];
  if (x.record.length) return x.record[0];
  const e = ctx.events++;
  ctx.ins[i] = instructionWith(x, { record: [e] });
  return e;
}

/** adds x to the instructions inserted before place `at` (see assemble) */
export function insertBefore(
  before: Map<number, PlanInstruction[]>,
  at: number,
  x: PlanInstruction,
): void {
  const list = before.get(at);
  if (list) list.push(x);
  else before.set(at, [x]);
}

/** A copy of buffer `of` appended to the program (arena unless told), offset set by a planner. */
export function addCopy(
  ctx: Ctx,
  of: number,
  suffix: string,
  patch: Partial<MutableBuffer> = {},
): number {
  const id = ctx.buffers.length;
  const b = ctx.buffers[of];
  ctx.buffers.push(bufferWith(b, { id, name: `${b.name}${suffix}`, offset: 0, ...patch }));
  return id;
}

/** Indexes of one instruction list: producers and readers of each buffer. */
export class ProgramIndex {
  /** [buffer] the first instruction that writes it, or -1 */
  readonly producer: Int32Array;
  /** [buffer] instructions that read it (as an input), in issue order */
  readonly readers: number[][];
  /** [root buffer] the buffers that are views of it */
  readonly views: number[][];
  /** forward instructions of each microbatch and decoder layer, in issue order */
  readonly layers = new Map<string, { mb: number; layer: string; fw: number[] }>();

  constructor(private readonly ctx: Ctx) {
    const { ins, buffers } = ctx;
    this.producer = new Int32Array(buffers.length).fill(-1);
    this.readers = Array.from({ length: buffers.length }, () => []);
    this.views = Array.from({ length: buffers.length }, () => []);
    for (const b of buffers) if (b.viewOf !== undefined) this.views[b.viewOf].push(b.id);
    ins.forEach((x, i) => {
      for (const o of x.outputs) if (this.producer[o] < 0) this.producer[o] = i;
      for (const v of x.inputs) this.readers[v].push(i);
      const layer = layerOf(x.scope);
      if (x.phase !== 'forward' || x.microbatch < 0 || !layer) return;
      const key = `${x.microbatch} ${layer}`;
      let entry = this.layers.get(key);
      if (!entry) this.layers.set(key, (entry = { mb: x.microbatch, layer, fw: [] }));
      entry.fw.push(i);
    });
  }

  root(id: number): number {
    return rootOf(this.ctx.buffers, id);
  }

  /** instructions that read a root buffer through itself or any view of it */
  readersOfRoot(r: number): number[] {
    const list = [...this.readers[r]];
    for (const v of this.views[r]) list.push(...this.readers[v]);
    return list.sort((a, b) => a - b);
  }

  eventAt(i: number): number {
    return eventAt(this.ctx, i);
  }
}

/** Builds the new list: each instruction preceded by what is inserted before it. */
export function assemble(
  ins: readonly PlanInstruction[],
  before: ReadonlyMap<number, PlanInstruction[]>,
): PlanInstruction[] {
  const out: PlanInstruction[] = [];
  ins.forEach((x, i) => {
    const list = before.get(i);
    if (list) out.push(...list);
    out.push(x);
  });
  return out;
}

/**
 * Before each place i (0..n): the last compute instruction, and the last comm or grad instruction
 * that touches the arena (-1: none). A reload into fresh arena bytes waits for both: the planner
 * may give it bytes any of them still reads or writes.
 */
export function lastArenaUsers(ctx: Ctx): { compute: Int32Array; comm: Int32Array } {
  const { ins, buffers } = ctx;
  const n = ins.length;
  const compute = new Int32Array(n + 1).fill(-1);
  const comm = new Int32Array(n + 1).fill(-1);
  const inArena = (id: number) => buffers[rootOf(buffers, id)].region === 'arena';
  for (let i = 0; i < n; i++) {
    const x = ins[i];
    compute[i + 1] = x.stream === 'compute' ? i : compute[i];
    const touches = x.inputs.some(inArena) || x.outputs.some(inArena);
    comm[i + 1] = (x.stream === 'comm' || x.stream === 'grad') && touches ? i : comm[i];
  }
  return { compute, comm };
}

/** A copy between a device buffer and a host buffer, on the copy stream. */
export function copyInstruction(
  op: 'offload' | 'reload',
  from: number,
  to: number,
  wait: readonly number[],
  record: number,
  where: Pick<PlanInstruction, 'microbatch' | 'phase' | 'scope'>,
): PlanInstruction {
  return {
    stream: 'copy',
    op,
    inputs: [from],
    outputs: [to],
    attrs: {},
    wait: [...new Set(wait)],
    record: [record],
    microbatch: where.microbatch,
    phase: where.phase,
    scope: where.scope,
  };
}
