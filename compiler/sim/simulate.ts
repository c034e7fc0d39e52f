// The step simulator: every rank's program replayed as discrete events on one clock, with each
// instruction's cost from cost.ts. The rules are the runtime's (runtime-native/src/core/executor.h)
// and the progress check's (compiler/verify/check-progress.ts), with times:
//   - a stream runs its instructions one at a time in issue order; an instruction starts when the
//     stream is free and every event it waits for has been recorded, and records its events when
//     it ends
//   - a collective ends at the latest start among the members of its group, plus its cost: no
//     member leaves before the last has arrived
//   - a send and its recv end at the later of their starts plus the transfer (the larger of the
//     two sides' costs)
//   - consecutive sends and recvs of one stream with the same `batch` are posted one after another
//     (each once its own events are recorded) and end at once, recording their events; the last
//     of them ends when every transfer of the batch has, and records its events then
//   - on a GPU profile that prices the framework's host (hardware.ts HostSide), a rank's host
//     issues its instructions in program order, each taking the profile's host time, and an
//     instruction starts no earlier than its issue; at a forward expert dispatch the host first
//     waits until the GPU could start it (dropless routing's row counts are read back before the
//     exchange is posted), so the GPU then idles while the host issues what follows. Kernels too
//     small to hide the host make the step the host's (a 4k sequence over tp 4, a tiny model)
// The plan is verified before it is simulated, so every stream runs to its end.
//
// Ranks that share a program are alike: their instructions are priced alike (on the first rank's
// groups), and where the plan is symmetric they run alike too, so only a stand-in of each is
// replayed: the first rank of each program, or of each class of programs that differ only in
// microbatch labels (compiler/sim/symmetry.ts). A collective's members are counted as their
// stand-ins (a group of data-parallel replicas of one program is complete once that one rank
// arrives): a 1024-rank plan of 8 programs replays 8 ranks, the article's 32-rank level-3 line 4.
// The times are those of the full replay, and test/sim checks them equal on every layout of the
// equivalence matrix. A plan that is not symmetric replays every rank. What the simulation reports
// for the first rank of each program is when its last instruction ends, how long its compute
// stream is busy, and how long communication or host copies run while compute is idle (exposed
// communication). The step is the latest end over the ranks replayed.
//
// On a GPU profile whose compute slows while communication kernels share the SMs (its overlap
// compute_slowdown), the replay runs twice: the second with each compute kernel lengthened by the
// slowdown times the share of it the first showed overlapping a collective's transfer.

import { OP_TABLE, type OpKind } from '../../ir/ops.js';
import { UserError } from '../errors.js';
import {
  batchSpans,
  STREAMS,
  type PlanFile,
  type PlanInstruction,
  type ProgramFile,
} from '../plan/format.js';
import {
  buildPlanIndex,
  GROUP,
  LOCAL,
  SEND,
  type PlanIndex,
  type ProgramIndex,
} from '../verify/plan-index.js';
import { Worklist } from '../verify/worklist.js';
import {
  expectedSizes,
  instructionCosts,
  instructionWork,
  issueSeconds,
  pricedHost,
  WorkMemo,
  type GroupShape,
} from './cost.js';
import type { HardwareProfile } from './hardware.js';
import { groupLayout, Meetings, symmetricMeetings } from './symmetry.js';

const S = STREAMS.length;
const COMPUTE = STREAMS.indexOf('compute');

export interface RankTimes {
  readonly rank: number;
  readonly program: string;
  /** [instruction] start and end, seconds from the step's start */
  readonly start: Float64Array;
  readonly end: Float64Array;
  /** [instruction] its priced time: data moves (or the kernel runs) for the last `cost` seconds
   * of its span, and before that it waits (for its peers, or for the cores) */
  readonly cost: Float64Array;
  /** the end of its last instruction */
  readonly finish: number;
  /** time its compute stream waits for the framework's host to issue its next kernel (0 on a
   * profile that prices no host) */
  readonly hostWait: number;
  /** time its compute stream runs a kernel (an op that is not a collective) */
  readonly computeBusy: number;
  /** time data moves or another stream runs a kernel while the compute stream runs none */
  readonly exposedComm: number;
  /** exposedComm by op (time two ops overlap counts once, for the one that started first) */
  readonly exposedByOp: Readonly<Record<string, number>>;
}

export interface Simulation {
  readonly hardware: HardwareProfile;
  /** the step: the last instruction's end over all ranks */
  readonly stepSeconds: number;
  /** the first rank of each distinct program, in program order */
  readonly ranks: readonly RankTimes[];
}

/** What a replay of a plan steps through: the plan's index and who meets whom. */
export interface ReplaySetup {
  readonly ix: PlanIndex;
  /** each rank's stand-in, and the meetings between them (the replays of one plan share it) */
  readonly meet: Meetings;
  /** [rank] the rank replayed for it (itself, or its program's or program class's first) */
  readonly standIn: Int32Array;
  /** [program] the program replayed for it: its stand-in's */
  readonly replayedFor: Int32Array;
  /** the ranks replayed, and the instructions: Σ over them of their program's length */
  readonly ranks: number;
  readonly rankInstructions: number;
}

/**
 * Who is replayed for a plan (compiler/sim/symmetry.ts): `alike`, a stand-in per class of
 * programs alike but for their microbatch labels where the plan's symmetry allows; `programs`, a
 * rank per program; `all`, every rank. Each falls back to the next where the plan is not symmetric.
 * `ix`: the plan's index, when the verifier made it already (CompileResult.planIndex).
 */
