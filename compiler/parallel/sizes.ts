// Parallel sizes: the cluster shape and the degree of each kind of parallelism, as the user gives
// them (Megatron's flags), and the derived degrees. Shared by the layout rules (validate.ts) and
// the topology (topology.ts), which both read sizes and nothing else from each other.

export interface ParallelSizes {
  /** --nnodes */
  readonly nnodes: number;
  /** --nproc-per-node */
  readonly nprocPerNode: number;
  /** --tensor-model-parallel-size: decoder tensor parallelism */
  readonly tp: number;
  /** --pipeline-model-parallel-size */
  readonly pp: number;
  /** --num-virtual-stages-per-pipeline-rank: model chunks per stage (does not change groups) */
  readonly vpp: number;
  /** --expert-model-parallel-size */
  readonly ep: number;
  /** --expert-tensor-parallel-size: tensor parallelism inside experts; defaults to tp */
  readonly etp?: number;
  /** --context-parallel-size (only 1 is built) */
  readonly cp: number;
  /**
   * the vision encoder's tensor parallelism (its config's tensor_model_parallel_size); divides tp;
   * defaults to tp (the encoder shares the decoder's TP groups)
   */
  readonly encoderTp?: number;
}

/** Sizes with defaults filled in and the derived degrees. */
export interface ResolvedSizes extends Required<ParallelSizes> {
  /** nnodes · nprocPerNode */
  readonly world: number;
  /** decoder data parallelism: world / (tp · cp · pp) */
  readonly dp: number;
  /** expert data parallelism: world / (etp · ep · pp) */
  readonly edp: number;
}

/** The flag of each size, for messages. */
export const SIZE_FLAGS = {
  nnodes: '--nnodes',
  nprocPerNode: '--nproc-per-node',
  tp: '--tensor-model-parallel-size',
  pp: '--pipeline-model-parallel-size',
  vpp: '--num-virtual-stages-per-pipeline-rank',
  ep: '--expert-model-parallel-size',
  etp: '--expert-tensor-parallel-size',
  cp: '--context-parallel-size',
  encoderTp: 'model.image_encoder.tensor_model_parallel_size',
} as const satisfies Record<keyof ParallelSizes, string>;

/**
 * Fills etp and encoderTp and derives world, dp and edp (dp and edp may be fractions if the sizes
 * are bad).
 */
export function resolveSizes(s: ParallelSizes): ResolvedSizes {
  const etp = s.etp ?? s.tp;
  const encoderTp = s.encoderTp ?? s.tp;
  const world = s.nnodes * s.nprocPerNode;
  return {
    nnodes: s.nnodes,
    nprocPerNode: s.nprocPerNode,
    tp: s.tp,
    pp: s.pp,
    vpp: s.vpp,
    ep: s.ep,
    etp,
    cp: s.cp,
    encoderTp,
    world,
    dp: world / (s.tp * s.cp * s.pp),
    edp: world / (etp * s.ep * s.pp),
  };
}
