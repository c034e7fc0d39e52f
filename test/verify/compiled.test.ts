// The plan verifier on plans the compiler emits: a data-parallel plan (one program shared by every
// replica, gradient buckets all_reduced over the rank's dp group kind) is accepted, and breaking
// its event order or one rank's collectives is caught. A gradient bucket is a buffer of its own
// spanning the bytes of the gradients it sums, so the ordering is found by bytes, not buffer ids.
import { describe, expect, it } from 'vitest';
import { compile } from '../../compiler/pipeline.js';
import type { ProgramFile } from '../../compiler/plan/format.js';
import { formatPlanProblem, verifyPlan } from '../../compiler/verify/plan-verifier.js';
import { MUTATIONS, dropCollective, withOwnProgram, withoutEvent } from './mutations.js';
import { rng } from './plan-gen.js';

describe('tiny-vlm-moe, data parallel on 4 ranks', () => {
  const { plan, programs: list } = compile({
    model: 'tiny-vlm-moe',
    nprocPerNode: 4,
    globalBatchSize: 8,
  });
  const programs = new Map<string, ProgramFile>(list.map((p) => [p.id, p]));

  it('is accepted', () => {
    expect(verifyPlan(plan, programs).map(formatPlanProblem)).toEqual([]);
  });

  it('a bucket all_reduce without the event after the last gradient write is rejected', () => {
    const p = programs.get(plan.rankPrograms[0])!;
    const sync = p.instructions.findIndex((ins) => ins.op === 'all_reduce' && ins.wait.length);
    const e = p.instructions[sync].wait[0];
    const broken = withOwnProgram({ plan, programs }, 0, (q) => withoutEvent(q, e));
    const problems = verifyPlan(broken.plan, broken.programs);
    expect(problems.map((x) => x.rule)).toContain('event-order');
    const bucket = p.buffers[p.instructions[sync].inputs[0]].name;
    expect(problems.find((x) => x.rule === 'event-order')!.message).toMatch(
      new RegExp(
        `reads ${bucket}, written by instruction \\d+ \\((grouped_)?linear_wgrad_accumulate on compute\\) as `,
      ),
    );
  });

  it("dropping one rank's gradient all_reduce is rejected", () => {
    const rand = rng(11);
    for (let k = 0; k < 10; k++) {
      const broken = dropCollective.apply({ plan, programs }, rand)!;
      const rules = verifyPlan(broken.plan.plan, broken.plan.programs).map((x) => x.rule);
      expect(rules).toContain('collective-match');
      expect(rules).toContain('progress');
    }
  });
});

describe('tiny-vlm-moe on 8 ranks: tp 2, pp 2 × vpp 2, ep 2, dp 2, distributed optimizer', () => {
  const { plan, programs: list } = compile({
    model: 'tiny-vlm-moe',
    nprocPerNode: 8,
    globalBatchSize: 16,
    parallel: { tp: 2, pp: 2, vpp: 2, ep: 2 },
    distributedOptimizer: true,
  });
  const valid = { plan, programs: new Map<string, ProgramFile>(list.map((p) => [p.id, p])) };

  it('is accepted, with one program per stage', () => {
    expect(verifyPlan(valid.plan, valid.programs).map(formatPlanProblem)).toEqual([]);
    expect(new Set(plan.rankPrograms)).toEqual(new Set(['p0', 'p1']));
  });

  // the event mutation needs an event whose waiter itself reads what the recorder wrote: a pass
  // waits once, at its first instruction, for the batch before it, so this plan has ~30 such
  // places (the generated plans of plan-verifier.test.ts give it 50)
  it.each(MUTATIONS.map((m) => [m.name, m.rule === 'event-order' ? 20 : 50, m] as const))(
    'mutation %s is rejected at ≥ %i random places',
    (_, least, m) => {
      const rand = rng(0x51 + m.name.length);
      const places = new Set<string>();
      const missed: string[] = [];
      for (let attempt = 0; places.size < 50 && attempt < 5_000; attempt++) {
        const mutated = m.apply(valid, rand);
        if (!mutated || places.has(mutated.place)) continue;
        places.add(mutated.place);
        const rules = verifyPlan(mutated.plan.plan, mutated.plan.programs).map((x) => x.rule);
        if (!rules.includes(m.rule))
          missed.push(`${mutated.place}: ${rules.join(', ') || 'accepted'}`);
      }
      expect(places.size).toBeGreaterThanOrEqual(least);
      expect(missed).toEqual([]);
      console.log(`${m.name}: ${places.size} places, all rejected by ${m.rule}`);
    },
    120_000,
  );
});

