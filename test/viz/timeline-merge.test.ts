// The timeline view's "one rank per stage": two ranks' timelines as one, lanes one after another,
// events renumbered with their names, bubbles kept per rank, each phase one window over both.
import { describe, expect, it } from 'vitest';
import type { VizTimeline } from '../../viz/model.js';
import { mergeTimelines } from '../../viz/app/timeline/merge.js';

function timeline(rank: number, ops: string[], startMs: number): VizTimeline {
  return {
    source: 'simulated on h800',
    endMs: startMs + 10,
    lanes: [
      { rank, program: `p${rank}`, stream: 'compute' },
      { rank, program: `p${rank}`, stream: 'comm' },
    ],
    ops,
    opIsCollective: ops.map((op) => op === 'send' || op === 'recv'),
    phases: ['forward'],
    scopes: [`s${rank}`],
    events: {
      lane: [0, 1],
      start: [startMs, startMs + 1],
      dur: [2, 3],
      wait: [0, 1],
      op: [0, 1],
      phase: [0, 0],
      scope: [0, 0],
      microbatch: [0, 0],
      bytes: [64, 128],
      instruction: [0, 1],
    },
    marks: [
      { rank, kind: 'phase', label: 'optimizer step', startMs: startMs + 8, endMs: startMs + 10 },
      { rank, kind: 'bubble', label: 'bubble', startMs: startMs + 3, endMs: startMs + 4 },
    ],
  };
}

describe('mergeTimelines', () => {
  it('puts the lanes one after another and renumbers events and names', () => {
    const m = mergeTimelines([
      timeline(0, ['linear', 'send'], 0),
      timeline(4, ['recv', 'linear'], 5),
    ]);
    expect(m.lanes.map((l) => `${l.rank}/${l.stream}`)).toEqual([
      '0/compute',
      '0/comm',
      '4/compute',
      '4/comm',
    ]);
    expect(m.events.lane).toEqual([0, 1, 2, 3]);
    expect(m.events.op.map((o) => m.ops[o])).toEqual(['linear', 'send', 'recv', 'linear']);
    expect(m.ops).toEqual(['linear', 'send', 'recv']);
    expect(m.opIsCollective).toEqual([false, true, true]);
    expect(m.events.scope.map((s) => m.scopes[s])).toEqual(['s0', 's0', 's4', 's4']);
    expect(m.events.start).toEqual([0, 1, 5, 6]);
    expect(m.endMs).toBe(15);
  });

  it('keeps each rank its bubbles, and makes each phase one window over the ranks', () => {
    const m = mergeTimelines([timeline(0, ['a', 'b'], 0), timeline(4, ['a', 'b'], 5)]);
    expect(m.marks.filter((k) => k.kind === 'bubble').map((k) => [k.rank, k.startMs])).toEqual([
      [0, 3],
      [4, 8],
    ]);
    expect(m.marks.filter((k) => k.kind === 'phase')).toEqual([
      { rank: 0, kind: 'phase', label: 'optimizer step', startMs: 8, endMs: 15 },
    ]);
  });

  it('gives one timeline back as it is', () => {
    const t = timeline(0, ['a', 'b'], 0);
    expect(mergeTimelines([t])).toBe(t);
  });
});
