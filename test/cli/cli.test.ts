// The CLI in-process: user errors are one line naming the problem with exit code 2; help works
// on every command; inspect prints a table and JSON.
import { existsSync, mkdtempSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { makeProgram } from '../../cli/index.js';
import { makeDirs } from '../../compiler/files.js';
import { cli } from '../helpers.js';

const dir = mkdtempSync(join(tmpdir(), 'lfc-cli-'));
const malformed = join(dir, 'broken.yaml');
writeFileSync(
  malformed,
  'name: broken\ndefaults:\n  image_encoder: tiny_vit\n   text_decoder: [unclosed\n',
);
const badPart = join(dir, 'badpart.yaml');
writeFileSync(
  badPart,
  'name: badpart\ndefaults:\n  image_encoder: tiny_vitt\n  image_projector: patch_merger\n  text_decoder: tiny_dense\n',
);

const USER_ERRORS: [string, string[], RegExp][] = [
  ['malformed YAML', ['inspect', malformed], /broken\.yaml: malformed YAML/],
  [
    'unknown part in a file',
    ['inspect', badPart],
    /defaults\.image_encoder: no image_encoder config 'tiny_vitt' \(did you mean 'tiny_vit'\?\)/,
  ],
  ['missing file', ['inspect', join(dir, 'nope.yaml')], /model file .*nope\.yaml does not exist/],
  [
    'unknown preset',
    ['inspect', 'tiny-vlm-mo'],
    /unknown model 'tiny-vlm-mo' \(did you mean 'tiny-vlm-moe'\?\)/,
  ],
  [
    'bad override key',
    ['inspect', 'tiny-vlm', 'model.text_decoder.hiden_size=64'],
    /no key 'model\.text_decoder\.hiden_size' \(did you mean 'hidden_size'\?\)/,
  ],
  [
    'bad override group',
    ['inspect', 'tiny-vlm', 'model.txt_decoder.hidden_size=64'],
    /no config group 'model\.txt_decoder' \(did you mean 'text_decoder'\?\)/,
  ],
  [
    'bad override value',
    ['inspect', 'tiny-vlm', 'model.image_encoder.freeze=maybe'],
    /model\.image_encoder\.freeze: must be true or false, got "maybe"/,
  ],
  [
    'negative size',
    ['inspect', 'tiny-vlm', 'model.text_decoder.num_layers=-2'],
    /model\.text_decoder\.num_layers: must be a positive integer, got -2/,
  ],
  [
    'zero size',
    ['inspect', 'tiny-vlm', 'model.image_encoder.hidden_size=0'],
    /model\.image_encoder\.hidden_size: must be a positive integer, got 0/,
  ],
  [
    'non-numeric size',
    ['inspect', 'tiny-vlm', 'model.text_decoder.vocab_size=big'],
    /vocab_size: must be a positive integer, got "big"/,
  ],
  [
    'inconsistent heads',
    ['inspect', 'tiny-vlm', 'model.text_decoder.num_query_groups=3'],
    /num_attention_heads 8 is not a multiple of num_query_groups 3/,
  ],
  [
    'malformed override',
    ['inspect', 'tiny-vlm', 'model.text_decoder.num_layers'],
    /override 'model.text_decoder.num_layers': missing '=value'/,
  ],
  [
    'bad flag value',
    ['inspect', 'tiny-vlm', '--seq-length', '-5'],
    /--seq-length must be a positive integer, got '-5'/,
  ],
  [
    'bad image size',
    ['inspect', 'tiny-vlm', '--image-size', '30x32'],
    /image size 30x32: both sides must be multiples of patch × merge = 8/,
  ],
  ['unknown option', ['inspect', 'tiny-vlm', '--bogus'], /unknown option '--bogus'/],
  ['unknown command', ['inspekt'], /unknown command 'inspekt'/],
  ['no model', ['inspect'], /name a model/],
];

describe('user errors: one line, exit code 2', () => {
  it.each(USER_ERRORS)('%s', async (_what, argv, message) => {
    const r = await cli(...argv);
    expect(r.code).toBe(2);
    expect(r.out).toBe('');
    expect(r.err).toMatch(message);
    expect(r.err.trim().split('\n')).toHaveLength(1);
    expect(r.err).not.toMatch(/\n\s+at /); // no stack trace
  });
});

describe('an output path under a file: refused before any work, one line, exit code 2', () => {
  // the operating system refused it once the plan was made (ENOTDIR, exit 1); cli/options.ts
  // checkOutputPath now names the flag and the file in the way first
  it('compile -o under a regular file', async () => {
    const r = await cli('compile', 'tiny-vlm', '-o', join(malformed, 'plan'));
    expect(r.code).toBe(2);
    expect(r.err).toMatch(/^lfc: error: -o .*: .*broken\.yaml is a file, not a directory/);
    expect(r.err.trim().split('\n')).toHaveLength(1);
  });
});

describe('an output directory that takes no entries: refused before any work', () => {
  // /proc/self is a directory in which mkdir fails with ENOENT; node's recursive mkdir then never
  // returned (compiler/files.ts makeDirs), so `compile -o /proc/self/lfc-plan` hung after its work
  it.runIf(existsSync('/proc/self'))('compile -o /proc/self/lfc-plan', async () => {
    const r = await cli('compile', 'tiny-vlm', '-o', '/proc/self/lfc-plan');
    expect(r.code).toBe(2);
    expect(r.err).toMatch(/^lfc: error: -o \/proc\/self\/lfc-plan: cannot write in \/proc\/self/);
    expect(r.err.trim().split('\n')).toHaveLength(1);
  });
});

describe('makeDirs', () => {
  it('makes the missing directories and accepts those there', () => {
    const deep = join(dir, 'a', 'b', 'c');
    makeDirs(deep);
    expect(statSync(deep).isDirectory()).toBe(true);
    makeDirs(deep);
    makeDirs(join(dir, 'a'));
  });
  it('throws the system error under a file', () => {
    expect(() => makeDirs(join(malformed, 'x', 'y'))).toThrow(/EEXIST|ENOTDIR/);
  });
  it.runIf(existsSync('/proc/self'))('throws where mkdir is refused with ENOENT', () => {
    expect(() => makeDirs('/proc/self/lfc-x/y')).toThrow(/ENOENT/);
  });
});

describe('help', () => {
  const commands = makeProgram({ out: () => {}, err: () => {} }).commands.map((c) => c.name());
  it.each(['', ...commands])('lfc %s --help', async (command) => {
    const r = await cli(...(command ? [command] : []), '--help');
    expect(r.code).toBe(0);
    expect(r.out).toMatch(/Usage: lfc/);
  });
});

describe('inspect', () => {
  it('prints the per-module table', async () => {
    const r = await cli('inspect', 'tiny-vlm-moe');
    expect(r.code).toBe(0);
    expect(r.out).toMatch(/image_encoder\s+104,128/);
    expect(r.out).toMatch(/active \/ token/);
  });
  it('takes LoongForge names with --model-name, and overrides', async () => {
    const r = await cli(
      'inspect',
      '--model-name',
      'qwen3_vl_30b_a3b',
      '--json',
      '+model.image_encoder.freeze=True',
    );
    expect(r.code).toBe(0);
    const j = JSON.parse(r.out);
    expect(j.model).toBe('qwen3-vl-30b-a3b');
    expect(j.params.text_decoder.total).toBe(30_532_122_624);
    expect(j.params.image_encoder.trainable).toBe(0);
    expect(j.memory.optimizerBytes).toBe(8 * j.params.total.trainable);
  });
  it('FLOPs per text token follow the convention (hand count, tiny-vlm)', async () => {
    const r = await cli('inspect', 'tiny-vlm', '--json', '--seq-length', '128');
    const j = JSON.parse(r.out);
    // per token forward: linears 2·(params of q,k,v,o + mlp) per layer + lm_head; attention causal 2·S·nh·d per layer
    const perLayerLinear = 2 * (128 * 128 + 2 * 128 * 64 + 128 * 128 + 3 * 128 * 384);
    const perLayerAttn = 2 * 128 * 8 * 16;
    const forward = 4 * (perLayerLinear + perLayerAttn) + 2 * 128 * 512;
    expect(j.flops.perTextToken).toBeCloseTo(3 * forward, 6);
  });
  it('FLOPs per image follow the convention (hand count, tiny-vlm, 32x32)', async () => {
    const j = JSON.parse((await cli('inspect', 'tiny-vlm', '--json', '--image-size', '32x32')).out);
    const np = 64;
    const block = 2 * np * (64 * 192 + 64 * 64 + 2 * 64 * 256) + 4 * np * np * 64;
    const forward = 2 * np * 48 * 64 + 2 * block + 2 * 16 * (256 * 256 + 256 * 128);
    expect(j.flops.image).toEqual({ height: 32, width: 32, patches: 64, visualTokens: 16 });
    expect(j.flops.perImage).toBe(3 * forward);
  });
  it('--print-ir prints the graph text', async () => {
    const r = await cli('inspect', 'tiny-vlm', '--print-ir');
    expect(r.out).toMatch(/^graph "tiny-vlm" \{/);
    expect(r.out).toMatch(/cross_entropy\(/);
  });
});

describe('compile status', () => {
  const compileWith = async (isTTY: boolean) => {
    let out = '';
    let err = '';
    const program = makeProgram({ out: (t) => (out += t), err: (t) => (err += t) }, () => isTTY);
    const plan = join(dir, `status-${isTTY}`);
    await program.parseAsync(
      ['compile', 'tiny-vlm', '--nproc-per-node', '2', '--pp', '2', '-o', plan],
      {
        from: 'user',
      },
    );
    return { out, err, plan };
  };

  it('on a terminal: one redrawn line naming each phase on stderr, cleared before the report', async () => {
    const { out, err, plan } = await compileWith(true);
    const phases = err.split('\r\x1b[2K').filter(Boolean);
    expect(phases.map((p) => p.replace(/… \([\d.]+ s\)$/, ''))).toEqual([
      'lfc compile: graph passes',
      'lfc compile: emitting program p0 (stage 1 of 2)',
      'lfc compile: emitting program p1 (stage 2 of 2)',
      'lfc compile: verifying the plan (2 programs)',
      'lfc compile: simulating the step',
      `lfc compile: writing ${plan}`,
    ]);
    expect(err.endsWith('\r\x1b[2K')).toBe(true);
    expect(out).toMatch(/^compiled tiny-vlm for 2 ranks/);
  });

  it('elsewhere: nothing on stderr, the same report', async () => {
    const tty = await compileWith(true);
    const piped = await compileWith(false);
    expect(piped.err).toBe('');
    const same = (r: { out: string; plan: string }) =>
      r.out.replaceAll(r.plan, 'PLAN').replace(/verified in [\d.]+ s/, 'verified in T s');
    expect(same(piped)).toBe(same(tty));
  });
});
