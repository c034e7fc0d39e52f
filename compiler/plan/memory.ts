// Memory planning: arena offsets from buffer lifetimes. Buffers whose lifetimes overlap never
// share bytes; the arena's size is reported against the liveness lower bound (the most bytes
// live at once), which no placement can beat.

export interface Lifetime {
  readonly id: number;
  readonly bytes: number;
  /** first and last instruction index that touches the buffer (inclusive) */
  readonly start: number;
  readonly end: number;
}

export interface ArenaPlan {
  /** [buffer id] its offset (NaN: not an id of the planned lifetimes) */
  readonly offsets: Float64Array;
  readonly sizeBytes: number;
  readonly lowerBoundBytes: number;
}

export const ALIGN = 64;

export function align(n: number): number {
  return Math.ceil(n / ALIGN) * ALIGN;
}

/** the arena bytes `bytes` take: aligned, and at least one unit (an empty block has an address) */
function footprintOf(bytes: number): number {
  return align(Math.max(bytes, 1));
}
const footprint = (b: Lifetime) => footprintOf(b.bytes);

/** a lifetime's own bytes */
const ownBytes = (b: Lifetime) => b.bytes;

/**
 * [instruction] the bytes (aligned sizes) of the buffers live at it, up to the last one's end:
 * those that start there or before and end there or after (frees first at a tie). `bytesOf`
 * sizes each buffer (default: its own bytes; the expected sizes, say).
 */
export function liveBytes(
  buffers: readonly Lifetime[],
  bytesOf: (b: Lifetime) => number = ownBytes,
): Float64Array {
  // bytes starting and ending at each instruction, then a running sum
  let last = 0;
  for (let k = 0; k < buffers.length; k++) last = Math.max(last, buffers[k].end + 1);
  const delta = new Float64Array(last + 1);
  for (let k = 0; k < buffers.length; k++) {
    const b = buffers[k];
    const bytes = footprintOf(bytesOf(b));
    delta[b.start] += bytes;
    delta[b.end + 1] -= bytes;
  }
  const live = new Float64Array(last);
  let sum = 0;
  for (let t = 0; t < last; t++) live[t] = sum += delta[t];
  return live;
}

/** The most bytes live at once (aligned sizes, `bytesOf` as liveBytes): a lower bound on any arena. */
export function livenessLowerBound(
  buffers: readonly Lifetime[],
  bytesOf: (b: Lifetime) => number = ownBytes,
): number {
  let peak = 0;
  const live = liveBytes(buffers, bytesOf);
  for (let t = 0; t < live.length; t++) peak = Math.max(peak, live[t]);
  return peak;
}

/**
 * Placement for programs of any size: greedy by size for a small program; beyond, a best-fit
 * allocator run through the program in issue order, and where that ends more than 1% above the
 * liveness bound, the smaller of it and greedy by size (up to GREEDY_LIMIT buffers), or of it and
 * the largest buffers greedy by size with the rest best fit in issue order above them. Greedy by
 * size compares each buffer with every placed buffer it overlaps in time: quadratic in the buffers
 * live at once. On the article's 30B line with 2 microbatches a replica (5,900 arena buffers a
 * program) it took 470-500 ms a program, for an arena 1.001 of the bound, where issue order took
 * 10 ms for 1.006.
 */
export function planArena(buffers: readonly Lifetime[]): ArenaPlan {
  if (buffers.length <= GREEDY_ALWAYS) return planBySize(buffers);
  const byTime = planByTime(buffers);
  if (byTime.sizeBytes <= 1.01 * byTime.lowerBoundBytes) return byTime;
  const other =
    buffers.length <= GREEDY_LIMIT ? planBySize(buffers) : planLargestFirst(buffers, SPLIT_LARGEST);
  return other.sizeBytes < byTime.sizeBytes ? other : byTime;
}

/** up to how many buffers a program is placed greedy by size outright */
export const GREEDY_ALWAYS = 1500;
export const GREEDY_LIMIT = 6000;
/** how many of a large program's buffers planLargestFirst places greedy by size */
export const SPLIT_LARGEST = 4000;

/**
 * The `k` largest buffers greedy by size, the others best fit in issue order in a region above
 * them. On stage 0 of the article's 30B line (24k buffers) the arena comes to ×1.008 of the bound
 * (×1.015 with --full-hetero-dp-cpu-offload), where best fit in issue order alone comes to ×1.027
 * (×1.034); it can also be much worse (the small buffers' own peak lands on top of the large
 * ones'), so planArena keeps the smaller.
 */
export function planLargestFirst(buffers: readonly Lifetime[], k: number): ArenaPlan {
  const sorted = [...buffers].sort((a, b) => b.bytes - a.bytes || a.start - b.start || a.id - b.id);
  const [largest, others] = [sorted.slice(0, k), sorted.slice(k)];
  const large = planBySize(largest);
  const rest = planByTime(others);
  const offsets = offsetTable(buffers);
  for (const b of largest) offsets[b.id] = large.offsets[b.id];
  for (const b of others) offsets[b.id] = large.sizeBytes + rest.offsets[b.id];
  return {
    offsets,
    sizeBytes: large.sizeBytes + rest.sizeBytes,
    lowerBoundBytes: livenessLowerBound(buffers),
  };
}

