// The layouts of the equivalence matrix (test/multirank/equivalence.test.ts: each trained against
// one rank), shared with the plan digests (test/plan/digests.test.ts: each compiled byte for byte
// as before a change).
import { DEMO_LAYOUT } from './helpers.js';

/** every layout's batch: 4 microbatches of one sample */
export const BATCH = ['--global-batch-size', '4', '--micro-batch-size', '1'];

export interface Layout {
  readonly name: string;
  readonly model: 'tiny-vlm-moe' | 'tiny-vlm' | 'qwen2.5-vl-tiny' | 'qwen3-vl-moe-tiny';
  readonly ranks: number;
  readonly flags: readonly string[];
  /** overrides the one-rank baseline is compiled with too (default: none) */
  readonly baseline?: readonly string[];
  /** both runs replay the imbalanced batch (IMBALANCED) every step instead of synthetic data */
  readonly imbalanced?: boolean;
  /**
   * mixed precision (--bf16, layout and baseline alike): losses and parameters are held to
   * BF16_TOLERANCE instead of the f32 rows' 1e-5 and 1e-4
   */
  readonly bf16?: boolean;
}

/**
 * The bf16 rows' tolerance against one rank in bf16. A layout sums in another order than one rank
 * (a tensor-parallel all-reduce of bf16 partial sums rounds once per sum where one rank's GEMM
 * rounds its f32 accumulator once; pipeline stages and expert ranks cut the same work apart), so
 * values differ by bf16 rounding (2⁻⁹ relative per rounding, not f32's 2⁻²⁴): measured, the
 * losses of 3 steps by at most 1.4e-5 relative (tp 2) on an AVX2 machine, and by 1.13e-4 with the
 * encoder split too (tp 2, encoder tp 2) on an AVX-512 one (Zen 4, whose kernels round in another
 * order); the bound is 3e-4, still 7× under one bf16 rounding. AdamW then turns those differences into
 * whole steps: an element whose gradient is near zero moves ±lr either way, so after 3 steps of
 * lr 1e-3 a zero-initialised bias differs by up to 25% of its norm and a routing near-tie moves an
 * expert's weights 7% apart. The parameters are therefore held per element to AdamW's step bound
 * (two runs differ by at most 2·lr per step) and over the whole model to a relative L2 of 5e-2
 * (measured at most 1.4e-2, tp 2); the gradients themselves are checked by cosine in
 * test/multirank/bf16.test.ts.
 */
export const BF16_TOLERANCE = { loss: 3e-4, modelParam: 5e-2 };

export const FROZEN = ['model.image_encoder.freeze=true'];
/** tied input embedding and output weight (Qwen2.5-VL-3B's) */
export const TIED = 'model.text_decoder.untie_embeddings_and_output_weights=false';
export const SELECTIVE = ['--recompute-granularity', 'selective', '--recompute-modules'];
export const OFFLOAD = ['--fine-grained-activation-offloading', '--offload-tensors'];
export const A2A_OVERLAP = ['--overlap-moe-expert-parallel-comm', '--delay-wgrad-compute'];
/** the article's combination at small scale */
export const ARTICLE = [
  ...['--pp', '2', '--vpp', '2', '--ep', '2', '--enable-full-hetero-dp', ...A2A_OVERLAP],
  ...[...SELECTIVE, 'a2a_overlap_attn', 'a2a_overlap_post_attn', 'a2a_overlap_mlp'],
  ...[...OFFLOAD, 'dispatched_input', 'pre_mlp_layernorm_output'],
];
/**
 * token dropping: each expert keeps 8 of a microbatch's 256 assignments (capacity ceil(256/8 ·
 * 0.25)), which drops real tokens in every step (checked below). At 0.5 one element of
 * visual.blocks.1.attn.proj.bias has a round-off-level gradient (−4.0e-7 against a max-abs of
 * 0.06 at step 1, the two runs within 4%) that AdamW turns into steps of ±lr, so that tensor
 * misses the 1e-4 parameter criterion while every gradient agrees within 1.4e-6 of its max-abs.
 */
export const CAPACITY = ['--moe-expert-capacity-factor', '0.25'];
/** the same with the drop policy position (CAPACITY has Megatron's default, probs) */
export const CAPACITY_POSITION = [...CAPACITY, '--moe-token-drop-policy', 'position'];

