// Rule progress: a symbolic execution of all ranks together proves the step finishes.
//   - each rank's streams run in issue order; an instruction starts once the events it waits for
//     are recorded on its rank, and records its events when it completes
//   - a local instruction completes when it starts
//   - a group collective completes once every member of its group has started the collective
//     with the same index in its sequence on that group
//   - send and recv meet: each completes once both have started; consecutive sends and recvs of
//     one stream with the same `batch` attribute start together (a batched send/recv), and the
//     stream moves past them once all have completed
// Only the instructions that can block or unblock something are stepped through (collectives,
// send/recv, and those that wait for or record events); the local instructions between them
// complete with them. Event driven: a worklist of (rank, stream) that may move. A stream blocked
// on an event is woken by the record; one waiting in a collective or a send/recv by its
// completion. Whatever is left unfinished is deadlocked: one problem per blocked instruction of a
// program, its ranks merged.

import { STREAMS } from '../plan/format.js';
import {
  GROUP,
  LOCAL,
  problemAt,
  recordersOf,
  SEND,
  STREAM_COUNT,
  type PlanIndex,
  type ProgramIndex,
} from './plan-index.js';
import { Worklist } from './worklist.js';
import { formatRanks, type PlanProblem } from './problem.js';

const RULE = 'progress';
const S = STREAM_COUNT;

export interface StepSimulation {
  readonly problems: PlanProblem[];
  /** instructions completed, summed over ranks */
  readonly completed: number;
  /** instructions of all ranks together */
  readonly total: number;
}

export function simulateStep(ix: PlanIndex): StepSimulation {
  const run = new SymbolicRun(ix);
  run.runAll();
  const completed = run.completed();
  if (completed === run.total) return { problems: [], completed, total: run.total };
  return { problems: deadlockProblems(run), completed, total: run.total };
}

/**
 * The state of the symbolic run: where each rank's streams are, which events are recorded, how
 * many members have started each collective, which sides of each send/recv pair have started.
 */
class SymbolicRun {
  /** [program][stream] the instructions that take part: not local, or waiting, or recording */
  readonly hot: readonly (readonly Int32Array[])[];
  /** [rank × stream] position in the hot list */
  readonly pc: Int32Array;
  /** [rank × stream] 1 while it has started a collective or send/recv (or batch) not completed */
  readonly arrived: Uint8Array;
  /** [rank × stream] the event it is blocked on, -1 when none */
  readonly blockedOn: Int32Array;
  /** [rank × stream] members of the batch the stream is in that have not completed (0: none) */
  readonly batchLeft: Int32Array;
  /** [rank × stream] hot-list position after that batch */
  readonly batchEnd: Int32Array;
  /** instructions of all ranks together */
  readonly total: number;
  /** [rank] its first event's index in `recorded` */
  private readonly eventBase: Int32Array;
  private readonly recorded: Uint8Array;
  /** arrivals[c][k]: members that have started their k-th collective on communicator c */
  private readonly arrivals: readonly Int32Array[];
  /** [pair] bit 1: send started, bit 2: recv started */
  private readonly pairState: Uint8Array;
  /** [rank][ref] the communicator a rank's collective runs on, -1 when it resolves to none or to a
   * group the rank is not a member of (it never completes) */
  private readonly memberComm: readonly Int32Array[];
  private readonly work: Worklist;

