// Microbatches as the runtime takes them: the batch contract of docs/qwen-vl.md, and its file form
// (the step exchange format of tiny-vlm.md, extended): per microbatch j
//   mb{j}.tokens|labels|loss_mask|segments   [S]
//   mb{j}.positions                          [S], or [3, S] M-RoPE ids (t, h, w)
//   mb{j}.image{i}                           [3, H, W] images, or instead
//   mb{j}.pixel_values, mb{j}.image_grid_thw [N, C·T·P·P] patches and [n, 3] grids
//   mb{j}.window_segments                    [N] (window attention; optional, checked)
//   mb{j}.image_token_id                     [] the placeholder id (optional: the model's)
//   mb{j}.caption_mask                       [S] where the caption metric counts (optional: the
//                                            synthetic task's caption tokens; data: the replies)

import { UserError } from '../compiler/errors.js';
import type { ModelConfig } from '../compiler/frontend/config.js';
import type { NativeAddon, NativeRuntimeOptions } from './native.js';
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
  /** [S], or [3, S] (rows t, h, w) for an M-RoPE model */
  readonly positions: Int32Array;
  readonly segments: Int32Array;
  /** images the runtime cuts into patches; empty when pixelValues and grids are given */
  readonly images: readonly Image[];
  /** [N, C·T·P·P] patches in merge-block order */
  readonly pixelValues?: Float32Array;
  /** each image's (t, h, w) grid in patches, flat [n·3] */
  readonly grids?: Int32Array;
  /** [N] each patch's attention window (checked against the grids' windows) */
  readonly windowSegments?: Int32Array;
  /** the placeholder id of the text (default: the model's image_token_id) */
  readonly imageTokenId?: number;
  readonly captionMask?: Uint8Array;
}

type FieldShape = 'S' | 'positions' | 'patches' | 'grids' | 'N' | 'scalar';

/** The batch contract, field by field: its file name, dtype and shape, and whether it must be there. */
export const MICROBATCH_FIELDS: readonly {
  readonly name: string;
  readonly dtype: 'I32' | 'U8' | 'F32';
  readonly shape: FieldShape;
  readonly required: boolean;
  readonly doc: string;
}[] = [
  { name: 'tokens', dtype: 'I32', shape: 'S', required: true, doc: 'token ids; 0 padding' },
  {
    name: 'labels',
    dtype: 'I32',
    shape: 'S',
    required: true,
    doc: 'next text token of the sample, else 0',
  },
  { name: 'loss_mask', dtype: 'U8', shape: 'S', required: true, doc: '1 where the label counts' },
  {
    name: 'segments',
    dtype: 'I32',
    shape: 'S',
    required: true,
    doc: 'sample index, -1 on padding',
  },
  {
    name: 'positions',
    dtype: 'I32',
    shape: 'positions',
    required: true,
    doc: '[S] or M-RoPE [3, S]',
  },
  {
    name: 'pixel_values',
    dtype: 'F32',
    shape: 'patches',
    required: false,
    doc: '[N, C·T·P·P] patches',
  },
  { name: 'image_grid_thw', dtype: 'I32', shape: 'grids', required: false, doc: '[n, 3] grids' },
  {
    name: 'window_segments',
    dtype: 'I32',
    shape: 'N',
    required: false,
    doc: '[N] window of each patch',
  },
  {
    name: 'image_token_id',
    dtype: 'I32',
    shape: 'scalar',
    required: false,
    doc: 'the placeholder id',
  },
  {
    name: 'caption_mask',
    dtype: 'U8',
    shape: 'S',
    required: false,
    doc: '1 where the caption metric counts',
  },
];

/** The runtime's view of images for a model: patch, frames, merge, windows, table, tokens. */
export function visionOptions(model: ModelConfig['model']): NativeRuntimeOptions {
  const e = model.image_encoder;
  const d = model.text_decoder;
  return {
    patchSize: e.patch_size,
    mergeSize: e.spatial_merge_size,
    temporalPatch: e.temporal_patch_size,
    windowMerged: e.window_size > 0 ? e.window_size / e.patch_size / e.spatial_merge_size : 0,
    tableSide:
      e.position_embedding === 'interpolated'
        ? Math.round(Math.sqrt(e.num_position_embeddings))
        : 0,
    imageTokenId: d.image_token_id,
    positionRows: d.mrope_section.length > 1 ? 3 : 1,
  };
}

/**
 * The microbatch in the contract's form: its images as patches with their grids, its window ids,
 * its placeholder id. The tiny-vlm exchange files keep images (shared/reference/tiny-vlm.md); a
 * model with temporal patches (the Qwen presets) is dumped this way.
 */
