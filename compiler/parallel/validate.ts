// Layout rules: one ordered table of the conditions a parallel layout must meet before a topology
// is built or a graph is sharded. Each rule reads the layout and returns a message naming the
// numbers that break it, or undefined; validateParallel throws the first failure as
// `invalid layout (<rule id>): <message>`.
//
// Notation: L decoder layers, p pipeline stages, v virtual chunks per stage, m microbatches per
// data-parallel rank, g microbatch group size of the interleaved schedule (reference/schedules.md).

import { UserError } from '../errors.js';
import type { ModelConfig } from '../frontend/config.js';
import {
  nearestName,
  OFFLOAD_TENSORS,
  RECOMPUTE_MODULES,
  type RecomputeOptions,
} from '../frontend/activation-names.js';
import type { EncoderOptions } from './encoder.js';
import { resolveSizes, SIZE_FLAGS, type ParallelSizes } from './sizes.js';

/** What the rules that read only the parallel sizes see. */
export interface SizesContext {
  readonly sizes: ParallelSizes;
}

/** --overlap-moe-expert-parallel-comm / --delay-wgrad-compute of a compile (CompileOptions.moeOverlap). */
export interface MoeOverlapOptions {
  readonly overlap?: boolean;
  readonly delayWgrad?: boolean;
}

export interface LayoutContext extends SizesContext {
  readonly config: ModelConfig;
  readonly seqLength: number;
  readonly microBatchSize: number;
  readonly globalBatchSize: number;
  /** --microbatch-group-size-per-vp-stage (interleaved schedule only; default p) */
  readonly microbatchGroupSize?: number;
  /** --decoder-first-pipeline-num-layers */
  readonly decoderFirstPipelineNumLayers?: number;
  /** --decoder-last-pipeline-num-layers */
  readonly decoderLastPipelineNumLayers?: number;
  /** --account-for-embedding-in-pipeline-split */
  readonly accountForEmbeddingInPipelineSplit?: boolean;
  /** --account-for-loss-in-pipeline-split */
  readonly accountForLossInPipelineSplit?: boolean;
  /** --sequence-parallel */
  readonly sequenceParallel?: boolean;
  /** --moe-token-dispatcher-type */
  readonly moeTokenDispatcher?: 'alltoall' | 'flex';
  /** encoder levels: --enable-encoder-hetero-dp, --enable-full-hetero-dp and their options */
  readonly encoder?: EncoderOptions;
  /** --overlap-moe-expert-parallel-comm / --delay-wgrad-compute */
  readonly moeOverlap?: MoeOverlapOptions;
  /** --recompute-granularity / --recompute-modules */
  readonly recompute?: RecomputeOptions;
  /** --offload-tensors (with --fine-grained-activation-offloading) */
  readonly offloadTensors?: readonly string[];
}

export interface LayoutRule<C extends SizesContext = LayoutContext> {
  readonly id: string;
  check(ctx: C): string | undefined;
}

const isPosInt = (n: number): boolean => Number.isInteger(n) && n > 0;

/** The largest layouts lfc compiles: ranks, tokens of a microbatch, microbatches of a rank. */
const MAX_WORLD = 65_536;
const MAX_TOKENS = 2 ** 31 - 1;
const MAX_MICROBATCHES = 65_536;

/** Microbatches per data-parallel rank: m = global batch / (micro-batch · dp). */
function microbatchesPerDpRank(ctx: LayoutContext): number {
  return ctx.globalBatchSize / (ctx.microBatchSize * resolveSizes(ctx.sizes).dp);
}

