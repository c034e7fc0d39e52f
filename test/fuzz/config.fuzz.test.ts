// Property tests of the config loaders (compiler/frontend/config.ts and friends): Hydra-style
// overrides on the presets, a model YAML file, a data profile (--data-profile FILE) and a Hugging
// Face config.json, each edited structurally (keys dropped, added, given wrong types, extreme
// numbers, NaN). The loader accepts, or throws a UserError of one line naming the file or key.
import fc from 'fast-check';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import YAML from 'yaml';
import { describe, expect, it } from 'vitest';
import { loadModelConfig } from '../../compiler/frontend/config.js';
import { loadDataProfile } from '../../compiler/frontend/data-profile.js';
import { hfConfigOf, loadHfModelConfig } from '../../compiler/frontend/hf-config.js';
import { projectRoot } from '../../compiler/paths.js';
import { expectAcceptOrUserError, jsonEdits, limitMs, mutateJson, runs } from './fuzz.js';

const dir = mkdtempSync(join(tmpdir(), 'lfc-fuzz-config-'));
const PRESETS = ['tiny-vlm', 'tiny-vlm-moe', 'qwen2.5-vl-tiny', 'qwen3-vl-moe-tiny'];

/** Every key path of a preset's composed config, as an override names it. */
function keyPaths(preset: string): string[] {
  const c = loadModelConfig(preset);
  const out: string[] = ['name', 'aliases', 'model', 'training', 'defaults'];
  const walk = (v: unknown, at: string): void => {
    out.push(at);
    if (v && typeof v === 'object' && !Array.isArray(v))
      for (const [k, x] of Object.entries(v)) walk(x, `${at}.${k}`);
  };
  walk(c.model, 'model');
  walk(c.training, 'training');
  return out;
}
const KEYS = [...new Set(PRESETS.flatMap(keyPaths))];

/** YAML text an override's value may be. */
const VALUES = [
  '0',
  '-1',
  '1',
  '3',
  '64',
  '1.5',
  '1e308',
  '-1e308',
  '.nan',
  '.inf',
  '-.inf',
  'null',
  '~',
  'true',
  '[]',
  '{}',
  '[1, 2]',
  '[0, 0, 0]',
  '{a: 1}',
  'abc',
  '"x"',
  '2147483648',
  '9007199254740993',
  '1000000000',
  '',
  'x\ny',
  '[',
  ': :',
  'zeros',
  'gelu',
  'layernorm',
  'rmsnorm',
];

const key = fc.oneof(
  fc.constantFrom(...KEYS),
  // a typo, a path one level too deep, a key that is not there
  fc.tuple(fc.constantFrom(...KEYS), fc.nat()).map(([k, n]) => {
    const i = n % k.length;
    return k.slice(0, i) + k.slice(i + 1);
  }),
  fc.constantFrom(...KEYS).map((k) => `${k}.extra`),
  fc.stringMatching(/^[a-z_.]{1,12}$/),
);
const value = fc.oneof(fc.constantFrom(...VALUES), fc.string({ maxLength: 10 }));
const override = fc.oneof(
  {
    weight: 8,
    arbitrary: fc
      .tuple(fc.constantFrom('', '', '', '+', '++', '~'), key, value)
      .map(([prefix, k, v]) => (prefix === '~' ? `~${k}` : `${prefix}${k}=${v}`)),
  },
  { weight: 1, arbitrary: fc.string({ maxLength: 12 }) },
);

function writeYaml(name: string, doc: unknown): string {
  const path = join(dir, name);
  writeFileSync(path, YAML.stringify(doc));
  return path;
}

