// The order samples are read in: a pure function of the datasets' sizes, the blend weights, the
// split and the seed, indexed by the data position, one global sample index that no layout
// changes (it counts samples drawn from the blend since the run began, dropped ones included).
// Checkpoints hold it, so a resume continues exactly, under any layout.
//
//   parseDataPath(words)   Megatron's --data-path: PATH, or WEIGHT PATH WEIGHT PATH …
//   parseSplit(text)       Megatron's --split: "98,2,0" (train, valid, test), normalized
//   splitRange(n, …)       the samples [start, end) of one part of a dataset of n
//   SampleStream           draw k of the blend → (dataset, sample): dataset d is the one whose
//                          share is most behind (Megatron's blending: argmax w_d·(k+1) − drawn_d),
//                          its j-th draw the sample perm_{d,e}[j mod n_d] of epoch e = ⌊j / n_d⌋,
//                          a permutation seeded by (seed, d, e): every sample once per epoch

import { UserError } from '../../compiler/errors.js';

export interface DataSource {
  readonly weight: number;
  readonly path: string;
}

/** --data-path's words: one path, several paths (weight 1 each), or weight–path pairs. */
export function parseDataPath(words: readonly string[]): DataSource[] {
  if (!words.length) throw new UserError('--data-path needs a dataset');
  const isNumber = (w: string) => /^[+]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?$/i.test(w);
  if (!isNumber(words[0])) {
    const weighted = words.find(isNumber);
    if (weighted !== undefined)
      throw new UserError(
        `--data-path mixes paths with weights ('${weighted}'); give WEIGHT PATH pairs, or paths only`,
      );
    return words.map((path) => ({ weight: 1, path }));
  }
  if (words.length % 2 !== 0)
    throw new UserError(
      `--data-path with weights takes WEIGHT PATH pairs; ${words.length} words leave '${words.at(-1)}' unpaired`,
    );
  const out: DataSource[] = [];
  for (let i = 0; i < words.length; i += 2) {
    const [w, path] = [words[i], words[i + 1]];
    if (!isNumber(w) || !(Number(w) > 0))
      throw new UserError(`--data-path: weight '${w}' of ${path} must be a positive number`);
    if (isNumber(path))
      throw new UserError(`--data-path: '${path}' after weight ${w} is not a path`);
    out.push({ weight: Number(w), path });
  }
  return out;
}

export type SplitPart = 'train' | 'valid' | 'test';
export const SPLIT_PARTS: readonly SplitPart[] = ['train', 'valid', 'test'];

/** "98,2,0" (or "98/2/0"; missing parts are 0) → proportions summing to 1. */
export function parseSplit(text: string): [number, number, number] {
  const parts = text.split(/[,/]/).map((s) => s.trim());
  if (parts.length > 3 || parts.some((p) => !/^\d+(\.\d*)?$/.test(p)))
    throw new UserError(
      `--split '${text}': want up to three non-negative numbers, train,valid,test (e.g. 98,2,0)`,
    );
  const v = [0, 1, 2].map((i) => Number(parts[i] ?? 0));
  const sum = v[0] + v[1] + v[2];
  if (!(sum > 0)) throw new UserError(`--split '${text}' gives nothing to any part`);
  return [v[0] / sum, v[1] / sum, v[2] / sum];
}

/** The samples [start, end) of `part` in a dataset of n: contiguous, train first, by rounding. */
export function splitRange(
  n: number,
  split: readonly [number, number, number],
  part: SplitPart,
): { start: number; end: number } {
  const k = SPLIT_PARTS.indexOf(part);
  const edge = (i: number) =>
    i >= 3 ? n : Math.round(n * split.slice(0, i).reduce((a, b) => a + b, 0));
  return { start: edge(k), end: edge(k + 1) };
}

/** Uniform [0, 1) from a 32-bit generator (mulberry32) seeded by a hash of integers. */
export function generator(...keys: number[]): () => number {
  let h = 0x9e3779b9;
  for (const k of keys) {
    h = Math.imul(h ^ (k >>> 0), 0x85ebca6b);
    h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35);
    h ^= h >>> 16;
  }
  let state = h >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 2 ** 32;
  };
}

/** A permutation of 0..n−1 (Fisher–Yates), the same for the same keys. */
export function permutation(n: number, ...keys: number[]): Uint32Array {
  const rand = generator(...keys);
  const p = new Uint32Array(n);
  for (let i = 0; i < n; i++) p[i] = i;
  for (let i = n - 1; i > 0; i--) {
    const j = Math.floor(rand() * (i + 1));
    const t = p[i];
    p[i] = p[j];
    p[j] = t;
  }
  return p;
}

export interface Draw {
  /** the data position of this draw */
  readonly position: number;
  readonly dataset: number;
  /** the sample's index in its dataset (the split's offset included) */
  readonly index: number;
  /** the dataset's epoch this draw belongs to */
  readonly epoch: number;
}

/**
 * The blend's draws in order, from a position: seek() replays the blending counters from 0 (a
 * few milliseconds per million draws), next() draws one. Datasets are given by the range of
 * their split part.
 */
export class SampleStream {
  private readonly weights: number[];
  private drawn: number[];
  private k = 0;
  private readonly perms = new Map<number, { epoch: number; perm: Uint32Array }>();

  constructor(
    private readonly ranges: readonly { readonly start: number; readonly end: number }[],
    weights: readonly number[],
    private readonly seed: number,
  ) {
    const sum = weights.reduce((a, b) => a + b, 0);
    this.weights = weights.map((w) => w / sum);
    this.drawn = ranges.map(() => 0);
    ranges.forEach((r, d) => {
      if (r.end <= r.start)
        throw new UserError(`dataset ${d + 1} of --data-path has no sample in this split`);
    });
  }

  get position(): number {
    return this.k;
  }

  seek(position: number): void {
    this.k = 0;
    this.drawn = this.ranges.map(() => 0);
    while (this.k < position) this.choose();
  }

  next(): Draw {
    const position = this.k;
    const d = this.choose();
    const j = this.drawn[d] - 1;
    const r = this.ranges[d];
    const n = r.end - r.start;
    const epoch = Math.floor(j / n);
    let cached = this.perms.get(d);
    if (cached?.epoch !== epoch) {
      cached = { epoch, perm: permutation(n, this.seed, d, epoch) };
      this.perms.set(d, cached);
    }
    return { position, dataset: d, index: r.start + cached.perm[j % n], epoch };
  }

  /** the next draw's dataset, counted */
  private choose(): number {
    let best = 0;
    let behind = -Infinity;
    for (let d = 0; d < this.weights.length; d++) {
      const lag = this.weights[d] * (this.k + 1) - this.drawn[d];
      if (lag > behind + 1e-12) {
        best = d;
        behind = lag;
      }
    }
    this.drawn[best]++;
    this.k++;
    return best;
  }
}
