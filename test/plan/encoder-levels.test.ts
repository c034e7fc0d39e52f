// The encoder levels in emitted plans (issue: parallel compilation part 2, item 1): tiny-vlm-moe on
// 8 ranks, each level checked against DESIGN.md's table by reading the programs: which rank
// encodes which microbatch, every inserted broadcast / gather_v / scatter_v (count, kind, group,
// root), that ranks outside the encoder's placement hold no encoder instruction, where the encoder
// and projector backward run, and which ranks each encoder gradient is summed over.
import { describe, expect, it } from 'vitest';
import { compile, type CompileOptions } from '../../compiler/pipeline.js';
import type { PlanInstruction, ProgramFile } from '../../compiler/plan/format.js';

const isEncoder = (i: PlanInstruction) => i.scope === 'visual' || i.scope.startsWith('visual.');
const HANDOFF = new Set(['broadcast', 'gather_v', 'scatter_v']);

interface Layout {
  readonly tp: number;
  readonly pp: number;
  readonly dp: number;
  readonly m: number;
}

function build(o: Partial<CompileOptions> & { parallel: CompileOptions['parallel'] }) {
  const r = compile({
    model: 'tiny-vlm-moe',
    nprocPerNode: 8,
    seqLength: 64,
    microBatchSize: 1,
    ...o,
  } as CompileOptions);
  const byId = new Map(r.programs.map((p) => [p.id, p]));
  const { tp, pp, dp } = r.plan.topology.sizes;
  const layout: Layout = { tp, pp, dp, m: r.plan.training.numMicrobatches };
  /** the program of the rank at (tp index, stage), dp replica 0 */
  const programAt = (t: number, s: number): ProgramFile =>
    byId.get(r.plan.rankPrograms[t + tp * dp * s])!;
  return { ...r, layout, programAt };
}

/** microbatches whose encoder forward runs in a program */
const encodes = (p: ProgramFile) => [
  ...new Set(
    p.instructions.filter((i) => isEncoder(i) && i.phase === 'forward').map((i) => i.microbatch),
  ),
];
/** the index of the last instruction that satisfies f, -1 if none */
function lastIndex(list: readonly PlanInstruction[], f: (i: PlanInstruction) => boolean): number {
  for (let k = list.length - 1; k >= 0; k--) if (f(list[k])) return k;
  return -1;
}
const handoffs = (p: ProgramFile) => p.instructions.filter((i) => HANDOFF.has(i.op));

/** the group kinds the encoder's gradients are summed over: sums whose bucket spans them */
function encoderGradGroups(p: ProgramFile): string[] {
  const encoderGrads = p.params
    .filter((q) => q.name.startsWith('visual.') && q.grad !== undefined)
    .map((q) => p.buffers[q.grad!]);
  const groups = new Set<string>();
  for (const ins of p.instructions) {
    if (ins.phase === 'optimizer' || !['all_reduce', 'reduce_scatter'].includes(ins.op)) continue;
    if (ins.stream !== 'grad') continue;
    const b = p.buffers[ins.inputs[0]];
    if (b.region !== 'grad') continue;
    const spans = (g: (typeof encoderGrads)[number]) =>
      g.offset >= b.offset && g.offset + g.bytes <= b.offset + b.bytes;
    if (encoderGrads.some(spans)) groups.add(String(ins.attrs.group));
  }
  return [...groups].sort();
}

describe('level 0: the encoder shares the decoder TP (tp 2, encoder tp 2, pp 2)', () => {
  const r = build({
    parallel: { tp: 2, pp: 2 },
    globalBatchSize: 4,
    overrides: ['model.image_encoder.tensor_model_parallel_size=2'],
  });
  it('stage 0 encodes every microbatch on every TP rank; stage 1 holds no encoder instruction', () => {
    for (let t = 0; t < 2; t++) expect(encodes(r.programAt(t, 0))).toEqual([0, 1]);
    expect(r.programAt(0, 1).instructions.filter(isEncoder)).toEqual([]);
  });
  it('inserts no handoff; encoder gradients sum over dp', () => {
    expect(handoffs(r.programAt(0, 0))).toEqual([]);
    expect(encoderGradGroups(r.programAt(0, 0))).toEqual(['dp']);
  });
});

