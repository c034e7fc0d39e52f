// What `lfc viz` shows, gathered from a plan directory: the layout (rank grid by program and
// stage, each stage's layers), each program's memory, the step's timeline (measured by `lfc run
// --trace`, or simulated on a hardware profile) and the programs folded by module. The page
// (page.ts) embeds it as JSON; the browser script (client.js) draws it.

import { readFileSync } from 'node:fs';
import { memoryByProgram, type ProgramMemory } from '../compiler/report/memory.js';
import { UserError } from '../compiler/errors.js';
import { stageOfRank, type PlanFile, type ProgramFile } from '../compiler/plan/format.js';
import { loadHardware, type HardwareProfile } from '../compiler/sim/hardware.js';
import { simulatePlan } from '../compiler/sim/simulate.js';
import { readPlan } from '../runtime/plan-io.js';
import type { TraceEvent } from '../runtime/trace.js';

export interface VizLane {
  readonly rank: number;
  readonly program: string;
  readonly stream: string;
}

export interface VizData {
  readonly title: string;
  readonly summary: string;
  readonly ranks: readonly { rank: number; program: string; stage: number; groups: string }[];
  readonly stages: readonly { stage: number; chunks: string[] }[];
  readonly memory: readonly ProgramMemory[];
  readonly timeline: {
    readonly source: string;
    readonly lanes: readonly VizLane[];
    /** names referenced by index from events */
    readonly ops: readonly string[];
    readonly phases: readonly string[];
    /** [lane, start ms, duration ms, op, phase, microbatch, instruction] */
    readonly events: readonly (readonly number[])[];
    readonly endMs: number;
  };
  /** per program: instructions by module (scope to its layer or block), with their time */
  readonly modules: readonly {
    program: string;
    module: string;
    instructions: number;
    ms: number;
  }[];
}

/** A scope folded to its module: `model.layers.3.mlp.experts` → `model.layers.3`. */
export function moduleOf(scope: string): string {
  const parts = scope.split('.');
  const at = parts.findIndex((p) => /^\d+$/.test(p));
  return parts.slice(0, at >= 0 ? at + 1 : Math.min(parts.length, 2)).join('.');
}

function stages(plan: PlanFile): VizData['stages'] {
  const { pp, vpp } = plan.topology.sizes;
  const layers = plan.topology.pipelineLayers;
  if (!layers) return [{ stage: 0, chunks: ['every layer'] }];
  const first = layers.map((_, s) => layers.slice(0, s).reduce((a, b) => a + b, 0));
  return Array.from({ length: pp }, (_, r) => ({
    stage: r,
    chunks: Array.from({ length: vpp }, (_, c) => {
      const s = c * pp + r;
      const n = layers[s];
      return `${vpp > 1 ? `chunk ${c}: ` : ''}${n === 1 ? `layer ${first[s]}` : `layers ${first[s]}–${first[s] + n - 1}`}`;
    }),
  }));
}

interface Timed {
  lanes: VizLane[];
  /** lane, start ms, end ms, instruction index */
  spans: [number, number, number, number][];
  source: string;
}

function simulated(
  plan: PlanFile,
  programs: ReadonlyMap<string, ProgramFile>,
  hw: HardwareProfile,
): Timed {
  const sim = simulatePlan(plan, programs, hw);
  const lanes: VizLane[] = [];
  const spans: Timed['spans'] = [];
  for (const r of sim.ranks) {
    const p = programs.get(r.program)!;
    const laneOf = new Map<string, number>();
    p.instructions.forEach((x, i) => {
      let lane = laneOf.get(x.stream);
      if (lane === undefined) {
        laneOf.set(x.stream, (lane = lanes.length));
        lanes.push({ rank: r.rank, program: r.program, stream: x.stream });
      }
      spans.push([lane, r.start[i] * 1e3, r.end[i] * 1e3, i]);
    });
  }
  return { lanes, spans, source: `simulated on ${hw.name} (${hw.description})` };
}

