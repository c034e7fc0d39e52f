// The tiny presets' parameters are exactly reference/tiny-vlm.md's names and shapes.
import { describe, expect, it } from 'vitest';
import { presetGraph } from '../helpers.js';

const HV = 64;
const FV = 256;
const HD = 128;
const V = 512;

function visual(): [string, number[]][] {
  const out: [string, number[]][] = [
    ['visual.patch_embed.proj.weight', [HV, 48]],
    ['visual.patch_embed.proj.bias', [HV]],
    ['visual.pos_embed_row', [8, HV]],
    ['visual.pos_embed_col', [8, HV]],
  ];
  for (let i = 0; i < 2; i++) {
    const p = `visual.blocks.${i}`;
    out.push(
      [`${p}.norm1.weight`, [HV]],
      [`${p}.norm1.bias`, [HV]],
      [`${p}.attn.qkv.weight`, [3 * HV, HV]],
      [`${p}.attn.qkv.bias`, [3 * HV]],
      [`${p}.attn.proj.weight`, [HV, HV]],
      [`${p}.attn.proj.bias`, [HV]],
      [`${p}.norm2.weight`, [HV]],
      [`${p}.norm2.bias`, [HV]],
      [`${p}.mlp.fc1.weight`, [FV, HV]],
      [`${p}.mlp.fc1.bias`, [FV]],
      [`${p}.mlp.fc2.weight`, [HV, FV]],
      [`${p}.mlp.fc2.bias`, [HV]],
    );
  }
  out.push(
    ['visual.merger.norm.weight', [HV]],
    ['visual.merger.norm.bias', [HV]],
    ['visual.merger.fc1.weight', [4 * HV, 4 * HV]],
    ['visual.merger.fc1.bias', [4 * HV]],
    ['visual.merger.fc2.weight', [HD, 4 * HV]],
    ['visual.merger.fc2.bias', [HD]],
  );
  return out;
}

function decoder(moe: boolean): [string, number[]][] {
  const out: [string, number[]][] = [['model.embed_tokens.weight', [V, HD]]];
  for (let i = 0; i < 4; i++) {
    const p = `model.layers.${i}`;
    out.push(
      [`${p}.input_layernorm.weight`, [HD]],
      [`${p}.self_attn.q_proj.weight`, [8 * 16, HD]],
      [`${p}.self_attn.k_proj.weight`, [4 * 16, HD]],
      [`${p}.self_attn.v_proj.weight`, [4 * 16, HD]],
      [`${p}.self_attn.q_norm.weight`, [16]],
      [`${p}.self_attn.k_norm.weight`, [16]],
      [`${p}.self_attn.o_proj.weight`, [HD, 8 * 16]],
      [`${p}.post_attention_layernorm.weight`, [HD]],
    );
    if (!moe) {
      out.push(
        [`${p}.mlp.gate_proj.weight`, [384, HD]],
        [`${p}.mlp.up_proj.weight`, [384, HD]],
        [`${p}.mlp.down_proj.weight`, [HD, 384]],
      );
    } else {
      out.push([`${p}.mlp.gate.weight`, [8, HD]]);
      for (let e = 0; e < 8; e++) {
        out.push(
          [`${p}.mlp.experts.${e}.gate_proj.weight`, [128, HD]],
          [`${p}.mlp.experts.${e}.up_proj.weight`, [128, HD]],
          [`${p}.mlp.experts.${e}.down_proj.weight`, [HD, 128]],
        );
      }
    }
  }
  out.push(['model.norm.weight', [HD]], ['lm_head.weight', [V, HD]]);
  return out;
}

describe.each([
  ['tiny-vlm', false],
  ['tiny-vlm-moe', true],
] as const)('%s', (name, moe) => {
  it('has exactly the parameters of tiny-vlm.md', () => {
    const got = Object.fromEntries(presetGraph(name).params.map((p) => [p.name, p.type.shape]));
    const want = Object.fromEntries([...visual(), ...decoder(moe)]);
    expect(got).toEqual(want);
  });
});
