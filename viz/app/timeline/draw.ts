// Drawing timeline lanes on a canvas, shared by the timeline view and the compare view: one row
// per lane, its label in a gutter on the left, its events culled to the window (binary search on
// the lane's sorted starts) and merged where they are narrower than a pixel, so a rank of 100k
// events draws in a few milliseconds. Work is coloured by phase, the waiting part of a span (its
// first `wait` ms) grey, collectives and p2p edged in red, pipeline bubbles shaded on the
// compute lane. The colours and the legend's rows come from here, so every view agrees.

import type { VizTimeline } from '../../model.js';
import {
  BUBBLE_FILL,
  COLLECTIVE_STROKE,
  PART_COLORS,
  PHASE_COLORS,
  Palette,
  WAIT_FILL,
} from '../colors.js';
import {
  formatTicks,
  hitTest,
  indexLanes,
  niceTicks,
  RectMerger,
  TimeScale,
  visibleRange,
  type LaneIndex,
  type TimeWindow,
} from './scale.js';

/** the canvas text */
export const FONT = '12px system-ui, sans-serif';
/** the gutter the lane labels sit in, when the box does not say */
export const LABEL_WIDTH = 120;

/** the phases' colours, stable across the views that draw lanes */
const phasePalette = new Palette(PHASE_COLORS);

/** the marks' bands: the three phases of full separation and the optimizer step */
export const markPalette = new Palette({
  'encoder forward': PART_COLORS.encoder,
  'decoder pipeline': PART_COLORS.decoder,
  'encoder backward': '#76b7b2',
  'optimizer step': PART_COLORS.step,
});

// A span's colour key: 0 waiting; 1 + 2·(phase id) + (1 for a collective) its work.
const WAIT_KEY = 0;
const phaseIds = new Map<string, number>();
const phaseNames: string[] = [];
function phaseId(phase: string): number {
  let id = phaseIds.get(phase);
  if (id === undefined) phaseIds.set(phase, (id = phaseNames.push(phase) - 1));
  return id;
}
const keyPhase = (key: number) => phaseNames[(key - 1) >> 1];
const keyIsCollective = (key: number) => key > 0 && (key - 1) % 2 === 1;

/** what drawing and hovering a timeline needs beyond its columns; made once per timeline */
interface Prepared {
  readonly lanes: LaneIndex[];
  /** the colour key of each event's work */
  readonly workKey: Int32Array;
  readonly collective: Uint8Array;
}
const prepared = new WeakMap<VizTimeline, Prepared>();

function prepare(t: VizTimeline): Prepared {
  let p = prepared.get(t);
  if (p) return p;
  const ev = t.events;
  const collectiveOp = t.opIsCollective;
  const phaseKey = t.phases.map((ph) => 1 + 2 * phaseId(ph));
  const n = ev.lane.length;
  const workKey = new Int32Array(n);
  const collective = new Uint8Array(n);
  for (let i = 0; i < n; i++) {
    const c = collectiveOp[ev.op[i]] || t.lanes[ev.lane[i]].stream === 'p2p';
    collective[i] = c ? 1 : 0;
    workKey[i] = phaseKey[ev.phase[i]] + collective[i];
  }
  p = { lanes: indexLanes(ev, t.lanes.length), workKey, collective };
  prepared.set(t, p);
  return p;
}

/** is event `i` a collective or p2p (drawn edged in red) */
export function isCollective(t: VizTimeline, i: number): boolean {
  return prepare(t).collective[i] === 1;
}

/** the event of `lane` under `ms` (or within `tolMs` of it), or -1 */
export function eventAt(t: VizTimeline, lane: number, ms: number, tolMs: number): number {
  const ix = prepare(t).lanes[lane];
  return ix ? hitTest(ix, ms, tolMs) : -1;
}

/** the colour of a phase's work */
export function phaseColor(phase: string): string {
  return phasePalette.of(phase);
}

/** a legend swatch for collectives: the phase colour between red edges */
export const COLLECTIVE_SWATCH = `linear-gradient(${COLLECTIVE_STROKE} 0 3px, #bbb 3px 9px, ${COLLECTIVE_STROKE} 9px)`;

