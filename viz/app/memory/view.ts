// The memory view: one program's device bytes over its step (the program of rank 0 first; a
// selector for the others). The static part (parameters, gradients, optimizer state, batch) is
// shaded at the bottom, the activations live at each point stacked on it: at the bounds of every
// size (what the memory plan reserves) and at the data profile's expected sizes (dashed). The
// device's usable memory is a line, the peak a labelled dot; hovering reads a point off.
//
// DOM the shell and the browser tests read:
//   root[data-ready]                       the plan drawn (absent while a program loads)
//   select.program                         the program shown
//   svg.memory-chart[data-program="p0"]    the chart, with
//     path.series[data-series="bound"], path.series[data-series="expected"], g.static,
//     g.limit (line and label; data-off-scale="true" when the limit is far above the data: then a
//     note at the top, and input.fit-limit puts it in scale), g.peak (dot and formatBytes label)
//   .tooltip                               shown while the pointer is over the plot

import type { VizMemory, VizPlanSummary } from '../../model.js';
import { COLLECTIVE_STROKE, legend } from '../colors.js';
import {
  el,
  formatBytes,
  formatMs,
  markReady,
  svg,
  type MountView,
  type View,
  type ViewContext,
} from '../view.js';
import { chartFrame, peakX, pointXs, renderChart, STATIC_FILL, type ChartSpec } from './chart.js';
import './memory.css';

export { memoryChart } from './chart.js';

const BOUND_COLOR = '#4e79a7';
const EXPECTED_COLOR = '#f28e2b';
const CHART_HEIGHT = 440;