export function replaySetup(
  plan: PlanFile,
  programs: ReadonlyMap<string, ProgramFile>,
  replay: 'alike' | 'programs' | 'all' = 'alike',
  ix: PlanIndex = buildPlanIndex(plan, programs),
): ReplaySetup {
  const meet =
    (replay === 'all' ? undefined : symmetricMeetings(ix, replay === 'alike')) ??
    new Meetings(
      ix,
      Int32Array.from({ length: ix.world }, (_, r) => r),
    );
  const replayed = new Set(meet.standIn);
  let rankInstructions = 0;
  for (const r of replayed) rankInstructions += ix.programs[ix.programOf[r]].n;
  const replayedFor = Int32Array.from(ix.programs, (p) => ix.programOf[meet.standIn[p.ranks[0]]]);
  return {
    ix,
    meet,
    standIn: meet.standIn,
    replayedFor,
    ranks: replayed.size,
    rankInstructions,
  };
}

/**
 * Simulates one step of a plan on a hardware profile (costs: cost.ts, or given per program, which
 * replays a rank per program at least: alike programs may be given different costs).
 */
export function simulatePlan(
  plan: PlanFile,
  programs: ReadonlyMap<string, ProgramFile>,
  hw: HardwareProfile,
  costsOf?: (program: ProgramFile) => Float64Array,
  setup: ReplaySetup = replaySetup(plan, programs, costsOf ? 'programs' : 'alike'),
): Simulation {
  const { ix, replayedFor } = setup;
  const cores = hw.runtime === 'cpu' ? hw.gpusPerNode : Infinity;
  const shared = plan.topology.nprocPerNode > cores;
  let sizes = expectedSizes(plan, programs.values());
  if (shared) sizes = routingOnSharedCores(plan, programs.values(), sizes, cores);
  const memo = new WorkMemo(sizes, hw.compute.dtypeBytes, hw.compute.gradDtypeBytes);
  // a program replayed for another is priced alike (symmetry.ts): its costs are the other's; one
  // replayed for itself whose instructions are another's but for microbatch labels (plan-index.ts
  // alikeOf), on groups that lie as that one's do, has that one's costs too
  const priced = new Map<string, Float64Array>();
  const costs = costsOf
    ? ix.programs.map((p) => costsOf(p.file))
    : byReplayed(replayedFor, (j) => {
        const p = ix.programs[j];
        const key = `${p.alikeOf} ${groupLayout(ix, p)}`;
        let c = priced.get(key);
        if (c === undefined) priced.set(key, (c = defaultCosts(ix, p, sizes, hw, memo)));
        return c;
      });
  const host = hostIssue(hw, setup, sizes, memo);
  const run = (c: readonly Float64Array[]) => simulationOf(replayed(setup, c, host), hw);
  if (shared) return runOnSharedCores(ix, costs, run, cores);
  const slowdown = hw.efficiency?.overlapSlowdown ?? 0;
  if (!(slowdown > 0)) return run(costs);
  // compute that shares the SMs with communication: lengthen it by the overlap the first replay
  // shows, and replay once more (one correction, not a fixed point: the overlap moves a little)
  const first = replayed(setup, costs, host).kept;
  return run(
    byReplayed(replayedFor, (j) => slowOverlapped(ix.programs[j], first[j], costs[j], slowdown)),
  );
}

/** f(j) for each program replayed for itself; a program replayed for another shares its value */
function byReplayed<T>(replayedFor: Int32Array, f: (j: number) => T): T[] {
  const out: T[] = [];
  for (let j = 0; j < replayedFor.length; j++)
    out.push(replayedFor[j] < j ? out[replayedFor[j]] : f(j));
  return out;
}

/**
 * A program's costs with each compute kernel lengthened by `slowdown` × the share of it that
 * overlaps a collective's transfer (the last `cost` of its interval) on the rank's other
 * streams, as the first replay timed them.
 */
function slowOverlapped(
  p: ProgramIndex,
  k: { readonly start: Float64Array; readonly end: Float64Array },
  cost: Float64Array,
  slowdown: number,
): Float64Array {
  // typed arrays, not tuples: this runs once per replayed program over all its instructions
  const { category } = replayInfo(p);
  const from = new Float64Array(p.n); // [i] when instruction i's data starts to move or it runs
  const moving = new Int32Array(p.n); // collectives that move data, then kernels on compute
  const kernels = new Int32Array(p.n);
  let nm = 0;
  let nk = 0;
  for (let i = 0; i < p.n; i++) {
    if (category[i] === COLLECTIVE) {
      from[i] = Math.max(k.start[i], k.end[i] - cost[i]);
      if (k.end[i] > from[i]) moving[nm++] = i;
    } else if (category[i] !== MEMORY && p.stream[i] === COMPUTE && cost[i] > 0) kernels[nk++] = i;
  }
  // the union of the moving intervals, by start (the union does not depend on the order of ties)
  const byStart = moving.subarray(0, nm).sort((a, b) => from[a] - from[b]);
  const lo = new Float64Array(nm);
  const hi = new Float64Array(nm);
  let nu = 0;
  for (let q = 0; q < nm; q++) {
    const j = byStart[q];
    if (nu > 0 && from[j] <= hi[nu - 1]) hi[nu - 1] = Math.max(hi[nu - 1], k.end[j]);
    else {
      lo[nu] = from[j];
      hi[nu++] = k.end[j];
    }
  }
  const ks = kernels.subarray(0, nk).sort((a, b) => k.start[a] - k.start[b]);
  const out = Float64Array.from(cost);
  let u = 0;
  for (let q = 0; q < nk; q++) {
    const i = ks[q];
    const a = k.start[i];
    const b = k.end[i];
    while (u < nu && hi[u] <= a) u++;
    let overlap = 0;
    for (let v = u; v < nu && lo[v] < b; v++) overlap += Math.min(b, hi[v]) - Math.max(a, lo[v]);
    if (overlap > 0) out[i] = cost[i] * (1 + (slowdown * overlap) / (b - a));
  }
  return out;
}

