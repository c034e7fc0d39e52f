// Packing (runtime/data/packer.ts): the batch contract's arrays at sample boundaries, written out
// by hand for two samples and padding; truncation before an image it would cut; the fit rule.

import { describe, expect, it } from 'vitest';
import { assemble, fits, truncated, type PackedSample } from '../../runtime/data/packer.js';

const sample = (
  position: number,
  tokens: number[],
  target: number[],
  reply: number[],
  grids: [number, number, number][] = [],
): PackedSample => ({
  position,
  tokens: Int32Array.from(tokens),
  target: Uint8Array.from(target),
  reply: Uint8Array.from(reply),
  grids,
  visual: grids.reduce((a, [t, h, w]) => a + (t * h * w) / 4, 0),
});

// sample A: bos, image (one merged token of a 2×2 patch grid, id 1), 7 8 | reply 9, end 5
const A = sample(0, [3, 1, 7, 8, 9, 5], [0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 1, 0], [[1, 2, 2]]);
// sample B: text only, 3 4 6 with targets on 4 and 6
const B = sample(1, [3, 4, 6], [0, 1, 1], [0, 1, 1]);

describe('assemble', () => {
  it('labels, loss mask, segments and positions at the boundaries, by hand', () => {
    const mb = assemble([A, B], 12, { imageTokenId: 1, images: [] });
    expect([...mb.tokens]).toEqual([3, 1, 7, 8, 9, 5, 3, 4, 6, 0, 0, 0]);
    // label i: token i + 1 where it is a target of the same sample; none across A|B nor at the end
    expect([...mb.labels]).toEqual([0, 7, 8, 9, 5, 0, 4, 6, 0, 0, 0, 0]);
    expect([...mb.lossMask]).toEqual([0, 1, 1, 1, 1, 0, 1, 1, 0, 0, 0, 0]);
    expect([...mb.captionMask!]).toEqual([0, 0, 0, 1, 0, 0, 1, 1, 0, 0, 0, 0]);
    expect([...mb.segments]).toEqual([0, 0, 0, 0, 0, 0, 1, 1, 1, -1, -1, -1]);
    expect([...mb.positions]).toEqual([0, 1, 2, 3, 4, 5, 0, 1, 2, 0, 0, 0]);
    expect(mb.imageTokenId).toBe(1);
  });

  it('without images (a rank that does not encode), the grids stand for them', () => {
    const mb = assemble([A, B], 12, { imageTokenId: 1 });
    expect([...mb.grids!]).toEqual([1, 2, 2]);
    expect(mb.pixelValues!.length).toBe(0);
    expect(mb.images).toEqual([]);
  });

  it('passes tokens, segments and grids to ropeIndex for M-RoPE positions', () => {
    const seen: number[][] = [];
    const mb = assemble([A], 8, {
      imageTokenId: 1,
      ropeIndex: (t, s, g) => {
        seen.push([...t], [...s], [...g]);
        return new Int32Array(24).fill(7);
      },
    });
    expect(seen).toEqual([
      [3, 1, 7, 8, 9, 5, 0, 0],
      [0, 0, 0, 0, 0, 0, -1, -1],
      [1, 2, 2],
    ]);
    expect(mb.positions.length).toBe(24);
  });

  it('refuses to pack past the sequence', () => {
    expect(() => assemble([A, B], 8, { imageTokenId: 1 })).toThrow(/packed 9 tokens/);
  });
});

describe('fits and truncated', () => {
  it('a sample fits while both tokens and visual tokens stay within their bounds', () => {
    const b = { seqLength: 10, maxVisualTokens: 1 };
    expect(fits(A, 4, 0, b)).toBe(true);
    expect(fits(A, 5, 0, b)).toBe(false);
    expect(fits(A, 0, 1, b)).toBe(false);
  });

  it('cuts at the sequence, or before an image whose placeholders would be cut', () => {
    // bos, text 7, image of 2 tokens at [2, 4), text 8 9
    const s = sample(0, [3, 7, 1, 1, 8, 9], [0, 1, 0, 0, 1, 1], [0, 0, 0, 0, 1, 1], [[1, 2, 4]]);
    const cutAfter = truncated(s, [[2, 4]], 5, 2);
    expect([...cutAfter.tokens]).toEqual([3, 7, 1, 1, 8]);
    expect(cutAfter.grids).toEqual([[1, 2, 4]]);
    const cutInside = truncated(s, [[2, 4]], 3, 2);
    expect([...cutInside.tokens]).toEqual([3, 7]);
    expect(cutInside.grids).toEqual([]);
    expect(cutInside.visual).toBe(0);
  });
});
