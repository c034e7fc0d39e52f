// The Qwen image processor (runtime/data/image-processor.ts) against Hugging Face's rules run with PIL
// (test/reference/image_processor.py, committed fixtures): smart_resize's size on images of
// awkward sizes, Pillow's bicubic resize, the rescaled and normalized values.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { projectRoot } from '../../compiler/paths.js';
import {
  processImage,
  resizeBicubic,
  smartResize,
  type ProcessorSpec,
} from '../../runtime/data/image-processor.js';
import { readSafetensors } from '../../runtime/safetensors.js';

const dir = join(projectRoot(), 'test/fixtures/image-processor');
const meta = JSON.parse(readFileSync(join(dir, 'meta.json'), 'utf8')) as {
  factor: number;
  min_pixels: number;
  max_pixels: number;
  mean: [number, number, number];
  std: [number, number, number];
  images: { height: number; width: number; resized: [number, number] }[];
};
const tensors = readSafetensors(join(dir, 'images.safetensors')).tensors;
const spec: ProcessorSpec = {
  factor: meta.factor,
  minPixels: meta.min_pixels,
  maxPixels: meta.max_pixels,
  mean: meta.mean,
  std: meta.std,
};

describe.each(meta.images.map((m, i) => [`${m.height}×${m.width}`, i, m] as const))(
  'an image of %s pixels',
  (_, i, m) => {
    const input = {
      height: m.height,
      width: m.width,
      data: tensors.get(`img${i}.input`)!.data as Uint8Array,
    };
    it(`resizes to smart_resize's ${m.resized.join('×')}`, () => {
      expect(smartResize(m.height, m.width, spec)).toEqual(m.resized);
    });
    it("resizes as PIL's bicubic does, byte for byte", () => {
      const got = resizeBicubic(input, ...m.resized);
      const want = tensors.get(`img${i}.resized`)!.data as Uint8Array;
      let differ = 0;
      want.forEach((v, k) => (differ += +(got.data[k] !== v)));
      expect(differ).toBe(0);
    });
    it('rescales and normalizes as HF does', () => {
      const got = processImage(input, spec);
      const want = tensors.get(`img${i}.normalized`)!.data as Float32Array;
      expect([got.height, got.width]).toEqual(m.resized);
      let worst = 0;
      want.forEach((v, k) => (worst = Math.max(worst, Math.abs(got.pixels[k] - v))));
      expect(worst).toBeLessThan(1e-6);
    });
  },
);

describe('smart_resize edge rules', () => {
  it("rounds half to even, as Python's round", () => {
    // 42 / 28 = 1.5 rounds to 2, 70 / 28 = 2.5 rounds to 2: 56 × 56, at least min_pixels
    expect(smartResize(42, 70, spec)).toEqual([56, 56]);
  });
  it('refuses an aspect ratio over 200', () => {
    expect(() => smartResize(1, 201, spec)).toThrow(/aspect ratio over 200/);
  });
});
