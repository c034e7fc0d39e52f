// A one-rank plan trained in this process on the synthetic data, with chosen instructions' outputs
// kept readable after each step (router decisions, dropped assignments, expert counts): the
// multi-rank tests' view of what one rank computed, and bench/routing.ts's measure of routing.
// The data is what `lfc run` synthesizes for the same plan (runtime/train.ts).
import type { ProgramFile } from '../compiler/plan/format.js';
import { loadWeights } from './checkpoint.js';
import { loadNative, type NativeRuntime } from './native.js';
import { readPlan } from './plan-io.js';
import { RankState } from './state.js';

export interface Instruction {
  scope: string;
  op: string;
  phase: string;
  outputs: number[];
  microbatch: number;
  attrs: { k?: number };
}

/**
 * Trains a one-rank plan `steps` steps from `seed` in this process; the outputs `keep` names get bytes of their
 * own, so that they still hold their values after the step, and `read` sees each keeping
 * instruction after each step.
 */
export async function stepOneRank(
  planDir: string,
  steps: number,
  seed: number,
  keep: (ins: Instruction) => number[],
  read: (rt: NativeRuntime, ins: Instruction, step: number) => void,
  /** start from these weights (a safetensors file of whole tensors) instead of the initializer */
  weights?: string,
): Promise<void> {
  const loaded = readPlan(planDir);
  const program = JSON.parse(loaded.programTexts.get('p0')!) as {
    regions: { arena: number };
    buffers: { offset: number; bytes: number }[];
    instructions: Instruction[];
  };
  let top = Math.ceil(program.regions.arena / 64) * 64;
  const kept = program.instructions.filter((ins) => keep(ins).length > 0);
  for (const ins of kept)
    for (const id of keep(ins)) {
      const b = program.buffers[id];
      b.offset = top;
      top += Math.ceil(b.bytes / 64) * 64;
    }
  program.regions.arena = top;
  const plan = loaded.plan;
  const rt = new (loadNative().Runtime)(JSON.stringify(program), { symbols: plan.symbols });
  rt.initParams(seed, plan.params);
  if (weights) loadWeights(weights, new RankState(program as unknown as ProgramFile, rt));
  const m = plan.training.numMicrobatches;
  const vocab = (plan.model.config as { text_decoder: { vocab_size: number } }).text_decoder
    .vocab_size;
  for (let step = 1; step <= steps; step++) {
    let lossTokens = 0;
    let captionTokens = 0;
    for (let j = 0; j < m; j++) {
      const mb = rt.synthesize(j, seed, step - 1, j, {
        seqLength: plan.training.seqLength * plan.training.microBatchSize,
        vocab,
        maxVisualTokens: plan.training.maxVisualTokens,
      });
      lossTokens += mb.lossMask.reduce((a, b) => a + b, 0);
      captionTokens += rt.captionMask(j).reduce((a, b) => a + b, 0);
    }
    rt.setScalar('loss_tokens', lossTokens);
    rt.setScalar('caption_tokens', Math.max(1, captionTokens));
    await rt.step({ lr: plan.training.optimizer.lr, step });
    for (const ins of kept) read(rt, ins, step);
  }
}
