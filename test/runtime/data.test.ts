// Microbatch data: the synthetic task (deterministic in seed, step and global microbatch; its
// packing invariants), the patch order of images, and the checks of setMicrobatch.
import { describe, expect, it } from 'vitest';

import { loadNative, type NativeMicrobatch } from '../../runtime/native.js';
import { ProgramBuilder, textMicrobatch } from './program-builder.js';

const native = loadNative();

const SEQ = 128;
const VOCAB = 512;

/** The inputs of a tiny-vlm rank: text and image fields of one microbatch slot (or more). */
function dataProgram(slots = 1, bounds = { S: SEQ, Nv: 128 }) {
  const b = new ProgramBuilder('data', bounds);
  const ids: Record<string, number>[] = [];
  for (let mb = 0; mb < slots; mb++) {
    ids.push({
      tokens: b.input('tokens', 'i32', ['S'], mb),
      labels: b.input('labels', 'i32', ['S'], mb),
      loss_mask: b.input('loss_mask', 'u8', ['S'], mb),
      positions: b.input('positions', 'i32', ['S'], mb),
      segments: b.input('segments', 'i32', ['S'], mb),
      patches: b.input('patches', 'f32', ['4*Nv', 48], mb),
      image_segments: b.input('image_segments', 'i32', ['4*Nv'], mb),
      patch_rows: b.input('patch_rows', 'i32', ['4*Nv'], mb),
      patch_cols: b.input('patch_cols', 'i32', ['4*Nv'], mb),
    });
  }
  return { rt: new native.Runtime(b.json()), ids };
}

function bytesOf(mb: NativeMicrobatch): number[] {
  const parts: ArrayBufferView[] = [mb.tokens, mb.labels, mb.lossMask, mb.positions, mb.segments];
  for (const im of mb.images) parts.push(im.pixels);
  const out: number[] = [];
  for (const p of parts) out.push(...new Uint8Array(p.buffer, p.byteOffset, p.byteLength));
  return out;
}

