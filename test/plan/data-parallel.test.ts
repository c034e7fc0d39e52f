// Data parallelism: one program shared by every replica; each gradient summed exactly once over
// the dp group, in buckets on the comm stream that wait for the compute instruction that last
// wrote their gradients; the optimizer step waits for the last bucket.
import { describe, expect, it } from 'vitest';
import { compile } from '../../compiler/pipeline.js';
import { updatedInputs, type OpKind } from '../../ir/ops.js';

describe('data parallel plan, tiny-vlm-moe on 4 ranks', () => {
  const { plan, programs } = compile({
    model: 'tiny-vlm-moe',
    nprocPerNode: 4,
    globalBatchSize: 8,
  });
  const p = programs[0];
  it('shares one program, two microbatches per replica', () => {
    expect(new Set(plan.rankPrograms)).toEqual(new Set(['p0']));
    expect(plan.training.numMicrobatches).toBe(2);
    expect(plan.dataParallel.rankIndex).toEqual([0, 1, 2, 3]);
    const dpGroups = plan.rankGroups.dp.map((g) => plan.groups[g].ranks);
    for (const ranks of dpGroups) expect(ranks).toEqual([0, 1, 2, 3]);
  });
  it('sums every gradient byte exactly once', () => {
    const syncs = p.instructions.filter((i) => i.scope === 'gradient_sync');
    expect(syncs.length).toBeGreaterThan(1);
    const covered = new Map<number, number>();
    for (const s of syncs) {
      expect(s.stream).toBe('grad');
      expect(s.attrs).toEqual({ group: 'dp', group_size: 4 });
      const b = p.buffers[s.inputs[0]];
      expect(b.region).toBe('grad');
      for (let at = b.offset; at < b.offset + b.bytes; at += 4)
        covered.set(at, (covered.get(at) ?? 0) + 1);
    }
    for (const q of p.params.filter((x) => x.grad !== undefined)) {
      const g = p.buffers[q.grad!];
      for (let at = g.offset; at < g.offset + g.bytes; at += 4) expect(covered.get(at)).toBe(1);
    }
  });
  it('orders each bucket after the last write of its gradients, and the optimizer after the last bucket', () => {
    const recordedBy = new Map<number, number>();
    p.instructions.forEach((ins, i) => ins.record.forEach((e) => recordedBy.set(e, i)));
    const syncs = p.instructions
      .map((ins, i) => [ins, i] as const)
      .filter(([ins]) => ins.scope === 'gradient_sync');
    for (const [s] of syncs) {
      const b = p.buffers[s.inputs[0]];
      const lastWrite = Math.max(
        ...p.instructions
          .map((ins, i) => [ins, i] as const)
          .filter(
            ([ins]) =>
              ins.phase === 'backward' &&
              updatedInputs(ins.op as OpKind, ins.inputs.length).some(
                (k) =>
                  p.buffers[ins.inputs[k]].offset >= b.offset &&
                  p.buffers[ins.inputs[k]].offset < b.offset + b.bytes,
              ),
          )
          .map(([, i]) => i),
      );
      expect(s.wait).toHaveLength(1);
      expect(recordedBy.get(s.wait[0])).toBe(lastWrite);
    }
    const firstOpt = p.instructions.findIndex((ins) => ins.phase === 'optimizer');
    expect(p.instructions[firstOpt].wait).toHaveLength(1);
    expect(recordedBy.get(p.instructions[firstOpt].wait[0])).toBe(syncs[syncs.length - 1][1]);
  });
  it('weighs each replica a quarter in the gradient norm, summed over the world', () => {
    const at = p.instructions.findIndex((ins) => ins.op === 'sum_squares');
    const scales = p.instructions[at].attrs.scales as number[];
    expect(scales).toHaveLength(p.instructions[at].inputs.length);
    for (const s of scales) expect(s).toBe(0.25);
    const sum = p.instructions[at + 1];
    expect([sum.op, sum.attrs]).toEqual(['all_reduce', { group: 'world', group_size: 4 }]);
    expect(sum.inputs).toEqual(p.instructions[at].outputs);
  });
});
