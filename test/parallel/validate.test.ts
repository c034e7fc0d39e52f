// Layout rules: each invalid layout below breaks exactly one rule and is refused with that rule's
// own message, numbers included; the valid layouts (the tiny models, the Qwen3-VL line of
// LoongForge's scripts, uneven pipeline stages, hetero TP, a 1024-rank layout, the article's
// hetero DP and full separation + A2A overlap launch lines) pass.
import { describe, expect, it } from 'vitest';
import { UserError } from '../../compiler/errors.js';
import { loadModelConfig } from '../../compiler/frontend/config.js';
import {
  nearestName,
  OFFLOAD_TENSORS,
  RECOMPUTE_MODULES,
} from '../../compiler/frontend/activation-names.js';
import type { ParallelSizes } from '../../compiler/parallel/sizes.js';
import {
  LAYOUT_RULES,
  validateParallel,
  type LayoutContext,
} from '../../compiler/parallel/validate.js';

interface Case {
  /** what the layout gets wrong, or right */
  readonly why: string;
  readonly model?: string;
  readonly overrides?: readonly string[];
  readonly sizes?: Partial<ParallelSizes>;
  readonly ctx?: Partial<Omit<LayoutContext, 'sizes' | 'config'>>;
  /** the whole message; absent: the layout is valid */
  readonly error?: string;
}

/** tiny-vlm-moe on one node of 8: tp 2, pp 2, ep 2 → dp 2, edp 2; 4 microbatches per dp rank */
function context(c: Case): LayoutContext {
  return {
    sizes: { nnodes: 1, nprocPerNode: 8, tp: 2, pp: 2, vpp: 1, ep: 2, cp: 1, ...c.sizes },
    config: loadModelConfig(c.model ?? 'tiny-vlm-moe', c.overrides ?? []),
    seqLength: 128,
    microBatchSize: 1,
    globalBatchSize: 8,
    ...c.ctx,
  };
}

function thrown(f: () => void): Error | undefined {
  try {
    f();
  } catch (e) {
    return e as Error;
  }
  return undefined;
}

const QWEN3 = 'qwen3-vl-30b-a3b'; // 48 MoE layers, 32 / 4 heads, 128 experts of FFN 768

