// The timeline view: one rank's step (or one rank per pipeline stage) on a canvas, a row per stream (compute, comm, copy, p2p),
// the phases of the step as labelled bands above them and the pipeline bubbles shaded on the
// compute row. Wheel zooms around the cursor, drag pans, the buttons zoom around the middle;
// hovering an event shows what it is, and how much of it was spent waiting for peers.
//
// DOM the shell and the browser tests read:
//   root[data-ready]        the plan drawn (absent while a rank loads)
//   root[data-events]       the number of events of the rank shown
//   root[data-view-start], root[data-view-end]   the visible window, ms
//   select.rank (a rank, or `stages`: the first rank of each pipeline stage, lanes one after
//     another), button.zoom-in, button.zoom-out, button.zoom-reset
//   div.mark.phase[data-label]   a phase band (its label text inside, hidden when it does not fit)
//   div.mark.bubble         the biggest 200 bubbles, over the compute row
//   .tooltip                shown while the pointer is over an event, a band or a bubble

import type { VizTimeline } from '../../model.js';
import { legend } from '../colors.js';
import {
  el,
  formatBytes,
  formatMs,
  markReady,
  type MountView,
  type View,
  type ViewContext,
} from '../view.js';
import {
  drawLanes,
  drawTimeAxis,
  eventAt,
  FONT,
  isCollective,
  markPalette,
  plotScale,
  timelineLegendRows,
  type LaneRow,
} from './draw.js';
import { mergeTimelines } from './merge.js';
import { packRows, panBy, zoomAt, type TimeWindow } from './scale.js';
import './timeline.css';

// The canvas's rows, in CSS pixels, top down: the axis, the phase bands, the lanes.
const AXIS_H = 26;
const BAND_H = 20;
const ROW_H = 52;
const GAP = 6;
/** the bubbles drawn as DOM elements (all are shaded on the canvas) */
const MAX_BUBBLE_ELEMENTS = 200;
/** the rank selector's choice of the first rank of each pipeline stage, one after another */
const STAGES = 'stages';
/** the zoom buttons' step; the wheel zooms by exp(-deltaY · WHEEL_ZOOM) */
const BUTTON_ZOOM = 2;
const WHEEL_ZOOM = 0.0015;

type Mark = VizTimeline['marks'][number];

