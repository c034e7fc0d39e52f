// Rule collective-match: every member of a group issues the same collectives on it, in the same
// order, with the same kind, root and static sizes (element counts of the input at the symbols'
// bounds; for variable-size ops the row width and the size exchange), with group_size equal to the
// group's size, and only on groups it is a member of. Each (group, stream) is a communicator of
// its own (the runtime makes one context per pair).
//
// Ranks whose group references resolve alike share one sequence, so sequences are compared once
// per distinct sequence among a group's members, against the sequence most members issue.

import {
  problemAt,
  ROOTED,
  type CommSeq,
  type PlanIndex,
  type ProgramIndex,
} from './plan-index.js';
import type { PlanProblem } from './problem.js';

const RULE = 'collective-match';

/** how messages name the group a reference resolves to */
function groupName(ix: PlanIndex, p: ProgramIndex, j: number, comm: number): string {
  const ref = ix.groupRefs[p.refs[j]];
  if (ref.kind < 0 || comm < 0) return ref.text;
  return `${ref.text} (${ix.comms[comm].names[0]})`;
}

/**
 * Per program, group reference and the communicator it resolves to: the reference resolves, the
 * ranks are members, group_size is the group's size, roots are group ranks.
 */
function checkResolution(ix: PlanIndex, out: PlanProblem[]): void {
  const seen = new Map<
    string,
    { p: ProgramIndex; j: number; c: number; ranks: number[]; outside: number[] }
  >();
  for (let r = 0; r < ix.world; r++) {
    const pi = ix.programOf[r];
    if (pi < 0) continue;
    const comms = ix.rankComm[r];
    for (let j = 0; j < comms.length; j++) {
      const c = comms[j];
      const key = `${pi}|${j}|${c}`;
      let e = seen.get(key);
      if (!e) seen.set(key, (e = { p: ix.programs[pi], j, c, ranks: [], outside: [] }));
      e.ranks.push(r);
      if (c >= 0 && !ix.comms[c].groupRank.has(r)) e.outside.push(r);
    }
  }
  const bySize = new Map<string, { p: ProgramIndex; j: number; c: number; ranks: number[] }>();
  for (const { p, j, c, ranks, outside } of seen.values()) {
    const seq = p.refSeq[j];
    const ref = ix.groupRefs[p.refs[j]];
    if (c < 0) {
      const msg =
        ref.kind >= 0
          ? `group kind ${ref.text}: plan.rankGroups gives these ranks no group`
          : `group '${ref.text}' is neither in plan.groups nor a kind of plan.rankGroups`;
      out.push(problemAt(RULE, ranks, p, seq[0], msg));
      continue;
    }
    const name = groupName(ix, p, j, c);
    if (outside.length)
      out.push(
        problemAt(
          RULE,
          outside,
          p,
          seq[0],
          `issues collectives on ${name}, which it is not a member of`,
        ),
      );
    // sizes and roots depend on the group's size only: checked once per (program, ref, size)
    const size = ix.comms[c].ranks.length;
    const key = `${p.id}|${j}|${size}`;
    const b = bySize.get(key);
    if (b) b.ranks.push(...ranks);
    else bySize.set(key, { p, j, c, ranks: [...ranks] });
  }
  for (const { p, j, c, ranks } of bySize.values()) {
    const name = groupName(ix, p, j, c);
    const size = ix.comms[c].ranks.length;
    for (const i of p.refSeq[j]) {
      const { op, attrs } = p.file.instructions[i];
      if (attrs.group_size !== size) {
        const msg = `group_size is ${String(attrs.group_size)}; group ${name} has ${size} ranks`;
        out.push(problemAt(RULE, ranks, p, i, msg));
      }
      const root = attrs.root;
      if (
        ROOTED.has(op) &&
        !(Number.isInteger(root) && (root as number) >= 0 && (root as number) < size)
      ) {
        const msg = `root ${String(attrs.root)} is not a group rank of ${name} (${size} ranks)`;
        out.push(problemAt(RULE, ranks, p, i, msg));
      }
    }
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
  readonly seq: CommSeq | undefined;
  /** members of the group that issue seq */
  readonly ranks: number[];
  /** signatures of seq, in issue order */
  readonly sigs: Int32Array;
}

const NONE = new Int32Array(0);

/** Each group's members issue one sequence: compared per distinct sequence, against the majority. */
function checkSequences(ix: PlanIndex, out: PlanProblem[]): void {
  // a sequence's signatures, once per sequence (one program's sequence serves many groups)
  const sigCache = new Map<CommSeq, Int32Array>();
  const sigsOf = (seq: CommSeq): Int32Array => {
    let sigs = sigCache.get(seq);
    if (!sigs) {
      const { collSig, slot } = seq.program;
      sigs = new Int32Array(seq.instrs.length);
      for (let k = 0; k < sigs.length; k++) sigs[k] = collSig[slot[seq.instrs[k]]];
      sigCache.set(seq, sigs);
    }
    return sigs;
  };
  for (const comm of ix.comms) {
    const bySeq = new Map<CommSeq | undefined, number[]>();
    for (const m of comm.ranks) {
      if (ix.programOf[m] < 0) continue; // a missing program is a structure problem
      const seq = ix.seqOn(m, comm.id);
      let rs = bySeq.get(seq);
      if (!rs) bySeq.set(seq, (rs = []));
      rs.push(m);
    }
    const issuers: Issuer[] = [...bySeq].map(([seq, ranks]) => ({
      seq,
      ranks,
      sigs: seq ? sigsOf(seq) : NONE,
    }));
    const name = (s: Issuer) => {
      const p = s.seq!.program;
      return groupName(ix, p, p.collRef[p.slot[s.seq!.instrs[0]]], comm.id);
    };
    if (issuers.length < 2) continue;
    // the reference: the sequence the most members issue
    const votes = new Map<number, number>();
    for (const s of issuers)
      votes.set(hashInts(s.sigs), (votes.get(hashInts(s.sigs)) ?? 0) + s.ranks.length);
    let ref = issuers[0];
    for (const s of issuers)
      if (votes.get(hashInts(s.sigs))! > votes.get(hashInts(ref.sigs))!) ref = s;
    const refRank = ref.ranks[0];
    for (const s of issuers) {
      const k = s === ref ? -1 : firstDifference(s.sigs, ref.sigs);
      if (k < 0) continue;
      const g = s.seq ? name(s) : name(ref);
      const text = (t: Issuer) =>
        k < t.sigs.length
          ? (ix.sigText[t.sigs[k]] ?? 'an unreadable collective')
          : `nothing (its collectives on ${g} end after ${t.sigs.length})`;
      const msg =
        `collective ${k} on ${g}: issues ${text(s)} where rank ${refRank} ` +
        `(group rank ${comm.groupRank.get(refRank)}) issues ${text(ref)}`;
      const p = s.seq?.program ?? ix.programs[ix.programOf[s.ranks[0]]];
      out.push(
        problemAt(RULE, s.ranks, p, s.seq && k < s.seq.instrs.length ? s.seq.instrs[k] : -1, msg),
      );
    }
  }
}

export function checkCollectives(ix: PlanIndex): PlanProblem[] {
  const out: PlanProblem[] = [];
  checkResolution(ix, out);
  checkSequences(ix, out);
  return out;
}
