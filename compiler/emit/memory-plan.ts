// Emission pass 10, memory-plan: the arena, and the host region of offloaded activations, placed
// from the buffers' lifetimes (compiler/plan/memory.ts); the scratch region, each stream's slice
// the most scratch one of its instructions takes in the CPU runtime (compiler/plan/scratch.ts).
//
// Holds before: every instruction is in its final place; arena and host buffers have offset 0.
// Holds after: every arena and host buffer has its offset (a view its base's), no two buffers
//   whose lifetimes overlap share bytes, and regions.arena / regions.host are the sizes; the
//   arena's liveness lower bound is recorded for the report; scratchBytes holds each stream's
//   scratch at the bounds and regions.scratch their sum.

import { DTYPE_BYTES, type DType } from '../../ir/dtype.js';
import type { Graph } from '../../ir/graph.js';
import { shapeResolver } from '../../ir/shape.js';
import { batchSpans, type PlanBuffer, type PlanInstruction } from '../plan/format.js';
import { livenessLowerBound, planArena, type Lifetime } from '../plan/memory.js';
import { AlikeMemo } from '../plan/alike.js';
import { scratchByStream } from '../plan/scratch.js';
import { rootOf, type MutableBuffer } from './rewrite.js';
import type { ProgramDraft } from './draft.js';

export function planMemory(d: ProgramDraft, g: Graph): ProgramDraft {
  const lifetimes = lifetimesOf(d.instructions, d.buffers, d.keepUntilWait);
  // offsets set in place (draft.ts: drafts are linear; a copy of every buffer is slower)
  const buffers = d.buffers as MutableBuffer[];
  const regions = { ...d.regions };
  let lowerBound = 0;
  for (const region of ['arena', 'host'] as const) {
    const plan = planArena(lifetimes[region]);
    for (let k = 0; k < buffers.length; k++) {
      const b = buffers[k];
      if (b.region === region) b.offset = plan.offsets[b.viewOf ?? b.id];
    }
    regions[region] = plan.sizeBytes;
    if (region === 'arena') lowerBound = plan.lowerBoundBytes;
  }
  const { sizeOf, memo } = scratchSizing(g);
  const scratchBytes = scratchByStream(d.instructions, buffers, sizeOf, memo);
  regions.scratch = scratchBytes.compute + scratchBytes.comm + scratchBytes.copy;
  const expectedBytes = atExpectedSizes(g, buffers, lifetimes.arena);
  return {
    ...d,
    buffers,
    regions,
    scratchBytes,
    arenaLowerBoundBytes: lowerBound,
    ...(expectedBytes ? { expectedBytes } : {}),
  };
}

/** the bounds scratch is sized at, and what every program of the graph has worked out at them */
const scratchSizings = new WeakMap<
  Graph['symbols'],
  { sizeOf: (sym: string) => number; memo: AlikeMemo<number> }
>();
function scratchSizing(g: Graph) {
  let x = scratchSizings.get(g.symbols);
  if (!x) {
    const bound = new Map(g.symbols.map((s) => [s.name, s.bound]));
    x = { sizeOf: (s) => bound.get(s) ?? 0, memo: new AlikeMemo() };
    scratchSizings.set(g.symbols, x);
  }
  return x;
}

/**
 * The arena's most bytes live at once and the data region's bytes, with every symbol at its
 * expected size; undefined when no symbol has one that differs from its bound (the figures would
 * be the planned ones).
 */
function atExpectedSizes(
  g: Graph,
  buffers: readonly PlanBuffer[],
  arena: readonly Lifetime[],
): { arena: number; data: number } | undefined {
  if (!g.symbols.some((s) => s.expected !== undefined)) return undefined;
  const bytes = bytesAtExpectedSizes(g.symbols);
  let data = 0;
  for (let k = 0; k < buffers.length; k++)
    if (buffers[k].region === 'data' && buffers[k].viewOf === undefined) data += bytes(buffers[k]);
  return { arena: livenessLowerBound(arena, (l) => bytes(buffers[l.id])), data };
}

/** A buffer's bytes with every symbol at its expected size (its bound where none is given). */
export function bytesAtExpectedSizes(
  symbols: readonly { readonly name: string; readonly bound: number; readonly expected?: number }[],
): (b: PlanBuffer) => number {
  const size = new Map(symbols.map((s) => [s.name, s.expected ?? s.bound]));
  const resolve = shapeResolver((name: string) => size.get(name) ?? 0);
  // whether a shape names a symbol, once per shape array (buffers of one value share theirs)
  const symbolic = new Map<readonly string[], boolean>();
  return (b) => {
    let named = symbolic.get(b.shape);
    if (named === undefined)
      symbolic.set(b.shape, (named = b.shape.some((x) => /[A-Za-z]/.test(x))));
    if (!named) return b.bytes;
    let n = 1;
    const dims = resolve(b.shape);
    for (let k = 0; k < dims.length; k++) n *= dims[k];
    return n * DTYPE_BYTES[b.dtype as DType];
  };
}

/**
 * The lifetimes of the planned regions' buffers (views count for the buffer they view), in issue
 * order: a batched send/recv runs from its batch's first instruction to its last, so what it sends
 * stays live to the end and what it receives is written from the start; a comm unit's bytes stay
 * allocated until an instruction waits for its event (`keepUntilWait`).
 */
export function lifetimesOf(
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
    for (let k = 0; k < ins.inputs.length; k++) {
      const r = root(ins.inputs[k]);
      if (lastUse[r] < last) lastUse[r] = last;
    }
    for (const e of ins.wait)
      for (const id of keepUntilWait.get(e) ?? []) {
        const r = root(id);
        if (lastUse[r] < idx) lastUse[r] = idx;
      }
    for (let k = 0; k < ins.outputs.length; k++) {
      const r = root(ins.outputs[k]);
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
