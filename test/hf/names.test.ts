// lfc ↔ Hugging Face names (runtime/hf/names.ts, docs/qwen-vl.md "Hugging Face names"): every
// parameter of every preset maps to a tensor of its family and back, one to one except the fused
// experts, whose views cover each element of their tensor exactly once.
import { describe, expect, it } from 'vitest';
import { loadModelConfig } from '../../compiler/frontend/config.js';
import { hfMap, hfNameOf, lfcNameOf, namingOf, type HfMap } from '../../runtime/hf/names.js';
import { PRESETS, presetGraph } from '../helpers.js';

const numel = (shape: readonly number[]) => shape.reduce((a, b) => a * b, 1);

function mapOf(preset: string): HfMap {
  const params = presetGraph(preset).params.map((p) => ({
    name: p.name,
    shape: p.type.shape.map(Number),
  }));
  return hfMap(params, loadModelConfig(preset).model);
}

describe('every preset maps to its family and back', () => {
  for (const preset of PRESETS) {
    it(`${preset}: each parameter has a tensor; renamed tensors map back to it alone`, () => {
      const map = mapOf(preset);
      const params = presetGraph(preset).params;
      expect(map.views.size).toBe(params.length);
      const fused = map.tensors.filter(
        (t) => t.sources.length > 1 || /experts\.(gate_up|down)_proj$/.test(t.name),
      );
      for (const t of map.tensors) {
        const back = lfcNameOf(t.name, map.naming);
        if (fused.includes(t)) expect(back).toBeUndefined();
        else expect([back]).toEqual(t.sources);
      }
      for (const p of params) expect(hfNameOf(p.name, map.naming)).toBe(map.views.get(p.name)!.hf);
      // the tensors hold exactly the parameters' elements
      const held = map.tensors.reduce((a, t) => a + numel(t.shape), 0);
      expect(held).toBe(params.reduce((a, p) => a + numel(p.type.shape.map(Number)), 0));
      // only experts are fused, and only in the Qwen3-VL family
      if (fused.length) expect(map.naming.family).toBe('qwen3_vl');
      for (const t of fused) for (const s of t.sources) expect(s).toMatch(/\.mlp\.experts\.\d+\./);
    });
  }
});

