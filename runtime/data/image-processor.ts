// The image processor of the Qwen-VL models (Hugging Face's Qwen2-VL image processor, the
// PIL-based one, as its code describes it): an RGB image is resized to sides that are multiples
// of patch × merge within [min_pixels, max_pixels] (smart_resize), by Pillow's bicubic
// resampling, then rescaled by 1/255 and normalized with the model's mean and std. The result is
// an image [3, h, w] that the runtime cuts into patches (docs/qwen-vl.md). Checked against PIL
// itself: test/reference/image_processor.py.

import { UserError } from '../../compiler/errors.js';

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

/** Python's round(): half to even. */
function roundHalfEven(x: number): number {
  const r = Math.round(x);
  return Math.abs(x % 1) === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

/** HF's smart_resize: [height, width] of the resized image. */
export function smartResize(height: number, width: number, s: ProcessorSpec): [number, number] {
  if (Math.max(height, width) / Math.min(height, width) > 200)
    throw new UserError(`an image of ${height}×${width} pixels has an aspect ratio over 200`);
  const f = s.factor;
  let h = roundHalfEven(height / f) * f;
  let w = roundHalfEven(width / f) * f;
  if (h * w > s.maxPixels) {
    const beta = Math.sqrt((height * width) / s.maxPixels);
    h = Math.max(f, Math.floor(height / beta / f) * f);
    w = Math.max(f, Math.floor(width / beta / f) * f);
  } else if (h * w < s.minPixels) {
    const beta = Math.sqrt(s.minPixels / (height * width));
    h = Math.ceil((height * beta) / f) * f;
    w = Math.ceil((width * beta) / f) * f;
  }
  return [h, w];
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

interface Coefficients {
  /** per output index: the first input index and the integer weights from it */
  readonly first: Int32Array;
  readonly weights: Int32Array[];
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
  const first = new Int32Array(outSize);
  const weights: Int32Array[] = [];
  for (let x = 0; x < outSize; x++) {
    const center = (x + 0.5) * scale;
    const lo = Math.max(0, Math.trunc(center - support + 0.5));
    const hi = Math.min(inSize, Math.trunc(center + support + 0.5));
    const w: number[] = [];
    let sum = 0;
    for (let i = lo; i < hi; i++) {
      const k = bicubic((i - center + 0.5) / filterScale);
      w.push(k);
      sum += k;
    }
    const one = 2 ** PRECISION_BITS;
    first[x] = lo;
    weights.push(
      Int32Array.from(w, (k) => {
        const v = (sum !== 0 ? k / sum : k) * one;
        return Math.trunc(v < 0 ? v - 0.5 : v + 0.5);
      }),
    );
  }
  return { first, weights };
}

const clip8 = (v: number) => (v <= 0 ? 0 : v >= 255 ? 255 : v);

/** one pass of Pillow's 8-bit resampling along rows (horizontal) or columns */
function pass(src: RgbImage, out: number, horizontal: boolean): RgbImage {
  const [inSize, height, width] = horizontal
    ? [src.width, src.height, out]
    : [src.height, out, src.width];
  const c = coefficients(inSize, out);
  const data = new Uint8Array(height * width * 3);
  const half = 2 ** (PRECISION_BITS - 1);
  for (let y = 0; y < height; y++)
    for (let x = 0; x < width; x++) {
      const o = horizontal ? x : y;
      const w = c.weights[o];
      for (let ch = 0; ch < 3; ch++) {
        let ss = half;
        for (let k = 0; k < w.length; k++) {
          const i = c.first[o] + k;
          const at = horizontal ? (y * src.width + i) * 3 : (i * src.width + x) * 3;
          ss += src.data[at + ch] * w[k];
        }
        // the fixed-point sum shifted back: Pillow's (ss >> PRECISION_BITS), clipped to 8 bits
        data[(y * width + x) * 3 + ch] = clip8(Math.floor(ss / 2 ** PRECISION_BITS));
      }
    }
  return { height, width, data };
}

/** Pillow's Image.resize(…, BICUBIC) of an 8-bit RGB image: horizontal pass, then vertical. */
export function resizeBicubic(img: RgbImage, height: number, width: number): RgbImage {
  let out = img;
  if (width !== img.width) out = pass(out, width, true);
  if (height !== img.height) out = pass(out, height, false);
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
  const pixels = new Float32Array(3 * h * w);
  for (let ch = 0; ch < 3; ch++) {
    // HF rescales in float32, then normalizes in float32
    const mean = Math.fround(s.mean[ch]);
    const std = Math.fround(s.std[ch]);
    for (let i = 0; i < h * w; i++) {
      const x = Math.fround(r.data[i * 3 + ch] * (1 / 255));
      pixels[ch * h * w + i] = Math.fround(Math.fround(x - mean) / std);
    }
  }
  return { height: h, width: w, pixels };
}
