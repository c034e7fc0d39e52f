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

/** The emission passes in the order they run (schedule first: it makes the draft's plan). */
export const EMIT_PASSES: readonly EmitPass[] = [
  { name: 'schedule', summary: "the program's steps: warm-up, paired and cool-down passes" },
  {
    name: 'lower',
    summary:
      "buffers and instructions in issue order: passes, A2A-overlap steps, the encoder's runs",
  },
  {
    name: 'encoder-handoff',
    summary: 'levels 2, 3: broadcast, gather_v, scatter_v of encoder outputs and their gradients',
  },
  { name: 'p2p', summary: "the pipeline's sends and recvs, batched between schedule steps" },
  {
    name: 'grad-sync',
    summary: 'gradient buckets summed on the comm stream; distributed optimizer shards',
  },
  { name: 'optimizer', summary: 'gradient norm, clipping and AdamW after the last sum' },
  { name: 'number', summary: 'buffers and events numbered by first appearance' },
  { name: 'activations', summary: 'selective/full recompute and activation offload to the host' },
  { name: 'encoder-offload', summary: "level 3: the encoder's idle outputs wait on the host" },
  { name: 'memory-plan', summary: 'arena and host offsets from buffer lifetimes' },
];

/** After a pass: its draft, or the schedule (the first pass). */
export type EmitDump = (pass: string, stage: ProgramSchedule | ProgramDraft) => void;

/** Runs the emission passes; `dump` sees each stage. */
export function emitProgram(g: Graph, opts: EmitOptions, dump?: EmitDump): ProgramFile {
  const s = scheduleProgram(g, opts);
  dump?.('schedule', s);
  const steps: readonly [string, (d: ProgramDraft) => ProgramDraft][] = [
    ['encoder-handoff', (d) => encoderHandoff(d, g, opts)],
    ['p2p', batchTransfers],
    ['grad-sync', (d) => syncGradients(d, g, opts)],
    ['optimizer', (d) => lowerOptimizerStep(d, g, opts)],
    ['number', numbered],
    ['activations', (d) => withActivationPolicy(d, opts)],
    ['encoder-offload', (d) => withEncoderOffload(d, opts)],
    ['memory-plan', planMemory],
  ];
  let d = lowerProgram(g, opts, s);
  dump?.('lower', d);
  for (const [name, pass] of steps) {
    d = pass(d);
    dump?.(name, d);
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
