// The memory charts, as SVG: device bytes over the step, one curve per series, the static part
// (parameters, gradients, optimizer state, batch) shaded under the activations, the device's
// usable memory as a horizontal line and the peak marked. One renderer draws both the memory
// view's chart (one program: bound and expected curves) and the compare view's (several plans'
// bound curves on one chart, memoryChart below).

import type { VizMemory } from '../../model.js';
import { CATEGORICAL, COLLECTIVE_STROKE } from '../colors.js';
import { formatTicks, niceStep, niceTicks } from '../timeline/scale.js';
import { formatBytes, svg } from '../view.js';

/** one curve: its points (x ascending; y device bytes), drawn as steps (a value holds until the next point) */
export interface ChartSeries {
  /** the data-series attribute of its path */
  readonly key: string;
  readonly color: string;
  readonly x: readonly number[];
  readonly y: readonly number[];
  /** fill between the curve and `areaFrom` bytes (the static part's top) */
  readonly areaFrom?: number;
  readonly dashed?: boolean;
  /** where the last value ends (default: the plot's right edge, the step's end) */
  readonly xEnd?: number;
}

export interface ChartSpec {
  readonly width: number;
  readonly height: number;
  /** what x counts: ms on the timeline, an instruction index, or a percentage of the step */
  readonly xUnit: 'ms' | 'instruction' | 'percent';
  readonly xMax: number;
  readonly series: readonly ChartSeries[];
  /** bytes held over the whole step, shaded from 0 */
  readonly staticBytes?: number;
  /** the usable device memory; off the chart's scale unless `fitLimit` or near the data */
  readonly limit?: { readonly bytes: number; readonly label: string };
  readonly fitLimit?: boolean;
  /** the peaks marked: a dot at (x, bytes), labelled when `label` is given */
  readonly peaks: readonly {
    readonly x: number;
    readonly bytes: number;
    readonly color: string;
    readonly label?: string;
  }[];
  /** a legend drawn inside the chart, above the plot (the view draws its own, in HTML) */
  readonly legend?: readonly (readonly [string, string])[];
}

/** the y axis reaches the device limit when that is within this factor of the data's top */
const LIMIT_IN_SCALE = 3;
const FONT_PX = 11;
/** a label's width, approximately (system-ui at 11px): for placing, never for clipping */
const textWidth = (s: string) => s.length * FONT_PX * 0.6;

/**
 * y ticks in bytes at steps of 1, 2 or 5 × a power of two's unit (1 MiB, 2 MiB, 5 MiB …), at
 * most about `maxTicks`, labelled with formatBytes (more decimals where it would repeat one)
 */
export function byteTicks(
  maxBytes: number,
  maxTicks: number,
): { ticks: number[]; labels: string[] } {
  if (!(maxBytes > 0)) return { ticks: [0], labels: ['0 B'] };
  let unit = 1;
  while (maxBytes / unit >= 1024 && unit < 1024 ** 4) unit *= 1024;
  const step = niceStep(maxBytes / unit / maxTicks) * unit;
  const ticks: number[] = [];
  for (let i = 0; i * step <= maxBytes * (1 + 1e-9); i++) ticks.push(i * step);
  let labels = ticks.map(formatBytes);
  if (labels.some((l, i) => i > 0 && l === labels[i - 1])) {
    const name = formatBytes(unit).split(' ')[1];
    const decimals = Math.max(0, Math.ceil(-Math.log10(step / unit) - 1e-9));
    labels = ticks.map((t) => `${(t / unit).toFixed(decimals)} ${name}`);
  }
  return { ticks, labels };
}

/** the chart's frame: margins, scales, and what the y axis reaches */
export interface ChartFrame {
  readonly x0: number;
  readonly x1: number;
  readonly y0: number;
  readonly y1: number;
  readonly yMax: number;
  readonly limitInScale: boolean;
  x(v: number): number;
  y(bytes: number): number;
}

export function chartFrame(spec: ChartSpec): ChartFrame {
  const dataTop = Math.max(
    spec.staticBytes ?? 0,
    ...spec.series.flatMap((s) => s.y.reduce((m, v) => Math.max(m, v), 0)),
    ...spec.peaks.map((p) => p.bytes),
    1,
  );
  const limitInScale =
    !!spec.limit && (!!spec.fitLimit || spec.limit.bytes <= dataTop * LIMIT_IN_SCALE);
  const yMax = (limitInScale ? Math.max(dataTop, spec.limit!.bytes) : dataTop) * 1.08;
  const legendRows = spec.legend ? legendLayout(spec.legend, spec.width - 80).rows : 0;
  const x0 = 76;
  const x1 = spec.width - 16;
  const y0 = 30 + legendRows * 18;
  const y1 = spec.height - 36;
  const xMax = spec.xMax > 0 ? spec.xMax : 1;
  return {
    x0,
    x1,
    y0,
    y1,
    yMax,
    limitInScale,
    x: (v) => x0 + (v / xMax) * (x1 - x0),
    y: (b) => y1 - (b / yMax) * (y1 - y0),
  };
}