/**
 * Routing imbalance on shared cores. The plan prices each rank's expert dispatch at the busiest
 * rank's rows, f × balanced (--moe-expected-imbalance): GPU ranks of an expert-parallel group each
 * have their own device and wait for the busiest at the next all-to-all. Ranks that share a node's
 * C cores do not wait idle: the cores of the ranks with less to do go to the others, so the
 * group's expert work takes about max(its total over the cores, the busiest rank's alone). With
 * all P ranks of the node at it, the shared-core replay already stretches balanced work by P / C,
 * so rows priced at max(1, f · C / P) × balanced give that maximum: f = 1.84 on 4 ranks of 2
 * cores prices balanced rows (the total, 4 / 2, exceeds the busiest, 1.84); on 2 ranks of 2
 * cores it keeps f. The balanced rows are the expected ones over f (before the plan's rounding).
 */
function routingOnSharedCores(
  plan: PlanFile,
  programs: Iterable<ProgramFile>,
  sizes: Map<string, number>,
  cores: number,
): Map<string, number> {
  const decoder = (plan.model.config as { text_decoder?: { moe_expected_imbalance?: number } })
    ?.text_decoder;
  const f = decoder?.moe_expected_imbalance ?? 1;
  if (!(f > 1)) return sizes;
  const share = Math.max(1, (f * cores) / plan.topology.nprocPerNode);
  const stated = new Map(plan.symbols.map((s) => [s.name, s.expected]));
  const out = new Map(sizes);
  for (const p of programs) {
    const dispatch = expertDispatches(p.instructions);
    for (const x of p.instructions) {
      if (!dispatch(x)) continue;
      const rows = (x.attrs.out_rows as string[] | undefined)?.[0];
      const expected = rows === undefined ? undefined : stated.get(rows);
      if (expected !== undefined) out.set(rows!, Math.round((expected / f) * share));
    }
  }
  return out;
}

/**
 * Whether an instruction is an expert dispatch: an all_to_all_v whose received rows moe_sort_chunks
 * then sorts by expert (a combine's rows are sorted back before it, and are the rows its rank sent).
 */
function expertDispatches(
  instructions: readonly PlanInstruction[],
): (x: PlanInstruction) => boolean {
  const sorted = new Set<number>();
  for (const x of instructions)
    if (x.op === 'moe_sort_chunks' && x.attrs.inverse === false) sorted.add(x.inputs[0]);
  return (x) => x.op === 'all_to_all_v' && sorted.has(x.outputs[0]);
}

/**
 * Shared cores: a CPU profile's gpus_per_node is the cores of a node (one rank's threads each),
 * and a node may run more ranks than that. While n instructions run at once on a node of C cores
 * (any rank, any stream: on the CPU runtime every kernel and every copy of a collective is a
 * thread's work), each progresses at min(1, C / n) of its own speed. The replay has fixed costs,
 * so the sharing is found by iteration: replay, take the load n(t) of every node from the
 * timeline (the ranks of a program run its first rank's timeline), slow each instruction by the
 * mean of max(1, n / C) over the time it ran, replay again with those costs. The step is the
 * mean of the last two replays once they agree within 0.5%, or after 12.
 */
function runOnSharedCores(
  ix: PlanIndex,
  base: readonly Float64Array[],
  run: (costs: readonly Float64Array[]) => Simulation,
  cores: number,
): Simulation {
  const perNode = ix.plan.topology.nprocPerNode;
  const nodes = Math.ceil(ix.world / perNode);
  // [program][node] its ranks there, and the nodes it has ranks on
  const count = ix.programs.map((p) => {
    const c = new Float64Array(nodes);
    for (const r of p.ranks) c[Math.floor(r / perNode)]++;
    return c;
  });
  const nodesOf = count.map((c) => range(nodes, (n) => n).filter((n) => c[n] > 0));
  let costs = base.map((c) => Float64Array.from(c));
  let sim = run(costs);
  let previous = NaN;
  for (let round = 0; round < 12; round++) {
    const load = range(nodes, (n) => nodeLoad(sim, costs, count, n, cores));
    costs = sim.ranks.map((k, j) => {
      const out = Float64Array.from(base[j]);
      for (let i = 0; i < out.length; i++) {
        if (!(base[j][i] > 0)) continue;
        const from = Math.max(k.start[i], k.end[i] - costs[j][i]);
        let slow = 1;
        for (const n of nodesOf[j]) slow = Math.max(slow, load[n].meanSlowdown(from, k.end[i]));
        out[i] = base[j][i] * slow;
      }
      return out;
    });
    previous = sim.stepSeconds;
    sim = run(costs);
    if (Math.abs(sim.stepSeconds - previous) <= 0.005 * previous) break;
  }
  return { ...sim, stepSeconds: (sim.stepSeconds + previous) / 2 };
}

