// Emission: one program from the training-step graph, as an ordered list of passes over the
// program IR (compiler/emit/draft.ts). compiler/pipeline.ts runs them, for each distinct program,
// after the graph passes; each states in its header what holds before and after it.

import type { Graph } from '../../ir/graph.js';
import { applyActivationPolicy } from './activations.js';
import { offloadIdleEncoderBytes } from './encoder-offload.js';
import type { ProgramFile } from '../plan/format.js';
import { programFileOf, type ProgramDraft } from './draft.js';
import { encoderHandoff } from './encoder-handoff.js';
import { syncGradients } from './grad-sync.js';
import { batchTransfers } from './p2p.js';
import { lowerProgram } from './lower.js';
import { lifetimesOf, planMemory } from './memory-plan.js';
import { numberProgram } from './number.js';
import type { EmitOptions } from './options.js';
import { lowerOptimizerStep } from './optimizer.js';
import { printSchedule, scheduleProgram, type ProgramSchedule } from './schedule.js';

export interface EmitPass {
  readonly name: string;
  readonly summary: string;
}

/** A pass from one draft to the next (every emission pass after the first two). */
interface DraftPass extends EmitPass {
  readonly run: (d: ProgramDraft, g: Graph, opts: EmitOptions) => ProgramDraft;
}

const DRAFT_PASSES: readonly DraftPass[] = [
  {
    name: 'encoder-handoff',
    summary: 'levels 2, 3: broadcast, gather_v, scatter_v of encoder outputs and their gradients',
    run: encoderHandoff,
  },
  {
    name: 'p2p',
    summary: "the pipeline's sends and recvs, batched between schedule steps",
    run: batchTransfers,
  },
  {
    name: 'grad-sync',
    summary: 'gradient buckets summed on the grad stream; distributed optimizer shards',
    run: syncGradients,
  },
  {
    name: 'optimizer',
    summary: 'gradient norm, clipping and AdamW after the last sum',
    run: lowerOptimizerStep,
  },
  { name: 'number', summary: 'buffers and events numbered by first appearance', run: numbered },
  {
    name: 'activations',
    summary: 'selective/full recompute and activation offload to the host',
    run: (d, _g, opts) => withActivationPolicy(d, opts),
  },
  {
    name: 'encoder-offload',
    summary: "level 3: the encoder's idle outputs wait on the host",
    run: (d, _g, opts) => withEncoderOffload(d, opts),
  },
  {
    name: 'memory-plan',
    summary: 'arena and host offsets from buffer lifetimes',
    run: (d, g) => planMemory(d, g),
  },
];

/** The emission passes in the order they run: the schedule, lowering, then the draft passes. */
export const EMIT_PASSES: readonly EmitPass[] = [
  { name: 'schedule', summary: "the program's steps: warm-up, paired and cool-down passes" },
  {
    name: 'lower',
    summary:
      "buffers and instructions in issue order: passes, A2A-overlap steps, the encoder's runs",
  },
  ...DRAFT_PASSES.map(({ name, summary }) => ({ name, summary })),
];

/** After a pass: its draft, or the schedule (the first pass). */
export type EmitDump = (pass: string, stage: ProgramSchedule | ProgramDraft) => void;

/** Told each pass's wall time (ms) as it ends. */
export type PassClock = (pass: string, ms: number) => void;

/** A lap timer: each call tells `clock` the time since the call before (or since it was made). */
export function lapTimer(clock?: PassClock): (pass: string) => void {
  let t = performance.now();
  return (pass) => {
    const now = performance.now();
    clock?.(pass, now - t);
    t = now;
  };
}

/** Runs the emission passes; `dump` sees each stage (drafts are linear: draft.ts). */
export function emitProgram(
  g: Graph,
  opts: EmitOptions,
  dump?: EmitDump,
  clock?: PassClock,
): ProgramFile {
  const lap = lapTimer(clock);
  const s = scheduleProgram(g, opts);
  lap('schedule');
  dump?.('schedule', s);
  let d = lowerProgram(g, opts, s);
  lap('lower');
  dump?.('lower', d);
  for (const pass of DRAFT_PASSES) {
    d = pass.run(d, g, opts);
    lap(pass.name);
    dump?.(pass.name, d);
  }
  return programFileOf(d);
}

export { printSchedule };

function numbered(d: ProgramDraft): ProgramDraft {
  return { ...d, ...numberProgram(d) };
}

/** --recompute-*, --offload-tensors (compiler/emit/activations.ts) */
function withActivationPolicy(d: ProgramDraft, opts: EmitOptions): ProgramDraft {
  if (!opts.activations) return d;
  const instructions = [...d.instructions];
  const buffers = [...d.buffers];
  const events = applyActivationPolicy(
    { instructions, buffers, events: d.events },
    opts.activations,
  );
  return { ...d, instructions, buffers, events };
}

/** --full-hetero-dp-cpu-offload at level 3 (compiler/emit/encoder-offload.ts) */
function withEncoderOffload(d: ProgramDraft, opts: EmitOptions): ProgramDraft {
  if (opts.encoder?.placement.level !== 3 || !opts.encoder.offload) return d;
  const { arena } = lifetimesOf(d.instructions, d.buffers, d.keepUntilWait);
  const instructions = [...d.instructions];
  const buffers = [...d.buffers];
  const r = offloadIdleEncoderBytes({ instructions, buffers, events: d.events }, arena);
  const keepUntilWait = new Map(d.keepUntilWait);
  for (const [e, ids] of r.keep) keepUntilWait.set(e, [...(keepUntilWait.get(e) ?? []), ...ids]);
  return { ...d, instructions, buffers, events: r.events, keepUntilWait };
}
