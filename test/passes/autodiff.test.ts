// Autodiff's structure: every trainable parameter gets exactly one accumulated gradient and one
// AdamW update; weight ops split into dgrad and wgrad; frozen modules get no backward work and
// no optimizer state; the result verifies. (Numbers are checked against the PyTorch fixture in
// test/runtime.)
import { describe, expect, it } from 'vitest';
import { buildForwardGraph } from '../../compiler/frontend/build.js';
import { loadModelConfig } from '../../compiler/frontend/config.js';
import { verifyGraph, type Graph } from '../../ir/index.js';
import { autodiff } from '../../passes/autodiff.js';

function step(model: string, overrides: string[] = []): Graph {
  return autodiff(buildForwardGraph(loadModelConfig(model, overrides))).graph;
}

const byOp = (g: Graph, op: string) => g.nodes.filter((n) => n.op === op);

describe.each(['tiny-vlm', 'tiny-vlm-moe'])('%s', (model) => {
  const g = step(model);
  const trainable = g.params.filter((p) => p.role === 'param' && p.trainable).map((p) => p.name);
  it('verifies', () => expect(verifyGraph(g)).toEqual([]));
  it('accumulates one gradient per trainable parameter, into its grad buffer', () => {
    const acc = byOp(g, 'grad_accumulate').map((n) => n.inputs[1]);
    expect(acc.sort()).toEqual(trainable.map((n) => `grad.${n}`).sort());
  });
  it('updates every trainable parameter once with AdamW, decay only on ≥2-D tensors', () => {
    const adam = byOp(g, 'adamw');
    expect(adam.map((n) => n.inputs[0]).sort()).toEqual([...trainable].sort());
    for (const n of adam) {
      const p = g.params.find((q) => q.name === n.inputs[0])!;
      expect(n.attrs.weight_decay).toBe(p.type.shape.length >= 2 ? 0.1 : 0);
      expect(n.phase).toBe('optimizer');
    }
    expect(byOp(g, 'clip_coef')).toHaveLength(1);
    expect(byOp(g, 'sum_squares')[0].inputs).toHaveLength(trainable.length);
  });
  it('splits every linear into dgrad and wgrad (no dgrad into the data)', () => {
    const linears = byOp(g, 'linear').length + byOp(g, 'patch_embed').length;
    expect(byOp(g, 'linear_wgrad')).toHaveLength(linears);
    // the patch embedding reads the pixels, which need no gradient
    expect(byOp(g, 'linear_dgrad')).toHaveLength(linears - 1);
  });
  it('marks every backward node as backward', () => {
    const firstBackward = g.nodes.findIndex((n) => n.phase === 'backward');
    expect(g.nodes.slice(0, firstBackward).every((n) => n.phase === 'forward')).toBe(true);
    expect(g.nodes.slice(firstBackward).every((n) => n.phase !== 'forward')).toBe(true);
  });
});

describe('frozen modules', () => {
  it('a frozen encoder gets no backward nodes and no optimizer state; the projector still trains', () => {
    const g = step('tiny-vlm', ['model.image_encoder.freeze=true']);
    expect(verifyGraph(g)).toEqual([]);
    const backward = g.nodes.filter((n) => n.phase === 'backward');
    expect(
      backward.some(
        (n) => n.scope.startsWith('visual.blocks') || n.scope.startsWith('visual.patch_embed'),
      ),
    ).toBe(false);
    expect(backward.some((n) => n.scope.startsWith('visual.merger'))).toBe(true);
    expect(g.params.some((p) => p.role !== 'param' && p.name.includes('visual.blocks'))).toBe(
      false,
    );
    // the merger's input comes from the frozen encoder: no gradient flows into it
    const mergerNorm = g.nodes.find(
      (n) => n.op === 'layernorm_grad' && n.scope.startsWith('visual.merger'),
    );
    expect(mergerNorm).toBeDefined();
  });
  it('frozen encoder and projector: no visual backward at all', () => {
    const g = step('tiny-vlm', [
      'model.image_encoder.freeze=true',
      'model.image_projector.freeze=true',
    ]);
    expect(g.nodes.filter((n) => n.phase === 'backward' && n.scope.startsWith('visual'))).toEqual(
      [],
    );
    expect(byOp(g, 'merge_visual_grad')).toHaveLength(1);
  });
});
