// Rule event-order, per program (every rank that runs a program has its streams and events):
//   pass 1  every event is recorded by exactly one instruction; every waited event is recorded
//   pass 2  happens-before: program order within a stream and record → wait edges, transitively.
//           A vector clock per instruction (for each stream, the last position on it ordered
//           before or at the instruction) is built in a topological order of those edges.
//   pass 3  byte cells: each address space (region, memory space, data slot) cut at every buffer
//           boundary, so that buffers sharing bytes (a view and its base, a gradient bucket and
//           the gradients it spans, arena buffers placed on reused bytes) share cells; only bytes
//           that some stream other than compute touches can be in a hazard, so only they get cells
//   pass 4  hazards, in issue order: a read of bytes last written on another stream (RAW), and a
//           write over bytes last read (WAR) or written (WAW) on another stream, must be ordered
//           after that access
// Instructions that can never start (a wait cycle) get no clock: the progress rule reports them.

import { isOpKind, updatedInputs } from '../../ir/ops.js';
import { BUFFER_REGIONS, STREAMS } from '../plan/format.js';
import {
  problemAt,
  recordersOf,
  STREAM_COUNT,
  type PlanIndex,
  type ProgramIndex,
} from './plan-index.js';
import type { PlanProblem } from './problem.js';

/** the inputs an instruction updates in place (the op table's `updates`; none for an unknown op) */
const inPlaceOf = (op: string, inputs: number): readonly number[] =>
  isOpKind(op) ? updatedInputs(op, inputs) : [];

const RULE = 'event-order';
const S = STREAM_COUNT;

/** Work arrays sized for the largest program, reused for each (no garbage per program). */
interface Scratch {
  /** [event] the instruction that records it first */
  readonly recordedBy: Int32Array;
  readonly count: Int32Array;
  readonly waited: Uint8Array;
  readonly clock: Int32Array;
  readonly done: Uint8Array;
  readonly pos: Int32Array;
  /** [buffer] the buffer whose bytes it uses (a view → its base) */
  readonly owner: Int32Array;
  /** [buffer] its address (space · 2^42 + offset), and its cells: [cellFirst, cellEnd) */
  readonly cellAt: Float64Array;
  readonly cellBytes: Float64Array;
  /** [buffer] the streams touching its bytes through it or its views; whether it gets cells */
  readonly ownerStreams: Uint8Array;
  readonly relevant: Uint8Array;
  readonly cuts: Float64Array;
  readonly cellFirst: Int32Array;
  readonly cellEnd: Int32Array;
  /** [cell × stream] the last instruction that wrote / read it */
  readonly lastWrite: Int32Array;
  readonly lastRead: Int32Array;
}

function scratchFor(ix: PlanIndex): Scratch {
  let [events, n, buffers] = [0, 0, 0];
  for (const p of ix.programs) {
    events = Math.max(events, p.events);
    n = Math.max(n, p.n);
    buffers = Math.max(buffers, p.file.buffers.length);
  }
  return {
    recordedBy: new Int32Array(events),
    count: new Int32Array(events),
    waited: new Uint8Array(events),
    clock: new Int32Array(n * S),
    done: new Uint8Array(n),
    pos: new Int32Array(n),
    owner: new Int32Array(buffers),
    cellAt: new Float64Array(buffers),
    cellBytes: new Float64Array(buffers),
    ownerStreams: new Uint8Array(buffers),
    relevant: new Uint8Array(buffers),
    cuts: new Float64Array(2 * buffers),
    cellFirst: new Int32Array(buffers),
    cellEnd: new Int32Array(buffers),
    // at most two cuts per buffer, or one cell of its own
    lastWrite: new Int32Array(3 * buffers * S),
    lastRead: new Int32Array(3 * buffers * S),
  };
}

/** pass 1 */
function checkRecords(p: ProgramIndex, sc: Scratch, out: PlanProblem[]): void {
  const count = sc.count.fill(0, 0, p.events);
  for (let i = 0; i < p.n; i++) {
    for (let k = p.recordStart[i]; k < p.recordStart[i + 1]; k++) {
      const e = p.recordEvents[k];
      if (++count[e] > 1) {
        const msg = `records event ${e}, already recorded by instruction ${sc.recordedBy[e]}`;
        out.push(problemAt(RULE, p.ranks, p, i, msg));
      }
    }
  }
  const waited = sc.waited.fill(0, 0, p.events);
  for (let i = 0; i < p.n; i++) {
    for (let k = p.waitStart[i]; k < p.waitStart[i + 1]; k++) {
      const e = p.waitEvents[k];
      waited[e] = 1;
      if (count[e] === 0)
        out.push(
          problemAt(RULE, p.ranks, p, i, `waits for event ${e}, which no instruction records`),
        );
    }
  }
  for (let e = 0; e < p.events; e++)
    if (count[e] === 0 && !waited[e])
      out.push(problemAt(RULE, p.ranks, p, -1, `event ${e} is never recorded`));
}