const range = <T>(n: number, f: (i: number) => T): T[] => Array.from({ length: n }, (_, i) => f(i));

/** A node's load: how many instructions run at once, piecewise constant between breakpoints. */
class Load {
  /** ∫ max(1, load / cores) from the first breakpoint to each */
  private readonly F: Float64Array;
  constructor(
    private readonly at: Float64Array,
    private readonly level: Float64Array,
    private readonly cores: number,
  ) {
    this.F = new Float64Array(at.length);
    for (let k = 1; k < at.length; k++)
      this.F[k] = this.F[k - 1] + (at[k] - at[k - 1]) * this.slowdown(k - 1);
  }

  /** the mean of max(1, load / cores) over [a, b] (1 for an empty interval) */
  meanSlowdown(a: number, b: number): number {
    return b > a ? (this.integral(b) - this.integral(a)) / (b - a) : 1;
  }

  private slowdown(k: number): number {
    return Math.max(1, this.level[k] / this.cores);
  }

  /** ∫ from the first breakpoint to t (the load is 0 outside them) */
  private integral(t: number): number {
    const { at, F } = this;
    if (at.length === 0 || t <= at[0]) return 0;
    let lo = 0;
    let hi = at.length - 1;
    if (t >= at[hi]) return F[hi] + (t - at[hi]);
    while (hi - lo > 1) {
      const mid = (lo + hi) >> 1;
      if (at[mid] <= t) lo = mid;
      else hi = mid;
    }
    return F[lo] + (t - at[lo]) * this.slowdown(lo);
  }
}

/** node n's load over the step: each program's running instructions × its ranks on n */
function nodeLoad(
  sim: Simulation,
  costs: readonly Float64Array[],
  count: readonly Float64Array[],
  n: number,
  cores: number,
): Load {
  const edges: [number, number][] = [];
  sim.ranks.forEach((k, j) => {
    const w = count[j][n];
    if (w === 0) return;
    for (let i = 0; i < k.end.length; i++) {
      const from = Math.max(k.start[i], k.end[i] - costs[j][i]);
      if (k.end[i] > from) edges.push([from, w], [k.end[i], -w]);
    }
  });
  edges.sort((x, y) => x[0] - y[0]);
  const at: number[] = [];
  const level: number[] = [];
  let current = 0;
  for (const [t, d] of edges) {
    current += d;
    if (at.length && at[at.length - 1] === t) level[level.length - 1] = current;
    else {
      at.push(t);
      level.push(current);
    }
  }
  return new Load(Float64Array.from(at), Float64Array.from(level), cores);
}

/** A program's costs, its collectives priced on the groups of the first rank that runs it. */
function defaultCosts(
  ix: PlanIndex,
  p: ProgramIndex,
  sizes: ReadonlyMap<string, number>,
  hw: HardwareProfile,
  memo: WorkMemo,
): Float64Array {
  const rank = p.ranks[0];
  const perNode = ix.plan.topology.nprocPerNode;
  const node = (r: number) => Math.floor(r / perNode);
  const shapes = new Map<number, GroupShape>(); // by communicator
  const groupOf = (_: unknown, i: number): GroupShape => {
    if (p.kind[i] === GROUP) {
      const c = ix.rankComm[rank][p.collRef[p.slot[i]]];
      let g = shapes.get(c);
      if (g === undefined) {
        const ranks = c >= 0 ? [...ix.comms[c].ranks] : [rank];
        g = {
          size: ranks.length,
          nodes: new Set(ranks.map(node)).size,
          local: ranks.filter((r) => node(r) === node(rank)).length,
        };
        shapes.set(c, g);
      }
      return g;
    }
    const peer = ix.peerOf(rank, p, p.slot[i]);
    const apart = peer >= 0 && node(peer) !== node(rank);
    return { size: 2, nodes: apart ? 2 : 1, local: apart ? 1 : 2 };
  };
  // priced from the first program alike it: the same instructions, so the same work (one memo
  // entry for the class)
  return instructionCosts(ix.programs[p.alikeOf].file, hw, sizes, groupOf, memo);
}

/** A plan's step replayed at `costs`, run to its end. */
function replayed(
  setup: ReplaySetup,
  costs: readonly Float64Array[],
  host?: readonly HostIssue[],
): StepReplay {
  const replay = new StepReplay(setup, costs, host);
  replay.runAll();
  replay.assertFinished();
  return replay;
}

function simulationOf(replay: StepReplay, hw: HardwareProfile): Simulation {
  return { hardware: hw, stepSeconds: replay.stepEnd, ranks: replay.keptRanks() };
}

/**
 * What a rank's host issues (the framework's launch path): [n + 1] prefix sums of each
 * instruction's host seconds, and the instructions the host must wait at (sorted): a forward
 * expert dispatch, whose row counts the host reads back before it can post the exchange.
 */
interface HostIssue {
  readonly before: Float64Array;
  readonly syncs: Int32Array;
}

