// Which ranks a replay must step through (compiler/sim/simulate.ts). Each rank has a stand-in, a
// rank replayed for it, and the replay counts a collective's members and a transfer's other side
// as their stand-ins. That is exact where the plan is symmetric: the ranks a stand-in stands for
// would run its timeline instruction for instruction.
//
//   replicas   the ranks of one program (data-parallel replicas, or a 1024-rank plan's 8 stages)
//              stand in by the program's first rank
//   alike      programs that differ only in microbatch labels (level 3's TP ranks encode different
//              slots: compiler/emit/alike-programs.ts) are priced alike when their instructions,
//              buffers' shapes and groups' shapes are the same; such a class stands in by its first
//              program's first rank, refined until every member meets what its stand-in meets
//              (stage 1's TP rank 0 receives from the root, its siblings from the root's siblings)
//
// Symmetric means that every collective and send/recv, seen from the first rank of any program,
// meets the same (stand-in, instruction) pairs as seen from its stand-in and from each of its
// members' stand-ins. A plan where alike classes fail that check replays one rank per program; one
// where that fails too replays every rank. test/sim/simulate.test.ts checks the times equal those
// of the full replay on every layout of the equivalence matrix and the article's level-3 line.

import {
  GROUP,
  LOCAL,
  SEND,
  sameValue,
  type PlanIndex,
  type ProgramIndex,
} from '../verify/plan-index.js';

/**
 * Who meets whom in a replay where each rank stands for `standIn[r]`: a collective's members and a
 * transfer's other side, each as (the stand-in, its instruction) encoded as `rank * stride +
 * instruction` (stride: the longest program), so that a meeting is named by its smallest member.
 * A program's first rank keeps its collectives' members: the symmetry check and every replay of
 * the plan ask for them.
 */
export class Meetings {
  readonly stride: number;
  /** [program] per collective instruction: the members its first rank meets */
  private readonly kept: Map<number, number[]>[];

  constructor(
    private readonly ix: PlanIndex,
    readonly standIn: Int32Array,
  ) {
    this.stride = ix.programs.reduce((m, p) => Math.max(m, p.n), 1);
    this.kept = ix.programs.map(() => new Map());
  }

  /** collective i of rank r's program p: its members, distinct, smallest first */
  members(r: number, p: ProgramIndex, i: number): number[] {
    const kept = r === p.ranks[0] ? this.kept[this.ix.programOf[r]] : undefined;
    let out = kept?.get(i);
    if (out === undefined) {
      out = this.gather(r, p, i);
      kept?.set(i, out);
    }
    return out;
  }

  private gather(r: number, p: ProgramIndex, i: number): number[] {
    const { ix, standIn, stride } = this;
    const j = p.collRef[p.slot[i]];
    const c = ix.rankComm[r][j];
    const k = ix.rankSeq[r][j]!.ord[p.slot[i]];
    // distinct, ascending: each code inserted in place (a group has a few members; a Set, a
    // spread and Array sort, which copies to a work array, for each of a plan's collectives were
    // most of what the replay's setup allocated)
    const ranks = ix.comms[c].ranks;
    const out: number[] = [];
    for (let q = 0; q < ranks.length; q++) {
      const m = ranks[q];
      const code = standIn[m] * stride + ix.seqOn(m, c)!.instrs[k];
      let at = out.length;
      while (at > 0 && out[at - 1] > code) at--;
      if (at > 0 && out[at - 1] === code) continue;
      out.push(code);
      for (let j = out.length - 1; j > at; j--) out[j] = out[j - 1];
      out[at] = code;
    }
    return out;
  }

  /** send or recv i of rank r's program p: its other side */
  peer(r: number, p: ProgramIndex, i: number): number {
    const { pairs } = this.ix;
    const q = pairs.pairOf[r][p.slot[i]];
    return p.kind[i] === SEND
      ? this.standIn[pairs.dst[q]] * this.stride + pairs.recvInstr[q]
      : this.standIn[pairs.src[q]] * this.stride + pairs.sendInstr[q];
  }
}

/**
 * The meetings with the fewest stand-ins the plan's symmetry allows (see the header): alike
 * programs' classes, else one rank per program; undefined where neither is symmetric (every rank
 * is replayed). `alike: false` skips the classes (costs given per program may differ between
 * alike programs).
 */
export function symmetricMeetings(ix: PlanIndex, alike = true): Meetings | undefined {
  const own = Int32Array.from(ix.programs, (_, j) => j);
  if (alike) {
    const classes = refinedClasses(ix, alikeClasses(ix));
    if (classes && checked(ix, classes)) return classes;
  }
  if (ix.programs.every((p) => p.ranks.length === 1)) return undefined; // nothing to gain
  const meet = new Meetings(ix, standInsOf(ix, own));
  return checked(ix, meet) ? meet : undefined;
}

/** each rank's stand-in: the first rank of its program's class representative */
function standInsOf(ix: PlanIndex, rep: Int32Array): Int32Array {
  return Int32Array.from(
    { length: ix.world },
    (_, r) => ix.programs[rep[ix.programOf[r]]].ranks[0],
  );
}