export function inContractForm(
  mb: Microbatch,
  v: NativeRuntimeOptions,
  native: Pick<NativeAddon, 'patchify' | 'windowSegments'>,
): Microbatch {
  if (!mb.images.length && mb.grids) return mb;
  const { pixelValues, grids } = native.patchify(
    mb,
    v.patchSize ?? 4,
    v.mergeSize ?? 2,
    v.temporalPatch ?? 1,
  );
  return {
    ...mb,
    images: [],
    pixelValues,
    grids,
    ...(v.windowMerged
      ? { windowSegments: native.windowSegments(grids, v.mergeSize ?? 2, v.windowMerged) }
      : {}),
    imageTokenId: mb.imageTokenId ?? v.imageTokenId ?? 1,
  };
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
    const S = mb.tokens.length;
    const s = [S];
    t.set(`mb${j}.tokens`, { dtype: 'I32', shape: s, data: mb.tokens });
    t.set(`mb${j}.labels`, { dtype: 'I32', shape: s, data: mb.labels });
    t.set(`mb${j}.loss_mask`, { dtype: 'U8', shape: s, data: mb.lossMask });
    const rows = S && mb.positions.length / S;
    t.set(`mb${j}.positions`, {
      dtype: 'I32',
      shape: rows > 1 ? [rows, S] : s,
      data: mb.positions,
    });
    t.set(`mb${j}.segments`, { dtype: 'I32', shape: s, data: mb.segments });
    mb.images.forEach((im, i) =>
      t.set(`mb${j}.image${i}`, { dtype: 'F32', shape: [3, im.height, im.width], data: im.pixels }),
    );
    if (mb.grids) {
      const n = mb.grids.length / 3;
      const pv = mb.pixelValues ?? new Float32Array(0);
      let patches = 0;
      for (let i = 0; i < n; i++)
        patches += mb.grids[3 * i] * mb.grids[3 * i + 1] * mb.grids[3 * i + 2];
      t.set(`mb${j}.pixel_values`, {
        dtype: 'F32',
        shape: [patches, patches ? pv.length / patches : 0],
        data: pv,
      });
      t.set(`mb${j}.image_grid_thw`, { dtype: 'I32', shape: [n, 3], data: mb.grids });
    }
    if (mb.windowSegments)
      t.set(`mb${j}.window_segments`, {
        dtype: 'I32',
        shape: [mb.windowSegments.length],
        data: mb.windowSegments,
      });
    if (mb.captionMask)
      t.set(`mb${j}.caption_mask`, { dtype: 'U8', shape: s, data: mb.captionMask });
    if (mb.imageTokenId !== undefined)
      t.set(`mb${j}.image_token_id`, {
        dtype: 'I32',
        shape: [],
        data: Int32Array.of(mb.imageTokenId),
      });
  });
  return t;
}

export function readBatchFile(path: string): Microbatch[] {
  const tensors = readSafetensors(path).tensors;
  const out: Microbatch[] = [];
  for (let j = 0; tensors.has(`mb${j}.tokens`); j++) {
    const where = (field: string) => `${path}: mb${j}.${field}`;
    const get = (field: string, dtype: string, required = true) => {
      const t = tensors.get(`mb${j}.${field}`);
      if (!t) {
        if (!required) return undefined;
        throw new UserError(`${where(field)} is missing`);
      }
      if (t.dtype !== dtype) throw new UserError(`${where(field)} is ${t.dtype}, want ${dtype}`);
      return t;
    };
    const tokens = get('tokens', 'I32')!;
    const S = tokens.shape[0];
    const perToken = (field: string, dtype: string) => {
      const t = get(field, dtype)!;
      if (t.shape.length !== 1 || t.shape[0] !== S)
        throw new UserError(`${where(field)} is [${t.shape.join(', ')}]; tokens is [${S}]`);
      return t;
    };
    const labels = perToken('labels', 'I32');
    const mask = perToken('loss_mask', 'U8');
    const segments = perToken('segments', 'I32');
    const positions = get('positions', 'I32')!;
    const ps = positions.shape;
    if (!((ps.length === 1 && ps[0] === S) || (ps.length === 2 && ps[0] === 3 && ps[1] === S)))
      throw new UserError(`${where('positions')} is [${ps.join(', ')}]; want [${S}] or [3, ${S}]`);
    const images: Image[] = [];
    for (let i = 0; tensors.has(`mb${j}.image${i}`); i++) {
      const t = get(`image${i}`, 'F32')!;
      if (t.shape.length !== 3 || t.shape[0] !== 3)
        throw new UserError(`${where(`image${i}`)} must be [3, H, W]`);
      images.push({ height: t.shape[1], width: t.shape[2], pixels: t.data as Float32Array });
    }
    const pixels = get('pixel_values', 'F32', false);
    const grids = get('image_grid_thw', 'I32', false);
    if ((pixels === undefined) !== (grids === undefined))
      throw new UserError(
        `${path}: mb${j} gives ${pixels ? 'pixel_values' : 'image_grid_thw'} without ${pixels ? 'image_grid_thw' : 'pixel_values'}`,
      );
    if (pixels && images.length)
      throw new UserError(`${path}: mb${j} gives both image{i} and pixel_values`);
    if (grids && (grids.shape.length !== 2 || grids.shape[1] !== 3))
      throw new UserError(`${where('image_grid_thw')} is [${grids.shape.join(', ')}]; want [n, 3]`);
    if (pixels && pixels.shape.length !== 2)
      throw new UserError(
        `${where('pixel_values')} is [${pixels.shape.join(', ')}]; want [N, C·T·P·P]`,
      );
    const windows = get('window_segments', 'I32', false);
    if (windows && windows.shape.length !== 1)
      throw new UserError(`${where('window_segments')} must be [N]`);
    const caption = tensors.has(`mb${j}.caption_mask`) ? perToken('caption_mask', 'U8') : undefined;
    const token = get('image_token_id', 'I32', false);
    if (token && token.data.length !== 1)
      throw new UserError(`${where('image_token_id')} must hold one value`);
    out.push({
      tokens: tokens.data as Int32Array,
      labels: labels.data as Int32Array,
      lossMask: mask.data as Uint8Array,
      positions: positions.data as Int32Array,
      segments: segments.data as Int32Array,
      images,
      ...(pixels ? { pixelValues: pixels.data as Float32Array } : {}),
      ...(grids ? { grids: grids.data as Int32Array } : {}),
      ...(windows ? { windowSegments: windows.data as Int32Array } : {}),
      ...(token ? { imageTokenId: (token.data as Int32Array)[0] } : {}),
      ...(caption ? { captionMask: caption.data as Uint8Array } : {}),
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