/** the legend's rows for what drawLanes draws of these timelines (their phases first) */
export function timelineLegendRows(timelines: readonly VizTimeline[]): [string, string][] {
  const phases = [...new Set(timelines.flatMap((t) => t.phases))];
  return [
    ...phases.map((ph): [string, string] => [ph, phaseColor(ph)]),
    ['waiting for peers', WAIT_FILL],
    ['collective / p2p', COLLECTIVE_SWATCH],
    ['pipeline bubble', BUBBLE_FILL],
  ];
}

/** one row of drawLanes: a lane of a timeline, and its label in the gutter */
export interface LaneRow {
  readonly label: string;
  readonly timeline: VizTimeline;
  readonly lane: number;
}

/** where drawLanes draws, in CSS pixels: rows from (x, y) down, labels in the first labelWidth */
export interface LaneBox {
  readonly x: number;
  readonly y: number;
  readonly width: number;
  readonly rowHeight: number;
  /** the gutter for the row labels (default LABEL_WIDTH); the plot is the rest of the width */
  readonly labelWidth?: number;
}

/** the plot's time scale inside a box (the part right of the gutter) */
export function plotScale(
  window: TimeWindow,
  box: Pick<LaneBox, 'x' | 'width' | 'labelWidth'>,
): TimeScale {
  const gutter = box.labelWidth ?? LABEL_WIDTH;
  return new TimeScale(window, box.x + gutter, Math.max(1, box.width - gutter));
}

/**
 * Draws `rows` one under the other, each `box.rowHeight` tall: the label (cut to fit the gutter),
 * then the lane's events in `window` (the waiting part grey, the work coloured by phase, a
 * collective edged in red) and, on a compute lane, its rank's pipeline bubbles shaded. Draws
 * nothing outside the box. Returns the scale it drew with (for axes and hit testing).
 */
export function drawLanes(
  ctx: CanvasRenderingContext2D,
  rows: readonly LaneRow[],
  window: TimeWindow,
  box: LaneBox,
): TimeScale {
  const scale = plotScale(window, box);
  const plotX1 = scale.x0 + scale.width;
  const pad = Math.min(4, Math.floor(box.rowHeight / 6));
  ctx.save();
  ctx.font = FONT;
  ctx.textBaseline = 'middle';
  rows.forEach((row, r) => {
    const y = box.y + r * box.rowHeight;
    // the gutter's label, and the lane's background
    ctx.fillStyle = '#333';
    ctx.textAlign = 'left';
    ctx.fillText(fitText(ctx, row.label, scale.x0 - box.x - 8), box.x + 4, y + box.rowHeight / 2);
    ctx.fillStyle = r % 2 === 0 ? '#f3f4f7' : '#eceef2';
    ctx.fillRect(scale.x0, y, scale.width, box.rowHeight);
    ctx.save();
    ctx.beginPath();
    ctx.rect(scale.x0, y, scale.width, box.rowHeight);
    ctx.clip();
    const t = row.timeline;
    const lane = t.lanes[row.lane];
    if (lane?.stream === 'compute') {
      ctx.fillStyle = BUBBLE_FILL;
      for (const m of t.marks)
        if (
          m.kind === 'bubble' &&
          m.rank === lane.rank &&
          m.endMs > window.startMs &&
          m.startMs < window.endMs
        ) {
          const x0 = Math.max(scale.x(m.startMs), scale.x0 - 1);
          ctx.fillRect(
            x0,
            y,
            Math.max(1, Math.min(scale.x(m.endMs), plotX1 + 1) - x0),
            box.rowHeight,
          );
        }
    }
    if (lane) drawEvents(ctx, t, row.lane, scale, y + pad, box.rowHeight - 2 * pad);
    ctx.restore();
  });
  ctx.restore();
  return scale;
}

