// The facts every plan rule reads, computed once per distinct program: ranks that share a program
// id share its index, and only the send/recv pairing is per rank (peers are global ranks, so the
// same program pairs differently on each rank). Integer ids in typed arrays keep the checks and
// the all-ranks simulation linear in the instructions.
//
//   instruction kinds   LOCAL (runs on its rank alone), GROUP (collective over a plan group),
//                       SEND, RECV, derived from the op table
//   stream orders       instruction indices per stream, in issue order
//   events              CSR lists of the events each instruction waits for and records
//   buffer streams      which streams touch each buffer (the event rule tracks only bytes that
//                       some stream other than compute touches)
//   group collectives   the group reference and an interned signature (kind, root, dtype,
//                       element count at symbol bounds)
//   communicators       plan groups with the same ordered rank list are one communicator
//   group references    a collective's `group` attribute names a plan group, or a group kind
//                       that plan.rankGroups resolves per rank (so replicas share a program);
//                       each rank's sequence on a communicator is cached per distinct program
//                       and set of references that resolve to it
//   p2p pairs           the j-th send from r to q with tag t meets the j-th recv on q from r with t

import { OP_KINDS, OP_TABLE, type AttrSpec, type OpKind } from '../../ir/ops.js';
import { formatDim, parseDim, type Dim } from '../../ir/shape.js';
import { STREAMS, type PlanFile, type PlanInstruction, type ProgramFile } from '../plan/format.js';
import type { PlanProblem, PlanRule } from './problem.js';

export const STREAM_COUNT = STREAMS.length;
const STREAM_INDEX: ReadonlyMap<string, number> = new Map(STREAMS.map((s, i) => [s, i]));

/** How an instruction takes part in the step. */
export const LOCAL = 0;
export const GROUP = 1;
export const SEND = 2;
export const RECV = 3;

type AttrNames<K extends OpKind> = keyof (typeof OP_TABLE)[K]['attrs'];
type OpsWithAttr<A extends string> = {
  [K in OpKind]: A extends AttrNames<K> ? K : never;
}[OpKind];

/** point-to-point ops (those with a `peer`), by direction */
const P2P_KIND = { send: SEND, recv: RECV } as const satisfies Record<OpsWithAttr<'peer'>, number>;

const specs = (k: OpKind) => OP_TABLE[k].attrs as Readonly<Record<string, AttrSpec>>;
const KIND_OF_OP: ReadonlyMap<string, number> = new Map(
  OP_KINDS.map((k) => {
    if (k in P2P_KIND) return [k, P2P_KIND[k as keyof typeof P2P_KIND]];
    return [k, 'group' in specs(k) ? GROUP : LOCAL];
  }),
);
/** variable-size collectives: sizes are exchanged first, so buffer rows may differ per rank */
const VARIABLE_SIZE: ReadonlySet<string> = new Set(OP_KINDS.filter((k) => 'out_rows' in specs(k)));
/** variable-size collectives whose second input is the counts every member passes */
const COUNTED: ReadonlySet<string> = new Set(['all_to_all_v', 'all_gather_v', 'reduce_scatter_v']);
export const ROOTED: ReadonlySet<string> = new Set(OP_KINDS.filter((k) => 'root' in specs(k)));

/** Absent or non-int32 attribute, in the Int32Array fields below. */
export const NONE = -0x80000000;

