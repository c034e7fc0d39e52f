// One program's device bytes over its step (model.ts VizMemory), from the memory plan: the
// regions that hold for the whole step (parameters, gradients, optimizer state, the batch, the
// streams' scratch) and the activations live at each instruction, from the arena buffers'
// lifetimes, at the bounds of every size and at their expected sizes (the data profile's means).
//
// The lifetimes are the planner's (compiler/emit/memory-plan.ts lifetimesOf) less one detail the
// program file does not keep: a comm unit's bytes held until an instruction waits for its event.
// So the curve can sit a little under the planned arena, never over it.

import { bytesAtExpectedSizes, lifetimesOf } from '../../compiler/emit/memory-plan.js';
import { liveBytes } from '../../compiler/plan/memory.js';
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
  const expectedOf = bytesAtExpectedSizes(plan.symbols);
  const bound = perInstruction(liveBytes(arena), n);
  const expected = perInstruction(
    liveBytes(arena, (l) => expectedOf(buffers[l.id])),
    n,
  );
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

/** live bytes over all `n` instructions (none live after the last buffer's end) */
function perInstruction(live: Float64Array, n: number): Float64Array {
  const out = new Float64Array(n);
  out.set(live.subarray(0, n));
  return out;
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
