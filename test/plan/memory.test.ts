// Memory planning: the arena stays within 1.15× of the liveness lower bound on the tiny models,
// and the reuse checker proves no buffer is read after its bytes were reused — and catches a
// plan where that happens.
import { describe, expect, it } from 'vitest';
import { compile } from '../../compiler/pipeline.js';
import { checkMemoryReuse } from '../../compiler/plan/check-memory.js';
import {
  GREEDY_ALWAYS,
  GREEDY_LIMIT,
  livenessLowerBound,
  planArena,
  planBySize,
  planByTime,
  planLargestFirst,
  SPLIT_LARGEST,
  type ArenaPlan,
  type Lifetime,
} from '../../compiler/plan/memory.js';

describe.each(['tiny-vlm', 'tiny-vlm-moe'])('%s, 3 microbatches', (model) => {
  const { programs } = compile({ model, globalBatchSize: 3 });
  const p = programs[0];
  it('arena ≤ 1.15 × the liveness lower bound', () => {
    expect(p.regions.arena).toBeGreaterThanOrEqual(p.arenaLowerBoundBytes);
    expect(p.regions.arena / p.arenaLowerBoundBytes).toBeLessThanOrEqual(1.15);
  });
  it('no buffer is read after its space was reused', () => {
    expect(checkMemoryReuse(p)).toEqual([]);
  });
  it('the checker catches a clobbered read', () => {
    // move one buffer that is read later onto the bytes of another that is live at the same time
    const reads = new Map<number, number>();
    p.instructions.forEach((ins, i) => ins.inputs.forEach((b) => reads.set(b, i)));
    const arena = p.buffers.filter(
      (b) => b.region === 'arena' && b.viewOf === undefined && b.bytes > 0,
    );
    const victim = arena.find(
      (b) =>
        (reads.get(b.id) ?? -1) > p.instructions.findIndex((ins) => ins.outputs.includes(b.id)) + 2,
    )!;
    const defAt = p.instructions.findIndex((ins) => ins.outputs.includes(victim.id));
    const other = p.instructions[defAt + 1].outputs
      .map((id) => p.buffers[id])
      .find((b) => b.region === 'arena' && b.viewOf === undefined)!;
    const broken = {
      ...p,
      buffers: p.buffers.map((b) => (b.id === other.id ? { ...b, offset: victim.offset } : b)),
    };
    expect(checkMemoryReuse(broken).length).toBeGreaterThan(0);
  });
});

/** no two buffers whose lifetimes intersect share a byte */
function expectDisjoint(bufs: readonly Lifetime[], plan: ArenaPlan) {
  for (const a of bufs) {
    for (const b of bufs) {
      if (a.id >= b.id || a.end < b.start || b.end < a.start) continue;
      const [ao, bo] = [plan.offsets[a.id], plan.offsets[b.id]];
      expect(ao + a.bytes <= bo || bo + b.bytes <= ao).toBe(true);
    }
  }
  expect(plan.lowerBoundBytes).toBe(livenessLowerBound(bufs));
  expect(plan.sizeBytes).toBeGreaterThanOrEqual(plan.lowerBoundBytes);
}

/** n buffers of mixed sizes and lifetimes, deterministic */
const lifetimes = (n: number): Lifetime[] =>
  Array.from({ length: n }, (_, i) => ({
    id: i,
    bytes: 64 * (1 + ((i * 7) % 5)) * (i % 11 === 0 ? 64 : 1),
    start: i,
    end: i + 1 + (i % 3) + (i % 13 === 0 ? 40 : 0),
  }));

describe('planArena', () => {
  it('never overlaps buffers whose lifetimes intersect', () => {
    expectDisjoint(lifetimes(50), planArena(lifetimes(50)));
  });

  it('the largest buffers greedy by size, the rest above them: never overlaps', () => {
    const bufs = lifetimes(300);
    expectDisjoint(bufs, planLargestFirst(bufs, 40));
  });

  it('a mid-size program: best fit in issue order within 1% of the bound, else the smaller of it and greedy by size', () => {
    // pairs apart in time, a small buffer then a large one that starts as it ends: issue order
    // places the small one at 0 and meets the bound, and is taken (greedy by size would place the
    // large one at 0)
    const pairs: Lifetime[] = Array.from({ length: GREEDY_ALWAYS + 100 }, (_, i) => {
      const k = Math.floor(i / 2);
      return i % 2 === 0
        ? { id: i, bytes: 64, start: 3 * k, end: 3 * k + 1 }
        : { id: i, bytes: 640, start: 3 * k + 1, end: 3 * k + 2 };
    });
    const byTime = planByTime(pairs);
    expect(byTime.sizeBytes).toBe(byTime.lowerBoundBytes);
    expect(planBySize(pairs).offsets).not.toEqual(byTime.offsets);
    expect(planArena(pairs).offsets).toEqual(byTime.offsets);
    // mixed lifetimes, where issue order ends over 1% above the bound
    const bufs = lifetimes(GREEDY_ALWAYS + 500);
    const time = planByTime(bufs).sizeBytes;
    const size = planBySize(bufs).sizeBytes;
    expect(time).toBeGreaterThan(1.01 * livenessLowerBound(bufs));
    const plan = planArena(bufs);
    expect(plan.sizeBytes).toBe(Math.min(time, size));
    expectDisjoint(bufs, plan);
  });

  it('a large program takes the smaller of best fit in issue order and largest-first', () => {
    const bufs = lifetimes(GREEDY_LIMIT + 500);
    const byTime = planByTime(bufs).sizeBytes;
    const split = planLargestFirst(bufs, SPLIT_LARGEST).sizeBytes;
    // on these lifetimes issue order ends >1% above the bound and largest-first does better
    expect(byTime).toBeGreaterThan(1.01 * livenessLowerBound(bufs));
    expect(split).toBeLessThan(byTime);
    const plan = planArena(bufs);
    expect(plan.sizeBytes).toBe(split);
    expect(plan.sizeBytes).toBeGreaterThanOrEqual(plan.lowerBoundBytes);
  });
});
