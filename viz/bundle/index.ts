// A plan directory as the viz app asks for it (model.ts): its summary, a program's folded graph,
// a rank's timeline and a program's memory over the step. Each is made on first request and
// kept, so the local server answers the views as they open and `lfc viz --output` embeds what a
// page needs. The step is simulated on first need (on --hardware, else the profile the plan was
// compiled for), or read from a measured trace (--trace).

import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { UserError } from '../../compiler/errors.js';
import { stageOfRank, type PlanFile, type ProgramFile } from '../../compiler/plan/format.js';
import { deviceMemoryOf, type DeviceMemory } from '../../compiler/report/memory.js';
import { expectedSizes, instructionWork, type Work } from '../../compiler/sim/cost.js';
import { loadHardware, type HardwareProfile } from '../../compiler/sim/hardware.js';
import { simulatePlan, type Simulation } from '../../compiler/sim/simulate.js';
import { layerRange } from '../../compiler/schedule/partition.js';
import { readPlan } from '../../runtime/plan-io.js';
import type {
  VizEmbedded,
  VizForecast,
  VizGraph,
  VizMemory,
  VizPlanSummary,
  VizTimeline,
} from '../model.js';
import { programGraph } from './graph.js';
import { irGraph, irId, readSavedIr, savedPasses } from './ir.js';
import { programMemory } from './memory.js';
import { measuredSpans, rankTimeline, simulatedSpans, type RankSpans } from './timeline.js';

export interface BundleOptions {
  /** the hardware profile the step is simulated on (default: the plan's report's, else h800) */
  readonly hardware?: string;
  readonly attentionKernel?: string;
  /** a measured trace (lfc run --trace) to draw instead of the simulated step */
  readonly trace?: string;
}

/** What lfc compile wrote beside the plan (report.json): the parts the app shows. */
interface Report {
  readonly encoder?: { readonly level?: number };
  readonly memory?: { readonly device?: DeviceMemory };
  readonly forecast?: {
    readonly hardware?: string;
    readonly stepSeconds?: number;
    readonly tokensPerSecond?: number;
    readonly mfu?: number;
  };
}

export class PlanBundle {
  readonly plan: PlanFile;
  readonly programs: ReadonlyMap<string, ProgramFile>;
  private readonly report: Report;
  private readonly graphs = new Map<string, VizGraph>();
  private readonly memories = new Map<string, VizMemory>();
  private readonly timelines = new Map<number, VizTimeline>();
  private readonly works = new Map<string, Work[]>();
  private sizes?: Map<string, number>;
  private summarized?: VizPlanSummary;
  private hw?: HardwareProfile;
  private sim?: Simulation;
  private measured?: Map<number, RankSpans>;

  constructor(
    readonly dir: string,
    readonly index: number,
    private readonly o: BundleOptions = {},
  ) {
    const { plan, programs } = readPlan(dir);
    this.plan = plan;
    this.programs = programs;
    this.report = readReport(dir);
  }

  /** the encoder level (1 hetero TP, 2 hetero DP, 3 full separation), 0 when not known */
  get encoderLevel(): number {
    return this.report.encoder?.level ?? 0;
  }

  summary(): VizPlanSummary {
    return (this.summarized ??= this.summarize());
  }

  private summarize(): VizPlanSummary {
    const { plan } = this;
    const sz = plan.topology.sizes;
    const world = plan.topology.worldSize;
    const ranksOf = new Map<string, number[]>();
    plan.rankPrograms.forEach((id, r) => ranksOf.set(id, [...(ranksOf.get(id) ?? []), r]));
    const device = this.device();
    return {
      index: this.index,
      dir: this.dir,
      title: `${plan.model.name} on ${world} rank${world > 1 ? 's' : ''}`,
      layout: [
        `tp ${sz.tp}, pp ${sz.pp}${sz.vpp > 1 ? ` × vpp ${sz.vpp}` : ''}, dp ${sz.dp}${sz.ep > 1 ? `, ep ${sz.ep}` : ''}`,
        this.encoderLevel ? `encoder level ${this.encoderLevel}` : '',
        `${plan.training.numMicrobatches} microbatches, sequence ${plan.training.seqLength}`,
      ]
        .filter(Boolean)
        .join('; '),
      encoderLevel: this.encoderLevel,
      worldSize: world,
      forecast: this.forecast(),
      ranks: plan.rankPrograms.map((program, rank) => ({
        rank,
        program,
        stage: stageOfRank(plan, rank),
        groups: Object.fromEntries(
          Object.entries(plan.rankGroups)
            .filter(([kind]) => ['tp', 'pp', 'dp', 'ep', 'edp', 'enc_tp'].includes(kind))
            .map(([kind, ids]) => [kind, plan.groups[ids[rank]]?.name ?? ''] as const)
            .filter(([, name]) => name !== ''),
        ),
      })),
      stages: stagesOf(plan),
      programs: [...this.programs.values()].map((p) => {
        const ranks = ranksOf.get(p.id) ?? [];
        const m = this.memory(p.id);
        return {
          id: p.id,
          ranks,
          stages: [...new Set(ranks.map((r) => stageOfRank(plan, r)))],
          instructions: p.instructions.length,
          boundBytes: m.peak.boundBytes,
          expectedBytes: m.peak.expectedBytes,
          hostBytes: p.regions.host,
        };
      }),
      irPasses: savedPasses(this.dir).map((s) => s.pass),
      device: { name: device.name, bytes: device.bytes, reserveBytes: device.reserveBytes },
    };
  }

