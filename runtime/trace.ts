// A step's timeline as a Chrome trace (the Trace Event Format that Perfetto and chrome://tracing
// open): one process per rank, one thread per stream of its program, one complete event per
// instruction from the runtime's own start and end times (its timing option), with the
// instruction's op, scope, phase, microbatch and index. A batched send or recv (attribute
// `batch`) is only posted by its own instruction; the batch's transfers complete together in its
// last instruction, whose event says `batchEnd`.
//
// Ranks are put on one time line by the system-clock instant each executor started its step from
// (the native step result's startWallMs): exact on one machine, as good as the machines' clock
// sync across nodes. A multi-rank run writes one
// fragment per rank beside the trace file (traceFragment), which the launcher of node 0 merges.

import { existsSync, readFileSync, rmSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { makeDirs } from '../compiler/files.js';
import { UserError } from '../compiler/errors.js';
import {
  batchSpans,
  stageOfRank,
  type PlanFile,
  type ProgramFile,
} from '../compiler/plan/format.js';
import { writeFileAtomic } from './safetensors.js';

/** One event of the Trace Event Format (complete 'X' or metadata 'M'). */
export interface TraceEvent {
  readonly name: string;
  readonly ph: 'X' | 'M';
  readonly pid: number;
  readonly tid: number;
  /** microseconds */
  readonly ts?: number;
  readonly dur?: number;
  readonly cat?: string;
  readonly args?: Record<string, unknown>;
}

/** One rank's part of a trace: its events on its own clock, and where that clock starts. */
export interface RankTrace {
  readonly rank: number;
  readonly step: number;
  /** wall-clock ms (epoch) at the step's start */
  readonly wallStartMs: number;
  readonly events: readonly TraceEvent[];
}

/** The stream names of a program in first-use order: thread ids are their indices. */
export function streamsOf(program: ProgramFile): string[] {
  return [...new Set(program.instructions.map((x) => x.stream))];
}

/**
 * One rank's events from the runtime's per-instruction times (ms since the step began); the
 * instructions the step did not run (none in a finished step) have no event.
 */
export function rankTrace(
  plan: PlanFile,
  program: ProgramFile,
  rank: number,
  step: number,
  wallStartMs: number,
  perInstruction: readonly { readonly start: number; readonly end: number }[],
): RankTrace {
  const streams = streamsOf(program);
  const tid = new Map(streams.map((s, i) => [s, i]));
  const events: TraceEvent[] = [
    {
      name: 'process_name',
      ph: 'M',
      pid: rank,
      tid: 0,
      args: { name: `rank ${rank} (${program.id}, stage ${stageOfRank(plan, rank)})` },
    },
    { name: 'process_sort_index', ph: 'M', pid: rank, tid: 0, args: { sort_index: rank } },
    ...streams.map((s, i) => ({
      name: 'thread_name',
      ph: 'M' as const,
      pid: rank,
      tid: i,
      args: { name: s },
    })),
  ];
  const batches = batchSpans(program.instructions);
  program.instructions.forEach((x, index) => {
    const t = perInstruction[index];
    if (!t || !(t.end >= t.start)) return;
    events.push({
      name: x.op,
      cat: x.phase,
      ph: 'X',
      pid: rank,
      tid: tid.get(x.stream)!,
      ts: micros(t.start),
      dur: micros(t.end - t.start),
      args: {
        scope: x.scope,
        microbatch: x.microbatch,
        phase: x.phase,
        index,
        ...(x.attrs.batch === undefined
          ? {}
          : { batch: x.attrs.batch, ...(batches.last[index] === index ? { batchEnd: true } : {}) }),
      },
    });
  });
  return { rank, step, wallStartMs, events };
}

/** The trace file of several ranks: every rank's events moved onto the earliest rank's clock. */
export function traceFile(parts: readonly RankTrace[], about: Record<string, unknown>): string {
  const t0 = Math.min(...parts.map((p) => p.wallStartMs));
  const events = parts.flatMap((p) => {
    const shift = (p.wallStartMs - t0) * 1000;
    return p.events.map((e) => (e.ts === undefined ? e : { ...e, ts: round3(e.ts + shift) }));
  });
  return JSON.stringify({
    traceEvents: events,
    displayTimeUnit: 'ms',
    otherData: { ...about, ranks: parts.map((p) => p.rank), step: parts[0]?.step },
  });
}

/** Where rank `rank` of a multi-rank run leaves its part of `file`. */
export function traceFragment(file: string, rank: number): string {
  return `${file}.rank-${rank}.json`;
}

export function writeRankTrace(file: string, part: RankTrace): void {
  writeFileAtomic(file, JSON.stringify(part));
}

/** Writes the trace file of `parts` (traceFile), making its directory. */
export function writeTrace(
  file: string,
  parts: readonly RankTrace[],
  about: Record<string, unknown>,
): void {
  makeDirs(dirname(resolve(file)));
  writeFileAtomic(file, traceFile(parts, about));
}

/**
 * Merges the fragments ranks 0..world-1 left beside `file` into it and removes them; returns the
 * ranks whose fragment is not on this machine (ranks of other nodes without a shared file system).
 */
export function mergeTrace(file: string, world: number, about: Record<string, unknown>): number[] {
  const parts: RankTrace[] = [];
  const missing: number[] = [];
  for (let r = 0; r < world; r++) {
    const path = traceFragment(file, r);
    if (!existsSync(path)) {
      missing.push(r);
      continue;
    }
    try {
      parts.push(JSON.parse(readFileSync(path, 'utf8')) as RankTrace);
    } catch (e) {
      throw new UserError(`--trace: ${path}: not a rank's trace (${(e as Error).message})`);
    }
  }
  if (parts.length === 0) return missing;
  writeTrace(file, parts, about);
  for (const p of parts) rmSync(traceFragment(file, p.rank), { force: true });
  return missing;
}

/** ms → µs, to the nanosecond */
const micros = (ms: number) => round3(ms * 1000);
const round3 = (x: number) => Math.round(x * 1000) / 1000;