const INVALID: readonly Case[] = [
  {
    why: 'hetero DP and full separation together',
    ctx: { encoder: { heteroDp: true, fullHeteroDp: true } },
    error:
      'invalid layout (encoder-levels-exclusive): --enable-encoder-hetero-dp (level 2, hetero DP) and --enable-full-hetero-dp (level 3, full separation) exclude each other; give one',
  },
  {
    why: 'hetero DP with encoder TP 2',
    overrides: ['model.image_encoder.tensor_model_parallel_size=2'],
    ctx: { encoder: { heteroDp: true } },
    error:
      'invalid layout (encoder-level-tp): --enable-encoder-hetero-dp needs encoder tensor parallel size 1, got 2 (model.image_encoder.tensor_model_parallel_size)',
  },
  {
    why: 'full separation with encoder TP 2',
    overrides: ['model.image_encoder.tensor_model_parallel_size=2'],
    ctx: { encoder: { fullHeteroDp: true } },
    error:
      'invalid layout (encoder-level-tp): --enable-full-hetero-dp needs encoder tensor parallel size 1, got 2 (model.image_encoder.tensor_model_parallel_size)',
  },
  {
    why: 'full separation with context parallelism',
    sizes: { cp: 2 },
    ctx: { encoder: { fullHeteroDp: true } },
    error:
      'invalid layout (full-hetero-dp-cp): --enable-full-hetero-dp (level 3, full separation) needs --context-parallel-size 1, got 2',
  },
  {
    why: 'encoder output offload without full separation',
    ctx: { encoder: { cpuOffload: true } },
    error:
      'invalid layout (full-hetero-dp-options): --full-hetero-dp-cpu-offload needs --enable-full-hetero-dp (full separation)',
  },
  {
    why: 'encoder recompute and offload under hetero DP',
    ctx: { encoder: { heteroDp: true, cpuOffload: true, recompute: true } },
    error:
      'invalid layout (full-hetero-dp-options): --full-hetero-dp-cpu-offload and --full-hetero-dp-encoder-recompute need --enable-full-hetero-dp (full separation)',
  },
  {
    why: 'A2A overlap without expert parallelism',
    sizes: { ep: 1, vpp: 2 },
    ctx: { moeOverlap: { overlap: true } },
    error:
      'invalid layout (a2a-overlap-ep): --overlap-moe-expert-parallel-comm needs expert parallelism (--expert-model-parallel-size is 1)',
  },
  {
    why: 'A2A overlap on pp 2 without virtual stages',
    ctx: { moeOverlap: { overlap: true } },
    error:
      'invalid layout (a2a-overlap-vpp): --overlap-moe-expert-parallel-comm with --pipeline-model-parallel-size 2 needs the interleaved schedule (--num-virtual-stages-per-pipeline-rank is 1)',
  },
  {
    why: 'A2A overlap with full recompute',
    sizes: { pp: 1 },
    ctx: { moeOverlap: { overlap: true }, recompute: { granularity: 'full' } },
    error:
      'invalid layout (a2a-overlap-full-recompute): --overlap-moe-expert-parallel-comm does not work with --recompute-granularity full (it interleaves sub-layer nodes of two microbatches); use selective with --recompute-modules a2a_overlap_attn a2a_overlap_post_attn a2a_overlap_mlp',
  },
  {
    why: 'delayed weight gradients without A2A overlap',
    ctx: { moeOverlap: { delayWgrad: true } },
    error:
      "invalid layout (delay-wgrad-needs-overlap): --delay-wgrad-compute needs --overlap-moe-expert-parallel-comm (the weight gradients it delays hide the overlap's all-to-alls)",
  },
  {
    why: 'recompute modules under full recompute',
    ctx: { recompute: { granularity: 'full', modules: ['core_attn', 'mlp'] } },
    error:
      'invalid layout (recompute-modules-selective): --recompute-modules core_attn mlp needs --recompute-granularity selective, got full',
  },
  {
    why: 'a misspelt recompute module',
    ctx: {
      recompute: { granularity: 'selective', modules: ['a2a_overlap_attn', 'a2a_overlap_mpl'] },
    },
    error:
      "invalid layout (recompute-module-known): --recompute-modules: unknown module 'a2a_overlap_mpl' (did you mean 'a2a_overlap_mlp'?); known: core_attn, mlp, moe, moe_act, layernorm, a2a_overlap_attn, a2a_overlap_post_attn, a2a_overlap_mlp",
  },
  {
    why: "the article's misspelt offload tensor pre_mlm_layernorm_output",
    ctx: { offloadTensors: ['dispatched_input', 'pre_mlm_layernorm_output'] },
    error:
      "invalid layout (offload-tensor-known): --offload-tensors: unknown tensor 'pre_mlm_layernorm_output' (did you mean 'pre_mlp_layernorm_output'?); known: dispatched_input, pre_mlp_layernorm_output, attn_norm, qkv_linear, core_attn, attn_proj, mlp_norm, expert_fc1, moe_act",
  },
  {
    why: 'an expert capacity for a dense decoder',
    model: 'tiny-vlm',
    overrides: ['+model.text_decoder.moe_expert_capacity_factor=1.5'],
    sizes: { ep: 1 },
    error:
      'invalid layout (moe-capacity-factor): --moe-expert-capacity-factor 1.5 needs an MoE decoder; tiny-vlm is dense',
  },
  {
    why: 'an expected routing imbalance below balanced',
    model: 'tiny-vlm-moe',
    overrides: ['+model.text_decoder.moe_expected_imbalance=0.8'],
    error:
      'invalid layout (moe-expected-imbalance): --moe-expected-imbalance (model.text_decoder.moe_expected_imbalance) must be at least 1 (balanced routing), got 0.8',
  },
  {
    why: 'an expected routing imbalance for a dense decoder',
    model: 'tiny-vlm',
    overrides: ['+model.text_decoder.moe_expected_imbalance=1.5'],
    sizes: { ep: 1 },
    error:
      'invalid layout (moe-expected-imbalance): --moe-expected-imbalance 1.5 needs an MoE decoder; tiny-vlm is dense',
  },
  {
    why: "DeepEP's dispatcher for a dense decoder",
    model: 'tiny-vlm',
    sizes: { ep: 1 },
    ctx: { moeTokenDispatcher: 'flex' },
    error:
      'invalid layout (moe-dispatcher-dense): --moe-token-dispatcher-type flex needs an MoE decoder; tiny-vlm is dense',
  },
  {
    why: 'a size of 0',
    sizes: { tp: 0 },
    error:
      'invalid layout (sizes-positive): --tensor-model-parallel-size must be a positive integer, got 0',
  },
  {
    why: 'context parallelism',
    sizes: { cp: 2 },
    error:
      'invalid layout (cp-unsupported): context parallelism (--context-parallel-size 2) is not supported yet',
  },
  {
    why: 'a world past the ranks lfc compiles (fuzzed: --gpus-per-node 2^53 ran the compiler out of memory)',
    sizes: { nnodes: 16_384, nprocPerNode: 8 },
    error:
      'invalid layout (world-bound): world size 131072 (--nnodes 16384 × --nproc-per-node 8) is past the 65536 ranks lfc compiles',
  },
  {
    why: 'a microbatch of more tokens than an int32 counts (fuzzed: the memory plan lost exactness)',
    ctx: { seqLength: 2 ** 31, microBatchSize: 2 },
    error:
      'invalid layout (batch-bound): --seq-length 2147483648 × --micro-batch-size 2 = 4294967296 tokens a microbatch, past 2147483647',
  },
  {
    why: 'more microbatches per rank than a schedule lists (fuzzed: an array past its length)',
    ctx: { globalBatchSize: 2 ** 20 },
    error:
      'invalid layout (batch-bound): --global-batch-size 1048576 gives 524288 microbatches per data-parallel rank, past 65536',
  },
  {
    why: '6 ranks for tp 2 × pp 2',
    sizes: { nprocPerNode: 6 },
    error:
      'invalid layout (world-decoder-grid): world size 6 (--nnodes 1 × --nproc-per-node 6) is not divisible by tp·cp·pp = 4 (tensor 2 × context 1 × pipeline 2)',
  },
  {
    why: '8 ranks for etp 1 × ep 8 × pp 2',
    sizes: { tp: 1, ep: 8 },
    error:
      'invalid layout (world-expert-grid): world size 8 (--nnodes 1 × --nproc-per-node 8) is not divisible by etp·ep·pp = 16 (expert tensor 1 × expert 8 × pipeline 2)',
  },
  {
    why: 'an empty global batch',
    ctx: { globalBatchSize: 0 },
    error: 'invalid layout (batch-positive): --global-batch-size must be a positive integer, got 0',
  },
  {
    why: 'virtual stages without a pipeline',
    sizes: { pp: 1, vpp: 2 },
    error:
      'invalid layout (vpp-needs-pp): --num-virtual-stages-per-pipeline-rank 2 needs pipeline parallelism (--pipeline-model-parallel-size is 1)',
  },
  {
    why: '6 decoder heads over tp 4',
    overrides: [
      'model.text_decoder.num_attention_heads=6',
      'model.text_decoder.num_query_groups=2',
    ],
    sizes: { tp: 4, ep: 1 },
    error:
      'invalid layout (tp-heads): decoder attention heads 6 are not divisible by tensor parallel size 4',
  },
  {
    why: '4 KV heads over tp 8',
    sizes: { tp: 8, pp: 1, ep: 1 },
    error:
      'invalid layout (tp-kv-heads): decoder KV heads (num_query_groups) 4 are not divisible by tensor parallel size 8',
  },
  {
    why: 'a dense FFN of 390 over tp 4',
    model: 'tiny-vlm',
    overrides: ['model.text_decoder.ffn_hidden_size=390'],
    sizes: { tp: 4, ep: 1 },
    error:
      'invalid layout (tp-ffn): decoder FFN size 390 is not divisible by tensor parallel size 4',
  },
  {
    why: 'a vocabulary of 510 over tp 4',
    overrides: ['model.text_decoder.vocab_size=510'],
    sizes: { tp: 4, ep: 1 },
    error:
      'invalid layout (tp-vocab): vocabulary size 510 is not divisible by tensor parallel size 4',
  },
  {
    why: 'encoder TP 4 under decoder TP 2',
    overrides: ['model.image_encoder.tensor_model_parallel_size=4'],
    error:
      'invalid layout (encoder-tp-divides-tp): encoder tensor parallel size 4 (model.image_encoder.tensor_model_parallel_size) does not divide decoder tensor parallel size 2',
  },
  {
    why: '2 encoder heads over encoder TP 4',
    overrides: [
      'model.image_encoder.num_attention_heads=2',
      'model.image_encoder.tensor_model_parallel_size=4',
    ],
    sizes: { tp: 4, ep: 1 },
    error:
      'invalid layout (encoder-tp-heads): encoder attention heads 2 are not divisible by encoder tensor parallel size 4',
  },
  {
    why: 'an encoder MLP of 258 over encoder TP 4',
    overrides: [
      'model.image_encoder.ffn_hidden_size=258',
      'model.image_encoder.tensor_model_parallel_size=4',
    ],
    sizes: { tp: 4, ep: 1 },
    error:
      'invalid layout (encoder-tp-ffn): encoder MLP size 258 is not divisible by encoder tensor parallel size 4',
  },
  {
    why: 'expert parallelism on a dense model',
    model: 'tiny-vlm',
    error:
      'invalid layout (ep-dense): expert parallelism (--expert-model-parallel-size 2) needs an MoE decoder; tiny-vlm is dense',
  },
  {
    why: '8 experts over ep 3',
    sizes: { nprocPerNode: 6, tp: 1, pp: 1, ep: 3 },
    ctx: { globalBatchSize: 6 },
    error: 'invalid layout (ep-experts): 8 experts are not divisible by expert parallel size 3',
  },
  {
    why: 'an expert FFN of 130 over expert TP 4',
    overrides: ['model.text_decoder.moe_ffn_hidden_size=130'],
    sizes: { pp: 1, etp: 4 },
    error:
      'invalid layout (etp-expert-ffn): expert FFN size 130 is not divisible by expert tensor parallel size 4',
  },
  {
    why: 'expert TP 4 above decoder TP 2',
    sizes: { pp: 1, etp: 4 },
    error:
      'invalid layout (etp-divides-tp): expert tensor parallel size 4 (--expert-tensor-parallel-size) does not divide tp 2; lfc builds expert TP up to TP',
  },
  {
    why: 'expert TP 1 under tp 2 without expert parallelism',
    sizes: { pp: 1, ep: 1, etp: 1 },
    error:
      'invalid layout (etp-below-tp): expert tensor parallel size 1 below tp 2 needs expert parallelism (--expert-model-parallel-size > 1)',
  },
  {
    why: 'expert TP 1 under tp 2, sequence parallelism off',
    sizes: { etp: 1 },
    ctx: { sequenceParallel: false },
    error:
      'invalid layout (etp-below-tp): expert tensor parallel size 1 below tp 2 needs --sequence-parallel',
  },
  {
    why: 'expert TP 1 under tp 2 with an expert capacity',
    overrides: ['+model.text_decoder.moe_expert_capacity_factor=1'],
    sizes: { etp: 1 },
    error:
      'invalid layout (etp-below-tp): expert tensor parallel size 1 below tp 2 needs dropless routing; drop --moe-expert-capacity-factor',
  },
  {
    why: '4 layers over pp 4 × vpp 2',
    sizes: { tp: 1, pp: 4, vpp: 2 },
    error:
      'invalid layout (pp-layers): 4 decoder layers cannot fill pp·vpp = 8 virtual stages (pipeline 4 × virtual 2); each needs at least one layer',
  },
  {
    why: 'a first-stage layer count without a pipeline',
    sizes: { pp: 1 },
    ctx: { decoderFirstPipelineNumLayers: 1 },
    error:
      'invalid layout (pp-uneven-layers): --decoder-first-pipeline-num-layers 1 needs pipeline parallelism (--pipeline-model-parallel-size is 1)',
  },
  {
    why: 'a last stage of 5 layers in 2 chunks',
    model: QWEN3,
    sizes: { tp: 1, pp: 4, vpp: 2 },
    ctx: { decoderLastPipelineNumLayers: 5, globalBatchSize: 8 },
    error:
      'invalid layout (pp-uneven-layers): --decoder-last-pipeline-num-layers 5 is not a multiple of --num-virtual-stages-per-pipeline-rank 2',
  },
  {
    why: '48 layers less 11 and 10 over 2 middle stages',
    model: QWEN3,
    sizes: { tp: 1, pp: 4 },
    ctx: { decoderFirstPipelineNumLayers: 11, decoderLastPipelineNumLayers: 10 },
    error:
      'invalid layout (pp-uneven-layers): 48 decoder layers less first 11 and last 10 stage layers leave 27, which do not split evenly over 2 middle stages',
  },
  {
    why: 'first and last stages that do not add up to 48 layers on pp 2',
    model: QWEN3,
    sizes: { tp: 1 },
    ctx: { decoderFirstPipelineNumLayers: 20, decoderLastPipelineNumLayers: 20 },
    error:
      'invalid layout (pp-uneven-layers): first 20 and last 20 pipeline stage layers add up to 40, but the decoder has 48 layers and pipeline 2 has no middle stage',
  },
  {
    why: 'middle stages of 5 layers in 2 chunks',
    model: QWEN3,
    sizes: { tp: 1, pp: 4, vpp: 2 },
    ctx: { decoderFirstPipelineNumLayers: 20, decoderLastPipelineNumLayers: 18 },
    error:
      'invalid layout (pp-uneven-layers): each of the 2 middle stages gets 5 layers, not a multiple of --num-virtual-stages-per-pipeline-rank 2',
  },
  {
    why: 'the embedding counted as a layer: 49 pieces over pp 4',
    model: QWEN3,
    sizes: { tp: 1, pp: 4 },
    ctx: { accountForEmbeddingInPipelineSplit: true },
    error:
      'invalid layout (pp-account-for): 48 decoder layers + the embedding = 49 pieces do not split evenly over pp·vpp = 4 virtual stages (pipeline 4 × virtual 1)',
  },
  {
    why: 'the loss counted as a layer without pipeline parallelism',
    sizes: { pp: 1 },
    ctx: { accountForLossInPipelineSplit: true },
    error:
      'invalid layout (pp-account-for): --account-for-loss-in-pipeline-split needs pipeline parallelism (--pipeline-model-parallel-size is 1)',
  },
  {
    why: 'the embedding counted as a layer besides a first-stage count',
    model: QWEN3,
    sizes: { tp: 1 },
    ctx: { accountForEmbeddingInPipelineSplit: true, decoderFirstPipelineNumLayers: 24 },
    error:
      'invalid layout (pp-account-for): --account-for-embedding-in-pipeline-split split the layers evenly; they do not combine with --decoder-first-pipeline-num-layers or --decoder-last-pipeline-num-layers',
  },
  {
    why: 'a global batch of 6 over micro-batch 1 × dp 4',
    sizes: { pp: 1 },
    ctx: { globalBatchSize: 6 },
    error:
      'invalid layout (global-batch): global batch 6 is not divisible by micro-batch 1 × data parallel 4 = 4',
  },
  {
    why: 'a microbatch group of 5 with 4 microbatches per dp rank',
    sizes: { vpp: 2 },
    ctx: { microbatchGroupSize: 5 },
    error:
      'invalid layout (microbatch-group): interleaved schedule: --microbatch-group-size-per-vp-stage 5 must lie in [pipeline 2, microbatches per data-parallel rank 4]',
  },
  {
    why: 'fewer microbatches (3) than stages (4) under interleaving',
    model: QWEN3,
    sizes: { tp: 1, pp: 4, vpp: 2 },
    ctx: { globalBatchSize: 6 },
    error:
      'invalid layout (microbatch-group): interleaved schedule: group size 4 (default: pipeline size) must lie in [pipeline 4, microbatches per data-parallel rank 3]',
  },
  {
    why: '10 microbatches in groups of 4 on 4 stages: a last group of 2',
    model: QWEN3,
    sizes: { tp: 1, pp: 4, vpp: 2 },
    ctx: { globalBatchSize: 20 },
    error:
      'invalid layout (microbatch-group): interleaved schedule: 10 microbatches per data-parallel rank in groups of 4 leave a last group of 2, which must be 0 or at least pipeline 4',
  },
  {
    why: 'sequence parallelism without tensor parallelism',
    sizes: { tp: 1 },
    ctx: { sequenceParallel: true },
    error:
      'invalid layout (sp-needs-tp): --sequence-parallel needs tensor parallelism (--tensor-model-parallel-size is 1)',
  },
  {
    why: 'a sequence of 130 over tp 4 under sequence parallelism',
    sizes: { tp: 4, ep: 1 },
    ctx: { sequenceParallel: true, seqLength: 130 },
    error:
      'invalid layout (sp-seq-length): --seq-length 130 is not divisible by tensor parallel size 4 under --sequence-parallel',
  },
];

