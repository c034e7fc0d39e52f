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
  // owners: disjoint arena intervals [lo, hi) → buffer id whose bytes are there, sorted by lo
  const owners: { lo: number; hi: number; id: number }[] = [];
  const root = (id: number) => p.buffers[id].viewOf ?? id;
  const extent = (id: number) => {
    const b = p.buffers[root(id)];
    return { lo: b.offset, hi: b.offset + Math.max(b.bytes, 1) };
  };
  /** index of the first owner whose hi is above lo */
  const firstAbove = (lo: number) => {
    let [a, b] = [0, owners.length];
    while (a < b) {
      const mid = (a + b) >>> 1;
      if (owners[mid].hi <= lo) a = mid + 1;
      else b = mid;
    }
    return a;
  };
  const written = new Set<number>();
  const problems: MemoryProblem[] = [];
  p.instructions.forEach((ins, idx) => {
    for (const id of ins.inputs) {
      const r = root(id);
      if (p.buffers[r].region !== 'arena' || !written.has(r)) continue;
      const { lo, hi } = extent(r);
      for (let k = firstAbove(lo); k < owners.length && owners[k].lo < hi; k++) {
        if (owners[k].id !== r) {
          problems.push({
            instruction: idx,
            buffer: p.buffers[id].name,
            clobberedBy: p.buffers[owners[k].id].name,
          });
          break;
        }
      }
    }
    for (const id of ins.outputs) {
      const r = root(id);
      if (p.buffers[r].region !== 'arena') continue;
      const { lo, hi } = extent(r);
      const from = firstAbove(lo);
      let to = from;
      while (to < owners.length && owners[to].lo < hi) to++;
      const keep: { lo: number; hi: number; id: number }[] = [];
      if (from < to && owners[from].lo < lo) keep.push({ ...owners[from], hi: lo });
      keep.push({ lo, hi, id: r });
      if (from < to && owners[to - 1].hi > hi) keep.push({ ...owners[to - 1], lo: hi });
      owners.splice(from, to - from, ...keep);
      written.add(r);
    }
  });
  return problems;
}
