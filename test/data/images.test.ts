// Image files through lfc's decoding and processing (runtime/data/images.ts) against PIL doing what
// Hugging Face's pipeline does (test/reference/image_processor.py, committed fixtures): PNGs of
// every colour mode, JPEGs baseline, progressive, grayscale, CMYK and EXIF-rotated. The sizes and
// grids equal; the normalized values, back in pixel units (0..1), within 1/255 on average and 8/255
// at worst (JPEG decoders may round differently), PNGs exactly. Refusals name the file.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import sharp from 'sharp';
import { afterAll, describe, expect, it } from 'vitest';
import { imageHeader, orientedSize } from '../../runtime/data/image-headers.js';
import { projectRoot } from '../../compiler/paths.js';
import {
  decodeImage,
  imageInfo,
  processDecoded,
  visualTokensOf,
  type ImageProcessorSpec,
} from '../../runtime/data/images.js';
import { DataError } from '../../runtime/data/sample.js';
import { readSafetensors } from '../../runtime/safetensors.js';

interface FileCase {
  file: string;
  what: string;
  pil_mode: string;
  height: number;
  width: number;
  resized: [number, number];
  grid: [number, number, number];
  decoded: boolean;
  expected: string;
}

const dir = join(projectRoot(), 'test/fixtures/image-processor');
const meta = JSON.parse(readFileSync(join(dir, 'meta.json'), 'utf8')) as {
  patch: number;
  merge: number;
  temporal_patch: number;
  min_pixels: number;
  max_pixels: number;
  mean: [number, number, number];
  std: [number, number, number];
  files: FileCase[];
};
const tensors = readSafetensors(join(dir, 'files.safetensors')).tensors;
const spec: ImageProcessorSpec = {
  factor: meta.patch * meta.merge,
  patchSize: meta.patch,
  mergeSize: meta.merge,
  temporalPatch: meta.temporal_patch,
  minPixels: meta.min_pixels,
  maxPixels: meta.max_pixels,
  mean: meta.mean,
  std: meta.std,
  // no encoder's bound on a side: the reference is HF's processor alone
  maxSide: Infinity,
};
const bytesOf = (file: string) => readFileSync(join(dir, 'files', file));

/** the worst errors seen, per format, in pixel units (0..1) */
const worst = new Map<string, { mean: number; max: number }>();

describe.each(meta.files.map((f) => [f.file, f] as const))('%s', (file, f) => {
  const png = file.endsWith('.png');
  it(`reads its size after EXIF orientation from the header: ${f.width}×${f.height}`, async () => {
    expect(await imageInfo(bytesOf(file), file)).toEqual({ width: f.width, height: f.height });
    // lfc's own header reader (image-headers.ts), not sharp's fallback, and the same as sharp's
    const header = imageHeader(bytesOf(file))!;
    expect(header.format).toBe(png ? 'png' : 'jpeg');
    expect(orientedSize(header)).toEqual({ width: f.width, height: f.height });
    const m = await sharp(bytesOf(file)).metadata();
    expect(header.orientation).toBe(m.orientation ?? 1);
    if (!png) expect(header.components === 4).toBe(m.space === 'cmyk');
  });

  it(`decodes and processes as PIL does (${f.what}, PIL mode ${f.pil_mode})`, async () => {
    const img = await decodeImage(bytesOf(file), file);
    expect([img.height, img.width]).toEqual([f.height, f.width]);
    if (f.decoded) {
      const want = tensors.get(`${file}.decoded`)!.data as Uint8Array;
      let differ = 0;
      want.forEach((v, k) => (differ += +(img.data[k] !== v)));
      expect(differ).toBe(0);
    }
    const got = processDecoded(img, spec);
    expect([got.height, got.width]).toEqual(f.resized);
    expect(got.grid).toEqual(f.grid);

    // lfc's normalized values back in pixel units (x·std + mean) against PIL's resized bytes / 255
    const want = tensors.get(`${file}.resized`)!.data as Uint8Array;
    const hw = got.height * got.width;
    let sum = 0;
    let max = 0;
    for (let ch = 0; ch < 3; ch++)
      for (let i = 0; i < hw; i++) {
        const x = got.pixels[ch * hw + i] * spec.std[ch] + spec.mean[ch];
        const d = Math.abs(x - want[i * 3 + ch] / 255);
        sum += d;
        max = Math.max(max, d);
      }
    const mean = sum / (3 * hw);
    const format = png ? 'PNG' : 'JPEG';
    const w = worst.get(format) ?? { mean: 0, max: 0 };
    worst.set(format, { mean: Math.max(w.mean, mean), max: Math.max(w.max, max) });
    if (png) {
      // lossless: the same bytes, off only by float32 rounding
      expect(max).toBeLessThan(1e-6);
    } else {
      expect(mean).toBeLessThanOrEqual(1 / 255);
      expect(max).toBeLessThanOrEqual(8 / 255);
    }
  });

  it("counts its visual tokens from its size alone, as the processed image's grid", () => {
    const [t, gh, gw] = f.grid;
    expect(visualTokensOf({ width: f.width, height: f.height }, spec)).toBe(
      (t * gh * gw) / (spec.mergeSize * spec.mergeSize),
    );
  });
});

