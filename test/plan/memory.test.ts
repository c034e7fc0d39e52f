// Memory planning: the arena stays within 1.15× of the liveness lower bound on the tiny models,
// and the reuse checker proves no buffer is read after its bytes were reused — and catches a
// plan where that happens.
import { describe, expect, it } from 'vitest';
import { compile } from '../../compiler/pipeline.js';
import { checkMemoryReuse } from '../../compiler/plan/check-memory.js';
import { livenessLowerBound, planArena } from '../../compiler/plan/memory.js';

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

describe('planArena', () => {
  it('never overlaps buffers whose lifetimes intersect', () => {
    const bufs = Array.from({ length: 50 }, (_, i) => ({
      id: i,
      bytes: 64 * (1 + ((i * 7) % 5)),
      start: i,
      end: i + 1 + (i % 3),
    }));
    const plan = planArena(bufs);
    for (const a of bufs) {
      for (const b of bufs) {
        if (a.id >= b.id || a.end < b.start || b.end < a.start) continue;
        const [ao, bo] = [plan.offsets[a.id], plan.offsets[b.id]];
        expect(ao + a.bytes <= bo || bo + b.bytes <= ao).toBe(true);
      }
    }
    expect(plan.lowerBoundBytes).toBe(livenessLowerBound(bufs));
    expect(plan.sizeBytes).toBeGreaterThanOrEqual(plan.lowerBoundBytes);
  });
});