const SIZE_RULES: readonly LayoutRule<SizesContext>[] = [
  {
    id: 'sizes-positive',
    check: ({ sizes }) => {
      for (const key of Object.keys(SIZE_FLAGS) as (keyof ParallelSizes)[]) {
        const n = sizes[key];
        if (n === undefined && (key === 'etp' || key === 'encoderTp')) continue;
        if (n === undefined || !isPosInt(n)) {
          return `${SIZE_FLAGS[key]} must be a positive integer, got ${n}`;
        }
      }
      return undefined;
    },
  },
  {
    id: 'world-bound',
    // past it the per-rank tables of the compile take more memory than a machine has
    check: ({ sizes }) => {
      const s = resolveSizes(sizes);
      return s.world > MAX_WORLD
        ? `world size ${s.world} (${SIZE_FLAGS.nnodes} ${s.nnodes} × ${SIZE_FLAGS.nprocPerNode} ${s.nprocPerNode}) is past the ${MAX_WORLD} ranks lfc compiles`
        : undefined;
    },
  },
  {
    id: 'cp-unsupported',
    check: ({ sizes }) =>
      sizes.cp > 1
        ? `context parallelism (${SIZE_FLAGS.cp} ${sizes.cp}) is not supported yet`
        : undefined,
  },
  {
    id: 'world-decoder-grid',
    check: ({ sizes }) => {
      const s = resolveSizes(sizes);
      const grid = s.tp * s.cp * s.pp;
      return s.world % grid === 0
        ? undefined
        : `world size ${s.world} (${SIZE_FLAGS.nnodes} ${s.nnodes} × ${SIZE_FLAGS.nprocPerNode} ${s.nprocPerNode}) is not divisible by tp·cp·pp = ${grid} (tensor ${s.tp} × context ${s.cp} × pipeline ${s.pp})`;
    },
  },
  {
    id: 'world-expert-grid',
    check: ({ sizes }) => {
      const s = resolveSizes(sizes);
      const grid = s.etp * s.ep * s.pp;
      return s.world % grid === 0
        ? undefined
        : `world size ${s.world} (${SIZE_FLAGS.nnodes} ${s.nnodes} × ${SIZE_FLAGS.nprocPerNode} ${s.nprocPerNode}) is not divisible by etp·ep·pp = ${grid} (expert tensor ${s.etp} × expert ${s.ep} × pipeline ${s.pp})`;
    },
  },
];