/** an in-chart legend's items, wrapped into rows within `width` */
function legendLayout(rows: readonly (readonly [string, string])[], width: number) {
  const items: { label: string; color: string; x: number; row: number }[] = [];
  let x = 0;
  let row = 0;
  for (const [label, color] of rows) {
    const w = 16 + textWidth(label) + 18;
    if (x > 0 && x + w > width) {
      x = 0;
      row++;
    }
    items.push({ label, color, x, row });
    x += w;
  }
  return { items, rows: rows.length ? row + 1 : 0 };
}

/** the x axis's labels: ms (formatMs), instruction indices or a percentage */
function xTicks(spec: ChartSpec, maxTicks: number): { ticks: number[]; labels: string[] } {
  const { stepMs, ticks } = niceTicks(0, spec.xMax > 0 ? spec.xMax : 1, maxTicks);
  if (spec.xUnit === 'ms') return { ticks, labels: formatTicks(ticks, stepMs) };
  if (spec.xUnit === 'percent') return { ticks, labels: ticks.map((t) => `${+t.toFixed(6)}%`) };
  const whole = ticks.filter((t) => Number.isInteger(t));
  return { ticks: whole, labels: whole.map(String) };
}

const X_TITLE = {
  ms: 'time in the step',
  instruction: 'instruction',
  percent: 'position in the step (% of its instructions)',
};

/** draws a chart; the svg's class is memory-chart, its parts classed as the DOM contract says */
export function renderChart(spec: ChartSpec): SVGSVGElement {
  const f = chartFrame(spec);
  const root = svg('svg', {
    class: 'memory-chart',
    width: spec.width,
    height: spec.height,
    viewBox: `0 0 ${spec.width} ${spec.height}`,
    'font-size': FONT_PX,
    'font-family': 'system-ui, sans-serif',
  });
  const text = (x: number, y: number, s: string, attrs: Record<string, string | number> = {}) => {
    const t = svg('text', { x, y, ...attrs });
    t.textContent = s;
    return t;
  };
  // the legend, above the plot
  if (spec.legend) {
    const g = svg('g', { class: 'chart-legend' });
    for (const it of legendLayout(spec.legend, spec.width - 80).items) {
      const y = 8 + it.row * 18;
      g.append(
        svg('rect', { x: f.x0 + it.x, y, width: 12, height: 10, fill: it.color }),
        text(f.x0 + it.x + 16, y + 9, it.label),
      );
    }
    root.append(g);
  }
  // y axis: grid lines and byte ticks
  const yAxis = svg('g', { class: 'axis y-axis' });
  const { ticks: yt, labels: yl } = byteTicks(f.yMax, Math.max(2, Math.floor((f.y1 - f.y0) / 40)));
  yt.forEach((b, i) => {
    const y = Math.round(f.y(b)) + 0.5;
    yAxis.append(
      svg('line', { x1: f.x0, x2: f.x1, y1: y, y2: y, stroke: i === 0 ? '#999' : '#e6e6e6' }),
      text(f.x0 - 6, y + 4, yl[i], { 'text-anchor': 'end', fill: '#444' }),
    );
  });
  root.append(yAxis);
  // x axis: ticks spaced so that no two labels touch
  const xAxis = svg('g', { class: 'axis x-axis' });
  let maxTicks = Math.max(2, Math.floor((f.x1 - f.x0) / 90));
  let xt = xTicks(spec, maxTicks);
  while (maxTicks > 2) {
    const widest = Math.max(0, ...xt.labels.map(textWidth));
    const gap = xt.ticks.length > 1 ? f.x(xt.ticks[1]) - f.x(xt.ticks[0]) : Infinity;
    if (widest + 16 <= gap) break;
    xt = xTicks(spec, (maxTicks = Math.floor(maxTicks * 0.7)));
  }
  let lastRight = -Infinity;
  xt.ticks.forEach((v, i) => {
    const x = Math.round(f.x(v)) + 0.5;
    xAxis.append(svg('line', { x1: x, x2: x, y1: f.y1, y2: f.y1 + 4, stroke: '#999' }));
    const w = textWidth(xt.labels[i]);
    const lx = Math.min(Math.max(x - w / 2, f.x0 - 20), spec.width - 4 - w);
    if (lx < lastRight + 8) return;
    lastRight = lx + w;
    xAxis.append(text(lx, f.y1 + 16, xt.labels[i], { fill: '#444' }));
  });
  xAxis.append(
    text((f.x0 + f.x1) / 2, f.y1 + 31, X_TITLE[spec.xUnit], {
      'text-anchor': 'middle',
      fill: '#666',
    }),
  );
  root.append(xAxis);
  // the static part, from 0 up: what does not change over the step
  if (spec.staticBytes) {
    const top = f.y(spec.staticBytes);
    const g = svg('g', { class: 'static', 'data-bytes': spec.staticBytes });
    g.append(
      svg('rect', { x: f.x0, y: top, width: f.x1 - f.x0, height: f.y1 - top, fill: STATIC_FILL }),
    );
    const label = `static ${formatBytes(spec.staticBytes)}: parameters, gradients, optimizer state, batch`;
    if (f.y1 - top >= 16 && textWidth(label) + 12 <= f.x1 - f.x0)
      g.append(text(f.x0 + 6, f.y1 - 5, label, { fill: '#555' }));
    root.append(g);
  }
  // the curves, areas first so no fill covers a line
  for (const s of spec.series)
    if (s.areaFrom !== undefined && s.x.length)
      root.append(
        svg('path', {
          class: 'area',
          'data-series': s.key,
          d: areaPath(f, s, s.areaFrom),
          fill: s.color,
          'fill-opacity': 0.18,
        }),
      );
  for (const s of spec.series)
    root.append(
      svg('path', {
        class: 'series',
        'data-series': s.key,
        d: stepPath(f, s),
        fill: 'none',
        stroke: s.color,
        'stroke-width': 1.5,
        ...(s.dashed ? { 'stroke-dasharray': '5 3' } : {}),
      }),
    );
  const limitLabel = spec.limit ? drawLimit(root, f, spec.limit, text) : null;
  for (const p of spec.peaks) drawPeak(root, f, p, limitLabel, text);
  return root;
}