  constructor(readonly ix: PlanIndex) {
    const { world, programs, comms, pairs } = ix;
    this.hot = programs.map((p) =>
      p.streams.map((list) =>
        list.filter(
          (i) =>
            p.kind[i] !== LOCAL ||
            p.waitStart[i] !== p.waitStart[i + 1] ||
            p.recordStart[i] !== p.recordStart[i + 1],
        ),
      ),
    );
    this.pc = new Int32Array(world * S);
    this.arrived = new Uint8Array(world * S);
    this.blockedOn = new Int32Array(world * S).fill(-1);
    const eventBase = new Int32Array(world + 1);
    let total = 0;
    for (let r = 0; r < world; r++) {
      eventBase[r + 1] = eventBase[r] + (this.prog(r)?.events ?? 0);
      total += this.prog(r)?.n ?? 0;
    }
    this.eventBase = eventBase;
    this.total = total;
    this.recorded = new Uint8Array(eventBase[world]);
    this.arrivals = comms.map((c) => {
      let len = 0;
      for (const m of c.ranks) len = Math.max(len, ix.seqOn(m, c.id)?.instrs.length ?? 0);
      return new Int32Array(len);
    });
    this.pairState = new Uint8Array(pairs.count);
    this.batchLeft = new Int32Array(world * S);
    this.batchEnd = new Int32Array(world * S);
    this.memberComm = ix.rankComm.map((cs, r) =>
      cs.map((c) => (c >= 0 && comms[c].groupRank.has(r) ? c : -1)),
    );
    this.work = new Worklist(world * S);
  }

  /** rank r's program, undefined for a rank without one */
  prog(r: number): ProgramIndex | undefined {
    const { programs, programOf } = this.ix;
    return programOf[r] >= 0 ? programs[programOf[r]] : undefined;
  }

  /** every stream moved until none can */
  runAll(): void {
    const size = this.ix.world * S;
    for (let rs = 0; rs < size; rs++) this.work.push(rs);
    this.work.drain((rs) => this.advance(rs));
  }

  /** the instruction rank r's stream s is blocked at, -1 when the stream finished */
  headOf(r: number, s: number): number {
    const at = this.ix.programOf[r];
    const list = at >= 0 ? this.hot[at][s] : undefined;
    return list && this.pc[r * S + s] < list.length ? list[this.pc[r * S + s]] : -1;
  }

  /**
   * Instructions completed: every instruction of a finished stream, those before the head of a
   * blocked one (stream lists are ascending: the head's position is found by bisection).
   */
  completed(): number {
    let completed = 0;
    for (let r = 0; r < this.ix.world; r++) {
      const p = this.prog(r);
      for (let s = 0; p && s < S; s++) {
        const list = p.streams[s];
        const i = this.headOf(r, s);
        let [lo, hi] = i < 0 ? [list.length, list.length] : [0, list.length];
        while (lo < hi) {
          const mid = (lo + hi) >>> 1;
          if (list[mid] < i) lo = mid + 1;
          else hi = mid;
        }
        completed += lo;
      }
    }
    return completed;
  }

  private recordEvents(r: number, p: ProgramIndex, i: number): void {
    const { recorded, blockedOn, work } = this;
    const base = this.eventBase[r];
    for (let k = p.recordStart[i]; k < p.recordStart[i + 1]; k++) {
      const e = p.recordEvents[k];
      recorded[base + e] = 1;
      for (let t = r * S; t < r * S + S; t++) {
        if (blockedOn[t] === e) {
          blockedOn[t] = -1;
          work.push(t);
        }
      }
    }
  }

  /** completes the started collective or send/recv i of rank r */
  private finish(r: number, i: number): void {
    const p = this.prog(r)!;
    const rs = r * S + p.stream[i];
    this.recordEvents(r, p, i);
    if (this.batchLeft[rs] > 0) {
      if (--this.batchLeft[rs] > 0) return;
      this.pc[rs] = this.batchEnd[rs];
    } else this.pc[rs]++;
    this.arrived[rs] = 0;
    this.work.push(rs);
  }

  /** marks p2p instruction i of rank r started; completes the pair when both sides are */
  private startP2p(r: number, p: ProgramIndex, i: number): void {
    const { pairs } = this.ix;
    const q = pairs.pairOf[r][p.slot[i]];
    if (q >= 0 && (this.pairState[q] |= p.kind[i] === SEND ? 1 : 2) === 3) {
      this.finish(pairs.src[q], pairs.sendInstr[q]);
      this.finish(pairs.dst[q], pairs.recvInstr[q]);
    }
  }