describe('level 1, hetero TP: encoder tp 1 under decoder tp 2 (pp 2)', () => {
  const r = build({ parallel: { tp: 2, pp: 2 }, globalBatchSize: 4 });
  it('every stage-0 TP rank encodes every microbatch (replicas of the same data), unsplit', () => {
    for (let t = 0; t < 2; t++) expect(encodes(r.programAt(t, 0))).toEqual([0, 1]);
    const enc = r.programAt(0, 0).instructions.filter(isEncoder);
    expect(enc.filter((i) => i.attrs.group !== undefined)).toEqual([]);
    expect(r.programAt(1, 1).instructions.filter(isEncoder)).toEqual([]);
  });
  it('no embedding movement; encoder gradients sum over dp only (not over the TP replicas)', () => {
    expect(handoffs(r.programAt(0, 0))).toEqual([]);
    expect(encoderGradGroups(r.programAt(1, 0))).toEqual(['dp']);
    expect(r.plan.rankPrograms[0]).toBe(r.plan.rankPrograms[1]); // one program per stage
  });
});

describe('level 2, hetero DP: tp 4, dp 2, 3 microbatches (one mock slot)', () => {
  const r = build({
    parallel: { tp: 4 },
    globalBatchSize: 6,
    encoder: { heteroDp: true },
  });
  const { m } = r.layout;
  it('microbatch g·tp + i is encoded by TP rank i alone; the mock slot encodes nothing', () => {
    expect(m).toBe(3);
    expect([0, 1, 2, 3].map((t) => encodes(r.programAt(t, 0)))).toEqual([[0], [1], [2], []]);
  });
  it("one broadcast per microbatch over tp, rooted at its owner, before the decoder's first use", () => {
    for (let t = 0; t < 4; t++) {
      const p = r.programAt(t, 0);
      const b = handoffs(p);
      expect(b.map((i) => [i.op, i.attrs.group, i.attrs.root, i.microbatch])).toEqual(
        [0, 1, 2].map((k) => ['broadcast', 'tp', k % 4, k]),
      );
      // the decoder's merge of microbatch k reads the broadcast's buffer, after it
      for (const bc of b) {
        const merge = p.instructions.findIndex(
          (i) => i.op === 'merge_visual' && i.microbatch === bc.microbatch,
        );
        expect(p.instructions.indexOf(bc)).toBeLessThan(merge);
        expect(p.instructions[merge].inputs).toContain(bc.outputs[0]);
      }
    }
  });
  it("the owner's encoder backward runs after the decoder backward of the group's last microbatch", () => {
    for (let t = 0; t < 3; t++) {
      const p = r.programAt(t, 0);
      const firstEncoderBackward = p.instructions.findIndex(
        (i) => isEncoder(i) && i.phase === 'backward',
      );
      const lastDecoderBackward = lastIndex(
        p.instructions,
        (i) => !isEncoder(i) && i.phase === 'backward' && i.microbatch === m - 1,
      );
      expect(firstEncoderBackward).toBeGreaterThan(lastDecoderBackward);
      const mbs = new Set(
        p.instructions
          .filter((i) => isEncoder(i) && i.phase === 'backward')
          .map((i) => i.microbatch),
      );
      expect([...mbs]).toEqual([t]);
    }
  });
  it('encoder gradients sum over every rank of stage 0 (tp·dp = 8); other stages hold none', () => {
    expect(encoderGradGroups(r.programAt(3, 0))).toEqual(['tp_dp_cp']);
    // the mock-only rank holds the encoder too: it takes part in the sum
    expect(r.programAt(3, 0).params.some((p) => p.name.startsWith('visual.'))).toBe(true);
  });
});

