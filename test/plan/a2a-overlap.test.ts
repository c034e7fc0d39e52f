// MoE all-to-all overlap (--overlap-moe-expert-parallel-comm, --delay-wgrad-compute) in emitted
// programs: steady-state steps pair the forward of one microbatch with the backward of another,
// layer by layer (reference/anchors.md), the expert all-to-alls on the comm stream. Every
// dispatch and combine on comm must have compute of the paired microbatch issued between its
// start and the compute instruction that waits for its result; a golden file prints one layer
// pair's order.
import { describe, expect, it } from 'vitest';
import { compile, type CompileOptions } from '../../compiler/pipeline.js';
import type { PlanInstruction, ProgramFile } from '../../compiler/plan/format.js';
import { expectGolden } from '../golden.js';

function build(o: Partial<CompileOptions>) {
  return compile({
    model: 'tiny-vlm-moe',
    seqLength: 64,
    microBatchSize: 1,
    globalBatchSize: 8,
    moeOverlap: { overlap: true, delayWgrad: true },
    ...o,
  } as CompileOptions);
}

interface Unit {
  /** its instructions: the counts exchange, counts, rows; or one all_to_all_v */
  readonly at: number[];
  /** the compute instruction that waits for it */
  readonly waitedAt: number;
}

/** every comm-stream unit of all-to-alls and the compute instruction that waits for its result */
function commUnits(p: ProgramFile): Unit[] {
  const list = p.instructions;
  const units: Unit[] = [];
  for (let i = 0; i < list.length; i++) {
    if (list[i].stream !== 'comm' || list[i].op !== 'all_to_all_v') continue;
    const at = [i];
    while (
      i + 1 < list.length &&
      list[i + 1].stream === 'comm' &&
      list[i + 1].op === 'moe_rank_counts'
    ) {
      at.push(i + 1, i + 2);
      i += 2;
    }
    const done = new Set(list[at[at.length - 1]].record);
    let w = at[at.length - 1] + 1;
    while (
      w < list.length &&
      !(list[w].stream === 'compute' && list[w].wait.some((e) => done.has(e)))
    )
      w++;
    units.push({ at, waitedAt: w });
  }
  return units;
}

const describeIns = (i: PlanInstruction) =>
  `${i.stream.padEnd(7)} ${i.phase === 'forward' ? 'F' : 'B'}${i.microbatch} ${i.op} ${i.scope}`;

describe.each([
  ['no pipeline, ep 2 (2 ranks)', { nprocPerNode: 2, parallel: { ep: 2 } }],
  ['pp 2 × vpp 2, ep 2 (4 ranks)', { nprocPerNode: 4, parallel: { pp: 2, vpp: 2, ep: 2 } }],
  [
    'full separation + tp 2, pp 2 × vpp 2, ep 2 (8 ranks)',
    {
      nprocPerNode: 8,
      parallel: { tp: 2, pp: 2, vpp: 2, ep: 2 },
      encoder: { fullHeteroDp: true },
    },
  ],
] as const)('%s', (_, o) => {
  const r = build(o as Partial<CompileOptions>);
  it.each(r.programs.map((p) => [p.id, p] as const))(
    '%s: every all-to-all on comm has compute of the paired microbatch before its wait',
    (_id, p) => {
      const units = commUnits(p);
      expect(units.length).toBeGreaterThan(0);
      for (const u of units) {
        const first = p.instructions[u.at[0]];
        expect(u.waitedAt).toBeLessThan(p.instructions.length);
        const between = p.instructions
          .slice(u.at[u.at.length - 1] + 1, u.waitedAt)
          .filter(
            (i) =>
              i.stream === 'compute' &&
              i.phase !== first.phase &&
              i.microbatch !== first.microbatch &&
              !i.scope.startsWith('visual'),
          );
        expect(
          between.length,
          `${p.id} instruction ${u.at[0]}: ${describeIns(first)} has no paired compute before its wait`,
        ).toBeGreaterThan(0);
      }
    },
  );
  it('outside combined steps the all-to-alls stay on compute (warm-up and cool-down)', () => {
    const a2a = r.programs.flatMap((p) => p.instructions.filter((i) => i.op === 'all_to_all_v'));
    expect(a2a.some((i) => i.stream === 'compute')).toBe(true);
  });
});

describe('one layer pair of a combined step (golden)', () => {
  it('pp 2 × vpp 2, ep 2: stage 0, its first combined step', () => {
    const r = build({ nprocPerNode: 4, parallel: { pp: 2, vpp: 2, ep: 2 } });
    const p = r.programs[0];
    const units = commUnits(p);
    // the step runs from the instruction after the batch before it to the batch after it
    const firstUnit = units[0].at[0];
    let start = firstUnit;
    while (
      start > 0 &&
      p.instructions[start - 1].op !== 'recv' &&
      p.instructions[start - 1].op !== 'send'
    )
      start--;
    let end = firstUnit;
    while (end < p.instructions.length && !['send', 'recv'].includes(p.instructions[end].op)) end++;
    const lines = p.instructions
      .slice(start, end)
      .filter((i) => i.scope.startsWith('model.layers.') || i.stream === 'comm')
      .map(describeIns);
    expectGolden('tiny-vlm-moe.a2a-overlap.step.txt', lines.join('\n') + '\n');
  });
});