/** each replayed program's host issue, on a profile that prices the host (hardware.ts HostSide) */
function hostIssue(
  hw: HardwareProfile,
  setup: ReplaySetup,
  sizes: ReadonlyMap<string, number>,
  memo: WorkMemo,
): HostIssue[] | undefined {
  const host = pricedHost(hw);
  if (!host) return undefined;
  const { ix } = setup;
  const { dtypeBytes, gradDtypeBytes } = hw.compute;
  // programs alike but for microbatch labels (plan-index.ts alikeOf) issue alike
  const issued = new Map<number, HostIssue>();
  return byReplayed(setup.replayedFor, (j) => {
    const alike = ix.programs[j].alikeOf;
    const known = issued.get(alike);
    if (known) return known;
    const file = ix.programs[alike].file;
    const work = instructionWork(file, sizes, dtypeBytes, gradDtypeBytes, memo);
    const n = file.instructions.length;
    const dispatch = expertDispatches(file.instructions);
    const before = new Float64Array(n + 1);
    const syncs: number[] = [];
    for (let i = 0; i < n; i++) {
      const x = file.instructions[i];
      // nothing issued in the optimizer phase (a fused multi-tensor update in the framework, a
      // few launches for every parameter)
      const h = x.phase === 'optimizer' ? 0 : issueSeconds(host, work[i]);
      before[i + 1] = before[i] + h;
      if (x.phase === 'forward' && dispatch(x)) syncs.push(i);
    }
    const issue = { before, syncs: Int32Array.from(syncs) };
    issued.set(alike, issue);
    return issue;
  });
}

const OTHER = 0;
const COLLECTIVE = 1;
const MEMORY = 2;
/** blockedOn: a stream waiting for its host to pass a sync */
const HOST = -2;

/**
 * What every replay of a program reads from its instructions' attributes, worked out once per
 * program: each instruction's op category (OTHER, COLLECTIVE, MEMORY), its batch (format.ts
 * batchSpans: a batch's members are consecutive on their stream) and whether it has one.
 */
interface ReplayInfo {
  readonly category: Uint8Array;
  readonly spans: ReturnType<typeof batchSpans>;
  readonly batched: Uint8Array;
}
/** by the program's kinds: programs alike share their index's arrays (plan-index.ts alikeOf) */
const replayInfos = new WeakMap<Uint8Array, ReplayInfo>();

function replayInfo(p: ProgramIndex): ReplayInfo {
  let info = replayInfos.get(p.kind);
  if (info) return info;
  const instructions = p.file.instructions;
  const category = new Uint8Array(p.n);
  const batched = new Uint8Array(p.n);
  const codes = new Map<string, number>();
  for (let i = 0; i < p.n; i++) {
    const op = instructions[i].op;
    let c = codes.get(op);
    if (c === undefined) {
      const k = OP_TABLE[op as OpKind].category;
      c = k === 'collective' ? COLLECTIVE : k === 'memory' ? MEMORY : OTHER;
      codes.set(op, c);
    }
    category[i] = c;
    batched[i] = +(instructions[i].attrs.batch !== undefined);
  }
  info = { category, spans: batchSpans(instructions), batched };
  replayInfos.set(p.kind, info);
  return info;
}

/**
 * One replay of a step: the clock state of the replayed ranks' streams, events, collectives and
 * send/recv pairs, moved on by a worklist of (rank × stream) that may advance. `standIn[r]`: the
 * rank replayed for rank r (r itself, or the first rank of its program where the plan is
 * symmetric).
 */
class StepReplay {
  private readonly programs: readonly ProgramIndex[];
  private readonly programOf: Int32Array;
  /** [program] the program replayed for it (ReplaySetup) */
  private readonly replayedFor: Int32Array;
  /** [program] instruction times of its first rank; other ranks' only as far as the step needs */
  readonly kept: readonly {
    rank: number;
    start: Float64Array;
    end: Float64Array;
    wait: Float64Array;
  }[];
  /** [rank][instruction] start and end: a kept rank's arrays; any other's an empty one (writes past
   * its end are dropped) */
  private readonly start: Float64Array[];
  private readonly end: Float64Array[];
  /** [rank][instruction] how long it waited for its host past the time the GPU could start it
   * (a kept rank's, on a profile that prices the host) */
  private readonly hostWait: Float64Array[];
  /** the latest instruction end so far */
  stepEnd = 0;
  /** [rank] its first event's index in recordedAt */
  private readonly eventBase: Int32Array;
  /** [rank's event] when it was recorded, NaN before */
  private readonly recordedAt: Float64Array;
  /** [rank × stream] list position of the next instruction */
  private readonly pc: Int32Array;
  /** [rank × stream] when the stream is next free */
  private readonly free: Float64Array;
  /** [rank × stream] 1 while it waits in a collective, a send/recv or a batch */
  private readonly arrived: Uint8Array;
  /** [rank × stream] the event it is blocked on, -1 when none */
  private readonly blockedOn: Int32Array;
  /** the replayed ranks */
  private readonly active: readonly number[];
  private readonly meet: Meetings;
  /** collectives under way, by their smallest member: members arrived and their latest start */
  private readonly arrivals = new Map<number, { count: number; latest: number }>();
  /** transfers under way, by their smaller side: bit 1 send posted, bit 2 recv posted, the later post */
  private readonly transfers = new Map<number, { state: number; latest: number }>();
  /** [rank × stream] the batch being posted: list positions [batchAt, batchEnd), the next to
   * post, transfers not yet done, the latest transfer end so far */
  private readonly batchEnd: Int32Array;
  private readonly batchNext: Int32Array;
  private readonly batchOpen: Int32Array;
  private readonly batchDone: Float64Array;
  /** [program] what replays read from its instructions: each one's batch and whether it has one */
  private readonly infos: readonly ReplayInfo[];
  private readonly work: Worklist;
  /** [program] its host issue, when the profile prices the launch path */
  private readonly host?: readonly HostIssue[];
  /** [rank] the host: when it issued its last sync, the instruction after it, the next sync */
  private readonly hostBase: Float64Array;
  private readonly hostFrom: Int32Array;
  private readonly hostNext: Int32Array;

