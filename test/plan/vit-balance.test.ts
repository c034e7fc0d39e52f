// --use-vit-dp-balance in emitted plans: tiny-vlm-moe on 8 ranks at levels 0 to 3. Every
// encode of every program pools its images over the encoder's gradient group (dp at levels 0 and 1,
// every rank of stage 0 at level 2, every rank at level 3): one size exchange, one routing
// decision, one all_to_all_v per patch input before the encoder and one per visual output after
// it, and the reverse exchange of the output gradient in the backward. Ranks that do not encode
// hold none of it; one rank needs none.
import { describe, expect, it } from 'vitest';
import { compile, type CompileOptions } from '../../compiler/pipeline.js';
import type { PlanInstruction, ProgramFile } from '../../compiler/plan/format.js';

/** per-patch inputs of the tiny encoder: patches, image_segments, patch_rows, patch_cols */
const PATCH_INPUTS = 4;

function build(o: Partial<CompileOptions>) {
  return compile({
    model: 'tiny-vlm-moe',
    nprocPerNode: 8,
    seqLength: 64,
    microBatchSize: 1,
    globalBatchSize: 8,
    ...o,
    encoder: { ...o.encoder, vitDpBalance: true },
  } as CompileOptions);
}

const at = (p: ProgramFile, scope: string, op: string, phase: PlanInstruction['phase']) =>
  p.instructions.filter((i) => i.scope === scope && i.op === op && i.phase === phase);
/** microbatches the program encodes */
const encodes = (p: ProgramFile) =>
  new Set(at(p, 'visual.balance', 'vit_balance_route', 'forward').map((i) => i.microbatch));

const CASES = [
  {
    level: 0,
    group: 'dp',
    size: 2,
    o: {
      parallel: { tp: 2, pp: 2 },
      overrides: ['model.image_encoder.tensor_model_parallel_size=2'],
    },
  },
  { level: 1, group: 'dp', size: 2, o: { parallel: { tp: 2, pp: 2 } } },
  {
    level: 2,
    group: 'tp_dp_cp',
    size: 4,
    o: { parallel: { tp: 2, pp: 2 }, encoder: { heteroDp: true } },
  },
  {
    level: 3,
    group: 'world',
    size: 8,
    o: { parallel: { tp: 2, pp: 2 }, encoder: { fullHeteroDp: true } },
  },
] as const;

describe('ViT DP balance in the plan (tiny-vlm-moe, 8 ranks, tp 2 pp 2 dp 2)', () => {
  for (const c of CASES) {
    it(`level ${c.level}: images pooled over ${c.group} (${c.size} ranks) at every encode`, () => {
      const r = build(c.o as Partial<CompileOptions>);
      expect(r.placement.level).toBe(c.level);
      let encoded = 0;
      for (const p of r.programs) {
        const mbs = encodes(p);
        encoded += mbs.size;
        const balanceOps = p.instructions.filter((i) => i.scope.startsWith('visual.balance'));
        if (!mbs.size) {
          expect(balanceOps, `${p.id} encodes nothing`).toEqual([]);
          continue;
        }
        for (const i of balanceOps.filter((x) => x.attrs.group !== undefined)) {
          expect(i.attrs.group, `${p.id} ${i.op}`).toBe(c.group);
          expect(i.attrs.group_size).toBe(c.size);
        }
        const count = (scope: string, op: string, phase: PlanInstruction['phase']) =>
          at(p, scope, op, phase).length;
        expect(count('visual.balance', 'all_gather', 'forward')).toBe(mbs.size);
        expect(count('visual.balance', 'all_to_all_v', 'forward')).toBe(PATCH_INPUTS * mbs.size);
        expect(count('visual.balance_back', 'all_to_all_v', 'forward')).toBe(mbs.size);
        // the output gradient goes back to the rank that encoded the image
        expect(count('visual.balance_back', 'all_to_all_v', 'backward')).toBe(mbs.size);
        expect(count('visual.balance_back', 'scatter_rows', 'backward')).toBe(mbs.size);
        // the encoder runs over the balanced rows (the run-time symbol Pb), not its own 4·Nv
        const patchEmbed = p.instructions.find((i) => i.op === 'patch_embed')!;
        expect(p.buffers[patchEmbed.inputs[0]].shape[0]).toBe('Pb');
      }
      // each microbatch of a data-parallel rank is encoded by one program (levels 0, 1: stage 0's,
      // which its TP ranks share; levels 2 and 3: one per TP index and stage)
      expect(encoded).toBe(r.plan.training.numMicrobatches);
      expect(r.plan.symbols.find((s) => s.name === 'Pb')?.bound).toBe(4 * 64);
    });
  }

  it('mock slots take part: level 3 with 2 microbatches over 4 encoding ranks, level 2 with 3 over tp 2', () => {
    const level3 = build({
      parallel: { tp: 2, pp: 2 },
      globalBatchSize: 4,
      encoder: { fullHeteroDp: true },
    });
    expect(level3.placement.slots - level3.placement.microbatches).toBe(2);
    for (const p of level3.programs) {
      // every rank encodes its slot of the round, mock or real, and runs its encoder backward
      expect(encodes(p).size, p.id).toBe(1);
      expect(at(p, 'visual.balance_back', 'all_to_all_v', 'backward')).toHaveLength(1);
    }
    const level2 = build({
      parallel: { tp: 2 },
      nprocPerNode: 2,
      globalBatchSize: 3,
      encoder: { heteroDp: true },
    });
    expect(level2.programs.map((p) => [...encodes(p)])).toEqual([
      [0, 2],
      [1, 3], // slot 3 is a mock microbatch
    ]);
  });

  it('frozen encoder and projector: no gradient flows back through the exchange', () => {
    const r = build({
      parallel: { tp: 2, pp: 2 },
      encoder: { fullHeteroDp: true },
      overrides: ['model.image_encoder.freeze=true', 'model.image_projector.freeze=true'],
    });
    for (const p of r.programs) {
      expect(encodes(p).size).toBeGreaterThan(0);
      expect(
        p.instructions.filter((i) => i.scope.startsWith('visual.') && i.phase === 'backward'),
      ).toEqual([]);
    }
  });

  it('encoder recompute runs the exchange again but reports the images moved once', () => {
    const r = build({
      parallel: { tp: 2, pp: 2 },
      encoder: { fullHeteroDp: true, recompute: true },
    });
    for (const p of r.programs) {
      const routes = p.instructions.filter((i) => i.op === 'vit_balance_route');
      expect(routes.length).toBe(2 * encodes(p).size); // phase 1, and again before phase 3
      const moved = p.outputs.filter((o) => o.name === 'vit_images_moved');
      expect(moved.map((o) => o.microbatch)).toEqual([...encodes(p)]);
    }
  });

  it('one rank: nothing to balance, the pass leaves the graph alone', () => {
    const r = build({ nprocPerNode: 1, globalBatchSize: 2 });
    expect(r.graph.nodes.some((n) => n.scope.startsWith('visual.balance'))).toBe(false);
    expect(r.graph.outputs.map((o) => o.label)).not.toContain('vit_images_moved');
  });
});
