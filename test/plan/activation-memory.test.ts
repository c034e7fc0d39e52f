// Activation memory of one decoder layer against an independent count. Qwen2.5-VL-7B's dense layer
// and Qwen3-VL-30B-A3B's MoE layer, at sequence 32768, one microbatch, bf16, with and without
// sequence parallelism (tp 2) and selective recompute. lfc's figure is what the plan keeps: the
// bytes of every buffer a forward instruction of the layer writes that a backward instruction
// reads (the bound of each: the expert dispatch of ep 1 holds exactly S·k rows).
//
// The count below is written from the config numbers, tensor by tensor, as Megatron-LM with flash
// attention and no dropout saves them for backward (the Korthikanti et al. accounting without the
// s² and dropout terms):
//   layer input x, the norm's output (input of the q/k/v projections), q and k after RoPE, v,
//   the attention output and its log-sum-exp (f32), the residual after attention, the second
//   norm's output (input of the MLP), and the MLP's gate and up outputs and its activation;
//   MoE: q and k before their qk-norm, the router's probabilities (f32), top-k weights (f32) and
//   expert ids, the permuted rows, each expert's gate, up and activation rows, the experts'
//   output rows (moe_unpermute's backward weighs them) and the row map.
// Tensor parallelism divides heads and FFN widths by t; sequence parallelism divides the tensors
// of the residual stream (and the norms' outputs, which Megatron keeps as the local shard and
// all-gathers again in backward) by t. Selective recompute drops what the recomputed modules make
// (core_attn: the attention output and its log-sum-exp; mlp: the gate, up and activation; moe_act:
// the experts' activation) and keeps their inputs.
//
// Where lfc differs, and why (each within the 10% the test allows):
//   - under sequence parallelism lfc keeps the all-gathered input of the first linear after each
//     norm ([S, h]) for its weight gradient, where Megatron keeps the [S/t, h] shard and gathers it
//     again in backward: lfc spends memory to save that second all-gather;
//   - the MoE auxiliary loss under sequence parallelism reads every token's expert ids in lfc
//     (gathered over tp, [S, k]), where Megatron all-reduces each rank's per-expert sums.

import { describe, expect, it } from 'vitest';
import { compile, type CompileOptions } from '../../compiler/pipeline.js';

const S = 32768;
const BF16 = 2;
const F32 = 4;

interface Layer {
  readonly h: number;
  readonly heads: number;
  readonly kvHeads: number;
  readonly headDim: number;
  /** dense FFN width, or the experts' */
  readonly ffn: number;
  /** MoE: experts and top-k */
  readonly experts?: number;
  readonly k?: number;
  readonly qkNorm: boolean;
}

const QWEN25_7B: Layer = {
  h: 3584,
  heads: 28,
  kvHeads: 4,
  headDim: 128,
  ffn: 18944,
  qkNorm: false,
};
const QWEN3_30B: Layer = {
  h: 2048,
  heads: 32,
  kvHeads: 4,
  headDim: 128,
  ffn: 768,
  experts: 128,
  k: 8,
  qkNorm: true,
};

interface Setting {
  readonly tp: number;
  readonly sp: boolean;
  readonly recompute: readonly string[];
}

/** bytes per token one layer keeps for its backward, per Megatron's saved tensors */
function megatronBytesPerToken(l: Layer, s: Setting): number {
  const t = s.tp;
  const seq = s.sp ? t : 1; // the residual stream's split
  const q = l.heads * l.headDim;
  const kv = l.kvHeads * l.headDim;
  const drop = (m: string) => s.recompute.includes(m);
  let b = 0;
  b += (BF16 * l.h) / seq; // x, the layer's input (first norm's backward)
  b += (BF16 * l.h) / seq; // the first norm's output, input of q/k/v
  if (l.qkNorm) b += (BF16 * (q + kv)) / t; // q and k before their norms
  b += (BF16 * (q + 2 * kv)) / t; // q, k after RoPE, v
  if (!drop('core_attn')) b += (BF16 * q + F32 * l.heads) / t; // attention output, log-sum-exp
  b += (BF16 * l.h) / seq; // the residual after attention (second norm's backward)
  b += (BF16 * l.h) / seq; // the second norm's output, the MLP's input
  if (l.experts === undefined) {
    if (!drop('mlp')) b += (3 * BF16 * l.ffn) / t; // gate, up, activation
    return b;
  }
  // MoE: each rank routes its own tokens (under SP, S/t of them); the experts' input rows are
  // every tensor-parallel rank's rows, gathered
  const k = l.k!;
  b += (F32 * l.experts + F32 * k + 4 * k) / seq; // router probabilities, top-k weights, expert ids
  b += BF16 * k * l.h; // permuted rows (input of the experts' gate and up), gathered over tp
  b += (2 * BF16 * k * l.ffn) / t; // gate and up rows
  if (!drop('moe_act')) b += (BF16 * k * l.ffn) / t; // activation rows (down's input)
  b += (BF16 * k * l.h) / seq; // the experts' output rows of its own tokens (moe_unpermute's backward)
  b += (4 * k) / seq; // the row of each assignment
  return b;
}

