// What lfc viz's app is given, from a real plan (tiny-vlm-moe on 4 ranks, decoder tp 2, ep 2, full
// separation): the folded graph of a program keeps every instruction and names the encoder
// hand-off's gather_v with its group and root; the timeline splits spans into waiting and work
// and marks the three phases of full separation; memory over the step peaks at the planner's
// liveness bound; a measured trace (lfc run --trace) gives every rank's timeline; the server's
// API answers and names what it cannot.
import { readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import type { ProgramFile } from '../../compiler/plan/format.js';
import { openPlans, type PlanBundle } from '../../viz/bundle/index.js';
import { answerApi } from '../../viz/server.js';
import { cli } from '../helpers.js';

const dir = join(tmpdir(), 'viz-bundle');
const plan = join(dir, 'plan');
/** full separation with decoder tp 2: the hand-off gathers over the model-parallel group */
export const LEVEL3 = [
  '--nproc-per-node',
  '4',
  '--tp',
  '2',
  '--ep',
  '2',
  '--enable-full-hetero-dp',
];
let bundle: PlanBundle;

beforeAll(async () => {
  const c = await cli(
    'compile',
    'tiny-vlm-moe',
    ...LEVEL3,
    '--global-batch-size',
    '8',
    '--no-advice',
    '--save-ir',
    '-o',
    plan,
  );
  expect(c.err).toBe('');
  [bundle] = openPlans([plan]);
}, 60_000);

const program = (id: string) =>
  JSON.parse(readFileSync(join(plan, 'programs', `${id}.json`), 'utf8')) as ProgramFile;

describe('lfc viz data', () => {
  it('the graph folds microbatches and keeps every instruction; the hand-off names its group', () => {
    const id = bundle.plan.rankPrograms[1];
    const g = bundle.graph(id);
    const n = program(id).instructions.length;
    expect(g.nodes.reduce((a, x) => a + x.count, 0)).toBe(n);
    expect(g.nodes.length).toBeLessThan(n); // two microbatches share their nodes
    const handoff = g.nodes.filter((x) => x.op === 'gather_v' || x.op === 'scatter_v');
    expect(new Set(handoff.map((x) => x.op))).toEqual(new Set(['gather_v', 'scatter_v']));
    for (const x of handoff) {
      // the model-parallel group: at pp 1 it is a tp group (`mp=tp[0]`)
      expect(x.collective?.group).toMatch(/^mp(=tp)?\[\d\]$/);
      expect(x.collective?.ranks).toHaveLength(2);
      expect(x.collective?.root).toBe(0);
      expect(x.part).toBe('encoder');
    }
    for (const [from, to, bytes] of g.edges) {
      expect(from).not.toBe(to);
      expect(bytes).toBeGreaterThan(0);
    }
  });

  it('the IR after a pass (--save-ir): a node per IR node, the collectives tensor parallelism inserts', () => {
    const passes = bundle.summary().irPasses;
    expect(passes).toEqual([
      'build',
      'expert-parallel',
      'tensor-parallel',
      'encoder-data-parallel',
      'vit-dp-balance',
      'autodiff',
      'wgrad-accumulation',
    ]);
    const built = bundle.graph('ir:build');
    const tp = bundle.graph('ir:tensor-parallel');
    expect(tp.nodes.length).toBeGreaterThan(built.nodes.length);
    expect(built.nodes.some((n) => n.collective?.group === 'tp')).toBe(false);
    expect(tp.nodes.filter((n) => n.collective?.group === 'tp').length).toBeGreaterThan(0);
    expect(tp.nodes.filter((n) => n.op === 'linear').every((n) => n.flops > 0)).toBe(true);
    for (const [from, to] of tp.edges) expect(from).toBeLessThan(to); // the IR is in topological order
    expect(() => bundle.graph('ir:pipeline')).toThrow(/kept the IR after build, expert-parallel/);
  });

  it('a rank timeline: every instruction, waiting within its span, the three phases in order', () => {
    const t = bundle.timeline(2);
    const id = bundle.plan.rankPrograms[2];
    expect(t.events.start).toHaveLength(program(id).instructions.length);
    expect(t.lanes[0]).toMatchObject({ rank: 2, stream: 'compute' });
    t.events.wait.forEach((w, i) => {
      expect(w).toBeGreaterThanOrEqual(0);
      expect(w).toBeLessThanOrEqual(t.events.dur[i] + 1e-9);
    });
    const phases = t.marks.filter((m) => m.kind === 'phase');
    expect(phases.map((m) => m.label)).toEqual([
      'encoder forward',
      'decoder pipeline',
      'encoder backward',
      'optimizer step',
    ]);
    // full separation: one after the other (the hand-off's broadcast counts with the decoder)
    for (let k = 1; k < phases.length; k++)
      expect(phases[k - 1].endMs).toBeLessThanOrEqual(phases[k].startMs + 1e-9);
    expect(t.endMs).toBeCloseTo(bundle.summary().forecast!.stepMs, 6);
  });

  it('a pipeline: the later stage waits for its activations, its bubbles are marked, its chunks coloured apart', async () => {
    const pp = join(dir, 'pp');
    const c = await cli(
      'compile',
      'tiny-vlm-moe',
      '--nproc-per-node',
      '2',
      '--pp',
      '2',
      '--vpp',
      '2',
      '--global-batch-size',
      '4',
      '--no-advice',
      '-o',
      pp,
    );
    expect(c.err).toBe('');
    const [b] = openPlans([pp]);
    const t = b.timeline(1);
    const waiting = t.events.wait
      .map((w, i) => [w, t.ops[t.events.op[i]]] as const)
      .filter(([w]) => w > 0);
    expect(waiting.length).toBeGreaterThan(0);
    expect(new Set(waiting.map(([, op]) => op))).toContain('recv');
    expect(t.marks.filter((m) => m.kind === 'bubble').length).toBeGreaterThan(0);
    // stage 1's program holds the virtual stages 1 and 3: decoder layers 1 and 3 of 4
    const g = b.graph(b.plan.rankPrograms[1]);
    const stageOf = (layer: number) =>
      new Set(
        g.nodes.filter((n) => n.scope.startsWith(`model.layers.${layer}.`)).map((n) => n.stage),
      );
    expect([stageOf(1), stageOf(3)]).toEqual([new Set([1]), new Set([3])]);
  });

  it("memory over the step peaks at the planner's liveness bound, under the device", () => {
    for (const p of bundle.programs.values()) {
      const m = bundle.memoryOnTimeline(p.id);
      expect(Math.max(...m.points.boundBytes)).toBe(p.arenaLowerBoundBytes);
      expect(m.peak.boundBytes).toBe(m.staticBytes + p.arenaLowerBoundBytes);
      expect(m.peak.expectedBytes).toBeLessThanOrEqual(m.peak.boundBytes);
      expect(m.points.ms).toHaveLength(m.points.instruction.length);
      expect(m.peak.boundBytes).toBeLessThan(m.limitBytes);
    }
  });

  it('the API answers the views, and names a bad request', () => {
    const plans = answerApi([bundle], '/api/plans') as { title: string }[];
    expect(plans[0].title).toBe('tiny-vlm-moe on 4 ranks');
    const id = bundle.plan.rankPrograms[0];
    expect(answerApi([bundle], `/api/plans/0/graph/${encodeURIComponent(id)}`)).toBe(
      bundle.graph(id),
    );
    expect(() => answerApi([bundle], '/api/plans/3/graph/p0')).toThrow(
      /plan 3: there are plans 0–0/,
    );
    expect(() => answerApi([bundle], '/api/plans/0/timeline/9')).toThrow(
      /rank 9: the plan has ranks 0–3/,
    );
    expect(() => answerApi([bundle], '/api/plans/0/graph/p7')).toThrow(
      /program p7: the plan's programs are/,
    );
    expect(answerApi([bundle], '/index.html')).toBeUndefined();
  });

  it('a measured timeline (lfc run --trace): every rank, every instruction, no waiting guessed', async () => {
    const trace = join(dir, 'run.json');
    const run = await cli('run', plan, '--steps', '1', '--trace', trace, '--quiet');
    expect(run.err).toBe('');
    const [measured] = openPlans([plan], { trace });
    for (let rank = 0; rank < 4; rank++) {
      const t = measured.timeline(rank);
      expect(t.source).toMatch(/^measured/);
      expect(t.events.start).toHaveLength(
        program(bundle.plan.rankPrograms[rank]).instructions.length,
      );
      expect(t.events.wait.every((w) => w === 0)).toBe(true);
    }
    expect(measured.summary().forecast?.source).toBe('measured');
    const bad = join(dir, 'bad.json');
    const { writeFileSync } = await import('node:fs');
    writeFileSync(bad, '{"traceEvents": 3}');
    expect(() => openPlans([plan], { trace: bad })[0].timeline(0)).toThrow(/no traceEvents/);
  }, 120_000);
});
