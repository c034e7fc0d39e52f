// What emission is given for one program: the options of compiler/emit's passes.

import type { ParamDecl } from '../../ir/graph.js';
import type { Transfer } from '../../passes/parallel/pipeline.js';
import type { EncoderPlacement } from '../parallel/encoder.js';
import type { ActivationPolicy } from './activations.js';
import type { Action } from '../schedule/pipeline.js';

export interface EmitPipeline {
  /** this program's pipeline rank */
  readonly stage: number;
  readonly pp: number;
  /** virtual stage of every node (-1: the optimizer step) */
  readonly chunkOf: readonly number[];
  readonly transfers: readonly Transfer[];
  /** the stage's schedule: forward and backward passes, chunk = local chunk index */
  readonly actions: readonly Action[];
  /** warm-up forwards of the schedule: the steady-state forward/backward pairs follow them */
  readonly warmup?: number;
}

export interface EmitOptions {
  readonly numMicrobatches: number;
  readonly id?: string;
  /** absent fields: one stage holding every node (an A2A-overlap schedule without a pipeline
   * gives only its actions) */
  readonly pipeline?: Partial<EmitPipeline>;
  /**
   * Sizes of the groups gradients are summed over, by kind (dp, edp, tp, …). Dense gradients
   * sum over `dp`, expert gradients over `edp`, plus the kinds in a parameter's dist.gradSum;
   * kinds of size 1 are skipped.
   */
  readonly groupSizes?: Readonly<Record<string, number>>;
  /** bucket size of gradient sums; default 4 MiB */
  readonly bucketBytes?: number;
  /** --use-distributed-optimizer: reduce-scatter gradients and shard the optimizer over dp */
  readonly distributedOptimizer?: boolean;
  /**
   * How many ranks of the world hold each copy of a parameter's gradient after the sums, by
   * parameter name: the gradient norm weighs each local sum of squares by 1/that, then sums over
   * `world`. Absent: 1. (Plain data, so emission can run in a worker.)
   */
  readonly copies?: Readonly<Record<string, number>>;
  /** ranks in the world (the gradient norm is summed over them when > 1) */
  readonly worldSize?: number;
  /**
   * --delay-wgrad-compute: in combined steps, the experts' weight gradients run after the next
   * all-to-all is issued (it does not need them), hiding it
   */
  readonly delayWgrad?: boolean;
  /**
   * encoder levels 2 and 3: the encoder and projector (`visual.*`) run apart from the decoder's
   * passes, on the ranks and at the times compiler/parallel/encoder.ts gives
   */
  readonly encoder?: EmitEncoder;
  /** parameters whose gradient is also summed over embd (a tied weight on two stages) */
  readonly tied?: readonly string[];
  /** --recompute-granularity/--recompute-modules, --offload-tensors (compiler/emit/activations.ts) */
  readonly activations?: ActivationPolicy;
}

export interface EmitEncoder {
  readonly placement: EncoderPlacement;
  /** this program's decoder TP index (programs differ by it at levels 2 and 3) */
  readonly tp: number;
  readonly tpSize: number;
  /** level 3, --full-hetero-dp-cpu-offload: what the encoder leaves on the device through the
   * decoder's pipeline waits on the host (compiler/emit/encoder-offload.ts) */
  readonly offload?: boolean;
  /** level 3, --full-hetero-dp-encoder-recompute: the encoder forward runs again before backward */
  readonly recompute?: boolean;
}

export const DEFAULT_BUCKET_BYTES = 4 * 2 ** 20;

/** Whether the distributed optimizer shards a parameter's AdamW state (by its gradient group). */
export function shardable(opts: EmitOptions, p: ParamDecl): boolean {
  const groupSizes = opts.groupSizes ?? {};
  const dist = opts.distributedOptimizer === true && (groupSizes.dp ?? 1) > 1;
  return dist && (groupSizes[p.dist?.replicas ?? 'dp'] ?? 1) > 1;
}