export const mountTimeline: MountView = (root: HTMLElement, ctx: ViewContext): View => {
  const rankSelect = el('select', { class: 'rank', 'aria-label': 'rank' });
  const zoomIn = el('button', { class: 'zoom-in', title: 'zoom in (or the wheel)' }, '+');
  const zoomOut = el('button', { class: 'zoom-out', title: 'zoom out' }, '−');
  const zoomReset = el('button', { class: 'zoom-reset', title: 'the whole step' }, 'reset');
  const info = el('span', { class: 'timeline-info' });
  const canvas = el('canvas', { class: 'timeline-canvas' });
  const marksLayer = el('div', { class: 'timeline-marks' });
  const tooltip = el('div', { class: 'tooltip', role: 'tooltip' });
  tooltip.style.display = 'none';
  const stage = el('div', { class: 'timeline-stage' }, canvas, marksLayer, tooltip);
  const legends = el('div', { class: 'timeline-legends' });
  const message = el('div', { class: 'timeline-message' });
  root.classList.add('timeline-view');
  root.append(
    el(
      'div',
      { class: 'timeline-bar' },
      el('label', {}, 'rank ', rankSelect),
      el('span', { class: 'zoom' }, zoomIn, zoomOut, zoomReset),
      info,
    ),
    message,
    stage,
    legends,
    el(
      'div',
      { class: 'timeline-hint' },
      'wheel: zoom around the cursor · drag: pan · hover: an event’s details',
    ),
  );

  // what is shown: the plan, its rank, that rank's timeline, the window
  let plan = -1;
  let loads = 0;
  let t: VizTimeline | null = null;
  let bounds: TimeWindow = { startMs: 0, endMs: 1 };
  let win: TimeWindow = bounds;
  // the layout of the timeline shown
  let rows: LaneRow[] = [];
  let phases: { mark: Mark; row: number; div: HTMLElement; label: HTMLElement }[] = [];
  let bubbles: { mark: Mark; div: HTMLElement }[] = [];
  let bandRows = 0;
  /** each rank's compute row (where its bubbles are) */
  let computeRows = new Map<number, number>();
  let width = 0;

  const laneTop = () => AXIS_H + GAP + bandRows * BAND_H + (bandRows ? GAP : 0);
  const height = () => laneTop() + rows.length * ROW_H + GAP;
  const bandTop = (row: number) => AXIS_H + GAP + row * BAND_H;
  const scale = () => plotScale(win, { x: 0, width });

  /** draws the canvas and places the marks' elements for the window; cheap enough per frame */
  function draw(): void {
    width = Math.max(320, Math.floor(stage.clientWidth || root.clientWidth || 1200));
    const h = height();
    const dpr = window.devicePixelRatio || 1;
    if (canvas.width !== Math.round(width * dpr) || canvas.height !== Math.round(h * dpr)) {
      canvas.width = Math.round(width * dpr);
      canvas.height = Math.round(h * dpr);
      canvas.style.width = `${width}px`;
      canvas.style.height = `${h}px`;
    }
    const g = canvas.getContext('2d')!;
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, width, h);
    if (!t) return;
    const s = drawLanes(g, rows, win, { x: 0, y: laneTop(), width, rowHeight: ROW_H });
    drawBands(g, s.x0, s.x0 + s.width);
    drawTimeAxis(g, win, { x: 0, y: 0, width, height: AXIS_H }, h - GAP);
    placeMarks();
    root.dataset.viewStart = String(win.startMs);
    root.dataset.viewEnd = String(win.endMs);
    info.textContent = `${win.startMs === 0 ? '0' : formatMs(win.startMs)} – ${formatMs(win.endMs)} of ${formatMs(t.endMs)} · ${t.events.lane.length} events · ${t.source}`;
  }

  /** the phase bands: a tinted box each, in the rows packRows gave (the labels are DOM) */
  function drawBands(g: CanvasRenderingContext2D, x0: number, x1: number): void {
    const s = scale();
    g.save();
    g.font = FONT;
    g.textBaseline = 'middle';
    g.fillStyle = '#333';
    if (bandRows) g.fillText('phases', 4, bandTop(0) + (bandRows * BAND_H) / 2);
    for (const { mark, row } of phases) {
      const a = Math.max(s.x(mark.startMs), x0);
      const b = Math.min(s.x(mark.endMs), x1);
      if (b < a) continue;
      const color = markPalette.of(mark.label);
      g.globalAlpha = 0.28;
      g.fillStyle = color;
      g.fillRect(a, bandTop(row) + 1, Math.max(1, b - a), BAND_H - 2);
      g.globalAlpha = 1;
      g.strokeStyle = color;
      g.strokeRect(a + 0.5, bandTop(row) + 1.5, Math.max(0, b - a - 1), BAND_H - 3);
    }
    g.restore();
  }

  /** moves the marks' elements over the canvas; hides those out of the window, and labels that do not fit */
  function placeMarks(): void {
    const s = scale();
    const x0 = s.x0;
    const x1 = s.x0 + s.width;
    const measure = canvas.getContext('2d')!;
    measure.font = FONT;
    const place = (div: HTMLElement, m: Mark, top: number, h: number): number => {
      const a = Math.max(s.x(m.startMs), x0);
      const b = Math.min(s.x(m.endMs), x1);
      div.style.display = b < a ? 'none' : '';
      div.style.left = `${a}px`;
      div.style.width = `${Math.max(1, b - a)}px`;
      div.style.top = `${top}px`;
      div.style.height = `${h}px`;
      return b - a;
    };
    for (const p of phases) {
      const w = place(p.div, p.mark, bandTop(p.row) + 1, BAND_H - 2);
      p.label.hidden = measure.measureText(p.mark.label).width + 10 > w;
    }
    for (const b of bubbles)
      place(b.div, b.mark, laneTop() + computeRows.get(b.mark.rank)! * ROW_H, ROW_H);
  }

  // redraws at most once a frame while the wheel or a drag moves the window
  let pending = false;
  function redraw(): void {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => {
      pending = false;
      draw();
    });
  }

  /** lays out the timeline `t` (rows, bands, bubbles), whole step in view */
  function layout(tl: VizTimeline): void {
    const ranks = new Set(tl.lanes.map((l) => l.rank));
    rows = tl.lanes.map((l, lane) => ({
      label: ranks.size > 1 ? `rank ${l.rank} ${l.stream}` : l.stream,
      timeline: tl,
      lane,
    }));
    computeRows = new Map();
    tl.lanes.forEach((l, row) => {
      if (l.stream === 'compute' && !computeRows.has(l.rank)) computeRows.set(l.rank, row);
    });
    const end = Math.max(tl.endMs, ...tl.marks.map((m) => m.endMs));
    bounds = { startMs: 0, endMs: end > 0 ? end : 1 };
    win = bounds;
    const phaseMarks = tl.marks.filter((m) => m.kind === 'phase');
    const packed = packRows(phaseMarks);
    bandRows = packed.rowCount;
    marksLayer.replaceChildren();
    phases = phaseMarks.map((mark, i) => {
      const label = el('span', { class: 'mark-label' }, mark.label);
      const div = el(
        'div',
        {
          class: 'mark phase',
          'data-label': mark.label,
          'data-start-ms': String(mark.startMs),
          'data-end-ms': String(mark.endMs),
        },
        label,
      );
      div.style.borderColor = markPalette.of(mark.label);
      marksLayer.append(div);
      return { mark, row: packed.rows[i], div, label };
    });
    bubbles = tl.marks
      .filter((m) => m.kind === 'bubble' && computeRows.has(m.rank))
      .sort((a, b) => b.endMs - b.startMs - (a.endMs - a.startMs))
      .slice(0, MAX_BUBBLE_ELEMENTS)
      .map((mark) => {
        const div = el('div', {
          class: 'mark bubble',
          'data-label': mark.label,
          'data-start-ms': String(mark.startMs),
          'data-end-ms': String(mark.endMs),
        });
        marksLayer.append(div);
        return { mark, div };
      });
    legends.replaceChildren(
      legend(timelineLegendRows([tl]), 'work by phase'),
      ...(phaseMarks.length
        ? [
            legend(
              [...new Set(phaseMarks.map((m) => m.label))].map((l) => [l, markPalette.of(l)]),
              'step phases',
            ),
          ]
        : []),
    );
    root.dataset.events = String(tl.events.lane.length);
    root.dataset.rank = String(tl.lanes[0]?.rank ?? '');
  }

  /** fetches and draws a rank of the plan shown, or (STAGES) the first rank of each stage */
  async function load(choice: string): Promise<void> {
    const mine = ++loads;
    delete root.dataset.ready;
    const summary = ctx.plans[plan];
    const ranks =
      choice === STAGES
        ? [...new Set(summary.ranks.map((r) => r.stage))]
            .sort((a, b) => a - b)
            .map((stage) => summary.ranks.find((r) => r.stage === stage)!.rank)
        : [Number(choice)];
    const rank = ranks.join(', ');
    message.textContent = `loading rank ${rank}…`;
    let tl: VizTimeline;
    try {
      tl = mergeTimelines(await Promise.all(ranks.map((r) => ctx.source.timeline(plan, r))));
    } catch (e) {
      if (mine !== loads) return;
      // drawn, as far as it can be: the error says why (an embedded page holds some ranks only)
      t = null;
      rows = [];
      marksLayer.replaceChildren();
      legends.replaceChildren();
      message.textContent = `rank ${rank}: ${(e as Error).message}`;
      draw();
      markReady(root, plan);
      return;
    }
    if (mine !== loads) return; // another rank or plan was asked for meanwhile
    const began = performance.now();
    t = tl;
    message.textContent = '';
    layout(tl);
    draw();
    root.dataset.drawMs = (performance.now() - began).toFixed(1);
    markReady(root, plan);
  }

  // ---- interaction -----------------------------------------------------------------------------

  const zoomBy = (factor: number, anchorMs: number) => {
    win = zoomAt(win, factor, anchorMs, bounds);
    redraw();
  };
  const middle = () => (win.startMs + win.endMs) / 2;
  zoomIn.addEventListener('click', () => zoomBy(BUTTON_ZOOM, middle()));
  zoomOut.addEventListener('click', () => zoomBy(1 / BUTTON_ZOOM, middle()));
  zoomReset.addEventListener('click', () => {
    win = bounds;
    redraw();
  });
  rankSelect.addEventListener('change', () => void load(rankSelect.value));

  canvas.addEventListener(
    'wheel',
    (e) => {
      if (!t) return;
      e.preventDefault();
      const px = e.deltaMode === 1 ? 16 : e.deltaMode === 2 ? 400 : 1;
      const x = e.offsetX;
      const s = scale();
      zoomBy(Math.exp(-e.deltaY * px * WHEEL_ZOOM), x >= s.x0 ? s.ms(x) : middle());
      hideTooltip();
    },
    { passive: false },
  );

  let drag: { x: number; win: TimeWindow } | null = null;
  canvas.addEventListener('pointerdown', (e) => {
    if (e.button !== 0 || !t) return;
    drag = { x: e.clientX, win };
    canvas.setPointerCapture(e.pointerId);
    canvas.classList.add('dragging');
    hideTooltip();
  });
  canvas.addEventListener('pointermove', (e) => {
    if (drag) {
      const dx = e.clientX - drag.x;
      win = panBy(drag.win, -dx / scale().pxPerMs, bounds);
      redraw();
    } else hover(e.offsetX, e.offsetY);
  });
  const endDrag = (e: PointerEvent) => {
    if (!drag) return;
    drag = null;
    canvas.classList.remove('dragging');
    if (canvas.hasPointerCapture(e.pointerId)) canvas.releasePointerCapture(e.pointerId);
  };
  canvas.addEventListener('pointerup', endDrag);
  canvas.addEventListener('pointercancel', endDrag);
  canvas.addEventListener('pointerleave', hideTooltip);

  function hideTooltip(): void {
    tooltip.style.display = 'none';
  }

  /** shows what is under (x, y) of the canvas: an event, else a bubble, else a phase band */
  function hover(x: number, y: number): void {
    const s = scale();
    if (!t || x < s.x0) return hideTooltip();
    const ms = s.ms(x);
    const top = laneTop();
    if (y >= top && y < top + rows.length * ROW_H) {
      const lane = rows[Math.floor((y - top) / ROW_H)].lane;
      const i = eventAt(t, lane, ms, 4 / s.pxPerMs);
      if (i >= 0) return showTooltip(x, y, eventLines(t, i));
      const { rank } = t.lanes[lane];
      const bubble =
        computeRows.get(rank) === lane
          ? t.marks.find(
              (m) => m.kind === 'bubble' && m.rank === rank && m.startMs <= ms && ms <= m.endMs,
            )
          : undefined;
      if (bubble) return showTooltip(x, y, markLines(bubble));
    } else if (y >= bandTop(0) && y < bandTop(bandRows)) {
      const row = Math.floor((y - bandTop(0)) / BAND_H);
      const p = phases.find((p) => p.row === row && p.mark.startMs <= ms && ms <= p.mark.endMs);
      if (p) return showTooltip(x, y, markLines(p.mark));
    }
    hideTooltip();
  }

  function showTooltip(x: number, y: number, lines: [string, string][]): void {
    tooltip.replaceChildren(
      ...lines.map(([k, v]) => el('div', {}, el('span', { class: 'tooltip-key' }, k), ' ', v)),
    );
    tooltip.style.display = 'block';
    // beside the pointer, flipped to its left near the right edge
    const w = tooltip.offsetWidth;
    tooltip.style.left = `${x + 14 + w > width ? Math.max(0, x - 14 - w) : x + 14}px`;
    tooltip.style.top = `${y + 12}px`;
  }

  new ResizeObserver(() => {
    if (t && Math.floor(stage.clientWidth) !== width) redraw();
  }).observe(stage);

  return {
    async show(p: number): Promise<void> {
      plan = p;
      const summary = ctx.plans[p];
      const stages = new Set(summary.ranks.map((r) => r.stage)).size;
      rankSelect.replaceChildren(
        ...(stages > 1 ? [new Option(`one rank per stage (${stages} stages)`, STAGES)] : []),
        ...summary.ranks.map(
          (r) => new Option(`rank ${r.rank} · ${r.program} · stage ${r.stage}`, String(r.rank)),
        ),
      );
      const first = String(summary.ranks[0]?.rank ?? 0);
      rankSelect.value = first;
      await load(first);
    },
  };
};

