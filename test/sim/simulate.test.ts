// The step simulator (compiler/sim/simulate.ts) against an independent solution of the same
// timing equations. The simulator is event driven (a worklist of streams that may move); here the
// equations are solved by sweeping every instruction of every rank until no time changes (the
// least fixed point), with random instruction costs so that no schedule is special:
//   post(i)  = max(end of the instruction before it on its stream, ends of its waited events'
//              recorders)
//   end(i)   = post + cost                                          a local instruction
//            = max over the group of post + the largest member cost  a collective
//            = max(post(send), post(recv)) + max of the two costs    an unbatched send or recv
//            = post                                                  a batch member but the last
//            = max(post, every transfer of the batch)                the last member of a batch
// On a profile that prices the framework's host (hardware.ts HostSide), each rank's host issues
// its instructions in program order, and an instruction posts no earlier than its issue:
//   issue(i) = issue(i - 1) + host(i)                                 an instruction (host 0 in
//                                                   the optimizer phase, and with no work to do)
//            = max(issue(i - 1), its post without the host) + host(i)  a forward expert dispatch
//   post(i)  = max(the post above, issue(i))
// Every instruction's start and end on the first rank of each program, and the step, must agree.

import { describe, expect, it } from 'vitest';
import { compile, type CompileOptions } from '../../compiler/pipeline.js';
import type { ProgramFile } from '../../compiler/plan/format.js';
import { loadHardware, type HostSide } from '../../compiler/sim/hardware.js';
import { expectedSizes, instructionWork } from '../../compiler/sim/cost.js';
import { replaySetup, simulatePlan } from '../../compiler/sim/simulate.js';
import { parseCompileArgs } from '../../cli/compile.js';
import { BATCH, LAYOUTS as MATRIX } from '../layouts.js';
import { buildPlanIndex, GROUP, LOCAL } from '../../compiler/verify/plan-index.js';
import { OP_TABLE, type OpKind } from '../../ir/ops.js';

const LAYOUTS: Record<string, Partial<CompileOptions>> = {
  'one rank': {},
  'dp 2, distributed optimizer': { nprocPerNode: 2, distributedOptimizer: true },
  'tp 2, sequence parallel': { nprocPerNode: 2, parallel: { tp: 2 }, sequenceParallel: true },
  'pp 2 × vpp 2, ep 2, full separation, A2A overlap, cpu offload': {
    nprocPerNode: 4,
    parallel: { pp: 2, vpp: 2, ep: 2 },
    encoder: { fullHeteroDp: true, cpuOffload: true },
    moeOverlap: { overlap: true, delayWgrad: true },
  },
  'pp 4 (1F1B), tp 2': { nprocPerNode: 8, parallel: { pp: 4, tp: 2 }, globalBatchSize: 8 },
};

/**
 * deterministic costs in (0, 1], a different schedule for every seed; collectives and copies
 * `slow` times that (long transfers that compute resumes under)
 */
function randomCosts(seed: number, slow = 1) {
  return (p: ProgramFile) => {
    let x = seed ^ p.id.length;
    return Float64Array.from(p.instructions, (ins, i) => {
      x = (Math.imul(x ^ (i + 0x9e3779b9), 0x85ebca6b) + 0x6b43a9b5) | 0;
      const kernel = OP_TABLE[ins.op as OpKind].category;
      const factor = kernel === 'collective' || kernel === 'memory' ? slow : 1;
      return (factor * ((x >>> 8) + 1)) / 2 ** 24;
    });
  };
}

/**
 * Each program's host seconds an instruction and whether the host waits for the GPU there (a
 * forward all_to_all_v whose rows moe_sort_chunks sorts by expert), at the profile's host figures.
 */
function hostOf(
  plan: Parameters<typeof buildPlanIndex>[0],
  programs: Parameters<typeof buildPlanIndex>[1],
  host: HostSide,
) {
  const sizes = expectedSizes(plan, programs.values());
  return (p: ProgramFile) => {
    const work = instructionWork(p, sizes, 2, 4);
    const sorted = new Set(
      p.instructions
        .filter((x) => x.op === 'moe_sort_chunks' && x.attrs.inverse === false)
        .map((x) => x.inputs[0]),
    );
    return p.instructions.map((x, i) => {
      const m = work[i].matmul;
      const groups = m?.kind === 'gemm' && m.groups > 1 ? m.groups : 0;
      return {
        seconds:
          x.phase === 'optimizer' || (work[i].flops === 0 && work[i].bytes === 0)
            ? 0
            : (host.opUs + groups * host.groupedGemmUs) * 1e-6,
        sync: x.op === 'all_to_all_v' && x.phase === 'forward' && sorted.has(x.outputs[0]),
      };
    });
  };
}