/** pass 2: clocks [n × S] (position + 1; 0 = nothing on that stream) and which have one */
function vectorClocks(p: ProgramIndex, sc: Scratch): { clock: Int32Array; done: Uint8Array } {
  const clock = sc.clock.fill(0, 0, p.n * S);
  const done = sc.done.fill(0, 0, p.n);
  const head = new Int32Array(S);
  for (let moved = true; moved;) {
    moved = false;
    for (let s = 0; s < S; s++) {
      const list = p.streams[s];
      next: while (head[s] < list.length) {
        const i = list[head[s]];
        for (let k = p.waitStart[i]; k < p.waitStart[i + 1]; k++) {
          const j = sc.recordedBy[p.waitEvents[k]];
          if (j < 0 || !done[j]) break next;
        }
        const at = i * S;
        if (head[s] > 0) clock.copyWithin(at, list[head[s] - 1] * S, list[head[s] - 1] * S + S);
        for (let k = p.waitStart[i]; k < p.waitStart[i + 1]; k++) {
          const from = sc.recordedBy[p.waitEvents[k]] * S;
          for (let t = 0; t < S; t++)
            if (clock[from + t] > clock[at + t]) clock[at + t] = clock[from + t];
        }
        clock[at + s] = head[s] + 1;
        done[i] = 1;
        head[s]++;
        moved = true;
      }
    }
  }
  return { clock, done };
}