export interface ProgramIndex {
  /** the program id ranks name in plan.rankPrograms */
  readonly id: string;
  readonly file: ProgramFile;
  /** the ranks that run it, ascending */
  readonly ranks: number[];
  readonly n: number;
  /** [n] stream index (STREAMS) */
  readonly stream: Uint8Array;
  /** [stream] instruction indices in issue order */
  readonly streams: readonly Int32Array[];
  /** [n] LOCAL, GROUP, SEND or RECV */
  readonly kind: Uint8Array;
  /** [n] a GROUP instruction's index in the coll* arrays, a SEND or RECV's in the p2p* arrays */
  readonly slot: Int32Array;
  /** [n + 1] CSR offsets into waitEvents / recordEvents (valid event ids only) */
  readonly waitStart: Int32Array;
  readonly waitEvents: Int32Array;
  readonly recordStart: Int32Array;
  readonly recordEvents: Int32Array;
  readonly events: number;
  /** [buffer] bit s set when an instruction on stream s reads or writes it */
  readonly bufferStreams: Uint8Array;
  /** the group references (PlanIndex.groupRefs) its collectives use, in first-use order */
  readonly refs: Int32Array;
  /** [ref of refs] its collectives (instruction indices), in issue order */
  readonly refSeq: readonly Int32Array[];
  /** [collectives] index into refs; interned signature (PlanIndex.sigText, -1: unreadable) */
  readonly collRef: Int32Array;
  readonly collSig: Int32Array;
  /** [p2p] instruction; peer and tag attributes (NONE when absent); interned dtype+shape */
  readonly p2pInstr: Int32Array;
  readonly p2pPeer: Int32Array;
  readonly p2pTag: Int32Array;
  /** [p2p] group kind the peer is a member index of (PlanIndex.kinds), -1: a global rank */
  readonly p2pKind: Int32Array;
  readonly p2pPayload: Int32Array;
  /** the first program (index in PlanIndex.programs) whose instructions are this one's but for
   * their microbatch labels, over buffers of the same types and shapes: it shares that one's
   * arrays (level 3's TP ranks, compiler/emit/alike-programs.ts); its own index when none */
  readonly alikeOf: number;
}

/** What a collective's `group` attribute names. */
export interface GroupRef {
  readonly text: string;
  /** a plan group by name: its communicator; else -1 */
  readonly comm: number;
  /** a group kind of plan.rankGroups: its index in PlanIndex.kinds; else -1 */
  readonly kind: number;
  /** the stream its collectives are issued from: each (group, stream) is its own communicator */
  readonly stream: number;
}

/** One rank's collectives on one communicator (shared by the ranks that resolve alike). */
export interface CommSeq {
  readonly program: ProgramIndex;
  /** instruction indices, in issue order */
  readonly instrs: Int32Array;
  /** [collective slot of the program] index in instrs, -1 when not on this communicator */
  readonly ord: Int32Array;
}

export interface Communicator {
  readonly id: number;
  /** every plan.groups name with this rank list */
  readonly names: readonly string[];
  /** members in group order */
  readonly ranks: Int32Array;
  /** global rank → group rank */
  readonly groupRank: ReadonlyMap<number, number>;
}

/** Send/recv pairs: one per (src, dst, tag) occurrence; a missing side is -1. */
export interface P2pPairs {
  readonly count: number;
  readonly src: Int32Array;
  readonly dst: Int32Array;
  readonly tag: Int32Array;
  readonly sendInstr: Int32Array;
  readonly recvInstr: Int32Array;
  /** pair → the next pair with the same (src, dst, tag): a duplicate (rare, so a map) */
  readonly next: ReadonlyMap<number, number>;
  /** [rank][p2p slot of its program] the pair, -1 when the peer or tag is unusable */
  readonly pairOf: readonly Int32Array[];
}

export interface PlanIndex {
  readonly plan: PlanFile;
  /** ranks simulated: plan.rankPrograms.length */
  readonly world: number;
  readonly programs: readonly ProgramIndex[];
  /** [rank] index into programs, -1 when its program is missing */
  readonly programOf: Int32Array;
  readonly comms: readonly Communicator[];
  readonly groupRefs: readonly GroupRef[];
  /** group kinds of plan.rankGroups, and [kind][rank] the communicator of that rank's group */
  readonly kinds: readonly string[];
  readonly kindComm: readonly Int32Array[];
  /** [rank][ref of its program's refs] the communicator it resolves to, -1 none */
  readonly rankComm: readonly Int32Array[];
  /** [rank][ref of its program's refs] the rank's sequence on that communicator */
  readonly rankSeq: readonly (readonly (CommSeq | undefined)[])[];
  /** the rank's sequence on a communicator, undefined when it issues none there */
  seqOn(rank: number, comm: number): CommSeq | undefined;
  readonly pairs: P2pPairs;
  /** the global rank that p2p slot o of program p names on this rank (-1: none) */
  peerOf(rank: number, p: ProgramIndex, o: number): number;
  readonly sigText: readonly string[];
  readonly payloadText: readonly string[];
  /** structure problems found while indexing */
  readonly problems: readonly PlanProblem[];
}

const NO_RANKS: readonly number[] = [];

