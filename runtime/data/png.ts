// The PNGs that datasets hold nearly always, decoded here in a few microseconds: 8 bits per
// sample, grey, grey + alpha, RGB or RGBA, not interlaced, no tRNS chunk. The chunks' CRCs are
// checked (PIL refuses a bad one too), the IDAT data inflated by zlib, the five row filters undone,
// and the samples turned into 8-bit RGB as PIL's `convert('RGBA')` then compositing onto white
// gives (images.ts). Anything else (palettes, other depths, Adam7, tRNS) is not taken:
// `decodeSimplePng` answers undefined and images.ts hands the file to pngjs, which took about
// 55 µs a demo image (8–32 pixels a side) against about 20 here, its cost per call rather than
// per pixel (CPU profiles of the loader).

import { crc32, inflateSync } from 'node:zlib';

const SIGNATURE = [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a];

/** samples per pixel of the colour types taken: grey, RGB, grey + alpha, RGBA */
const CHANNELS: Readonly<Record<number, number>> = { 0: 1, 2: 3, 4: 2, 6: 4 };

export interface DecodedPng {
  readonly width: number;
  readonly height: number;
  /** 8-bit RGB, row-major [height, width, 3] */
  readonly data: Uint8Array;
}

const u32 = (b: Uint8Array, at: number) =>
  ((b[at] << 24) | (b[at + 1] << 16) | (b[at + 2] << 8) | b[at + 3]) >>> 0;

/** v·a/255 + 255·(1 − a/255) rounded: PIL's alpha_composite of (v, a) onto opaque white */
export function overWhite(v: number, a: number): number {
  // the numerator is never a half: 255 is odd
  return Math.floor((v * a + 255 * (255 - a) + 127) / 255);
}

/**
 * The image, or undefined when the file is a PNG of another kind (or no PNG). A PNG of the kind
 * taken whose data is broken (a bad CRC, truncated or corrupt deflate data, an unknown filter)
 * throws an Error saying what.
 */
export function decodeSimplePng(b: Uint8Array): DecodedPng | undefined {
  if (b.length < 33 || SIGNATURE.some((x, i) => b[i] !== x)) return undefined;
  const width = u32(b, 16);
  const height = u32(b, 20);
  const [depth, colour, compression, filter, interlace] = b.subarray(24, 29);
  const channels = CHANNELS[colour];
  if (depth !== 8 || !channels || compression !== 0 || filter !== 0 || interlace !== 0)
    return undefined;
  if (width === 0 || height === 0) return undefined;

  const idat: Uint8Array[] = [];
  let ended = false;
  for (let at = 8; at + 12 <= b.length;) {
    const length = u32(b, at);
    const end = at + 12 + length;
    if (end > b.length) throw new Error(`PNG: the chunk at byte ${at} runs past the file's end`);
    const type = String.fromCharCode(b[at + 4], b[at + 5], b[at + 6], b[at + 7]);
    if (crc32(b.subarray(at + 4, at + 8 + length)) >>> 0 !== u32(b, at + 8 + length))
      throw new Error(`PNG: bad CRC in the ${type} chunk at byte ${at}`);
    if (type === 'tRNS' || type === 'PLTE') return undefined; // pngjs's
    if (type === 'IDAT') idat.push(b.subarray(at + 8, at + 8 + length));
    at = end;
    if (type === 'IEND') {
      ended = true;
      break;
    }
  }
  if (!ended) throw new Error('PNG: no IEND chunk (the file is truncated)');
  if (idat.length === 0) throw new Error('PNG: no IDAT chunk');

  const stride = width * channels;
  const expected = height * (stride + 1);
  let raw: Buffer;
  try {
    raw = inflateSync(idat.length === 1 ? idat[0] : Buffer.concat(idat));
  } catch (e) {
    throw new Error(`PNG: the image data does not inflate: ${(e as Error).message}`, { cause: e });
  }
  if (raw.length < expected)
    throw new Error(`PNG: the image data holds ${raw.length} bytes, not ${expected}`);

  const pixels = unfilter(raw, height, stride, channels);
  return { width, height, data: toRgb(pixels, width * height, channels) };
}

/** The rows with their filters undone (PNG's None, Sub, Up, Average, Paeth), row after row. */
function unfilter(raw: Uint8Array, height: number, stride: number, bpp: number): Uint8Array {
  const out = new Uint8Array(height * stride);
  for (let y = 0; y < height; y++) {
    const type = raw[y * (stride + 1)];
    const src = y * (stride + 1) + 1;
    const row = y * stride;
    const up = row - stride; // the row above in out (absent on the first row: zeros)
    const first = y === 0;
    switch (type) {
      case 0:
        out.set(raw.subarray(src, src + stride), row);
        break;
      case 1:
        for (let i = 0; i < stride; i++)
          out[row + i] = raw[src + i] + (i >= bpp ? out[row + i - bpp] : 0);
        break;
      case 2:
        for (let i = 0; i < stride; i++) out[row + i] = raw[src + i] + (first ? 0 : out[up + i]);
        break;
      case 3:
        for (let i = 0; i < stride; i++) {
          const left = i >= bpp ? out[row + i - bpp] : 0;
          const above = first ? 0 : out[up + i];
          out[row + i] = raw[src + i] + ((left + above) >> 1);
        }
        break;
      case 4:
        for (let i = 0; i < stride; i++) {
          const a = i >= bpp ? out[row + i - bpp] : 0;
          const bb = first ? 0 : out[up + i];
          const c = i >= bpp && !first ? out[up + i - bpp] : 0;
          const p = a + bb - c;
          const pa = Math.abs(p - a);
          const pb = Math.abs(p - bb);
          const pc = Math.abs(p - c);
          out[row + i] = raw[src + i] + (pa <= pb && pa <= pc ? a : pb <= pc ? bb : c);
        }
        break;
      default:
        throw new Error(`PNG: row ${y} has filter type ${type} (0 to 4 exist)`);
    }
  }
  return out;
}

/** grey replicated, alpha composited onto white (PIL's RGBA → RGB of the processor) */
function toRgb(p: Uint8Array, pixels: number, channels: number): Uint8Array {
  if (channels === 3) return p;
  const rgb = new Uint8Array(pixels * 3);
  for (let i = 0; i < pixels; i++) {
    if (channels === 1) {
      rgb[i * 3] = rgb[i * 3 + 1] = rgb[i * 3 + 2] = p[i];
    } else if (channels === 2) {
      rgb[i * 3] = rgb[i * 3 + 1] = rgb[i * 3 + 2] = overWhite(p[i * 2], p[i * 2 + 1]);
    } else {
      const a = p[i * 4 + 3];
      rgb[i * 3] = overWhite(p[i * 4], a);
      rgb[i * 3 + 1] = overWhite(p[i * 4 + 1], a);
      rgb[i * 3 + 2] = overWhite(p[i * 4 + 2], a);
    }
  }
  return rgb;
}
