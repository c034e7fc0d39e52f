// The image processor of the Qwen-VL models (Hugging Face's Qwen2-VL image processor, the
// PIL-based one, as its code describes it): an RGB image is resized to sides that are multiples
// of patch × merge within [min_pixels, max_pixels] (smart_resize), by Pillow's bicubic
// resampling, then rescaled by 1/255 and normalized with the model's mean and std. The result is
// an image [3, h, w] that the runtime cuts into patches (docs/qwen-vl.md). Checked against PIL
// itself: test/reference/image_processor.py.

import { UserError } from '../../compiler/errors.js';
import { smartResize as hfSmartResize } from '../../compiler/frontend/data-profile.js';

export interface ProcessorSpec {
  /** patch × merge: both sides come out multiples of it (28 for Qwen2.5-VL, 32 for Qwen3-VL) */
  readonly factor: number;
  readonly minPixels: number;
  readonly maxPixels: number;
  readonly mean: readonly [number, number, number];
  readonly std: readonly [number, number, number];
}

/** An 8-bit RGB image, row-major [height, width, 3]. */
export interface RgbImage {
  readonly height: number;
  readonly width: number;
  readonly data: Uint8Array;
}

/** HF's smart_resize: [height, width] of the resized image (compiler/frontend/data-profile.ts). */
export function smartResize(height: number, width: number, s: ProcessorSpec): [number, number] {
  if (Math.max(height, width) / Math.min(height, width) > 200)
    throw new UserError(`an image of ${height}×${width} pixels has an aspect ratio over 200`);
  return hfSmartResize(height, width, s.factor, s.minPixels, s.maxPixels);
}

/** Pillow's bicubic kernel (a = −0.5), support 2 */
function bicubic(x: number): number {
  const a = -0.5;
  x = Math.abs(x);
  if (x < 1) return ((a + 2) * x - (a + 3)) * x * x + 1;
  if (x < 2) return (((x - 5) * x + 8) * x - 4) * a;
  return 0;
}

/** Pillow's fixed-point precision of 8-bit resampling */
const PRECISION_BITS = 32 - 8 - 2;
/** 0.5 in fixed point: each sum starts at it, so that the shift rounds */
const HALF = 1 << (PRECISION_BITS - 1);

/** the fixed-point sum shifted back (Pillow's `ss >> PRECISION_BITS`), clipped to 8 bits */
function clip8(ss: number): number {
  // |ss| < 2³¹: 255 × the positive weights (at most about 1.15 × 2²²) + HALF
  const v = ss >> PRECISION_BITS;
  return v <= 0 ? 0 : v >= 255 ? 255 : v;
}

interface Coefficients {
  /** per output index: the first input index it reads */
  readonly first: Int32Array;
  /** per output index: how many inputs it reads, at most `taps` */
  readonly count: Int32Array;
  /** [outSize, taps] fixed-point weights: output o's from o·taps */
  readonly weights: Int32Array;
  readonly taps: number;
}

/**
 * Pillow's precompute_coeffs for resizing a side of `inSize` to `outSize`: each output sample is
 * centred at (x + 0.5)·scale, the kernel stretched by the scale when shrinking (antialiasing), the
 * weights normalised to sum 1 and then rounded to fixed point.
 */
function coefficients(inSize: number, outSize: number): Coefficients {
  const scale = inSize / outSize;
  const filterScale = Math.max(scale, 1);
  const support = 2 * filterScale;
  // Pillow multiplies by the inverse of the filter scale (a division differs in the last bit)
  const inverse = 1 / filterScale;
  const taps = Math.ceil(support) * 2 + 1;
  const first = new Int32Array(outSize);
  const count = new Int32Array(outSize);
  const weights = new Int32Array(outSize * taps);
  const w = new Float64Array(taps);
  for (let x = 0; x < outSize; x++) {
    const center = (x + 0.5) * scale;
    const lo = Math.max(0, Math.trunc(center - support + 0.5));
    const hi = Math.min(inSize, Math.trunc(center + support + 0.5));
    let sum = 0;
    for (let i = lo; i < hi; i++) {
      w[i - lo] = bicubic((i - center + 0.5) * inverse);
      sum += w[i - lo];
    }
    first[x] = lo;
    count[x] = hi - lo;
    for (let k = 0; k < hi - lo; k++) {
      const v = (sum !== 0 ? w[k] / sum : w[k]) * 2 ** PRECISION_BITS;
      weights[x * taps + k] = Math.trunc(v < 0 ? v - 0.5 : v + 0.5);
    }
  }
  return { first, count, weights, taps };
}