/** one lane's events in the scale's window, as merged rectangles between y and y + h */
function drawEvents(
  ctx: CanvasRenderingContext2D,
  t: VizTimeline,
  lane: number,
  scale: TimeScale,
  y: number,
  h: number,
): void {
  const p = prepare(t);
  const ix = p.lanes[lane];
  const { start, dur, wait } = t.events;
  const edge = Math.min(3, Math.max(1, Math.floor(h / 6)));
  const merger = new RectMerger((key, x, width) => {
    ctx.fillStyle = key === WAIT_KEY ? WAIT_FILL : phaseColor(keyPhase(key));
    ctx.fillRect(x, y, width, h);
    if (keyIsCollective(key)) {
      ctx.fillStyle = COLLECTIVE_STROKE;
      ctx.fillRect(x, y, width, edge);
      ctx.fillRect(x, y + h - edge, width, edge);
    }
  });
  const [lo, hi] = visibleRange(ix, scale.window);
  // far outside the window a span's pixel can be huge: clamp to just beyond the plot
  const xMin = scale.x0 - 2;
  const xMax = scale.x0 + scale.width + 2;
  const clampX = (x: number) => (x < xMin ? xMin : x > xMax ? xMax : x);
  for (let k = lo; k < hi; k++) {
    const i = ix.order[k];
    const s = start[i];
    const w = Math.min(wait[i], dur[i]);
    if (w > 0) merger.add(WAIT_KEY, clampX(scale.x(s)), clampX(scale.x(s + w)));
    merger.add(p.workKey[i], clampX(scale.x(s + w)), clampX(scale.x(s + dur[i])));
  }
  merger.flush();
}

/** `text`, cut with an ellipsis to fit `width` px in the context's font ('' if nothing fits) */
export function fitText(ctx: CanvasRenderingContext2D, text: string, width: number): string {
  if (ctx.measureText(text).width <= width) return text;
  for (let n = text.length - 1; n > 0; n--) {
    const cut = text.slice(0, n) + '…';
    if (ctx.measureText(cut).width <= width) return cut;
  }
  return '';
}

/**
 * A time axis over the plot of `box` (same x, width and gutter as drawLanes'): a baseline at
 * y + height, ticks with labels (formatMs) spaced so no two labels touch, and, down to `gridTo`
 * when given, light grid lines.
 */
export function drawTimeAxis(
  ctx: CanvasRenderingContext2D,
  window: TimeWindow,
  box: { x: number; y: number; width: number; height: number; labelWidth?: number },
  gridTo?: number,
): void {
  const scale = plotScale(window, box);
  ctx.save();
  ctx.font = FONT;
  // as many ticks as fit their labels with a gap: the widest label decides
  let maxTicks = Math.max(2, Math.floor(scale.width / 80));
  let ticks: number[] = [];
  let labels: string[] = [];
  for (; maxTicks >= 1; maxTicks = Math.floor(maxTicks * 0.7)) {
    const t = niceTicks(window.startMs, window.endMs, maxTicks);
    ticks = t.ticks;
    labels = formatTicks(t.ticks, t.stepMs);
    const widest = Math.max(0, ...labels.map((l) => ctx.measureText(l).width));
    if (widest + 16 <= t.stepMs * scale.pxPerMs || maxTicks <= 1) break;
  }
  const base = box.y + box.height;
  ctx.strokeStyle = '#999';
  ctx.beginPath();
  ctx.moveTo(scale.x0, base + 0.5);
  ctx.lineTo(scale.x0 + scale.width, base + 0.5);
  ctx.stroke();
  ctx.textBaseline = 'bottom';
  let lastRight = -Infinity;
  ticks.forEach((ms, i) => {
    const x = Math.round(scale.x(ms)) + 0.5;
    ctx.strokeStyle = '#999';
    ctx.beginPath();
    ctx.moveTo(x, base - 4);
    ctx.lineTo(x, base);
    ctx.stroke();
    if (gridTo !== undefined) {
      ctx.strokeStyle = 'rgba(0,0,0,0.08)';
      ctx.beginPath();
      ctx.moveTo(x, base);
      ctx.lineTo(x, gridTo);
      ctx.stroke();
    }
    // a label kept inside the plot (the first and last may sit at its edges), and left out
    // where that pushes it into its neighbour
    const w = ctx.measureText(labels[i]).width;
    const lx = Math.min(Math.max(x - w / 2, scale.x0), scale.x0 + scale.width - w);
    if (lx < lastRight + 8) return;
    lastRight = lx + w;
    ctx.fillStyle = '#444';
    ctx.fillText(labels[i], lx, base - 5);
  });
  ctx.restore();
}