/** The equations of the header, solved by sweeping until nothing changes. */
function fixedPoint(
  plan: Parameters<typeof buildPlanIndex>[0],
  programs: Parameters<typeof buildPlanIndex>[1],
  costOf: (p: ProgramFile) => Float64Array,
  host?: HostSide,
) {
  const ix = buildPlanIndex(plan, programs);
  const { world } = ix;
  const prog = (r: number) => ix.programs[ix.programOf[r]];
  const cost = ix.programs.map((p) => costOf(p.file));
  const hostOfProgram = host && hostOf(plan, programs, host);
  const hostCosts = hostOfProgram && ix.programs.map((p) => hostOfProgram(p.file));
  const post = Array.from({ length: world }, (_, r) => new Float64Array(prog(r).n));
  const end = Array.from({ length: world }, (_, r) => new Float64Array(prog(r).n));
  /** [rank][instruction] when its host has issued it; its post without the host */
  const issue = Array.from({ length: world }, (_, r) => new Float64Array(prog(r).n));
  const ready = Array.from({ length: world }, (_, r) => new Float64Array(prog(r).n));
  const batchOf = (r: number, i: number) => {
    const b = prog(r).file.instructions[i].attrs.batch;
    return typeof b === 'number' ? b : -1;
  };
  /** [rank][instruction] the recorder of each waited event */
  const recorder = Array.from({ length: world }, (_, r) => {
    const p = prog(r);
    const by = new Map<number, number>();
    for (let i = 0; i < p.n; i++)
      for (let k = p.recordStart[i]; k < p.recordStart[i + 1]; k++) by.set(p.recordEvents[k], i);
    return by;
  });
  /** the members of collective i of rank r: [rank, instruction] */
  const members = (r: number, i: number): [number, number][] => {
    const p = prog(r);
    const j = p.collRef[p.slot[i]];
    const c = ix.rankComm[r][j];
    const k = ix.rankSeq[r][j]!.ord[p.slot[i]];
    return [...ix.comms[c].ranks].map((m) => [m, ix.seqOn(m, c)!.instrs[k]]);
  };
  /** a send or recv's transfer end: the pair's later post plus the larger cost */
  const transfer = (r: number, i: number): number => {
    const p = prog(r);
    const q = ix.pairs.pairOf[r][p.slot[i]];
    const [src, si, dst, di] = [
      ix.pairs.src[q],
      ix.pairs.sendInstr[q],
      ix.pairs.dst[q],
      ix.pairs.recvInstr[q],
    ];
    return (
      Math.max(post[src][si], post[dst][di]) +
      Math.max(cost[ix.programOf[src]][si], cost[ix.programOf[dst]][di])
    );
  };
  for (let changed = true, rounds = 0; changed; rounds++) {
    if (rounds > 100_000) throw new Error('no fixed point');
    changed = false;
    const set = (a: Float64Array, i: number, v: number) => {
      if (a[i] !== v) {
        a[i] = v;
        changed = true;
      }
    };
    for (let r = 0; r < world; r++) {
      const p = prog(r);
      if (hostCosts) {
        const h = hostCosts[ix.programOf[r]];
        let t = 0;
        for (let i = 0; i < p.n; i++) {
          t = (h[i].sync ? Math.max(t, ready[r][i]) : t) + h[i].seconds;
          set(issue[r], i, t);
        }
      }
      for (const list of p.streams) {
        let free = 0;
        list.forEach((i, at) => {
          let t = free;
          for (let k = p.waitStart[i]; k < p.waitStart[i + 1]; k++)
            t = Math.max(t, end[r][recorder[r].get(p.waitEvents[k])!]);
          set(ready[r], i, t);
          t = Math.max(t, issue[r][i]);
          set(post[r], i, t);
          let e: number;
          if (p.kind[i] === LOCAL) e = t + cost[ix.programOf[r]][i];
          else if (p.kind[i] === GROUP) {
            const ms = members(r, i);
            e =
              Math.max(...ms.map(([m, mi]) => post[m][mi])) +
              Math.max(...ms.map(([m, mi]) => cost[ix.programOf[m]][mi]));
          } else if (batchOf(r, i) < 0) e = transfer(r, i);
          else if (at + 1 < list.length && batchOf(r, list[at + 1]) === batchOf(r, i)) e = t;
          else {
            e = t;
            for (let k = at; k >= 0 && batchOf(r, list[k]) === batchOf(r, i); k--)
              e = Math.max(e, transfer(r, list[k]));
          }
          set(end[r], i, e);
          free = e;
        });
      }
    }
  }
  let step = 0;
  for (let r = 0; r < world; r++) for (const e of end[r]) step = Math.max(step, e);
  return { post, end, step, ready };
}