export const STATIC_FILL = '#d9dce3';

/** the usable memory: a dashed line with its label at the right end, or a note at the top when off the scale */
function drawLimit(
  root: SVGSVGElement,
  f: ChartFrame,
  limit: { bytes: number; label: string },
  text: (x: number, y: number, s: string, a?: Record<string, string | number>) => SVGTextElement,
): { x0: number; x1: number; y: number } {
  const g = svg('g', { class: 'limit', 'data-bytes': limit.bytes });
  const label = `${limit.label}: ${formatBytes(limit.bytes)}`;
  const w = textWidth(label);
  if (f.limitInScale) {
    const y = Math.round(f.y(limit.bytes)) + 0.5;
    g.append(
      svg('line', {
        x1: f.x0,
        x2: f.x1,
        y1: y,
        y2: y,
        stroke: COLLECTIVE_STROKE,
        'stroke-dasharray': '6 4',
        'stroke-width': 1.5,
      }),
      text(f.x1 - 4, y - 5, label, { 'text-anchor': 'end', fill: COLLECTIVE_STROKE }),
    );
    root.append(g);
    return { x0: f.x1 - 4 - w, x1: f.x1, y: y - 5 };
  }
  // far above the data: said in words, at the top of the plot, not drawn where it is not
  g.setAttribute('data-off-scale', 'true');
  const note = `▲ ${label} (above the chart)`;
  g.append(text(f.x1 - 4, f.y0 - 6, note, { 'text-anchor': 'end', fill: COLLECTIVE_STROKE }));
  root.append(g);
  return { x0: f.x1 - 4 - textWidth(note), x1: f.x1, y: f.y0 - 6 };
}