export const LAYOUTS: readonly Layout[] = [
  { name: 'dp2', model: 'tiny-vlm-moe', ranks: 2, flags: [] },
  { name: 'tp2', model: 'tiny-vlm-moe', ranks: 2, flags: ['--tp', '2'] },
  {
    name: 'tp2-sp',
    model: 'tiny-vlm-moe',
    ranks: 2,
    flags: ['--tp', '2', '--sequence-parallel'],
  },
  { name: 'pp2', model: 'tiny-vlm-moe', ranks: 2, flags: ['--pp', '2'] },
  {
    name: 'pp2-vpp2',
    model: 'tiny-vlm-moe',
    ranks: 2,
    flags: ['--pp', '2', '--vpp', '2'],
  },
  // Megatron's even split with the embedding and the loss counted as layers: 4 layers + 2 over
  // 6 virtual stages, so stage 0's first chunk holds only the embedding (and the encoder) and
  // stage 1's last only lm_head and the loss
  {
    name: 'pp2-vpp3-account-for',
    model: 'tiny-vlm-moe',
    ranks: 2,
    flags: [
      ...['--pp', '2', '--vpp', '3'],
      ...['--account-for-embedding-in-pipeline-split', '--account-for-loss-in-pipeline-split'],
    ],
  },
  { name: 'ep2', model: 'tiny-vlm-moe', ranks: 2, flags: ['--ep', '2'] },
  // DeepEP's dispatcher: the same rows move, its exchanges marked for the simulator's price
  {
    name: 'ep2-flex',
    model: 'tiny-vlm-moe',
    ranks: 2,
    flags: ['--ep', '2', '--moe-token-dispatcher-type', 'flex'],
  },
  // the MoE dispatch under SP: each tp rank routes its own tokens, gathered inside the tp group
  // for the experts (sequence parallelism is implied by tp and ep together)
  { name: 'tp2-ep2', model: 'tiny-vlm-moe', ranks: 4, flags: ['--tp', '2', '--ep', '2'] },
  // expert TP below TP: at 1 the experts run whole on each rank's own routed rows (no gather
  // inside the tp group); at 2 under tp 4 the gather and the expert split run on the etp groups
  {
    name: 'tp2-ep2-etp1',
    model: 'tiny-vlm-moe',
    ranks: 4,
    flags: ['--tp', '2', '--ep', '2', '--expert-tensor-parallel-size', '1'],
  },
  {
    name: 'tp4-ep2-etp2',
    model: 'tiny-vlm-moe',
    ranks: 4,
    flags: ['--tp', '4', '--ep', '2', '--expert-tensor-parallel-size', '2'],
  },
  {
    name: 'a2a-overlap-tp2-ep2',
    model: 'tiny-vlm-moe',
    ranks: 4,
    flags: [
      '--tp',
      '2',
      '--ep',
      '2',
      '--overlap-moe-expert-parallel-comm',
      '--delay-wgrad-compute',
    ],
  },
  { name: 'ep4', model: 'tiny-vlm-moe', ranks: 4, flags: ['--ep', '4'] },
  {
    name: 'tp2-pp2',
    model: 'tiny-vlm-moe',
    ranks: 4,
    flags: ['--tp', '2', '--pp', '2'],
  },
  { name: 'dist-opt-dp2', model: 'tiny-vlm-moe', ranks: 2, flags: ['--use-distributed-optimizer'] },
  {
    name: 'dist-opt-dp2-tp2',
    model: 'tiny-vlm-moe',
    ranks: 4,
    flags: ['--tp', '2', '--use-distributed-optimizer'],
  },
  // the encoder levels (the tiny encoders' YAML says encoder TP 1, so tp 2 above is level 1)
  {
    name: 'tp2-encoder-tp2',
    model: 'tiny-vlm-moe',
    ranks: 2,
    flags: ['--tp', '2', 'model.image_encoder.tensor_model_parallel_size=2'],
  },
  {
    name: 'level2-tp2',
    model: 'tiny-vlm-moe',
    ranks: 2,
    flags: ['--tp', '2', '--enable-encoder-hetero-dp'],
  },
  {
    name: 'level2-tp4',
    model: 'tiny-vlm-moe',
    ranks: 4,
    flags: ['--tp', '4', '--enable-encoder-hetero-dp'],
  },
  {
    name: 'level3-tp2-pp2',
    model: 'tiny-vlm-moe',
    ranks: 4,
    flags: ['--tp', '2', '--pp', '2', '--enable-full-hetero-dp'],
  },
  // one stage of 4 TP ranks: TP ranks 2 and 3 are TP rank 1's program relabeled
  // (compiler/emit/alike-programs.ts)
  {
    name: 'level3-tp4',
    model: 'tiny-vlm-moe',
    ranks: 4,
    flags: ['--tp', '4', '--enable-full-hetero-dp'],
  },
  {
    name: 'level3-tp2-pp2-offload',
    model: 'tiny-vlm-moe',
    ranks: 4,
    flags: ['--tp', '2', '--pp', '2', '--enable-full-hetero-dp', '--full-hetero-dp-cpu-offload'],
  },
  {
    name: 'level3-tp2-pp2-recompute',
    model: 'tiny-vlm-moe',
    ranks: 4,
    flags: [
      '--tp',
      '2',
      '--pp',
      '2',
      '--enable-full-hetero-dp',
      '--full-hetero-dp-encoder-recompute',
    ],
  },
  {
    name: 'a2a-overlap-ep2',
    model: 'tiny-vlm-moe',
    ranks: 2,
    flags: ['--ep', '2', '--overlap-moe-expert-parallel-comm', '--delay-wgrad-compute'],
  },
  {
    name: 'level3-a2a-overlap-pp2-vpp2-ep2',
    model: 'tiny-vlm-moe',
    ranks: 4,
    flags: [...DEMO_LAYOUT],
  },
  // encoder freeze (LoongForge's +model.image_encoder.freeze=True) under levels 2 and 3
  {
    name: 'level2-tp2-frozen',
    model: 'tiny-vlm-moe',
    ranks: 2,
    flags: ['--tp', '2', '--enable-encoder-hetero-dp', '+model.image_encoder.freeze=True'],
    baseline: FROZEN,
  },
  {
    name: 'level3-tp2-pp2-frozen',
    model: 'tiny-vlm-moe',
    ranks: 4,
    flags: ['--tp', '2', '--pp', '2', '--enable-full-hetero-dp', ...FROZEN],
    baseline: FROZEN,
  },
  // selective recompute and fine-grained activation offload
  {
    name: 'selective-recompute-tp2-ep2',
    model: 'tiny-vlm-moe',
    ranks: 4,
    flags: ['--tp', '2', '--ep', '2', ...SELECTIVE, 'core_attn', 'moe_act', 'layernorm'],
  },
  {
    name: 'activation-offload-ep2',
    model: 'tiny-vlm-moe',
    ranks: 2,
    flags: ['--ep', '2', ...OFFLOAD, 'dispatched_input', 'pre_mlp_layernorm_output'],
  },
  // the article's combination at small scale: full separation, A2A overlap with delayed wgrad,
  // selective recompute of the overlap's segments and activation offload
  {
    name: 'article-pp2-vpp2-ep2',
    model: 'tiny-vlm-moe',
    ranks: 4,
    flags: ARTICLE,
  },
  {
    name: 'article-pp2-vpp2-ep2-cpu-offload',
    model: 'tiny-vlm-moe',
    ranks: 4,
    flags: [...ARTICLE, '--full-hetero-dp-cpu-offload'],
  },
  // ViT DP balance on a batch built to be imbalanced: over dp and over every rank (level 3)
  {
    name: 'vit-balance-dp2',
    model: 'tiny-vlm-moe',
    ranks: 2,
    flags: ['--use-vit-dp-balance'],
    imbalanced: true,
  },
  {
    name: 'vit-balance-level3-tp2-pp2',
    model: 'tiny-vlm-moe',
    ranks: 4,
    flags: ['--tp', '2', '--pp', '2', '--enable-full-hetero-dp', '--use-vit-dp-balance'],
    imbalanced: true,
  },
  {
    // 2 microbatches per data-parallel rank over 4 encoding ranks: the mock slots encode too;
    // with what the encoder leaves idle across the pipeline's peak on the host
    name: 'vit-balance-level3-mock-slots-offload',
    model: 'tiny-vlm-moe',
    ranks: 8,
    flags: [
      ...['--tp', '2', '--pp', '2', '--enable-full-hetero-dp', '--use-vit-dp-balance'],
      '--full-hetero-dp-cpu-offload',
    ],
    imbalanced: true,
  },
  // token dropping: the same assignments dropped on every layout, so the same losses as one rank
  // with the same capacity factor
  {
    name: 'capacity-position-ep2',
    model: 'tiny-vlm-moe',
    ranks: 2,
    flags: ['--ep', '2', ...CAPACITY_POSITION],
    baseline: CAPACITY_POSITION,
  },
  {
    name: 'capacity-article-pp2-vpp2-ep2',
    model: 'tiny-vlm-moe',
    ranks: 4,
    flags: [...ARTICLE, ...CAPACITY],
    baseline: CAPACITY,
  },
  { name: 'vlm-dp2', model: 'tiny-vlm', ranks: 2, flags: [] },
  { name: 'vlm-tp2', model: 'tiny-vlm', ranks: 2, flags: ['--tp', '2'] },
  { name: 'vlm-pp2', model: 'tiny-vlm', ranks: 2, flags: ['--pp', '2'] },
  {
    name: 'vlm-level2-tp2',
    model: 'tiny-vlm',
    ranks: 2,
    flags: ['--tp', '2', '--enable-encoder-hetero-dp'],
  },
  // tied embeddings under pipeline parallelism: the first stage's embedding and the last
  // stage's output layer share one weight, its two gradients summed over embd; pp 4 has middle
  // stages in no embd group
  {
    name: 'vlm-pp2-tied',
    model: 'tiny-vlm',
    ranks: 2,
    flags: ['--pp', '2', TIED],
    baseline: [TIED],
  },
  {
    name: 'vlm-pp2-dp2-tied-dist-opt',
    model: 'tiny-vlm',
    ranks: 4,
    flags: ['--pp', '2', '--use-distributed-optimizer', TIED],
    baseline: [TIED],
  },
  {
    name: 'vlm-pp4-tied',
    model: 'tiny-vlm',
    ranks: 4,
    flags: ['--pp', '4', TIED],
    baseline: [TIED],
  },
  {
    name: 'vlm-level3-pp2',
    model: 'tiny-vlm',
    ranks: 2,
    flags: ['--pp', '2', '--enable-full-hetero-dp'],
  },
  // the Qwen architectures at tiny widths (docs/qwen-vl.md): window attention, 2-D rotary ViT,
  // M-RoPE and tied embeddings (qwen2.5-vl-tiny, so its pipeline rows are the tied rows), the
  // interpolated position table, deepstack, interleaved M-RoPE and MoE (qwen3-vl-moe-tiny)
  { name: 'qwen25-tp2', model: 'qwen2.5-vl-tiny', ranks: 2, flags: ['--tp', '2'] },
  {
    name: 'qwen25-pp2-vpp2-tied',
    model: 'qwen2.5-vl-tiny',
    ranks: 2,
    flags: ['--pp', '2', '--vpp', '2'],
  },
  {
    name: 'qwen25-tp2-pp2-tied',
    model: 'qwen2.5-vl-tiny',
    ranks: 4,
    flags: ['--tp', '2', '--pp', '2'],
  },
  {
    name: 'qwen25-level2-tp2',
    model: 'qwen2.5-vl-tiny',
    ranks: 2,
    flags: ['--tp', '2', '--enable-encoder-hetero-dp'],
  },
  {
    name: 'qwen25-level3-tp2-pp2',
    model: 'qwen2.5-vl-tiny',
    ranks: 4,
    flags: ['--tp', '2', '--pp', '2', '--enable-full-hetero-dp'],
  },
  { name: 'qwen3-tp2', model: 'qwen3-vl-moe-tiny', ranks: 2, flags: ['--tp', '2'] },
  {
    name: 'qwen3-pp2-vpp2',
    model: 'qwen3-vl-moe-tiny',
    ranks: 2,
    flags: ['--pp', '2', '--vpp', '2'],
  },
  { name: 'qwen3-ep2', model: 'qwen3-vl-moe-tiny', ranks: 2, flags: ['--ep', '2'] },
  {
    name: 'qwen3-level2-tp2',
    model: 'qwen3-vl-moe-tiny',
    ranks: 2,
    flags: ['--tp', '2', '--enable-encoder-hetero-dp'],
  },
  {
    name: 'qwen3-level3-a2a-overlap-pp2-vpp2-ep2',
    model: 'qwen3-vl-moe-tiny',
    ranks: 4,
    flags: [...DEMO_LAYOUT],
  },
  // mixed precision: each layout against one rank in bf16
  ...(
    [
      ['dp2', 2, []],
      ['dist-opt-dp2', 2, ['--use-distributed-optimizer']],
      ['tp2', 2, ['--tp', '2']],
      // the encoder split too: its row-parallel biases are added once after the sum, in bf16
      ['tp2-encoder-tp2', 2, ['--tp', '2', 'model.image_encoder.tensor_model_parallel_size=2']],
      ['pp2-vpp2', 2, ['--pp', '2', '--vpp', '2']],
      ['ep2', 2, ['--ep', '2']],
      ['level2-tp2', 2, ['--tp', '2', '--enable-encoder-hetero-dp']],
      ['level3-a2a-overlap-pp2-vpp2-ep2', 4, [...DEMO_LAYOUT]],
    ] as const
  ).map(([name, ranks, flags]): Layout => ({
    name: `bf16-${name}`,
    model: 'tiny-vlm-moe',
    ranks,
    flags: [...flags, '--bf16'],
    baseline: ['--bf16'],
    bf16: true,
  })),
];
