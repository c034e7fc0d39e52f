// Programs that differ only in labels. At encoder level 3 every TP rank is a program of its own,
// since each encodes its own microbatch slots in phase 1 (compiler/emit/encoder-runs.ts): round r
// encodes slot r·M + its model-parallel rank. Nothing else depends on the TP index, except on
// model-parallel rank 0 (stage 0's TP rank 0), the root that gathers every slot's outputs and
// broadcasts them to stage 0's TP ranks: the decoder's passes, the p2p, the handoff's
// collectives, the gradient sums, the optimizer and the memory plan are the same, and the
// encoder's runs are the same instructions over the same buffers (lowering creates the encoder's
// data inputs after the decoder's, in slot order, and stage 0's decoder reads every slot from an
// import, its own too). So the program of TP rank k is its stage's template's (TP rank 0's, or
// TP rank 1's on stage 0) with each encoded slot renamed to rank k's of the same round: the
// microbatch of the encoder's instructions, of the buffers they use, and of the data inputs, and
// the `.mb<slot>` of those buffers' names.
//
// test/plan/alike-programs.test.ts compiles level-3 layouts both ways and compares every program.

import { isEncoderScope, type EncoderPlacement } from '../parallel/encoder.js';
import {
  bufferWith,
  instructionWith,
  type PlanBuffer,
  type PlanInstruction,
  type ProgramFile,
} from '../plan/format.js';
import { noteRelabeled } from '../plan/program-json.js';

/** The TP rank whose program `stage`'s others are relabeled from (stage 0's rank 0 is the root). */
export function templateTp(stage: number): number {
  return stage === 0 ? 1 : 0;
}

/**
 * TP rank k's slots by its stage's template's (templateTp; the same rounds), where the program of
 * (stage, k) is the template's relabeled; undefined for the template itself, the root, or a round
 * that encodes a real microbatch on one rank and none on the other.
 */
export function siblingSlots(
  placement: EncoderPlacement,
  stage: number,
  tp: number,
  microbatches: number,
): ReadonlyMap<number, number> | undefined {
  const template = templateTp(stage);
  if (placement.level !== 3 || tp <= template) return undefined;
  // each rank's slots, one a round (the placement's rule: encoder-runs.ts encodes by it)
  const from = placement.slotsOf(template, stage);
  const to = placement.slotsOf(tp, stage);
  if (from.length !== to.length) return undefined;
  const map = new Map<number, number>();
  for (let r = 0; r < from.length; r++) {
    if (from[r] < microbatches !== to[r] < microbatches) return undefined;
    if (from[r] < microbatches) map.set(from[r], to[r]);
  }
  return map;
}

/** Program `template` as `id`, each encoded slot renamed by `slots` (see the header). */
export function relabeledProgram(
  template: ProgramFile,
  id: string,
  slots: ReadonlyMap<number, number>,
): ProgramFile {
  const { buffers } = template;
  const moved = new Uint8Array(buffers.length);
  const mark = (b: number, mb: number) => {
    if (buffers[b].microbatch === mb) moved[b] = 1;
    const root = buffers[b].viewOf;
    if (root !== undefined && buffers[root].microbatch === mb) moved[root] = 1;
  };
  const instructions: PlanInstruction[] = template.instructions.map((x) => {
    const to = slots.get(x.microbatch);
    if (to === undefined || !isEncoderScope(x.scope)) return x;
    for (const b of x.inputs) mark(b, x.microbatch);
    for (const b of x.outputs) mark(b, x.microbatch);
    return instructionWith(x, { microbatch: to });
  });
  const relabeled: PlanBuffer[] = buffers.map((b, k) => {
    if (!moved[k]) return b;
    const to = slots.get(b.microbatch)!;
    const suffix = `.mb${b.microbatch}`;
    const name = b.name.endsWith(suffix) ? `${b.name.slice(0, -suffix.length)}.mb${to}` : b.name;
    return bufferWith(b, { name, microbatch: to });
  });
  const program: ProgramFile = {
    ...template,
    id,
    buffers: relabeled,
    inputs: template.inputs.map((i) =>
      moved[i.buffer] ? { ...i, microbatch: slots.get(i.microbatch)! } : i,
    ),
    instructions,
  };
  // its JSON takes the template's text wherever it holds the template's objects
  noteRelabeled(program, template);
  return program;
}
