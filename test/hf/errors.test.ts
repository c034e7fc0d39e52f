// A bad Hugging Face directory given to lfc run --load-hf, or a bad export-hf request: one line
// naming the file (and the tensor), exit 2, and nothing already written touched (the save
// directory's checkpoint, metrics, an export's target).
import {
  cpSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  truncateSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { compile, writePlan } from '../../compiler/pipeline.js';
import { heldPieces, iterDir, writeCheckpoint } from '../../runtime/checkpoint.js';
import { closeLoadPlan, planHfLoad, readPieces } from '../../runtime/hf/load.js';
import {
  readSafetensors,
  serializeSafetensors,
  writeSafetensors,
  type Tensor,
} from '../../runtime/safetensors.js';
import { cli } from '../helpers.js';

const dir = mkdtempSync(join(tmpdir(), 'lfc-hf-errors-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const at = (...p: string[]) => join(dir, ...p);
const PLAN = at('plan');
const GOOD = at('hf');

/** the shard holding a tensor, by the index */
function shardOf(hf: string, tensor: string): string {
  const index = JSON.parse(readFileSync(join(hf, 'model.safetensors.index.json'), 'utf8'));
  return join(hf, index.weight_map[tensor]);
}

/** a copy of the good directory, changed by `edit` */
function variant(name: string, edit: (d: string) => void): string {
  const d = at(name);
  cpSync(GOOD, d, { recursive: true });
  edit(d);
  return d;
}

/** rewrites one shard with a tensor changed (or added, or removed: undefined) */
function rewriteShard(
  d: string,
  tensor: string,
  change: (t: Tensor | undefined) => Tensor | undefined,
  name = tensor,
) {
  const file = shardOf(d, tensor);
  const { tensors } = readSafetensors(file);
  const t = change(tensors.get(name));
  if (t) tensors.set(name, t);
  else tensors.delete(name);
  writeFileSync(file, serializeSafetensors(tensors));
}

const TENSOR = 'model.layers.1.mlp.experts.3.up_proj.weight';

beforeAll(async () => {
  const { plan, programs } = compile({ model: 'tiny-vlm-moe', globalBatchSize: 2 });
  writePlan(PLAN, plan, programs);
  const r = await cli('run', PLAN, '--train-iters', '1', '--save', at('save'), '--quiet');
  expect(r.code).toBe(0);
  const e = await cli(
    'export-hf',
    GOOD,
    '--load',
    at('save'),
    '--plan',
    PLAN,
    '--max-shard-size',
    '400KB',
  );
  expect(e.code).toBe(0);
}, 120_000);

describe('lfc run --load-hf with a bad directory: one line naming the file, exit 2', () => {
  const cases: [string, () => string, RegExp][] = [
    [
      'a missing tensor',
      () =>
        variant('missing', (d) => {
          const index = join(d, 'model.safetensors.index.json');
          const json = JSON.parse(readFileSync(index, 'utf8'));
          delete json.weight_map[TENSOR];
          writeFileSync(index, JSON.stringify(json));
        }),
      /missing\/model\.safetensors\.index\.json: no tensor model\.layers\.1\.mlp\.experts\.3\.up_proj\.weight \(lfc parameter model\.layers\.1\.mlp\.experts\.3\.up_proj\.weight, from --load-hf /,
    ],
    [
      'a wrong shape',
      () =>
        variant('shape', (d) =>
          rewriteShard(d, TENSOR, (t) => ({ ...t!, shape: [t!.shape[0] / 2, t!.shape[1] * 2] })),
        ),
      /shape\/model-\d+-of-\d+\.safetensors: tensor model\.layers\.1\.mlp\.experts\.3\.up_proj\.weight is BF16\[64, 256\], this model wants \[128, 128\]/,
    ],
    [
      'an unsupported dtype',
      () =>
        variant('dtype', (d) =>
          rewriteShard(d, TENSOR, (t) => ({
            dtype: 'F64',
            shape: t!.shape,
            data: new Float64Array(t!.data.length),
          })),
        ),
      /dtype\/model-\d+-of-\d+\.safetensors: tensor model\.layers\.1\.mlp\.experts\.3\.up_proj\.weight is F64; lfc reads BF16, F16, F32/,
    ],
    [
      'an unknown architecture in config.json',
      () =>
        variant('arch', (d) => {
          const json = JSON.parse(readFileSync(join(d, 'config.json'), 'utf8'));
          writeFileSync(
            join(d, 'config.json'),
            JSON.stringify({ ...json, architectures: ['LlamaForCausalLM'] }),
          );
        }),
      /arch\/config\.json: architecture LlamaForCausalLM is not one lfc builds/,
    ],
    [
      "another family's config.json",
      () =>
        variant('family', (d) => {
          const json = JSON.parse(readFileSync(join(d, 'config.json'), 'utf8'));
          writeFileSync(
            join(d, 'config.json'),
            JSON.stringify({ ...json, architectures: ['Qwen3VLForConditionalGeneration'] }),
          );
        }),
      /family\/config\.json: a Qwen3VLForConditionalGeneration checkpoint \(qwen3_vl names\), but tiny-vlm-moe has qwen2_5_vl names/,
    ],
    [
      'a truncated shard',
      () =>
        variant('truncated', (d) => {
          const file = shardOf(d, TENSOR);
          truncateSync(file, statSync(file).size - 1000);
        }),
      /truncated\/model-\d+-of-\d+\.safetensors: not a valid safetensors file: tensor \S+ ends at byte \d+, past the file's \d+ bytes \(truncated\?\)/,
    ],
    [
      'an index naming a shard that does not exist',
      () => variant('no-shard', (d) => rmSync(shardOf(d, TENSOR))),
      /no-shard\/model\.safetensors\.index\.json: names shard model-\d+-of-\d+\.safetensors, which does not exist/,
    ],
    [
      'a malformed index',
      () =>
        variant('bad-index', (d) =>
          writeFileSync(join(d, 'model.safetensors.index.json'), '{"weight_map": {'),
        ),
      /bad-index\/model\.safetensors\.index\.json: malformed JSON/,
    ],
    [
      'a malformed config.json',
      () => variant('bad-config', (d) => writeFileSync(join(d, 'config.json'), 'architectures: [')),
      /bad-config\/config\.json: malformed JSON/,
    ],
    [
      'a tensor the model lacks (a checkpoint of a bigger model)',
      () =>
        variant('extra', (d) => {
          rewriteShard(
            d,
            TENSOR,
            () => ({ dtype: 'BF16', shape: [4], data: new Uint16Array(4) }),
            'model.layers.9.input_layernorm.weight',
          );
          const index = join(d, 'model.safetensors.index.json');
          const json = JSON.parse(readFileSync(index, 'utf8'));
          json.weight_map['model.layers.9.input_layernorm.weight'] = json.weight_map[TENSOR];
          writeFileSync(index, JSON.stringify(json));
        }),
      /extra\/model\.safetensors\.index\.json: holds tensors this model lacks: model\.layers\.9\.input_layernorm\.weight/,
    ],
    [
      'not a model directory',
      () => {
        mkdirSync(at('empty'), { recursive: true });
        return at('empty');
      },
      /empty: has neither model\.safetensors nor model\.safetensors\.index\.json/,
    ],
  ];
  for (const [name, make, message] of cases)
    it(name, async () => {
      const bad = make();
      const save = join(at('save'));
      const before = readdirSync(iterDir(save, 1)).map((f) =>
        readFileSync(join(iterDir(save, 1), f)),
      );
      const metrics = readFileSync(join(PLAN, 'metrics.jsonl'), 'utf8');
      const r = await cli(
        'run',
        PLAN,
        '--train-iters',
        '3',
        '--quiet',
        '--save',
        save,
        '--load-hf',
        bad,
      );
      expect(r.code).toBe(2);
      expect(r.err).toMatch(message);
      expect(r.err.trim().split('\n')).toHaveLength(1);
      // nothing written: the save directory's checkpoint and latest, the metrics
      const after = readdirSync(iterDir(save, 1)).map((f) =>
        readFileSync(join(iterDir(save, 1), f)),
      );
      expect(after.every((b, i) => b.equals(before[i]))).toBe(true);
      expect(readdirSync(save).sort()).toEqual(['iter_0000001', 'latest']);
      expect(readFileSync(join(PLAN, 'metrics.jsonl'), 'utf8')).toBe(metrics);
    });

  it('flags that both set the starting parameters', async () => {
    for (const [flags, message] of [
      [
        ['--load-hf', GOOD, '--load', at('save')],
        /--load and --load-hf both set the starting parameters; give one/,
      ],
      [
        ['--load-hf', GOOD, '--load-hf-decoder', GOOD],
        /--load-hf loads every parameter; drop --load-hf-decoder/,
      ],
    ] as const) {
      const r = await cli('run', PLAN, '--train-iters', '1', ...flags);
      expect(r.code).toBe(2);
      expect(r.err).toMatch(message);
    }
  });
});

describe('tied embeddings (qwen2.5-vl-tiny ties lm_head to embed_tokens)', () => {
  // read without the runtime: the check is the reader's
  const model = 'qwen2.5-vl-tiny';
  const loadWith = (hf: string) => {
    const { plan, programs } = compile({ model });
    const pieces = heldPieces(plan, programs[0], 0);
    const lp = planHfLoad(
      [{ dir: hf, part: 'all' }],
      plan.model.name,
      plan.model.config as never,
      plan.params,
      pieces,
    );
    try {
      readPieces(lp, (r) => new Float32Array(r.shape.reduce((a, b) => a * b, 1)));
    } finally {
      closeLoadPlan(lp);
    }
  };
  let hf: string;
  let embed: Tensor;
  beforeAll(async () => {
    const { plan } = compile({ model });
    const tensors = new Map<string, Tensor>(
      plan.params.map((p) => [
        p.name,
        {
          dtype: 'F32',
          shape: [...p.shape],
          data: Float32Array.from(
            { length: p.shape.reduce((a, b) => a * b, 1) },
            (_, i) => (i % 97) / 97,
          ),
        },
      ]),
    );
    const meta = { model, step: 1, seed: 1, dataStep: 1, lr: {} };
    writeCheckpoint(at('tied-save'), { model: tensors, optim: new Map() }, meta);
    hf = at('tied-hf');
    const r = await cli(
      'export-hf',
      hf,
      '--load',
      at('tied-save'),
      '--model',
      model,
      '--dtype',
      'fp32',
    );
    expect(r.code).toBe(0);
    embed = readSafetensors(join(hf, 'model.safetensors')).tensors.get(
      'model.embed_tokens.weight',
    )!;
  });

  it('export writes no lm_head; a present lm_head equal to embed_tokens is accepted', () => {
    expect(readSafetensors(join(hf, 'model.safetensors')).tensors.has('lm_head.weight')).toBe(
      false,
    );
    const withHead = at('tied-equal');
    cpSync(hf, withHead, { recursive: true });
    const file = join(withHead, 'model.safetensors');
    const t = readSafetensors(file).tensors;
    t.set('lm_head.weight', embed);
    writeSafetensors(file, t);
    expect(() => loadWith(withHead)).not.toThrow();
  });

  it('a different lm_head is refused, naming it', () => {
    const other = at('tied-differs');
    cpSync(hf, other, { recursive: true });
    const file = join(other, 'model.safetensors');
    const t = readSafetensors(file).tensors;
    const data = Float32Array.from(embed.data as Float32Array);
    data[77] += 1;
    t.set('lm_head.weight', { ...embed, data });
    writeSafetensors(file, t);
    expect(() => loadWith(other)).toThrow(
      /tied-differs\/model\.safetensors: tensor lm_head\.weight differs from model\.embed_tokens\.weight \(element 77 of this rank's piece\), but this model ties them/,
    );
  });
});

describe('an untied model and a directory without lm_head', () => {
  const loadWith = (hf: string) => {
    const { plan, programs } = compile({ model: 'tiny-vlm-moe', globalBatchSize: 2 });
    const lp = planHfLoad(
      [{ dir: hf, part: 'all' }],
      plan.model.name,
      plan.model.config as never,
      plan.params,
      heldPieces(plan, programs[0], 0),
    );
    const got = new Map<string, Float32Array>();
    try {
      readPieces(
        lp,
        (r) => new Float32Array(r.shape.reduce((a, b) => a * b, 1)),
        (r, v) => got.set(r.name, v),
      );
    } finally {
      closeLoadPlan(lp);
    }
    return got;
  };
  const withoutHead = (name: string, tied: boolean) =>
    variant(name, (d) => {
      const index = join(d, 'model.safetensors.index.json');
      const json = JSON.parse(readFileSync(index, 'utf8'));
      delete json.weight_map['lm_head.weight'];
      writeFileSync(index, JSON.stringify(json));
      const config = JSON.parse(readFileSync(join(d, 'config.json'), 'utf8'));
      writeFileSync(
        join(d, 'config.json'),
        JSON.stringify({ ...config, tie_word_embeddings: tied }),
      );
    });

  it('takes the embedding when config.json says the two are tied', () => {
    const got = loadWith(withoutHead('head-tied', true));
    expect(
      Buffer.from(got.get('lm_head.weight')!.buffer).equals(
        Buffer.from(got.get('model.embed_tokens.weight')!.buffer),
      ),
    ).toBe(true);
  });

  it('is refused naming lm_head otherwise', () => {
    expect(() => loadWith(withoutHead('head-untied', false))).toThrow(
      /head-untied\/model\.safetensors\.index\.json: no tensor lm_head\.weight \(lfc parameter lm_head\.weight/,
    );
  });
});

describe('lfc export-hf with a bad request: one line, exit 2, nothing touched', () => {
  it('a target that is not empty', async () => {
    const target = at('taken');
    mkdirSync(target, { recursive: true });
    writeFileSync(join(target, 'keep.txt'), 'mine');
    const r = await cli('export-hf', target, '--load', at('save'), '--plan', PLAN);
    expect(r.code).toBe(2);
    expect(r.err).toMatch(/taken exists and is not empty; export into a new directory/);
    expect(readdirSync(target)).toEqual(['keep.txt']);
  });

  it('a checkpoint of another model', async () => {
    const r = await cli('export-hf', at('never'), '--load', at('save'), '--model', 'tiny-vlm');
    expect(r.code).toBe(2);
    expect(r.err).toMatch(/a checkpoint of model tiny-vlm-moe, not tiny-vlm/);
    expect(readdirSync(dir).some((f) => f.includes('never'))).toBe(false);
  });

  it('no model named, a bad shard size', async () => {
    const a = await cli('export-hf', at('never'), '--load', at('save'));
    expect(a.code).toBe(2);
    expect(a.err).toMatch(/--plan DIR or --model NAME/);
    const b = await cli(
      'export-hf',
      at('never'),
      '--load',
      at('save'),
      '--plan',
      PLAN,
      '--max-shard-size',
      'huge',
    );
    expect(b.code).toBe(2);
    expect(b.err).toMatch(/--max-shard-size must be a size like 5GB/);
  });
});