export function problemAt(
  rule: PlanRule,
  ranks: readonly number[],
  p: ProgramIndex | undefined,
  instruction: number,
  message: string,
): PlanProblem {
  const ins: PlanInstruction | undefined =
    p && instruction >= 0 ? p.file.instructions[instruction] : undefined;
  return {
    rule,
    ranks,
    program: p?.id ?? '',
    instruction: ins ? instruction : -1,
    stream: ins && STREAM_INDEX.has(ins.stream) ? ins.stream : '',
    op: ins ? String(ins.op) : '',
    scope: ins ? String(ins.scope ?? '') : '',
    message,
  };
}

/** [event] the first instruction of p that records it, -1 none (into `out` when given). */
export function recordersOf(
  p: ProgramIndex,
  out: Int32Array = new Int32Array(p.events),
): Int32Array {
  const by = out.subarray(0, p.events).fill(-1);
  for (let i = p.n - 1; i >= 0; i--)
    for (let k = p.recordStart[i]; k < p.recordStart[i + 1]; k++) by[p.recordEvents[k]] = i;
  return by;
}

/** Interns texts to dense ids. */
class Interner {
  readonly texts: string[] = [];
  private readonly ids = new Map<string, number>();
  id(text: string): number {
    let id = this.ids.get(text);
    if (id === undefined) {
      id = this.texts.length;
      this.ids.set(text, id);
      this.texts.push(text);
    }
    return id;
  }
}

class DimError extends Error {}

const isInt = (v: unknown): v is number => typeof v === 'number' && Number.isInteger(v);
const int32 = (v: unknown): number => (isInt(v) && v > NONE && v <= 0x7fffffff ? v : NONE);

/** Dims of buffers and payloads at the symbols' declared bounds, parsed once per dim text. */
class Dims {
  private readonly parsed = new Map<string, Dim>();
  constructor(private readonly bounds: ReadonlyMap<string, number>) {}

  dim(text: unknown): Dim {
    const t = String(text);
    let d = this.parsed.get(t);
    if (d === undefined) {
      try {
        d = parseDim(t);
      } catch {
        throw new DimError(`bad dim '${t}'`);
      }
      if (typeof d !== 'number' && !this.bounds.has(d.sym))
        throw new DimError(`dim '${t}' uses symbol ${d.sym}, not in plan.symbols`);
      this.parsed.set(t, d);
    }
    return d;
  }

  /** element count of dims [from, …) at the bounds */
  elems(shape: unknown, from = 0): number {
    if (!Array.isArray(shape)) throw new DimError(`shape ${JSON.stringify(shape)} is not a list`);
    let n = 1;
    for (let k = from; k < shape.length; k++) {
      const d = this.dim(shape[k]);
      n *= typeof d === 'number' ? d : Math.floor((this.bounds.get(d.sym)! * d.num) / d.den);
    }
    return n;
  }

  text(shape: unknown): string {
    if (!Array.isArray(shape)) throw new DimError(`shape ${JSON.stringify(shape)} is not a list`);
    return shape.map((t) => formatDim(this.dim(t))).join(', ');
  }
}

interface Ctx {
  readonly dims: Dims;
  /** a collective's group attribute, on the stream it is issued from */
  refOf(group: unknown, stream: number): number;
  /** a send/recv's group kind: its index in kinds; -1 without one (a global peer); -2 unknown */
  kindOf(group: unknown): number;
  readonly sigs: Interner;
  readonly payloads: Interner;
  readonly problems: PlanProblem[];
}

/** The facts of a group collective that every member must agree on, as text. */
function collectiveSignature(
  op: string,
  ins: PlanInstruction,
  file: ProgramFile,
  root: number,
  dims: Dims,
): string {
  const input = (k: number) => {
    const id = ins.inputs[k];
    if (!isInt(id) || id < 0 || id >= file.buffers.length)
      throw new DimError(`input ${k} is not a buffer`);
    return file.buffers[id];
  };
  const x = input(0);
  const at = ROOTED.has(op) ? ` root ${root === NONE ? 'absent' : root}` : '';
  if (!VARIABLE_SIZE.has(op)) return `${op}${at} of ${x.dtype} × ${dims.elems(x.shape)}`;
  // variable rows: only the row width is static; the counts input is the size exchange
  const rows = `${op}${at} of ${x.dtype} rows × ${dims.elems(x.shape, 1)}`;
  // all_to_all_v's, all_gather_v's and reduce_scatter_v's second input is their counts;
  // scatter_v's further inputs are the root's blocks
  if (!COUNTED.has(op) || ins.inputs.length < 2) return rows;
  const c = input(1);
  return `${rows}, counts ${c.dtype} × ${dims.elems(c.shape)}`;
}

