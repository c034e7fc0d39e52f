// A debug checker for memory plans: replays a program in issue order (one stream) tracking which
// buffer last wrote each arena byte range, and proves that every read finds its own buffer's
// bytes there: no buffer is read after its space was reused.

import type { ProgramFile } from './format.js';

export interface MemoryProblem {
  readonly instruction: number;
  readonly buffer: string;
  readonly clobberedBy: string;
}

export function checkMemoryReuse(p: ProgramFile): MemoryProblem[] {
  // owners: disjoint arena intervals [lo, hi) → buffer id whose bytes are there
  let owners: { lo: number; hi: number; id: number }[] = [];
  const root = (id: number) => p.buffers[id].viewOf ?? id;
  const extent = (id: number) => {
    const b = p.buffers[root(id)];
    return { lo: b.offset, hi: b.offset + Math.max(b.bytes, 1) };
  };
  const written = new Set<number>();
  const problems: MemoryProblem[] = [];
  p.instructions.forEach((ins, idx) => {
    for (const id of ins.inputs) {
      const r = root(id);
      if (p.buffers[r].region !== 'arena' || !written.has(r)) continue;
      const { lo, hi } = extent(r);
      for (const o of owners) {
        if (o.lo < hi && lo < o.hi && o.id !== r) {
          problems.push({
            instruction: idx,
            buffer: p.buffers[id].name,
            clobberedBy: p.buffers[o.id].name,
          });
          break;
        }
      }
    }
    for (const id of ins.outputs) {
      const r = root(id);
      if (p.buffers[r].region !== 'arena') continue;
      const { lo, hi } = extent(r);
      const next: typeof owners = [];
      for (const o of owners) {
        if (o.hi <= lo || o.lo >= hi) next.push(o);
        else {
          if (o.lo < lo) next.push({ lo: o.lo, hi: lo, id: o.id });
          if (o.hi > hi) next.push({ lo: hi, hi: o.hi, id: o.id });
        }
      }
      next.push({ lo, hi, id: r });
      owners = next;
      written.add(r);
    }
  });
  return problems;
}
