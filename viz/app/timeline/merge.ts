// Several ranks' timelines as one (the timeline view's "one rank per stage"): their lanes one
// after another, their events with the lanes and names renumbered, their bubbles kept per rank,
// and each phase one window over the ranks (its earliest start to its latest end), so the phases
// of the step read as one band each above the pipeline's stages. Pure: no DOM.

import type { VizTimeline } from '../../model.js';

export function mergeTimelines(ts: readonly VizTimeline[]): VizTimeline {
  if (ts.length === 1) return ts[0];
  const names = () => {
    const list: string[] = [];
    const at = new Map<string, number>();
    const of = (x: string) => {
      let i = at.get(x);
      if (i === undefined) at.set(x, (i = list.push(x) - 1));
      return i;
    };
    return { list, of };
  };
  const [ops, phases, scopes] = [names(), names(), names()];
  const opIsCollective: boolean[] = [];
  const ev: { [K in keyof VizTimeline['events']]: number[] } = {
    lane: [],
    start: [],
    dur: [],
    wait: [],
    op: [],
    phase: [],
    scope: [],
    microbatch: [],
    bytes: [],
    instruction: [],
  };
  const lanes: VizTimeline['lanes'][number][] = [];
  const windows = new Map<string, [number, number]>();
  const bubbles: VizTimeline['marks'][number][] = [];
  for (const t of ts) {
    const laneAt = lanes.length;
    lanes.push(...t.lanes);
    const opOf = t.ops.map(ops.of);
    t.ops.forEach((_, i) => (opIsCollective[opOf[i]] = t.opIsCollective[i]));
    const phaseOf = t.phases.map(phases.of);
    const scopeOf = t.scopes.map(scopes.of);
    const e = t.events;
    for (let i = 0; i < e.lane.length; i++) {
      ev.lane.push(e.lane[i] + laneAt);
      ev.start.push(e.start[i]);
      ev.dur.push(e.dur[i]);
      ev.wait.push(e.wait[i]);
      ev.op.push(opOf[e.op[i]]);
      ev.phase.push(phaseOf[e.phase[i]]);
      ev.scope.push(scopeOf[e.scope[i]]);
      ev.microbatch.push(e.microbatch[i]);
      ev.bytes.push(e.bytes[i]);
      ev.instruction.push(e.instruction[i]);
    }
    for (const m of t.marks) {
      if (m.kind === 'bubble') {
        bubbles.push(m);
        continue;
      }
      const w = windows.get(m.label);
      if (w) [w[0], w[1]] = [Math.min(w[0], m.startMs), Math.max(w[1], m.endMs)];
      else windows.set(m.label, [m.startMs, m.endMs]);
    }
  }
  const sources = [...new Set(ts.map((t) => t.source))];
  return {
    source: sources.length === 1 ? sources[0] : sources.join('; '),
    endMs: Math.max(...ts.map((t) => t.endMs)),
    lanes,
    ops: ops.list,
    opIsCollective,
    phases: phases.list,
    scopes: scopes.list,
    events: ev,
    marks: [
      ...[...windows].map(([label, [startMs, endMs]]) => ({
        rank: ts[0].lanes[0]?.rank ?? 0,
        kind: 'phase' as const,
        label,
        startMs,
        endMs,
      })),
      ...bubbles,
    ],
  };
}