/** a list of primitives, or a primitive, the same */
export function sameValue(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (!Array.isArray(a) || !Array.isArray(b) || a.length !== b.length) return false;
  for (let k = 0; k < a.length; k++) if (a[k] !== b[k]) return false;
  return true;
}

function sameAttrs(a: Readonly<Record<string, unknown>>, b: Readonly<Record<string, unknown>>) {
  if (a === b) return true;
  if (!a || !b) return false;
  let keys = 0;
  for (const k in a) {
    if (!sameValue(a[k], b[k])) return false;
    keys++;
  }
  for (const _ in b) keys--;
  return keys === 0;
}

/**
 * Whether program b is a's but for its instructions' microbatch labels (and the names and labels
 * of its buffers): every instruction and buffer the same object (a program relabeled in memory)
 * or the same but for those.
 */
export function alikeBodies(a: ProgramFile, b: ProgramFile): boolean {
  const [x, y] = [a.instructions, b.instructions];
  if (!Array.isArray(x) || !Array.isArray(y) || x.length !== y.length) return false;
  if (a.events !== b.events || !Array.isArray(a.buffers) || !Array.isArray(b.buffers)) return false;
  if (a.buffers.length !== b.buffers.length) return false;
  for (let i = 0; i < x.length; i++) {
    const [u, v] = [x[i], y[i]];
    if (u === v) continue;
    if (u.op !== v.op || u.stream !== v.stream || u.phase !== v.phase || u.scope !== v.scope)
      return false;
    if (!sameValue(u.inputs, v.inputs) || !sameValue(u.outputs, v.outputs)) return false;
    if (!sameValue(u.wait, v.wait) || !sameValue(u.record, v.record)) return false;
    if (!sameAttrs(u.attrs, v.attrs)) return false;
  }
  for (let k = 0; k < a.buffers.length; k++) {
    const [u, v] = [a.buffers[k], b.buffers[k]];
    if (u === v) continue;
    if (u.dtype !== v.dtype || u.bytes !== v.bytes || u.region !== v.region) return false;
    if (u.space !== v.space || u.offset !== v.offset || u.viewOf !== v.viewOf) return false;
    if (!sameValue(u.shape, v.shape)) return false;
  }
  return true;
}

