// The decoder's M-RoPE position ids and the encoder's attention windows (docs/qwen-vl.md), from
// the native data code, against arrays worked out by hand from the rules of Hugging Face's
// get_rope_index and get_window_index.
import { describe, expect, it } from 'vitest';
import { loadNative } from '../../runtime/native.js';

const native = loadNative();
const IMG = 1;

describe('M-RoPE position ids (get_rope_index, per packed sample)', () => {
  // sample 0: text 5 6, image A (4×6 patches → 2×3 merged tokens), text 7 8, image B (2×2
  // patches → 1 token), text 9; sample 1: text 10 11; then 2 padding positions
  const tokens = Int32Array.from([5, 6, IMG, IMG, IMG, IMG, IMG, IMG, 7, 8, IMG, 9, 10, 11, 0, 0]);
  const segments = Int32Array.from([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, -1, -1]);
  const grids = Int32Array.from([1, 4, 6, 1, 2, 2]);

  it('two images of different grids with text between them, element for element', () => {
    const ids = native.ropeIndex(tokens, segments, grids, IMG, 2);
    // text 0, 1; image A from 2: t = 2, h = 2 + row, w = 2 + column; text resumes at 2 + max(2, 3)
    // = 5, 6; image B at 7; text 8; the next sample restarts at 0; padding 0
    const t = [0, 1, 2, 2, 2, 2, 2, 2, 5, 6, 7, 8, 0, 1, 0, 0];
    const h = [0, 1, 2, 2, 2, 3, 3, 3, 5, 6, 7, 8, 0, 1, 0, 0];
    const w = [0, 1, 2, 3, 4, 2, 3, 4, 5, 6, 7, 8, 0, 1, 0, 0];
    expect([...ids]).toEqual([...t, ...h, ...w]);
  });

  it('refuses placeholders that do not match the grids, naming the image', () => {
    const short = Int32Array.from(tokens);
    short[7] = 4; // image A loses a placeholder
    expect(() => native.ropeIndex(short, segments, grids, IMG, 2)).toThrow(
      /image 0 \(2×3 merged tokens\) needs 6 placeholders from token 2; token 7/,
    );
    expect(() => native.ropeIndex(tokens, segments, grids.subarray(0, 3), IMG, 2)).toThrow(
      /placeholder at token 10 but only 1 images/,
    );
  });
});

describe('attention windows (window_segments)', () => {
  it('windows of 2×2 merged tokens, patches in merge-block order, ids unique over images', () => {
    // image A: merged grid 2×3 → windows [0 0 1 / 0 0 1] (2 windows across); image B: window 2;
    // each merged token is 4 patches
    const ids = native.windowSegments(Int32Array.from([1, 4, 6, 1, 2, 2]), 2, 2);
    const perToken = [0, 0, 1, 0, 0, 1, 2];
    expect([...ids]).toEqual(perToken.flatMap((w) => [w, w, w, w]));
  });
});
