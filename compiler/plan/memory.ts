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
 * does not overlap a placed buffer whose lifetime intersects its own.
 */
export function planArena(buffers: readonly Lifetime[]): ArenaPlan {
  const order = [...buffers].sort((a, b) => b.bytes - a.bytes || a.start - b.start || a.id - b.id);
  const placed: { start: number; end: number; lo: number; hi: number }[] = [];
  const offsets = new Map<number, number>();
  let size = 0;
  for (const buf of order) {
    const bytes = align(buf.bytes);
    const conflicts = placed
      .filter((p) => p.start <= buf.end && buf.start <= p.end)
      .sort((a, b) => a.lo - b.lo);
    let offset = 0;
    for (const c of conflicts) {
      if (c.lo >= offset + bytes) break;
      offset = Math.max(offset, c.hi);
    }
    offsets.set(buf.id, offset);
    placed.push({ start: buf.start, end: buf.end, lo: offset, hi: offset + bytes });
    size = Math.max(size, offset + bytes);
  }
  return { offsets, sizeBytes: size, lowerBoundBytes: livenessLowerBound(buffers) };
}