/** Pillow's horizontal pass: each row resampled to `outWidth`, the three channels together */
function horizontalPass(src: RgbImage, outWidth: number): RgbImage {
  const { height, width, data: s } = src;
  const { first, count, weights, taps } = coefficients(width, outWidth);
  const data = new Uint8Array(height * outWidth * 3);
  for (let y = 0; y < height; y++) {
    const rowIn = y * width * 3;
    let o = y * outWidth * 3;
    for (let x = 0; x < outWidth; x++, o += 3) {
      const n = count[x];
      const wk = x * taps;
      let at = rowIn + first[x] * 3;
      let r = HALF;
      let g = HALF;
      let b = HALF;
      for (let k = 0; k < n; k++, at += 3) {
        const w = weights[wk + k];
        r += s[at] * w;
        g += s[at + 1] * w;
        b += s[at + 2] * w;
      }
      data[o] = clip8(r);
      data[o + 1] = clip8(g);
      data[o + 2] = clip8(b);
    }
  }
  return { height, width: outWidth, data };
}

/** Pillow's vertical pass: each output row a weighted sum of input rows, sample by sample */
function verticalPass(src: RgbImage, outHeight: number): RgbImage {
  const { height, width, data: s } = src;
  const { first, count, weights, taps } = coefficients(height, outHeight);
  const row = width * 3;
  const data = new Uint8Array(outHeight * row);
  // an output row's sums, input row by input row (a pass over contiguous memory each)
  const sums = new Int32Array(row);
  for (let y = 0; y < outHeight; y++) {
    sums.fill(HALF);
    for (let k = 0; k < count[y]; k++) {
      const w = weights[y * taps + k];
      const rowIn = (first[y] + k) * row;
      for (let j = 0; j < row; j++) sums[j] += s[rowIn + j] * w;
    }
    const o = y * row;
    for (let j = 0; j < row; j++) data[o + j] = clip8(sums[j]);
  }
  return { height: outHeight, width, data };
}

/** Pillow's Image.resize(…, BICUBIC) of an 8-bit RGB image: horizontal pass, then vertical. */
export function resizeBicubic(img: RgbImage, height: number, width: number): RgbImage {
  let out = img;
  if (width !== img.width) out = horizontalPass(out, width);
  if (height !== img.height) out = verticalPass(out, height);
  return out;
}

/**
 * The processed image: resized (to smart_resize's size, or to `size` [h, w] where the caller
 * decided it), rescaled and normalized, channel-major [3, h, w].
 */
export function processImage(
  img: RgbImage,
  s: ProcessorSpec,
  size?: readonly [number, number],
): { height: number; width: number; pixels: Float32Array } {
  if (img.data.length !== img.height * img.width * 3)
    throw new UserError(
      `an image of ${img.height}×${img.width} pixels has ${img.data.length} bytes, not ${img.height * img.width * 3}`,
    );
  const [h, w] = size ?? smartResize(img.height, img.width, s);
  const r = resizeBicubic(img, h, w);
  const hw = h * w;
  const pixels = new Float32Array(3 * hw);
  const table = normalizeTable(s);
  // one pass over the interleaved bytes, three planes written
  const data = r.data;
  for (let i = 0, at = 0; i < hw; i++, at += 3) {
    pixels[i] = table[data[at]];
    pixels[hw + i] = table[256 + data[at + 1]];
    pixels[2 * hw + i] = table[512 + data[at + 2]];
  }
  return { height: h, width: w, pixels };
}

/** [3, 256] normalized values of each byte, by mean and std (a few per run: built once each). */
const tables = new Map<string, Float32Array>();

/** HF rescales to float32, then normalizes in float32: a value per byte, looked up. */
function normalizeTable(s: ProcessorSpec): Float32Array {
  const key = `${s.mean.join(',')}/${s.std.join(',')}`;
  let table = tables.get(key);
  if (!table) {
    table = new Float32Array(3 * 256);
    for (let ch = 0; ch < 3; ch++) {
      const mean = Math.fround(s.mean[ch]);
      const std = Math.fround(s.std[ch]);
      for (let v = 0; v < 256; v++)
        table[ch * 256 + v] = Math.fround(Math.fround(Math.fround(v * (1 / 255)) - mean) / std);
    }
    tables.set(key, table);
  }
  return table;
}