afterAll(() => {
  const figures = [...worst].map(
    ([format, w]) =>
      `${format} mean ${(w.mean * 255).toFixed(4)}/255, max ${(w.max * 255).toFixed(4)}/255`,
  );
  console.log(`decode + process vs PIL, worst per file: ${figures.join('; ')}`);
});

describe('a smaller bound on pixels', () => {
  it('shrinks the image and its grid alike', async () => {
    const img = await decodeImage(bytesOf('photo-448.jpg'), 'photo-448.jpg');
    const got = processDecoded(img, spec, 28 * 28 * 4);
    // smart_resize of 448×448 into 3136 pixels: 56×56, a grid of 4×4 patches, 4 visual tokens
    expect([got.height, got.width, ...got.grid]).toEqual([56, 56, 1, 4, 4]);
    expect(got.pixels.length).toBe(3 * 56 * 56);
    expect(visualTokensOf({ width: 448, height: 448 }, spec, 28 * 28 * 4)).toBe(4);
  });
});

describe("libjpeg's warnings", () => {
  it('a JPEG with extraneous bytes before a marker decodes, as PIL decodes it', async () => {
    const clean = bytesOf('progressive.jpg');
    const sos = clean.indexOf(Buffer.from([0xff, 0xda]));
    const junk = Buffer.from([0x12, 0x34, 0x56]);
    const warned = Buffer.concat([clean.subarray(0, sos), junk, clean.subarray(sos)]);
    const got = await decodeImage(warned, 'warned.jpg');
    expect(got).toEqual(await decodeImage(clean, 'progressive.jpg'));
  });
});

describe('refusals name the file, on one line', () => {
  const jpeg = bytesOf('photo-448.jpg');
  const png = bytesOf('rgba.png');
  // a fixed pseudo-random byte string (no image format starts like it)
  const random = Buffer.from(Array.from({ length: 4096 }, (_, i) => (i * 2654435761) >>> 24));
  const cases: [string, Buffer][] = [
    ['a truncated JPEG', jpeg.subarray(0, jpeg.length >> 1)],
    ['a truncated PNG', png.subarray(0, png.length >> 1)],
    ['random bytes', random],
    ['an empty buffer', Buffer.alloc(0)],
  ];
  it.each(cases)('%s', async (_, bytes) => {
    const where = 'shard-00003.tar:sample-17.jpg';
    const err = await decodeImage(bytes, where).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(DataError);
    const message = (err as DataError).message;
    expect(message).toMatch(/^shard-00003\.tar:sample-17\.jpg: cannot decode the image: \S/);
    expect(message).not.toContain('\n');
  });
  it('random bytes and an empty buffer have no header either', async () => {
    for (const bytes of [random, Buffer.alloc(0)])
      await expect(imageInfo(bytes, 'x.png')).rejects.toThrow(/^x\.png: cannot decode the image/);
  });
  it('an aspect ratio over 200, from the header', async () => {
    const sharp = (await import('sharp')).default;
    const thin = await sharp({
      create: { width: 402, height: 2, channels: 3, background: { r: 9, g: 9, b: 9 } },
    })
      .png()
      .toBuffer();
    await expect(imageInfo(thin, 'thin.png')).rejects.toThrow(
      /^thin\.png: the image is 402×2 pixels .*aspect ratio over 200/,
    );
    await expect(decodeImage(thin, 'thin.png')).rejects.toThrow(DataError);
  });
});
