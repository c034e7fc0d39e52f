// The sample order (runtime/data/sampler.ts): --data-path and --split parsing, every sample once
// per epoch, a fresh shuffle each epoch, Megatron's blending shares, and seek() resuming exactly.

import { describe, expect, it } from 'vitest';
import {
  parseDataPath,
  parseSplit,
  permutation,
  SampleStream,
  splitRange,
} from '../../runtime/data/sampler.js';

describe('--data-path and --split', () => {
  it('takes paths, or weight-path pairs', () => {
    expect(parseDataPath(['a.jsonl'])).toEqual([{ weight: 1, path: 'a.jsonl' }]);
    expect(parseDataPath(['a.jsonl', 'b'])).toEqual([
      { weight: 1, path: 'a.jsonl' },
      { weight: 1, path: 'b' },
    ]);
    expect(parseDataPath(['0.3', 'a.jsonl', '7', 'b'])).toEqual([
      { weight: 0.3, path: 'a.jsonl' },
      { weight: 7, path: 'b' },
    ]);
  });

  it('refuses unpaired weights, mixed forms and weights that are not positive', () => {
    expect(() => parseDataPath(['0.3', 'a', '0.7'])).toThrow(/unpaired/);
    expect(() => parseDataPath(['a', '0.5', 'b'])).toThrow(/mixes paths with weights/);
    expect(() => parseDataPath(['0', 'a'])).toThrow(/positive/);
    expect(() => parseDataPath([])).toThrow(/needs a dataset/);
  });

  it('splits contiguously, train first, and normalizes', () => {
    expect(parseSplit('98,2,0')).toEqual([0.98, 0.02, 0]);
    expect(parseSplit('1')).toEqual([1, 0, 0]);
    const s = parseSplit('8,1,1');
    expect(splitRange(100, s, 'train')).toEqual({ start: 0, end: 80 });
    expect(splitRange(100, s, 'valid')).toEqual({ start: 80, end: 90 });
    expect(splitRange(100, s, 'test')).toEqual({ start: 90, end: 100 });
    expect(() => parseSplit('a,b')).toThrow(/--split 'a,b'/);
    expect(() => parseSplit('0,0,0')).toThrow(/nothing/);
  });
});

describe('SampleStream', () => {
  it('reads every sample once per epoch, in a new order each epoch', () => {
    const n = 50;
    const s = new SampleStream([{ start: 0, end: n }], [1], 7);
    const epochs = [0, 1, 2].map(() => Array.from({ length: n }, () => s.next()));
    for (const [e, draws] of epochs.entries()) {
      expect(new Set(draws.map((d) => d.index)).size).toBe(n);
      expect(draws.every((d) => d.epoch === e)).toBe(true);
    }
    expect(epochs[0].map((d) => d.index)).not.toEqual(epochs[1].map((d) => d.index));
    expect(epochs[0].map((d) => d.index)).not.toEqual([...Array(n).keys()]);
  });

  it('offsets indices by the split range', () => {
    const s = new SampleStream([{ start: 80, end: 90 }], [1], 1);
    const idx = Array.from({ length: 10 }, () => s.next().index).sort((a, b) => a - b);
    expect(idx).toEqual([80, 81, 82, 83, 84, 85, 86, 87, 88, 89]);
  });

  it("blends by Megatron's rule: each dataset's share stays within one draw of its weight", () => {
    const s = new SampleStream(
      [
        { start: 0, end: 7 },
        { start: 0, end: 1000 },
        { start: 0, end: 30 },
      ],
      [0.2, 0.5, 0.3],
      3,
    );
    const drawn = [0, 0, 0];
    for (let k = 1; k <= 997; k++) {
      drawn[s.next().dataset]++;
      [0.2, 0.5, 0.3].forEach((w, d) => expect(Math.abs(drawn[d] - w * k)).toBeLessThan(1 + 1e-9));
    }
  });

  it('seek() continues exactly where the draws left off', () => {
    const ranges = [
      { start: 0, end: 13 },
      { start: 0, end: 5 },
    ];
    const a = new SampleStream(ranges, [2, 1], 11);
    const all = Array.from({ length: 60 }, () => a.next());
    const b = new SampleStream(ranges, [2, 1], 11);
    b.seek(37);
    expect(b.position).toBe(37);
    expect(Array.from({ length: 23 }, () => b.next())).toEqual(all.slice(37));
  });

  it('permutation depends on its keys only', () => {
    expect(permutation(20, 1, 2)).toEqual(permutation(20, 1, 2));
    expect(permutation(20, 1, 2)).not.toEqual(permutation(20, 1, 3));
  });
});
