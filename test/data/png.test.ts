// lfc's decoder of common PNGs (runtime/data/png.ts) against libvips (sharp) on images that use
// every row filter, in each colour type it takes, and against PIL's fixtures (images.test.ts runs
// them through decodeImage, which now takes this path for them). The kinds it leaves to pngjs come
// back undefined; broken files throw.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { crc32 as crc32Of, deflateSync, inflateSync as inflateSyncOf } from 'node:zlib';
import sharp from 'sharp';
import { describe, expect, it } from 'vitest';
import { projectRoot } from '../../compiler/paths.js';
import { decodeSimplePng, overWhite } from '../../runtime/data/png.js';
import { encodePng } from '../../runtime/data/demo-dataset.js';

/** a photo-like image: gradients, texture and sharp edges, so libvips's filter choice varies */
function pixels(width: number, height: number, channels: number, seed: number): Buffer {
  const b = Buffer.alloc(width * height * channels);
  let s = seed;
  for (let y = 0; y < height; y++)
    for (let x = 0; x < width; x++)
      for (let c = 0; c < channels; c++) {
        s = (s * 1103515245 + 12345) >>> 0;
        const edge = x > width / 3 !== y > height / 2 ? 90 : 0;
        b[(y * width + x) * channels + c] = (x * 3 + y * (c + 1) + edge + ((s >>> 24) & 15)) & 255;
      }
  return b;
}

/** what lfc's decoding makes of the raw samples: RGB, grey replicated, alpha onto white */
function expectedRgb(raw: Buffer, channels: number): Uint8Array {
  const n = raw.length / channels;
  const rgb = new Uint8Array(n * 3);
  for (let i = 0; i < n; i++)
    for (let c = 0; c < 3; c++) {
      const v = raw[i * channels + (channels < 3 ? 0 : c)];
      rgb[i * 3 + c] = channels % 2 === 0 ? overWhite(v, raw[i * channels + channels - 1]) : v;
    }
  return rgb;
}

/** the filter type of each row, from the inflated image data (8-bit samples) */
function filtersOf(png: Buffer): Set<number> {
  const channels = { 0: 1, 2: 3, 4: 2, 6: 4 }[png[25]]!;
  expect(png[24]).toBe(8);
  const stride = png.readUInt32BE(16) * channels;
  const idat: Buffer[] = [];
  for (let at = 8; at < png.length;) {
    const length = png.readUInt32BE(at);
    if (png.toString('latin1', at + 4, at + 8) === 'IDAT')
      idat.push(png.subarray(at + 8, at + 8 + length));
    at += 12 + length;
  }
  const raw = inflateSyncOf(Buffer.concat(idat));
  const types = new Set<number>();
  for (let at = 0; at < raw.length; at += stride + 1) types.add(raw[at]);
  return types;
}

/** A PNG whose row y uses filter y mod 5 (PNG's definitions, spelled out here), in one IDAT. */
function filteredPng(raw: Buffer, width: number, height: number, channels: number): Buffer {
  const stride = width * channels;
  const rows = Buffer.alloc(height * (stride + 1));
  const at = (y: number, i: number) => (y < 0 || i < 0 ? 0 : raw[y * stride + i]);
  for (let y = 0; y < height; y++) {
    const type = y % 5;
    rows[y * (stride + 1)] = type;
    for (let i = 0; i < stride; i++) {
      const x = at(y, i);
      const a = at(y, i - channels);
      const b = at(y - 1, i);
      const c = at(y - 1, i - channels);
      const p = a + b - c;
      const [pa, pb, pc] = [Math.abs(p - a), Math.abs(p - b), Math.abs(p - c)];
      const predictor = [
        0,
        a,
        b,
        Math.floor((a + b) / 2),
        pa <= pb && pa <= pc ? a : pb <= pc ? b : c,
      ][type];
      rows[y * (stride + 1) + 1 + i] = (x - predictor) & 255;
    }
  }
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(width, 0);
  ihdr.writeUInt32BE(height, 4);
  ihdr.set([8, { 1: 0, 2: 4, 3: 2, 4: 6 }[channels]!, 0, 0, 0], 8);
  return Buffer.concat([
    Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
    chunk('IHDR', ihdr),
    chunk('IDAT', deflateSync(rows)),
    chunk('IEND', Buffer.alloc(0)),
  ]);
}

function chunk(type: string, data: Buffer): Buffer {
  const head = Buffer.alloc(8);
  head.writeUInt32BE(data.length);
  head.write(type, 4, 'latin1');
  const crc = Buffer.alloc(4);
  crc.writeUInt32BE(crc32Of(Buffer.concat([head.subarray(4), data])) >>> 0);
  return Buffer.concat([head, data, crc]);
}