/** offsets indexed by the lifetimes' ids, NaN where none */
function offsetTable(buffers: readonly Lifetime[]): Float64Array {
  let n = 0;
  for (let k = 0; k < buffers.length; k++) n = Math.max(n, buffers[k].id + 1);
  return new Float64Array(n).fill(NaN);
}

/**
 * Best fit in issue order: at each instruction, the buffers whose last use was the instruction
 * before are freed (their gaps merged with free neighbours), then the buffers it defines take the
 * smallest free gap that holds them, or the top of the arena.
 */
export function planByTime(buffers: readonly Lifetime[]): ArenaPlan {
  const order = [...buffers].sort((a, b) => a.start - b.start || b.bytes - a.bytes || a.id - b.id);
  const ends = [...buffers].sort((a, b) => a.end - b.end);
  const offsets = offsetTable(buffers);
  /** free gaps [lo, hi), sorted by lo, never adjacent to each other */
  const gaps: { lo: number; hi: number }[] = [];
  let top = 0;
  let size = 0;
  let e = 0;
  const release = (lo: number, hi: number) => {
    let [a, b] = [0, gaps.length];
    while (a < b) {
      const mid = (a + b) >>> 1;
      if (gaps[mid].lo < lo) a = mid + 1;
      else b = mid;
    }
    const prev = a > 0 && gaps[a - 1].hi === lo ? gaps[a - 1] : undefined;
    const next = a < gaps.length && gaps[a].lo === hi ? gaps[a] : undefined;
    if (prev && next) {
      prev.hi = next.hi;
      gaps.splice(a, 1);
    } else if (prev) prev.hi = hi;
    else if (next) next.lo = lo;
    else gaps.splice(a, 0, { lo, hi });
    // a gap that reaches the top lowers it
    const last = gaps[gaps.length - 1];
    if (last && last.hi === top) {
      top = last.lo;
      gaps.pop();
    }
  };
  for (let k = 0; k < order.length; k++) {
    const buf = order[k];
    while (e < ends.length && ends[e].end < buf.start) {
      const x = ends[e++];
      const at = offsets[x.id];
      if (!Number.isNaN(at)) release(at, at + footprint(x));
    }
    const bytes = footprint(buf);
    let best = -1;
    for (let i = 0; i < gaps.length; i++) {
      const g = gaps[i].hi - gaps[i].lo;
      if (g >= bytes && (best < 0 || g < gaps[best].hi - gaps[best].lo)) {
        best = i;
        if (g === bytes) break; // an exact fit: none is better
      }
    }
    let offset: number;
    if (best >= 0) {
      offset = gaps[best].lo;
      gaps[best].lo += bytes;
      if (gaps[best].lo === gaps[best].hi) gaps.splice(best, 1);
    } else {
      offset = top;
      top += bytes;
    }
    offsets[buf.id] = offset;
    size = Math.max(size, offset + bytes);
  }
  return { offsets, sizeBytes: size, lowerBoundBytes: livenessLowerBound(buffers) };
}

/**
 * Greedy placement: largest buffers first (ties: earliest start), each at the lowest offset that
 * does not overlap a placed buffer whose lifetime intersects its own. Placed buffers are indexed
 * by blocks of instruction time, so finding the ones that share a lifetime visits only the
 * blocks it spans; a block is a quarter of the mean lifetime (at least 64 instructions), so a
 * buffer spans a few blocks whether lifetimes are short (arena activations) or long (host copies
 * kept from forward to backward).
 */
export function planBySize(buffers: readonly Lifetime[]): ArenaPlan {
  const order = [...buffers].sort((a, b) => b.bytes - a.bytes || a.start - b.start || a.id - b.id);
  let span = 0;
  for (const b of buffers) span += b.end - b.start + 1;
  const BLOCK = Math.max(64, Math.ceil(span / Math.max(buffers.length, 1) / 4));
  const blocks = new Map<number, number[]>(); // block → indices into placed
  const placed: { start: number; end: number; lo: number; hi: number }[] = [];
  const seen: number[] = [];
  let stamp = 0;
  const offsets = offsetTable(buffers);
  let size = 0;
  for (const buf of order) {
    const bytes = footprint(buf);
    stamp++;
    const conflicts: { lo: number; hi: number }[] = [];
    for (let k = Math.floor(buf.start / BLOCK); k <= Math.floor(buf.end / BLOCK); k++) {
      for (const i of blocks.get(k) ?? []) {
        if (seen[i] === stamp) continue;
        seen[i] = stamp;
        const p = placed[i];
        if (p.start <= buf.end && buf.start <= p.end) conflicts.push(p);
      }
    }
    conflicts.sort((a, b) => a.lo - b.lo);
    let offset = 0;
    for (const c of conflicts) {
      if (c.lo >= offset + bytes) break;
      offset = Math.max(offset, c.hi);
    }
    offsets[buf.id] = offset;
    const i = placed.length;
    placed.push({ start: buf.start, end: buf.end, lo: offset, hi: offset + bytes });
    seen.push(0);
    for (let k = Math.floor(buf.start / BLOCK); k <= Math.floor(buf.end / BLOCK); k++) {
      let list = blocks.get(k);
      if (!list) blocks.set(k, (list = []));
      list.push(i);
    }
    size = Math.max(size, offset + bytes);
  }
  return { offsets, sizeBytes: size, lowerBoundBytes: livenessLowerBound(buffers) };
}
