// The compare view: two to four plans side by side — their forecast figures and memory in one
// table, each plan's first rank's compute lane on one time axis, and each plan's largest program's
// memory over the step on one chart. The plans compared are picked in up to four selectors
// (select.compare-plan); the root's data-plans lists the ones drawn.

import type { VizMemory, VizPlanSummary, VizTimeline } from '../../model.js';
import { memoryChart } from '../memory/view.js';
import { drawLanes } from '../timeline/draw.js';
import { el, formatBytes, formatMs, markReady, type MountView } from '../view.js';

const SLOTS = 4;

export const mountCompare: MountView = (root, ctx) => {
  const { plans } = ctx;
  root.classList.add('compare');
  const pickers = el('div', { class: 'compare-pickers' });
  const note = el('p', { class: 'compare-note' });
  const table = el('table', { class: 'figures compare-figures' });
  const lanesTitle = el('h3', {}, 'Timelines (rank 0 of each plan, compute stream, one time axis)');
  const canvas = el('canvas', { class: 'compare-timeline' });
  const memoryTitle = el(
    'h3',
    {},
    'Memory over the step (each plan’s largest program, at the bounds)',
  );
  const memoryBox = el('div', { class: 'compare-memory' });
  root.append(pickers, note, table, lanesTitle, canvas, memoryTitle, memoryBox);

  const selects = Array.from({ length: SLOTS }, (_, slot) => {
    const s = el('select', { class: 'compare-plan', 'data-slot': String(slot) });
    s.append(new Option('—', ''));
    for (const p of plans) s.append(new Option(`${p.index}: ${p.title}`, String(p.index)));
    s.value = slot < Math.min(plans.length, SLOTS) ? String(slot) : '';
    pickers.append(el('label', {}, `plan ${slot + 1} `, s));
    return s;
  });
  let drawing = Promise.resolve();
  const chosen = () => [
    ...new Set(
      selects
        .map((s) => s.value)
        .filter((v) => v !== '')
        .map(Number),
    ),
  ];

  const draw = async (): Promise<void> => {
    delete root.dataset.ready;
    const picked = chosen().map((i) => plans[i]);
    note.textContent =
      plans.length < 2
        ? 'One plan: give lfc viz two to four plan directories to compare them.'
        : picked.length < 2
          ? 'Pick two to four plans.'
          : '';
    figures(table, picked);
    const timelines = await Promise.all(picked.map((p) => ctx.source.timeline(p.index, 0)));
    lanes(canvas, picked, timelines);
    const memories = await Promise.all(
      picked.map((p) => ctx.source.memory(p.index, largestProgram(p).id)),
    );
    memory(memoryBox, picked, memories);
    root.dataset.plans = picked.map((p) => p.index).join(',');
  };
  for (const s of selects)
    s.addEventListener('change', () => {
      drawing = drawing.then(draw).then(() => markReady(root, -1), console.error);
    });

  return {
    async show() {
      // the compare view draws the plans picked, not the shell's one plan
      drawing = drawing.then(draw);
      await drawing;
      markReady(root, -1);
    },
  };
};

/** a plan's name in the narrow places (lane labels, the chart's legend): its index and level */
const shortName = (p: VizPlanSummary) =>
  `plan ${p.index}${p.encoderLevel ? ` (level ${p.encoderLevel})` : ''}`;

/** the program that needs the most device memory at the bounds */
const largestProgram = (p: VizPlanSummary) =>
  p.programs.reduce((a, b) => (b.boundBytes > a.boundBytes ? b : a));

/** the forecast and memory figures, a column per plan */
function figures(table: HTMLTableElement, picked: readonly VizPlanSummary[]): void {
  const f = (x: number | null | undefined, fmt: (v: number) => string) =>
    x === null || x === undefined ? '—' : fmt(x);
  const num = (v: number) => v.toLocaleString('en-US', { maximumFractionDigits: 0 });
  const big = largestProgram;
  const rows: [string, (p: VizPlanSummary) => string][] = [
    ['layout', (p) => p.layout],
    ['ranks', (p) => String(p.worldSize)],
    ['step', (p) => f(p.forecast?.stepMs, formatMs)],
    ['tokens/s', (p) => f(p.forecast?.tokensPerSecond, num)],
    ['tokens/s per GPU', (p) => f(p.forecast?.tokensPerSecondPerGpu, num)],
    ['MFU', (p) => f(p.forecast?.mfu, (v) => `${(v * 100).toFixed(1)}%`)],
    ['forecast', (p) => p.forecast?.source ?? '—'],
    ['largest program, bound', (p) => `${big(p).id}: ${formatBytes(big(p).boundBytes)}`],
    ['largest program, expected', (p) => formatBytes(big(p).expectedBytes)],
    [
      'device',
      (p) => `${p.device.name}: ${formatBytes(p.device.bytes - p.device.reserveBytes)} usable`,
    ],
    [
      'fits (bound)',
      (p) => (big(p).boundBytes <= p.device.bytes - p.device.reserveBytes ? 'yes' : 'no'),
    ],
  ];
  table.replaceChildren(
    el(
      'tr',
      {},
      el('th', {}, ''),
      ...picked.map((p) => el('th', { title: p.dir }, `${shortName(p)}: ${p.title}`)),
    ),
    ...rows.map(([label, cell]) =>
      el(
        'tr',
        { 'data-row': label },
        el('th', {}, label),
        ...picked.map((p) => el('td', {}, cell(p))),
      ),
    ),
  );
}

/** each plan's rank-0 compute lane, one row per plan, one time axis */
function lanes(
  canvas: HTMLCanvasElement,
  picked: readonly VizPlanSummary[],
  timelines: readonly VizTimeline[],
): void {
  const width = Math.max(600, (canvas.parentElement?.clientWidth ?? 1200) - 24);
  const rowHeight = 28;
  const height = 24 + rowHeight * picked.length;
  const dpr = window.devicePixelRatio || 1;
  canvas.width = width * dpr;
  canvas.height = height * dpr;
  canvas.style.width = `${width}px`;
  canvas.style.height = `${height}px`;
  const g = canvas.getContext('2d')!;
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.clearRect(0, 0, width, height);
  const endMs = Math.max(...timelines.map((t) => t.endMs), 1e-9);
  drawLanes(
    g,
    timelines.map((timeline, i) => ({
      label: `${shortName(picked[i])} · ${formatMs(timeline.endMs)}`,
      timeline,
      lane: Math.max(
        0,
        timeline.lanes.findIndex((l) => l.stream === 'compute'),
      ),
    })),
    { startMs: 0, endMs },
    { x: 0, y: 0, width, rowHeight, labelWidth: 180 },
  );
}

function memory(
  box: HTMLElement,
  picked: readonly VizPlanSummary[],
  memories: readonly VizMemory[],
): void {
  const limit = Math.min(...picked.map((p) => p.device.bytes - p.device.reserveBytes));
  box.replaceChildren(
    memoryChart(
      memories.map((memory, i) => ({
        label: `${shortName(picked[i])}: ${memory.program}`,
        memory,
      })),
      { width: Math.max(600, (box.clientWidth || 1200) - 24), height: 260, limitBytes: limit },
    ),
  );
}
