// The timeline's pure parts, kept apart from the canvas so they are unit-tested
// (test/viz/timeline-scale.test.ts): the visible window and its zoom and pan, the time axis's
// ticks, a per-lane index of the columnar events (culling and hit testing by binary search), the
// merging of sub-pixel spans into few rectangles, and the packing of overlapping marks into rows.
//
// Units: times in ms from the step's start, positions in CSS pixels.

import type { VizTimeline } from '../../model.js';
import { formatMs } from '../view.js';

/** the part of the step the plot shows */
export interface TimeWindow {
  readonly startMs: number;
  readonly endMs: number;
}

/** the narrowest window zoom reaches: 1 µs */
export const MIN_SPAN_MS = 1e-3;

/** ms ↔ px, the window drawn over the plot's columns [x0, x0 + width) */
export class TimeScale {
  readonly pxPerMs: number;
  constructor(
    readonly window: TimeWindow,
    readonly x0: number,
    readonly width: number,
  ) {
    this.pxPerMs = width / Math.max(window.endMs - window.startMs, Number.MIN_VALUE);
  }
  x(ms: number): number {
    return this.x0 + (ms - this.window.startMs) * this.pxPerMs;
  }
  ms(x: number): number {
    return this.window.startMs + (x - this.x0) / this.pxPerMs;
  }
}

/** `w` moved and narrowed into `bounds`, no narrower than `minSpanMs` (or the bounds) */
export function clampWindow(
  w: TimeWindow,
  bounds: TimeWindow,
  minSpanMs = MIN_SPAN_MS,
): TimeWindow {
  const full = bounds.endMs - bounds.startMs;
  const span = Math.min(Math.max(w.endMs - w.startMs, Math.min(minSpanMs, full)), full);
  const startMs = Math.min(Math.max(w.startMs, bounds.startMs), bounds.endMs - span);
  return { startMs, endMs: startMs + span };
}

/**
 * zoomed by `factor` (> 1 in, < 1 out) around `anchorMs`, which stays at the same pixel (the
 * cursor under the wheel; the middle for the buttons), unless the bounds push the window
 */
export function zoomAt(
  w: TimeWindow,
  factor: number,
  anchorMs: number,
  bounds: TimeWindow,
  minSpanMs = MIN_SPAN_MS,
): TimeWindow {
  const span0 = w.endMs - w.startMs;
  const anchor = Math.min(Math.max(anchorMs, w.startMs), w.endMs);
  const frac = span0 > 0 ? (anchor - w.startMs) / span0 : 0.5;
  const full = bounds.endMs - bounds.startMs;
  const span = Math.min(Math.max(span0 / factor, Math.min(minSpanMs, full)), full);
  const startMs = anchor - frac * span;
  return clampWindow({ startMs, endMs: startMs + span }, bounds, minSpanMs);
}

/** moved by `deltaMs` (positive: later), its width kept, within the bounds */
export function panBy(w: TimeWindow, deltaMs: number, bounds: TimeWindow): TimeWindow {
  return clampWindow({ startMs: w.startMs + deltaMs, endMs: w.endMs + deltaMs }, bounds, 0);
}

/** a tick step of 1, 2 or 5 × 10^k no smaller than `raw` */
export function niceStep(raw: number): number {
  const p = 10 ** Math.floor(Math.log10(raw));
  for (const m of [1, 2, 5, 10]) if (m * p >= raw * (1 - 1e-9)) return m * p;
  return 10 * p;
}

/** ticks at multiples of a nice step inside [startMs, endMs], at most about `maxTicks` of them */
export function niceTicks(
  startMs: number,
  endMs: number,
  maxTicks: number,
): { stepMs: number; ticks: number[] } {
  const span = endMs - startMs;
  if (!(span > 0) || maxTicks < 1) return { stepMs: 0, ticks: [] };
  const stepMs = niceStep(span / maxTicks);
  const ticks: number[] = [];
  // integer multiples, so 0.1 + 0.2 noise does not creep into the labels
  for (let i = Math.ceil(startMs / stepMs - 1e-9); i * stepMs <= endMs + stepMs * 1e-9; i++)
    ticks.push(i * stepMs + 0); // + 0: no -0 for a tick at the start
  return { stepMs, ticks };
}

/**
 * the ticks' labels ('0' at the step's start): formatMs where it tells them apart, else one unit for all with as many
 * decimals as the step needs (zoomed in to µs, formatMs would print 12.34 ms twice)
 */
export function formatTicks(ticks: readonly number[], stepMs: number): string[] {
  const zero = (t: number, label: string) => (t === 0 ? '0' : label);
  const plain = ticks.map((t) => zero(t, formatMs(t)));
  if (plain.every((l, i) => i === 0 || l !== plain[i - 1])) return plain;
  const top = Math.max(...ticks.map(Math.abs));
  const [unit, msPerUnit] = top >= 1000 ? ['s', 1000] : top >= 1 ? ['ms', 1] : ['µs', 1e-3];
  const decimals = Math.min(9, Math.max(0, Math.ceil(-Math.log10(stepMs / msPerUnit) - 1e-9)));
  return ticks.map((t) => zero(t, `${(t / msPerUnit).toFixed(decimals)} ${unit}`));
}

// ---- the events of a lane, by start --------------------------------------------------------------