  constructor(
    { ix, meet, replayedFor }: ReplaySetup,
    private readonly costs: readonly Float64Array[],
    host?: readonly HostIssue[],
  ) {
    const { world, programs, programOf } = ix;
    this.programs = programs;
    this.programOf = programOf;
    this.replayedFor = replayedFor;
    this.active = [...new Set(meet.standIn)].sort((a, b) => a - b);
    this.meet = meet;
    // a program replayed for another runs its times (symmetry.ts)
    const times = byReplayed(replayedFor, (j) => ({
      start: new Float64Array(programs[j].n),
      end: new Float64Array(programs[j].n),
      wait: new Float64Array(host ? programs[j].n : 0),
    }));
    const kept = programs.map((p, j) => ({ rank: p.ranks[0], ...times[j] }));
    this.kept = kept;
    const keptOf = new Int32Array(world).fill(-1);
    kept.forEach((k, j) => {
      if (replayedFor[j] === j) keptOf[k.rank] = j;
    });
    const NOWHERE = new Float64Array(0);
    this.start = Array.from({ length: world }, (_, r) =>
      keptOf[r] >= 0 ? kept[keptOf[r]].start : NOWHERE,
    );
    this.end = Array.from({ length: world }, (_, r) =>
      keptOf[r] >= 0 ? kept[keptOf[r]].end : NOWHERE,
    );
    this.hostWait = Array.from({ length: world }, (_, r) =>
      keptOf[r] >= 0 ? kept[keptOf[r]].wait : NOWHERE,
    );
    const eventBase = new Int32Array(world + 1);
    for (let r = 0; r < world; r++) eventBase[r + 1] = eventBase[r] + programs[programOf[r]].events;
    this.eventBase = eventBase;
    this.recordedAt = new Float64Array(eventBase[world]).fill(NaN);
    this.pc = new Int32Array(world * S);
    this.free = new Float64Array(world * S);
    this.arrived = new Uint8Array(world * S);
    this.blockedOn = new Int32Array(world * S).fill(-1);
    this.batchEnd = new Int32Array(world * S);
    this.batchNext = new Int32Array(world * S);
    this.batchOpen = new Int32Array(world * S);
    this.batchDone = new Float64Array(world * S);
    this.infos = programs.map(replayInfo);
    this.work = new Worklist(world * S);
    this.host = host;
    this.hostBase = new Float64Array(host ? world : 0);
    this.hostFrom = new Int32Array(host ? world : 0);
    this.hostNext = new Int32Array(host ? world : 0);
  }

  /** every replayed stream moved until none can */
  runAll(): void {
    for (const r of this.active) for (let s = 0; s < S; s++) this.work.push(r * S + s);
    this.work.drain((rs) => this.advance(rs));
  }

  /** a stream that stopped short is a plan the verifier would refuse (a hand-edited one) */
  assertFinished(): void {
    const { programs, programOf, pc } = this;
    for (const r of this.active)
      for (let rs = r * S; rs < r * S + S; rs++) {
        const list = programs[programOf[r]].streams[rs - r * S];
        if (pc[rs] < list.length)
          // the user's file, not lfc
          throw new UserError(
            `simulation: rank ${r}'s ${STREAMS[rs - r * S]} stream stops at instruction ${list[pc[rs]]} of ${programs[programOf[r]].id}: the plan deadlocks (was it edited? recompile it)`,
          );
      }
  }

  /** the times of the first rank of each distinct program, and how its step divides (a program
   * replayed for another: the other's) */
  keptRanks(): RankTimes[] {
    const { programs, costs, kept } = this;
    const divided = byReplayed(this.replayedFor, (j) => {
      const { start, end, wait } = kept[j];
      let finish = 0;
      for (let i = 0; i < programs[j].n; i++) finish = Math.max(finish, end[i]);
      // the compute stream's gaps that its kernels' issue made
      let hostWait = 0;
      const { category } = replayInfo(programs[j]);
      for (let i = 0; i < wait.length; i++)
        if (programs[j].stream[i] === COMPUTE && category[i] !== COLLECTIVE) hostWait += wait[i];
      return {
        start,
        end,
        cost: costs[j],
        finish,
        hostWait,
        ...divide(programs[j], start, end, costs[j]),
      };
    });
    return kept.map(({ rank }, j) => ({ rank, program: programs[j].id, ...divided[j] }));
  }

  /** instruction i of rank r records its events at `at`, waking the streams blocked on them */
  private record(r: number, i: number, at: number): void {
    const { recordedAt, blockedOn, work } = this;
    const p = this.programs[this.programOf[r]];
    for (let k = p.recordStart[i]; k < p.recordStart[i + 1]; k++) {
      const e = p.recordEvents[k];
      recordedAt[this.eventBase[r] + e] = at;
      for (let t = r * S; t < r * S + S; t++)
        if (blockedOn[t] === e) {
          blockedOn[t] = -1;
          work.push(t);
        }
    }
  }