/** bytes the plan keeps from layer `layer`'s forward to its backward (one microbatch) */
function plannedLayerBytes(o: CompileOptions, layer: number): number {
  const r = compile({ ...o, skipVerify: true });
  const p = r.programs[0];
  const root = (id: number) => {
    let b = p.buffers[id];
    while (b.viewOf !== undefined) b = p.buffers[b.viewOf];
    return b.id;
  };
  const writer = new Map<number, number>();
  const readInBackward = new Set<number>();
  p.instructions.forEach((ins, i) => {
    for (const id of ins.outputs) if (!writer.has(root(id))) writer.set(root(id), i);
    if (ins.phase === 'backward') for (const id of ins.inputs) readInBackward.add(root(id));
  });
  const scope = `model.layers.${layer}`;
  let bytes = 0;
  for (const [id, i] of writer) {
    const ins = p.instructions[i];
    const inLayer = ins.scope === scope || ins.scope.startsWith(`${scope}.`);
    if (
      ins.phase === 'forward' &&
      inLayer &&
      p.buffers[id].region === 'arena' &&
      readInBackward.has(id)
    )
      bytes += p.buffers[id].bytes;
  }
  return bytes;
}

const CASES: { model: string; layer: Layer; setting: Setting }[] = [
  { model: 'qwen2.5-vl-7b', layer: QWEN25_7B, setting: { tp: 1, sp: false, recompute: [] } },
  { model: 'qwen2.5-vl-7b', layer: QWEN25_7B, setting: { tp: 2, sp: true, recompute: [] } },
  {
    model: 'qwen2.5-vl-7b',
    layer: QWEN25_7B,
    setting: { tp: 1, sp: false, recompute: ['core_attn', 'mlp'] },
  },
  { model: 'qwen3-vl-30b-a3b', layer: QWEN3_30B, setting: { tp: 1, sp: false, recompute: [] } },
  { model: 'qwen3-vl-30b-a3b', layer: QWEN3_30B, setting: { tp: 2, sp: true, recompute: [] } },
  {
    model: 'qwen3-vl-30b-a3b',
    layer: QWEN3_30B,
    setting: { tp: 1, sp: false, recompute: ['core_attn', 'moe_act'] },
  },
];

describe('activation memory of one decoder layer against an independent count', () => {
  it.each(CASES)(
    '$model, tp $setting.tp, sp $setting.sp, recompute [$setting.recompute]',
    ({ model, layer, setting }) => {
      const planned = plannedLayerBytes(
        {
          model,
          seqLength: S,
          globalBatchSize: 1,
          nprocPerNode: setting.tp,
          parallel: { tp: setting.tp },
          sequenceParallel: setting.sp,
          recompute: setting.recompute.length
            ? { granularity: 'selective', modules: setting.recompute }
            : undefined,
          precision: { bf16: true },
        },
        5,
      );
      const counted = S * megatronBytesPerToken(layer, setting);
      const gib = (b: number) => (b / 2 ** 30).toFixed(3);
      console.log(
        `${model} tp ${setting.tp}${setting.sp ? ' sp' : ''} [${setting.recompute.join(' ')}]: planned ${gib(planned)} GiB, counted ${gib(counted)} GiB (×${(planned / counted).toFixed(3)})`,
      );
      expect(Math.abs(planned - counted) / counted).toBeLessThanOrEqual(0.1);
    },
    120_000,
  );
});