function indexProgram(
  id: string,
  file: ProgramFile,
  ranks: number[],
  ctx: Ctx,
  alikeOf: number,
): ProgramIndex {
  const list = Array.isArray(file.instructions) ? file.instructions : [];
  const n = list.length;
  const buffers = Array.isArray(file.buffers) ? file.buffers : [];
  const nbuf = buffers.length;
  const events = isInt(file.events) && file.events >= 0 ? file.events : 0;
  const pending: { i: number; message: string }[] = [];
  const bad = (i: number, message: string) => pending.push({ i, message });
  if (!isInt(file.events) || file.events < 0) bad(-1, `events is ${String(file.events)}`);
  if (file.id !== id) bad(-1, `program file has id '${String(file.id)}'`);

  // one pass over the instruction objects (plans are large and scattered in memory): lists grow
  // as plain arrays and become typed arrays of their final size (typed-array garbage would cost
  // a full collection of the plan's heap)
  const stream = new Uint8Array(n);
  const kind = new Uint8Array(n);
  const slot = new Int32Array(n).fill(-1);
  const waitStart = new Int32Array(n + 1);
  const recordStart = new Int32Array(n + 1);
  const [waitEvents, recordEvents]: number[][] = [[], []];
  const [collRef, collSig]: number[][] = [[], []];
  const [p2pInstr, p2pPeer, p2pTag, p2pPayload, p2pKind]: number[][] = [[], [], [], [], []];
  const refIndex = new Map<number, number>(); // group ref → index in refs
  const refSeq: number[][] = [];
  const eventList = (i: number, ids: unknown, what: string, out: number[]) => {
    if (!Array.isArray(ids)) return bad(i, `${what} is not a list of events`);
    for (const e of ids) {
      if (isInt(e) && e >= 0 && e < events) out.push(e);
      else bad(i, `${what} names event ${String(e)}; the program has ${events} events`);
    }
  };
  const bufferStreams = new Uint8Array(nbuf);
  const bufferList = (i: number, ids: unknown, what: string) => {
    if (!Array.isArray(ids)) return bad(i, `${what} is not a list of buffers`);
    for (const b of ids) {
      if (isInt(b) && b >= 0 && b < nbuf) bufferStreams[b] |= 1 << stream[i];
      else bad(i, `${what} names buffer ${String(b)}; the program has ${nbuf} buffers`);
    }
  };
  for (let i = 0; i < n; i++) {
    const ins = list[i];
    let s = STREAM_INDEX.get(ins.stream);
    if (s === undefined) {
      bad(i, `unknown stream '${String(ins.stream)}'`);
      s = 0;
    }
    stream[i] = s;
    eventList(i, ins.wait, 'wait', waitEvents);
    eventList(i, ins.record, 'record', recordEvents);
    waitStart[i + 1] = waitEvents.length;
    recordStart[i + 1] = recordEvents.length;
    bufferList(i, ins.inputs, 'inputs');
    bufferList(i, ins.outputs, 'outputs');
    const k = KIND_OF_OP.get(ins.op);
    if (k === undefined) bad(i, `unknown op '${String(ins.op)}'`);
    kind[i] = k ?? LOCAL;
    if (k === undefined || k === LOCAL) continue;
    const attrs = (ins.attrs ?? {}) as Readonly<Record<string, unknown>>;
    if (k === GROUP) {
      slot[i] = collRef.length;
      const ref = ctx.refOf(attrs.group, stream[i]);
      let j = refIndex.get(ref);
      if (j === undefined) {
        refIndex.set(ref, (j = refSeq.length));
        refSeq.push([]);
      }
      refSeq[j].push(i);
      collRef.push(j);
      let sig = -1;
      try {
        sig = ctx.sigs.id(collectiveSignature(ins.op, ins, file, int32(attrs.root), ctx.dims));
      } catch (e) {
        if (!(e instanceof DimError)) throw e;
        bad(i, e.message);
      }
      collSig.push(sig);
      continue;
    }
    slot[i] = p2pInstr.length;
    p2pInstr.push(i);
    p2pPeer.push(int32(attrs.peer));
    p2pTag.push(int32(attrs.tag));
    p2pKind.push(ctx.kindOf(attrs.group));
    let payload = -1;
    try {
      let dtype = attrs.dtype;
      let shape = attrs.shape;
      if (k === SEND) {
        const b = ins.inputs?.[0];
        if (!isInt(b) || b < 0 || b >= nbuf) throw new DimError('send has no input buffer');
        ({ dtype, shape } = buffers[b]);
      }
      payload = ctx.payloads.id(`${String(dtype)}[${ctx.dims.text(shape)}]`);
    } catch (e) {
      if (!(e instanceof DimError)) throw e;
      bad(i, e.message);
    }
    p2pPayload.push(payload);
  }
  // stream lists by a counting sort of the stream of each instruction
  const perStream = new Int32Array(STREAM_COUNT);
  for (let i = 0; i < n; i++) perStream[stream[i]]++;
  const streams = Array.from(perStream, (len) => new Int32Array(len));
  const fill = new Int32Array(STREAM_COUNT);
  for (let i = 0; i < n; i++) streams[stream[i]][fill[stream[i]]++] = i;

  const index: ProgramIndex = {
    id,
    file,
    ranks,
    n,
    stream,
    streams,
    kind,
    slot,
    waitStart,
    waitEvents: Int32Array.from(waitEvents),
    recordStart,
    recordEvents: Int32Array.from(recordEvents),
    events,
    bufferStreams,
    refs: Int32Array.from(refIndex.keys()),
    refSeq: refSeq.map((l) => Int32Array.from(l)),
    collRef: Int32Array.from(collRef),
    collSig: Int32Array.from(collSig),
    p2pInstr: Int32Array.from(p2pInstr),
    p2pPeer: Int32Array.from(p2pPeer),
    p2pTag: Int32Array.from(p2pTag),
    p2pKind: Int32Array.from(p2pKind),
    p2pPayload: Int32Array.from(p2pPayload),
    alikeOf,
  };
  for (const { i, message } of pending)
    ctx.problems.push(problemAt('structure', ranks, index, i, message));
  return index;
}