/** a peak's dot, and its label beside it, moved off the limit's label where they would meet */
function drawPeak(
  root: SVGSVGElement,
  f: ChartFrame,
  p: ChartSpec['peaks'][number],
  limitLabel: { x0: number; x1: number; y: number } | null,
  text: (x: number, y: number, s: string, a?: Record<string, string | number>) => SVGTextElement,
): void {
  const g = svg('g', { class: 'peak', 'data-bytes': p.bytes });
  const cx = f.x(p.x);
  const cy = f.y(p.bytes);
  g.append(svg('circle', { cx, cy, r: 4, fill: p.color, stroke: '#fff', 'stroke-width': 1.5 }));
  if (p.label) {
    const w = textWidth(p.label);
    const lx = cx + 8 + w > f.x1 ? cx - 8 - w : cx + 8;
    let ly = cy - 6;
    if (ly - 10 < f.y0) ly = cy + 16;
    if (
      limitLabel &&
      Math.abs(ly - limitLabel.y) < 14 &&
      lx < limitLabel.x1 &&
      lx + w > limitLabel.x0
    )
      ly = ly < limitLabel.y ? limitLabel.y - 15 : limitLabel.y + 15;
    // a white halo, so the label reads over the curves
    g.append(
      text(lx, ly, p.label, {
        fill: '#222',
        stroke: '#fff',
        'stroke-width': 3,
        'paint-order': 'stroke',
        'font-weight': 600,
      }),
    );
  }
  root.append(g);
}

/** a step curve: each value holds from its x to the next point's */
function stepPath(f: ChartFrame, s: ChartSeries): string {
  const n = Math.min(s.x.length, s.y.length);
  if (!n) return '';
  const parts = [`M${f.x(s.x[0]).toFixed(1)},${f.y(s.y[0]).toFixed(1)}`];
  for (let i = 1; i < n; i++) parts.push(`H${f.x(s.x[i]).toFixed(1)}V${f.y(s.y[i]).toFixed(1)}`);
  parts.push(`H${(s.xEnd === undefined ? f.x1 : f.x(s.xEnd)).toFixed(1)}`);
  return parts.join('');
}

function areaPath(f: ChartFrame, s: ChartSeries, from: number): string {
  const base = f.y(from).toFixed(1);
  return `${stepPath(f, s)}V${base}H${f.x(s.x[0]).toFixed(1)}Z`;
}

/** the x of the memory's points: ms where it has them, else the instruction index */
export function pointXs(m: VizMemory): { xUnit: 'ms' | 'instruction'; x: readonly number[] } {
  return m.points.ms
    ? { xUnit: 'ms', x: m.points.ms }
    : { xUnit: 'instruction', x: m.points.instruction };
}

/** the x of the memory's peak: its sampled point's, else the nearest sampled instruction's */
export function peakX(m: VizMemory, xs: readonly number[]): number {
  const ins = m.points.instruction;
  let best = 0;
  for (let i = 1; i < ins.length; i++)
    if (Math.abs(ins[i] - m.peak.instruction) < Math.abs(ins[best] - m.peak.instruction)) best = i;
  return xs[best] ?? 0;
}

/**
 * The compare view's chart: each memory's device bytes at the bounds (its static part plus the
 * activations live at the bounds) as one curve, coloured in order (CATEGORICAL), its peak a
 * dot, on one y axis with the usable memory `limitBytes` as a dashed line (said above the chart
 * when it is more than 3× the highest curve). x is ms on the timeline when every memory has ms,
 * else the position in the step as a percentage of its instructions (plans of different lengths
 * side by side). An in-chart legend names each curve with its peak.
 */
export function memoryChart(
  memories: readonly { label: string; memory: VizMemory }[],
  opts: { width: number; height: number; limitBytes: number; limitLabel?: string },
): SVGSVGElement {
  const byMs = memories.length > 0 && memories.every((m) => m.memory.points.ms !== null);
  const series: ChartSeries[] = memories.map(({ memory: m }, i) => {
    const last = m.points.instruction.at(-1) || 1;
    const x = byMs ? m.points.ms! : m.points.instruction.map((v) => (v / last) * 100);
    // each curve ends where its step does, not at the longest one's end
    return {
      key: `bound-${i}`,
      color: CATEGORICAL[i % CATEGORICAL.length],
      x,
      y: m.points.boundBytes.map((b) => b + m.staticBytes),
      xEnd: x.at(-1),
    };
  });
  const xMax = byMs ? Math.max(...series.flatMap((s) => s.x.at(-1) ?? 0), 0) : 100;
  const chart = renderChart({
    width: opts.width,
    height: opts.height,
    xUnit: byMs ? 'ms' : 'percent',
    xMax,
    series,
    limit: { bytes: opts.limitBytes, label: opts.limitLabel ?? 'usable device memory' },
    peaks: memories.map(({ memory: m }, i) => ({
      x: peakX(m, series[i].x),
      bytes: m.peak.boundBytes,
      color: series[i].color,
    })),
    legend: memories.map(
      ({ label, memory: m }, i) =>
        [`${label}: peak ${formatBytes(m.peak.boundBytes)}`, series[i].color] as const,
    ),
  });
  chart.dataset.programs = memories.map((m) => m.memory.program).join(',');
  return chart;
}
