// The step dump of tiny-vlm.md (`lfc run DIR --dump-step OUT`), the same files under any layout:
//   weights.safetensors  every parameter before the step: whole tensors, checkpoint names
//   batch.safetensors    the step's global batch (batch.ts): global microbatch dpIndex·m + j as mb{…}
//   grads.safetensors    every trainable parameter's gradient of the step, summed over the global
//                        batch (microbatches and data-parallel ranks), before clipping
//   step.json            the loss and its terms, loss tokens, the gradient norm, the optimizer
//
// A rank captures its share: the pieces of the parameters it holds before the step and of their
// gradients after it. With the distributed optimizer, a parameter in a bucket holds only this
// rank's unsummed gradient; the sum exists only as the rank's slice of the bucket's
// reduce-scatter, so that slice is captured instead. Rank 0 assembles whole tensors from every
// share as checkpoints do (checkpoint.ts assembleWhole) and writes the dump once; one rank takes
// the same path with its own share.

import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { makeDirs } from '../compiler/files.js';
import type { PlanFile, ProgramFile } from '../compiler/plan/format.js';
import { writeBatchFile, type Microbatch } from './batch.js';
import { assembleWhole } from './checkpoint.js';
import { writeSafetensors, type Tensor } from './safetensors.js';
import type { RankState } from './state.js';
import type { StepMetrics } from './metrics.js';

/** A rank's share of the dump: `param.<p>`, `grad.<p>`, `shard<k>.grad` (checkpoint.ts ShareKind). */
export type DumpShare = Map<string, Tensor>;

const f32 = (data: Float32Array, shape: readonly number[]): Tensor => ({
  dtype: 'F32',
  shape: [...shape],
  data: data.slice(),
});

/** Before the step: copies of this rank's parameter pieces. */
export function captureWeights(state: RankState): DumpShare {
  return new Map(
    state.names().map((n) => [`param.${n}`, f32(state.read(n, 'param'), state.shape(n))]),
  );
}

/**
 * After the step: this rank's pieces of the summed gradients join the share, `grad.<p>` per
 * parameter and `shard<k>.grad` per distributed-optimizer bucket (whose parameters' own gradient
 * buffers hold the unsummed local gradient and are left out).
 */
export function captureGrads(
  share: DumpShare,
  state: RankState,
  program: ProgramFile,
  groupRank: (kind: string) => number,
): void {
  const shards = program.optimizerShards ?? [];
  const bucketed = new Set(shards.flatMap((s) => s.params.map((p) => p.name)));
  for (const n of state.names()) {
    if (state.has(n, 'grad') && !bucketed.has(n))
      share.set(`grad.${n}`, f32(state.read(n, 'grad'), state.shape(n)));
  }
  shards.forEach((s, k) => {
    const length = s.elements / s.parts;
    const at = groupRank(s.group) * length;
    const slice = state.readBuffer(bucketGradOf(program, k)).subarray(at, at + length);
    share.set(`shard${k}.grad`, f32(slice, [length]));
  });
}

/**
 * The gradient bucket k was reduce-scattered in place into (its block of this rank holds the
 * sum): what the group_slice reads that gives the gradient input of the adamw updating the
 * bucket's moments (inputs: param, grad, exp_avg, exp_avg_sq, clip_coef[, master]).
 */
function bucketGradOf(program: ProgramFile, k: number): number {
  const s = program.optimizerShards![k];
  const adamw = program.instructions.find((i) => i.op === 'adamw' && i.inputs[2] === s.expAvg);
  const slice = adamw?.inputs[1];
  const cut = program.instructions.find((i) => i.op === 'group_slice' && i.outputs[0] === slice);
  if (!cut)
    throw new Error(`program ${program.id}: no gradient slice feeds optimizer bucket ${k}'s adamw`);
  return cut.inputs[0];
}

export interface StepDump {
  readonly weights: Map<string, Tensor>;
  readonly grads: Map<string, Tensor>;
  readonly batch: Microbatch[];
}

/**
 * Whole tensors from every rank's share (`shareOf(rank)`), and the global batch from each
 * data-parallel index's microbatches (`batchOf(dpIndex)`), in global microbatch order.
 */
export function assembleDump(
  plan: PlanFile,
  programs: ReadonlyMap<string, ProgramFile>,
  shareOf: (rank: number) => ReadonlyMap<string, Tensor>,
  batchOf: (dpIndex: number) => readonly Microbatch[],
): StepDump {
  const whole = assembleWhole(
    plan,
    programs,
    shareOf,
    ['param', 'grad'],
    (kind, p) => kind === 'param' || p.trainable,
  );
  const dpSize = plan.dataParallel?.size ?? 1;
  return {
    weights: whole.get('param')!,
    grads: whole.get('grad')!,
    batch: Array.from({ length: dpSize }, (_, d) => batchOf(d)).flat(),
  };
}

export function writeDump(
  dir: string,
  dump: StepDump,
  m: StepMetrics,
  plan: PlanFile,
  lossTokens: number,
): void {
  makeDirs(dir);
  writeSafetensors(join(dir, 'weights.safetensors'), dump.weights);
  writeBatchFile(join(dir, 'batch.safetensors'), dump.batch);
  writeSafetensors(join(dir, 'grads.safetensors'), dump.grads);
  const o = plan.training.optimizer;
  const stepJson = {
    loss: m.loss,
    ce_loss: m.ceLoss,
    aux_loss: m.auxLoss,
    loss_tokens: lossTokens,
    grad_norm: m.gradNorm,
    optimizer: {
      lr: m.lr,
      beta1: o.beta1,
      beta2: o.beta2,
      eps: o.eps,
      weight_decay: o.weightDecay,
      clip_norm: o.clipNorm,
    },
  };
  writeFileSync(join(dir, 'step.json'), JSON.stringify(stepJson, null, 1) + '\n');
}
