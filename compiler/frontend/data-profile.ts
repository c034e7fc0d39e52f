// Data profiles (configs/data/, docs/data-profiles.md): what a packed microbatch holds, so that
// memory is planned at a bound something enforces and at the sizes expected on average.
//
// A profile gives three independent histograms (value → weight, normalized here): images per
// sample n, the size of one image (pixels, or the merged grid), text tokens per sample t; and an
// optional cap C on the visual tokens of a microbatch. With v the visual tokens of one image
// (visualTokensOfImage) and a microbatch of S tokens:
//   bound     Nv ≤ min(S, C)
//   a sample  L = t + Σ_{its n images} v,  E[L] = E[t] + E[n]·E[v],  visual E[n]·E[v]
//   expected  samples = min(S / E[L], min(S, C) / (E[n]·E[v]))   whole samples until S or C binds
//             visual tokens = samples·E[n]·E[v] (≤ the bound), images = samples·E[n]
//             a token's sample: E[L²] / E[L] tokens (≤ the sequence), E[L²] = E[t²] + 2E[t]E[V]
//             + E[n]·Var(v) + E[n²]·E[v]², V = a sample's visual tokens
// each rounded to the nearest integer. Assumed: the histograms are independent, the packer fills a
// microbatch to S tokens (or to C) with no padding, and these means stand for one microbatch. A
// packer that stops at the first sample that does not fit pads on average E[L(L−1)]/(2·E[L])
// tokens, and the expected sizes are that share too high: negligible when S ≫ E[L].

import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { cachedParse } from './file-cache.js';
import { basename, relative } from 'node:path';
import { didYouMean, UserError } from '../errors.js';
import { configsDir, projectRoot } from '../paths.js';
import type { EncoderConfig } from './config.js';
import { yaml } from './yaml.js';

/** value → probability; the probabilities sum to 1 */
export type Histogram<T> = readonly { readonly value: T; readonly p: number }[];

/** an image as it comes (pixels, resized by the processor) or as the processor's merged grid */
export type ImageSize =
  | { readonly kind: 'pixels'; readonly width: number; readonly height: number }
  | { readonly kind: 'grid'; readonly rows: number; readonly cols: number };

export interface DataProfile {
  name: string;
  description: string;
  reasons: string;
  /** the file, for messages */
  source: string;
  imagesPerSample: Histogram<number>;
  imageSizes: Histogram<ImageSize>;
  textTokens: Histogram<number>;
  /** at most one of the two; neither: no cap beyond the microbatch's tokens */
  caps: { maxVisualTokens?: number; maxVisualFraction?: number };
}

export interface ProfileSizes {
  bound: { visualTokens: number };
  expected: {
    visualTokens: number;
    images: number;
    samples: number;
    /**
     * tokens of the sample a token belongs to, on average over tokens: E[L²] / E[L], at most
     * the sequence (packed samples attend within themselves)
     */
    sampleTokens: number;
  };
}

// ---- visual tokens of an image ---------------------------------------------------------------

// Hugging Face transformers, Qwen2VLImageProcessor (models/qwen2_vl/image_processing_qwen2_vl.py):
// min_pixels 56·56 = 3136 and max_pixels 28·28·1280 = 1003520 by default, at factor 28 (patch 14 ×
// merge 2): 4 and 1280 merged tokens, which lfc scales to the model's factor (Qwen3-VL: patch 16 ×
// merge 2 = 32, so 4096 and 1310720 pixels). Released checkpoints override these in their
// preprocessor_config.json: Qwen2.5-VL 3136 … 12845056 (16384 tokens), Qwen3-VL 65536 (64 tokens)
// … 16777216 (16384 tokens); the encoder's max_image_size bounds lfc's images well below either
// maximum. An encoder's min_pixels and max_pixels, where its preset sets them, replace these.
const MIN_MERGED_TOKENS = 4;
const MAX_MERGED_TOKENS = 1280;
/** the processor refuses images more elongated than this */
const MAX_ASPECT_RATIO = 200;