describe('level 3, full separation: tp 2, pp 2, dp 2, 6 microbatches (M = 4, two mock slots)', () => {
  const r = build({
    parallel: { tp: 2, pp: 2 },
    globalBatchSize: 12,
    encoder: { fullHeteroDp: true },
  });
  const { m } = r.layout;
  const M = 4;
  it('in round r, model-parallel rank (pp, tp) encodes microbatch r·M + pp·tp_size + tp', () => {
    expect(m).toBe(6);
    const got = [0, 1].flatMap((s) => [0, 1].map((t) => encodes(r.programAt(t, s))));
    expect(got).toEqual([
      [0, 4],
      [1, 5],
      [2], // slot 6 is a mock
      [3], // slot 7 is a mock
    ]);
  });
  it('phase 1: one gather_v per round to model-parallel rank 0 over mp; phase 3: one scatter_v back', () => {
    for (let s = 0; s < 2; s++)
      for (let t = 0; t < 2; t++) {
        const p = r.programAt(t, s);
        const gathers = p.instructions.filter((i) => i.op === 'gather_v');
        const scatters = p.instructions.filter((i) => i.op === 'scatter_v');
        expect(gathers.map((i) => [i.attrs.group, i.attrs.group_size, i.attrs.root])).toEqual([
          ['mp', M, 0],
          ['mp', M, 0],
        ]);
        expect(scatters.map((i) => [i.attrs.group, i.attrs.root])).toEqual([
          ['mp', 0],
          ['mp', 0],
        ]);
        // the root receives one block per member (mock blocks have no rows)
        const root = s === 0 && t === 0;
        expect(gathers[0].outputs).toHaveLength(root ? M : 1);
        expect(scatters[1].inputs).toHaveLength(root ? M : 1);
        // phase 1 before any decoder instruction, phase 3 after every decoder backward
        const firstDecoder = p.instructions.findIndex((i) => !isEncoder(i) && !HANDOFF.has(i.op));
        expect(p.instructions.indexOf(gathers[1])).toBeLessThan(firstDecoder);
        const lastDecoderBackward = lastIndex(
          p.instructions,
          (i) =>
            !isEncoder(i) && i.stream === 'compute' && i.phase === 'backward' && !HANDOFF.has(i.op),
        );
        expect(p.instructions.indexOf(scatters[0])).toBeGreaterThan(lastDecoderBackward);
      }
  });
  it('stage 0 broadcasts each microbatch from TP rank 0; stage 1 broadcasts nothing', () => {
    for (let t = 0; t < 2; t++) {
      const b = r.programAt(t, 0).instructions.filter((i) => i.op === 'broadcast');
      expect(b.map((i) => [i.attrs.group, i.attrs.root, i.microbatch])).toEqual(
        Array.from({ length: m }, (_, k) => ['tp', 0, k]),
      );
      expect(r.programAt(t, 1).instructions.filter((i) => i.op === 'broadcast')).toEqual([]);
    }
  });
  it('each owner runs its encoder backward after the scatter; gradients sum over every rank', () => {
    for (let s = 0; s < 2; s++)
      for (let t = 0; t < 2; t++) {
        const p = r.programAt(t, s);
        const back = new Set(
          p.instructions
            .filter((i) => isEncoder(i) && i.phase === 'backward')
            .map((i) => i.microbatch),
        );
        expect([...back]).toEqual(encodes(p));
        expect(encoderGradGroups(p)).toEqual(['world']);
      }
  });
  it('with the encoder frozen, phase 3 runs only the projector backward', () => {
    const f = build({
      parallel: { tp: 2, pp: 2 },
      globalBatchSize: 12,
      encoder: { fullHeteroDp: true },
      overrides: ['model.image_encoder.freeze=true'],
    });
    const back = f
      .programAt(1, 1)
      .instructions.filter((i) => isEncoder(i) && i.phase === 'backward');
    expect(back.length).toBeGreaterThan(0);
    expect(back.every((i) => i.scope.startsWith('visual.merger'))).toBe(true);
    const both = build({
      parallel: { tp: 2, pp: 2 },
      globalBatchSize: 12,
      encoder: { fullHeteroDp: true },
      overrides: ['model.image_encoder.freeze=true', 'model.image_projector.freeze=true'],
    });
    const p = both.programAt(0, 0);
    expect(p.instructions.filter((i) => i.op === 'scatter_v')).toEqual([]);
    expect(p.instructions.filter((i) => isEncoder(i) && i.phase === 'backward')).toEqual([]);
  });
});
