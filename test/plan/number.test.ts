// compiler/emit/number.ts: the numbering of a program's buffers and events depends only on where
// they appear, never on the order they were made in. Each emitted program, its ids shuffled by a
// random permutation (a consistent renaming), numbers back to the same program.
import { describe, expect, it } from 'vitest';
import { compile } from '../../compiler/pipeline.js';
import type { PlanBuffer, ProgramFile } from '../../compiler/plan/format.js';
import { numberProgram, type NumberedParts } from '../../compiler/emit/number.js';

/** the parts of a copy of p (numberProgram renumbers in place: each call gets its own) */
const partsOf = (original: ProgramFile): NumberedParts => {
  const p = structuredClone(original);
  return {
    buffers: p.buffers,
    instructions: p.instructions,
    params: p.params,
    inputs: p.inputs,
    scalars: p.scalars,
    outputs: p.outputs,
    optimizerShards: p.optimizerShards ?? [],
    keepUntilWait: new Map(),
    events: p.events,
  };
};

/** a deterministic permutation of 0..n-1 */
function shuffled(n: number, seed: number): Int32Array {
  const a = Int32Array.from({ length: n }, (_, i) => i);
  let s = seed;
  for (let i = n - 1; i > 0; i--) {
    s = (s * 1103515245 + 12345) % 2 ** 31;
    const j = s % (i + 1);
    [a[i], a[j]] = [a[j], a[i]];
  }
  return a;
}

/** the same program with buffer i renamed to perm[i] and event e to eperm[e] */
function renamed(p: NumberedParts, seed: number): NumberedParts {
  const perm = shuffled(p.buffers.length, seed);
  const eperm = shuffled(p.events, seed + 1);
  const b = (id: number) => perm[id];
  const e = (x: number) => eperm[x];
  const buffers = new Array<PlanBuffer>(p.buffers.length);
  for (const x of p.buffers)
    buffers[b(x.id)] = {
      ...x,
      id: b(x.id),
      ...(x.viewOf !== undefined ? { viewOf: b(x.viewOf) } : {}),
    };
  return {
    buffers,
    instructions: p.instructions.map((i) => ({
      ...i,
      inputs: i.inputs.map(b),
      outputs: i.outputs.map(b),
      wait: i.wait.map(e),
      record: i.record.map(e),
    })),
    params: p.params.map((q) => ({
      ...q,
      buffer: b(q.buffer),
      ...(q.grad !== undefined ? { grad: b(q.grad) } : {}),
      ...(q.expAvg !== undefined ? { expAvg: b(q.expAvg) } : {}),
      ...(q.expAvgSq !== undefined ? { expAvgSq: b(q.expAvgSq) } : {}),
    })),
    inputs: p.inputs.map((i) => ({ ...i, buffer: b(i.buffer) })),
    scalars: Object.fromEntries(Object.entries(p.scalars).map(([k, v]) => [k, b(v)])),
    outputs: p.outputs.map((o) => ({ ...o, buffer: b(o.buffer) })),
    optimizerShards: p.optimizerShards.map((s) => ({
      ...s,
      expAvg: b(s.expAvg),
      expAvgSq: b(s.expAvgSq),
    })),
    keepUntilWait: new Map([...p.keepUntilWait].map(([k, ids]) => [e(k), ids.map(b)])),
    events: p.events,
  };
}

const json = (p: NumberedParts) => JSON.stringify({ ...p, keepUntilWait: [...p.keepUntilWait] });

describe('numberProgram', () => {
  const cases: [string, Parameters<typeof compile>[0]][] = [
    ['one rank', { model: 'tiny-vlm-moe', globalBatchSize: 2 }],
    [
      'level 3, A2A overlap, pp 2 × vpp 2, ep 2, offload',
      {
        model: 'tiny-vlm-moe',
        nprocPerNode: 4,
        globalBatchSize: 8,
        parallel: { pp: 2, vpp: 2, ep: 2 },
        encoder: { fullHeteroDp: true, cpuOffload: true },
        moeOverlap: { overlap: true, delayWgrad: true },
        offloadTensors: ['dispatched_input'],
      },
    ],
    [
      'level 2, tp 2, distributed optimizer',
      {
        model: 'tiny-vlm-moe',
        nprocPerNode: 4,
        globalBatchSize: 4,
        parallel: { tp: 2 },
        encoder: { heteroDp: true },
        distributedOptimizer: true,
      },
    ],
  ];
  for (const [name, options] of cases)
    it(`${name}: any renaming of ids numbers back to one program`, () => {
      for (const program of compile(options).programs) {
        const canonical = json(numberProgram(partsOf(program)));
        for (const seed of [1, 2, 3])
          expect(json(numberProgram(renamed(partsOf(program), seed)))).toBe(canonical);
        // views stay after what they view
        for (const b of numberProgram(partsOf(program)).buffers)
          if (b.viewOf !== undefined) expect(b.viewOf).toBeLessThan(b.id);
      }
    });
});