/** the tooltip's rows for event `i` */
function eventLines(t: VizTimeline, i: number): [string, string][] {
  const ev = t.events;
  const wait = Math.min(ev.wait[i], ev.dur[i]);
  const mb = ev.microbatch[i];
  return [
    ['op', `${t.ops[ev.op[i]]}${isCollective(t, i) ? ' (collective)' : ''}`],
    ['scope', t.scopes[ev.scope[i]] || '—'],
    ['phase', t.phases[ev.phase[i]]],
    ['microbatch', mb >= 0 ? String(mb) : '—'],
    ['bytes', formatBytes(ev.bytes[i])],
    ['start', formatMs(ev.start[i])],
    ['duration', formatMs(ev.dur[i])],
    ['waiting', `${wait > 0 ? formatMs(wait) : 'none'} · work ${formatMs(ev.dur[i] - wait)}`],
    ['stream', `${t.lanes[ev.lane[i]].stream} · instruction ${ev.instruction[i]}`],
  ];
}

/** the tooltip's rows for a phase band or a bubble */
function markLines(m: Mark): [string, string][] {
  return [
    [m.kind, m.label],
    ['from', `${formatMs(m.startMs)} to ${formatMs(m.endMs)}`],
    ['duration', formatMs(m.endMs - m.startMs)],
  ];
}