function buildComms(plan: PlanFile, world: number, problems: PlanProblem[]) {
  const comms: Communicator[] = [];
  const commOfName = new Map<string, number>();
  const byRanks = new Map<string, number>();
  const groups = Array.isArray(plan.groups) ? plan.groups : [];
  /** [index in plan.groups] communicator, -1 for a faulty group */
  const commOfGroup = new Int32Array(groups.length).fill(-1);
  groups.forEach((g, gi) => {
    const ranks = Array.isArray(g.ranks) ? g.ranks : [];
    const fault = (message: string) =>
      problems.push(problemAt('structure', NO_RANKS, undefined, -1, `group ${g.name}: ${message}`));
    if (commOfName.has(g.name)) return fault('named twice in plan.groups');
    const members = new Map<number, number>();
    for (const r of ranks) {
      if (!isInt(r) || r < 0 || r >= world) fault(`member ${String(r)} is not a rank`);
      else if (members.has(r)) fault(`rank ${r} is listed twice`);
      else members.set(r, members.size);
    }
    if (members.size !== ranks.length) return;
    const key = ranks.join(',');
    let c = byRanks.get(key);
    if (c === undefined) {
      c = comms.length;
      byRanks.set(key, c);
      comms.push({ id: c, names: [], ranks: Int32Array.from(ranks), groupRank: members });
    }
    (comms[c].names as string[]).push(g.name);
    commOfName.set(g.name, c);
    commOfGroup[gi] = c;
  });
  // one communicator per (group, stream), as the runtime makes one context per pair:
  // communicator c·STREAM_COUNT + s is group c's on stream s
  const perStream = comms.flatMap((c) =>
    STREAMS.map((name, si) => ({
      ...c,
      id: c.id * STREAM_COUNT + si,
      names: si === 0 ? c.names : c.names.map((n) => `${n}@${name}`),
    })),
  );
  return { comms: perStream, commOfName, commOfGroup };
}

/**
 * plan.rankGroups: [kind][rank] → communicator (-1 when the entry is not a usable group). An entry
 * of -1 says the rank is in no group of the kind (a middle pipeline stage has no embd group): a
 * collective over that kind on such a rank is the collectives rule's problem, not a structure one.
 */
function buildKinds(
  plan: PlanFile,
  world: number,
  commOfGroup: Int32Array,
  problems: PlanProblem[],
) {
  const entries = Object.entries(plan.rankGroups ?? {});
  const kinds = entries.map(([k]) => k);
  const kindComm = entries.map(([kind, list]) => {
    const comm = new Int32Array(world).fill(-1);
    const bad: number[] = [];
    for (let r = 0; r < world; r++) {
      const g = Array.isArray(list) ? list[r] : undefined;
      if (isInt(g) && g >= 0 && g < commOfGroup.length && commOfGroup[g] >= 0)
        comm[r] = commOfGroup[g];
      else if (g !== -1) bad.push(r);
    }
    if (bad.length)
      problems.push(
        problemAt(
          'structure',
          bad,
          undefined,
          -1,
          `rankGroups.${kind} names no group of plan.groups`,
        ),
      );
    return comm;
  });
  return { kinds, kindComm };
}

/**
 * The global rank a send/recv of rank r names: its peer attribute, or with a group kind, the
 * member at that index of r's group of that kind; -1 when it names none.
 */
function resolvePeer(
  r: number,
  p: ProgramIndex,
  o: number,
  comms: readonly Communicator[],
  kindComm: readonly Int32Array[],
): number {
  const peer = p.p2pPeer[o];
  const kind = p.p2pKind[o];
  if (kind === -1) return peer;
  if (kind < 0) return -1;
  const c = kindComm[kind][r];
  if (c < 0) return -1;
  const ranks = comms[c * STREAM_COUNT].ranks;
  return peer >= 0 && peer < ranks.length ? ranks[peer] : -1;
}