  /** moves stream rs past what completes at once, up to a wait, a collective or a send/recv */
  private advance(rs: number): void {
    if (this.arrived[rs]) return;
    const { programs, programOf } = this.ix;
    const r = (rs / S) | 0;
    if (programOf[r] < 0) return;
    const { pc, recorded } = this;
    const p = programs[programOf[r]];
    const list = this.hot[programOf[r]][rs - r * S];
    const base = this.eventBase[r];
    for (let at = pc[rs]; at < list.length; at++) {
      const i = list[at];
      for (let k = p.waitStart[i]; k < p.waitStart[i + 1]; k++) {
        const e = p.waitEvents[k];
        if (!recorded[base + e]) {
          this.blockedOn[rs] = e;
          pc[rs] = at;
          return;
        }
      }
      const kind = p.kind[i];
      if (kind === LOCAL) {
        if (p.recordStart[i] !== p.recordStart[i + 1]) this.recordEvents(r, p, i);
        continue;
      }
      pc[rs] = at;
      this.arrived[rs] = 1;
      if (kind === GROUP) {
        this.startCollective(r, p, i);
        return;
      }
      const batch = batchOf(p, i);
      if (batch < 0) this.startP2p(r, p, i);
      else this.startBatch(rs, r, p, list, at, batch);
      return;
    }
    pc[rs] = list.length;
  }

  /** rank r starts collective i; the last member to start completes it on every member */
  private startCollective(r: number, p: ProgramIndex, i: number): void {
    const { ix } = this;
    const j = p.collRef[p.slot[i]];
    const c = this.memberComm[r][j];
    if (c < 0) return; // never completes
    const k = ix.rankSeq[r][j]!.ord[p.slot[i]];
    if (++this.arrivals[c][k] === ix.comms[c].ranks.length)
      for (const m of ix.comms[c].ranks) this.finish(m, ix.seqOn(m, c)!.instrs[k]);
  }

  /** batch `batch` of stream rs's sends and recvs, from hot-list position `at`: every member
   * starts now */
  private startBatch(
    rs: number,
    r: number,
    p: ProgramIndex,
    list: Int32Array,
    at: number,
    batch: number,
  ): void {
    let end = at + 1;
    while (
      end < list.length &&
      p.kind[list[end]] !== LOCAL &&
      p.kind[list[end]] !== GROUP &&
      batchOf(p, list[end]) === batch
    )
      end++;
    this.batchLeft[rs] = end - at;
    this.batchEnd[rs] = end;
    for (let k = at; k < end; k++) this.startP2p(r, p, list[k]);
  }
}

/** a send's or recv's `batch` attribute, -1 when it has none */
function batchOf(p: ProgramIndex, i: number): number {
  const b = p.file.instructions[i].attrs.batch;
  return typeof b === 'number' ? b : -1;
}

// ---- the deadlock: why each unfinished stream is blocked ------------------------------------

/** One problem per blocked instruction of a program, the ranks blocked at it merged. */
function deadlockProblems(run: SymbolicRun): PlanProblem[] {
  const { ix } = run;
  const recorderCache = new Map<ProgramIndex, Int32Array>();
  const recorders = (p: ProgramIndex) => {
    let by = recorderCache.get(p);
    if (!by) recorderCache.set(p, (by = recordersOf(p)));
    return by;
  };
  const merged = new Map<
    string,
    { p: ProgramIndex; i: number; ranks: number[]; message: string }
  >();
  for (let r = 0; r < ix.world; r++) {
    const p = run.prog(r);
    if (!p) continue;
    for (let s = 0; s < S; s++) {
      const i = run.headOf(r, s);
      if (i < 0) continue;
      const rs = r * S + s;
      const key = `${p.id}\u0000${i}`;
      const seen = merged.get(key);
      if (seen) {
        seen.ranks.push(r);
        continue;
      }
      let message: string;
      if (!run.arrived[rs]) {
        const e = run.blockedOn[rs];
        const j = e >= 0 ? recorders(p)[e] : -1;
        message =
          j < 0
            ? `waits for event ${e}, which no instruction records`
            : `waits for event ${e}, recorded by instruction ${j} (${p.file.instructions[j].op} on ${STREAMS[p.stream[j]]}), which never completes`;
      } else if (p.kind[i] === GROUP) message = whyGroup(run, r, p, i);
      else message = whyP2p(run, r, p, i);
      merged.set(key, { p, i, ranks: [r], message: `deadlock (rank ${r}): ${message}` });
    }
  }
  return [...merged.values()].map(({ p, i, ranks, message }) =>
    problemAt(
      RULE,
      ranks,
      p,
      i,
      ranks.length > 1 ? `${message} (also ${formatRanks(ranks.slice(1))})` : message,
    ),
  );
}