// Level 2 gives each tp rank a program of its own, and a global batch that is not a multiple of tp
// leaves the last round a mock slot (encodes nothing): its encoder backward ends earlier in the
// step. With dp 1, tp_dp_cp (the encoder's sum group) is the tp group itself, so the encoder's
// gradient sums share a communicator with the decoder's sums over tp: every rank must issue them
// in the same order (the encoder's go after the backward).
describe('level 2 with a mock slot: gradient sums in one order on every rank', () => {
  it.each([
    [2, 3, []],
    [2, 5, ['--use-distributed-optimizer']],
    [4, 6, []],
  ] as const)('tp %i, %i microbatches %j', (tp, gbs, extra) => {
    const { plan, programs: list } = compile({
      model: 'tiny-vlm-moe',
      nprocPerNode: tp,
      parallel: { tp },
      globalBatchSize: gbs,
      encoder: { heteroDp: true },
      distributedOptimizer: extra.length > 0,
    });
    expect(new Set(plan.rankPrograms).size).toBe(tp);
    const programs = new Map<string, ProgramFile>(list.map((p) => [p.id, p]));
    expect(verifyPlan(plan, programs).map(formatPlanProblem)).toEqual([]);
  });
  // one microbatch a step on 2 tp ranks: rank 1 of each pair encodes only a mock slot and never
  // writes its encoder gradients, which span many buckets here (lfc tune found it)
  it('qwen3-vl-30b-a3b, 32 ranks, tp 2, ep 4, micro-batch 4, levels 2 and 3', () => {
    for (const encoder of [{ heteroDp: true }, { fullHeteroDp: true }]) {
      const { plan, programs: list } = compile({
        model: 'qwen3-vl-30b-a3b',
        nnodes: 4,
        nprocPerNode: 8,
        parallel: { tp: 2, ep: 4 },
        sequenceParallel: true,
        seqLength: 32768,
        microBatchSize: 4,
        globalBatchSize: 64,
        precision: { bf16: true },
        encoder,
        skipVerify: true,
      });
      const programs = new Map<string, ProgramFile>(list.map((p) => [p.id, p]));
      expect(verifyPlan(plan, programs).map(formatPlanProblem)).toEqual([]);
    }
  }, 60_000);
});

describe('tiny-vlm-moe at level 3 on 4 TP ranks (p0.t2 and p0.t3 are p0.t1 relabeled)', () => {
  const { plan, programs: list } = compile({
    model: 'tiny-vlm-moe',
    nprocPerNode: 4,
    globalBatchSize: 4,
    parallel: { tp: 4 },
    encoder: { fullHeteroDp: true },
  });
  const programs = new Map<string, ProgramFile>(list.map((p) => [p.id, p]));

  it('is accepted', () => {
    expect(list.map((p) => p.id)).toEqual(['p0.t0', 'p0.t1', 'p0.t2', 'p0.t3']);
    expect(verifyPlan(plan, programs).map(formatPlanProblem)).toEqual([]);
  });

  it('an event dropped alike from a program and its relabeled sibling is found in both', () => {
    // the event-order rule skips a program alike a clean one (plan-index alikeOf), not one alike
    // a faulty one
    const p = programs.get('p0.t1')!;
    const sync = p.instructions.findIndex((ins) => ins.op === 'all_reduce' && ins.wait.length);
    expect(sync).toBeGreaterThanOrEqual(0);
    const e = p.instructions[sync].wait[0];
    const broken = new Map(programs);
    for (const id of ['p0.t1', 'p0.t2']) broken.set(id, withoutEvent(programs.get(id)!, e));
    const found = verifyPlan(plan, broken).filter((x) => x.rule === 'event-order');
    expect(new Set(found.map((x) => x.program))).toEqual(new Set(['p0.t1', 'p0.t2']));
  });
});
