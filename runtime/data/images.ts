// The images of the data path: encoded bytes (PNG, JPEG; what else sharp's libvips reads, e.g.
// WebP and GIF, passes too) in, the processed image the runtime patchifies out. Decoding follows
// what Hugging Face's pipeline gets from PIL: `load_image`'s EXIF transpose, then the Qwen2-VL
// processor's `convert_to_rgb` (a non-RGB image goes to RGBA and is alpha-composited onto white),
// as when the processor is given the image PIL opened. (`load_image` itself ends with
// convert('RGB'), which drops alpha without compositing; qwen-vl-utils pastes onto white.)
// Checked against PIL itself: test/reference/image_processor.py writes the files and PIL's pixels.
//
// Decoding is libvips (through sharp) with PIL's choices where the two differ:
//   - no ICC transform (PIL ignores embedded profiles; sharp would convert to sRGB);
//   - CMYK is read as CMYK and turned into RGB by PIL's own formula, not a colour profile;
//   - corrupt-data warnings pass (PIL decodes such JPEGs), truncation and errors fail;
//   - 16-bit samples keep their high byte (PIL's reading of 16-bit RGB PNGs). PIL 9.4 clips a
//     16-bit grayscale PNG to 0..255 instead (nearly every pixel white); lfc keeps the high byte
//     there too, the image the file holds.
// The rest (palette, grayscale, bit depths below 8, tRNS) is libvips's, equal to PIL's on the
// fixtures, and so is the JPEG decoding itself (libjpeg-turbo's islow IDCT and fancy upsampling).

import { PNG } from 'pngjs';
import sharp from 'sharp';
import { imageHeader, orientedSize } from './image-headers.js';
import { decodeSimplePng, overWhite } from './png.js';
import { processedSize, type ImageProcessorSpec } from '../../compiler/frontend/data-profile.js';
import { processImage, type RgbImage } from './image-processor.js';
import { DataError } from './sample.js';

/**
 * libvips's process-wide settings, for data workers that decode one image after another.
 * - One thread per image: a JPEG or PNG decodes on one thread anyway (4 threads decoded 448×448
 *   JPEGs no faster on one core), and a pool per image would oversubscribe the cores when several
 *   workers decode at once. sharp already picks 1 under glibc's allocator but the number of cores
 *   under musl or jemalloc; set here so that it does not depend on the allocator.
 * - No operation cache: every input is a new buffer, so it never hits; it only held 100
 *   operations and about 22 MiB more resident memory after 300 decodes of 1024×768 JPEGs.
 */
sharp.concurrency(1);
sharp.cache(false);

export type { ImageProcessorSpec };

/** A processed image, ready to be cut into patches. */
export interface ProcessedImage {
  /** resized height and width in pixels, multiples of patch × merge */
  readonly height: number;
  readonly width: number;
  /** rescaled and normalized, channel-major [3, height, width] */
  readonly pixels: Float32Array;
  /** image_grid_thw: temporal patches (1), patch rows, patch columns */
  readonly grid: readonly [number, number, number];
}

/** The size an image shows, EXIF orientation applied. */
export interface ImageSize {
  readonly width: number;
  readonly height: number;
}

// What sharp is asked for, every time: orientation as PIL's exif_transpose, no ICC transform, and
// failure on truncated or broken data but not on libjpeg's warnings.
const READ = { autoOrient: true, ignoreIcc: true, failOn: 'error' } as const;

/** sharp's error message, first line, as the reason of a DataError */
function cannotDecode(where: string, e: unknown): DataError {
  const message = e instanceof Error ? e.message : String(e);
  const reason = message.split('\n', 1)[0].trim() || 'unknown error';
  return new DataError(where, `cannot decode the image: ${reason}`);
}

/** the processor's bound on aspect ratio (smart_resize's), named against the file */
function checkAspect(size: ImageSize, where: string): void {
  const { width, height } = size;
  if (width < 1 || height < 1)
    throw new DataError(where, `cannot decode the image: it is ${width}×${height} pixels`);
  if (Math.max(width, height) / Math.min(width, height) > 200)
    throw new DataError(
      where,
      `the image is ${width}×${height} pixels (width × height), an aspect ratio over 200, which the image processor refuses`,
    );
}

/**
 * The image's width and height after EXIF orientation, from its header alone: the pixel data is
 * not read, so a truncated file passes here and fails in decodeImage.
 */
export async function imageInfo(bytes: Buffer, where: string): Promise<ImageSize> {
  const header = imageHeader(bytes);
  if (header && header.width > 0 && header.height > 0) {
    const size = orientedSize(header);
    checkAspect(size, where);
    return size;
  }
  let size: ImageSize;
  try {
    const m = await sharp(bytes, READ).metadata();
    size = { width: m.autoOrient.width, height: m.autoOrient.height };
  } catch (e) {
    throw cannotDecode(where, e);
  }
  checkAspect(size, where);
  return size;
}

/** PIL's CMYK → RGB: each channel (255 − k) − c·(255 − k)/255, the product rounded */
function cmykToRgb(cmyk: Uint8Array, pixels: number): Uint8Array {
  const rgb = new Uint8Array(pixels * 3);
  for (let i = 0; i < pixels; i++) {
    const nk = 255 - cmyk[i * 4 + 3];
    for (let ch = 0; ch < 3; ch++) {
      const t = cmyk[i * 4 + ch] * nk + 128;
      rgb[i * 3 + ch] = nk - (((t >> 8) + t) >> 8);
    }
  }
  return rgb;
}

