// One program's device bytes over its step (model.ts VizMemory), from the memory plan: the
// regions that hold for the whole step (parameters, gradients, optimizer state, the batch, the
// streams' scratch) and the activations live at each instruction, from the arena buffers'
// lifetimes, at the bounds of every size and at their expected sizes (the data profile's means).
//
// The lifetimes are the planner's (compiler/emit/memory-plan.ts lifetimesOf) less one detail the
// program file does not keep: a comm unit's bytes held until an instruction waits for its event.
// So the curve can sit a little under the planned arena, never over it.

import { DTYPE_BYTES, type DType } from '../../ir/dtype.js';
import { numel, parseDim } from '../../ir/shape.js';
import { lifetimesOf } from '../../compiler/emit/memory-plan.js';
import { align, type Lifetime } from '../../compiler/plan/memory.js';
import type { PlanFile, ProgramFile } from '../../compiler/plan/format.js';
import type { DeviceMemory } from '../../compiler/report/memory.js';
import type { VizMemory } from '../model.js';

/** at most this many points per curve: the browser draws them as one path */
const MAX_POINTS = 2000;

/**
 * `ms`: the program's instructions' start times on a timeline (simulated or measured), if there is
 * one, so the curve can share the timeline's axis.
 */
export function programMemory(
  plan: PlanFile,
  program: ProgramFile,
  device: DeviceMemory,
  ms?: Float64Array,
): VizMemory {
  const { buffers, instructions, regions } = program;
  const n = instructions.length;
  const arena = lifetimesOf(instructions, buffers, new Map()).arena;
  const expectedOf = expectedBytes(plan);
  const bound = liveBytes(arena, n, (l) => l.bytes);
  const expected = liveBytes(arena, n, (l) => expectedOf(buffers[l.id]));
  // a GPU runtime's workspaces are in the device's reserve, not the plan's scratch
  const scratch = device.runtime === 'gpu' ? 0 : regions.scratch;
  const fixed = regions.param + regions.grad + regions.optim + regions.scalar + scratch;
  const dataExpected = program.expectedBytes?.data ?? regions.data;
  let peakAt = 0;
  for (let i = 1; i < n; i++) if (bound[i] > bound[peakAt]) peakAt = i;
  let expectedPeak = 0;
  for (let i = 0; i < n; i++) expectedPeak = Math.max(expectedPeak, expected[i]);
  const picks = sample(bound, expected);
  return {
    program: program.id,
    staticBytes: fixed + regions.data,
    points: {
      instruction: picks,
      ms: ms ? picks.map((i) => ms[i]) : null,
      boundBytes: picks.map((i) => bound[i]),
      // the expected batch is smaller than the bound's: the curve carries the difference
      expectedBytes: picks.map((i) => expected[i] - (regions.data - dataExpected)),
    },
    peak: {
      boundBytes: fixed + regions.data + (n ? bound[peakAt] : 0),
      expectedBytes: fixed + dataExpected + expectedPeak,
      instruction: peakAt,
    },
    limitBytes: device.bytes - device.reserveBytes,
  };
}

/** a buffer's bytes with every symbol at its expected size (its bound where none is given) */
function expectedBytes(plan: PlanFile): (b: ProgramFile['buffers'][number]) => number {
  const size = new Map(plan.symbols.map((s) => [s.name, s.expected ?? s.bound]));
  const sizeOf = (name: string) => size.get(name) ?? 0;
  return (b) =>
    b.shape.some((x) => /[A-Za-z]/.test(x))
      ? numel(b.shape.map(parseDim), sizeOf) * DTYPE_BYTES[b.dtype as DType]
      : b.bytes;
}

/** [instruction] the aligned bytes of the buffers live at it */
function liveBytes(
  lifetimes: readonly Lifetime[],
  n: number,
  bytes: (l: Lifetime) => number,
): Float64Array {
  const delta = new Float64Array(n + 1);
  for (const l of lifetimes) {
    const b = align(Math.max(bytes(l), 1));
    delta[Math.min(l.start, n)] += b;
    delta[Math.min(l.end + 1, n)] -= b;
  }
  const live = new Float64Array(n);
  let sum = 0;
  for (let i = 0; i < n; i++) live[i] = sum += delta[i];
  return live;
}

/**
 * At most MAX_POINTS instructions, spread over the step, that keep each bucket's highest and
 * lowest point of both curves (a peak never falls between two samples), in order.
 */
function sample(a: Float64Array, b: Float64Array): number[] {
  const n = a.length;
  if (n <= MAX_POINTS) return Array.from({ length: n }, (_, i) => i);
  const buckets = Math.floor(MAX_POINTS / 4);
  const out = new Set<number>([0, n - 1]);
  for (let k = 0; k < buckets; k++) {
    const lo = Math.floor((k * n) / buckets);
    const hi = Math.floor(((k + 1) * n) / buckets);
    let [amax, amin, bmax, bmin] = [lo, lo, lo, lo];
    for (let i = lo; i < hi; i++) {
      if (a[i] > a[amax]) amax = i;
      if (a[i] < a[amin]) amin = i;
      if (b[i] > b[bmax]) bmax = i;
      if (b[i] < b[bmin]) bmin = i;
    }
    for (const i of [amax, amin, bmax, bmin]) out.add(i);
  }
  return [...out].sort((x, y) => x - y);
}