/** where rank r's stream s stopped */
function where(run: SymbolicRun, r: number, s: number): string {
  const i = run.headOf(r, s);
  if (i < 0) return `rank ${r} has finished its ${STREAMS[s]} stream`;
  const p = run.prog(r)!;
  return `rank ${r} is blocked at ${STREAMS[s]} instruction ${i} (${p.file.instructions[i].op})`;
}

/** whether rank r has started instruction i (and waits in it) */
function started(run: SymbolicRun, r: number, i: number): boolean {
  const p = run.prog(r);
  if (!p) return false;
  const s = p.stream[i];
  const rs = r * S + s;
  if (run.arrived[rs] !== 1) return false;
  if (run.batchLeft[rs] === 0) return run.headOf(r, s) === i;
  const list = run.hot[run.ix.programOf[r]][s];
  for (let k = run.pc[rs]; k < run.batchEnd[rs]; k++) if (list[k] === i) return true;
  return false;
}

/** why collective i of rank r does not complete */
function whyGroup(run: SymbolicRun, r: number, p: ProgramIndex, i: number): string {
  const { ix } = run;
  const { comms } = ix;
  const j = p.collRef[p.slot[i]];
  const c = ix.rankComm[r][j];
  const ref = ix.groupRefs[p.refs[j]];
  if (c < 0) return `its group ${ref.text} does not resolve to a group of plan.groups`;
  const name = ref.kind < 0 ? ref.text : `${ref.text} (${comms[c].names[0]})`;
  if (!comms[c].groupRank.has(r)) return `rank ${r} is not a member of ${name}`;
  const k = ix.rankSeq[r][j]!.ord[p.slot[i]];
  const missing: string[] = [];
  let count = 0;
  for (const m of comms[c].ranks) {
    const seq = ix.seqOn(m, c);
    if (!seq || seq.instrs.length <= k) {
      count++;
      if (missing.length < 3)
        missing.push(`rank ${m} issues only ${seq?.instrs.length ?? 0} collectives on it`);
    } else if (!started(run, m, seq.instrs[k])) {
      count++;
      if (missing.length < 3) missing.push(where(run, m, seq.program.stream[seq.instrs[k]]));
    }
  }
  const of = comms[c].ranks.length;
  return `collective ${k} on ${name} waits for ${count} of its ${of} ranks: ${missing.join('; ')}${count > missing.length ? '; …' : ''}`;
}

/** why send or recv i of rank r does not complete */
function whyP2p(run: SymbolicRun, r: number, p: ProgramIndex, i: number): string {
  const { pairs } = run.ix;
  const q = pairs.pairOf[r][p.slot[i]];
  const { peer, tag } = p.file.instructions[i].attrs;
  if (q < 0) return `its peer ${String(peer)} is not a rank`;
  const isSend = p.kind[i] === SEND;
  const other = isSend ? pairs.dst[q] : pairs.src[q];
  const j = isSend ? pairs.recvInstr[q] : pairs.sendInstr[q];
  const want = isSend ? 'recv' : 'send';
  if (j < 0) return `rank ${other} has no matching ${want} (tag ${String(tag)})`;
  const op = run.prog(other)!;
  return `waits for rank ${other} to reach its ${want} (instruction ${j}, tag ${String(tag)}); ${where(run, other, op.stream[j])}`;
}

export function checkProgress(ix: PlanIndex): PlanProblem[] {
  return simulateStep(ix).problems;
}