export const mountMemory: MountView = (root: HTMLElement, ctx: ViewContext): View => {
  const programSelect = el('select', { class: 'program', 'aria-label': 'program' });
  const fitLimit = el('input', { type: 'checkbox', class: 'fit-limit' });
  const info = el('span', { class: 'memory-info' });
  const message = el('div', { class: 'memory-message' });
  const tooltip = el('div', { class: 'tooltip', role: 'tooltip' });
  tooltip.style.display = 'none';
  const chartBox = el('div', { class: 'memory-chart-box' });
  const legendBox = el('div', { class: 'memory-legend' });
  root.classList.add('memory-view');
  root.append(
    el(
      'div',
      { class: 'memory-bar' },
      el('label', {}, 'program ', programSelect),
      el(
        'label',
        { title: 'draw the y axis up to the usable device memory' },
        fitLimit,
        ' y axis to the device limit',
      ),
      info,
    ),
    message,
    chartBox,
    legendBox,
  );

  let plan = -1;
  let loads = 0;
  let memory: VizMemory | null = null;
  let drawnWidth = 0;

  /** the chart of the memory shown, at the box's width */
  function draw(): void {
    const m = memory;
    const summary = ctx.plans[plan];
    if (!m || !summary) return;
    const width = Math.max(480, Math.floor(chartBox.clientWidth || root.clientWidth || 1200));
    drawnWidth = width;
    const { xUnit, x } = pointXs(m);
    const spec: ChartSpec = {
      width,
      height: CHART_HEIGHT,
      xUnit,
      xMax: Math.max(
        x.at(-1) ?? 0,
        xUnit === 'instruction' ? (programOf(summary, m.program)?.instructions ?? 0) : 0,
      ),
      staticBytes: m.staticBytes,
      series: [
        {
          key: 'bound',
          color: BOUND_COLOR,
          x,
          y: m.points.boundBytes.map((b) => b + m.staticBytes),
          areaFrom: m.staticBytes,
        },
        {
          key: 'expected',
          color: EXPECTED_COLOR,
          x,
          y: m.points.expectedBytes.map((b) => b + m.staticBytes),
          dashed: true,
        },
      ],
      limit: { bytes: m.limitBytes, label: `${summary.device.name} usable` },
      fitLimit: fitLimit.checked,
      peaks: [
        {
          x: peakX(m, x),
          bytes: m.peak.boundBytes,
          color: BOUND_COLOR,
          label: `peak ${formatBytes(m.peak.boundBytes)}`,
        },
      ],
    };
    const chart = renderChart(spec);
    chart.dataset.program = m.program;
    const cursor = svg('line', {
      class: 'cursor',
      stroke: '#888',
      'stroke-dasharray': '2 2',
      visibility: 'hidden',
    });
    chart.append(cursor);
    hoverOn(chart, cursor, spec, m);
    chartBox.replaceChildren(chart, tooltip);
    fitLimit.disabled = chart.querySelector('.limit[data-off-scale]') === null && !fitLimit.checked;
  }

  /** reads the point under the pointer off the chart: a dashed line there and the tooltip */
  function hoverOn(
    chart: SVGSVGElement,
    cursor: SVGLineElement,
    spec: ChartSpec,
    m: VizMemory,
  ): void {
    const f = chartFrame(spec);
    const xs = spec.series[0].x;
    chart.addEventListener('pointermove', (e) => {
      const px = e.offsetX;
      if (px < f.x0 || px > f.x1 || e.offsetY < f.y0 || e.offsetY > f.y1 || !xs.length)
        return hide();
      const v = ((px - f.x0) / (f.x1 - f.x0)) * spec.xMax;
      // the last point at or before v (a value holds until the next point)
      let lo = 0;
      let hi = xs.length;
      while (lo < hi) {
        const mid = (lo + hi) >>> 1;
        if (xs[mid] <= v) lo = mid + 1;
        else hi = mid;
      }
      const i = Math.max(0, lo - 1);
      for (const [k, val] of Object.entries({ x1: px, x2: px, y1: f.y0, y2: f.y1 }))
        cursor.setAttribute(k, String(val));
      cursor.setAttribute('visibility', 'visible');
      const at = m.points.ms ? formatMs(m.points.ms[i]) : `instruction ${m.points.instruction[i]}`;
      tooltip.replaceChildren(
        el(
          'div',
          {},
          el('span', { class: 'tooltip-key' }, 'at'),
          ` ${at} (instruction ${m.points.instruction[i]})`,
        ),
        el(
          'div',
          {},
          el('span', { class: 'tooltip-key' }, 'bounds'),
          ` ${formatBytes(m.staticBytes + m.points.boundBytes[i])}`,
        ),
        el(
          'div',
          {},
          el('span', { class: 'tooltip-key' }, 'expected'),
          ` ${formatBytes(m.staticBytes + m.points.expectedBytes[i])}`,
        ),
        el(
          'div',
          {},
          el('span', { class: 'tooltip-key' }, 'static'),
          ` ${formatBytes(m.staticBytes)}`,
        ),
      );
      tooltip.style.display = 'block';
      const w = tooltip.offsetWidth;
      tooltip.style.left = `${px + 14 + w > f.x1 ? px - 14 - w : px + 14}px`;
      tooltip.style.top = `${Math.max(f.y0, e.offsetY - 40)}px`;
    });
    const hide = () => {
      tooltip.style.display = 'none';
      cursor.setAttribute('visibility', 'hidden');
    };
    chart.addEventListener('pointerleave', hide);
  }

  async function load(program: string): Promise<void> {
    const mine = ++loads;
    delete root.dataset.ready;
    message.textContent = `loading ${program}…`;
    let m: VizMemory;
    try {
      m = await ctx.source.memory(plan, program);
    } catch (e) {
      if (mine !== loads) return;
      memory = null;
      chartBox.replaceChildren();
      legendBox.replaceChildren();
      info.textContent = '';
      message.textContent = `${program}: ${(e as Error).message}`;
      markReady(root, plan);
      return;
    }
    if (mine !== loads) return;
    memory = m;
    message.textContent = '';
    const summary = ctx.plans[plan];
    const p = programOf(summary, program);
    info.textContent = [
      p
        ? `${p.ranks.length} rank${p.ranks.length === 1 ? '' : 's'} (stage ${p.stages.join(', ')})`
        : program,
      `peak ${formatBytes(m.peak.boundBytes)} at the bounds, ${formatBytes(m.peak.expectedBytes)} expected`,
      `${summary.device.name}: ${formatBytes(m.limitBytes)} usable (${formatBytes(summary.device.bytes)} less ${formatBytes(summary.device.reserveBytes)} reserve)`,
    ].join(' · ');
    legendBox.replaceChildren(
      legend([
        ['static: parameters, gradients, optimizer state, batch', STATIC_FILL],
        ['with activations at the bounds', BOUND_COLOR],
        ['at expected sizes (dashed)', EXPECTED_COLOR],
        [`${summary.device.name} usable memory`, COLLECTIVE_STROKE],
      ]),
    );
    draw();
    markReady(root, plan);
  }

  programSelect.addEventListener('change', () => void load(programSelect.value));
  fitLimit.addEventListener('change', draw);
  new ResizeObserver(() => {
    if (memory && Math.floor(chartBox.clientWidth) !== drawnWidth) draw();
  }).observe(chartBox);

  return {
    async show(p: number): Promise<void> {
      plan = p;
      const summary = ctx.plans[p];
      programSelect.replaceChildren(
        ...summary.programs.map(
          (q) =>
            new Option(
              `${q.id} · ${q.ranks.length} rank${q.ranks.length === 1 ? '' : 's'} · stage ${q.stages.join(', ')}`,
              q.id,
            ),
        ),
      );
      const first = summary.ranks[0]?.program ?? summary.programs[0]?.id;
      if (first === undefined) {
        message.textContent = 'this plan has no programs';
        markReady(root, p);
        return;
      }
      programSelect.value = first;
      await load(first);
    },
  };
};

function programOf(summary: VizPlanSummary, id: string) {
  return summary.programs.find((q) => q.id === id);
}
