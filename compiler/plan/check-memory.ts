// A checker for memory plans: replays a program in issue order (one stream), keeping the buffers
// of the planned regions (the arena, and the host region of offloaded activations) that are live
// (written, and read again later) sorted by offset, and proves that no write lands on a live
// buffer's bytes: no buffer is read after its space was reused. A batched
// send/recv runs over its whole batch: its reads last to the batch's end, its writes happen at the
// batch's start.

import { batchSpans, type ProgramFile } from './format.js';

export interface MemoryProblem {
  readonly instruction: number;
  readonly buffer: string;
  readonly clobberedBy: string;
}

export function checkMemoryReuse(p: ProgramFile): MemoryProblem[] {
  // [buffer] the buffer whose bytes it uses (a view → its base)
  const rootOf = new Int32Array(p.buffers.length);
  for (let id = 0; id < rootOf.length; id++) rootOf[id] = p.buffers[id].viewOf ?? id;
  // the planned regions, each with its live buffers
  const planned = new Map([
    ['arena', new LiveSet()],
    ['host', new LiveSet()],
  ]);
  // the last instruction that reads or writes each buffer
  const span = batchSpans(p.instructions);
  const lastUse = new Int32Array(p.buffers.length).fill(-1);
  const use = (id: number, last: number) => {
    const r = rootOf[id];
    if (lastUse[r] < last) lastUse[r] = last;
  };
  for (let idx = 0; idx < p.instructions.length; idx++) {
    const ins = p.instructions[idx];
    for (const id of ins.inputs) use(id, span.last[idx]);
    for (const id of ins.outputs) use(id, span.last[idx]);
  }
  // live buffers (written, read again later), sorted by offset: their bytes must never overlap
  const isLive = new Uint8Array(p.buffers.length);
  // buffers by the instruction after which they die: a linked list per instruction
  const endHead = new Int32Array(p.instructions.length).fill(-1);
  const endNext = new Int32Array(p.buffers.length).fill(-1);
  const problems: MemoryProblem[] = [];
  const write = (id: number) => {
    const r = rootOf[id];
    const b = p.buffers[r];
    const live = planned.get(b.region);
    if (!live || isLive[r]) return;
    const [lo, hi] = [b.offset, b.offset + Math.max(b.bytes, 1)];
    const over = live.overlapping(lo, hi);
    if (over >= 0) {
      // a live buffer's bytes are reused: its next read finds another buffer's data
      const victim = over;
      problems.push({
        instruction: lastUse[victim],
        buffer: p.buffers[victim].name,
        clobberedBy: b.name,
      });
      return;
    }
    live.insert(lo, hi, r);
    isLive[r] = 1;
    endNext[r] = endHead[lastUse[r]];
    endHead[lastUse[r]] = r;
  };
  for (let idx = 0; idx < p.instructions.length; idx++) {
    // the writes of a batch happen at its first instruction
    if (span.first[idx] === idx)
      for (let k = idx; k <= span.last[idx]; k++)
        for (const id of p.instructions[k].outputs) write(id);
    for (let r = endHead[idx]; r >= 0; r = endNext[r]) {
      if (isLive[r]) planned.get(p.buffers[r].region)!.remove(p.buffers[r].offset, r);
      isLive[r] = 0;
    }
  }
  return problems;
}

interface Span {
  readonly lo: number;
  readonly hi: number;
  readonly id: number;
}

/**
 * Disjoint byte spans sorted by offset, in chunks of at most CHUNK (a sorted list of sorted
 * lists): insert, remove and the overlap query touch one or two chunks.
 */
class LiveSet {
  private static readonly CHUNK = 256;
  private chunks: Span[][] = [];

  /** the id of a span that overlaps [lo, hi), or -1 */
  overlapping(lo: number, hi: number): number {
    const c = this.chunkOf(lo);
    for (let k = c; k < this.chunks.length && k <= c + 1; k++) {
      const chunk = this.chunks[k];
      const at = firstAbove(chunk, lo);
      if (at < chunk.length && chunk[at].lo < hi) return chunk[at].id;
    }
    return -1;
  }

  insert(lo: number, hi: number, id: number): void {
    if (!this.chunks.length) {
      this.chunks.push([{ lo, hi, id }]);
      return;
    }
    const c = this.chunkOf(lo);
    const chunk = this.chunks[c];
    chunk.splice(firstAbove(chunk, lo), 0, { lo, hi, id });
    if (chunk.length > LiveSet.CHUNK) this.chunks.splice(c + 1, 0, chunk.splice(chunk.length >> 1));
  }

  remove(lo: number, id: number): void {
    const c = this.chunkOf(lo);
    const chunk = this.chunks[c];
    const at = firstAbove(chunk, lo);
    if (at < chunk.length && chunk[at].id === id) chunk.splice(at, 1);
    if (!chunk.length) this.chunks.splice(c, 1);
  }

  /** the chunk that holds (or would hold) a span starting at lo: the last whose first lo ≤ lo */
  private chunkOf(lo: number): number {
    let [a, b] = [0, this.chunks.length];
    while (a < b) {
      const mid = (a + b) >>> 1;
      if (this.chunks[mid][0].lo <= lo) a = mid + 1;
      else b = mid;
    }
    return Math.max(0, a - 1);
  }
}

/** index of the first span whose hi is above lo */
function firstAbove(spans: readonly Span[], lo: number): number {
  let [a, b] = [0, spans.length];
  while (a < b) {
    const mid = (a + b) >>> 1;
    if (spans[mid].hi <= lo) a = mid + 1;
    else b = mid;
  }
  return a;
}