describe('decodeSimplePng', () => {
  const kinds = [
    { channels: 1, name: 'grey' },
    { channels: 2, name: 'grey + alpha' },
    { channels: 3, name: 'RGB' },
    { channels: 4, name: 'RGBA' },
  ];
  it.each(kinds)('$name: the pixels libvips decodes, through every filter', async (k) => {
    for (const [width, height, seed] of [
      [1, 1, 1],
      [37, 23, 2],
      [64, 48, 3],
      [5, 90, 4],
    ]) {
      const raw = pixels(width, height, k.channels, seed);
      const png = await sharp(raw, {
        raw: { width, height, channels: k.channels as 1 | 2 | 3 | 4 },
      })
        .png({ adaptiveFiltering: true, compressionLevel: 9 })
        .toBuffer();
      const got = decodeSimplePng(png)!;
      expect([got.width, got.height]).toEqual([width, height]);
      expect(Buffer.from(got.data).equals(Buffer.from(expectedRgb(raw, k.channels)))).toBe(true);
    }
  });

  it.each(kinds)('$name: each of the five row filters, as libvips decodes it', async (k) => {
    const [width, height] = [19, 15];
    const raw = pixels(width, height, k.channels, 7);
    const png = filteredPng(raw, width, height, k.channels);
    expect([...filtersOf(png)].sort()).toEqual([0, 1, 2, 3, 4]);
    const got = decodeSimplePng(png)!;
    const vips = await sharp(png).raw().toBuffer({ resolveWithObject: true });
    // libvips gives grey as RGB: its RGB(A) through the same compositing
    const fromVips = expectedRgb(vips.data, vips.info.channels);
    expect(Buffer.from(fromVips).equals(Buffer.from(expectedRgb(raw, k.channels)))).toBe(true);
    expect(Buffer.from(got.data).equals(Buffer.from(fromVips))).toBe(true);
  });

  it('an image in several IDAT chunks (the demo dataset writes one)', () => {
    const raw = pixels(16, 8, 3, 9);
    const one = encodePng(raw, 16, 8);
    expect(Buffer.from(decodeSimplePng(one)!.data).equals(raw)).toBe(true);
    // the same data split across three IDATs
    const rows = Buffer.alloc(8 * 49);
    for (let y = 0; y < 8; y++) raw.copy(rows, y * 49 + 1, y * 48, (y + 1) * 48);
    const z = deflateSync(rows);
    const ihdr = one.subarray(8, 8 + 25);
    const split = Buffer.concat([
      one.subarray(0, 8),
      ihdr,
      chunk('IDAT', z.subarray(0, 5)),
      chunk('IDAT', z.subarray(5, 11)),
      chunk('IDAT', z.subarray(11)),
      chunk('IEND', Buffer.alloc(0)),
    ]);
    expect(Buffer.from(decodeSimplePng(split)!.data).equals(raw)).toBe(true);
  });

  it("leaves palettes, other depths, tRNS and Adam7 to pngjs: PIL's fixtures", () => {
    const dir = join(projectRoot(), 'test/fixtures/image-processor/files');
    const taken = (file: string) => decodeSimplePng(readFileSync(join(dir, file))) !== undefined;
    for (const file of [
      'rgb.png',
      'gray.png',
      'rgba.png',
      'gray-alpha.png',
      'alpha-table.png',
      'rgb-exif8.png',
    ])
      expect(taken(file), file).toBe(true);
    for (const file of [
      'bilevel.png',
      'palette.png',
      'palette-trns.png',
      'gray16.png',
      'rgb16.png',
      'rgba16.png',
    ])
      expect(taken(file), file).toBe(false);
    expect(decodeSimplePng(readFileSync(join(dir, 'photo-448.jpg')))).toBeUndefined();
  });

  it('refuses broken data: a bad CRC, truncation, corrupt deflate data', () => {
    const png = encodePng(pixels(16, 8, 3, 5), 16, 8);
    const badCrc = Buffer.from(png);
    badCrc[8 + 25 + 10] ^= 0x40; // a byte of the IDAT's data
    expect(() => decodeSimplePng(badCrc)).toThrow(/^PNG: bad CRC in the IDAT chunk/);
    expect(() => decodeSimplePng(png.subarray(0, png.length - 12))).toThrow(/no IEND/);
    expect(() => decodeSimplePng(png.subarray(0, 50))).toThrow(/runs past the file's end/);
    // a valid chunk around data that is not deflate's
    const junk = Buffer.from(png);
    const length = junk.readUInt32BE(33);
    junk.fill(0xaa, 41, 41 + length);
    junk.writeUInt32BE(crc32Of(junk.subarray(37, 41 + length)) >>> 0, 41 + length);
    expect(() => decodeSimplePng(junk)).toThrow(/^PNG: the image data does not inflate/);
  });
});
