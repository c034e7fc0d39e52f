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
  readonly offsets: ReadonlyMap<number, number>;
  readonly sizeBytes: number;
  readonly lowerBoundBytes: number;
}

export const ALIGN = 64;

export function align(n: number): number {
  return Math.ceil(n / ALIGN) * ALIGN;
}

/** The most bytes live at once (aligned sizes): a lower bound on any arena. */
export function livenessLowerBound(buffers: readonly Lifetime[]): number {
  const events: [number, number][] = [];
  for (const b of buffers) {
    events.push([b.start, align(b.bytes)], [b.end + 1, -align(b.bytes)]);
  }
  events.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  let live = 0;
  let peak = 0;
  for (const [, delta] of events) {
    live += delta;
    peak = Math.max(peak, live);
  }
  return peak;
}

/**
 * Greedy placement: largest buffers first (ties: earliest start), each at the lowest offset that
 * does not overlap a placed buffer whose lifetime intersects its own. Placed buffers are indexed
 * by blocks of instruction time, so finding the ones that share a lifetime visits only the
 * blocks it spans.
 */
export function planArena(buffers: readonly Lifetime[]): ArenaPlan {
  const order = [...buffers].sort((a, b) => b.bytes - a.bytes || a.start - b.start || a.id - b.id);
  const BLOCK = 64;
  const blocks = new Map<number, number[]>(); // block → indices into placed
  const placed: { start: number; end: number; lo: number; hi: number }[] = [];
  const seen: number[] = [];
  let stamp = 0;
  const offsets = new Map<number, number>();
  let size = 0;
  for (const buf of order) {
    const bytes = align(buf.bytes);
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
    offsets.set(buf.id, offset);
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
