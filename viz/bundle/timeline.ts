// One rank's lanes of the step's timeline (model.ts VizTimeline): from the simulated step (the
// first rank of each distinct program is replayed; another rank shows its program's replay), or
// from a measured trace (`lfc run --trace`). Each span is split into waiting and work: the
// simulator prices the last `cost` seconds of a span as data moving or a kernel running, the rest
// as waiting for peers. Marks: the three phases of full separation, the optimizer step, and the
// pipeline bubbles (the compute stream idle between its first and last kernel).

import { readFileSync } from 'node:fs';
import { UserError } from '../../compiler/errors.js';
import type { PlanFile, ProgramFile } from '../../compiler/plan/format.js';
import type { Work } from '../../compiler/sim/cost.js';
import type { RankTimes } from '../../compiler/sim/simulate.js';
import type { TraceEvent } from '../../runtime/trace.js';
import type { VizTimeline } from '../model.js';
import { communicates } from './group.js';
import { partOf } from './part.js';

/** a rank's spans, in ms from the step's start */
export interface RankSpans {
  readonly rank: number;
  readonly program: string;
  /** per instruction (NaN: not in the trace) */
  readonly start: Float64Array;
  readonly end: Float64Array;
  readonly work: Float64Array;
  /** per instruction: the stream that ran it, where the trace names another than the plan's */
  readonly stream?: readonly string[];
}

export function simulatedSpans(t: RankTimes): RankSpans {
  const ms = (a: Float64Array) => a.map((s) => s * 1e3);
  return {
    rank: t.rank,
    program: t.program,
    start: ms(t.start),
    end: ms(t.end),
    work: ms(t.cost),
  };
}

type TraceJson = { traceEvents?: (TraceEvent & { args?: { index?: number } })[] };

/** every rank's spans in a trace of `lfc run --trace` */
export function measuredSpans(
  file: string,
  plan: PlanFile,
  programs: ReadonlyMap<string, ProgramFile>,
): Map<number, RankSpans> {
  let json: TraceJson;
  try {
    json = JSON.parse(readFileSync(file, 'utf8')) as TraceJson;
  } catch (e) {
    throw new UserError(`--trace ${file}: not a readable trace (${(e as Error).message})`);
  }
  if (!Array.isArray(json.traceEvents))
    throw new UserError(`--trace ${file}: no traceEvents (write one with lfc run --trace)`);
  const names = new Map<string, string>();
  for (const e of json.traceEvents)
    if (e.ph === 'M' && e.name === 'thread_name')
      names.set(`${e.pid}/${e.tid}`, String(e.args?.name));
  const out = new Map<number, RankSpans & { stream: string[] }>();
  for (const e of json.traceEvents) {
    if (e.ph !== 'X') continue;
    const rank = e.pid;
    const id = plan.rankPrograms[rank];
    if (id === undefined)
      throw new UserError(`--trace ${file}: rank ${rank} is not a rank of this plan`);
    const p = programs.get(id)!;
    let s = out.get(rank);
    if (!s) {
      const n = p.instructions.length;
      s = {
        rank,
        program: id,
        start: new Float64Array(n).fill(NaN),
        end: new Float64Array(n).fill(NaN),
        work: new Float64Array(n).fill(NaN),
        stream: p.instructions.map((x) => x.stream),
      };
      out.set(rank, s);
    }
    const i = e.args?.index;
    if (typeof i !== 'number')
      throw new UserError(`--trace ${file}: an event without its instruction index (args.index)`);
    if (!(i >= 0 && i < p.instructions.length))
      throw new UserError(
        `--trace ${file}: rank ${rank}'s trace names instruction ${i} of ${id}, which has ${p.instructions.length}: is it this plan's?`,
      );
    const start = (e.ts ?? 0) / 1e3;
    const dur = (e.dur ?? 0) / 1e3;
    s.start[i] = start;
    s.end[i] = start + dur;
    // a measured span is all work: the trace does not say when peers arrived
    s.work[i] = s.end[i] - s.start[i];
    s.stream[i] = names.get(`${e.pid}/${e.tid}`) ?? p.instructions[i].stream;
  }
  return out;
}

const tenthUs = (ms: number) => Math.round(ms * 1e4) / 1e4;

class Interner {
  readonly list: string[] = [];
  private readonly at = new Map<string, number>();
  of(x: string): number {
    let i = this.at.get(x);
    if (i === undefined) this.at.set(x, (i = this.list.push(x) - 1));
    return i;
  }
}

