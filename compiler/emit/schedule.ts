// Emission pass 1, schedule: what one program runs, in which order, before any buffer exists.
//
// Holds before: the graph after the graph passes; the stage's pipeline schedule (its actions,
//   compiler/schedule/pipeline.ts) and the virtual stage of every node (the pipeline pass).
// Holds after: the program's steps in issue order: each warm-up forward alone, each steady-state
//   forward with its backward (a combined step under the A2A overlap), each cool-down backward
//   alone; the nodes of each pass (chunk, phase) this rank runs, in graph order; at encoder levels
//   2 and 3 the encoder's forward and backward nodes apart (they run where the handoff says, not
//   in the decoder's passes), on the ranks that run the encoder.
// Without a pipeline there is one stage holding every node: forward then backward of each
// microbatch.

import type { Graph, Node } from '../../ir/graph.js';
import { isEncoderScope } from '../parallel/encoder.js';
import type { Action } from '../schedule/pipeline.js';
import type { EmitOptions, EmitPipeline } from './options.js';

export interface ProgramSchedule {
  readonly pipe: EmitPipeline;
  /** steps in issue order; a step is one action, or a forward and the backward paired with it */
  readonly steps: readonly (readonly Action[])[];
  /** the nodes of each of this rank's passes (passKey), in graph order */
  readonly passNodes: ReadonlyMap<string, readonly Node[]>;
  /** levels 2 and 3: the encoder's nodes, run apart from the decoder's passes */
  readonly encoderForward: readonly Node[];
  readonly encoderBackward: readonly Node[];
  /** values some node of this rank reads (which parameters and inputs it holds) */
  readonly used: ReadonlySet<string>;
}

/** one pass of a schedule step: a chunk (global virtual stage), its phase, a microbatch */
export interface PassRef {
  readonly chunk: number;
  readonly phase: 'forward' | 'backward';
  readonly mb: number;
}

export const passKey = (chunk: number, phase: string): string => `${chunk}:${phase}`;

export function scheduleProgram(g: Graph, opts: EmitOptions): ProgramSchedule {
  const m = opts.numMicrobatches;
  if (!Number.isInteger(m) || m < 1)
    throw new Error(`numMicrobatches must be a positive integer, got ${m}`);
  const pipe: EmitPipeline = {
    stage: 0,
    pp: 1,
    chunkOf: g.nodes.map((n) => (n.phase === 'optimizer' ? -1 : 0)),
    transfers: [],
    actions: Array.from({ length: m }, (_, mb) => [
      { kind: 'F' as const, microbatch: mb, chunk: 0 },
      { kind: 'B' as const, microbatch: mb, chunk: 0 },
    ]).flat(),
    ...opts.pipeline,
  };
  const mine = (chunk: number) => chunk >= 0 && chunk % pipe.pp === pipe.stage;
  const passNodes = new Map<string, Node[]>();
  const used = new Set<string>();
  // levels 2 and 3: every rank of the encoder's gradient group holds its parameters, encoding or not
  const enc = opts.encoder;
  const encoderForward: Node[] = [];
  const encoderBackward: Node[] = [];
  const runsEncoder = enc !== undefined && (enc.placement.level === 3 || pipe.stage === 0);
  g.nodes.forEach((n, i) => {
    const c = pipe.chunkOf[i];
    if (enc && n.phase !== 'optimizer' && isEncoderScope(n.scope)) {
      if (!runsEncoder) return;
      (n.phase === 'forward' ? encoderForward : encoderBackward).push(n);
      for (const v of n.inputs) used.add(v);
      return;
    }
    if (!mine(c)) return;
    const k = passKey(c, n.phase);
    let list = passNodes.get(k);
    if (!list) passNodes.set(k, (list = []));
    list.push(n);
    for (const v of n.inputs) used.add(v);
  });
  return { pipe, steps: stepsOf(pipe), passNodes, encoderForward, encoderBackward, used };
}

/**
 * The schedule's actions grouped into steps; the batch between two steps carries everything the
 * first sends and the second receives (Megatron's send_forward_backward_recv_forward_backward).
 */
function stepsOf(pipe: EmitPipeline): Action[][] {
  const steps: Action[][] = [];
  const w = pipe.warmup ?? pipe.actions.length;
  pipe.actions.forEach((a, i) => {
    const paired =
      i > w &&
      i < pipe.actions.length &&
      (i - w) % 2 === 1 &&
      a.kind === 'B' &&
      pipe.actions[i - 1].kind === 'F';
    if (paired) steps[steps.length - 1].push(a);
    else steps.push([a]);
  });
  return steps;
}

/** The passes of one step, with their global chunk. */
export function passesOf(s: ProgramSchedule, a: Action): PassRef[] {
  const passOf = (kind: 'F' | 'B', x: { chunk: number; microbatch: number }): PassRef => ({
    chunk: x.chunk * s.pipe.pp + s.pipe.stage,
    phase: kind === 'F' ? 'forward' : 'backward',
    mb: x.microbatch,
  });
  return a.kind === 'FB' ? [passOf('F', a.f), passOf('B', a.b)] : [passOf(a.kind, a)];
}

/** The schedule as text (--dump-after schedule): a line per step, then the encoder's part. */
export function printSchedule(s: ProgramSchedule): string {
  const pass = (x: PassRef) => `${x.phase === 'forward' ? 'F' : 'B'}${x.mb}@chunk${x.chunk}`;
  const lines = [`stage ${s.pipe.stage} of ${s.pipe.pp}: ${s.steps.length} steps`];
  s.steps.forEach((step, k) => {
    const passes = step.flatMap((a) => passesOf(s, a));
    const combined = step.length === 1 && step[0].kind === 'FB' ? '  (combined)' : '';
    const nodes = passes.map((x) => s.passNodes.get(passKey(x.chunk, x.phase))?.length ?? 0);
    lines.push(
      `  step ${k}: ${passes.map(pass).join(' + ')}${combined}  nodes ${nodes.join(' + ')}`,
    );
  });
  if (s.encoderForward.length || s.encoderBackward.length)
    lines.push(
      `  encoder apart: ${s.encoderForward.length} forward nodes, ${s.encoderBackward.length} backward nodes`,
    );
  return lines.join('\n') + '\n';
}