const VALID: readonly Case[] = [
  { why: 'tiny-vlm-moe, tp 2, pp 2, ep 2' },
  { why: 'ViT DP balance at level 0', ctx: { encoder: { vitDpBalance: true } } },
  {
    why: 'ViT DP balance under full separation, m 4 over 4 encoding ranks',
    ctx: { encoder: { fullHeteroDp: true, vitDpBalance: true } },
  },
  {
    why: 'ViT DP balance under full separation with mock microbatches (m 2, 4 encoding ranks)',
    ctx: { encoder: { fullHeteroDp: true, vitDpBalance: true }, globalBatchSize: 4 },
  },
  {
    why: 'tiny-vlm, tp 2, pp 2, sequence parallel',
    model: 'tiny-vlm',
    sizes: { ep: 1 },
    ctx: { sequenceParallel: true },
  },
  {
    why: 'the Qwen3-VL line: 4 nodes × 8, tp 1, pp 2, ep 8, vpp 2, sequence 32768',
    model: QWEN3,
    sizes: { nnodes: 4, tp: 1, pp: 2, vpp: 2, ep: 8 },
    ctx: { seqLength: 32768, globalBatchSize: 32 },
  },
  {
    why: 'uneven stages: 10 + 14 + 14 + 10 layers in 2 chunks each',
    model: QWEN3,
    sizes: { tp: 1, pp: 4, vpp: 2 },
    ctx: {
      decoderFirstPipelineNumLayers: 10,
      decoderLastPipelineNumLayers: 10,
      globalBatchSize: 8,
    },
  },
  {
    why: '10 microbatches in groups of 5 on 4 stages',
    model: QWEN3,
    sizes: { tp: 1, pp: 4, vpp: 2 },
    ctx: { globalBatchSize: 20, microbatchGroupSize: 5 },
  },
  {
    why: 'hetero TP: encoder TP 2 under decoder TP 4',
    overrides: ['model.image_encoder.tensor_model_parallel_size=2'],
    sizes: { tp: 4, ep: 1 },
  },
  {
    why: "the article's hetero DP line: Qwen2.5-VL-7B, 8 ranks, tp 4, encoder frozen",
    model: 'qwen2.5-vl-7b',
    overrides: ['+model.image_encoder.freeze=True'],
    sizes: { tp: 4, pp: 1, ep: 1 },
    ctx: { encoder: { heteroDp: true }, globalBatchSize: 32 },
  },
  {
    why: "the article's full separation + A2A overlap line: Qwen3-VL-30B-A3B, 4 × 8, tp 1, pp 2 × vpp 2, ep 4",
    model: QWEN3,
    sizes: { nnodes: 4, tp: 1, pp: 2, vpp: 2, ep: 4 },
    ctx: {
      globalBatchSize: 64,
      encoder: { fullHeteroDp: true },
      moeOverlap: { overlap: true, delayWgrad: true },
      recompute: {
        granularity: 'selective',
        modules: ['a2a_overlap_attn', 'a2a_overlap_post_attn', 'a2a_overlap_mlp'],
      },
      offloadTensors: ['dispatched_input', 'pre_mlp_layernorm_output'],
    },
  },
  {
    why: "the article's 30B line with an expert capacity (drop policy probs, Megatron's default)",
    model: QWEN3,
    overrides: ['+model.text_decoder.moe_expert_capacity_factor=1'],
    sizes: { nnodes: 4, tp: 1, pp: 2, vpp: 2, ep: 4 },
    ctx: { globalBatchSize: 64 },
  },
  {
    why: 'full separation with encoder output offload and encoder recompute',
    ctx: { encoder: { fullHeteroDp: true, cpuOffload: true, recompute: true } },
  },
  {
    why: 'A2A overlap without a pipeline needs no virtual stages',
    sizes: { pp: 1 },
    ctx: { moeOverlap: { overlap: true } },
  },
  {
    why: 'every known recompute module and offload tensor',
    ctx: {
      recompute: {
        granularity: 'selective',
        modules: Object.keys(RECOMPUTE_MODULES),
      },
      offloadTensors: Object.keys(OFFLOAD_TENSORS),
    },
  },
  {
    why: 'expert TP 1 under decoder TP 2',
    sizes: { pp: 1, ep: 4, etp: 1 },
  },
  {
    why: '1024 ranks of Qwen3-VL-235B-A22B: tp 4, pp 8, ep 16',
    model: 'qwen3-vl-235b-a22b',
    sizes: { nnodes: 128, tp: 4, pp: 8, ep: 16 },
    ctx: { globalBatchSize: 256 },
  },
];

