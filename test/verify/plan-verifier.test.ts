// The plan verifier accepts generated valid multi-rank plans (pipeline × data parallel, shared
// programs, every collective kind), rejects hand-made plans that break one rule each, and rejects
// every plan broken by a mutation that always breaks a plan, applied at ≥ 50 random places.
import { describe, expect, it } from 'vitest';
import type { PlanFile, ProgramFile } from '../../compiler/plan/format.js';
import {
  assertPlanValid,
  formatPlanProblem,
  PlanVerifyError,
  verifyPlan,
  type PlanProblem,
} from '../../compiler/verify/plan-verifier.js';
import { MUTATIONS } from './mutations.js';
import {
  generatePlan,
  planFile,
  ProgramDraft,
  rng,
  type GenOptions,
  type GeneratedPlan,
} from './plan-gen.js';

/** A layout drawn from the seed: 1–4 stages, 1–6 replicas in blocks, 1–8 microbatches. */
function randomLayout(seed: number): GenOptions {
  const rand = rng(seed);
  const pp = 1 + Math.floor(rand() * 4);
  const dp = [1, 2, 3, 4, 6][Math.floor(rand() * 5)];
  const blocks = [1, 2, 3, 4, 6].filter((b) => dp % b === 0);
  const block = blocks[Math.floor(rand() * blocks.length)];
  return {
    seed,
    pp,
    dp,
    block,
    microbatches: 1 + Math.floor(rand() * 8),
    layers: 1 + Math.floor(rand() * 3),
    groupRefs: rand() < 0.5 ? 'names' : 'kinds',
  };
}

const LAYOUTS: GenOptions[] = [
  { seed: 1, pp: 2, dp: 2, block: 1, microbatches: 3, layers: 2 },
  { seed: 2, pp: 3, dp: 4, block: 2, microbatches: 5, layers: 2 },
  { seed: 3, pp: 4, dp: 2, block: 1, microbatches: 6, layers: 3 },
  { seed: 4, pp: 1, dp: 4, block: 4, microbatches: 2, layers: 2 },
  { seed: 4, pp: 1, dp: 4, block: 4, microbatches: 2, layers: 2, groupRefs: 'kinds' },
  { seed: 5, pp: 2, dp: 6, block: 3, microbatches: 4, layers: 1 },
  { seed: 5, pp: 3, dp: 6, block: 2, microbatches: 4, layers: 2, groupRefs: 'kinds' },
  { seed: 6, pp: 4, dp: 1, block: 1, microbatches: 4, layers: 2 },
  ...Array.from({ length: 12 }, (_, k) => randomLayout(100 + k)),
];
const VALID: GeneratedPlan[] = LAYOUTS.map(generatePlan);

const rules = (problems: readonly PlanProblem[]) => [...new Set(problems.map((p) => p.rule))];
const show = (problems: readonly PlanProblem[]) => problems.slice(0, 5).map(formatPlanProblem);

describe('valid plans', () => {
  it.each(LAYOUTS.map((o, k) => [JSON.stringify(o), k] as const))('accepts %s', (_, k) => {
    const { plan, programs } = VALID[k];
    expect(show(verifyPlan(plan, programs))).toEqual([]);
    expect(() => assertPlanValid(plan, programs)).not.toThrow();
  });
  it('the layouts share programs and use every kind of collective', () => {
    const ops = new Set<string>();
    for (const { programs } of VALID)
      for (const p of programs.values()) for (const ins of p.instructions) ops.add(ins.op);
    for (const op of [
      'all_reduce',
      'all_gather',
      'reduce_scatter',
      'broadcast',
      'all_to_all_v',
      'gather_v',
      'send',
      'recv',
    ])
      expect(ops).toContain(op);
    expect(VALID.some((g) => g.programs.size < g.plan.rankPrograms.length)).toBe(true);
  });
});