describe('native runtime: synthesize', () => {
  it('is a pure function of (seed, step, global microbatch)', () => {
    const { rt } = dataProgram(2);
    const a = rt.synthesize(0, 5, 3, 7, { seqLength: SEQ, vocab: VOCAB });
    const b = rt.synthesize(1, 5, 3, 7, { seqLength: SEQ, vocab: VOCAB });
    expect(bytesOf(b)).toEqual(bytesOf(a)); // same args, other slot → identical bytes
    const other = dataProgram().rt.synthesize(0, 5, 3, 7, { seqLength: SEQ, vocab: VOCAB });
    expect(bytesOf(other)).toEqual(bytesOf(a)); // another runtime → identical bytes
    expect(bytesOf(rt.synthesize(1, 5, 4, 7, { seqLength: SEQ, vocab: VOCAB }))).not.toEqual(
      bytesOf(a),
    );
    expect(bytesOf(rt.synthesize(1, 5, 3, 8, { seqLength: SEQ, vocab: VOCAB }))).not.toEqual(
      bytesOf(a),
    );
    expect(bytesOf(rt.synthesize(1, 6, 3, 7, { seqLength: SEQ, vocab: VOCAB }))).not.toEqual(
      bytesOf(a),
    );
    expect(bytesOf(rt.getMicrobatch(0))).toEqual(bytesOf(a));
  });

  it('packs samples by the task rules', () => {
    const { rt } = dataProgram();
    for (let step = 0; step < 20; step++) {
      const mb = rt.synthesize(0, 1, step, 0, { seqLength: SEQ, vocab: VOCAB });
      expect(mb.tokens).toHaveLength(SEQ);
      // placeholders = visual tokens of the images (8a × 8b pixels → a·b)
      const placeholders = mb.tokens.filter((t) => t === 1).length;
      const visual = mb.images.reduce((n, im) => n + (im.height / 8) * (im.width / 8), 0);
      expect(placeholders).toBe(visual);
      let sample = -1;
      let start = 0;
      for (let i = 0; i < SEQ; i++) {
        const seg = mb.segments[i];
        if (seg < 0) {
          // padding to the end
          expect(mb.tokens.slice(i).every((t) => t === 0)).toBe(true);
          expect(mb.segments.slice(i).every((s) => s === -1)).toBe(true);
          expect(mb.lossMask.slice(i).every((m) => m === 0)).toBe(true);
          break;
        }
        if (seg !== sample) {
          expect(seg).toBe(sample + 1);
          sample = seg;
          start = i;
        }
        expect(mb.positions[i]).toBe(i - start);
        const next = i + 1 < SEQ && mb.segments[i + 1] === seg ? mb.tokens[i + 1] : 0;
        const text = next >= 2;
        expect(mb.labels[i]).toBe(text ? next : 0);
        expect(mb.lossMask[i]).toBe(text ? 1 : 0);
      }
      expect(mb.images).toHaveLength(sample + 1);
      // each sample: placeholders, background 2–9, square 10–17 (another colour), quadrant 18–21,
      // then an arithmetic filler of 3–8 tokens ≥ 26
      for (let s = 0; s <= sample; s++) {
        const toks = Array.from(mb.tokens.filter((_, i) => mb.segments[i] === s));
        const nv = (mb.images[s].height / 8) * (mb.images[s].width / 8);
        expect(toks.slice(0, nv).every((t) => t === 1)).toBe(true);
        const [bg, sq, quad, ...filler] = toks.slice(nv);
        expect(bg).toBeGreaterThanOrEqual(2);
        expect(bg).toBeLessThanOrEqual(9);
        expect(sq).toBeGreaterThanOrEqual(10);
        expect(sq).toBeLessThanOrEqual(17);
        expect(sq - 10).not.toBe(bg - 2);
        expect(quad).toBeGreaterThanOrEqual(18);
        expect(quad).toBeLessThanOrEqual(21);
        expect(filler.length).toBeGreaterThanOrEqual(3);
        expect(filler.length).toBeLessThanOrEqual(8);
        const stride = (filler[1] - filler[0] + (VOCAB - 26)) % (VOCAB - 26);
        filler.forEach((t, i) => {
          expect(t).toBeGreaterThanOrEqual(26);
          expect(t).toBeLessThan(VOCAB);
          expect(t).toBe(26 + ((filler[0] - 26 + i * stride) % (VOCAB - 26)));
        });
        // the image: background colour at a corner pixel far from the square (up to noise)
        const im = mb.images[s];
        const c = bg - 2;
        const level = (bit: number) => (bit ? 0.85 : 0.15);
        const corner = [0, 1, 2].map(
          (ch) =>
            im.pixels[ch * im.height * im.width + (quad === 18 ? im.height * im.width - 1 : 0)],
        );
        expect(Math.abs(corner[0] - level((c >> 2) & 1))).toBeLessThan(0.2);
        expect(Math.abs(corner[1] - level((c >> 1) & 1))).toBeLessThan(0.2);
        expect(Math.abs(corner[2] - level(c & 1))).toBeLessThan(0.2);
      }
      // the next sample would not have fitted: at most 26 free tokens (the longest sample)
      const used = mb.segments.filter((x) => x >= 0).length;
      expect(SEQ - used).toBeLessThan(4 * 4 + 3 + 8);
      // captions: labels that are caption tokens
      const caption = rt.captionMask(0);
      expect(Array.from(caption)).toEqual(
        Array.from(mb.labels, (l) => (l >= 2 && l <= 25 ? 1 : 0)),
      );
      expect(caption.reduce((a, x) => a + x, 0)).toBe(3 * (sample + 1)); // background, square, quadrant
    }
  });

  it('keeps visual tokens within the slot bound', () => {
    const { rt } = dataProgram(1, { S: SEQ, Nv: 6 });
    for (let step = 0; step < 10; step++) {
      const mb = rt.synthesize(0, 2, step, 0, { seqLength: SEQ, vocab: VOCAB });
      expect(mb.tokens.filter((t) => t === 1).length).toBeLessThanOrEqual(6);
    }
  });
});