function pairP2p(
  world: number,
  programs: readonly ProgramIndex[],
  programOf: Int32Array,
  comms: readonly Communicator[],
  kindComm: readonly Int32Array[],
) {
  let [sends, recvs] = [0, 0];
  for (let r = 0; r < world; r++) {
    const p = programOf[r] >= 0 ? programs[programOf[r]] : undefined;
    for (const i of p?.p2pInstr ?? [])
      if (p!.kind[i] === SEND) sends++;
      else recvs++;
  }
  // a plan whose sends and recvs all pair needs max(sends, recvs) pairs; more only when faulty
  let capacity = Math.max(sends, recvs, 16);
  let src = new Int32Array(capacity);
  let dst = new Int32Array(capacity);
  let tag = new Int32Array(capacity);
  let sendInstr = new Int32Array(capacity).fill(-1);
  let recvInstr = new Int32Array(capacity).fill(-1);
  const grow = () => {
    const more = (a: Int32Array, fill: number) => {
      const b = new Int32Array(capacity * 2).fill(fill);
      b.set(a);
      return b;
    };
    [src, dst, tag] = [more(src, 0), more(dst, 0), more(tag, 0)];
    [sendInstr, recvInstr] = [more(sendInstr, -1), more(recvInstr, -1)];
    capacity *= 2;
  };
  let count = 0;
  const newPair = (s: number, d: number, t: number) => {
    if (count === capacity) grow();
    src[count] = s;
    dst[count] = d;
    tag[count] = t;
    return count++;
  };
  // the first pair of each (src, dst, tag), in one small map per destination rank (a rank's
  // pairs stay together in memory; one table over all ranks misses the cache on every probe)
  const byDst = new Array<Map<number, number> | undefined>(world);
  const firstPair = (s: number, d: number, t: number): number => {
    let m = byDst[d];
    if (!m) byDst[d] = m = new Map<number, number>();
    const key = s * 4294967296 + (t >>> 0);
    const q = m.get(key);
    if (q !== undefined) return q;
    const fresh = newPair(s, d, t);
    m.set(key, fresh);
    return fresh;
  };
  const next = new Map<number, number>();
  const pairOf: Int32Array[] = [];
  for (let r = 0; r < world; r++) {
    const p = programOf[r] >= 0 ? programs[programOf[r]] : undefined;
    const mine = new Int32Array(p ? p.p2pInstr.length : 0).fill(-1);
    pairOf.push(mine);
    if (!p) continue;
    for (let o = 0; o < mine.length; o++) {
      const i = p.p2pInstr[o];
      const peer = resolvePeer(r, p, o, comms, kindComm);
      const t = p.p2pTag[o];
      if (peer < 0 || peer >= world || t === NONE) continue;
      const isSend = p.kind[i] === SEND;
      const s = isSend ? r : peer;
      const d = isSend ? peer : r;
      let q = firstPair(s, d, t);
      while ((isSend ? sendInstr : recvInstr)[q] >= 0) {
        if (!next.has(q)) next.set(q, newPair(s, d, t));
        q = next.get(q)!;
      }
      (isSend ? sendInstr : recvInstr)[q] = i;
      mine[o] = q;
    }
  }
  return { count, src, dst, tag, sendInstr, recvInstr, next, pairOf };
}

/** Each rank's communicator per group reference, and its sequence on each communicator. */
function resolveSequences(
  world: number,
  programs: readonly ProgramIndex[],
  programOf: Int32Array,
  groupRefs: readonly GroupRef[],
  kindComm: readonly Int32Array[],
) {
  const rankComm: Int32Array[] = [];
  const rankSeq: (CommSeq | undefined)[][] = [];
  const cache = new Map<string, CommSeq>();
  for (let r = 0; r < world; r++) {
    const pi = programOf[r];
    const p = pi >= 0 ? programs[pi] : undefined;
    const refs = p ? p.refs : new Int32Array(0);
    const comms = Int32Array.from(refs, (ref) => {
      const g = groupRefs[ref];
      if (g.kind < 0) return g.comm;
      const base = kindComm[g.kind][r];
      return base < 0 ? -1 : base * STREAM_COUNT + g.stream;
    });
    const seqs: (CommSeq | undefined)[] = new Array<CommSeq | undefined>(refs.length);
    for (let j = 0; j < refs.length; j++) {
      if (comms[j] < 0 || seqs[j]) continue;
      // the program's references that resolve to the same communicator on this rank: one
      // sequence, in issue order
      const same: number[] = [];
      for (let k = j; k < refs.length; k++) if (comms[k] === comms[j]) same.push(k);
      const key = `${pi}:${same.join(',')}`;
      let seq = cache.get(key);
      if (!seq) {
        const instrs =
          same.length === 1
            ? p!.refSeq[j]
            : Int32Array.from(same.flatMap((k) => [...p!.refSeq[k]])).sort();
        const ord = new Int32Array(p!.collRef.length).fill(-1);
        instrs.forEach((i, k) => (ord[p!.slot[i]] = k));
        cache.set(key, (seq = { program: p!, instrs, ord }));
      }
      for (const k of same) seqs[k] = seq;
    }
    rankComm.push(comms);
    rankSeq.push(seqs);
  }
  return { rankComm, rankSeq };
}

