// Training on data from disk (runtime/data/): the demo's dataset (PNG files and a JSONL, made by
// runtime/data/demo-dataset.ts) trains tiny-vlm through the tokenizer, the chat template and the
// packer; a WebDataset copy of it gives the same losses bit for bit; a batch dumped by
// --dump-step reproduces its loss on replay; a resume mid-epoch gives the same losses as the run
// straight through; and bad samples are skipped and counted, or refused under --strict-data.

import { existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { cli } from '../helpers.js';
import { configsDir, projectRoot } from '../../compiler/paths.js';
import { readSafetensors } from '../../runtime/safetensors.js';
import { demoDataset, encodePng } from '../../runtime/data/demo-dataset.js';
import { jsonlToWebDataset } from '../../runtime/data/webdataset.js';
import { train } from '../../runtime/train.js';

const dir = mkdtempSync(join(tmpdir(), 'lfc-data-'));
const PLAN = join(dir, 'plan');
const TOKENIZER = configsDir('tokenizers', 'tiny');
let jsonl = '';
let shards = '';

interface Metrics {
  step: number;
  loss: number;
  caption_loss: number;
  loss_tokens: number;
}
const metrics = (file: string): Metrics[] =>
  readFileSync(file, 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as Metrics);

/** lfc run PLAN on the data, its metrics */
async function run(name: string, data: string, ...flags: string[]): Promise<Metrics[]> {
  const file = join(dir, `${name}.jsonl`);
  const r = await cli(
    'run',
    PLAN,
    '--data-path',
    data,
    '--tokenizer-model',
    TOKENIZER,
    '--metrics',
    file,
    '--seed',
    '3',
    '--quiet',
    ...flags,
  );
  expect(r.err).toBe('');
  expect(r.code).toBe(0);
  return metrics(file);
}

beforeAll(async () => {
  const data = await demoDataset(join(dir, 'demo'), 256, 5);
  jsonl = data.train;
  shards = join(dir, 'shards');
  await jsonlToWebDataset(jsonl, shards, 100);
  const r = await cli('compile', 'tiny-vlm', '--global-batch-size', '2', '-o', PLAN);
  expect(r.code).toBe(0);
}, 120_000);

describe('training on data from disk', () => {
  it('a WebDataset copy of the JSONL gives the same losses, bit for bit', async () => {
    const a = await run('jsonl', jsonl, '--train-iters', '4');
    const b = await run('wds', shards, '--train-iters', '4');
    expect(a.length).toBe(4);
    expect(b.map((m) => m.loss)).toEqual(a.map((m) => m.loss));
    // the chat template's reply tokens carry the loss: 7 caption words and the end of turn
    expect(a[0].loss_tokens).toBeGreaterThan(16);
  });

  it('a resume mid-epoch continues with the same losses', async () => {
    const straight = await run('straight', jsonl, '--train-iters', '6');
    const save = join(dir, 'ckpt');
    await run('first', jsonl, '--train-iters', '3', '--save', save);
    const state = JSON.parse(readFileSync(join(save, 'iter_0000003', 'state.json'), 'utf8')) as {
      data: { position: number };
    };
    expect(state.data.position).toBeGreaterThan(3 * 2 * 2); // several samples a microbatch
    const resumed = await run('resumed', jsonl, '--train-iters', '6', '--load', save);
    expect(resumed.map((m) => m.loss)).toEqual(straight.slice(3).map((m) => m.loss));
  });

  it('a batch dumped by --dump-step reproduces its loss on replay', async () => {
    const dump = join(dir, 'dump');
    const [first] = await run('dumped', jsonl, '--train-iters', '1', '--dump-step', dump);
    const weights = join(dump, 'weights.safetensors');
    const batch = join(dump, 'batch.safetensors');
    expect(existsSync(batch)).toBe(true);
    const file = join(dir, 'replay.jsonl');
    const r = await cli(
      'run',
      PLAN,
      '--batch',
      batch,
      '--weights',
      weights,
      '--train-iters',
      '1',
      '--metrics',
      file,
      '--quiet',
    );
    expect(r.code).toBe(0);
    const [replayed] = metrics(file);
    expect(replayed.loss).toBe(first.loss);
    expect(replayed.caption_loss).toBe(first.caption_loss);
  });
});

describe('evaluation on the validation split (--eval-interval)', () => {
  const evalFlags = ['--split', '90,10,0', '--train-iters', '4', '--eval-interval', '2'];
  const lines = (file: string) =>
    readFileSync(file, 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as Record<string, number | null>);

  it('every N steps and after the last, forward only: the training is the same without it', async () => {
    const file = join(dir, 'eval.jsonl');
    const r = await cli(
      'run',
      PLAN,
      '--data-path',
      jsonl,
      '--tokenizer-model',
      TOKENIZER,
      '--metrics',
      file,
      '--seed',
      '3',
      ...evalFlags,
      '--eval-iters',
      '3',
    );
    expect(r.code).toBe(0);
    expect(r.out).toMatch(
      /validation after step 4: loss \d+\.\d{4} caption \d+\.\d{3} \(3 batches, \d+ loss tokens\)/,
    );
    const all = lines(file);
    const evals = all.filter((l) => 'eval_after_step' in l);
    expect(evals.map((e) => e.eval_after_step)).toEqual([2, 4]);
    for (const e of evals) {
      expect(e.validation_batches).toBe(3);
      expect(Number.isFinite(e.validation_loss)).toBe(true);
      expect(e.validation_caption_loss).not.toBeNull();
    }
    // the same steps without the evaluations: the same losses, bit for bit
    const plain = await run('no-eval', jsonl, '--split', '90,10,0', '--train-iters', '4');
    expect(all.filter((l) => 'step' in l).map((l) => l.loss)).toEqual(plain.map((m) => m.loss));
  });

  it('reads the same batches each time: at lr 0 every evaluation gives the same loss', async () => {
    const r = await train({
      planDir: PLAN,
      trainIters: 4,
      lr: 0,
      seed: 3,
      data: {
        sources: [{ weight: 1, path: jsonl }],
        split: [0.9, 0.1, 0],
        tokenizer: TOKENIZER,
        phase: 'sft',
      },
      evalInterval: 2,
      evalIters: 2,
    });
    expect(r.evals.map((e) => e.step)).toEqual([2, 4]);
    expect(r.evals[1].loss).toBe(r.evals[0].loss);
    expect(r.evals[1].captionLoss).toBe(r.evals[0].captionLoss);
  });

  it.each([
    [['--eval-interval', '2'], '--eval-interval evaluates on the validation split of --data-path'],
    [['--eval-iters', '2'], '--eval-iters needs --eval-interval N'],
    [
      ['--data-path', 'DATA', '--tokenizer-model', TOKENIZER, '--eval-interval', '2'],
      '--eval-interval needs a validation split: the split gives it nothing (train 100%, test 0%); e.g. --split 98,2,0',
    ],
  ])('%j is refused, one line, exit 2', async (flags, message) => {
    const r = await cli('run', PLAN, ...flags.map((f) => (f === 'DATA' ? jsonl : f)), '--quiet');
    expect(r.code).toBe(2);
    expect(r.err).toContain(message);
    expect(r.err.trim().split('\n')).toHaveLength(1);
  });
});

describe('the Qwen presets on data', () => {
  it.each(['qwen2.5-vl-tiny', 'qwen3-vl-moe-tiny'])(
    '%s with a byte-level BPE tokenizer: M-RoPE ids per sample, and its dump replays',
    async (model) => {
      const plan = join(dir, model);
      const c = await cli('compile', model, '--global-batch-size', '2', '-o', plan);
      expect(c.code).toBe(0);
      const dump = join(plan, 'dump');
      const file = join(plan, 'data-metrics.jsonl');
      const bpe = join(projectRoot(), 'test/fixtures/tokenizers/bpe-tiny');
      const r = await cli(
        'run',
        plan,
        '--data-path',
        jsonl,
        '--tokenizer-model',
        bpe,
        '--train-iters',
        '1',
        '--dump-step',
        dump,
        '--metrics',
        file,
        '--quiet',
      );
      expect(r.err).toBe('');
      expect(r.code).toBe(0);
      const [first] = metrics(file);
      // the batch in the contract's form: patches, grids, [3, S] positions, the tokenizer's id
      const batch = readSafetensors(join(dump, 'batch.safetensors')).tensors;
      expect(batch.get('mb0.positions')!.shape).toEqual([3, 128]);
      expect(batch.get('mb0.image_grid_thw')!.shape[1]).toBe(3);
      expect([...(batch.get('mb0.image_token_id')!.data as Int32Array)]).toEqual([412]);
      const replay = join(plan, 'replay.jsonl');
      const p = await cli(
        'run',
        plan,
        '--batch',
        join(dump, 'batch.safetensors'),
        '--weights',
        join(dump, 'weights.safetensors'),
        '--train-iters',
        '1',
        '--metrics',
        replay,
        '--quiet',
      );
      expect(p.err).toBe('');
      expect(metrics(replay)[0].loss).toBe(first.loss);
    },
    120_000,
  );
});

describe('bad samples', () => {
  let bad = '';
  beforeAll(() => {
    const good = readFileSync(jsonl, 'utf8').trim().split('\n');
    const png = encodePng(new Uint8Array(8 * 8 * 3).fill(200), 8, 8);
    writeFileSync(join(dir, 'demo', 'broken.png'), Buffer.from('not an image'));
    writeFileSync(join(dir, 'demo', 'ok.png'), png);
    // a header that reads, data that does not: found only when the image is decoded
    const big = encodePng(
      new Uint8Array(32 * 32 * 3).map((_, i) => (i * 37) & 255),
      32,
      32,
    );
    writeFileSync(join(dir, 'demo', 'truncated.png'), big.subarray(0, 60));
    const conv = (user: string, reply = 'red square') => [
      { from: 'human', value: user },
      { from: 'gpt', value: reply },
    ];
    const lines = [
      ...good.slice(0, 40),
      '{"image": "images/000001.png", "conversations": [', // line 41: not JSON
      JSON.stringify({ image: 'images/nonesuch.png', conversations: conv('<image>\ndescribe') }),
      JSON.stringify({ image: 'broken.png', conversations: conv('<image>\ndescribe') }),
      JSON.stringify({ image: 'ok.png', conversations: conv('describe, no marker') }),
      JSON.stringify({
        image: 'ok.png',
        conversations: [{ from: 'human', value: '<image>\ndescribe' }],
      }),
      JSON.stringify({ image: 'truncated.png', conversations: conv('<image>\ndescribe') }),
      ...good.slice(40),
    ];
    bad = join(dir, 'demo', 'bad.jsonl');
    writeFileSync(bad, lines.join('\n') + '\n');
  });

  /** 40 steps on the bad data: more than an epoch, so every bad sample is drawn */
  const runOnBad = (metricsFile: string, ...flags: string[]) =>
    cli(
      'run',
      PLAN,
      '--data-path',
      bad,
      '--tokenizer-model',
      TOKENIZER,
      '--train-iters',
      '40',
      '--metrics',
      metricsFile,
      '--quiet',
      ...flags,
    );

  it('are skipped and counted by default, each named by file and line', async () => {
    const r = await runOnBad(join(dir, 'bad-metrics.jsonl'));
    expect(r.err).toBe('');
    expect(r.code).toBe(0);
    // counted each time they are drawn: the 40 steps read more than one epoch
    expect(Number(/(\d+) bad samples skipped/.exec(r.out)?.[1])).toBeGreaterThanOrEqual(6);
    expect(r.out).toMatch(/bad\.jsonl:41: not JSON/);
    expect(r.out).toMatch(/bad\.jsonl:42: image .*nonesuch\.png/);
    expect(r.out).toMatch(/bad\.jsonl:43.*broken\.png.*cannot decode/);
    expect(r.out).toMatch(/bad\.jsonl:44: .*0 <image> markers?, 1 image/);
    expect(r.out).toMatch(/bad\.jsonl:45: no loss token/);
    expect(r.out).toMatch(/bad\.jsonl:46: image .*truncated\.png: cannot decode .*blank image/);
  });

  it('--strict-data: the first is an error, one line, exit 2', async () => {
    const metricsFile = join(dir, 'strict-metrics.jsonl');
    writeFileSync(metricsFile, '{"kept": true}\n');
    const r = await runOnBad(metricsFile, '--strict-data');
    expect(r.code).toBe(2);
    expect(r.err.trim().split('\n')).toHaveLength(1);
    expect(r.err).toMatch(/^lfc: error: .*bad\.jsonl:4[1-6]: /);
    // what was written before is kept
    expect(readFileSync(metricsFile, 'utf8').startsWith('{"kept": true}\n')).toBe(true);
  });
});