describe('config loaders under mutation', () => {
  it(
    'overrides on the presets',
    () => {
      fc.assert(
        fc.property(
          fc.constantFrom(...PRESETS),
          fc.array(override, { minLength: 1, maxLength: 3 }),
          (p, os) => {
            expectAcceptOrUserError(() => loadModelConfig(p, os));
          },
        ),
        runs(250),
      );
    },
    limitMs(600, 60),
  );

  it(
    'a model YAML file with every field spelled out, edited',
    () => {
      const docs = PRESETS.map((p) => {
        const c = loadModelConfig(p);
        return { name: `fuzz-${p}`, model: c.model, training: c.training };
      });
      fc.assert(
        fc.property(fc.nat(docs.length - 1), jsonEdits(3), (i, edits) => {
          const path = writeYaml('model.yaml', mutateJson(docs[i], edits));
          expectAcceptOrUserError(() => loadModelConfig(path));
        }),
        runs(150),
      );
    },
    limitMs(300, 80),
  );

  it(
    'a preset file with its defaults, edited',
    () => {
      const docs = PRESETS.map(
        (p) =>
          YAML.parse(
            readFileSync(join(projectRoot(), 'configs/models', `${p}.yaml`), 'utf8'),
          ) as unknown,
      );
      fc.assert(
        fc.property(fc.nat(docs.length - 1), jsonEdits(2), (i, edits) => {
          const path = writeYaml('preset.yaml', mutateJson(docs[i], edits));
          expectAcceptOrUserError(() => loadModelConfig(path));
        }),
        runs(200),
      );
    },
    limitMs(200, 80),
  );

  it(
    'a data profile, edited',
    () => {
      const docs = ['default', 'sft-multi-image', 'article', 'caption', 'synthetic'].map(
        (p) =>
          YAML.parse(
            readFileSync(join(projectRoot(), 'configs/data', `${p}.yaml`), 'utf8'),
          ) as unknown,
      );
      fc.assert(
        fc.property(fc.nat(docs.length - 1), jsonEdits(3), (i, edits) => {
          const path = writeYaml('profile.yaml', mutateJson(docs[i], edits));
          expectAcceptOrUserError(() => loadDataProfile(path));
        }),
        runs(300),
      );
    },
    limitMs(300, 60),
  );

  it(
    'a Hugging Face config.json, edited',
    () => {
      const docs = ['qwen2.5-vl-tiny', 'qwen3-vl-moe-tiny'].map(
        (p) => hfConfigOf(loadModelConfig(p).model, 'float32').json as unknown,
      );
      const path = join(dir, 'config.json');
      fc.assert(
        fc.property(fc.nat(docs.length - 1), jsonEdits(3), (i, edits) => {
          writeFileSync(path, JSON.stringify(mutateJson(docs[i], edits)));
          expectAcceptOrUserError(() => loadHfModelConfig(path));
        }),
        runs(300),
      );
    },
    limitMs(300, 80),
  );

  it('regressions', async () => {
    // a line break in an override was a two-line message; aliases=5 a TypeError
    expect(() => loadModelConfig('tiny-vlm', ['x=a\nb'])).toThrow(
      /^override 'x=a\\nb': no key 'x'/,
    );
    expect(() => loadModelConfig('tiny-vlm', ['aliases=5'])).toThrow(
      /aliases must be a list of names/,
    );
    expect(() => loadModelConfig('tiny-vlm', ['~aliases'])).toThrow(
      /aliases must be a list of names/,
    );
    // a part name or an HF architecture with a line break (campaign, seed 7)
    const preset = writeYaml('regression.yaml', {
      name: 'r',
      defaults: { image_projector: 'x\ny' },
    });
    expect(() => loadModelConfig(preset)).toThrow(/no image_projector config 'x\\ny'/);
    // a YAML tag in a value printed a YAMLWarning on stderr besides the error line
    const warnings: unknown[] = [];
    const onWarning = (w: unknown) => warnings.push(w);
    process.on('warning', onWarning);
    try {
      expect(() => loadModelConfig('tiny-vlm', ['model.text_decoder.num_layers=!L6'])).toThrow(
        /num_layers: must be a positive integer/,
      );
      await new Promise((resolve) => setImmediate(resolve)); // warnings come on the next tick
    } finally {
      process.off('warning', onWarning);
    }
    expect(warnings).toEqual([]);
    // an architecture named after a key of Object's prototype was taken for a known one, and its
    // base preset for a name: a TypeError (campaign, seed 34)
    const qwen = hfConfigOf(loadModelConfig('qwen3-vl-moe-tiny').model, 'float32').json;
    for (const arch of ['__proto__', 'constructor', 'toString']) {
      const path = join(dir, 'config.json');
      writeFileSync(path, JSON.stringify({ ...qwen, architectures: [arch] }));
      expect(() => loadHfModelConfig(path)).toThrow(
        new RegExp(`architecture ${arch} is not one lfc builds`),
      );
    }
  });
});
