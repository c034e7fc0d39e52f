// Mutations that always break a valid plan, each applied to one rank at a random place. Programs
// are shared between ranks, so a mutated rank first gets its own copy of its program.
//
// Whether a place fits is decided here from the plan itself, independently of the verifier:
// group sizes from plan.groups, element counts from buffer bytes, and event ordering by a plain
// breadth-first search over program order and record → wait edges.

import { DTYPE_BYTES, type DType } from '../../ir/dtype.js';
import { OP_TABLE, isOpKind, updatedInputs, type AttrSpec, type OpKind } from '../../ir/ops.js';
import type { PlanInstruction, ProgramFile } from '../../compiler/plan/format.js';
import type { PlanRule } from '../../compiler/verify/plan-verifier.js';
import type { GeneratedPlan } from './plan-gen.js';

export interface Mutated {
  readonly plan: GeneratedPlan;
  /** where: rank, program instruction or event, for counting distinct places */
  readonly place: string;
}

export interface Mutation {
  readonly name: string;
  /** the rule that must reject the mutated plan */
  readonly rule: PlanRule;
  /** a mutated copy at a random place, or undefined when the place drawn does not fit */
  apply(g: GeneratedPlan, rand: () => number): Mutated | undefined;
}

const pick = <T>(xs: readonly T[], rand: () => number): T => xs[Math.floor(rand() * xs.length)];

/** The plan with `rank` running its own copy of its program, edited. */
export function withOwnProgram(
  g: GeneratedPlan,
  rank: number,
  edit: (p: ProgramFile) => ProgramFile,
): GeneratedPlan {
  const id = g.plan.rankPrograms[rank];
  const own = `${id}@rank${rank}`;
  const programs = new Map(g.programs);
  programs.set(own, { ...edit(g.programs.get(id)!), id: own });
  const rankPrograms = [...g.plan.rankPrograms];
  rankPrograms[rank] = own;
  return { plan: { ...g.plan, rankPrograms }, programs };
}

const attrSpecs = (op: string): Readonly<Record<string, AttrSpec>> =>
  isOpKind(op) ? (OP_TABLE[op].attrs as Readonly<Record<string, AttrSpec>>) : {};
/** a collective on a group (not send/recv, which dropP2p covers; not the local group_slice) */
const isGroupOp = (ins: PlanInstruction) =>
  isOpKind(ins.op) &&
  OP_TABLE[ins.op].category === 'collective' &&
  'group' in attrSpecs(ins.op) &&
  !('peer' in attrSpecs(ins.op));
const isVariable = (ins: PlanInstruction) => 'out_rows' in attrSpecs(ins.op);
const isRooted = (ins: PlanInstruction) => 'root' in attrSpecs(ins.op);
/** size of the group a collective names on a rank: a group kind resolved per rank, or a name */
const groupSize = (g: GeneratedPlan, rank: number, name: unknown) => {
  const kind = g.plan.rankGroups[String(name)];
  const group = kind ? g.plan.groups[kind[rank]] : g.plan.groups.find((x) => x.name === name);
  return group?.ranks.length ?? 0;
};
/** element count of the first input at the symbols' bounds */
const inputElems = (p: ProgramFile, ins: PlanInstruction) => {
  const b = p.buffers[ins.inputs[0]];
  return b.bytes / DTYPE_BYTES[b.dtype as DType];
};

function randomRank(g: GeneratedPlan, rand: () => number) {
  const rank = Math.floor(rand() * g.plan.rankPrograms.length);
  return { rank, p: g.programs.get(g.plan.rankPrograms[rank])! };
}

/** indices of a rank's group collectives on groups of two or more ranks */
function collectivesOnGroups(g: GeneratedPlan, rank: number, p: ProgramFile): number[] {
  const out: number[] = [];
  p.instructions.forEach((ins, i) => {
    if (isGroupOp(ins) && groupSize(g, rank, ins.attrs.group) >= 2) out.push(i);
  });
  return out;
}

const without = (p: ProgramFile, i: number): ProgramFile => ({
  ...p,
  instructions: p.instructions.filter((_, k) => k !== i),
});

export const dropCollective: Mutation = {
  name: "drop one rank's collective",
  rule: 'collective-match',
  apply(g, rand) {
    const { rank, p } = randomRank(g, rand);
    const cands = collectivesOnGroups(g, rank, p);
    if (!cands.length) return undefined;
    const i = pick(cands, rand);
    return { plan: withOwnProgram(g, rank, (q) => without(q, i)), place: `${rank}:${i}` };
  },
};

export const swapCollectives: Mutation = {
  name: 'swap two collectives of one group that differ in kind, root or size',
  rule: 'collective-match',
  apply(g, rand) {
    const { rank, p } = randomRank(g, rand);
    const cands = collectivesOnGroups(g, rank, p);
    if (!cands.length) return undefined;
    // one communicator: the same group on the same stream
    const first = p.instructions[pick(cands, rand)];
    const onGroup = cands.filter(
      (i) =>
        p.instructions[i].attrs.group === first.attrs.group &&
        p.instructions[i].stream === first.stream,
    );
    const differ = (a: PlanInstruction, b: PlanInstruction) =>
      a.op !== b.op ||
      a.attrs.root !== b.attrs.root ||
      (!isVariable(a) && inputElems(p, a) !== inputElems(p, b));
    const pairs: [number, number][] = [];
    for (let x = 0; x < onGroup.length; x++)
      for (let y = x + 1; y < onGroup.length; y++)
        if (differ(p.instructions[onGroup[x]], p.instructions[onGroup[y]]))
          pairs.push([onGroup[x], onGroup[y]]);
    if (!pairs.length) return undefined;
    const [a, b] = pick(pairs, rand);
    const plan = withOwnProgram(g, rank, (q) => {
      const instructions = [...q.instructions];
      [instructions[a], instructions[b]] = [instructions[b], instructions[a]];
      return { ...q, instructions };
    });
    return { plan, place: `${rank}:${a}:${b}` };
  },
};

