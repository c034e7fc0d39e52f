// Activation memory policies (compiler/emit/activations.ts) on tiny-vlm-moe: selective recompute
// of each module, full recompute, and offload of each named tensor. Each plan is accepted by the
// memory checker and the plan verifier (collectives issued again still match across the ranks of
// their groups), keeps fewer bytes from forward to backward than the plan without the policy, and
// never has a higher liveness peak; recomputed instructions are exact copies of their forward
// instructions; and one rank trains two steps to bit-identical losses and parameters.
//
// The programs are emitted from the graph compile() returns, with the options compile() gives
// emitProgram (a first test checks that they reproduce its program without a policy).
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { OFFLOAD_TENSORS, RECOMPUTE_MODULES } from '../../compiler/frontend/activation-names.js';
import { OP_TABLE, type OpKind } from '../../ir/ops.js';
import { compile, writePlan, type CompileResult } from '../../compiler/pipeline.js';
import { activationPolicyOf, type ActivationPolicy } from '../../compiler/emit/activations.js';
import { checkMemoryReuse } from '../../compiler/plan/check-memory.js';
import { emitProgram } from '../../compiler/emit/passes.js';
import type { PlanInstruction, ProgramFile } from '../../compiler/plan/format.js';
import { align, livenessLowerBound, type Lifetime } from '../../compiler/plan/memory.js';
import { formatPlanProblem, verifyPlan } from '../../compiler/verify/plan-verifier.js';
import { train } from '../../runtime/train.js';

const MODULES = Object.keys(RECOMPUTE_MODULES) as (keyof typeof RECOMPUTE_MODULES)[];
const TENSORS = Object.keys(OFFLOAD_TENSORS) as (keyof typeof OFFLOAD_TENSORS)[];

const POLICIES: readonly (readonly [string, ActivationPolicy])[] = [
  ['recompute full', { recompute: { granularity: 'full' } }],
  ...MODULES.map(
    (m) => [`recompute ${m}`, { recompute: { granularity: 'selective', modules: [m] } }] as const,
  ),
  ...TENSORS.map((t) => [`offload ${t}`, { offload: [t] }] as const),
  ['offload all', { offload: TENSORS }],
  [
    'recompute all modules, offload all',
    { recompute: { granularity: 'selective', modules: MODULES }, offload: TENSORS },
  ],
];

/** The program of a one-stage plan emitted again with a policy, with compile()'s options. */
function emitWith(r: CompileResult, activations?: ActivationPolicy): ProgramFile {
  const { sizes, worldSize: world } = r.plan.topology;
  const copies: Record<string, number> = {};
  for (const p of r.graph.params) {
    if (p.role !== 'param') continue;
    const parts = (p.dist?.split ?? []).reduce((n, x) => n * (x ? x.parts : 1), 1);
    copies[p.name] = world / sizes.pp / parts / (p.dist?.expert ? sizes.ep : 1);
  }
  return emitProgram(r.graph, {
    numMicrobatches: r.plan.training.numMicrobatches,
    id: 'p0',
    groupSizes: { tp: sizes.tp, dp: sizes.dp, edp: sizes.edp, ep: sizes.ep, pp: sizes.pp, world },
    copies,
    worldSize: world,
    ...(activations ? { activations } : {}),
  });
}

const rootOf = (p: ProgramFile, id: number) => p.buffers[id].viewOf ?? id;

/** arena lifetimes in issue order (a root's first write to its last use) */
function lifetimes(p: ProgramFile): Lifetime[] {
  const first = new Map<number, number>();
  const last = new Map<number, number>();
  p.instructions.forEach((x, i) => {
    for (const b of [...x.inputs, ...x.outputs]) {
      const r = rootOf(p, b);
      if (p.buffers[r].region !== 'arena') continue;
      if (!first.has(r)) first.set(r, i);
      last.set(r, i);
    }
  });
  return [...first].map(([id, start]) => ({
    id,
    bytes: p.buffers[id].bytes,
    start,
    end: last.get(id)!,
  }));
}

/** arena bytes written before a microbatch's first backward instruction and used after it (max) */
function stashBytes(p: ProgramFile): number {
  const life = lifetimes(p);
  let most = 0;
  const mbs = new Set(p.instructions.map((x) => x.microbatch).filter((mb) => mb >= 0));
  for (const mb of mbs) {
    const b0 = p.instructions.findIndex((x) => x.phase === 'backward' && x.microbatch === mb);
    let bytes = 0;
    for (const l of life) if (l.start < b0 && l.end >= b0) bytes += align(l.bytes);
    most = Math.max(most, bytes);
  }
  return most;
}

const isRecomputed = (p: ProgramFile, x: PlanInstruction) =>
  x.outputs.some((o) => p.buffers[o].name.endsWith('.recompute'));