/**
 * Exposed communication by elementary segments: between consecutive interval endpoints, a
 * segment counts when some transfer or non-compute kernel covers it and no compute kernel does.
 */
function exposedByBruteForce(
  p: ProgramFile,
  start: Float64Array,
  end: Float64Array,
  cost: Float64Array,
): number {
  const compute: [number, number][] = [];
  const other: [number, number][] = [];
  p.instructions.forEach((x, i) => {
    const runs: [number, number] = [Math.max(start[i], end[i] - cost[i]), end[i]];
    const kernel = OP_TABLE[x.op as OpKind].category !== 'collective';
    (kernel && x.stream === 'compute' ? compute : other).push(runs);
  });
  const points = [...new Set([...compute, ...other].flat())].sort((a, b) => a - b);
  let total = 0;
  for (let k = 0; k + 1 < points.length; k++) {
    const mid = (points[k] + points[k + 1]) / 2;
    const inside = (xs: [number, number][]) => xs.some(([a, b]) => a <= mid && mid < b);
    if (inside(other) && !inside(compute)) total += points[k + 1] - points[k];
  }
  return total;
}

const h800 = { ...loadHardware('h800'), host: undefined };
/** h800 without its compute slowdown under communication (that is a second replay, tested below) */
const unshared = { ...h800, efficiency: { ...h800.efficiency!, overlapSlowdown: 0 } };
/** a host as slow as the random costs' kernels, so that it binds (0.2 s an instruction, 0.05 s
 * an expert GEMM) */
const slowHost: HostSide = { opUs: 2e5, groupedGemmUs: 5e4 };

describe.each([
  ['', undefined],
  [', a host that binds', slowHost],
] as const)('the step simulator solves the timing equations%s', (_, host) => {
  const hw = { ...unshared, host };
  it.each(Object.keys(LAYOUTS))('%s', (name) => {
    const result = compile({
      model: 'tiny-vlm-moe',
      microBatchSize: 1,
      globalBatchSize: 4,
      ...LAYOUTS[name],
    } as CompileOptions);
    const programs = new Map(result.programs.map((p) => [p.id, p]));
    for (const [seed, slow] of [
      [1, 1],
      [2, 1],
      [3, 20],
    ]) {
      const costs = randomCosts(seed, slow);
      const sim = simulatePlan(result.plan, programs, hw, costs);
      const want = fixedPoint(result.plan, programs, costs, host);
      expect(sim.stepSeconds).toBeCloseTo(want.step, 9);
      if (host) {
        expect(sim.stepSeconds).toBeGreaterThan(fixedPoint(result.plan, programs, costs).step);
        expect(Math.max(...sim.ranks.map((r) => r.hostWait))).toBeGreaterThan(0);
      }
      // the expert layout's host waits at its dispatches
      if (host && name.includes('ep 2'))
        for (const p of programs.values())
          expect(hostOf(result.plan, programs, host)(p).some((x) => x.sync)).toBe(true);
      expect(sim.ranks.map((r) => r.program).sort()).toEqual([...programs.keys()].sort());
      for (const r of sim.ranks) {
        for (let i = 0; i < r.start.length; i++) {
          expect(r.start[i]).toBeCloseTo(want.post[r.rank][i], 9);
          expect(r.end[i]).toBeCloseTo(want.end[r.rank][i], 9);
        }
        expect(r.computeBusy).toBeGreaterThan(0);
        expect(r.computeBusy + r.exposedComm).toBeLessThanOrEqual(sim.stepSeconds * (1 + 1e-12));
        const split = exposedByBruteForce(
          programs.get(r.program)!,
          r.start,
          r.end,
          costs(programs.get(r.program)!),
        );
        expect(r.exposedComm).toBeCloseTo(split, 9);
        const byOp = Object.values(r.exposedByOp).reduce((a, b) => a + b, 0);
        expect(byOp).toBeCloseTo(r.exposedComm, 9);
        // the compute stream's waits for its host: each kernel's post past the GPU's own
        const p = programs.get(r.program)!;
        let waits = 0;
        p.instructions.forEach((x, i) => {
          if (x.stream === 'compute' && OP_TABLE[x.op as OpKind].category !== 'collective')
            waits += want.post[r.rank][i] - want.ready[r.rank][i];
        });
        expect(r.hostWait).toBeCloseTo(waits, 9);
      }
    }
  });
});

