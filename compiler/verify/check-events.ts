// Rule event-order, per program (every rank that runs a program has its streams and events):
//   pass 1  every event is recorded by exactly one instruction; every waited event is recorded
//   pass 2  happens-before: program order within a stream and record → wait edges, transitively.
//           A vector clock per instruction (for each stream, the last position on it ordered
//           before or at the instruction) is built in a topological order of those edges.
//   pass 3  hazards, in issue order: a read of a buffer last written on another stream (RAW), and
//           a write over a buffer last read (WAR) or written (WAW) on another stream, must be
//           ordered after that access. Accesses are by byte owner (a view is its base buffer).
// Instructions that can never start (a wait cycle) get no clock: the progress rule reports them.

import type { OP_TABLE, OpKind } from '../../ir/ops.js';
import { STREAMS } from '../plan/format.js';
import { problemAt, STREAM_COUNT, type PlanIndex, type ProgramIndex } from './plan-index.js';
import type { PlanProblem } from './problem.js';

type OptimizerOp = {
  [K in OpKind]: (typeof OP_TABLE)[K]['category'] extends 'optimizer' ? K : never;
}[OpKind];

/** inputs an optimizer op updates in place (optimizer ops have no outputs) */
const IN_PLACE_INPUTS = {
  grad_accumulate: [1], // acc += g
  sum_squares: [],
  clip_coef: [],
  adamw: [0, 1, 2, 3], // param, grad (scaled by clip_coef), m, v
} as const satisfies Record<OptimizerOp, readonly number[]>;
const IN_PLACE: ReadonlyMap<string, readonly number[]> = new Map(Object.entries(IN_PLACE_INPUTS));

const RULE = 'event-order';
const S = STREAM_COUNT;

/** Work arrays sized for the largest program, reused for each (no garbage per program). */
interface Scratch {
  readonly count: Int32Array;
  readonly waited: Uint8Array;
  readonly clock: Int32Array;
  readonly done: Uint8Array;
  readonly pos: Int32Array;
  readonly lastWrite: Int32Array;
  readonly lastRead: Int32Array;
}

function scratchFor(ix: PlanIndex): Scratch {
  let [events, n, buffers] = [0, 0, 0];
  for (const p of ix.programs) {
    events = Math.max(events, p.events);
    n = Math.max(n, p.n);
    buffers = Math.max(buffers, p.owner.length);
  }
  return {
    count: new Int32Array(events),
    waited: new Uint8Array(events),
    clock: new Int32Array(n * S),
    done: new Uint8Array(n),
    pos: new Int32Array(n),
    lastWrite: new Int32Array(buffers * S),
    lastRead: new Int32Array(buffers * S),
  };
}

/** pass 1 */
function checkRecords(p: ProgramIndex, sc: Scratch, out: PlanProblem[]): void {
  const count = sc.count.fill(0, 0, p.events);
  for (let i = 0; i < p.n; i++) {
    for (let k = p.recordStart[i]; k < p.recordStart[i + 1]; k++) {
      const e = p.recordEvents[k];
      if (++count[e] > 1) {
        const msg = `records event ${e}, already recorded by instruction ${p.recordedBy[e]}`;
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
          const j = p.recordedBy[p.waitEvents[k]];
          if (j < 0 || !done[j]) break next;
        }
        const at = i * S;
        if (head[s] > 0) clock.copyWithin(at, list[head[s] - 1] * S, list[head[s] - 1] * S + S);
        for (let k = p.waitStart[i]; k < p.waitStart[i + 1]; k++) {
          const from = p.recordedBy[p.waitEvents[k]] * S;
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

/** pass 3 */
function checkHazards(p: ProgramIndex, sc: Scratch, out: PlanProblem[]): void {
  const { clock, done } = vectorClocks(p, sc);
  const pos = sc.pos;
  for (const list of p.streams) list.forEach((i, k) => (pos[i] = k));
  const ordered = (a: number, b: number) => clock[b * S + p.stream[a]] > pos[a];
  const nbuf = p.file.buffers.length;
  const lastWrite = sc.lastWrite.fill(-1, 0, nbuf * S);
  const lastRead = sc.lastRead.fill(-1, 0, nbuf * S);
  const reported = new Set<number>();
  /** instruction i's access to buffer x is unordered after instruction j's */
  const report = (i: number, x: number, j: number, hazard: 0 | 1 | 2) => {
    const key = (i * nbuf + p.owner[x]) * 3 + hazard;
    if (reported.has(key)) return;
    reported.add(key);
    const by = `instruction ${j} (${p.file.instructions[j].op} on ${STREAMS[p.stream[j]]})`;
    const { buffers } = p.file;
    const name =
      p.owner[x] === x
        ? buffers[x].name
        : `${buffers[x].name} (a view of ${buffers[p.owner[x]].name})`;
    const msg = [
      `reads ${name}, written by ${by}, with no event ordering the read after that write`,
      `writes ${name}, read by ${by}, with no event ordering the write after that read`,
      `writes ${name}, written by ${by}, with no event ordering the two writes`,
    ][hazard];
    out.push(problemAt(RULE, p.ranks, p, i, msg));
  };
  const valid = (x: unknown): x is number =>
    Number.isInteger(x) && (x as number) >= 0 && (x as number) < nbuf;
  const checkRead = (i: number, s: number, x: number) => {
    const b = p.owner[x];
    for (let t = 0; t < S; t++) {
      const w = lastWrite[b * S + t];
      if (t !== s && w >= 0 && done[w] && !ordered(w, i)) report(i, x, w, 0);
    }
  };
  const checkWrite = (i: number, s: number, x: number) => {
    const b = p.owner[x];
    for (let t = 0; t < S; t++) {
      if (t === s) continue;
      const r = lastRead[b * S + t];
      if (r >= 0 && done[r] && !ordered(r, i)) report(i, x, r, 1);
      const w = lastWrite[b * S + t];
      if (w >= 0 && done[w] && !ordered(w, i)) report(i, x, w, 2);
    }
  };
  const none: readonly number[] = [];
  for (let i = 0; i < p.n; i++) {
    const s = p.stream[i];
    const { op, inputs = none, outputs = none } = p.file.instructions[i];
    const inPlace = IN_PLACE.get(op) ?? none;
    if (done[i]) {
      for (const x of inputs) if (valid(x)) checkRead(i, s, x);
      for (const x of outputs) if (valid(x)) checkWrite(i, s, x);
      for (const k of inPlace) if (valid(inputs[k])) checkWrite(i, s, inputs[k]);
    }
    for (const x of inputs) if (valid(x)) lastRead[p.owner[x] * S + s] = i;
    for (const x of outputs) if (valid(x)) lastWrite[p.owner[x] * S + s] = i;
    for (const k of inPlace) if (valid(inputs[k])) lastWrite[p.owner[inputs[k]] * S + s] = i;
  }
}

export function checkEvents(ix: PlanIndex): PlanProblem[] {
  const out: PlanProblem[] = [];
  const sc = scratchFor(ix);
  for (const p of ix.programs) {
    checkRecords(p, sc, out);
    checkHazards(p, sc, out);
  }
  return out;
}
