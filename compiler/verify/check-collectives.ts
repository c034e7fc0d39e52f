// Rule collective-match: every member of a group issues the same collectives on it, in the same
// order, with the same kind, root and static sizes (element counts of the input at the symbols'
// bounds; for variable-size ops the row width and the size exchange), with group_size equal to the
// group's size, from one stream, and only on groups it is a member of.
//
// Members that run one program share one sequence, so the sequences are compared once per distinct
// program of a group's members, against the sequence most members issue.

import { STREAMS } from '../plan/format.js';
import { problemAt, ROOTED, type PlanIndex, type ProgramIndex } from './plan-index.js';
import type { PlanProblem } from './problem.js';

const RULE = 'collective-match';

function groupName(ix: PlanIndex, p: ProgramIndex, i: number, c: number): string {
  const g = p.file.instructions[i]?.attrs?.group;
  return typeof g === 'string' ? g : ix.comms[c].names[0];
}

/** Per instruction: a known group, its size, a root inside it, one stream per group. */
function checkAttributes(ix: PlanIndex, p: ProgramIndex, out: PlanProblem[]): void {
  const streamOfComm = new Map<number, number>();
  for (let k = 0; k < p.collInstr.length; k++) {
    const i = p.collInstr[k];
    const { op, attrs } = p.file.instructions[i];
    const c = p.collComm[k];
    if (c < 0) {
      out.push(
        problemAt(RULE, p.ranks, p, i, `group '${String(attrs.group)}' is not in plan.groups`),
      );
      continue;
    }
    const name = groupName(ix, p, i, c);
    const size = ix.comms[c].ranks.length;
    if (p.collGroupSize[k] !== size) {
      const msg = `group_size is ${String(attrs.group_size)}; group ${name} has ${size} ranks`;
      out.push(problemAt(RULE, p.ranks, p, i, msg));
    }
    const root = p.collRoot[k];
    if (ROOTED.has(op) && !(root >= 0 && root < size)) {
      const msg = `root ${String(attrs.root)} is not a group rank of ${name} (${size} ranks)`;
      out.push(problemAt(RULE, p.ranks, p, i, msg));
    }
    const first = streamOfComm.get(c);
    if (first === undefined) streamOfComm.set(c, p.stream[i]);
    else if (first !== p.stream[i] && first >= 0) {
      const msg = `collectives on ${name} are issued on streams ${STREAMS[first]} and ${STREAMS[p.stream[i]]}; one group's collectives must share one stream`;
      out.push(problemAt(RULE, p.ranks, p, i, msg));
      streamOfComm.set(c, -1);
    }
  }
}

/** Every rank that runs the program is a member of each group the program names. */
function checkMembership(ix: PlanIndex, p: ProgramIndex, out: PlanProblem[]): void {
  for (const [c, seq] of p.commSeq) {
    const members = ix.comms[c].groupRank;
    const outside = p.ranks.filter((r) => !members.has(r));
    if (outside.length === 0) continue;
    const name = groupName(ix, p, seq[0], c);
    out.push(
      problemAt(
        RULE,
        outside,
        p,
        seq[0],
        `issues collectives on ${name}, which it is not a member of`,
      ),
    );
  }
}

function hashInts(a: Int32Array): number {
  let h = 0x811c9dc5 ^ a.length;
  for (let k = 0; k < a.length; k++) h = Math.imul(h ^ a[k], 0x01000193);
  return h >>> 0;
}

function firstDifference(a: Int32Array, b: Int32Array): number {
  const n = Math.min(a.length, b.length);
  for (let k = 0; k < n; k++) if (a[k] !== b[k]) return k;
  return a.length === b.length ? -1 : n;
}

interface Issuer {
  readonly p: ProgramIndex;
  /** members of the group that run p */
  readonly ranks: number[];
  /** signatures of p's collectives on the group, in issue order */
  readonly sigs: Int32Array;
}

/** Each group's members issue one sequence: compared per distinct program, against the majority. */
function checkSequences(ix: PlanIndex, out: PlanProblem[]): void {
  const none = new Int32Array(0);
  for (const comm of ix.comms) {
    const byProgram = new Map<number, number[]>();
    for (const m of comm.ranks) {
      const pi = ix.programOf[m];
      if (pi < 0) continue; // a missing program is a structure problem
      let rs = byProgram.get(pi);
      if (!rs) byProgram.set(pi, (rs = []));
      rs.push(m);
    }
    if (byProgram.size < 2) continue;
    const issuers: Issuer[] = [];
    for (const [pi, ranks] of byProgram) {
      const p = ix.programs[pi];
      const seq = p.commSeq.get(comm.id) ?? none;
      issuers.push({
        p,
        ranks,
        sigs: seq.length ? Int32Array.from(seq, (i) => p.collSig[p.slot[i]]) : none,
      });
    }
    // the reference: the sequence the most members issue
    const votes = new Map<number, number>();
    for (const s of issuers) {
      const h = hashInts(s.sigs);
      votes.set(h, (votes.get(h) ?? 0) + s.ranks.length);
    }
    let ref = issuers[0];
    for (const s of issuers)
      if (votes.get(hashInts(s.sigs))! > votes.get(hashInts(ref.sigs))!) ref = s;
    const refRank = ref.ranks[0];
    for (const s of issuers) {
      const k = s === ref ? -1 : firstDifference(s.sigs, ref.sigs);
      if (k < 0) continue;
      const seq = s.p.commSeq.get(comm.id) ?? none;
      const refSeq = ref.p.commSeq.get(comm.id) ?? none;
      const name = seq.length
        ? groupName(ix, s.p, seq[0], comm.id)
        : groupName(ix, ref.p, refSeq[0], comm.id);
      const text = (sigs: Int32Array, at: number) =>
        at < sigs.length
          ? (ix.sigText[sigs[at]] ?? 'an unreadable collective')
          : `nothing (its collectives on ${name} end after ${sigs.length})`;
      const msg =
        `collective ${k} on ${name}: issues ${text(s.sigs, k)} where rank ${refRank} ` +
        `(group rank ${comm.groupRank.get(refRank)}) issues ${text(ref.sigs, k)}`;
      out.push(problemAt(RULE, s.ranks, s.p, k < seq.length ? seq[k] : -1, msg));
    }
  }
}

export function checkCollectives(ix: PlanIndex): PlanProblem[] {
  const out: PlanProblem[] = [];
  for (const p of ix.programs) {
    checkAttributes(ix, p, out);
    checkMembership(ix, p, out);
  }
  checkSequences(ix, out);
  return out;
}