describe('compute that shares the SMs with communication', () => {
  it('is lengthened by the slowdown × the share of it that overlaps a transfer, then replayed', () => {
    const result = compile({
      model: 'tiny-vlm-moe',
      microBatchSize: 1,
      globalBatchSize: 4,
      ...LAYOUTS['pp 2 × vpp 2, ep 2, full separation, A2A overlap, cpu offload'],
    } as CompileOptions);
    const programs = new Map(result.programs.map((p) => [p.id, p]));
    const costs = randomCosts(5, 4);
    const slowdown = 0.5;
    const hw = { ...h800, efficiency: { ...h800.efficiency!, overlapSlowdown: slowdown } };
    const sim = simulatePlan(result.plan, programs, hw, costs);
    // the same by hand: the equations' times at the given costs, then each compute kernel's
    // overlap with the transfers (the last `cost` of a collective) of its rank, clipped and merged
    const first = fixedPoint(result.plan, programs, costs);
    const ix = buildPlanIndex(result.plan, programs);
    let lengthened = 0;
    const slowed = new Map<string, Float64Array>();
    for (const p of ix.programs) {
      const r = p.ranks[0];
      const c = costs(p.file);
      const out = Float64Array.from(c);
      const transfers: [number, number][] = [];
      p.file.instructions.forEach((x, i) => {
        if (OP_TABLE[x.op as OpKind].category === 'collective')
          transfers.push([Math.max(first.post[r][i], first.end[r][i] - c[i]), first.end[r][i]]);
      });
      p.file.instructions.forEach((x, i) => {
        const category = OP_TABLE[x.op as OpKind].category;
        if (category === 'collective' || category === 'memory' || x.stream !== 'compute') return;
        const [a, b] = [first.post[r][i], first.end[r][i]];
        const clipped = transfers
          .map(([s, e]) => [Math.max(a, s), Math.min(b, e)])
          .filter(([s, e]) => e > s)
          .sort((u, v) => u[0] - v[0]);
        let covered = 0;
        let upTo = -Infinity;
        for (const [s, e] of clipped) {
          if (e <= upTo) continue;
          covered += e - Math.max(s, upTo);
          upTo = e;
        }
        if (covered > 0) {
          out[i] = c[i] * (1 + (slowdown * covered) / (b - a));
          lengthened++;
        }
      });
      slowed.set(p.file.id, out);
    }
    expect(lengthened).toBeGreaterThan(0);
    const want = fixedPoint(result.plan, programs, (p) => slowed.get(p.id)!);
    expect(sim.stepSeconds).toBeCloseTo(want.step, 9);
    expect(sim.stepSeconds).toBeGreaterThan(first.step);
  });
});