describe.each(MUTATIONS.map((m) => [m.name, m] as const))('mutation: %s', (_, m) => {
  it(`is rejected by ${m.rule} at ≥ 50 random places`, () => {
    const rand = rng(0xabc + m.name.length);
    const places = new Set<string>();
    const missed: string[] = [];
    const seen = new Map<string, number>(); // rule → mutated plans it also fired on
    const also = () =>
      [...seen].map(([rule, count]) => `${rule} ${count}`).join(', ') || 'no other rule';
    for (let attempt = 0; places.size < 50 && attempt < 20_000; attempt++) {
      const k = Math.floor(rand() * VALID.length);
      const mutated = m.apply(VALID[k], rand);
      if (!mutated || places.has(`${k}/${mutated.place}`)) continue;
      places.add(`${k}/${mutated.place}`);
      const problems = verifyPlan(mutated.plan.plan, mutated.plan.programs);
      for (const rule of rules(problems))
        if (rule !== m.rule) seen.set(rule, (seen.get(rule) ?? 0) + 1);
      if (!rules(problems).includes(m.rule))
        missed.push(
          `${LAYOUTS[k].seed} ${mutated.place}: ${rules(problems).join(', ') || 'accepted'}`,
        );
    }
    expect(places.size).toBeGreaterThanOrEqual(50);
    expect(missed).toEqual([]);
    console.log(`${m.name}: ${places.size} places, all rejected by ${m.rule}; ${also()}`);
  });
});

// ---- hand-made plans, one broken rule each ------------------------------------------------------

type Build = (p: ProgramDraft, rank: number) => void;

/** One program per rank, built by `build(draft, rank)`. */
function perRank(world: number, groups: { name: string; ranks: number[] }[], build: Build) {
  const programs = new Map<string, ProgramFile>();
  for (let r = 0; r < world; r++) {
    const d = new ProgramDraft(`r${r}`);
    build(d, r);
    programs.set(`r${r}`, d.build());
  }
  const plan: PlanFile = planFile(
    Array.from({ length: world }, (_, r) => `r${r}`),
    groups,
  );
  return { plan, programs };
}

const pair = [{ name: 'g', ranks: [0, 1] }];
const check = (g: { plan: PlanFile; programs: Map<string, ProgramFile> }) =>
  verifyPlan(g.plan, g.programs);

