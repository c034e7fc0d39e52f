// Hugging Face config.json → lfc's model (compiler/frontend/hf-config.ts, lfc compile/inspect
// --hf-config): the hub's published configs of Qwen2.5-VL-7B-Instruct and Qwen3-VL-30B-A3B-Instruct
// build the same model as the presets (acceptance 5); config.json's keys win over a --model preset,
// which supplies the rest; the inverse (export-hf's config.json) round-trips every Qwen preset; a
// bad config.json is one line naming the file, exit 2.
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { buildForwardGraph } from '../../compiler/frontend/build.js';
import { loadModelConfig, type ModelConfig } from '../../compiler/frontend/config.js';
import { hfConfigOf, loadHfModelConfig } from '../../compiler/frontend/hf-config.js';
import { parseCompileArgs } from '../../cli/compile.js';
import { cli } from '../helpers.js';
import { QWEN2_5_VL_7B_INSTRUCT, QWEN3_VL_30B_A3B_INSTRUCT } from './published-configs.js';

const dir = mkdtempSync(join(tmpdir(), 'lfc-hf-config-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** config.json in a directory of its own (the model is named after the directory) */
function configFile(name: string, json: unknown): string {
  mkdirSync(join(dir, name), { recursive: true });
  const path = join(dir, name, 'config.json');
  writeFileSync(path, typeof json === 'string' ? json : JSON.stringify(json, null, 2));
  return path;
}

/** the keys where two models differ: `part.key: a ≠ b` */
function differences(a: ModelConfig['model'], b: ModelConfig['model']): string[] {
  const out: string[] = [];
  for (const part of ['image_encoder', 'image_projector', 'text_decoder'] as const) {
    const x = a[part] as unknown as Record<string, unknown>;
    const y = b[part] as unknown as Record<string, unknown>;
    for (const k of new Set([...Object.keys(x), ...Object.keys(y)]))
      if (JSON.stringify(x[k]) !== JSON.stringify(y[k]))
        out.push(`${part}.${k}: ${JSON.stringify(x[k])} ≠ ${JSON.stringify(y[k])}`);
  }
  return out;
}

const paramsOf = (c: ModelConfig) =>
  buildForwardGraph(c).params.map((p) => `${p.name} [${p.type.shape.join(', ')}]`);

describe('the published configs build the presets (acceptance 5)', () => {
  it('Qwen2.5-VL-7B-Instruct is qwen2.5-vl-7b: every key, every parameter', () => {
    const hf = loadHfModelConfig(configFile('Qwen2.5-VL-7B-Instruct', QWEN2_5_VL_7B_INSTRUCT));
    const preset = loadModelConfig('qwen2.5-vl-7b');
    expect(hf.name).toBe('Qwen2.5-VL-7B-Instruct');
    expect(differences(hf.model, preset.model)).toEqual([]);
    expect(hf.training).toEqual(preset.training);
    expect(paramsOf(hf)).toEqual(paramsOf(preset));
  });

  it('Qwen3-VL-30B-A3B-Instruct is qwen3-vl-30b-a3b: every key, every parameter', () => {
    const hf = loadHfModelConfig(
      configFile('Qwen3-VL-30B-A3B-Instruct', QWEN3_VL_30B_A3B_INSTRUCT),
    );
    const preset = loadModelConfig('qwen3-vl-30b-a3b');
    expect(differences(hf.model, preset.model)).toEqual([]);
    expect(paramsOf(hf)).toEqual(paramsOf(preset));
  });

  it('lfc compile --hf-config and lfc inspect --hf-config take them', async () => {
    const file = configFile('Qwen3-VL-30B-A3B-Instruct', QWEN3_VL_30B_A3B_INSTRUCT);
    const r = await cli('inspect', '--hf-config', file, '--json');
    expect(r.code).toBe(0);
    expect(JSON.parse(r.out).model).toBe('Qwen3-VL-30B-A3B-Instruct');
    const out = join(dir, 'plan-7b');
    const c = await cli(
      'compile',
      '--hf-config',
      join(dir, 'Qwen2.5-VL-7B-Instruct'),
      '--tp',
      '4',
      '--nproc-per-node',
      '4',
      '--no-simulate',
      '-o',
      out,
    );
    expect(c.err).toBe('');
    expect(c.code).toBe(0);
    expect(c.out).toMatch(/^compiled Qwen2.5-VL-7B-Instruct for 4 ranks/);
  });
});

describe('a dense Qwen3-VL config.json (Qwen3VLForConditionalGeneration)', () => {
  it('builds a dense decoder with the Qwen3-VL encoder and compiles', async () => {
    const { text_config: text, vision_config: vision } = QWEN3_VL_30B_A3B_INSTRUCT;
    const dense = {
      ...QWEN3_VL_30B_A3B_INSTRUCT,
      architectures: ['Qwen3VLForConditionalGeneration'],
      model_type: 'qwen3_vl',
      text_config: {
        ...Object.fromEntries(
          Object.entries(text).filter(
            ([k]) => !/expert|moe|norm_topk|sparse_step|mlp_only/.test(k),
          ),
        ),
        model_type: 'qwen3_vl_text',
        hidden_size: 4096,
        num_hidden_layers: 4,
        num_key_value_heads: 8,
        intermediate_size: 12288,
      },
      vision_config: { ...vision, model_type: 'qwen3_vl', out_hidden_size: 4096 },
    };
    const file = configFile('Qwen3-VL-dense', dense);
    const c = loadHfModelConfig(file);
    expect(c.model.text_decoder.num_experts).toBe(0);
    expect(c.model.text_decoder.ffn_hidden_size).toBe(12288);
    expect(c.model.image_encoder.deepstack_layers).toEqual([8, 16, 24]);
    expect(paramsOf(c)).toContain('model.layers.3.mlp.down_proj.weight [4096, 12288]');
    const r = await cli(
      'compile',
      '--hf-config',
      file,
      '--no-simulate',
      '-o',
      join(dir, 'plan-dense'),
    );
    expect(r.err).toBe('');
    expect(r.code).toBe(0);
  });
});

describe('config.json over a preset', () => {
  it("config.json's keys win; the preset supplies the rest; the command line's overrides win over both", () => {
    const file = configFile('Qwen3-VL-30B-A3B-Instruct', QWEN3_VL_30B_A3B_INSTRUCT);
    const request = parseCompileArgs([
      'qwen3-vl-moe-tiny',
      '--hf-config',
      file,
      'model.image_encoder.freeze=true',
      '-o',
      'x',
    ]);
    const c = loadModelConfig(request.options.model, request.options.overrides);
    const tiny = loadModelConfig('qwen3-vl-moe-tiny');
    expect(c.name).toBe('qwen3-vl-moe-tiny');
    expect(c.model.text_decoder.hidden_size).toBe(2048); // config.json
    expect(c.model.text_decoder.num_experts).toBe(128);
    expect(c.model.image_encoder.max_image_size).toBe(tiny.model.image_encoder.max_image_size); // preset
    expect(c.training).toEqual(tiny.training);
    expect(c.model.image_encoder.freeze).toBe(true); // command line
    // the tiny preset's pixel bounds belong to its patch 4: config.json's patch 16 takes HF's
    expect(c.model.image_encoder.min_pixels).toBeUndefined();
    expect(c.model.image_encoder.image_mean).toEqual(tiny.model.image_encoder.image_mean);
  });

  it("the image processor's keys come from preprocessor_config.json beside config.json", () => {
    const file = configFile('Qwen3-VL-processor', QWEN3_VL_30B_A3B_INSTRUCT);
    const processor = {
      size: { longest_edge: 16777216, shortest_edge: 65536 },
      image_mean: [0.5, 0.5, 0.5],
      image_std: [0.5, 0.5, 0.5],
    };
    writeFileSync(
      join(dir, 'Qwen3-VL-processor', 'preprocessor_config.json'),
      JSON.stringify(processor),
    );
    const e = loadHfModelConfig(file).model.image_encoder;
    expect([e.min_pixels, e.max_pixels, e.image_mean, e.image_std]).toEqual([
      65536,
      16777216,
      [0.5, 0.5, 0.5],
      [0.5, 0.5, 0.5],
    ]);
    writeFileSync(
      join(dir, 'Qwen3-VL-processor', 'preprocessor_config.json'),
      JSON.stringify({ min_pixels: -3 }),
    );
    expect(() => loadHfModelConfig(file)).toThrow(
      /preprocessor_config\.json: min_pixels must be a positive integer/,
    );
  });

  it('an override may stand where the model argument would', () => {
    const file = configFile('Qwen2.5-VL-7B-Instruct', QWEN2_5_VL_7B_INSTRUCT);
    const r = parseCompileArgs(['--hf-config', file, '+model.text_decoder.freeze=true', '-o', 'x']);
    const c = loadModelConfig(r.options.model, r.options.overrides);
    expect(c.name).toBe('Qwen2.5-VL-7B-Instruct');
    expect(c.model.text_decoder.freeze).toBe(true);
  });
});

describe('config.json of an lfc model (export-hf) round-trips', () => {
  const QWEN = [
    'qwen2.5-vl-3b',
    'qwen2.5-vl-7b',
    'qwen2.5-vl-32b',
    'qwen2.5-vl-72b',
    'qwen2.5-vl-tiny',
    'qwen3-vl-30b-a3b',
    'qwen3-vl-235b-a22b',
    'qwen3-vl-moe-tiny',
  ];
  for (const preset of QWEN)
    it(`${preset}: exactly its architecture, and read back over it, the same model`, () => {
      const c = loadModelConfig(preset);
      const { json, inexact } = hfConfigOf(c.model, 'bfloat16');
      expect(inexact).toEqual([]);
      const back = loadHfModelConfig(configFile(`rt-${preset}`, json), preset);
      expect({ ...back, source: c.source }).toEqual(c);
    });

  it('tiny-vlm is not a Hugging Face architecture: config.json says what differs', () => {
    const { json, inexact } = hfConfigOf(loadModelConfig('tiny-vlm').model, 'float32');
    expect(json.architectures).toEqual(['Qwen2_5_VLForConditionalGeneration']);
    expect(inexact).toContain(
      'image_encoder.normalization is "layernorm" (the architecture\'s: "rmsnorm")',
    );
  });
});

describe('a bad config.json is one line naming the file, exit 2', () => {
  const cases: [string, unknown, RegExp][] = [
    ['malformed', '{"architectures": [', /config\.json: malformed JSON/],
    [
      'unknown-arch',
      { ...QWEN2_5_VL_7B_INSTRUCT, architectures: ['LlavaForConditionalGeneration'] },
      /config\.json: architecture LlavaForConditionalGeneration is not one lfc builds \(Qwen2_5_VLForConditionalGeneration, Qwen3VLForConditionalGeneration, Qwen3VLMoeForConditionalGeneration\)/,
    ],
    [
      'missing-key',
      { ...QWEN2_5_VL_7B_INSTRUCT, num_hidden_layers: undefined },
      /config\.json: num_hidden_layers is missing/,
    ],
    [
      'bad-value',
      {
        ...QWEN3_VL_30B_A3B_INSTRUCT,
        text_config: { ...QWEN3_VL_30B_A3B_INSTRUCT.text_config, hidden_size: 'big' },
      },
      /config\.json: text_config\.hidden_size must be a positive integer, got "big"/,
    ],
    [
      'not-built',
      {
        ...QWEN3_VL_30B_A3B_INSTRUCT,
        text_config: { ...QWEN3_VL_30B_A3B_INSTRUCT.text_config, mlp_only_layers: [3] },
      },
      /config\.json: text_config\.mlp_only_layers \[3\] is not built: lfc builds every decoder layer as MoE/,
    ],
    [
      'inconsistent',
      { ...QWEN2_5_VL_7B_INSTRUCT, rope_scaling: { type: 'mrope', mrope_section: [16, 24, 16] } },
      /config\.json: .*mrope_section sums to 56; it must be kv_channels\/2 = 64/,
    ],
  ];
  for (const [name, json, message] of cases)
    it(name, async () => {
      const file = configFile(`bad-${name}`, json);
      for (const argv of [
        ['compile', '--hf-config', file, '-o', join(dir, 'never')],
        ['inspect', '--hf-config', file],
      ]) {
        const r = await cli(...argv);
        expect(r.code).toBe(2);
        expect(r.err).toMatch(message);
        expect(r.err.trim().split('\n')).toHaveLength(1);
        expect(r.err).toContain(file);
      }
    });

  it('a missing file', async () => {
    const r = await cli(
      'compile',
      '--hf-config',
      join(dir, 'nowhere', 'config.json'),
      '-o',
      join(dir, 'never'),
    );
    expect(r.code).toBe(2);
    expect(r.err).toMatch(/cannot read .*nowhere\/config\.json: ENOENT/);
  });
});
