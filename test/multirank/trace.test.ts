// lfc run --trace: the last step's timeline as a Chrome trace, held to what the plan says must
// have happened. Every instruction of every rank has one event; a stream runs its instructions
// one at a time in issue order; an instruction that waits on an event starts after the
// instruction that records it ended; a pipeline recv completes after its matching send, on
// another rank, started (the ranks' clocks are put on one time line by each executor's start
// instant). A batched send or recv is posted by its instruction and completes in its batch's last.
import { existsSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import type { PlanFile, ProgramFile } from '../../compiler/plan/format.js';
import { readPlan } from '../../runtime/plan-io.js';
import { traceFragment, type TraceEvent } from '../../runtime/trace.js';
import { cli, DEMO_LAYOUT } from '../helpers.js';

const dir = join(tmpdir(), 'trace');
const LAYOUTS = {
  'one rank': ['tiny-vlm', []],
  'pp 2 × vpp 2, ep 2, full separation, A2A overlap (4 ranks)': [
    'tiny-vlm-moe',
    ['--nproc-per-node', '4', ...DEMO_LAYOUT],
  ],
} as const;

interface Traced {
  plan: PlanFile;
  programs: ReadonlyMap<string, ProgramFile>;
  events: (TraceEvent & {
    ts: number;
    dur: number;
    args: { index: number; batch?: number; batchEnd?: boolean };
  })[];
  out: string;
}
const traced = new Map<string, Traced>();

beforeAll(async () => {
  for (const [name, [model, flags]] of Object.entries(LAYOUTS)) {
    const plan = join(dir, name.replace(/\W+/g, '-'));
    const c = await cli('compile', model, '--global-batch-size', '8', ...flags, '-o', plan);
    expect(c.err).toBe('');
    const file = join(plan, 'trace.json');
    const r = await cli('run', plan, '--steps', '2', '--trace', file, '--quiet');
    expect(r.err).toBe('');
    const loaded = readPlan(plan);
    const json = JSON.parse(readFileSync(file, 'utf8')) as { traceEvents: Traced['events'] };
    traced.set(name, {
      plan: loaded.plan,
      programs: loaded.programs,
      events: json.traceEvents.filter((e) => e.ph === 'X'),
      out: r.out,
    });
    for (let rank = 0; rank < loaded.plan.topology.worldSize; rank++)
      expect(existsSync(traceFragment(file, rank))).toBe(false); // merged and removed
  }
}, 120_000);

const end = (e: { ts: number; dur: number }) => e.ts + e.dur;

describe.each(Object.keys(LAYOUTS))('lfc run --trace: %s', (name) => {
  const get = () => traced.get(name)!;
  const programOf = (t: Traced, rank: number) => t.programs.get(t.plan.rankPrograms[rank])!;
  /** rank → instruction index → its event */
  const byIndex = (t: Traced) => {
    const m = new Map<number, Map<number, Traced['events'][number]>>();
    for (const e of t.events) {
      if (!m.has(e.pid)) m.set(e.pid, new Map());
      m.get(e.pid)!.set(e.args.index, e);
    }
    return m;
  };

  it('says where it wrote the trace', () => {
    expect(get().out).toMatch(/^trace: .*trace\.json$/m);
  });

  it('has one event per instruction of every rank', () => {
    const t = get();
    const events = byIndex(t);
    expect([...events.keys()].sort()).toEqual(
      Array.from({ length: t.plan.topology.worldSize }, (_, r) => r),
    );
    for (const [rank, mine] of events) {
      const program = programOf(t, rank);
      expect(mine.size).toBe(program.instructions.length);
      for (const [index, e] of mine) {
        expect(e.name).toBe(program.instructions[index].op);
        expect(e.dur).toBeGreaterThanOrEqual(0);
      }
    }
    expect(t.events.length).toBe(
      t.plan.rankPrograms.reduce((a, id) => a + t.programs.get(id)!.instructions.length, 0),
    );
  });

  it('runs each stream one instruction at a time, in issue order', () => {
    const t = get();
    for (const [rank, mine] of byIndex(t)) {
      const program = programOf(t, rank);
      const last = new Map<string, number>();
      program.instructions.forEach((x, index) => {
        const e = mine.get(index)!;
        const before = last.get(x.stream);
        if (before !== undefined) expect(e.ts).toBeGreaterThanOrEqual(before);
        last.set(x.stream, end(e));
      });
    }
  });

  it('starts an instruction that waits on an event after its recorder ended', () => {
    const t = get();
    let checked = 0;
    for (const [rank, mine] of byIndex(t)) {
      const program = programOf(t, rank);
      const recorder = new Map<number, number>();
      program.instructions.forEach((x, index) => x.record.forEach((ev) => recorder.set(ev, index)));
      program.instructions.forEach((x, index) => {
        for (const ev of x.wait) {
          expect(mine.get(index)!.ts).toBeGreaterThanOrEqual(end(mine.get(recorder.get(ev)!)!));
          checked++;
        }
      });
    }
    if (name !== 'one rank') expect(checked).toBeGreaterThan(100);
  });

  it('completes every pipeline recv after its matching send started', () => {
    const t = get();
    const events = byIndex(t);
    /** rank → batch → the end of its last instruction, where its transfers complete */
    const batchEnd = new Map<string, number>();
    for (const e of t.events) if (e.args.batchEnd) batchEnd.set(`${e.pid}/${e.args.batch}`, end(e));
    /** "from>to:tag" → the k-th send's start, the k-th recv's end */
    const sends = new Map<string, number[]>();
    const recvs = new Map<string, number[]>();
    for (let rank = 0; rank < t.plan.topology.worldSize; rank++) {
      programOf(t, rank).instructions.forEach((x, index) => {
        if (x.op !== 'send' && x.op !== 'recv') return;
        const group = t.plan.groups[t.plan.rankGroups[String(x.attrs.group)][rank]];
        const peer = group.ranks[x.attrs.peer as number];
        const key =
          x.op === 'send' ? `${rank}>${peer}:${x.attrs.tag}` : `${peer}>${rank}:${x.attrs.tag}`;
        const e = events.get(rank)!.get(index)!;
        const into = x.op === 'send' ? sends : recvs;
        const done = e.args.batch === undefined ? end(e) : batchEnd.get(`${rank}/${e.args.batch}`)!;
        into.set(key, [...(into.get(key) ?? []), x.op === 'send' ? e.ts : done]);
      });
    }
    expect([...recvs.keys()].sort()).toEqual([...sends.keys()].sort());
    let pairs = 0;
    for (const [key, ends] of recvs) {
      const starts = sends.get(key)!;
      expect(ends.length).toBe(starts.length);
      ends.forEach((e, k) => expect(e).toBeGreaterThanOrEqual(starts[k]));
      pairs += ends.length;
    }
    if (name !== 'one rank') expect(pairs).toBeGreaterThan(10);
  });
});