export function buildPlanIndex(plan: PlanFile, files: ReadonlyMap<string, ProgramFile>): PlanIndex {
  const problems: PlanProblem[] = [];
  const rankPrograms = Array.isArray(plan.rankPrograms) ? plan.rankPrograms : [];
  const world = rankPrograms.length;
  const planFault = (message: string) =>
    problems.push(problemAt('structure', NO_RANKS, undefined, -1, message));
  if (plan.topology?.worldSize !== world)
    planFault(`topology.worldSize is ${plan.topology?.worldSize}; rankPrograms has ${world} ranks`);
  const bounds = new Map<string, number>();
  for (const s of plan.symbols ?? []) {
    if (!isInt(s.bound) || s.bound < 1) planFault(`symbol ${s.name} has bound ${s.bound}`);
    bounds.set(s.name, s.bound);
  }
  const { comms, commOfName, commOfGroup } = buildComms(plan, world, problems);
  const { kinds, kindComm } = buildKinds(plan, world, commOfGroup, problems);
  const groupRefs: GroupRef[] = [];
  const refIds = new Map<string, number>();
  const ctx: Ctx = {
    dims: new Dims(bounds),
    refOf(group, stream) {
      const text = String(group);
      const key = `${text}\u0000${stream}`;
      let id = refIds.get(key);
      if (id === undefined) {
        // a group kind first (the attribute names a kind since plan.rankGroups), else a name
        const kind = kinds.indexOf(text);
        const base = kind < 0 ? (commOfName.get(text) ?? -1) : -1;
        const comm = base < 0 ? -1 : base * STREAM_COUNT + stream;
        refIds.set(key, (id = groupRefs.length));
        groupRefs.push({ text, comm, kind, stream });
      }
      return id;
    },
    kindOf(group) {
      if (group === undefined) return -1;
      const k = kinds.indexOf(String(group));
      return k < 0 ? -2 : k;
    },
    sigs: new Interner(),
    payloads: new Interner(),
    problems,
  };

  // ranks of each program id, in rank order
  const ranksOf = new Map<string, number[]>();
  rankPrograms.forEach((id, r) => {
    let rs = ranksOf.get(id);
    if (!rs) ranksOf.set(id, (rs = []));
    rs.push(r);
  });
  const programs: ProgramIndex[] = [];
  const programOf = new Int32Array(world).fill(-1);
  const clean = new Set<ProgramIndex>();
  for (const [id, ranks] of ranksOf) {
    const file = files.get(id);
    if (!file) {
      problems.push(
        problemAt('structure', ranks, undefined, -1, `program '${id}' is missing from the plan`),
      );
      continue;
    }
    const j = programs.length;
    for (const r of ranks) programOf[r] = j;
    // a program alike an earlier one without problems shares its index (the same facts)
    const twin =
      file.id === id ? programs.findIndex((q) => clean.has(q) && alikeBodies(q.file, file)) : -1;
    if (twin >= 0) {
      programs.push({ ...programs[twin], id, file, ranks });
      continue;
    }
    const before = problems.length;
    const index = indexProgram(id, file, ranks, ctx, j);
    if (problems.length === before) clean.add(index);
    programs.push(index);
  }
  const { rankComm, rankSeq } = resolveSequences(world, programs, programOf, groupRefs, kindComm);
  const seqOn = (rank: number, comm: number): CommSeq | undefined => {
    const cs = rankComm[rank];
    for (let j = 0; j < cs.length; j++) if (cs[j] === comm) return rankSeq[rank][j];
    return undefined;
  };
  return {
    plan,
    world,
    programs,
    programOf,
    comms,
    groupRefs,
    kinds,
    kindComm,
    rankComm,
    rankSeq,
    seqOn,
    pairs: pairP2p(world, programs, programOf, comms, kindComm),
    peerOf: (rank, p, o) => resolvePeer(rank, p, o, comms, kindComm),
    sigText: ctx.sigs.texts,
    payloadText: ctx.payloads.texts,
    problems,
  };
}
