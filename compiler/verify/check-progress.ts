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
  const { world, programs, programOf, comms, pairs } = ix;
  const prog = (r: number): ProgramIndex | undefined =>
    programOf[r] >= 0 ? programs[programOf[r]] : undefined;
  // [program][stream] the instructions that take part: not local, or waiting, or recording
  const hot = programs.map((p) =>
    p.streams.map((list) =>
      list.filter(
        (i) =>
          p.kind[i] !== LOCAL ||
          p.waitStart[i] !== p.waitStart[i + 1] ||
          p.recordStart[i] !== p.recordStart[i + 1],
      ),
    ),
  );
  /** [rank × stream] position in the hot list */
  const pc = new Int32Array(world * S);
  const arrived = new Uint8Array(world * S);
  const blockedOn = new Int32Array(world * S).fill(-1);
  const eventBase = new Int32Array(world + 1);
  let total = 0;
  for (let r = 0; r < world; r++) {
    eventBase[r + 1] = eventBase[r] + (prog(r)?.events ?? 0);
    total += prog(r)?.n ?? 0;
  }
  const recorded = new Uint8Array(eventBase[world]);
  // arrivals[c][k]: members that have started their k-th collective on communicator c
  const arrivals = comms.map((c) => {
    let len = 0;
    for (const m of c.ranks) len = Math.max(len, ix.seqOn(m, c.id)?.instrs.length ?? 0);
    return new Int32Array(len);
  });
  const pairState = new Uint8Array(pairs.count); // bit 1: send started, bit 2: recv started
  /** [rank × stream] members of the batch the stream is in that have not completed (0: none) */
  const batchLeft = new Int32Array(world * S);
  /** [rank × stream] hot-list position after that batch */
  const batchEnd = new Int32Array(world * S);
  const batchOf = (p: ProgramIndex, i: number): number => {
    const b = p.file.instructions[i].attrs.batch;
    return typeof b === 'number' ? b : -1;
  };
  // [rank][ref] the communicator a rank's collective runs on, -1 when it resolves to none or to a
  // group the rank is not a member of (it never completes)
  const memberComm = ix.rankComm.map((cs, r) =>
    cs.map((c) => (c >= 0 && comms[c].groupRank.has(r) ? c : -1)),
  );

  const size = world * S;
  const work = new Worklist(size);
  const push = (rs: number) => work.push(rs);

  const recordEvents = (r: number, p: ProgramIndex, i: number) => {
    const base = eventBase[r];
    for (let k = p.recordStart[i]; k < p.recordStart[i + 1]; k++) {
      const e = p.recordEvents[k];
      recorded[base + e] = 1;
      for (let t = r * S; t < r * S + S; t++) {
        if (blockedOn[t] === e) {
          blockedOn[t] = -1;
          push(t);
        }
      }
    }
  };
  /** completes the started collective or send/recv i of rank r */
  const finish = (r: number, i: number) => {
    const p = prog(r)!;
    const rs = r * S + p.stream[i];
    recordEvents(r, p, i);
    if (batchLeft[rs] > 0) {
      if (--batchLeft[rs] > 0) return;
      pc[rs] = batchEnd[rs];
    } else pc[rs]++;
    arrived[rs] = 0;
    push(rs);
  };
  /** marks p2p instruction i of rank r started; completes the pair when both sides are */
  const startP2p = (r: number, p: ProgramIndex, i: number) => {
    const q = pairs.pairOf[r][p.slot[i]];
    if (q >= 0 && (pairState[q] |= p.kind[i] === SEND ? 1 : 2) === 3) {
      finish(pairs.src[q], pairs.sendInstr[q]);
      finish(pairs.dst[q], pairs.recvInstr[q]);
    }
  };
  const advance = (rs: number) => {
    if (arrived[rs]) return;
    const r = (rs / S) | 0;
    if (programOf[r] < 0) return;
    const p = programs[programOf[r]];
    const list = hot[programOf[r]][rs - r * S];
    const base = eventBase[r];
    for (let at = pc[rs]; at < list.length; at++) {
      const i = list[at];
      for (let k = p.waitStart[i]; k < p.waitStart[i + 1]; k++) {
        const e = p.waitEvents[k];
        if (!recorded[base + e]) {
          blockedOn[rs] = e;
          pc[rs] = at;
          return;
        }
      }
      const kind = p.kind[i];
      if (kind === LOCAL) {
        if (p.recordStart[i] !== p.recordStart[i + 1]) recordEvents(r, p, i);
        continue;
      }
      pc[rs] = at;
      arrived[rs] = 1;
      if (kind === GROUP) {
        const j = p.collRef[p.slot[i]];
        const c = memberComm[r][j];
        if (c < 0) return; // never completes
        const k = ix.rankSeq[r][j]!.ord[p.slot[i]];
        if (++arrivals[c][k] === comms[c].ranks.length)
          for (const m of comms[c].ranks) finish(m, ix.seqOn(m, c)!.instrs[k]);
      } else {
        const batch = batchOf(p, i);
        if (batch < 0) {
          startP2p(r, p, i);
          return;
        }
        // a batch: every member starts now
        let end = at + 1;
        while (
          end < list.length &&
          p.kind[list[end]] !== LOCAL &&
          p.kind[list[end]] !== GROUP &&
          batchOf(p, list[end]) === batch
        )
          end++;
        batchLeft[rs] = end - at;
        batchEnd[rs] = end;
        for (let k = at; k < end; k++) startP2p(r, p, list[k]);
      }
      return;
    }
    pc[rs] = list.length;
  };

  for (let rs = 0; rs < size; rs++) push(rs);
  work.drain(advance);
  /** the instruction rank r's stream s is blocked at, -1 when the stream finished */
  const headOf = (r: number, s: number): number => {
    const list = programOf[r] >= 0 ? hot[programOf[r]][s] : undefined;
    return list && pc[r * S + s] < list.length ? list[pc[r * S + s]] : -1;
  };
  // completed: every instruction of a finished stream, those before the head of a blocked one
  // (stream lists are ascending: the head's position is found by bisection)
  let completed = 0;
  for (let r = 0; r < world; r++) {
    const p = prog(r);
    for (let s = 0; p && s < S; s++) {
      const list = p.streams[s];
      const i = headOf(r, s);
      let [lo, hi] = i < 0 ? [list.length, list.length] : [0, list.length];
      while (lo < hi) {
        const mid = (lo + hi) >>> 1;
        if (list[mid] < i) lo = mid + 1;
        else hi = mid;
      }
      completed += lo;
    }
  }
  if (completed === total) return { problems: [], completed, total };

  // ---- the deadlock: why each unfinished stream is blocked ----------------------------------
  const where = (r: number, s: number) => {
    const i = headOf(r, s);
    if (i < 0) return `rank ${r} has finished its ${STREAMS[s]} stream`;
    const p = prog(r)!;
    return `rank ${r} is blocked at ${STREAMS[s]} instruction ${i} (${p.file.instructions[i].op})`;
  };
  const started = (r: number, i: number) => {
    const p = prog(r);
    if (!p) return false;
    const s = p.stream[i];
    const rs = r * S + s;
    if (arrived[rs] !== 1) return false;
    if (batchLeft[rs] === 0) return headOf(r, s) === i;
    const list = hot[programOf[r]][s];
    for (let k = pc[rs]; k < batchEnd[rs]; k++) if (list[k] === i) return true;
    return false;
  };
  const whyGroup = (r: number, p: ProgramIndex, i: number): string => {
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
      } else if (!started(m, seq.instrs[k])) {
        count++;
        if (missing.length < 3) missing.push(where(m, seq.program.stream[seq.instrs[k]]));
      }
    }
    const of = comms[c].ranks.length;
    return `collective ${k} on ${name} waits for ${count} of its ${of} ranks: ${missing.join('; ')}${count > missing.length ? '; …' : ''}`;
  };
  const whyP2p = (r: number, p: ProgramIndex, i: number): string => {
    const q = pairs.pairOf[r][p.slot[i]];
    const { peer, tag } = p.file.instructions[i].attrs;
    if (q < 0) return `its peer ${String(peer)} is not a rank`;
    const isSend = p.kind[i] === SEND;
    const other = isSend ? pairs.dst[q] : pairs.src[q];
    const j = isSend ? pairs.recvInstr[q] : pairs.sendInstr[q];
    const want = isSend ? 'recv' : 'send';
    if (j < 0) return `rank ${other} has no matching ${want} (tag ${String(tag)})`;
    const op = prog(other)!;
    return `waits for rank ${other} to reach its ${want} (instruction ${j}, tag ${String(tag)}); ${where(other, op.stream[j])}`;
  };
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
  for (let r = 0; r < world; r++) {
    const p = prog(r);
    if (!p) continue;
    for (let s = 0; s < S; s++) {
      const i = headOf(r, s);
      if (i < 0) continue;
      const rs = r * S + s;
      const key = `${p.id}\u0000${i}`;
      const seen = merged.get(key);
      if (seen) {
        seen.ranks.push(r);
        continue;
      }
      let message: string;
      if (!arrived[rs]) {
        const e = blockedOn[rs];
        const j = e >= 0 ? recorders(p)[e] : -1;
        message =
          j < 0
            ? `waits for event ${e}, which no instruction records`
            : `waits for event ${e}, recorded by instruction ${j} (${p.file.instructions[j].op} on ${STREAMS[p.stream[j]]}), which never completes`;
      } else if (p.kind[i] === GROUP) message = whyGroup(r, p, i);
      else message = whyP2p(r, p, i);
      merged.set(key, { p, i, ranks: [r], message: `deadlock (rank ${r}): ${message}` });
    }
  }
  const problems = [...merged.values()].map(({ p, i, ranks, message }) =>
    problemAt(
      RULE,
      ranks,
      p,
      i,
      ranks.length > 1 ? `${message} (also ${formatRanks(ranks.slice(1))})` : message,
    ),
  );
  return { problems, completed, total };
}

export function checkProgress(ix: PlanIndex): PlanProblem[] {
  return simulateStep(ix).problems;
}
