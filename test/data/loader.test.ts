// The loader (runtime/data/loader.ts) in this thread on small hand-made datasets: text-only
// samples beside image samples, an image too large for the visual bound shrunk to fit, samples
// too long dropped or cut, a blend drawn by its weights, and tokenizers refused at start.

import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { imageProcessorOf } from '../../compiler/frontend/data-profile.js';
import { loadModelConfig } from '../../compiler/frontend/config.js';
import { configsDir } from '../../compiler/paths.js';
import { encodePng } from '../../runtime/data/demo-dataset.js';
import { DataLoader, type LoaderOptions } from '../../runtime/data/loader.js';

const dir = mkdtempSync(join(tmpdir(), 'lfc-loader-'));
const TINY = configsDir('tokenizers', 'tiny');
const encoder = loadModelConfig('tiny-vlm', []).model.image_encoder;

function image(name: string, w: number, h: number): string {
  const rgb = new Uint8Array(w * h * 3).map((_, i) => (i * 7) & 255);
  writeFileSync(join(dir, name), encodePng(rgb, w, h));
  return name;
}

function jsonl(name: string, lines: object[]): string {
  const path = join(dir, name);
  writeFileSync(path, lines.map((l) => JSON.stringify(l)).join('\n') + '\n');
  return path;
}

const turns = (user: string, reply: string) => [
  { from: 'human', value: user },
  { from: 'gpt', value: reply },
];

function options(paths: string[], over: Partial<LoaderOptions> = {}): LoaderOptions {
  return {
    sources: paths.map((path) => ({ weight: 1, path })),
    split: [1, 0, 0],
    part: 'train',
    tokenizer: TINY,
    phase: 'sft',
    seed: 1,
    bounds: { seqLength: 64, maxVisualTokens: 64 },
    globalMicrobatches: 1,
    perReplica: 1,
    replica: 0,
    processor: imageProcessorOf(encoder),
    vocabSize: 512,
    encodes: () => true,
    ...over,
  };
}

describe('the loader', () => {
  it('packs text-only samples beside image samples', async () => {
    const path = jsonl('mixed.jsonl', [
      { image: image('a.png', 16, 8), conversations: turns('<image>\ndescribe', 'red square') },
      { conversations: turns('what is the colour of the sky', 'blue') },
      { image: image('b.png', 8, 8), conversations: turns('<image>\ndescribe', 'green square') },
    ]);
    const loader = await DataLoader.open(
      options([path], { bounds: { seqLength: 40, maxVisualTokens: 64 } }),
    );
    const { microbatches, samples } = await loader.nextStep();
    const mb = microbatches[0];
    expect(samples[0].map((s) => s.index).sort()).toEqual([0, 1, 2]);
    // two images, 2 + 1 merged tokens, each [3, h, w] as processed
    expect(mb.images.map((im) => [im.height, im.width])).toEqual(
      samples[0].filter((s) => s.index !== 1).map((s) => (s.index === 0 ? [8, 16] : [8, 8])),
    );
    let placeholders = 0;
    for (const t of mb.tokens) placeholders += +(t === 1);
    expect(placeholders).toBe(3);
    expect(loader.counts).toMatchObject({ packed: 3, bad: 0, dropped: 0 });
  });

  it('shrinks an image whose visual tokens alone pass the bound, and counts it', async () => {
    const path = jsonl('big.jsonl', [
      { image: image('big.png', 32, 32), conversations: turns('<image>\ndescribe', 'red square') },
    ]);
    const loader = await DataLoader.open(
      options([path], { bounds: { seqLength: 64, maxVisualTokens: 4 } }),
    );
    const mb = (await loader.nextStep()).microbatches[0];
    // 32×32 is 16 merged tokens; at most 4: 16×16
    expect(mb.images.map((im) => [im.height, im.width])).toEqual([[16, 16]]);
    expect(loader.counts.shrunk).toBeGreaterThanOrEqual(1);
  });

  it('drops a sample longer than the sequence, or cuts it with truncate', async () => {
    const long = Array.from({ length: 80 }, () => 'red').join(' ');
    const path = jsonl('long.jsonl', [
      { conversations: turns('describe', long) },
      { conversations: turns('describe', 'blue') },
    ]);
    const dropping = await DataLoader.open(options([path]));
    await dropping.nextStep();
    expect(dropping.counts.dropped).toBeGreaterThanOrEqual(1);
    expect(dropping.counts.examples[0]).toMatch(/long\.jsonl:1: \d+ tokens .* do not fit/);
    const cutting = await DataLoader.open(options([path], { truncate: true }));
    const { microbatches, samples } = await cutting.nextStep();
    expect(cutting.counts.truncated).toBeGreaterThanOrEqual(1);
    expect(cutting.counts.dropped).toBe(0);
    expect(samples[0].some((s) => s.index === 0)).toBe(true);
    expect(microbatches[0].segments.every((s) => s >= 0)).toBe(true); // 64 tokens, all used
  });

  it('draws a blend by its weights', async () => {
    const a = jsonl(
      'a.jsonl',
      Array.from({ length: 10 }, () => ({ conversations: turns('a', 'red') })),
    );
    const b = jsonl(
      'b.jsonl',
      Array.from({ length: 10 }, () => ({ conversations: turns('b', 'blue') })),
    );
    const loader = await DataLoader.open({
      ...options([a, b]),
      sources: [
        { weight: 3, path: a },
        { weight: 1, path: b },
      ],
    });
    const drawn = [0, 0];
    for (let k = 0; k < 5; k++)
      for (const mb of (await loader.nextStep()).samples) for (const s of mb) drawn[s.dataset]++;
    const total = drawn[0] + drawn[1];
    expect(Math.abs(drawn[0] - 0.75 * total)).toBeLessThanOrEqual(1);
  });

  it('refuses, at start, a tokenizer with more ids than the model has', async () => {
    const path = jsonl('one.jsonl', [{ conversations: turns('a', 'red') }]);
    await expect(DataLoader.open(options([path], { vocabSize: 100 }))).rejects.toThrow(
      /--tokenizer-model .*tokenizer\.json has 508 ids; the model's vocabulary has 100/,
    );
  });
});