/** the timeline of one rank's spans; `level` the plan's encoder level (3: mark its phases) */
export function rankTimeline(
  spans: RankSpans,
  program: ProgramFile,
  work: readonly Work[],
  level: number,
  source: string,
): VizTimeline {
  const ops = new Interner();
  const phases = new Interner();
  const scopes = new Interner();
  const lanes: VizTimeline['lanes'][number][] = [];
  const laneOf = new Map<string, number>();
  const ev = {
    lane: [] as number[],
    start: [] as number[],
    dur: [] as number[],
    wait: [] as number[],
    op: [] as number[],
    phase: [] as number[],
    scope: [] as number[],
    microbatch: [] as number[],
    bytes: [] as number[],
    instruction: [] as number[],
  };
  let endMs = 0;
  program.instructions.forEach((x, i) => {
    const start = spans.start[i];
    if (Number.isNaN(start)) return;
    const stream = spans.stream?.[i] ?? x.stream;
    let lane = laneOf.get(stream);
    if (lane === undefined) {
      laneOf.set(stream, (lane = lanes.length));
      lanes.push({ rank: spans.rank, program: spans.program, stream });
    }
    const dur = spans.end[i] - start;
    ev.lane.push(lane);
    // to a tenth of a microsecond: the JSON of a long program's lanes halves
    ev.start.push(tenthUs(start));
    ev.dur.push(tenthUs(dur));
    ev.wait.push(Math.min(tenthUs(dur), tenthUs(Math.max(0, dur - spans.work[i]))));
    ev.op.push(ops.of(x.op));
    ev.phase.push(phases.of(x.phase));
    ev.scope.push(scopes.of(x.scope));
    ev.microbatch.push(x.microbatch);
    ev.bytes.push(work[i]?.bytes ?? 0);
    ev.instruction.push(i);
    endMs = Math.max(endMs, spans.end[i]);
  });
  // lanes in stream order: compute first
  const order = lanes
    .map((_, i) => i)
    .sort((a, b) => streamRank(lanes[a].stream) - streamRank(lanes[b].stream));
  const renumber = new Int32Array(lanes.length);
  order.forEach((old, now) => (renumber[old] = now));
  return {
    source,
    endMs,
    lanes: order.map((i) => lanes[i]),
    ops: ops.list,
    opIsCollective: ops.list.map(communicates),
    phases: phases.list,
    scopes: scopes.list,
    events: { ...ev, lane: ev.lane.map((l) => renumber[l]) },
    marks: [...phaseMarks(spans, program, level), ...bubbleMarks(spans, program)],
  };
}

const STREAM_ORDER = ['compute', 'comm', 'grad', 'copy'];
const streamRank = (s: string) => {
  const i = STREAM_ORDER.indexOf(s);
  return i >= 0 ? i : STREAM_ORDER.length;
};

/**
 * The phase window an instruction counts in: at level 3 the encoder and its projector forward,
 * the decoder's pipeline, the encoder backward; at any level the optimizer step. The hand-off's
 * broadcast into the decoder's tp group runs as the decoder takes each microbatch: the decoder's.
 */
function phaseOf(x: ProgramFile['instructions'][number], level: number): string | undefined {
  const part = partOf(x);
  if (part === 'step') return x.phase === 'optimizer' ? 'optimizer step' : undefined;
  if (level !== 3) return undefined;
  const intoDecoder = x.op === 'broadcast' && x.scope.startsWith('encoder_handoff');
  if (part === 'decoder' || intoDecoder) return 'decoder pipeline';
  return x.phase === 'forward' ? 'encoder forward' : 'encoder backward';
}

/** full separation's three phases (level 3), and the optimizer step at any level */
function phaseMarks(spans: RankSpans, program: ProgramFile, level: number): VizTimeline['marks'] {
  const windows = new Map<string, [number, number]>();
  program.instructions.forEach((x, i) => {
    const a = spans.start[i];
    if (Number.isNaN(a)) return;
    const label = phaseOf(x, level);
    if (!label) return;
    const w = windows.get(label);
    if (w) {
      w[0] = Math.min(w[0], a);
      w[1] = Math.max(w[1], spans.end[i]);
    } else windows.set(label, [a, spans.end[i]]);
  });
  const order = ['encoder forward', 'decoder pipeline', 'encoder backward', 'optimizer step'];
  return [...windows]
    .sort((a, b) => order.indexOf(a[0]) - order.indexOf(b[0]))
    .map(([label, [startMs, endMs]]) => ({
      rank: spans.rank,
      kind: 'phase',
      label,
      startMs,
      endMs,
    }));
}

/** gaps of the compute stream, between its first kernel and its last, of 0.2% of that or more */
function bubbleMarks(spans: RankSpans, program: ProgramFile): VizTimeline['marks'] {
  const kernels: [number, number][] = [];
  program.instructions.forEach((x, i) => {
    const stream = spans.stream?.[i] ?? x.stream;
    const a = spans.start[i];
    // a kernel: the compute stream's work part (its waiting is the bubble's)
    if (stream === 'compute' && !Number.isNaN(a) && spans.work[i] > 0)
      kernels.push([spans.end[i] - spans.work[i], spans.end[i]]);
  });
  if (kernels.length === 0) return [];
  kernels.sort((a, b) => a[0] - b[0]);
  const first = kernels[0][0];
  const last = kernels.reduce((m, k) => Math.max(m, k[1]), first);
  const minGap = (last - first) * 0.002;
  const out: VizTimeline['marks'][number][] = [];
  let busyUntil = kernels[0][1];
  for (const [a, b] of kernels) {
    if (a - busyUntil >= minGap && a - busyUntil > 0)
      out.push({ rank: spans.rank, kind: 'bubble', label: 'bubble', startMs: busyUntil, endMs: a });
    busyUntil = Math.max(busyUntil, b);
  }
  return out;
}