function measured(file: string, plan: PlanFile): Timed {
  let json: { traceEvents?: (TraceEvent & { args?: { index?: number } })[] };
  try {
    json = JSON.parse(readFileSync(file, 'utf8')) as typeof json;
  } catch (e) {
    throw new UserError(`--trace ${file}: not a readable trace (${(e as Error).message})`);
  }
  if (!Array.isArray(json.traceEvents))
    throw new UserError(`--trace ${file}: no traceEvents (write one with lfc run --trace)`);
  const names = new Map<string, string>();
  for (const e of json.traceEvents)
    if (e.ph === 'M' && e.name === 'thread_name')
      names.set(`${e.pid}/${e.tid}`, String(e.args?.name));
  const lanes: VizLane[] = [];
  const laneOf = new Map<string, number>();
  const spans: Timed['spans'] = [];
  for (const e of json.traceEvents) {
    if (e.ph !== 'X') continue;
    const key = `${e.pid}/${e.tid}`;
    let lane = laneOf.get(key);
    if (lane === undefined) {
      laneOf.set(key, (lane = lanes.length));
      const program = plan.rankPrograms[e.pid];
      if (program === undefined)
        throw new UserError(`--trace ${file}: rank ${e.pid} is not a rank of this plan`);
      lanes.push({ rank: e.pid, program, stream: names.get(key) ?? `stream ${e.tid}` });
    }
    const index = e.args?.index;
    if (typeof index !== 'number')
      throw new UserError(`--trace ${file}: an event without its instruction index (args.index)`);
    spans.push([lane, (e.ts ?? 0) / 1e3, ((e.ts ?? 0) + (e.dur ?? 0)) / 1e3, index]);
  }
  return { lanes, spans, source: `measured (${file})` };
}

export function vizData(
  planDir: string,
  o: { trace?: string; hardware?: string; attentionKernel?: string } = {},
): VizData {
  const { plan, programs } = readPlan(planDir);
  const t = o.trace
    ? measured(o.trace, plan)
    : simulated(plan, programs, loadHardware(o.hardware ?? 'h800', o.attentionKernel));
  const ops: string[] = [];
  const phases: string[] = [];
  const intern = (list: string[], x: string) => {
    const at = list.indexOf(x);
    return at >= 0 ? at : list.push(x) - 1;
  };
  const modules = new Map<
    string,
    { program: string; module: string; instructions: number; ms: number }
  >();
  const events = t.spans.map(([lane, start, end, index]) => {
    const program = programs.get(t.lanes[lane].program)!;
    const x = program.instructions[index];
    if (!x)
      throw new UserError(
        `the timeline names instruction ${index} of ${program.id}, which has ${program.instructions.length}: is it this plan's?`,
      );
    const key = `${program.id}\u0000${moduleOf(x.scope)}`;
    const m = modules.get(key) ?? {
      program: program.id,
      module: moduleOf(x.scope),
      instructions: 0,
      ms: 0,
    };
    m.instructions++;
    m.ms += end - start;
    modules.set(key, m);
    return [
      lane,
      start,
      end - start,
      intern(ops, x.op),
      intern(phases, x.phase),
      x.microbatch,
      index,
    ];
  });
  const groupsOf = (rank: number) =>
    Object.entries(plan.rankGroups)
      .filter(([kind]) => ['tp', 'pp', 'dp', 'ep', 'edp'].includes(kind))
      .map(([, ids]) => plan.groups[ids[rank]]?.name)
      .filter(Boolean)
      .join(' ');
  const sz = plan.topology.sizes;
  return {
    title: `${plan.model.name} on ${plan.topology.worldSize} rank${plan.topology.worldSize > 1 ? 's' : ''}`,
    summary: `tp ${sz.tp}, pp ${sz.pp}${sz.vpp > 1 ? ` × vpp ${sz.vpp}` : ''}, dp ${sz.dp}${sz.ep > 1 ? `, ep ${sz.ep}` : ''}; ${plan.training.numMicrobatches} microbatches per step per data-parallel rank, sequence ${plan.training.seqLength}`,
    ranks: plan.rankPrograms.map((program, rank) => ({
      rank,
      program,
      stage: stageOfRank(plan, rank),
      groups: groupsOf(rank),
    })),
    stages: stages(plan),
    memory: memoryByProgram({ plan, programs: [...programs.values()] }),
    timeline: {
      source: t.source,
      lanes: t.lanes,
      ops,
      phases,
      events,
      endMs: t.spans.reduce((a, s) => Math.max(a, s[2]), 0),
    },
    modules: [...modules.values()].sort(
      (a, b) => a.program.localeCompare(b.program) || b.ms - a.ms,
    ),
  };
}