  /** instruction i of rank r ends at `at`; its stream moves on to list position `next` */
  private finish(r: number, i: number, at: number, next: number): void {
    const rs = r * S + this.programs[this.programOf[r]].stream[i];
    this.end[r][i] = at;
    if (at > this.stepEnd) this.stepEnd = at;
    this.record(r, i, at);
    this.free[rs] = at;
    this.pc[rs] = next;
    this.arrived[rs] = 0;
    this.work.push(rs);
  }

  /** the last member of a batch ends once it is posted and every transfer of the batch is done */
  private finishBatch(rs: number): void {
    if (this.batchNext[rs] < this.batchEnd[rs] || this.batchOpen[rs] > 0) return;
    const r = (rs / S) | 0;
    const list = this.programs[this.programOf[r]].streams[rs - r * S];
    const last = list[this.batchEnd[rs] - 1];
    this.finish(r, last, Math.max(this.batchDone[rs], this.free[rs]), this.batchEnd[rs]);
  }

  /** a transfer is done: an unbatched side ends; a batched side counts toward its batch */
  private transferDone(r: number, i: number, at: number): void {
    const p = this.programs[this.programOf[r]];
    const rs = r * S + p.stream[i];
    if (!this.infos[this.programOf[r]].batched[i]) {
      this.finish(r, i, at, this.pc[rs] + 1);
      return;
    }
    this.batchDone[rs] = Math.max(this.batchDone[rs], at);
    this.batchOpen[rs]--;
    this.finishBatch(rs);
  }

  /** send or recv i of rank r is posted at `at`; once both sides are, the transfer runs */
  private post(r: number, i: number, at: number): void {
    const { transfers } = this;
    const { stride } = this.meet;
    const p = this.programs[this.programOf[r]];
    this.start[r][i] = at;
    const self = r * stride + i;
    const peer = this.meet.peer(r, p, i);
    const key = Math.min(self, peer);
    let t = transfers.get(key);
    if (t === undefined) transfers.set(key, (t = { state: 0, latest: at }));
    t.latest = Math.max(t.latest, at);
    if ((t.state |= p.kind[i] === SEND ? 1 : 2) !== 3) return;
    transfers.delete(key);
    const [send, recv] = p.kind[i] === SEND ? [self, peer] : [peer, self];
    const [src, sendInstr] = [Math.floor(send / stride), send % stride];
    const [dst, recvInstr] = [Math.floor(recv / stride), recv % stride];
    const cost = Math.max(
      this.costs[this.programOf[src]][sendInstr],
      this.costs[this.programOf[dst]][recvInstr],
    );
    const done = t.latest + cost;
    this.transferDone(src, sendInstr, done);
    this.transferDone(dst, recvInstr, done);
  }

  /** the time instruction i may start on its stream (free from `t`), NaN while an event it waits
   * for is not recorded (the stream is then blocked on it) */
  private ready(rs: number, r: number, i: number, t: number): number {
    const { recordedAt } = this;
    const p = this.programs[this.programOf[r]];
    const base = this.eventBase[r];
    for (let k = p.waitStart[i]; k < p.waitStart[i + 1]; k++) {
      const when = recordedAt[base + p.waitEvents[k]];
      if (Number.isNaN(when)) {
        this.blockedOn[rs] = p.waitEvents[k];
        return NaN;
      }
      if (when > t) t = when;
    }
    return this.host ? this.issued(rs, r, i, t) : t;
  }

  /**
   * the time instruction i of rank r may start once its host has issued it (its GPU readiness t),
   * NaN while the host waits at an earlier sync; at a sync, the host waits for t
   */
  private issued(rs: number, r: number, i: number, t: number): number {
    const { before, syncs } = this.host![this.programOf[r]];
    const next = this.hostNext[r];
    const sync = next < syncs.length ? syncs[next] : Infinity;
    if (sync < i) {
      this.blockedOn[rs] = HOST;
      return NaN;
    }
    const from = this.hostFrom[r];
    if (sync === i) {
      const arrive = this.hostBase[r] + (before[i] - before[from]);
      const issue = Math.max(arrive, t) + (before[i + 1] - before[i]);
      this.hostBase[r] = issue;
      this.hostFrom[r] = i + 1;
      this.hostNext[r] = next + 1;
      for (let u = r * S; u < r * S + S; u++)
        if (this.blockedOn[u] === HOST) {
          this.blockedOn[u] = -1;
          this.work.push(u);
        }
      this.hostWait[r][i] = issue - t;
      return issue;
    }
    const issue = this.hostBase[r] + (before[i + 1] - before[from]);
    if (issue <= t) return t;
    this.hostWait[r][i] = issue - t;
    return issue;
  }

  /** posts the batch's members from batchNext on, each once its events are recorded */
  private postBatch(rs: number, r: number): void {
    const { batchNext, batchEnd, free } = this;
    const list = this.programs[this.programOf[r]].streams[rs - r * S];
    while (batchNext[rs] < batchEnd[rs]) {
      const i = list[batchNext[rs]];
      const t = this.ready(rs, r, i, free[rs]);
      if (Number.isNaN(t)) return;
      free[rs] = t;
      batchNext[rs]++;
      if (batchNext[rs] < batchEnd[rs]) {
        // not the last: it ends once posted (the runtime records its events then)
        this.end[r][i] = t;
        this.record(r, i, t);
      }
      this.post(r, i, t);
    }
    this.arrived[rs] = 1;
    this.finishBatch(rs);
  }