/** Python's round(): halves to even, as smart_resize rounds */
function roundHalfEven(x: number): number {
  const r = Math.round(x);
  return Math.abs(x % 1) === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

/**
 * HF's smart_resize: [height, width] as multiples of factor nearest the image, scaled down to at
 * most maxPixels or up to at least minPixels keeping the aspect ratio. Unlike HF, an image smaller
 * than factor is scaled up rather than refused, and a side never floors to 0.
 */
export function smartResize(
  height: number,
  width: number,
  factor: number,
  minPixels: number,
  maxPixels: number,
): [number, number] {
  let h = roundHalfEven(height / factor) * factor;
  let w = roundHalfEven(width / factor) * factor;
  if (h * w > maxPixels) {
    const beta = Math.sqrt((height * width) / maxPixels);
    h = Math.max(factor, Math.floor(height / beta / factor) * factor);
    w = Math.max(factor, Math.floor(width / beta / factor) * factor);
  } else if (h * w < minPixels) {
    const beta = Math.sqrt(minPixels / (height * width));
    h = Math.ceil((height * beta) / factor) * factor;
    w = Math.ceil((width * beta) / factor) * factor;
  }
  return [h, w];
}

/** [a, b] shrunk, keeping the ratio and flooring, so that neither exceeds max (all in one unit) */
function fitSides(a: number, b: number, max: number): [number, number] {
  const longest = Math.max(a, b);
  if (longest <= max) return [a, b];
  return [
    Math.max(1, Math.floor((a * max) / longest)),
    Math.max(1, Math.floor((b * max) / longest)),
  ];
}

/** The image processor of an encoder: its sizes, in pixels, and its normalization. */
export interface ImageProcessorSpec {
  readonly patchSize: number;
  readonly mergeSize: number;
  readonly temporalPatch: number;
  /** patch × merge: both sides of a resized image are multiples of it */
  readonly factor: number;
  readonly minPixels: number;
  readonly maxPixels: number;
  /** the encoder's max_image_size: no side is longer */
  readonly maxSide: number;
  readonly mean: readonly [number, number, number];
  readonly std: readonly [number, number, number];
}

export function imageProcessorOf(enc: EncoderConfig): ImageProcessorSpec {
  const factor = enc.patch_size * enc.spatial_merge_size;
  return {
    patchSize: enc.patch_size,
    mergeSize: enc.spatial_merge_size,
    temporalPatch: enc.temporal_patch_size,
    factor,
    minPixels: enc.min_pixels ?? MIN_MERGED_TOKENS * factor ** 2,
    maxPixels: enc.max_pixels ?? MAX_MERGED_TOKENS * factor ** 2,
    maxSide: enc.max_image_size,
    mean: enc.image_mean,
    std: enc.image_std,
  };
}

/**
 * [height, width] in pixels of a width × height image after the processor: smart_resize to
 * multiples of factor = patch_size × spatial_merge_size within [min_pixels, max_pixels] (or the
 * smaller maxPixels given), then, where a side is still longer than the encoder's max_image_size
 * (lfc's graph bounds every image by max_image_size² pixels, a side per position-table row), both
 * sides shrunk to fit, floored to the factor.
 */
export function processedSize(
  width: number,
  height: number,
  spec: ImageProcessorSpec,
  maxPixels: number = spec.maxPixels,
): [number, number] {
  const f = spec.factor;
  if (Math.max(width, height) / Math.min(width, height) > MAX_ASPECT_RATIO)
    throw new UserError(
      `image ${width}x${height}: aspect ratio above ${MAX_ASPECT_RATIO}, which the processor refuses`,
    );
  const [h, w] = smartResize(height, width, f, Math.min(spec.minPixels, maxPixels), maxPixels);
  const [rows, cols] = fitSides(h / f, w / f, spec.maxSide / f);
  return [rows * f, cols * f];
}

/** Merged (post-merger) visual tokens of a width × height image (processedSize). */
export function visualTokensOfImage(width: number, height: number, enc: EncoderConfig): number {
  const spec = imageProcessorOf(enc);
  const [h, w] = processedSize(width, height, spec);
  return (h / spec.factor) * (w / spec.factor);
}

/** Merged tokens of an image given as its merged grid: taken as is, but for max_image_size. */
export function visualTokensOfGrid(rows: number, cols: number, enc: EncoderConfig): number {
  const maxSide = enc.max_image_size / (enc.patch_size * enc.spatial_merge_size);
  const [r, c] = fitSides(rows, cols, maxSide);
  return r * c;
}

// ---- sizes of a microbatch -------------------------------------------------------------------

function mean<T>(h: Histogram<T>, f: (v: T) => number): number {
  return h.reduce((s, { value, p }) => s + p * f(value), 0);
}

/** The bound and the expected sizes of a packed microbatch of S tokens (formula: file header). */
export function profileSizes(
  profile: DataProfile,
  enc: EncoderConfig,
  tokensPerMicrobatch: number,
  seqLength = tokensPerMicrobatch,
): ProfileSizes {
  const S = tokensPerMicrobatch;
  if (!Number.isInteger(S) || S < 1)
    throw new UserError(`tokens per microbatch must be a positive integer, got ${S}`);
  const { maxVisualTokens, maxVisualFraction } = profile.caps;
  const cap =
    maxVisualTokens ?? (maxVisualFraction !== undefined ? Math.floor(maxVisualFraction * S) : S);
  const bound = Math.min(S, cap);
  const imagesPerSample = mean(profile.imagesPerSample, (n) => n);
  const visualOf = (s: ImageSize) =>
    s.kind === 'pixels'
      ? visualTokensOfImage(s.width, s.height, enc)
      : visualTokensOfGrid(s.rows, s.cols, enc);
  const visualPerImage = mean(profile.imageSizes, visualOf);
  const visualPerSample = imagesPerSample * visualPerImage;
  const textPerSample = mean(profile.textTokens, (t) => t);
  const tokensPerSample = textPerSample + visualPerSample;
  // E[L²] of L = t + V, V the sum of n images' tokens (n, sizes and t independent)
  const visualVar = mean(profile.imageSizes, (s) => visualOf(s) ** 2) - visualPerImage ** 2;
  const visualSq =
    imagesPerSample * visualVar + mean(profile.imagesPerSample, (n) => n * n) * visualPerImage ** 2;
  const sampleSq =
    mean(profile.textTokens, (t) => t * t) + 2 * textPerSample * visualPerSample + visualSq;
  const samples = Math.min(
    S / tokensPerSample,
    visualPerSample > 0 ? bound / visualPerSample : Infinity,
  );
  return {
    bound: { visualTokens: bound },
    expected: {
      visualTokens: Math.min(bound, Math.round(samples * visualPerSample)),
      images: Math.round(samples * imagesPerSample),
      samples: Math.round(samples),
      sampleTokens:
        tokensPerSample > 0
          ? Math.min(seqLength, Math.round(sampleSq / tokensPerSample))
          : seqLength,
    },
  };
}

// ---- loading ---------------------------------------------------------------------------------

const FIELDS =
  'name description reasons images_per_sample image_resolution image_grid text_tokens caps';
const CAP_FIELDS = ['max_visual_tokens', 'max_visual_fraction'];

type Tree = Record<string, unknown>;
type Fail = (msg: string) => UserError;
const isTree = (v: unknown): v is Tree => typeof v === 'object' && v !== null && !Array.isArray(v);

export function listDataProfiles(): string[] {
  return readdirSync(configsDir('data'))
    .filter((f) => f.endsWith('.yaml'))
    .map((f) => basename(f, '.yaml'))
    .sort();
}

/** A profile by name (configs/data/NAME.yaml) or YAML path; undefined: `default`. */
export function loadDataProfile(ref = 'default'): DataProfile {
  const names = listDataProfiles();
  const isPath = /\.ya?ml$/.test(ref) || ref.includes('/');
  const file = isPath ? ref : configsDir('data', `${ref}.yaml`);
  if (!existsSync(file))
    throw new UserError(
      isPath
        ? `data profile file ${ref} does not exist; profiles: ${names.join(', ')}`
        : `unknown data profile '${ref}'${didYouMean(ref, names)}; profiles: ${names.join(', ')}`,
    );
  const source = isPath ? ref : relative(projectRoot(), file);
  const fail: Fail = (msg) => new UserError(`${source}: ${msg}`);
  let doc: unknown;
  try {
    doc = cachedParse(file, (): unknown =>
      yaml().parse(readFileSync(file, 'utf8'), { logLevel: 'error' }),
    );
  } catch (e) {
    throw fail(`malformed YAML: ${(e as Error).message.split('\n')[0]}`);
  }
  if (!isTree(doc)) throw fail('expected a mapping at the top level');
  const fields = FIELDS.split(' ');
  for (const k of Object.keys(doc))
    if (!fields.includes(k)) throw fail(`unknown field '${k}'${didYouMean(k, fields)}`);
  const text = (k: string, oneLine: boolean): string => {
    const v = doc[k];
    if (typeof v !== 'string' || !v.trim()) throw fail(`${k}: must be a non-empty string`);
    if (oneLine && v.trim().includes('\n')) throw fail(`${k}: must be one line`);
    return v.trim();
  };
  const count = (min: number) => (key: string) =>
    /^\d+$/.test(key) && Number(key) >= min ? Number(key) : undefined;
  return {
    name: text('name', true),
    description: text('description', true),
    reasons: text('reasons', false),
    source,
    imagesPerSample: histogram(fail, doc, 'images_per_sample', 'a non-negative integer', count(0)),
    imageSizes: imageSizes(fail, doc),
    textTokens: histogram(fail, doc, 'text_tokens', 'a positive integer', count(1)),
    caps: caps(fail, doc.caps ?? {}),
  };
}

/** doc[k] as a histogram, each key read by parse (undefined: not `want`), weights normalized */
function histogram<T>(
  fail: Fail,
  doc: Tree,
  k: string,
  want: string,
  parse: (key: string) => T | undefined,
): Histogram<T> {
  const raw = doc[k];
  if (!isTree(raw)) throw fail(`${k}: must be a mapping of value → weight`);
  const entries = Object.entries(raw).map(([key, w]) => {
    const value = parse(key);
    if (value === undefined) throw fail(`${k}: '${key}' is not ${want}`);
    if (typeof w !== 'number' || !Number.isFinite(w) || w < 0)
      throw fail(`${k}: weight of ${key} must be a non-negative number, got ${JSON.stringify(w)}`);
    return { value, w };
  });
  if (entries.length === 0) throw fail(`${k}: empty; give at least one value → weight`);
  const total = entries.reduce((s, e) => s + e.w, 0);
  if (total === 0) throw fail(`${k}: every weight is 0`);
  return entries.map(({ value, w }) => ({ value, p: w / total }));
}

function imageSizes(fail: Fail, doc: Tree): Histogram<ImageSize> {
  const pair = (key: string) => /^(\d+)x(\d+)$/.exec(key)?.slice(1).map(Number) ?? [0, 0];
  if (doc.image_resolution === undefined && doc.image_grid === undefined)
    throw fail('image_resolution (WIDTHxHEIGHT pixels) or image_grid (ROWSxCOLS) is required');
  if (doc.image_resolution !== undefined && doc.image_grid !== undefined)
    throw fail('give image_resolution or image_grid, not both');
  if (doc.image_grid !== undefined)
    return histogram(fail, doc, 'image_grid', 'ROWSxCOLS in merged tokens', (key) => {
      const [rows, cols] = pair(key);
      return rows >= 1 && cols >= 1 ? { kind: 'grid', rows, cols } : undefined;
    });
  return histogram(fail, doc, 'image_resolution', 'WIDTHxHEIGHT in pixels', (key) => {
    const [width, height] = pair(key);
    if (width < 1 || height < 1) return undefined;
    if (Math.max(width, height) / Math.min(width, height) > MAX_ASPECT_RATIO)
      throw fail(`image_resolution: ${key} is more elongated than the processor takes (200:1)`);
    return { kind: 'pixels', width, height };
  });
}

function caps(fail: Fail, raw: unknown): DataProfile['caps'] {
  if (!isTree(raw)) throw fail('caps: must be a mapping');
  for (const k of Object.keys(raw))
    if (!CAP_FIELDS.includes(k))
      throw fail(`caps: unknown field '${k}'${didYouMean(k, CAP_FIELDS)}`);
  const { max_visual_tokens: tokens, max_visual_fraction: fraction } = raw;
  if (tokens !== undefined && fraction !== undefined)
    throw fail('caps: give max_visual_tokens or max_visual_fraction, not both');
  if (tokens !== undefined) {
    if (typeof tokens !== 'number' || !Number.isInteger(tokens) || tokens < 1)
      throw fail(
        `caps: max_visual_tokens must be a positive integer, got ${JSON.stringify(tokens)}`,
      );
    return { maxVisualTokens: tokens };
  }
  if (fraction !== undefined) {
    if (typeof fraction !== 'number' || !(fraction > 0 && fraction <= 1))
      throw fail(`caps: max_visual_fraction must be in (0, 1], got ${JSON.stringify(fraction)}`);
    return { maxVisualFraction: fraction };
  }
  return {};
}