/** one lane's events sorted by start: `order[k]` is the event index of the k-th */
export interface LaneIndex {
  readonly order: Int32Array;
  /** start and end (ms) of the k-th event */
  readonly start: Float64Array;
  readonly end: Float64Array;
  /** the latest end among events 0..k: non-decreasing, so culling is a binary search */
  readonly maxEnd: Float64Array;
}

type Events = Pick<VizTimeline['events'], 'lane' | 'start' | 'dur'>;

/** each lane's index, from the columnar events (lanes numbered 0..laneCount-1) */
export function indexLanes(events: Events, laneCount: number): LaneIndex[] {
  const n = events.lane.length;
  const counts = new Int32Array(laneCount);
  for (let i = 0; i < n; i++) counts[events.lane[i]]++;
  const orders = [...counts].map((c) => new Int32Array(c));
  const fill = new Int32Array(laneCount);
  for (let i = 0; i < n; i++) {
    const l = events.lane[i];
    orders[l][fill[l]++] = i;
  }
  return orders.map((order) => {
    // the bundle writes events in instruction order, nearly sorted by start: sort only if not
    let sorted = true;
    for (let k = 1; k < order.length && sorted; k++)
      sorted = events.start[order[k - 1]] <= events.start[order[k]];
    if (!sorted) order.sort((a, b) => events.start[a] - events.start[b] || a - b);
    const m = order.length;
    const start = new Float64Array(m);
    const end = new Float64Array(m);
    const maxEnd = new Float64Array(m);
    for (let k = 0; k < m; k++) {
      const i = order[k];
      start[k] = events.start[i];
      end[k] = events.start[i] + events.dur[i];
      maxEnd[k] = k > 0 ? Math.max(maxEnd[k - 1], end[k]) : end[k];
    }
    return { order, start, end, maxEnd };
  });
}

/** the first k in [0, a.length) with a[k] >= x (a non-decreasing), else a.length */
export function lowerBound(a: Float64Array, x: number): number {
  let lo = 0;
  let hi = a.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (a[mid] < x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/** the first k with a[k] > x, else a.length */
export function upperBound(a: Float64Array, x: number): number {
  let lo = 0;
  let hi = a.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (a[mid] <= x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/** [lo, hi): the sorted positions of the events that reach into the window (all others culled) */
export function visibleRange(ix: LaneIndex, w: TimeWindow): [number, number] {
  return [lowerBound(ix.maxEnd, w.startMs), lowerBound(ix.start, w.endMs)];
}

/**
 * the event under time `ms` on this lane, or the nearest one within `tolMs` (so a sub-pixel
 * kernel can be hovered): its event index, or -1. Among several that hold `ms`, the one that
 * starts last (the innermost, where a measured trace nests spans).
 */
export function hitTest(ix: LaneIndex, ms: number, tolMs: number): number {
  let best = -1;
  let bestDist = Infinity;
  // events starting after ms + tol cannot be hit; scan back while some earlier one may reach ms - tol
  for (let k = upperBound(ix.start, ms + tolMs) - 1; k >= 0 && ix.maxEnd[k] >= ms - tolMs; k--) {
    const d = ms < ix.start[k] ? ix.start[k] - ms : ms > ix.end[k] ? ms - ix.end[k] : 0;
    if (d < bestDist && d <= tolMs) {
      best = ix.order[k];
      bestDist = d;
      if (d === 0) break;
    }
  }
  return best;
}

// ---- drawing few rectangles for many spans ----------------------------------------------------------

/**
 * Merges spans, given in order of their left edge, into the rectangles worth drawing: a span of
 * the same colour that touches the one before extends it, and a span that falls inside pixels
 * already painted is dropped. A lane of 100k events then costs about one rectangle per pixel
 * column (per change of colour), however far out it is zoomed. Rectangles are at least 1 px wide.
 */
export class RectMerger {
  private key = -1;
  private x0 = 0;
  private x1 = 0;
  constructor(private readonly emit: (key: number, x: number, width: number) => void) {}

  /** a span of colour `key` (>= 0) over pixels [x0, x1) */
  add(key: number, x0: number, x1: number): void {
    if (this.key >= 0) {
      if (key === this.key && x0 <= this.x1 + 0.5) {
        if (x1 > this.x1) this.x1 = x1;
        return;
      }
      if (x1 <= Math.max(this.x1, this.x0 + 1)) return; // inside the pixels painted already
      this.flush();
    }
    this.key = key;
    this.x0 = x0;
    this.x1 = x1;
  }

  /** emits the rectangle pending; call once after the last span */
  flush(): void {
    if (this.key >= 0) this.emit(this.key, this.x0, Math.max(this.x1 - this.x0, 1));
    this.key = -1;
  }
}

/** rows for intervals so that no two in a row overlap: each goes into the first row free at its start */
export function packRows(intervals: readonly { startMs: number; endMs: number }[]): {
  rows: number[];
  rowCount: number;
} {
  const order = intervals
    .map((_, i) => i)
    .sort((a, b) => intervals[a].startMs - intervals[b].startMs);
  const rowEnds: number[] = [];
  const rows = new Array<number>(intervals.length).fill(0);
  for (const i of order) {
    let r = rowEnds.findIndex((end) => end <= intervals[i].startMs);
    if (r < 0) r = rowEnds.push(0) - 1;
    rowEnds[r] = intervals[i].endMs;
    rows[i] = r;
  }
  return { rows, rowCount: rowEnds.length };
}