/** sRGB (+ alpha) samples as sharp gives them → 8-bit RGB, alpha composited onto white */
function toRgb(data: Uint8Array, pixels: number, channels: number): Uint8Array {
  if (channels === 3) return data;
  if (channels !== 4) throw new Error(`sharp gave ${channels} channels, not 3 or 4`);
  const rgb = new Uint8Array(pixels * 3);
  for (let i = 0; i < pixels; i++) {
    const a = data[i * 4 + 3];
    for (let ch = 0; ch < 3; ch++) rgb[i * 3 + ch] = overWhite(data[i * 4 + ch], a);
  }
  return rgb;
}

/**
 * The image as 8-bit RGB, row-major [height, width, 3], as HF's pipeline sees it after PIL:
 * EXIF orientation applied, grayscale and palette expanded, 16-bit samples to their high byte,
 * alpha composited onto white.
 */
export async function decodeImage(bytes: Buffer, where: string): Promise<RgbImage> {
  let img: RgbImage;
  try {
    const header = imageHeader(bytes);
    if (header?.format === 'png' && header.orientation === 1)
      return checked(decodePng(bytes), where);
    const input = sharp(bytes, READ);
    if (header?.format === 'jpeg' && header.components === 4) {
      // the CMYK samples themselves (Adobe's inverted ones already inverted back), no profile
      const { data, info } = await input
        .pipelineColourspace('cmyk')
        .toColourspace('cmyk')
        .raw()
        .toBuffer({ resolveWithObject: true });
      const pixels = info.width * info.height;
      if (info.channels !== 4) throw new Error(`a CMYK image with ${info.channels} channels`);
      img = { height: info.height, width: info.width, data: cmykToRgb(data, pixels) };
    } else {
      // sRGB, 8 bits per sample: grayscale replicated, palettes expanded, tRNS as alpha
      const { data, info } = await input.raw().toBuffer({ resolveWithObject: true });
      const pixels = info.width * info.height;
      img = { height: info.height, width: info.width, data: toRgb(data, pixels, info.channels) };
    }
  } catch (e) {
    throw cannotDecode(where, e);
  }
  return checked(img, where);
}

function checked(img: RgbImage, where: string): RgbImage {
  checkAspect(img, where);
  return img;
}

/**
 * A PNG in this thread (a call into sharp costs ~0.5 ms, most of a small image's decode): the
 * common kinds by png.ts, the rest by pngjs: palettes, grayscale and tRNS expanded to RGBA by pngjs, bit depths below 8 scaled to
 * 8 as PIL does (v·255/(2^d − 1)), 16-bit samples to their high byte, alpha onto white. Its
 * errors (truncated data, a bad CRC) are the file's.
 */
function decodePng(bytes: Buffer): RgbImage {
  const simple = decodeSimplePng(bytes); // 8-bit grey/RGB(A): png.ts, faster
  if (simple) return simple;
  let png: ReturnType<typeof PNG.sync.read>;
  try {
    png = PNG.sync.read(bytes, { skipRescale: true });
  } catch (e) {
    throw new Error(`PNG: ${(e as Error).message}`, { cause: e });
  }
  const { width, height } = png;
  const sixteen = png.depth === 16;
  const data = png.data as unknown as ArrayLike<number>;
  const pixels = width * height;
  if (data.length !== pixels * 4)
    throw new Error(`pngjs gave ${data.length} samples, not ${pixels * 4}`);
  const rgb = new Uint8Array(pixels * 3);
  const low = png.depth < 8 ? 255 / (2 ** png.depth - 1) : 0;
  const sample = (i: number) =>
    sixteen
      ? data[i] >> 8
      : low && (png.colorType as number) !== 3
        ? Math.round(data[i] * low)
        : data[i];
  for (let i = 0; i < pixels; i++) {
    const a = sample(i * 4 + 3);
    for (let ch = 0; ch < 3; ch++) rgb[i * 3 + ch] = overWhite(sample(i * 4 + ch), a);
  }
  return { height, width, data: rgb };
}

/**
 * The decoded image resized (processedSize: smart_resize, then the encoder's max_image_size;
 * Pillow's bicubic), rescaled and normalized, with its grid. `maxPixels` replaces the spec's
 * bound (the loader's, for an image whose visual tokens alone would exceed what a microbatch
 * holds).
 */
export function processDecoded(
  img: RgbImage,
  spec: ImageProcessorSpec,
  maxPixels?: number,
): ProcessedImage {
  const size = processedSize(img.width, img.height, spec, maxPixels);
  const { height, width, pixels } = processImage(img, spec, size);
  return { height, width, pixels, grid: [1, height / spec.patchSize, width / spec.patchSize] };
}

/** The merged visual tokens of an image of this size once processed: t·gh·gw / merge². */
export function visualTokensOf(
  info: ImageSize,
  spec: ImageProcessorSpec,
  maxPixels?: number,
): number {
  const [h, w] = processedSize(info.width, info.height, spec, maxPixels);
  return (h / spec.factor) * (w / spec.factor);
}