  /** a program's graph, or the IR after a pass (`ir:<pass>`, where the plan kept it) */
  graph(programId: string): VizGraph {
    let g = this.graphs.get(programId);
    if (!g && programId.startsWith('ir:')) {
      const saved = savedPasses(this.dir);
      const s = saved.find((x) => irId(x.pass) === programId);
      if (!s)
        throw new UserError(
          saved.length
            ? `${programId}: the plan kept the IR after ${saved.map((x) => x.pass).join(', ')}`
            : `${programId}: the plan kept no IR (compile it with --save-ir)`,
        );
      this.graphs.set(programId, (g = irGraph(readSavedIr(s.file), s.pass)));
    }
    if (!g) {
      const p = this.program(programId);
      const rank = this.plan.rankPrograms.indexOf(programId);
      this.graphs.set(programId, (g = programGraph(this.plan, p, rank, this.work(p))));
    }
    return g;
  }

  timeline(rank: number): VizTimeline {
    let t = this.timelines.get(rank);
    if (t) return t;
    const id = this.plan.rankPrograms[rank];
    if (id === undefined)
      throw new UserError(`rank ${rank}: the plan has ranks 0–${this.plan.topology.worldSize - 1}`);
    const p = this.program(id);
    const { spans, source } = this.spans(rank);
    t = rankTimeline(spans, p, this.work(p), this.encoderLevel, source);
    this.timelines.set(rank, t);
    return t;
  }

  memory(programId: string): VizMemory {
    let m = this.memories.get(programId);
    if (!m) {
      const p = this.program(programId);
      this.memories.set(programId, (m = programMemory(this.plan, p, this.device())));
    }
    return m;
  }

  /** the memory curve on the timeline's axis: the program's first rank's instruction starts */
  memoryOnTimeline(programId: string): VizMemory {
    const m = this.memory(programId);
    if (m.points.ms) return m;
    const rank = this.plan.rankPrograms.indexOf(programId);
    const { spans } = this.spans(rank);
    const withMs = {
      ...m,
      points: { ...m.points, ms: m.points.instruction.map((i) => spans.start[i]) },
    };
    this.memories.set(programId, withMs);
    return withMs;
  }

  /** what a self-contained page holds: every program's graph and memory, the IR the plan kept,
   * each program's first rank's timeline */
  embed(into: {
    graphs: Record<string, VizGraph>;
    timelines: Record<string, VizTimeline>;
    memory: Record<string, VizMemory>;
  }): void {
    for (const { pass } of savedPasses(this.dir))
      into.graphs[`${this.index}/${irId(pass)}`] = this.graph(irId(pass));
    for (const id of this.programs.keys()) {
      into.graphs[`${this.index}/${id}`] = this.graph(id);
      into.memory[`${this.index}/${id}`] = this.memoryOnTimeline(id);
      const rank = this.plan.rankPrograms.indexOf(id);
      into.timelines[`${this.index}/${rank}`] = this.timeline(rank);
    }
  }

  private program(id: string): ProgramFile {
    const p = this.programs.get(id);
    if (!p)
      throw new UserError(
        `program ${id}: the plan's programs are ${[...this.programs.keys()].join(', ')}`,
      );
    return p;
  }

  /** each instruction's work at expected sizes, the plan's dtypes as written */
  private work(p: ProgramFile): Work[] {
    let w = this.works.get(p.id);
    if (!w) {
      this.sizes ??= expectedSizes(this.plan, this.programs.values());
      this.works.set(p.id, (w = instructionWork(p, this.sizes, 4, 4)));
    }
    return w;
  }