/** every recomputed instruction repeats its forward instruction: op, attrs, stream, inputs */
function expectExactCopies(p: ProgramFile): number {
  const key = (name: string, mb: number) => `${name}@${mb}`;
  const forwardOf = new Map<string, PlanInstruction>();
  for (const x of p.instructions)
    if (x.phase === 'forward')
      for (const o of x.outputs) forwardOf.set(key(p.buffers[o].name, x.microbatch), x);
  // a recomputed or reloaded buffer stands for the forward buffer of its name
  const original = (id: number, mb: number) => {
    const name = p.buffers[id].name.replace(/\.(recompute|reload)$/, '');
    if (name === p.buffers[id].name) return id;
    const x = forwardOf.get(key(name, mb))!;
    return x.outputs.find((o) => p.buffers[o].name === name)!;
  };
  let copies = 0;
  for (const x of p.instructions.filter((y) => isRecomputed(p, y))) {
    const name = p.buffers[x.outputs[0]].name.replace(/\.recompute$/, '');
    const f = forwardOf.get(key(name, x.microbatch));
    expect(f, `forward instruction of ${name}`).toBeDefined();
    expect(x.op).toBe(f!.op);
    expect(x.attrs).toEqual(f!.attrs);
    expect([x.stream, x.scope, x.microbatch]).toEqual([f!.stream, f!.scope, f!.microbatch]);
    expect(x.inputs.map((v) => original(v, x.microbatch))).toEqual(f!.inputs);
    expect(x.outputs.map((o) => p.buffers[o].name)).toEqual(
      f!.outputs.map((o) => `${p.buffers[o].name}.recompute`),
    );
    copies++;
  }
  return copies;
}

describe('tiny-vlm-moe on one rank, 2 microbatches', () => {
  const base = compile({ model: 'tiny-vlm-moe', globalBatchSize: 2 });
  const none = emitWith(base);
  const plans = new Map(POLICIES.map(([name, policy]) => [name, emitWith(base, policy)]));

  it('emitting the graph again reproduces the compiled program', () => {
    expect(none).toEqual(base.programs[0]);
  });

  it.each(POLICIES.map(([name]) => [name]))(
    '%s: accepted, fewer bytes kept from forward to backward, peak not higher',
    (name) => {
      const p = plans.get(name)!;
      expect(checkMemoryReuse(p)).toEqual([]);
      expect(verifyPlan(base.plan, new Map([['p0', p]])).map(formatPlanProblem)).toEqual([]);
      const [stash, stash0] = [stashBytes(p), stashBytes(none)];
      const [peak, peak0] = [livenessLowerBound(lifetimes(p)), livenessLowerBound(lifetimes(none))];
      expect(stash).toBeLessThan(stash0);
      expect(peak).toBeLessThanOrEqual(peak0);
      expect(p.arenaLowerBoundBytes).toBe(peak);
    },
  );

  it('recomputed instructions are exact copies of forward instructions, read by their layer', () => {
    for (const [name, p] of plans) {
      if (!name.startsWith('recompute')) continue;
      expect(expectExactCopies(p), name).toBeGreaterThan(0);
      // the copies' outputs are read in backward only, by the layer they come from
      const made = new Set(
        p.instructions.filter((x) => isRecomputed(p, x)).flatMap((x) => x.outputs),
      );
      for (const x of p.instructions)
        if (x.inputs.some((v) => made.has(v))) {
          expect(x.phase).toBe('backward');
          expect(x.scope).toMatch(/^model\.layers\.\d+/);
        }
    }
  });

  it('full recompute: a layer keeps for its backward nothing it made itself', () => {
    const p = plans.get('recompute full')!;
    const layer = (s: string) => /^model\.layers\.\d+/.exec(s)?.[0];
    const madeIn = new Map<number, string>();
    for (const x of p.instructions)
      if (x.phase === 'forward' && layer(x.scope))
        for (const o of x.outputs) madeIn.set(rootOf(p, o), `${layer(x.scope)}@${x.microbatch}`);
    const kept = p.instructions.filter(
      (x) =>
        x.phase === 'backward' &&
        !isRecomputed(p, x) &&
        x.inputs.some((v) => madeIn.get(rootOf(p, v)) === `${layer(x.scope)}@${x.microbatch}`),
    );
    expect(kept.map((x) => `${x.op} ${x.scope}`)).toEqual([]);
  });

  it('collective-free recompute modules each recompute something', () => {
    for (const m of MODULES) {
      const p = plans.get(`recompute ${m}`)!;
      expect(p.instructions.filter((x) => isRecomputed(p, x)).length, m).toBeGreaterThan(0);
    }
  });

  it('offload: each tensor goes to the host on the copy stream after forward, and comes back once', () => {
    for (const t of TENSORS) {
      const p = plans.get(`offload ${t}`)!;
      const offloads = p.instructions.filter((x) => x.op === 'offload');
      expect(offloads.length, t).toBeGreaterThan(0);
      expect(p.regions.host).toBeGreaterThan(0);
      for (const o of offloads) {
        const [dev, host] = [o.inputs[0], o.outputs[0]];
        expect([o.stream, p.buffers[dev].region, p.buffers[host].region]).toEqual([
          'copy',
          'arena',
          'host',
        ]);
        expect(p.buffers[host].space).toBe('host');
        const reloads = p.instructions.filter((x) => x.op === 'reload' && x.inputs[0] === host);
        expect(reloads.map((x) => x.stream)).toEqual(['copy']);
        // after the reload, nothing reads the device buffer that was offloaded
        const at = p.instructions.indexOf(reloads[0]);
        const later = p.instructions.slice(at).filter((x) => x.inputs.includes(dev));
        expect(later).toEqual([]);
      }
    }
  });

  it('one rank trains 2 steps to bit-identical losses and parameters', async () => {
    const run = async (p: ProgramFile) => {
      const dir = mkdtempSync(join(tmpdir(), 'lfc-act-'));
      writePlan(dir, base.plan, [p]);
      return train({ planDir: dir, trainIters: 2, seed: 11 });
    };
    const want = await run(none);
    for (const name of [
      'recompute full',
      'recompute all modules, offload all',
      'offload all',
      ...MODULES.map((m) => `recompute ${m}`),
    ]) {
      const got = await run(plans.get(name)!);
      expect(
        got.steps.map((s) => s.loss),
        name,
      ).toEqual(want.steps.map((s) => s.loss));
      for (const [param, w] of want.params)
        expect(Buffer.from(got.params.get(param)!.buffer).equals(Buffer.from(w.buffer))).toBe(true);
    }
  }, 120_000);
});

