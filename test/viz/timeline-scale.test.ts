// The timeline's and the memory chart's pure parts (viz/app/timeline/scale.ts, memory/chart.ts):
// the window's zoom and pan, the axes' ticks, the lane index's culling and hit testing, the
// merging of sub-pixel spans, and the packing of overlapping phase bands into rows.

import { describe, expect, it } from 'vitest';
import { byteTicks } from '../../viz/app/memory/chart.js';
import {
  clampWindow,
  formatTicks,
  hitTest,
  indexLanes,
  niceTicks,
  packRows,
  panBy,
  RectMerger,
  TimeScale,
  visibleRange,
  zoomAt,
} from '../../viz/app/timeline/scale.js';

const step = { startMs: 0, endMs: 100 };

describe('time scale and window', () => {
  it('maps ms to px and back over the plot', () => {
    const s = new TimeScale({ startMs: 10, endMs: 20 }, 100, 500);
    expect(s.x(10)).toBe(100);
    expect(s.x(20)).toBe(600);
    expect(s.ms(350)).toBe(15);
    expect(s.pxPerMs).toBe(50);
  });

  it('zooms around the anchor, which keeps its pixel', () => {
    const w = zoomAt(step, 4, 20, step);
    expect(w.endMs - w.startMs).toBeCloseTo(25);
    // 20 ms sat at 20% of the window, and still does
    expect((20 - w.startMs) / (w.endMs - w.startMs)).toBeCloseTo(0.2);
  });

  it('zooming out never leaves the step, and in stops at the narrowest window', () => {
    expect(zoomAt({ startMs: 80, endMs: 90 }, 1 / 16, 85, step)).toEqual(step);
    expect(zoomAt({ startMs: 80, endMs: 90 }, 1 / 4, 85, step)).toEqual({
      startMs: 60,
      endMs: 100,
    });
    const w = zoomAt(step, 1e12, 50, step);
    expect(w.endMs - w.startMs).toBeCloseTo(1e-3);
    expect(w.startMs).toBeCloseTo(50 - 0.5e-3);
  });

  it('pans by a width kept, stopping at the ends', () => {
    expect(panBy({ startMs: 10, endMs: 30 }, 5, step)).toEqual({ startMs: 15, endMs: 35 });
    expect(panBy({ startMs: 10, endMs: 30 }, -50, step)).toEqual({ startMs: 0, endMs: 20 });
    expect(panBy({ startMs: 70, endMs: 90 }, 50, step)).toEqual({ startMs: 80, endMs: 100 });
  });

  it('clamps a window wider than the step to the step', () => {
    expect(clampWindow({ startMs: -5, endMs: 300 }, step)).toEqual(step);
  });
});

describe('axis ticks', () => {
  it('steps by 1, 2 or 5 × 10^k, inside the window', () => {
    expect(niceTicks(0, 173.5, 8)).toEqual({ stepMs: 50, ticks: [0, 50, 100, 150] });
    const { stepMs, ticks } = niceTicks(12.31, 12.36, 5);
    expect(stepMs).toBeCloseTo(0.01);
    expect(ticks.map((t) => +t.toFixed(6))).toEqual([12.31, 12.32, 12.33, 12.34, 12.35, 12.36]);
  });

  it('labels with formatMs, and with more decimals where formatMs would repeat a label', () => {
    expect(formatTicks([0, 50, 100], 50)).toEqual(['0', '50.00 ms', '100 ms']);
    const fine = niceTicks(12.3401, 12.3449, 4);
    const labels = formatTicks(fine.ticks, fine.stepMs);
    expect(new Set(labels).size).toBe(labels.length);
    expect(labels).toEqual(['12.342 ms', '12.344 ms']);
  });

  it('steps bytes in binary units, labels all distinct', () => {
    const mib = 1024 ** 2;
    const { ticks, labels } = byteTicks(38 * mib, 8);
    expect(ticks[1]).toBe(5 * mib);
    expect(labels.slice(0, 3)).toEqual(['0 B', '5.00 MiB', '10.0 MiB']);
    const fine = byteTicks(150.3 * mib, 300);
    expect(new Set(fine.labels).size).toBe(fine.labels.length);
  });
});

// three lanes: lane 0 sequential kernels, lane 1 one long span, lane 2 given out of order
const events = {
  lane: [0, 0, 0, 1, 2, 2, 0],
  start: [0, 10, 20, 0, 50, 5, 30],
  dur: [5, 5, 0.001, 100, 10, 10, 5],
};

describe('lane index', () => {
  const lanes = indexLanes(events, 3);

  it('sorts each lane by start', () => {
    expect([...lanes[0].order]).toEqual([0, 1, 2, 6]);
    expect([...lanes[2].order]).toEqual([5, 4]);
    expect([...lanes[1].maxEnd]).toEqual([100]);
  });

  it('culls to the events that reach into the window', () => {
    expect(visibleRange(lanes[0], { startMs: 6, endMs: 21 })).toEqual([1, 3]);
    expect(visibleRange(lanes[0], { startMs: 40, endMs: 50 })).toEqual([4, 4]);
    // a long span that began before the window is kept
    expect(visibleRange(lanes[1], { startMs: 60, endMs: 70 })).toEqual([0, 1]);
  });

  it('hits the event under the time, or the nearest within the tolerance', () => {
    expect(hitTest(lanes[0], 12, 0)).toBe(1);
    expect(hitTest(lanes[0], 7, 0)).toBe(-1);
    expect(hitTest(lanes[0], 7, 2.5)).toBe(0);
    // a 1 µs kernel found from a pixel's worth away
    expect(hitTest(lanes[0], 20.3, 0.5)).toBe(2);
    expect(hitTest(lanes[1], 99, 0)).toBe(3);
    expect(hitTest(lanes[2], 12, 0)).toBe(5);
  });
});

describe('merging spans into rectangles', () => {
  const run = (spans: [number, number, number][]) => {
    const out: [number, number, number][] = [];
    const m = new RectMerger((key, x, w) => out.push([key, x, w]));
    for (const [key, a, b] of spans) m.add(key, a, b);
    m.flush();
    return out;
  };

  it('keeps wide spans apart and extends a colour over touching spans', () => {
    expect(
      run([
        [1, 0, 10],
        [2, 10, 20],
      ]),
    ).toEqual([
      [1, 0, 10],
      [2, 10, 10],
    ]);
    expect(
      run([
        [1, 0, 3],
        [1, 3.2, 6],
      ]),
    ).toEqual([[1, 0, 6]]);
  });

  it('draws 100k sub-pixel spans as about one rectangle per pixel', () => {
    const spans: [number, number, number][] = [];
    for (let i = 0; i < 100_000; i++) spans.push([i % 3, i * 0.01, i * 0.01 + 0.004]);
    const rects = run(spans);
    expect(rects.length).toBeLessThanOrEqual(1001);
    expect(rects.every(([, , w]) => w >= 1)).toBe(true);
  });
});

describe('packing marks into rows', () => {
  it('puts overlapping bands in different rows, and reuses a row once free', () => {
    const marks = [
      { startMs: 0, endMs: 7.5 }, // encoder forward
      { startMs: 2.5, endMs: 163 }, // decoder pipeline
      { startMs: 152, endMs: 173 }, // encoder backward
      { startMs: 173, endMs: 173.5 }, // optimizer step
    ];
    expect(packRows(marks)).toEqual({ rows: [0, 1, 0, 0], rowCount: 2 });
  });
});