  private hardware(): HardwareProfile {
    return (this.hw ??= loadHardware(
      this.o.hardware ?? this.report.forecast?.hardware ?? 'h800',
      this.o.attentionKernel,
    ));
  }

  private device(): DeviceMemory {
    const d = this.report.memory?.device;
    return d && !this.o.hardware ? d : deviceMemoryOf(this.hardware());
  }

  private simulation(): Simulation {
    return (this.sim ??= simulatePlan(this.plan, this.programs, this.hardware()));
  }

  /** a rank's spans: measured, or its program's simulated replay */
  private spans(rank: number): { spans: RankSpans; source: string } {
    if (this.o.trace) {
      this.measured ??= measuredSpans(this.o.trace, this.plan, this.programs);
      const s = this.measured.get(rank);
      if (!s) throw new UserError(`--trace ${this.o.trace}: rank ${rank} is not in the trace`);
      return { spans: s, source: `measured (${this.o.trace})` };
    }
    const sim = this.simulation();
    const id = this.plan.rankPrograms[rank];
    const times =
      sim.ranks.find((t) => t.rank === rank) ?? sim.ranks.find((t) => t.program === id)!;
    const hw = sim.hardware;
    const as = times.rank === rank ? '' : `, rank ${times.rank}'s replay (same program)`;
    return {
      spans: { ...simulatedSpans(times), rank },
      source: `simulated on ${hw.name} (${hw.description})${as}`,
    };
  }

  private forecast(): VizForecast | null {
    const world = this.plan.topology.worldSize;
    if (this.o.trace) {
      this.measured ??= measuredSpans(this.o.trace, this.plan, this.programs);
      let end = 0;
      for (const s of this.measured.values()) for (const e of s.end) if (e > end) end = e;
      return {
        source: 'measured',
        stepMs: end,
        tokensPerSecond: null,
        tokensPerSecondPerGpu: null,
        mfu: null,
      };
    }
    const f = this.report.forecast;
    if (!f?.stepSeconds || (this.o.hardware && this.o.hardware !== f.hardware)) {
      // not simulated at compile, or on another profile: simulate it here
      const sim = this.simulation();
      return {
        source: `simulated on ${sim.hardware.name}`,
        stepMs: sim.stepSeconds * 1e3,
        tokensPerSecond: null,
        tokensPerSecondPerGpu: null,
        mfu: null,
      };
    }
    return {
      source: `simulated on ${f.hardware}`,
      stepMs: f.stepSeconds * 1e3,
      tokensPerSecond: f.tokensPerSecond ?? null,
      tokensPerSecondPerGpu: f.tokensPerSecond !== undefined ? f.tokensPerSecond / world : null,
      mfu: f.mfu ?? null,
    };
  }
}

function readReport(dir: string): Report {
  const path = join(dir, 'report.json');
  if (!existsSync(path)) return {};
  try {
    return JSON.parse(readFileSync(path, 'utf8')) as Report;
  } catch (e) {
    throw new UserError(`${path}: not readable JSON (${(e as Error).message.split('\n')[0]})`);
  }
}

/** each pipeline stage's layers, per virtual chunk */
function stagesOf(plan: PlanFile): VizPlanSummary['stages'] {
  const { pp, vpp } = plan.topology.sizes;
  const layers = plan.topology.pipelineLayers;
  if (!layers) return [{ stage: 0, chunks: ['every layer'] }];
  const first = layers.map((_, s) => layers.slice(0, s).reduce((a, b) => a + b, 0));
  return Array.from({ length: pp }, (_, r) => ({
    stage: r,
    chunks: Array.from({ length: vpp }, (_, c) => {
      const s = c * pp + r;
      const n = layers[s];
      return `${vpp > 1 ? `chunk ${c}: ` : ''}${layerRange(first[s], n)}`;
    }),
  }));
}

/** the plans of `lfc viz DIR…`, each given its index */
export function openPlans(dirs: readonly string[], o: BundleOptions = {}): PlanBundle[] {
  return dirs.map((d, i) => new PlanBundle(d, i, o));
}

/** everything a self-contained page embeds */
export function embedAll(bundles: readonly PlanBundle[]): VizEmbedded {
  const out = { plans: bundles.map((b) => b.summary()), graphs: {}, timelines: {}, memory: {} };
  for (const b of bundles) b.embed(out);
  return out;
}