describe('hand-made plans', () => {
  it('accepts an all_reduce between two ranks ordered by events', () => {
    const problems = check(
      perRank(2, pair, (d) => {
        const x = d.buf('x', 'arena', 'f32', [8]);
        const y = d.buf('y', 'arena', 'f32', [8]);
        const [e1, e2] = [d.event(), d.event()];
        d.add('compute', 'constant', [], [x], {}, { record: [e1] });
        d.add(
          'comm',
          'all_reduce',
          [x],
          [y],
          { group: 'g', group_size: 2 },
          { wait: [e1], record: [e2] },
        );
        d.add('compute', 'gelu', [y], [x], {}, { wait: [e2] });
      }),
    );
    expect(show(problems)).toEqual([]);
  });

  it('collective-match: group_size differs from the group', () => {
    const problems = check(
      perRank(2, pair, (d) => {
        const x = d.buf('x', 'param', 'f32', [8]);
        d.add('comm', 'all_reduce', [x], [x], { group: 'g', group_size: 4 });
      }),
    );
    expect(rules(problems)).toEqual(['collective-match']);
    expect(problems[0].message).toMatch(/group_size is 4; group g has 2 ranks/);
  });

  it('collective-match: a rank issues collectives on a group it is not in', () => {
    const problems = check(
      perRank(3, pair, (d, r) => {
        const x = d.buf('x', 'param', 'f32', [8]);
        if (r < 2) d.add('comm', 'all_reduce', [x], [x], { group: 'g', group_size: 2 });
        else d.add('comm', 'broadcast', [x], [x], { group: 'g', group_size: 2, root: 0 });
      }),
    );
    expect(problems.find((p) => p.rule === 'collective-match')?.ranks).toEqual([2]);
    expect(problems.some((p) => /not a member/.test(p.message))).toBe(true);
  });

  it('collective-match: a root outside the group, and an unknown group', () => {
    const problems = check(
      perRank(2, pair, (d) => {
        const x = d.buf('x', 'param', 'f32', [8]);
        d.add('comm', 'broadcast', [x], [x], { group: 'g', group_size: 2, root: 2 });
        d.add('comm', 'all_reduce', [x], [x], { group: 'h', group_size: 2 });
      }),
    );
    const messages = problems.filter((p) => p.rule === 'collective-match').map((p) => p.message);
    expect(messages.sort()).toEqual([
      expect.stringMatching(/group 'h' is neither in plan.groups nor a kind of plan.rankGroups/),
      expect.stringMatching(/group 'h' is neither in plan.groups nor a kind of plan.rankGroups/),
      expect.stringMatching(/root 2 is not a group rank of g/),
      expect.stringMatching(/root 2 is not a group rank of g/),
    ]);
  });

  it('collective-match: variable rows may differ, but not the row width', () => {
    const gather = (width: number) =>
      perRank(2, pair, (d, r) => {
        const x = d.buf('x', 'arena', 'f32', [`${r + 1}*S`, r === 1 ? width : 4]);
        const y = d.buf('y', 'arena', 'f32', ['4*S', 4]);
        d.add('comm', 'gather_v', [x], [y], {
          group: 'g',
          group_size: 2,
          root: 0,
          out_rows: ['4*S'],
        });
      });
    expect(show(check(gather(4)))).toEqual([]);
    expect(rules(check(gather(8)))).toEqual(['collective-match']);
  });

  it('collective-match: each (group, stream) is its own communicator', () => {
    // the two streams' collectives on g are issued in either order: separate communicators
    const ok = check(
      perRank(2, pair, (d, r) => {
        const x = { comm: d.buf('x', 'param', 'f32', [8]), copy: d.buf('y', 'param', 'f32', [8]) };
        const streams = r === 0 ? (['comm', 'copy'] as const) : (['copy', 'comm'] as const);
        for (const s of streams)
          d.add(s, 'all_reduce', [x[s]], [x[s]], { group: 'g', group_size: 2 });
      }),
    );
    expect(ok).toEqual([]);
    // …but on one stream, the sequences must agree
    const bad = check(
      perRank(2, pair, (d, r) => {
        const x = d.buf('x', 'param', 'f32', [8]);
        d.add('comm', 'all_reduce', [x], [x], { group: 'g', group_size: 2 });
        if (r === 0) d.add('copy', 'all_reduce', [x], [x], { group: 'g', group_size: 2 });
        else d.add('comm', 'all_reduce', [x], [x], { group: 'g', group_size: 2 });
      }),
    );
    expect(rules(bad)).toContain('collective-match');
  });

  it('p2p-match: a recv of another shape than is sent', () => {
    const problems = check(
      perRank(2, [], (d, r) => {
        const x = d.buf('x', 'arena', 'bf16', ['S', 8]);
        if (r === 0) d.add('comm', 'send', [x], [], { peer: 1, tag: 7 });
        else d.add('comm', 'recv', [], [x], { peer: 0, tag: 7, dtype: 'bf16', shape: ['S', '16'] });
      }),
    );
    expect(rules(problems)).toEqual(['p2p-match']);
    expect(problems[0].message).toMatch(
      /receives bf16\[S, 16\] from rank 0 \(tag 7\), which sends bf16\[S, 8\]/,
    );
  });

  it('p2p-match: two sends with one tag', () => {
    const problems = check(
      perRank(2, [], (d, r) => {
        const x = d.buf('x', 'arena', 'f32', [8]);
        for (let k = 0; k < 2; k++) {
          if (r === 0) d.add('comm', 'send', [x], [], { peer: 1, tag: 1 });
          else d.add('comm', 'recv', [], [x], { peer: 0, tag: 1, dtype: 'f32', shape: ['8'] });
        }
      }),
    );
    expect(problems.filter((p) => p.rule === 'p2p-match').map((p) => p.message)).toEqual([
      'more than one send from rank 0 to rank 1 with tag 1',
    ]);
  });

  it('event-order: an event recorded twice, one waited and never recorded', () => {
    const problems = check(
      perRank(1, [], (d) => {
        const [e, f] = [d.event(), d.event()];
        const x = d.buf('x', 'arena', 'f32', [8]);
        d.add('compute', 'constant', [], [x], {}, { record: [e] });
        d.add('compute', 'gelu', [x], [x], {}, { record: [e] });
        d.add('copy', 'offload', [x], [], {}, { wait: [e, f] });
      }),
    );
    expect(problems.filter((p) => p.rule === 'event-order').map((p) => p.message)).toEqual([
      'records event 0, already recorded by instruction 0',
      'waits for event 1, which no instruction records',
    ]);
  });

  it('event-order: a read through a view, on another stream, with no event', () => {
    const problems = check(
      perRank(1, [], (d) => {
        const x = d.buf('x', 'arena', 'f32', [8]);
        d.buffers.push({ ...d.buffers[x], id: 1, name: 'x.view', shape: ['2', '4'], viewOf: x });
        d.add('compute', 'constant', [], [x], {});
        d.add('copy', 'offload', [1], [], {});
      }),
    );
    expect(rules(problems)).toEqual(['event-order']);
    expect(problems[0].message).toMatch(
      /reads x.view \(a view of x\), written by instruction 0 \(constant on compute\)/,
    );
  });

  it('event-order: arena bytes reused on another stream with no event (by bytes, not buffer)', () => {
    const problems = check(
      perRank(2, [], (d, r) => {
        const a = d.buf('a', 'arena', 'f32', [8]);
        d.buffers.push({ ...d.buffers[a], id: 1, name: 'b' }); // b is placed on a's bytes
        if (r === 0) d.add('comm', 'send', [a], [], { peer: 1, tag: 0 });
        else d.add('comm', 'recv', [], [a], { peer: 0, tag: 0, dtype: 'f32', shape: ['8'] });
        d.add('compute', 'constant', [], [1]);
      }),
    );
    expect(problems.map((p) => [p.rule, p.ranks, p.message])).toEqual([
      [
        'event-order',
        [0],
        'writes b, read by instruction 0 (send on comm) as a, with no event ordering the write after that read',
      ],
      [
        'event-order',
        [1],
        'writes b, written by instruction 0 (recv on comm) as a, with no event ordering the two writes',
      ],
    ]);
  });

  it('event-order: a write over a buffer another stream still reads (WAR)', () => {
    const problems = check(
      perRank(2, pair, (d) => {
        const g = d.buf('grad', 'grad', 'f32', [8]);
        const y = d.buf('y', 'arena', 'f32', [8]);
        const dw = d.buf('dw', 'arena', 'f32', [8]);
        d.add('comm', 'all_reduce', [g], [y], { group: 'g', group_size: 2 });
        d.add('compute', 'grad_accumulate', [dw, g], []);
      }),
    );
    expect(rules(problems)).toEqual(['event-order']);
    expect(problems[0].message).toMatch(
      /writes grad, read by instruction 0 \(all_reduce on comm\)/,
    );
  });

  it('progress: two ranks that both send first deadlock (send and recv meet)', () => {
    const problems = check(
      perRank(2, [], (d, r) => {
        const x = d.buf('x', 'arena', 'f32', [8]);
        const y = d.buf('y', 'arena', 'f32', [8]);
        d.add('comm', 'send', [x], [], { peer: 1 - r, tag: r });
        d.add('comm', 'recv', [], [y], { peer: 1 - r, tag: 1 - r, dtype: 'f32', shape: ['8'] });
      }),
    );
    expect(rules(problems)).toEqual(['progress']);
    expect(problems.map((p) => [p.ranks, p.instruction])).toEqual([
      [[0], 0],
      [[1], 0],
    ]);
    expect(problems[0].message).toMatch(
      /waits for rank 1 to reach its recv \(instruction 1, tag 0\); rank 1 is blocked at comm instruction 0 \(send\)/,
    );
  });

  it('progress: two groups entered in opposite orders deadlock', () => {
    const groups = [
      { name: 'a', ranks: [0, 1] },
      { name: 'b', ranks: [0, 1].reverse() },
    ];
    const problems = check(
      perRank(2, groups, (d, r) => {
        const x = d.buf('x', 'param', 'f32', [8]);
        const order = r === 0 ? ['a', 'b'] : ['b', 'a'];
        for (const group of order) d.add('comm', 'all_reduce', [x], [x], { group, group_size: 2 });
      }),
    );
    expect(rules(problems)).toEqual(['progress']);
    expect(problems[0].message).toMatch(
      /collective 0 on a waits for 1 of its 2 ranks: rank 1 is blocked at comm instruction 0/,
    );
  });

  it('progress: a wait for an event recorded later on the same stream', () => {
    const problems = check(
      perRank(1, [], (d) => {
        const e = d.event();
        const x = d.buf('x', 'arena', 'f32', [8]);
        d.add('compute', 'constant', [], [x], {}, { wait: [e] });
        d.add('compute', 'gelu', [x], [x], {}, { record: [e] });
      }),
    );
    expect(rules(problems)).toEqual(['progress']);
    expect(problems[0].message).toMatch(
      /waits for event 0, recorded by instruction 1 \(gelu on compute\), which never completes/,
    );
  });

  it('group kinds: one shared program, its dp collective resolved per rank by rankGroups', () => {
    // 4 ranks, dp groups {0, 1} and {2, 3}, all running program p
    const d = new ProgramDraft('p');
    const x = d.buf('x', 'grad', 'f32', [8]);
    d.add('comm', 'all_reduce', [x], [x], { group: 'dp', group_size: 2 });
    const programs = new Map([['p', d.build()]]);
    const groups = [
      { name: 'dp[0]', ranks: [0, 1] },
      { name: 'dp[1]', ranks: [2, 3] },
    ];
    const plan = (dp: number[]) => planFile(['p', 'p', 'p', 'p'], groups, { rankGroups: { dp } });
    expect(show(verifyPlan(plan([0, 0, 1, 1]), programs))).toEqual([]);
    // rank 3 is pointed at dp[0], which does not hold it: not a member, and dp[1] never completes
    const problems = verifyPlan(plan([0, 0, 1, 0]), programs);
    expect(problems.find((p) => /not a member/.test(p.message))?.ranks).toEqual([3]);
    expect(rules(problems)).toEqual(['collective-match', 'progress']);
  });

  it('structure: a missing program and an unknown op', () => {
    const g = perRank(2, [], (d) => {
      d.add('compute', 'frobnicate', [], [], {});
    });
    g.programs.delete('r1');
    const problems = check(g);
    expect(problems.filter((p) => p.rule === 'structure').map((p) => p.message)).toEqual([
      "unknown op 'frobnicate'",
      "program 'r1' is missing from the plan",
    ]);
  });

  it('assertPlanValid names the first problems', () => {
    const g = perRank(2, pair, (d, r) => {
      const x = d.buf('x', 'param', 'f32', [8 + r]);
      d.add('comm', 'all_reduce', [x], [x], { group: 'g', group_size: 2 });
    });
    expect(() => assertPlanValid(g.plan, g.programs)).toThrow(PlanVerifyError);
    expect(() => assertPlanValid(g.plan, g.programs)).toThrow(
      /\[collective-match\] rank 1 program r1 instruction 0 \(all_reduce on comm\): collective 0 on g: issues all_reduce of f32 × 9 where rank 0 \(group rank 0\) issues all_reduce of f32 × 8/,
    );
  });
});