describe('one rank per program, or per class of alike programs', () => {
  // every layout of the equivalence matrix, and the article's 32-rank line at level 3, replayed
  // on stand-ins (compiler/sim/symmetry.ts) and on every rank: the same times, instruction by
  // instruction; each is symmetric, so at most one rank per program is replayed, and level 3's
  // TP ranks that differ only in their encoded slots are replayed once per class
  const cases = [
    ...MATRIX.map((l) => ({
      name: l.name,
      argv: [l.model, '--nproc-per-node', String(l.ranks), ...BATCH, ...l.flags],
      replays: undefined as number | undefined,
    })),
    {
      name: 'article level 3 (32 ranks)',
      argv: [
        'qwen3-vl-moe-tiny',
        ...['--nnodes', '4', '--nproc-per-node', '8', '--tp', '4', '--pp', '2', '--ep', '4'],
        ...['--global-batch-size', '64', '--use-distributed-optimizer', '--bf16'],
        '--enable-full-hetero-dp',
      ],
      // p0.t0 (the root), p0.t1 for p0.t1–t3, p1.t0 (the root's peer), p1.t1 for p1.t1–t3
      replays: 4,
    },
  ];
  it.each(cases)('$name', ({ name, argv, replays }) => {
    const result = compile({ ...parseCompileArgs(argv).options, skipVerify: true });
    const programs = new Map(result.programs.map((p) => [p.id, p]));
    const quotient = replaySetup(result.plan, programs);
    const all = replaySetup(result.plan, programs, 'all');
    const replayed = new Set(quotient.standIn).size;
    // every one of these plans is symmetric: at most one rank replayed per program
    expect(replayed).toBeLessThanOrEqual(result.programs.length);
    if (replays !== undefined) expect(replayed).toBe(replays);
    if (name === 'level3-tp4') expect(replayed).toBe(2); // the root, and p0.t1 for t1–t3
    for (const hw of [h800, unshared]) {
      const a = simulatePlan(result.plan, programs, hw, undefined, quotient);
      const b = simulatePlan(result.plan, programs, hw, undefined, all);
      expect(a.stepSeconds).toBe(b.stepSeconds);
      a.ranks.forEach((r, j) => {
        expect(r.rank).toBe(b.ranks[j].rank);
        expect(r.program).toBe(b.ranks[j].program);
        expect(r.start).toEqual(b.ranks[j].start);
        expect(r.end).toEqual(b.ranks[j].end);
        expect(r.cost).toEqual(b.ranks[j].cost);
        expect(r.exposedComm).toBe(b.ranks[j].exposedComm);
      });
    }
  });

  it("the verifier's index (CompileResult.planIndex) replays as a fresh one", () => {
    const argv = ['tiny-vlm-moe', '--nproc-per-node', '4', ...BATCH, '--tp', '4'];
    const result = compile(parseCompileArgs([...argv, '--enable-full-hetero-dp']).options);
    expect(result.planIndex).toBeDefined();
    const programs = new Map(result.programs.map((p) => [p.id, p]));
    const reused = replaySetup(result.plan, programs, 'alike', result.planIndex);
    expect(reused.ix).toBe(result.planIndex);
    const a = simulatePlan(result.plan, programs, h800, undefined, reused);
    const b = simulatePlan(result.plan, programs, h800);
    expect(a.stepSeconds).toBe(b.stepSeconds);
    a.ranks.forEach((r, j) => expect(r.end).toEqual(b.ranks[j].end));
    // an unverified compile has none
    expect(compile({ ...parseCompileArgs(argv).options, skipVerify: true }).planIndex).toBe(
      undefined,
    );
  });

  it('a plan read back from disk (no shared objects) finds the same classes', () => {
    const argv = ['tiny-vlm-moe', '--nproc-per-node', '4', ...BATCH, '--tp', '4'];
    const result = compile({
      ...parseCompileArgs([...argv, '--enable-full-hetero-dp']).options,
      skipVerify: true,
    });
    const copies = new Map(result.programs.map((p) => [p.id, structuredClone(p)]));
    const quotient = replaySetup(result.plan, copies);
    expect([...quotient.replayedFor]).toEqual([0, 1, 1, 1]);
    // without the classes, one rank per program: all 4
    expect(replaySetup(result.plan, copies, 'programs').ranks).toBe(4);
  });
});

describe('a plan that deadlocks', () => {
  it('is refused naming the rank, stream and instruction where it stops', () => {
    const result = compile({
      model: 'tiny-vlm-moe',
      microBatchSize: 1,
      globalBatchSize: 4,
      nprocPerNode: 2,
      parallel: { pp: 2 },
    } as CompileOptions);
    // a send whose tag no recv waits for: the pipeline never gets its activation
    const programs = new Map(result.programs.map((p) => [p.id, structuredClone(p) as ProgramFile]));
    const p0 = programs.get('p0')!;
    const send = p0.instructions.find((x) => x.op === 'send')!;
    (send.attrs as Record<string, unknown>).tag = 99_999;
    expect(() => simulatePlan(result.plan, programs, loadHardware('h800'))).toThrow(
      /simulation: rank \d's \w+ stream stops at instruction \d+ of p\d: the plan deadlocks/,
    );
  });
});