const MODEL_RULES: readonly LayoutRule[] = [
  {
    id: 'batch-positive',
    check: (ctx) => {
      const values: [string, number | undefined][] = [
        ['--seq-length', ctx.seqLength],
        ['--micro-batch-size', ctx.microBatchSize],
        ['--global-batch-size', ctx.globalBatchSize],
        ['--microbatch-group-size-per-vp-stage', ctx.microbatchGroupSize],
      ];
      for (const [flag, n] of values) {
        if (n !== undefined && !isPosInt(n)) return `${flag} must be a positive integer, got ${n}`;
      }
      return undefined;
    },
  },
  {
    id: 'vpp-needs-pp',
    check: ({ sizes: s }) =>
      s.vpp > 1 && s.pp === 1
        ? `${SIZE_FLAGS.vpp} ${s.vpp} needs pipeline parallelism (${SIZE_FLAGS.pp} is 1)`
        : undefined,
  },
  {
    id: 'tp-heads',
    check: ({ sizes: s, config }) => {
      const heads = config.model.text_decoder.num_attention_heads;
      return heads % s.tp === 0
        ? undefined
        : `decoder attention heads ${heads} are not divisible by tensor parallel size ${s.tp}`;
    },
  },
  {
    id: 'tp-kv-heads',
    check: ({ sizes: s, config }) => {
      const groups = config.model.text_decoder.num_query_groups;
      return groups % s.tp === 0
        ? undefined
        : `decoder KV heads (num_query_groups) ${groups} are not divisible by tensor parallel size ${s.tp}`;
    },
  },
  {
    id: 'tp-ffn',
    check: ({ sizes: s, config }) => {
      const dec = config.model.text_decoder;
      if (dec.num_experts > 0) return undefined; // every layer is MoE: see etp-expert-ffn
      return dec.ffn_hidden_size % s.tp === 0
        ? undefined
        : `decoder FFN size ${dec.ffn_hidden_size} is not divisible by tensor parallel size ${s.tp}`;
    },
  },
  {
    id: 'tp-vocab',
    // lfc does not pad the vocabulary (Megatron's --make-vocab-size-divisible-by): the embedding
    // and output layer shard the real vocabulary
    check: ({ sizes: s, config }) => {
      const vocab = config.model.text_decoder.vocab_size;
      return vocab % s.tp === 0
        ? undefined
        : `vocabulary size ${vocab} is not divisible by tensor parallel size ${s.tp}`;
    },
  },
  {
    id: 'encoder-tp-divides-tp',
    check: ({ sizes: s, config }) => {
      const encTp = config.model.image_encoder.tensor_model_parallel_size;
      return s.tp % encTp === 0
        ? undefined
        : `encoder tensor parallel size ${encTp} (model.image_encoder.tensor_model_parallel_size) does not divide decoder tensor parallel size ${s.tp}`;
    },
  },
  {
    id: 'encoder-tp-heads',
    check: ({ config }) => {
      const enc = config.model.image_encoder;
      return enc.num_attention_heads % enc.tensor_model_parallel_size === 0
        ? undefined
        : `encoder attention heads ${enc.num_attention_heads} are not divisible by encoder tensor parallel size ${enc.tensor_model_parallel_size}`;
    },
  },
  {
    id: 'encoder-tp-ffn',
    check: ({ config }) => {
      const enc = config.model.image_encoder;
      return enc.ffn_hidden_size % enc.tensor_model_parallel_size === 0
        ? undefined
        : `encoder MLP size ${enc.ffn_hidden_size} is not divisible by encoder tensor parallel size ${enc.tensor_model_parallel_size}`;
    },
  },
  {
    id: 'ep-dense',
    check: ({ sizes: s, config }) =>
      s.ep > 1 && config.model.text_decoder.num_experts === 0
        ? `expert parallelism (${SIZE_FLAGS.ep} ${s.ep}) needs an MoE decoder; ${config.name} is dense`
        : undefined,
  },
  {
    id: 'ep-experts',
    check: ({ sizes: s, config }) => {
      const experts = config.model.text_decoder.num_experts;
      return experts % s.ep === 0
        ? undefined
        : `${experts} experts are not divisible by expert parallel size ${s.ep}`;
    },
  },
  {
    id: 'etp-expert-ffn',
    check: ({ sizes, config }) => {
      const dec = config.model.text_decoder;
      const { etp } = resolveSizes(sizes);
      if (dec.num_experts === 0 || dec.moe_ffn_hidden_size % etp === 0) return undefined;
      return `expert FFN size ${dec.moe_ffn_hidden_size} is not divisible by expert tensor parallel size ${etp}`;
    },
  },
  {
    id: 'etp-divides-tp',
    // the experts' gather and split run on etp consecutive ranks of each tp group
    check: ({ sizes }) => {
      const { etp, tp } = resolveSizes(sizes);
      return tp % etp === 0
        ? undefined
        : `expert tensor parallel size ${etp} (${SIZE_FLAGS.etp}) does not divide tp ${tp}; lfc builds expert TP up to TP`;
    },
  },
  {
    id: 'etp-below-tp',
    // below tp, each rank routes its own tokens (the MoE dispatch under SP) and the expert
    // gradients sum over the expert-data-parallel ranks, which expert parallelism declares
    check: ({ sizes, config, sequenceParallel }) => {
      const { etp, tp, ep } = resolveSizes(sizes);
      const dec = config.model.text_decoder;
      if (dec.num_experts === 0 || etp >= tp) return undefined;
      const what = `expert tensor parallel size ${etp} below tp ${tp}`;
      if (ep === 1) return `${what} needs expert parallelism (${SIZE_FLAGS.ep} > 1)`;
      if (sequenceParallel === false) return `${what} needs --sequence-parallel`;
      if (dec.moe_expert_capacity_factor !== undefined)
        return `${what} needs dropless routing; drop --moe-expert-capacity-factor`;
      return undefined;
    },
  },
  {
    id: 'pp-layers',
    // lfc balances layers by cost, so any L ≥ p·v works; each virtual stage needs one layer
    // (pp-account-for: the embedding or the loss may take a layer's place)
    check: (ctx) => {
      const { sizes: s, config } = ctx;
      if (ctx.accountForEmbeddingInPipelineSplit || ctx.accountForLossInPipelineSplit)
        return undefined;
      const layers = config.model.text_decoder.num_layers;
      const stages = s.pp * s.vpp;
      return layers >= stages
        ? undefined
        : `${layers} decoder layers cannot fill pp·vpp = ${stages} virtual stages (pipeline ${s.pp} × virtual ${s.vpp}); each needs at least one layer`;
    },
  },
  {
    id: 'pp-account-for',
    // Megatron's rule: with the embedding and/or the loss counted as layers, the pieces split
    // evenly over the virtual stages; not with the first/last-stage counts
    check: (ctx) => {
      const e = ctx.accountForEmbeddingInPipelineSplit ?? false;
      const l = ctx.accountForLossInPipelineSplit ?? false;
      if (!e && !l) return undefined;
      const flags = [
        ...(e ? ['--account-for-embedding-in-pipeline-split'] : []),
        ...(l ? ['--account-for-loss-in-pipeline-split'] : []),
      ].join(' and ');
      const { sizes: s } = ctx;
      if (s.pp === 1) return `${flags} needs pipeline parallelism (${SIZE_FLAGS.pp} is 1)`;
      if (
        ctx.decoderFirstPipelineNumLayers !== undefined ||
        ctx.decoderLastPipelineNumLayers !== undefined
      )
        return `${flags} split the layers evenly; they do not combine with --decoder-first-pipeline-num-layers or --decoder-last-pipeline-num-layers`;
      const layers = ctx.config.model.text_decoder.num_layers;
      const pieces = layers + (e ? 1 : 0) + (l ? 1 : 0);
      const stages = s.pp * s.vpp;
      return pieces % stages === 0
        ? undefined
        : `${layers} decoder layers${e ? ' + the embedding' : ''}${l ? ' + the loss' : ''} = ${pieces} pieces do not split evenly over pp·vpp = ${stages} virtual stages (pipeline ${s.pp} × virtual ${s.vpp})`;
    },
  },
  {
    id: 'pp-uneven-layers',
    // Megatron's rule for --decoder-{first,last}-pipeline-num-layers: the stages given keep their
    // count, the rest split evenly over the middle stages, and with vpp every stage's count is a
    // multiple of v (each chunk gets the same number of layers, at least one)
    check: (ctx) => {
      const { sizes: s, decoderFirstPipelineNumLayers: first } = ctx;
      const last = ctx.decoderLastPipelineNumLayers;
      if (first === undefined && last === undefined) return undefined;
      const ends: [string, number | undefined][] = [
        ['--decoder-first-pipeline-num-layers', first],
        ['--decoder-last-pipeline-num-layers', last],
      ];
      for (const [flag, n] of ends) {
        if (n === undefined) continue;
        if (s.pp === 1) return `${flag} ${n} needs pipeline parallelism (${SIZE_FLAGS.pp} is 1)`;
        if (!isPosInt(n)) return `${flag} must be a positive integer, got ${n}`;
        if (n % s.vpp !== 0) {
          return `${flag} ${n} is not a multiple of ${SIZE_FLAGS.vpp} ${s.vpp}`;
        }
      }
      const layers = ctx.config.model.text_decoder.num_layers;
      const middleLayers = layers - (first ?? 0) - (last ?? 0);
      const middleStages = s.pp - (first === undefined ? 0 : 1) - (last === undefined ? 0 : 1);
      const given = `first ${first ?? '-'} and last ${last ?? '-'}`;
      if (middleStages === 0) {
        return middleLayers === 0
          ? undefined
          : `${given} pipeline stage layers add up to ${layers - middleLayers}, but the decoder has ${layers} layers and pipeline ${s.pp} has no middle stage`;
      }
      if (middleLayers < middleStages * s.vpp) {
        return `${layers} decoder layers less ${given} stage layers leave ${middleLayers} for ${middleStages} middle stages × ${s.vpp} chunks; each needs at least one layer`;
      }
      if (middleLayers % middleStages !== 0) {
        return `${layers} decoder layers less ${given} stage layers leave ${middleLayers}, which do not split evenly over ${middleStages} middle stages`;
      }
      const perStage = middleLayers / middleStages;
      return perStage % s.vpp === 0
        ? undefined
        : `each of the ${middleStages} middle stages gets ${perStage} layers, not a multiple of ${SIZE_FLAGS.vpp} ${s.vpp}`;
    },
  },
  {
    id: 'global-batch',
    check: (ctx) => {
      const { dp } = resolveSizes(ctx.sizes);
      const per = ctx.microBatchSize * dp;
      return ctx.globalBatchSize % per === 0
        ? undefined
        : `global batch ${ctx.globalBatchSize} is not divisible by micro-batch ${ctx.microBatchSize} × data parallel ${dp} = ${per}`;
    },
  },
  {
    id: 'microbatch-group',
    // interleaved 1F1B takes microbatches in groups of g, p ≤ g ≤ m; a last group of 1 … p−1
    // microbatches creates dependency bubbles (reference/schedules.md)
    check: (ctx) => {
      const { pp: p, vpp: v } = ctx.sizes;
      if (v === 1) return undefined;
      const m = microbatchesPerDpRank(ctx);
      const given = ctx.microbatchGroupSize !== undefined;
      const g = ctx.microbatchGroupSize ?? p;
      const name = given
        ? `--microbatch-group-size-per-vp-stage ${g}`
        : `group size ${g} (default: pipeline size)`;
      if (g < p || g > m) {
        return `interleaved schedule: ${name} must lie in [pipeline ${p}, microbatches per data-parallel rank ${m}]`;
      }
      const remainder = m % g;
      return remainder >= 1 && remainder < p
        ? `interleaved schedule: ${m} microbatches per data-parallel rank in groups of ${g} leave a last group of ${remainder}, which must be 0 or at least pipeline ${p}`
        : undefined;
    },
  },
  {
    id: 'sp-needs-tp',
    check: ({ sizes: s, sequenceParallel }) =>
      sequenceParallel && s.tp === 1
        ? `--sequence-parallel needs tensor parallelism (${SIZE_FLAGS.tp} is 1)`
        : undefined,
  },
  {
    id: 'sp-seq-length',
    check: ({ sizes: s, sequenceParallel, seqLength }) =>
      sequenceParallel && seqLength % s.tp !== 0
        ? `--seq-length ${seqLength} is not divisible by tensor parallel size ${s.tp} under --sequence-parallel`
        : undefined,
  },
];

