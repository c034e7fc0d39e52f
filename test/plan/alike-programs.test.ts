// Level 3's TP ranks are made by relabeling their stage's template program (TP rank 0's, stage
// 0's TP rank 1's: compiler/emit/alike-programs.ts): each such program must be, byte for byte, what emitting it
// through every pass gives. Every level-3 layout of the equivalence matrix, and the article's
// level-3 line of issue 17 (bench/compile's 30b-level3), compiled both ways.
import { describe, expect, it } from 'vitest';
import { parseCompileArgs } from '../../cli/compile.js';
import { siblingSlots } from '../../compiler/emit/alike-programs.js';
import { encoderPlacement } from '../../compiler/parallel/encoder.js';
import { compile } from '../../compiler/pipeline.js';
import { BATCH, LAYOUTS } from '../layouts.js';

const level3 = LAYOUTS.filter((l) => l.flags.includes('--enable-full-hetero-dp')).map((l) => ({
  name: l.name,
  argv: [l.model, '--nproc-per-node', String(l.ranks), ...BATCH, ...l.flags],
}));

function bothWays(argv: readonly string[]) {
  const { options } = parseCompileArgs(argv);
  const derived = compile({ ...options, skipVerify: false });
  const emitted = compile({ ...options, skipVerify: true, emitEveryProgram: true });
  return { derived, emitted };
}

describe('level-3 programs made by relabeling a sibling', () => {
  it('the matrix has level-3 layouts on more than one stage to check', () => {
    expect(level3.length).toBeGreaterThanOrEqual(6);
  });

  for (const { name, argv } of level3)
    it(`${name}: every program is the one emission gives`, () => {
      const { derived, emitted } = bothWays(argv);
      expect(derived.programs.map((p) => p.id)).toEqual(emitted.programs.map((p) => p.id));
      for (let i = 0; i < emitted.programs.length; i++)
        expect(JSON.stringify(derived.programs[i]), derived.programs[i].id).toBe(
          JSON.stringify(emitted.programs[i]),
        );
      expect(JSON.stringify(derived.plan)).toBe(JSON.stringify(emitted.plan));
    });

  it("the article's level-3 line (qwen3-vl-30b-a3b on 32 ranks, tp 4, pp 2): p0.t2–t3 and p1.t1–t3 relabeled, each as emitted", () => {
    const { derived, emitted } = bothWays([
      'qwen3-vl-30b-a3b',
      ...['--nnodes', '4', '--nproc-per-node', '8', '--tp', '4', '--pp', '2', '--ep', '4'],
      ...['--seq-length', '32768', '--micro-batch-size', '1', '--global-batch-size', '64'],
      ...[
        '--use-distributed-optimizer',
        '--bf16',
        '--hardware',
        'a800',
        '--data-profile',
        'article',
      ],
      'model.image_encoder.tensor_model_parallel_size=1',
      '--enable-full-hetero-dp',
    ]);
    expect(derived.programs.map((p) => p.id)).toEqual([
      'p0.t0',
      'p0.t1',
      'p0.t2',
      'p0.t3',
      'p1.t0',
      'p1.t1',
      'p1.t2',
      'p1.t3',
    ]);
    for (let i = 0; i < emitted.programs.length; i++)
      expect(JSON.stringify(derived.programs[i]), derived.programs[i].id).toBe(
        JSON.stringify(emitted.programs[i]),
      );
    // and p0.t2–t3, p1.t1–t3 were relabeled, not emitted: they hold their template's decoder
    // instructions themselves
    const relabeled = (template: number, siblings: number[]) => {
      const t = derived.programs[template];
      const last = t.instructions.length - 1;
      for (const k of siblings)
        expect(derived.programs[k].instructions[last], derived.programs[k].id).toBe(
          t.instructions[last],
        );
      expect(emitted.programs[siblings[0]].instructions[last]).not.toBe(
        emitted.programs[template].instructions[last],
      );
    };
    relabeled(1, [2, 3]);
    relabeled(4, [5, 6, 7]);
    // p0.t0, the root, is emitted
    const root = derived.programs[0];
    expect(root.instructions.at(-1)).not.toBe(derived.programs[1].instructions.at(-1));
  }, 120_000);

  it("each stage's template, the root, and rounds that encode on both ranks or on neither", () => {
    const p = encoderPlacement({ tp: 2, pp: 2, encoderTp: 1, fullHeteroDp: true, microbatches: 4 });
    expect(siblingSlots(p, 0, 0, 4)).toBeUndefined(); // the root gathers and broadcasts
    expect(siblingSlots(p, 0, 1, 4)).toBeUndefined(); // stage 0's template
    expect(siblingSlots(p, 1, 0, 4)).toBeUndefined(); // stage 1's template
    // rounds of M = 4 slots: stage 1's TP ranks encode slots 2 and 3
    expect([...siblingSlots(p, 1, 1, 4)!]).toEqual([[2, 3]]);
    // 6 microbatches in 8 slots: round 1 gives TP rank 0 slot 6 and TP rank 1 slot 7, both mock
    const q = encoderPlacement({ tp: 2, pp: 2, encoderTp: 1, fullHeteroDp: true, microbatches: 6 });
    expect([...siblingSlots(q, 1, 1, 6)!]).toEqual([[2, 3]]);
    // 7 microbatches: round 1 encodes slot 6 on TP rank 0 and mock slot 7 on TP rank 1
    const r = encoderPlacement({ tp: 2, pp: 2, encoderTp: 1, fullHeteroDp: true, microbatches: 7 });
    expect(siblingSlots(r, 1, 1, 7)).toBeUndefined();
    // tp 4 on one stage: TP ranks 2 and 3 are TP rank 1's, slot by slot of each round
    const s = encoderPlacement({ tp: 4, pp: 1, encoderTp: 1, fullHeteroDp: true, microbatches: 8 });
    expect([...siblingSlots(s, 0, 2, 8)!]).toEqual([
      [1, 2],
      [5, 6],
    ]);
    expect([...siblingSlots(s, 0, 3, 8)!]).toEqual([
      [1, 3],
      [5, 7],
    ]);
  });
});