describe('tiny-vlm-moe on 4 ranks: tp 2 × ep 2, sequence parallel', () => {
  const base = compile({
    model: 'tiny-vlm-moe',
    nprocPerNode: 4,
    globalBatchSize: 4,
    parallel: { tp: 2, ep: 2 },
    sequenceParallel: true,
  });
  const none = emitWith(base);

  it('emitting the graph again reproduces the compiled program', () => {
    expect(none).toEqual(base.programs[0]);
  });

  it.each(POLICIES.map(([name, policy]) => [name, policy] as const))(
    '%s: collectives issued again still match over every group; lower peak',
    (_, policy) => {
      const p = emitWith(base, policy);
      expect(checkMemoryReuse(p)).toEqual([]);
      expect(verifyPlan(base.plan, new Map([['p0', p]])).map(formatPlanProblem)).toEqual([]);
      expect(stashBytes(p)).toBeLessThan(stashBytes(none));
      expect(p.arenaLowerBoundBytes).toBeLessThan(none.arenaLowerBoundBytes);
    },
  );

  it('moe, the A2A-overlap attn and post_attn, layernorm and full issue collectives again', () => {
    const collectives = (policy: ActivationPolicy) => {
      const p = emitWith(base, policy);
      return new Set(
        p.instructions
          .filter((x) => isRecomputed(p, x) && OP_TABLE[x.op as OpKind].category === 'collective')
          .map((x) => `${x.op}:${String(x.attrs.group)}`),
      );
    };
    const sel = (m: (typeof MODULES)[number]): ActivationPolicy => ({
      recompute: { granularity: 'selective', modules: [m] },
    });
    // the MoE block under SP: the dispatch and combine over ep, the router's statistics and the
    // counts gathered over tp, the rows gathered for the experts and scattered back
    expect(collectives(sel('moe'))).toEqual(
      new Set(['all_to_all_v:ep', 'all_gather:tp', 'all_gather_v:tp', 'reduce_scatter_v:tp']),
    );
    // the auxiliary loss's gathers (the count exchange is not read by the backward any more: it
    // reads the counts gathered over tp, made after the dispatch)
    expect(collectives(sel('a2a_overlap_post_attn'))).toEqual(new Set(['all_gather:tp']));
    expect(collectives(sel('a2a_overlap_attn'))).toEqual(
      new Set(['all_gather:tp', 'reduce_scatter:tp']),
    );
    expect(collectives(sel('layernorm'))).toEqual(new Set(['all_gather:tp']));
    expect(collectives({ recompute: { granularity: 'full' } })).toEqual(
      new Set([
        'all_to_all_v:ep',
        'all_gather:tp',
        'reduce_scatter:tp',
        'all_gather_v:tp',
        'reduce_scatter_v:tp',
      ]),
    );
  });
});

describe('activationPolicyOf (the compile options)', () => {
  it('maps --recompute-* and --offload-tensors; defaults to core_attn; nothing set: none', () => {
    expect(activationPolicyOf({})).toBeUndefined();
    expect(activationPolicyOf({ recompute: { granularity: 'selective' } })).toEqual({
      recompute: { granularity: 'selective', modules: ['core_attn'] },
    });
    expect(
      activationPolicyOf({
        recompute: { granularity: 'full' },
        offloadTensors: ['dispatched_input', 'pre_mlp_layernorm_output'],
      }),
    ).toEqual({
      recompute: { granularity: 'full', modules: ['core_attn'] },
      offload: ['dispatched_input', 'pre_mlp_layernorm_output'],
    });
    expect(() => activationPolicyOf({ offloadTensors: ['dispatched'] })).toThrow(
      /--offload-tensors: unknown name dispatched/,
    );
  });
});