describe('the families', () => {
  it('Qwen2.5-VL: visual.* and model.*, the merger as ln_q / mlp.0 / mlp.2, the conv3d patch weight', () => {
    const map = mapOf('qwen2.5-vl-7b');
    expect(map.naming).toEqual({ family: 'qwen2_5_vl', layout: 'legacy' });
    const shapes = new Map(map.tensors.map((t) => [t.name, t.shape]));
    expect(shapes.get('visual.patch_embed.proj.weight')).toEqual([1280, 3, 2, 14, 14]);
    expect(shapes.get('visual.merger.ln_q.weight')).toEqual([1280]);
    expect(shapes.get('visual.merger.mlp.0.weight')).toEqual([5120, 5120]);
    expect(shapes.get('visual.merger.mlp.2.bias')).toEqual([3584]);
    expect(shapes.get('visual.blocks.31.mlp.gate_proj.weight')).toEqual([3420, 1280]);
    expect(shapes.get('model.layers.27.self_attn.q_proj.bias')).toEqual([3584]);
    expect(shapes.get('model.embed_tokens.weight')).toEqual([152064, 3584]);
    expect(shapes.get('lm_head.weight')).toEqual([152064, 3584]);
  });

  it('Qwen2.5-VL-3B ties its embeddings: no lm_head', () => {
    expect(mapOf('qwen2.5-vl-3b').tensors.some((t) => t.name === 'lm_head.weight')).toBe(false);
  });

  it('Qwen3-VL-MoE: model.visual.* and model.language_model.*, linear_fc1/2, fused experts', () => {
    const map = mapOf('qwen3-vl-30b-a3b');
    expect(map.naming).toEqual({ family: 'qwen3_vl', layout: 'nested' });
    const shapes = new Map(map.tensors.map((t) => [t.name, t.shape]));
    expect(shapes.get('model.visual.patch_embed.proj.weight')).toEqual([1152, 3, 2, 16, 16]);
    expect(shapes.get('model.visual.pos_embed.weight')).toEqual([2304, 1152]);
    expect(shapes.get('model.visual.blocks.26.mlp.linear_fc1.weight')).toEqual([4304, 1152]);
    expect(shapes.get('model.visual.merger.linear_fc2.weight')).toEqual([2048, 4608]);
    expect(shapes.get('model.visual.deepstack_merger_list.2.norm.weight')).toEqual([4608]);
    expect(shapes.get('model.language_model.layers.47.mlp.gate.weight')).toEqual([128, 2048]);
    expect(shapes.get('model.language_model.layers.0.mlp.experts.gate_up_proj')).toEqual([
      128, 2048, 1536,
    ]);
    expect(shapes.get('model.language_model.layers.0.mlp.experts.down_proj')).toEqual([
      128, 768, 2048,
    ]);
    expect(shapes.get('model.language_model.norm.weight')).toEqual([2048]);
    expect(shapes.get('lm_head.weight')).toEqual([151936, 2048]);
    // 128 gates and 128 ups in gate_up_proj, 128 downs in down_proj
    const t = map.tensors.find(
      (x) => x.name === 'model.language_model.layers.0.mlp.experts.gate_up_proj',
    )!;
    expect(t.sources.length).toBe(256);
  });

  it('the fused views: gate e is gate_up[e, :, 0:F]ᵀ, up e is gate_up[e, :, F:2F]ᵀ, down e is down[e]ᵀ, each element once', () => {
    const map = mapOf('qwen3-vl-moe-tiny'); // E 8, H 128, F 128
    const [E, H, F] = [8, 128, 128];
    for (const name of [
      'model.language_model.layers.2.mlp.experts.gate_up_proj',
      'model.language_model.layers.2.mlp.experts.down_proj',
    ]) {
      const t = map.tensors.find((x) => x.name === name)!;
      const seen = new Uint8Array(numel(t.shape));
      for (const s of t.sources) {
        const v = map.views.get(s)!;
        const [rows, cols] = s.endsWith('down_proj.weight') ? [H, F] : [F, H];
        for (let i = 0; i < rows; i++)
          for (let j = 0; j < cols; j++) seen[v.offset + i * v.strides[0] + j * v.strides[1]]++;
      }
      expect(seen.every((n) => n === 1)).toBe(true);
    }
    const v = (s: string) => map.views.get(`model.layers.2.mlp.experts.3.${s}.weight`)!;
    // gate (f, h) → [3, h, f]; up (f, h) → [3, h, F + f]; down (h, f) → [3, f, h]
    const at = (o: { offset: number; strides: readonly number[] }, i: number, j: number) =>
      o.offset + i * o.strides[0] + j * o.strides[1];
    expect(at(v('gate_proj'), 5, 7)).toBe(3 * H * 2 * F + 7 * 2 * F + 5);
    expect(at(v('up_proj'), 5, 7)).toBe(3 * H * 2 * F + 7 * 2 * F + F + 5);
    expect(at(v('down_proj'), 7, 5)).toBe(3 * F * H + 5 * H + 7);
    expect(E).toBe(8);
  });

  it("the tiny-vlm models keep lfc's own names (the Qwen2.5-VL family, experts one tensor each)", () => {
    for (const preset of ['tiny-vlm', 'tiny-vlm-moe']) {
      const map = mapOf(preset);
      expect(map.naming.family).toBe('qwen2_5_vl');
      for (const [name, v] of map.views)
        if (!name.startsWith('visual.merger.') && name !== 'visual.patch_embed.proj.weight')
          expect(v.hf).toBe(name);
    }
  });

  it('Qwen2.5-VL re-saved by recent transformers (nested) maps the same parameters', () => {
    const naming = { family: 'qwen2_5_vl', layout: 'nested' } as const;
    expect(hfNameOf('visual.merger.fc1.weight', naming)).toBe('model.visual.merger.mlp.0.weight');
    expect(hfNameOf('model.layers.3.mlp.up_proj.weight', naming)).toBe(
      'model.language_model.layers.3.mlp.up_proj.weight',
    );
    expect(hfNameOf('lm_head.weight', naming)).toBe('lm_head.weight');
    expect(lfcNameOf('model.language_model.norm.weight', naming)).toBe('model.norm.weight');
    expect(lfcNameOf('model.layers.0.mlp.up_proj.weight', naming)).toBeUndefined();
    expect(namingOf(loadModelConfig('qwen2.5-vl-tiny').model).layout).toBe('legacy');
  });
});
