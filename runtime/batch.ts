// Microbatches as the runtime takes them, and the step exchange format of tiny-vlm.md:
// `mb{j}.tokens|labels|loss_mask|positions|segments` and `mb{j}.image{i}` [3, H, W].

import { UserError } from '../compiler/errors.js';
import { readSafetensors, writeSafetensors, type Tensor } from './safetensors.js';

export interface Image {
  readonly height: number;
  readonly width: number;
  /** [3, H, W] */
  readonly pixels: Float32Array;
}

export interface Microbatch {
  readonly tokens: Int32Array;
  readonly labels: Int32Array;
  readonly lossMask: Uint8Array;
  readonly positions: Int32Array;
  readonly segments: Int32Array;
  readonly images: readonly Image[];
}

/** Caption tokens of the synthetic task (colours and quadrant): 2–25. */
export const CAPTION_TOKENS = { min: 2, max: 25 } as const;

export function captionMask(mb: Microbatch): Uint8Array {
  const out = new Uint8Array(mb.labels.length);
  mb.labels.forEach((l, i) => {
    out[i] = mb.lossMask[i] && l >= CAPTION_TOKENS.min && l <= CAPTION_TOKENS.max ? 1 : 0;
  });
  return out;
}

export function countOnes(mask: Uint8Array): number {
  let n = 0;
  for (const v of mask) n += v ? 1 : 0;
  return n;
}

export function writeBatchFile(path: string, mbs: readonly Microbatch[]): void {
  writeSafetensors(path, batchTensors(mbs));
}

/** The tensors of a batch file, by name. */
export function batchTensors(mbs: readonly Microbatch[]): Map<string, Tensor> {
  const t = new Map<string, Tensor>();
  mbs.forEach((mb, j) => {
    const s = [mb.tokens.length];
    t.set(`mb${j}.tokens`, { dtype: 'I32', shape: s, data: mb.tokens });
    t.set(`mb${j}.labels`, { dtype: 'I32', shape: s, data: mb.labels });
    t.set(`mb${j}.loss_mask`, { dtype: 'U8', shape: s, data: mb.lossMask });
    t.set(`mb${j}.positions`, { dtype: 'I32', shape: s, data: mb.positions });
    t.set(`mb${j}.segments`, { dtype: 'I32', shape: s, data: mb.segments });
    mb.images.forEach((im, i) =>
      t.set(`mb${j}.image${i}`, { dtype: 'F32', shape: [3, im.height, im.width], data: im.pixels }),
    );
  });
  return t;
}

export function readBatchFile(path: string): Microbatch[] {
  const tensors = readSafetensors(path).tensors;
  const out: Microbatch[] = [];
  for (let j = 0; tensors.has(`mb${j}.tokens`); j++) {
    const get = (field: string, dtype: string) => {
      const t = tensors.get(`mb${j}.${field}`);
      if (!t) throw new UserError(`${path}: mb${j}.${field} is missing`);
      if (t.dtype !== dtype)
        throw new UserError(`${path}: mb${j}.${field} is ${t.dtype}, want ${dtype}`);
      return t;
    };
    const tokens = get('tokens', 'I32');
    const n = tokens.shape[0];
    const rest = ['labels', 'positions', 'segments'].map((f) => get(f, 'I32'));
    const mask = get('loss_mask', 'U8');
    for (const t of [...rest, mask]) {
      if (t.shape.length !== 1 || t.shape[0] !== n)
        throw new UserError(`${path}: mb${j} fields differ in length`);
    }
    const images: Image[] = [];
    for (let i = 0; tensors.has(`mb${j}.image${i}`); i++) {
      const t = get(`image${i}`, 'F32');
      if (t.shape.length !== 3 || t.shape[0] !== 3)
        throw new UserError(`${path}: mb${j}.image${i} must be [3, H, W]`);
      images.push({ height: t.shape[1], width: t.shape[2], pixels: t.data as Float32Array });
    }
    out.push({
      tokens: tokens.data as Int32Array,
      labels: rest[0].data as Int32Array,
      lossMask: mask.data as Uint8Array,
      positions: rest[1].data as Int32Array,
      segments: rest[2].data as Int32Array,
      images,
    });
  }
  if (!out.length) throw new UserError(`${path}: no microbatch (want mb0.tokens, …)`);
  return out;
}

/** Nearest-neighbour resize of a [3, H, W] image. */
function resize(im: Image, height: number, width: number): Image {
  const out = new Float32Array(3 * height * width);
  for (let c = 0; c < 3; c++) {
    for (let y = 0; y < height; y++) {
      const sy = Math.floor((y * im.height) / height);
      for (let x = 0; x < width; x++) {
        const sx = Math.floor((x * im.width) / width);
        out[(c * height + y) * width + x] = im.pixels[(c * im.height + sy) * im.width + sx];
      }
    }
  }
  return { height, width, pixels: out };
}

/**
 * The control of the learning check: every image's content moves to another sample of the
 * global batch (a seeded derangement), resized to the size that sample's placeholders expect,
 * so captions no longer depend on what the image shows.
 */
export function shuffleImages(mbs: readonly Microbatch[], seed: number): Microbatch[] {
  const slots = mbs.flatMap((mb, j) => mb.images.map((_, i) => [j, i] as const));
  const n = slots.length;
  if (n < 2) return [...mbs];
  let state = (seed ^ 0x9e3779b9) >>> 0;
  const rand = () => {
    state = (Math.imul(state, 1664525) + 1013904223) >>> 0;
    return state / 2 ** 32;
  };
  // a derangement: a random cyclic shift of a random permutation
  const perm = slots.map((_, k) => k);
  for (let k = n - 1; k > 0; k--) {
    const r = Math.floor(rand() * (k + 1));
    [perm[k], perm[r]] = [perm[r], perm[k]];
  }
  const source = new Map<number, number>();
  perm.forEach((p, k) => source.set(p, perm[(k + 1) % n]));
  const images = mbs.map((mb) => [...mb.images]);
  slots.forEach(([j, i], k) => {
    const [sj, si] = slots[source.get(k)!];
    const target = mbs[j].images[i];
    images[j][i] = resize(mbs[sj].images[si], target.height, target.width);
  });
  return mbs.map((mb, j) => ({ ...mb, images: images[j] }));
}