/**
 * Whether the plan is symmetric under the stand-ins of `meet`, seen from each replayed program's
 * first rank (a program replayed for another meets what that one meets: refinedClasses).
 */
function checked(ix: PlanIndex, meet: Meetings): boolean {
  const { stride, standIn } = meet;
  const programOfRank = (r: number) => ix.programs[ix.programOf[r]];
  for (const p of ix.programs) {
    const r = p.ranks[0];
    if (standIn[r] !== r) continue;
    for (let i = 0; i < p.n; i++) {
      if (p.kind[i] === GROUP) {
        // seen from each member's stand-in (this rank's own among them), the same members
        const members = meet.members(r, p, i);
        for (const code of members) {
          const m = Math.floor(code / stride);
          const again = meet.members(m, programOfRank(m), code - m * stride);
          if (again.length !== members.length || again.some((x, k) => x !== members[k]))
            return false;
        }
      } else if (p.kind[i] !== LOCAL) {
        // the other side's stand-in sees this rank as its other side
        const peer = meet.peer(r, p, i);
        const m = Math.floor(peer / stride);
        if (meet.peer(m, programOfRank(m), peer - m * stride) !== r * stride + i) return false;
      }
    }
  }
  return true;
}

/**
 * [program] the first program alike it (see the header): the same instructions but for their
 * microbatch labels, the same buffer shapes and element types, on first ranks whose groups have
 * the same size and node spread, with the same number of ranks on each node.
 */
function alikeClasses(ix: PlanIndex): Int32Array {
  const rep = Int32Array.from(ix.programs, (_, j) => j);
  const perNode = ix.plan.topology.nprocPerNode;
  const nodeCounts = ix.programs.map((p) => {
    const c = new Map<number, number>();
    for (const r of p.ranks) {
      const node = Math.floor(r / perNode);
      c.set(node, (c.get(node) ?? 0) + 1);
    }
    return [...c].sort((a, b) => a[0] - b[0]).join(';');
  });
  const layouts = ix.programs.map((p) => groupLayout(ix, p));
  for (let j = 1; j < ix.programs.length; j++)
    for (let q = 0; q < j; q++) {
      if (rep[q] !== q || nodeCounts[q] !== nodeCounts[j]) continue;
      if (ix.programs[j].alikeOf === ix.programs[q].alikeOf && layouts[q] === layouts[j]) {
        rep[j] = q;
        break;
      }
    }
  return rep;
}

/**
 * How the groups of program p's first rank lie, in one text: each group reference's size, nodes
 * and members on the rank's node, and each send/recv's peer on another node or not. Programs whose
 * texts are equal are priced alike (simulate.ts defaultCosts' group shapes).
 */
export function groupLayout(ix: PlanIndex, p: ProgramIndex): string {
  const rank = p.ranks[0];
  const perNode = ix.plan.topology.nprocPerNode;
  const node = (r: number) => Math.floor(r / perNode);
  const parts: string[] = [];
  for (let k = 0; k < p.refs.length; k++) {
    const c = ix.rankComm[rank][k];
    if (c < 0) {
      parts.push('-');
      continue;
    }
    const ranks = ix.comms[c].ranks;
    const nodes = new Set<number>();
    let local = 0;
    for (const r of ranks) {
      nodes.add(node(r));
      if (node(r) === node(rank)) local++;
    }
    parts.push(`${ranks.length}/${nodes.size}/${local}`);
  }
  for (let s = 0; s < p.p2pInstr.length; s++) {
    const peer = ix.peerOf(rank, p, s);
    parts.push(peer >= 0 && node(peer) !== node(rank) ? 'x' : 'o');
  }
  return parts.join(',');
}

/**
 * The classes split until each program meets what its representative meets (as stand-ins): the
 * programs of a class that do not are a class of their own, under the first of them. The meetings
 * of the classes found, or undefined where every class is one program.
 */
function refinedClasses(ix: PlanIndex, start: Int32Array): Meetings | undefined {
  let rep = start;
  for (let round = 0; round < ix.programs.length; round++) {
    if (rep.every((q, j) => q === j)) return undefined;
    const meet = new Meetings(ix, standInsOf(ix, rep));
    const next = Int32Array.from(rep);
    const moved = new Map<number, number>(); // old representative → the new one of its leavers
    for (let j = 0; j < ix.programs.length; j++) {
      const q = rep[j];
      if (q === j || meetsAlike(meet, ix.programs[q], ix.programs[j])) continue;
      const to = moved.get(q);
      if (to === undefined) moved.set(q, (next[j] = j));
      else next[j] = to;
    }
    if (!moved.size) return meet;
    rep = next;
  }
  return undefined;
}

/** whether the first ranks of p and o meet the same stand-ins at every instruction */
function meetsAlike(meet: Meetings, p: ProgramIndex, o: ProgramIndex): boolean {
  const [a, b] = [p.ranks[0], o.ranks[0]];
  for (let i = 0; i < p.n; i++) {
    if (p.kind[i] === LOCAL) continue;
    if (p.kind[i] === GROUP) {
      if (!sameValue(meet.members(a, p, i), meet.members(b, o, i))) return false;
    } else if (meet.peer(a, p, i) !== meet.peer(b, o, i)) return false;
  }
  return true;
}