export const changeSizeOrRoot: Mutation = {
  name: "change one rank's static size or root",
  rule: 'collective-match',
  apply(g, rand) {
    const { rank, p } = randomRank(g, rand);
    const cands = collectivesOnGroups(g, rank, p);
    if (!cands.length) return undefined;
    const i = pick(cands, rand);
    const ins = p.instructions[i];
    const ways = [...(isRooted(ins) ? ['root'] : []), ...(isVariable(ins) ? [] : ['size'])];
    if (!ways.length) return undefined;
    const way = pick(ways, rand);
    const plan = withOwnProgram(g, rank, (q) => {
      const instructions = [...q.instructions];
      if (way === 'root') {
        const size = groupSize(g, rank, ins.attrs.group);
        const root = ((ins.attrs.root as number) + 1 + Math.floor(rand() * (size - 1))) % size;
        instructions[i] = { ...ins, attrs: { ...ins.attrs, root } };
        return { ...q, instructions };
      }
      // one more element in the input: a new buffer, flat
      const old = q.buffers[ins.inputs[0]];
      const elems = inputElems(q, ins) + 1;
      const id = q.buffers.length;
      const bytes = elems * DTYPE_BYTES[old.dtype as DType];
      const grown = { ...old, id, name: `${old.name}.grown`, shape: [String(elems)], bytes };
      instructions[i] = { ...ins, inputs: [id, ...ins.inputs.slice(1)] };
      return { ...q, buffers: [...q.buffers, grown], instructions };
    });
    return { plan, place: `${rank}:${i}:${way}` };
  },
};

export const dropP2p: Mutation = {
  name: 'drop one send or recv',
  rule: 'p2p-match',
  apply(g, rand) {
    const { rank, p } = randomRank(g, rand);
    const cands = p.instructions.flatMap((ins, i) =>
      ins.op === 'send' || ins.op === 'recv' ? [i] : [],
    );
    if (!cands.length) return undefined;
    const i = pick(cands, rand);
    return { plan: withOwnProgram(g, rank, (q) => without(q, i)), place: `${rank}:${i}` };
  },
};

/** Reference happens-before: is `to` reachable from `from` by stream order and record → wait? */
export function reaches(p: ProgramFile, from: number, to: number): boolean {
  const next: number[][] = p.instructions.map(() => []);
  const lastOn = new Map<string, number>();
  const waiters = new Map<number, number[]>();
  p.instructions.forEach((ins, i) => {
    const prev = lastOn.get(ins.stream);
    if (prev !== undefined) next[prev].push(i);
    lastOn.set(ins.stream, i);
    for (const e of ins.wait) waiters.set(e, [...(waiters.get(e) ?? []), i]);
  });
  p.instructions.forEach((ins, i) => {
    for (const e of ins.record) next[i].push(...(waiters.get(e) ?? []));
  });
  const seen = new Set([from]);
  const todo = [from];
  while (todo.length) {
    const i = todo.pop()!;
    if (i === to) return true;
    for (const j of next[i]) {
      if (seen.has(j)) continue;
      seen.add(j);
      todo.push(j);
    }
  }
  return false;
}

/** the buffer whose bytes a buffer uses */
const base = (p: ProgramFile, b: number): number =>
  p.buffers[b].viewOf === undefined ? b : base(p, p.buffers[b].viewOf!);
/** buffers an instruction writes: its outputs, and the inputs it updates in place */
const written = (p: ProgramFile, ins: PlanInstruction) =>
  [
    ...ins.outputs,
    ...updatedInputs(ins.op as OpKind, ins.inputs.length).map((k) => ins.inputs[k]),
  ].map((b) => base(p, b));

/** The program without event e: gone from every record and wait list, later events renumbered. */
export function withoutEvent(p: ProgramFile, e: number): ProgramFile {
  const renumber = (ids: readonly number[]) =>
    ids.filter((x) => x !== e).map((x) => (x > e ? x - 1 : x));
  return {
    ...p,
    events: p.events - 1,
    instructions: p.instructions.map((ins) => ({
      ...ins,
      wait: renumber(ins.wait),
      record: renumber(ins.record),
    })),
  };
}

export const deleteOrderingEvent: Mutation = {
  name: 'delete the only event that orders a cross-stream read',
  rule: 'event-order',
  apply(g, rand) {
    const { rank, p } = randomRank(g, rand);
    if (p.events === 0) return undefined;
    const e = Math.floor(rand() * p.events);
    const w = p.instructions.findIndex((ins) => ins.record.includes(e));
    if (w < 0) return undefined;
    const writes = new Set(written(p, p.instructions[w]));
    // a waiter on another stream that reads what the recorder wrote
    const readers = p.instructions.flatMap((ins, i) =>
      ins.wait.includes(e) &&
      ins.stream !== p.instructions[w].stream &&
      ins.inputs.some((b) => writes.has(base(p, b)))
        ? [i]
        : [],
    );
    if (!readers.length) return undefined;
    const q = withoutEvent(p, e);
    // the event must be the only ordering: without it the read is unordered after the write
    if (!readers.some((i) => !reaches(q, w, i))) return undefined;
    return {
      plan: withOwnProgram(g, rank, () => q),
      place: `${rank}:${g.plan.rankPrograms[rank]}:e${e}`,
    };
  },
};

export const MUTATIONS: readonly Mutation[] = [
  dropCollective,
  swapCollectives,
  changeSizeOrRoot,
  dropP2p,
  deleteOrderingEvent,
];
