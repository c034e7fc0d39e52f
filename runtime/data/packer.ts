// Packing: samples, in the order the sampler draws them, fill microbatches of S tokens with at
// most B visual tokens each; a microbatch closes before the first sample that does not fit, and
// that sample opens the next. A sample that fits no microbatch alone is dropped and counted (or,
// under --truncate, cut to S tokens before the first image whose placeholders pass S).
// The arrays of a packed microbatch follow the batch contract (runtime/batch.ts):
//   tokens     the samples' tokens one after another, then 0 (padding)
//   labels     at i, the token at i + 1 where it is a target of the same sample, else 0
//   loss_mask  1 where labels counts
//   segments   the sample's index in the microbatch, −1 on padding
//   positions  [S] each token's index in its sample, or [3, S] M-RoPE ids (ropeIndex)

import type { Image, Microbatch } from '../batch.js';

/** What the packer needs of a sample, and what the microbatch takes of it. */
export interface PackedSample {
  /** the sample's data position */
  readonly position: number;
  /** [L] with each image's placeholder repeated over its visual tokens */
  readonly tokens: Int32Array;
  /** [L] 1 where the token is one the loss predicts */
  readonly target: Uint8Array;
  /** [L] 1 on an assistant reply's tokens (the caption metric) */
  readonly reply: Uint8Array;
  /** each image's grid in patches (t, h, w) */
  readonly grids: readonly (readonly [number, number, number])[];
  /** merged visual tokens of all its images */
  readonly visual: number;
}

export interface PackBounds {
  /** tokens of a microbatch */
  readonly seqLength: number;
  /** visual tokens of a microbatch */
  readonly maxVisualTokens: number;
}

/** Whether `s` joins a microbatch holding `tokens` and `visual` so far. */
export function fits(
  s: Pick<PackedSample, 'tokens' | 'visual'>,
  tokens: number,
  visual: number,
  b: PackBounds,
): boolean {
  return tokens + s.tokens.length <= b.seqLength && visual + s.visual <= b.maxVisualTokens;
}

/**
 * A sample cut to `seqLength` tokens: at seqLength, or before the placeholders of the first image
 * that would be cut (that image and those after it leave the sample). imageRuns: each image's
 * [start, end) in the tokens.
 */
export function truncated(
  s: PackedSample,
  imageRuns: readonly (readonly [number, number])[],
  seqLength: number,
  mergeSize: number,
): PackedSample {
  let cut = seqLength;
  let keep = imageRuns.length;
  for (let i = 0; i < imageRuns.length; i++)
    if (imageRuns[i][1] > cut) {
      cut = Math.min(cut, imageRuns[i][0]);
      keep = i;
      break;
    }
  const grids = s.grids.slice(0, keep);
  return {
    ...s,
    tokens: s.tokens.slice(0, cut),
    target: s.target.slice(0, cut),
    reply: s.reply.slice(0, cut),
    grids,
    visual: grids.reduce((a, [t, h, w]) => a + (t * h * w) / (mergeSize * mergeSize), 0),
  };
}

/**
 * The microbatch of packed samples, padded to S tokens. images: each sample's images [3, h, w]
 * in order, or undefined where this rank does not encode the microbatch (then grids stand for
 * them). positions: [3, S] M-RoPE ids when given, else each token's index in its sample.
 */
export function assemble(
  samples: readonly PackedSample[],
  S: number,
  o: {
    readonly images?: readonly Image[];
    readonly imageTokenId: number;
    readonly ropeIndex?: (
      tokens: Int32Array,
      segments: Int32Array,
      grids: Int32Array,
    ) => Int32Array;
  },
): Microbatch {
  const tokens = new Int32Array(S);
  const labels = new Int32Array(S);
  const lossMask = new Uint8Array(S);
  const captionMask = new Uint8Array(S);
  const segments = new Int32Array(S).fill(-1);
  const positions = new Int32Array(S);
  const total = samples.reduce((a, s) => a + s.tokens.length, 0);
  if (total > S) throw new Error(`packed ${total} tokens into a microbatch of ${S}`);
  let at = 0;
  samples.forEach((s, k) => {
    const L = s.tokens.length;
    tokens.set(s.tokens, at);
    for (let i = 0; i < L; i++) {
      segments[at + i] = k;
      positions[at + i] = i;
      if (i + 1 < L && s.target[i + 1]) {
        labels[at + i] = s.tokens[i + 1];
        lossMask[at + i] = 1;
        captionMask[at + i] = s.reply[i + 1];
      }
    }
    at += L;
  });
  const grids = Int32Array.from(samples.flatMap((s) => s.grids.flatMap((g) => [...g])));
  return {
    tokens,
    labels,
    lossMask,
    segments,
    positions: o.ropeIndex ? o.ropeIndex(tokens, segments, grids) : positions,
    images: o.images ?? [],
    ...(o.images ? {} : { grids, pixelValues: new Float32Array(0) }),
    imageTokenId: o.imageTokenId,
    captionMask,
  };
}