/** the first index of sorted `xs` holding a value ≥ v */
function lowerBound(xs: Float64Array, v: number): number {
  let [lo, hi] = [0, xs.length];
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (xs[mid] < v) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

const REGION_INDEX: ReadonlyMap<string, number> = new Map(BUFFER_REGIONS.map((r, k) => [r, k]));
/** cut points of all address spaces in one sorted array: space · 2^42 + byte offset */
const SPACE_STRIDE = 2 ** 42;
const SPACES = 2 ** 10;

/** The byte owner of each buffer (a view resolves to its base) into sc.owner. */
function byteOwners(p: ProgramIndex, sc: Scratch, out: PlanProblem[]): Int32Array {
  const { buffers } = p.file;
  const nbuf = buffers.length;
  const owner = sc.owner.subarray(0, nbuf);
  for (let b = 0; b < nbuf; b++) {
    let r = b;
    for (let hops = 0; buffers[r].viewOf !== undefined; hops++) {
      const v = buffers[r].viewOf!;
      if (!Number.isInteger(v) || v < 0 || v >= nbuf || hops > nbuf) {
        const msg = `buffer ${b} (${buffers[b].name}) is a view of ${String(v)}, not of a buffer`;
        out.push(problemAt('structure', p.ranks, p, -1, msg));
        r = b;
        break;
      }
      r = v;
    }
    owner[b] = r;
  }
  return owner;
}

/**
 * pass 3: fills sc.cellFirst / cellEnd; returns the number of cells. Only bytes that a stream
 * other than compute touches can be in a hazard (a hazard needs two streams), so only buffers
 * overlapping those bytes get cells; the others get none and are not tracked.
 */
function byteCells(p: ProgramIndex, owner: Int32Array, sc: Scratch): number {
  const { buffers } = p.file;
  const nbuf = buffers.length;
  const { cellFirst, cellEnd } = sc;
  // the address of each byte owner (space · 2^42 + offset), and the streams touching its bytes
  const at = sc.cellAt.subarray(0, nbuf).fill(-1);
  const size = sc.cellBytes;
  const streams = sc.ownerStreams.fill(0, 0, nbuf);
  for (let b = 0; b < nbuf; b++) streams[owner[b]] |= p.bufferStreams[b];
  for (let b = 0; b < nbuf; b++) {
    if (owner[b] !== b || streams[b] === 0) continue;
    const { region, offset, bytes, microbatch } = buffers[b];
    const r = REGION_INDEX.get(region);
    if (r === undefined || !Number.isInteger(offset) || !Number.isInteger(bytes)) continue;
    if (bytes <= 0 || offset < 0 || offset + bytes >= SPACE_STRIDE) continue;
    const slot =
      region === 'data' && Number.isInteger(microbatch) ? Math.max(microbatch + 1, 0) : 0;
    const space = (slot * BUFFER_REGIONS.length + r) * 2 + (buffers[b].space === 'host' ? 1 : 0);
    if (space >= SPACES) continue;
    at[b] = space * SPACE_STRIDE + offset;
    size[b] = bytes;
  }
  // the bytes touched off the compute stream, as sorted disjoint intervals [lo[k], hi[k])
  const offCompute = (b: number) => owner[b] === b && (streams[b] & ~1) !== 0;
  const spans: [number, number][] = [];
  for (let b = 0; b < nbuf; b++)
    if (offCompute(b) && at[b] >= 0) spans.push([at[b], at[b] + size[b]]);
  spans.sort((x, y) => x[0] - y[0]);
  const lo: number[] = [];
  const hi: number[] = [];
  for (const [a, z] of spans) {
    if (hi.length && a < hi[hi.length - 1]) hi[hi.length - 1] = Math.max(hi[hi.length - 1], z);
    else {
      lo.push(a);
      hi.push(z);
    }
  }
  const overlapsOffCompute = (a: number, z: number) => {
    let [l, h] = [0, lo.length];
    while (l < h) {
      const mid = (l + h) >>> 1;
      if (hi[mid] <= a) l = mid + 1;
      else h = mid;
    }
    return l < lo.length && lo[l] < z;
  };
  // cells: the relevant buffers' bytes cut at each of their boundaries, sorted per address space
  // (placed by a counting sort on the space; a space laid out in buffer order is sorted already)
  const relevant = sc.relevant.fill(0, 0, nbuf);
  const perSpace = new Int32Array(SPACES + 1);
  for (let b = 0; b < nbuf; b++) {
    if (owner[b] !== b || streams[b] === 0) continue;
    if (at[b] >= 0 ? overlapsOffCompute(at[b], at[b] + size[b]) : offCompute(b)) {
      relevant[b] = 1;
      if (at[b] >= 0) perSpace[Math.floor(at[b] / SPACE_STRIDE) + 1] += 2;
    }
  }
  for (let k = 1; k <= SPACES; k++) perSpace[k] += perSpace[k - 1];
  const ncuts = perSpace[SPACES];
  const cuts = sc.cuts;
  const fill = perSpace.slice(0, SPACES);
  for (let b = 0; b < nbuf; b++) {
    if (!relevant[b] || at[b] < 0) continue;
    const k = Math.floor(at[b] / SPACE_STRIDE);
    cuts[fill[k]++] = at[b];
    cuts[fill[k]++] = at[b] + size[b];
  }
  for (let k = 0; k < SPACES; k++) {
    const seg = cuts.subarray(perSpace[k], perSpace[k + 1]);
    for (let x = 1; x < seg.length; x++)
      if (seg[x] < seg[x - 1]) {
        seg.sort();
        break;
      }
  }
  const sorted = cuts.subarray(0, ncuts);
  let u = 0;
  for (let k = 0; k < ncuts; k++)
    if (u === 0 || sorted[k] !== sorted[u - 1]) sorted[u++] = sorted[k];
  const bounds = sorted.subarray(0, u);
  // a cell is the bytes between consecutive cuts (the span between two spaces is never covered)
  let count = Math.max(u - 1, 0);
  for (let b = 0; b < nbuf; b++) {
    if (owner[b] !== b) continue;
    if (!relevant[b]) {
      cellFirst[b] = cellEnd[b] = 0;
    } else if (at[b] < 0) {
      // no byte range (empty, or unreadable): a cell of its own
      cellFirst[b] = count;
      cellEnd[b] = ++count;
    } else {
      cellFirst[b] = lowerBound(bounds, at[b]);
      cellEnd[b] = lowerBound(bounds, at[b] + size[b]);
    }
  }
  for (let b = 0; b < nbuf; b++) {
    cellFirst[b] = cellFirst[owner[b]];
    cellEnd[b] = cellEnd[owner[b]];
  }
  return count;
}

/** pass 4 */
function checkHazards(p: ProgramIndex, sc: Scratch, out: PlanProblem[]): void {
  const owner = byteOwners(p, sc, out);
  const { clock, done } = vectorClocks(p, sc);
  const pos = sc.pos;
  for (const list of p.streams) list.forEach((i, k) => (pos[i] = k));
  const ordered = (a: number, b: number) => clock[b * S + p.stream[a]] > pos[a];
  const { buffers, instructions } = p.file;
  const nbuf = buffers.length;
  const cells = byteCells(p, owner, sc);
  const { cellFirst, cellEnd } = sc;
  const lastWrite = sc.lastWrite.fill(-1, 0, cells * S);
  const lastRead = sc.lastRead.fill(-1, 0, cells * S);
  const none: readonly number[] = [];
  /** buffers an instruction writes: its outputs and the inputs it updates in place */
  const written = (j: number) => {
    const { op, inputs = none, outputs = none } = instructions[j];
    return [...outputs, ...inPlaceOf(op, inputs.length).map((k) => inputs[k])];
  };
  const reported = new Set<number>();
  /** instruction i's access to buffer x is unordered after instruction j's access to its bytes */
  const report = (i: number, x: number, j: number, hazard: 0 | 1 | 2) => {
    const key = (i * nbuf + owner[x]) * 3 + hazard;
    if (reported.has(key)) return;
    reported.add(key);
    const name = (b: number) =>
      owner[b] === b ? buffers[b].name : `${buffers[b].name} (a view of ${buffers[owner[b]].name})`;
    // the buffer j accessed, when another one shares the bytes
    const touched = (hazard === 1 ? (instructions[j].inputs ?? none) : written(j)).find(
      (b) =>
        Number.isInteger(b) &&
        b >= 0 &&
        b < nbuf &&
        cellFirst[b] < cellEnd[x] &&
        cellFirst[x] < cellEnd[b],
    );
    const as =
      touched !== undefined && owner[touched] !== owner[x] ? ` as ${buffers[touched].name}` : '';
    const by = `instruction ${j} (${instructions[j].op} on ${STREAMS[p.stream[j]]})${as}`;
    const msg = [
      `reads ${name(x)}, written by ${by}, with no event ordering the read after that write`,
      `writes ${name(x)}, read by ${by}, with no event ordering the write after that read`,
      `writes ${name(x)}, written by ${by}, with no event ordering the two writes`,
    ][hazard];
    out.push(problemAt(RULE, p.ranks, p, i, msg));
  };
  const valid = (x: unknown): x is number =>
    Number.isInteger(x) && (x as number) >= 0 && (x as number) < nbuf;
  const checkRead = (i: number, s: number, x: number) => {
    for (let c = cellFirst[x]; c < cellEnd[x]; c++)
      for (let t = 0; t < S; t++) {
        const w = lastWrite[c * S + t];
        if (t !== s && w >= 0 && done[w] && !ordered(w, i)) report(i, x, w, 0);
      }
  };
  const checkWrite = (i: number, s: number, x: number) => {
    for (let c = cellFirst[x]; c < cellEnd[x]; c++)
      for (let t = 0; t < S; t++) {
        if (t === s) continue;
        const r = lastRead[c * S + t];
        if (r >= 0 && done[r] && !ordered(r, i)) report(i, x, r, 1);
        const w = lastWrite[c * S + t];
        if (w >= 0 && done[w] && !ordered(w, i)) report(i, x, w, 2);
      }
  };
  const mark = (last: Int32Array, i: number, s: number, x: number) => {
    for (let c = cellFirst[x]; c < cellEnd[x]; c++) last[c * S + s] = i;
  };
  for (let i = 0; i < p.n; i++) {
    const s = p.stream[i];
    const { op, inputs = none, outputs = none } = instructions[i];
    const inPlace = inPlaceOf(op, inputs.length);
    if (done[i]) {
      for (const x of inputs) if (valid(x)) checkRead(i, s, x);
      for (const x of outputs) if (valid(x)) checkWrite(i, s, x);
      for (const k of inPlace) if (valid(inputs[k])) checkWrite(i, s, inputs[k]);
    }
    for (const x of inputs) if (valid(x)) mark(lastRead, i, s, x);
    for (const x of outputs) if (valid(x)) mark(lastWrite, i, s, x);
    for (const k of inPlace) if (valid(inputs[k])) mark(lastWrite, i, s, inputs[k]);
  }
}

export function checkEvents(ix: PlanIndex): PlanProblem[] {
  const out: PlanProblem[] = [];
  const sc = scratchFor(ix);
  const clean = new Set<number>();
  ix.programs.forEach((p, j) => {
    // a program alike a clean one (plan-index.ts alikeOf: the same instructions, events and
    // buffer bytes but for microbatch labels and names) is clean too, where its data buffers'
    // bytes are apart (a data buffer's address space is its microbatch slot's: pass 3)
    if (p.alikeOf !== j && clean.has(p.alikeOf) && dataApart(p)) return;
    const before = out.length;
    recordersOf(p, sc.recordedBy);
    checkRecords(p, sc, out);
    checkHazards(p, sc, out);
    if (out.length === before) clean.add(j);
  });
  return out;
}

/** whether no two data buffers (views aside) share a byte, whatever their microbatch slots */
function dataApart(p: ProgramIndex): boolean {
  const spans: [number, number][] = [];
  for (const b of p.file.buffers)
    if (b.region === 'data' && b.viewOf === undefined) spans.push([b.offset, b.offset + b.bytes]);
  spans.sort((x, y) => x[0] - y[0]);
  for (let k = 1; k < spans.length; k++) if (spans[k][0] < spans[k - 1][1]) return false;
  return true;
}