describe('invalid layouts are refused by their own rule', () => {
  it.each(INVALID.map((c) => [c.why, c] as const))('%s', (_, c) => {
    const error = thrown(() => validateParallel(context(c)));
    expect(error).toBeInstanceOf(UserError);
    expect(error?.message).toBe(c.error);
  });

  it('every rule is exercised by some invalid layout', () => {
    const hit = new Set(INVALID.map((c) => /\(([a-z0-9-]+)\)/.exec(c.error!)![1]));
    expect(LAYOUT_RULES.map((r) => r.id).filter((id) => !hit.has(id))).toEqual([]);
  });

  it('a capacity factor that is not positive (a library caller: the CLI and config refuse it first)', () => {
    const ctx = context({ why: '' });
    const d = ctx.config.model.text_decoder;
    const config = {
      ...ctx.config,
      model: { ...ctx.config.model, text_decoder: { ...d, moe_expert_capacity_factor: 0 } },
    };
    expect(thrown(() => validateParallel({ ...ctx, config }))?.message).toBe(
      'invalid layout (moe-capacity-factor): --moe-expert-capacity-factor must be a positive number, got 0',
    );
  });

  it('rule ids are unique', () => {
    const ids = LAYOUT_RULES.map((r) => r.id);
    expect(new Set(ids).size).toBe(ids.length);
  });
});

describe('valid layouts pass', () => {
  it.each(VALID.map((c) => [c.why, c] as const))('%s', (_, c) => {
    expect(thrown(() => validateParallel(context(c)))?.message).toBeUndefined();
  });
});

describe('nearestName', () => {
  it('names the closest known name, the first of a tie', () => {
    expect(nearestName('pre_mlm_layernorm_output', Object.keys(OFFLOAD_TENSORS))).toBe(
      'pre_mlp_layernorm_output',
    );
    expect(nearestName('CORE_ATTN', Object.keys(RECOMPUTE_MODULES))).toBe('core_attn');
    expect(nearestName('ab', ['ax', 'xb'])).toBe('ax');
    expect(nearestName('x', [])).toBeUndefined();
  });
});
