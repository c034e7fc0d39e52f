// lfc data stats: the demo's dataset read as training reads it (every sample one image of the
// demo's sizes, its reply's loss tokens), the data profile it writes compiles a plan, and the
// errors of a bad invocation are one line.

import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import YAML from 'yaml';
import { cli } from '../helpers.js';
import { configsDir } from '../../compiler/paths.js';
import { demoDataset } from '../../runtime/data/demo-dataset.js';

const dir = mkdtempSync(join(tmpdir(), 'lfc-data-stats-'));
let jsonl = '';

beforeAll(async () => {
  jsonl = (await demoDataset(join(dir, 'demo'), 200, 2)).train;
});

describe('lfc data stats', () => {
  it('prints what the data holds and writes a profile lfc compile takes', async () => {
    const profile = join(dir, 'demo-profile.yaml');
    const r = await cli(
      'data',
      'stats',
      jsonl,
      '--tokenizer-model',
      configsDir('tokenizers', 'tiny'),
      '--profile',
      profile,
      '--quiet',
    );
    expect(r.err).toBe('');
    expect(r.code).toBe(0);
    expect(r.out).toMatch(/200 samples read of 200 \(train split\)/);
    expect(r.out).toMatch(/bad 0, dropped 0/);
    expect(r.out).toMatch(/images per sample\s+1 100\.0%/);
    // the reply: 7 words and the end of turn
    expect(r.out).toMatch(/loss tokens\s+mean 8, median 8, p90 8, max 8/);
    const doc = YAML.parse(readFileSync(profile, 'utf8')) as {
      images_per_sample: Record<string, number>;
      image_resolution: Record<string, number>;
      caps: { max_visual_tokens: number };
    };
    expect(doc.images_per_sample).toEqual({ 1: 1 });
    // the demo's sizes, 8a × 8b: at most 16 of them
    for (const key of Object.keys(doc.image_resolution))
      expect(key).toMatch(/^(8|16|24|32)x(8|16|24|32)$/);
    const c = await cli('compile', 'tiny-vlm', '--data-profile', profile, '-o', join(dir, 'plan'));
    expect(c.err).toBe('');
    expect(c.code).toBe(0);
  });

  it('needs a tokenizer, and names a missing dataset', async () => {
    const a = await cli('data', 'stats', jsonl);
    expect(a.code).toBe(2);
    expect(a.err).toMatch(/^lfc: error: lfc data stats needs --tokenizer-model/);
    const b = await cli(
      'data',
      'stats',
      join(dir, 'nonesuch.jsonl'),
      '--tokenizer-model',
      configsDir('tokenizers', 'tiny'),
    );
    expect(b.code).toBe(2);
    expect(b.err.trim().split('\n')).toHaveLength(1);
    expect(b.err).toMatch(/nonesuch\.jsonl/);
  });
});