  /** runs stream rs's local instructions until one must wait: for an event, its group, its peer */
  private advance(rs: number): void {
    if (this.arrived[rs]) return;
    const r = (rs / S) | 0;
    // blocked in the middle of a batch
    if (this.batchNext[rs] < this.batchEnd[rs]) return this.postBatch(rs, r);
    const { pc, free } = this;
    const start = this.start[r];
    const end = this.end[r];
    const p = this.programs[this.programOf[r]];
    const cost = this.costs[this.programOf[r]];
    const list = p.streams[rs - r * S];
    for (let at = pc[rs]; at < list.length; at++) {
      const i = list[at];
      const t = this.ready(rs, r, i, free[rs]);
      if (Number.isNaN(t)) {
        pc[rs] = at;
        return;
      }
      if (p.kind[i] === LOCAL) {
        const done = t + cost[i];
        start[i] = t;
        end[i] = free[rs] = done;
        if (done > this.stepEnd) this.stepEnd = done;
        this.record(r, i, done);
        continue;
      }
      pc[rs] = at;
      this.arrived[rs] = 1;
      if (p.kind[i] === GROUP) return this.arriveAtCollective(r, p, i, t);
      if (!this.infos[this.programOf[r]].batched[i]) return this.post(r, i, t);
      return this.openBatch(rs, r, at, i);
    }
    pc[rs] = list.length;
  }

  /**
   * collective i of rank r starts at t; once every member (as its stand-in) has arrived, it ends
   * on each at the latest start plus the longest member's cost
   */
  private arriveAtCollective(r: number, p: ProgramIndex, i: number, t: number): void {
    const { costs, programs, programOf } = this;
    const { stride } = this.meet;
    this.start[r][i] = t;
    const members = this.meet.members(r, p, i);
    const key = members[0];
    let a = this.arrivals.get(key);
    if (a === undefined) this.arrivals.set(key, (a = { count: 0, latest: t }));
    a.latest = Math.max(a.latest, t);
    if (++a.count < members.length) return;
    this.arrivals.delete(key);
    let longest = 0;
    for (const code of members) {
      const m = Math.floor(code / stride);
      longest = Math.max(longest, costs[programOf[m]][code - m * stride]);
    }
    for (const code of members) {
      const m = Math.floor(code / stride);
      const mi = code - m * stride;
      this.finish(
        m,
        mi,
        a.latest + longest,
        this.pc[m * S + programs[programOf[m]].stream[mi]] + 1,
      );
    }
  }

  /** the batch that instruction i (list position `at`) starts: its members posted in turn */
  private openBatch(rs: number, r: number, at: number, i: number): void {
    const last = at + this.infos[this.programOf[r]].spans.last[i] - i + 1;
    this.arrived[rs] = 0;
    this.batchNext[rs] = at;
    this.batchEnd[rs] = last;
    this.batchOpen[rs] = last - at;
    this.batchDone[rs] = 0;
    this.postBatch(rs, r);
  }
}

/**
 * How a rank's step divides. What an instruction runs is the last `cost` of its interval: a
 * collective or send/recv waits for its peers before that, which is idle time. `computeBusy`: the
 * time the compute stream runs a kernel (an op that is not a collective); `exposedComm`: the time
 * data moves, or another stream runs a kernel (host copies), while the compute stream runs none.
 */
function divide(
  p: ProgramIndex,
  start: Float64Array,
  end: Float64Array,
  cost: Float64Array,
): { computeBusy: number; exposedComm: number; exposedByOp: Record<string, number> } {
  // typed arrays, not tuples: this runs once per replayed program over all its instructions
  const at = new Float64Array(p.n); // [i] when what instruction i runs starts
  const compute = new Int32Array(p.n); // local instructions of the compute stream, in time order
  const others = new Int32Array(p.n); // the other instructions that run for a while
  let nc = 0;
  let no = 0;
  const { category } = replayInfo(p);
  let computeBusy = 0;
  for (let i = 0; i < p.n; i++) {
    // what runs: the last `cost` of an instruction's interval (all of a local one's)
    at[i] = Math.max(start[i], end[i] - cost[i]);
    const kernel = category[i] !== COLLECTIVE;
    if (kernel && p.stream[i] === COMPUTE) {
      compute[nc++] = i;
      computeBusy += end[i] - at[i];
    } else if (end[i] > at[i]) others[no++] = i;
  }
  // by start, ties in issue order (the op that started first is charged)
  const byStart = others.subarray(0, no).sort((a, b) => at[a] - at[b] || a - b);
  let exposed = 0;
  const byOp: Record<string, number> = {};
  let c = 0; // first compute kernel that may still overlap
  let covered = -Infinity; // other time already counted up to here
  for (let q = 0; q < no; q++) {
    const i = byStart[q];
    const e0 = end[i];
    let s = Math.max(at[i], covered);
    if (s >= e0) continue;
    covered = e0;
    const before = exposed;
    while (c < nc && end[compute[c]] <= s) c++;
    for (let k = c; k < nc && at[compute[k]] < e0; k++) {
      const cs = at[compute[k]];
      if (cs > s) exposed += cs - s;
      s = Math.max(s, end[compute[k]]);
      if (s >= e0) break;
    }
    if (s < e0) exposed += e0 - s;
    const op = p.file.instructions[i].op;
    if (exposed > before) byOp[op] = (byOp[op] ?? 0) + exposed - before;
  }
  return { computeBusy, exposedComm: exposed, exposedByOp: byOp };
}