const LEVEL2 = '--enable-encoder-hetero-dp';
const LEVEL3 = '--enable-full-hetero-dp';
const OVERLAP = '--overlap-moe-expert-parallel-comm';

/** An unknown name among `given`, with the nearest known one and the whole list. */
function unknownName(flag: string, what: string, given: readonly string[], known: object) {
  const names = Object.keys(known);
  const bad = given.find((n) => !Object.hasOwn(known, n));
  return bad === undefined
    ? undefined
    : `${flag}: unknown ${what} '${bad}' (did you mean '${nearestName(bad, names)}'?); known: ${names.join(', ')}`;
}

// The flags of the encoder levels (DESIGN.md "Parallel topology"), the MoE all-to-all overlap,
// recompute and activation offload, and how they combine.
const FLAG_RULES: readonly LayoutRule[] = [
  {
    id: 'batch-bound',
    // a microbatch's tokens index int32 arrays, and its bytes must stay exact in a double; the
    // schedule lists every microbatch of a rank
    check: (ctx) => {
      const tokens = ctx.seqLength * ctx.microBatchSize;
      if (tokens > MAX_TOKENS)
        return `--seq-length ${ctx.seqLength} × --micro-batch-size ${ctx.microBatchSize} = ${tokens} tokens a microbatch, past ${MAX_TOKENS}`;
      const m = microbatchesPerDpRank(ctx);
      return m > MAX_MICROBATCHES
        ? `--global-batch-size ${ctx.globalBatchSize} gives ${m} microbatches per data-parallel rank, past ${MAX_MICROBATCHES}`
        : undefined;
    },
  },
  {
    id: 'encoder-levels-exclusive',
    check: ({ encoder }) =>
      encoder?.heteroDp && encoder.fullHeteroDp
        ? `${LEVEL2} (level 2, hetero DP) and ${LEVEL3} (level 3, full separation) exclude each other; give one`
        : undefined,
  },
  {
    id: 'encoder-level-tp',
    // levels 2 and 3 give each encoder replica its own microbatches: the encoder is not split
    check: ({ encoder, config }) => {
      const flag = encoder?.fullHeteroDp ? LEVEL3 : encoder?.heteroDp ? LEVEL2 : undefined;
      const encTp = config.model.image_encoder.tensor_model_parallel_size;
      return flag && encTp !== 1
        ? `${flag} needs encoder tensor parallel size 1, got ${encTp} (model.image_encoder.tensor_model_parallel_size)`
        : undefined;
    },
  },
  {
    id: 'full-hetero-dp-cp',
    // before cp-unsupported, so that this combination names its own reason
    check: ({ encoder, sizes }) =>
      encoder?.fullHeteroDp && sizes.cp > 1
        ? `${LEVEL3} (level 3, full separation) needs ${SIZE_FLAGS.cp} 1, got ${sizes.cp}`
        : undefined,
  },
  {
    id: 'full-hetero-dp-options',
    check: ({ encoder }) => {
      if (encoder?.fullHeteroDp) return undefined;
      const given = [
        ...(encoder?.cpuOffload ? ['--full-hetero-dp-cpu-offload'] : []),
        ...(encoder?.recompute ? ['--full-hetero-dp-encoder-recompute'] : []),
      ];
      return given.length
        ? `${given.join(' and ')} need${given.length === 1 ? 's' : ''} ${LEVEL3} (full separation)`
        : undefined;
    },
  },
  {
    id: 'moe-dispatcher-dense',
    check: ({ moeTokenDispatcher, config }) =>
      moeTokenDispatcher === 'flex' && config.model.text_decoder.num_experts === 0
        ? `--moe-token-dispatcher-type flex needs an MoE decoder; ${config.name} is dense`
        : undefined,
  },
  {
    id: 'a2a-overlap-ep',
    check: ({ moeOverlap, sizes }) =>
      moeOverlap?.overlap && sizes.ep === 1
        ? `${OVERLAP} needs expert parallelism (${SIZE_FLAGS.ep} is 1)`
        : undefined,
  },
  {
    id: 'a2a-overlap-vpp',
    // Megatron's combined 1F1B pairs one microbatch's forward with another's backward layer by
    // layer; with a pipeline it is built only into the interleaved schedule
    check: ({ moeOverlap, sizes: s }) =>
      moeOverlap?.overlap && s.pp > 1 && s.vpp === 1
        ? `${OVERLAP} with ${SIZE_FLAGS.pp} ${s.pp} needs the interleaved schedule (${SIZE_FLAGS.vpp} is 1)`
        : undefined,
  },
  {
    id: 'a2a-overlap-full-recompute',
    check: ({ moeOverlap, recompute }) =>
      moeOverlap?.overlap && recompute?.granularity === 'full'
        ? `${OVERLAP} does not work with --recompute-granularity full (it interleaves sub-layer nodes of two microbatches); use selective with --recompute-modules ${Object.keys(
            RECOMPUTE_MODULES,
          )
            .filter((m) => m.startsWith('a2a_overlap_'))
            .join(' ')}`
        : undefined,
  },
  {
    id: 'delay-wgrad-needs-overlap',
    check: ({ moeOverlap }) =>
      moeOverlap?.delayWgrad && !moeOverlap.overlap
        ? `--delay-wgrad-compute needs ${OVERLAP} (the weight gradients it delays hide the overlap's all-to-alls)`
        : undefined,
  },
  {
    id: 'moe-capacity-factor',
    check: ({ config }) => {
      const d = config.model.text_decoder;
      const f = d.moe_expert_capacity_factor;
      if (f === undefined) return undefined;
      if (!(Number.isFinite(f) && f > 0))
        return `--moe-expert-capacity-factor must be a positive number, got ${f}`;
      return d.num_experts === 0
        ? `--moe-expert-capacity-factor ${f} needs an MoE decoder; ${config.name} is dense`
        : undefined;
    },
  },
  {
    id: 'moe-expected-imbalance',
    check: ({ config }) => {
      const d = config.model.text_decoder;
      const f = d.moe_expected_imbalance;
      if (f === undefined) return undefined;
      // a share above balanced on a dense decoder would be priced nowhere: said, not ignored
      if (d.num_experts === 0 && f !== 1)
        return `--moe-expected-imbalance ${f} needs an MoE decoder; ${config.name} is dense`;
      if (f >= 1) return undefined;
      return `--moe-expected-imbalance (model.text_decoder.moe_expected_imbalance) must be at least 1 (balanced routing), got ${f}`;
    },
  },
  {
    id: 'recompute-modules-selective',
    check: ({ recompute }) =>
      recompute?.modules?.length && recompute.granularity !== 'selective'
        ? `--recompute-modules ${recompute.modules.join(' ')} needs --recompute-granularity selective, got ${recompute.granularity}`
        : undefined,
  },
  {
    id: 'recompute-module-known',
    check: ({ recompute }) =>
      unknownName('--recompute-modules', 'module', recompute?.modules ?? [], RECOMPUTE_MODULES),
  },
  {
    id: 'offload-tensor-known',
    check: ({ offloadTensors }) =>
      unknownName('--offload-tensors', 'tensor', offloadTensors ?? [], OFFLOAD_TENSORS),
  },
];

/** Every layout rule, in the order they are checked: flag combinations first (they name the
 * flags; full separation with cp > 1 is refused for its own reason before cp-unsupported). */
export const LAYOUT_RULES: readonly LayoutRule[] = [...FLAG_RULES, ...SIZE_RULES, ...MODEL_RULES];

function runRules<C extends SizesContext>(rules: readonly LayoutRule<C>[], ctx: C): void {
  for (const rule of rules) {
    const message = rule.check(ctx);
    if (message !== undefined) throw new UserError(`invalid layout (${rule.id}): ${message}`);
  }
}

/** Throws a UserError naming the first layout rule the context breaks. */
export function validateParallel(ctx: LayoutContext): void {
  runRules(LAYOUT_RULES, ctx);
}

/** The rules that read only the sizes (positive, cp, world divisibility); buildTopology runs them. */
export function validateSizes(sizes: ParallelSizes): void {
  runRules(SIZE_RULES, { sizes });
}