describe('native runtime: setMicrobatch', () => {
  /** One 8×8 image with pixel (c, y, x) = 100c + 10y + x: two tokens of text around 1 placeholder. */
  function handMade(): NativeMicrobatch {
    const pixels = new Float32Array(3 * 8 * 8);
    for (let c = 0; c < 3; c++)
      for (let y = 0; y < 8; y++)
        for (let x = 0; x < 8; x++) pixels[c * 64 + y * 8 + x] = 100 * c + 10 * y + x;
    return {
      tokens: Int32Array.from([1, 30, 31, 0]),
      labels: Int32Array.from([0, 31, 0, 0]),
      lossMask: Uint8Array.from([0, 1, 0, 0]),
      positions: Int32Array.from([0, 1, 2, 0]),
      segments: Int32Array.from([0, 0, 0, -1]),
      images: [{ height: 8, width: 8, pixels }],
    };
  }

  it('cuts an 8×8 image into 4×4 patches in merge-block order, (channel, row, col) inside', () => {
    const { rt, ids } = dataProgram();
    rt.setMicrobatch(0, handMade());
    const patches = new Float32Array(rt.readBuffer(ids[0].patches));
    expect(patches).toHaveLength(4 * 48); // Nv = 1 → 4 patches
    // one 2×2 merge block: top-left, top-right, bottom-left, bottom-right
    const origin = [
      [0, 0],
      [0, 4],
      [4, 0],
      [4, 4],
    ];
    origin.forEach(([y0, x0], p) => {
      const want: number[] = [];
      for (let c = 0; c < 3; c++)
        for (let y = 0; y < 4; y++)
          for (let x = 0; x < 4; x++) want.push(100 * c + 10 * (y0 + y) + x0 + x);
      expect(Array.from(patches.subarray(p * 48, (p + 1) * 48))).toEqual(want);
    });
    expect(Array.from(new Int32Array(rt.readBuffer(ids[0].patch_rows)))).toEqual([0, 0, 1, 1]);
    expect(Array.from(new Int32Array(rt.readBuffer(ids[0].patch_cols)))).toEqual([0, 1, 0, 1]);
    expect(Array.from(new Int32Array(rt.readBuffer(ids[0].image_segments)))).toEqual([0, 0, 0, 0]);
    expect(Array.from(new Int32Array(rt.readBuffer(ids[0].tokens)))).toEqual([1, 30, 31, 0]);
    expect(bytesOf(rt.getMicrobatch(0))).toEqual(bytesOf(handMade()));
  });

  it('orders the blocks of a 16×8 image by block rows, and images one after another', () => {
    const { rt, ids } = dataProgram();
    const mb = handMade();
    const tall = { height: 16, width: 8, pixels: new Float32Array(3 * 16 * 8) };
    rt.setMicrobatch(0, {
      ...mb,
      tokens: Int32Array.from([1, 1, 1, 0]),
      images: [mb.images[0], tall],
    });
    expect(Array.from(new Int32Array(rt.readBuffer(ids[0].patch_rows)))).toEqual([
      0, 0, 1, 1, 0, 0, 1, 1, 2, 2, 3, 3,
    ]);
    expect(Array.from(new Int32Array(rt.readBuffer(ids[0].patch_cols)))).toEqual([
      0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
    ]);
    expect(Array.from(new Int32Array(rt.readBuffer(ids[0].image_segments)))).toEqual([
      0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
    ]);
  });

  it('fills a caption_mask input from the microbatch, or from its labels', () => {
    const b = new ProgramBuilder('captions', { S: 6, Nv: 0 });
    const mask = b.input('caption_mask', 'u8', ['S']);
    const rt = new native.Runtime(b.json());
    const mb = textMicrobatch([[40, 3, 12, 19, 30]], 6); // labels 3 12 19 30 0 0
    rt.setMicrobatch(0, mb);
    expect(Array.from(new Uint8Array(rt.readBuffer(mask)))).toEqual([1, 1, 1, 0, 0, 0]);
    expect(Array.from(rt.getMicrobatch(0).captionMask!)).toEqual([1, 1, 1, 0, 0, 0]);
    rt.setMicrobatch(0, { ...mb, captionMask: Uint8Array.from([0, 0, 1, 0, 0, 0]) });
    expect(Array.from(new Uint8Array(rt.readBuffer(mask)))).toEqual([0, 0, 1, 0, 0, 0]);
    expect(Array.from(rt.captionMask(0))).toEqual([0, 0, 1, 0, 0, 0]);
  });

  it('refuses placeholders that differ from the visual tokens, sizes over a bound, bad images', () => {
    const { rt } = dataProgram(1, { S: 4, Nv: 1 });
    const mb = handMade();
    expect(() => rt.setMicrobatch(0, { ...mb, tokens: Int32Array.from([1, 1, 31, 0]) })).toThrow(
      'microbatch 0: 2 placeholder tokens (id 1) but its images give 1 visual tokens',
    );
    const long = { ...mb, tokens: Int32Array.from([1, 30, 31, 0, 0]) };
    for (const k of ['labels', 'positions', 'segments'] as const) long[k] = new Int32Array(5);
    long.lossMask = new Uint8Array(5);
    expect(() => rt.setMicrobatch(0, long)).toThrow(
      'microbatch 0: tokens has 5 elements, its buffer holds at most 4',
    );
    const twoImages = {
      ...mb,
      tokens: Int32Array.from([1, 1, 0, 0]),
      images: [mb.images[0], mb.images[0]],
    };
    expect(() => rt.setMicrobatch(0, twoImages)).toThrow(
      'microbatch 0: patches has 8 patches, its buffer holds at most 4',
    );
    const odd = { ...mb, images: [{ height: 12, width: 8, pixels: new Float32Array(3 * 12 * 8) }] };
    expect(() => rt.setMicrobatch(0, odd)).toThrow(
      'microbatch 0: image 0 is 12×8 pixels; both sides must be positive multiples of 8 (patch 4 × merge 2)',
    );
    expect(() => rt.setMicrobatch(0, { ...mb, labels: new Int32Array(3) })).toThrow(
      'microbatch 0: labels has 3 elements, tokens has 4',
    );
    expect(() => rt.setMicrobatch(1, mb)).toThrow(
      'setMicrobatch: microbatch slot 1 is out of range (the program has 1 slots)',
    );
  });
});
