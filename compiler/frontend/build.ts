// The model builder: the forward graph of one microbatch of a vision-language model, from its
// config. Encoder (`visual.*`), projector (`visual.merger`, deepstack mergers), merge_visual into
// the text embeddings, decoder layers (`model.layers.*`, dense or MoE), final norm, lm_head and
// the loss (cross-entropy, plus the MoE auxiliary loss). Symbolic dims:
//   S   tokens of a microbatch (micro-batch size × sequence length, packed)
//   Nv  visual tokens of a microbatch; the encoder sees 4·Nv patches (spatial merge 2×2)
//   Nk<i>  rows layer i's moe_permute keeps under an expert capacity (MoE with
//          moe_expert_capacity_factor only): at most min(S·k, E·capacity)

import { GraphBuilder, type Graph } from '../../ir/graph.js';
import { dimDiv, dimMul, formatDim, type Dim } from '../../ir/shape.js';
import type { Attrs } from '../../ir/types.js';
import type { DType } from '../../ir/dtype.js';
import type { DecoderConfig, EncoderConfig, ModelConfig, ProjectorConfig } from './config.js';
import { UserError } from '../errors.js';

export interface BuildOptions {
  /** tokens per sequence; default the preset's training.seq_length */
  seqLength?: number;
  microBatchSize?: number;
  /** bound of Nv; default the token count S (every position could be visual) */
  maxVisualTokens?: number;
  /** Nv in a typical microbatch (a data profile's expectation); default its bound */
  expectedVisualTokens?: number;
  /**
   * tokens of the sample a typical token belongs to (a data profile's packed samples): the
   * decoder's attention is priced within samples of that length; default the sequence
   */
  expectedSampleTokens?: number;
  /** microbatches in the global batch: the auxiliary loss is their mean */
  numMicrobatches?: number;
  /** element type of activations and parameters (mixed precision: bf16); default f32 */
  dtype?: DType;
}

const INIT_WEIGHT = 'normal(0.02)';

export function buildForwardGraph(cfg: ModelConfig, opts: BuildOptions = {}): Graph {
  const seq = opts.seqLength ?? cfg.training.seq_length;
  const mbs = opts.microBatchSize ?? 1;
  for (const [k, v] of [
    ['seq-length', seq],
    ['micro-batch-size', mbs],
    ['max visual tokens', opts.maxVisualTokens ?? 1],
    ['microbatches', opts.numMicrobatches ?? 1],
  ] as const) {
    if (!Number.isInteger(v) || v < 1)
      throw new UserError(`${k} must be a positive integer, got ${v}`);
  }
  const dtype = opts.dtype ?? 'f32';
  const b = new GraphBuilder(cfg.name, dtype);
  const S = b.symbol('S', seq * mbs, 'tokens of a microbatch (packed sequences)');
  const nvBound = opts.maxVisualTokens ?? seq * mbs;
  const Nv = b.symbol(
    'Nv',
    nvBound,
    'visual tokens of a microbatch',
    opts.expectedVisualTokens !== undefined
      ? Math.min(opts.expectedVisualTokens, nvBound)
      : undefined,
  );
  const enc = cfg.model.image_encoder;
  const merge = enc.spatial_merge_size * enc.spatial_merge_size;
  const Np = dimMul(Nv, merge);

  const visual = buildEncoder(b, enc, Np, dtype);
  const { embeds, deepstack } = buildProjector(
    b,
    cfg.model.image_projector,
    enc,
    cfg.model.text_decoder,
    visual,
  );
  buildDecoder(
    b,
    cfg.model.text_decoder,
    S,
    seq * mbs,
    seq,
    opts.expectedSampleTokens,
    embeds,
    deepstack,
    opts.numMicrobatches ?? 1,
    cfg.training.caption_metric,
  );
  return b.build();
}

function norm(
  b: GraphBuilder,
  kind: 'layernorm' | 'rmsnorm',
  x: string,
  name: string,
  size: Dim,
  eps: number,
  trainable: boolean,
): string {
  const w = b.param(`${name}.weight`, [size], { init: 'ones', trainable });
  if (kind === 'rmsnorm')
    return b.in(name.split('.').pop()!, () => b.op1('rmsnorm', [x, w], { eps }));
  const bias = b.param(`${name}.bias`, [size], { init: 'zeros', trainable });
  return b.in(name.split('.').pop()!, () => b.op1('layernorm', [x, w, bias], { eps }));
}

function linear(
  b: GraphBuilder,
  x: string,
  name: string,
  out: number,
  inp: number,
  bias: boolean,
  trainable: boolean,
  attrs: Attrs = {},
): string {
  const w = b.param(`${name}.weight`, [out, inp], { init: INIT_WEIGHT, trainable });
  const args = [x, w];
  if (bias) args.push(b.param(`${name}.bias`, [out], { init: 'zeros', trainable }));
  return b.in(name.split('.').pop()!, () => b.op1('linear', args, attrs));
}

/** The vision encoder over the patches of a microbatch; returns the hidden states after each block. */
function buildEncoder(b: GraphBuilder, e: EncoderConfig, Np: Dim, dtype: DType): string[] {
  const trainable = !e.freeze;
  const hv = e.hidden_size;
  const heads = e.num_attention_heads;
  const hd = hv / heads;
  const patchIn = e.in_channels * e.temporal_patch_size * e.patch_size * e.patch_size;
  const patches = b.input(
    'patches',
    dtype,
    [Np, patchIn],
    'flattened patches in merge-block order',
  );
  const imageSeg = b.input('image_segments', 'i32', [Np], 'image index of each patch');
  const windowSeg =
    e.window_size > 0
      ? b.input('window_segments', 'i32', [Np], 'attention window of each patch')
      : undefined;
  const windowPatches = (e.window_size / e.patch_size) ** 2;
  // full attention is block-diagonal over images: no segment is longer than the largest image
  const imagePatches = (e.max_image_size / e.patch_size) ** 2;
  return b.in('visual', () => {
    let x = b.in('patch_embed', () => {
      const w = b.param('visual.patch_embed.proj.weight', [hv, patchIn], {
        init: INIT_WEIGHT,
        trainable,
      });
      const args = [patches, w];
      if (e.patch_embed_bias)
        args.push(b.param('visual.patch_embed.proj.bias', [hv], { init: 'zeros', trainable }));
      return b.op1('patch_embed', args);
    });
    let ropePos: string | undefined;
    if (e.position_embedding === 'learned_row_col') {
      const side = e.max_image_size / e.patch_size;
      const rows = b.input('patch_rows', 'i32', [Np], 'row of each patch in its image');
      const cols = b.input('patch_cols', 'i32', [Np], 'column of each patch in its image');
      const tr = b.param('visual.pos_embed_row', [side, hv], { init: INIT_WEIGHT, trainable });
      const tc = b.param('visual.pos_embed_col', [side, hv], { init: INIT_WEIGHT, trainable });
      x = b.in('pos_embed', () => {
        const pr = b.op1('embedding', [rows, tr]);
        const pc = b.op1('embedding', [cols, tc]);
        return b.op1('add', [x, b.op1('add', [pr, pc])]);
      });
    } else if (e.position_embedding === 'interpolated') {
      // the table bilinearly interpolated to each image's grid: 4 rows and weights a patch
      const ids = b.input('patch_pos_ids', 'i32', [Np, 4], 'the 4 table rows of each patch');
      const w = b.input('patch_pos_weights', 'f32', [Np, 4], 'their bilinear weights');
      const t = b.param('visual.pos_embed.weight', [e.num_position_embeddings, hv], {
        init: INIT_WEIGHT,
        trainable,
      });
      x = b.in('pos_embed', () => b.op1('add', [x, b.op1('embedding', [ids, t, w])]));
    }
    if (e.rotary_2d) {
      ropePos = b.input(
        'patch_positions',
        'i32',
        [Np, 2],
        'row and column of each patch (2-D rotary)',
      );
    }
    const states: string[] = [];
    for (let i = 0; i < e.num_layers; i++) {
      const p = `visual.blocks.${i}`;
      x = b.in(`blocks.${i}`, () => {
        const h = norm(b, e.normalization, x, `${p}.norm1`, hv, e.norm_epsilon, trainable);
        const a = b.in('attn', () => {
          const qkv = linear(b, h, `${p}.attn.qkv`, 3 * hv, hv, e.add_qkv_bias, trainable);
          let [q, k, v] = b.op('split', [qkv], { sizes: [hv, hv, hv] });
          const heads3 = { shape: [formatDim(Np), String(heads), String(hd)] };
          [q, k, v] = [q, k, v].map((t) => b.op1('reshape', [t], heads3));
          if (ropePos) {
            // HF's vision rotary: d/4 frequencies θ^(−4k/d) for the row, the same for the column
            const rope = { theta: e.rotary_base, sections: [hd / 4, hd / 4], layout: 'per_axis' };
            q = b.op1('rope', [q, ropePos], rope);
            k = b.op1('rope', [k, ropePos], rope);
          }
          const windowed = windowSeg !== undefined && !e.fullatt_block_indexes.includes(i);
          const attrs: Attrs = windowed
            ? { causal: false, scale: 1 / Math.sqrt(hd), max_segment: windowPatches, windows: true }
            : { causal: false, scale: 1 / Math.sqrt(hd), max_segment: imagePatches };
          const [o] = b.op('attention', [q, k, v, windowed ? windowSeg : imageSeg], attrs);
          const flat = b.op1('reshape', [o], { shape: [formatDim(Np), String(hv)] });
          return linear(b, flat, `${p}.attn.proj`, hv, hv, e.add_bias_linear, trainable);
        });
        const x1 = b.op1('add', [x, a]);
        const h2 = norm(b, e.normalization, x1, `${p}.norm2`, hv, e.norm_epsilon, trainable);
        const m = b.in('mlp', () =>
          mlp(b, h2, `${p}.mlp`, e.activation, hv, e.ffn_hidden_size, e.add_bias_linear, trainable),
        );
        return b.op1('add', [x1, m]);
      });
      states.push(x);
    }
    return states;
  });
}

function mlp(
  b: GraphBuilder,
  x: string,
  p: string,
  act: 'gelu_tanh' | 'gelu' | 'swiglu',
  h: number,
  f: number,
  bias: boolean,
  trainable: boolean,
): string {
  if (act === 'swiglu') {
    const g = linear(b, x, `${p}.gate_proj`, f, h, bias, trainable);
    const u = linear(b, x, `${p}.up_proj`, f, h, bias, trainable);
    return linear(b, b.op1('swiglu', [g, u]), `${p}.down_proj`, h, f, bias, trainable);
  }
  const a = gelu(b, linear(b, x, `${p}.fc1`, f, h, bias, trainable), act === 'gelu');
  return linear(b, a, `${p}.fc2`, h, f, bias, trainable);
}

/** GELU: exact (erf, HF's nn.GELU) or the tanh approximation (no attribute: the default). */
function gelu(b: GraphBuilder, x: string, exact: boolean): string {
  return b.op1('gelu', [x], exact ? { exact: true } : {});
}

/** The merger (and Qwen3-VL's deepstack mergers): patches → visual tokens of decoder width. */
function buildProjector(
  b: GraphBuilder,
  pc: ProjectorConfig,
  e: EncoderConfig,
  d: DecoderConfig,
  states: string[],
) {
  const trainable = !pc.freeze;
  const hv = e.hidden_size;
  const merge = e.spatial_merge_size * e.spatial_merge_size;
  const wide = hv * merge;
  const tokensOf = (x: string) => {
    const np = b.typeOf(x).shape[0];
    return formatDim(dimDiv(np, merge));
  };
  const head = (x: string, p: string, normFirst: boolean) => {
    // normFirst: norm each patch, then concatenate each merge block; otherwise concatenate, then norm
    let y = normFirst
      ? norm(b, pc.normalization, x, `${p}.norm`, hv, pc.norm_epsilon, trainable)
      : x;
    y = b.op1('reshape', [y], { shape: [tokensOf(x), String(wide)] });
    if (!normFirst) y = norm(b, pc.normalization, y, `${p}.norm`, wide, pc.norm_epsilon, trainable);
    const a = gelu(
      b,
      linear(b, y, `${p}.fc1`, wide, wide, true, trainable),
      pc.activation === 'gelu',
    );
    return linear(b, a, `${p}.fc2`, d.hidden_size, wide, true, trainable);
  };
  const embeds = b.in('visual.merger', () =>
    head(states[states.length - 1], 'visual.merger', true),
  );
  const deepstack = e.deepstack_layers.map((layer, j) =>
    b.in(`visual.deepstack_merger_list.${j}`, () =>
      head(states[layer], `visual.deepstack_merger_list.${j}`, false),
    ),
  );
  return { embeds, deepstack };
}

/**
 * Megatron's expert capacity (moe_utils.get_capacity): ceil(T·k / E · factor) assignments per
 * expert from a microbatch of T tokens, top-k of E experts.
 */
export function expertCapacity(tokens: number, topk: number, experts: number, factor: number) {
  return Math.ceil(((tokens * topk) / experts) * factor);
}

/**
 * moe_permute's attributes for decoder layer i; with a capacity factor also the capacity and the
 * rows dim it bounds, a symbol Nk<i>. T is taken at its bound, the packed microbatch size
 * (microbatches are padded to it), so the capacity is a constant of the plan.
 */
function permuteAttrs(b: GraphBuilder, d: DecoderConfig, maxTokens: number, layer: number): Attrs {
  const attrs: Attrs = { num_experts: d.num_experts };
  const factor = d.moe_expert_capacity_factor;
  if (factor === undefined) return attrs;
  const k = d.moe_router_topk;
  const capacity = expertCapacity(maxTokens, k, d.num_experts, factor);
  const rows = b.symbol(
    `Nk${layer}`,
    Math.min(maxTokens * k, d.num_experts * capacity),
    `rows model.layers.${layer}'s moe_permute keeps: min(S·k, E·capacity ${capacity})`,
  );
  return {
    ...attrs,
    capacity,
    out_rows: [formatDim(rows)],
    ...(d.moe_token_drop_policy === 'probs' ? { drop_policy: 'probs' } : {}),
  };
}

/** The decoder's inputs: a microbatch's tokens, their labels, loss mask, positions and samples. */
interface DecoderInputs {
  readonly tokens: string;
  readonly labels: string;
  readonly mask: string;
  readonly positions: string;
  readonly segments: string;
  readonly lossTokens: string;
  /** the microbatch's image placeholder id (i32 scalar) */
  readonly imageTokenId: string;
}

/** What the decoder's layers and loss are built from. */
interface DecoderContext {
  readonly b: GraphBuilder;
  readonly d: DecoderConfig;
  readonly trainable: boolean;
  readonly S: Dim;
  /** the packed microbatch's tokens, S's bound */
  readonly maxTokens: number;
  /** its longest sequence (--seq-length): a micro-batch of several holds them side by side */
  readonly seqLength: number;
  /** the expected length of a token's sample (BuildOptions.expectedSampleTokens) */
  readonly sampleTokens?: number;
  readonly numMicrobatches: number;
  readonly inputs: DecoderInputs;
  /** the running sum of the MoE auxiliary losses after each MoE layer so far */
  readonly auxLosses: string[];
}

/** The text decoder on the merged embeddings: its layers, final norm, lm_head and the loss. */
function buildDecoder(
  b: GraphBuilder,
  d: DecoderConfig,
  S: Dim,
  maxTokens: number,
  seqLength: number,
  sampleTokens: number | undefined,
  embeds: string,
  deepstack: string[],
  numMicrobatches: number,
  captionMetric: boolean,
): void {
  const trainable = !d.freeze;
  const inputs = decoderInputs(b, d, S);
  const c: DecoderContext = {
    b,
    d,
    trainable,
    S,
    maxTokens,
    seqLength,
    sampleTokens,
    numMicrobatches,
    inputs,
    auxLosses: [],
  };
  const embedW = b.param('model.embed_tokens.weight', [d.vocab_size, d.hidden_size], {
    init: INIT_WEIGHT,
    trainable,
  });
  let x = b.in('model.embed_tokens', () => b.op1('embedding', [inputs.tokens, embedW]));
  x = b.in('model.merge_visual', () =>
    b.op1('merge_visual', [x, embeds, inputs.tokens, inputs.imageTokenId], { mode: 'replace' }),
  );
  for (let i = 0; i < d.num_layers; i++) {
    const layerIn = x;
    x = b.in(`model.layers.${i}`, () => decoderLayer(c, i, layerIn, deepstack[i]));
  }
  const xn = b.in('model', () =>
    norm(b, 'rmsnorm', x, 'model.norm', d.hidden_size, d.norm_epsilon, trainable),
  );
  const headW = d.untie_embeddings_and_output_weights
    ? b.param('lm_head.weight', [d.vocab_size, d.hidden_size], { init: INIT_WEIGHT, trainable })
    : embedW;
  const logits = b.in('lm_head', () => b.op1('linear', [xn, headW]));
  decoderLoss(c, logits, captionMetric);
}

function decoderInputs(b: GraphBuilder, d: DecoderConfig, S: Dim): DecoderInputs {
  const tokens = b.input('tokens', 'i32', [S], 'token ids (0 = padding)');
  const labels = b.input('labels', 'i32', [S], 'next token of the same sample, 0 where none');
  const mask = b.input('loss_mask', 'u8', [S], '1 where the label is a text token');
  const positions =
    d.mrope_section.length === 1
      ? b.input('positions', 'i32', [S], 'index of each token within its sample')
      : b.input(
          'positions',
          'i32',
          [S, d.mrope_section.length],
          'rotary position ids of each token (t, h, w)',
        );
  const segments = b.input('segments', 'i32', [S], 'sample index of each token, -1 on padding');
  const lossTokens = b.input('loss_tokens', 'f32', [], 'loss tokens of the whole global batch');
  const imageTokenId = b.input(
    'image_token_id',
    'i32',
    [],
    `the image placeholder token of the microbatch (the model's: ${d.image_token_id})`,
  );
  return { tokens, labels, mask, positions, segments, lossTokens, imageTokenId };
}

/**
 * Decoder layer i on the residual stream x: attention and MLP (dense or MoE), each after its norm
 * and added back; then the deepstack merger's visual tokens added, where layer i has one.
 */
function decoderLayer(c: DecoderContext, i: number, x: string, deepstack?: string): string {
  const { b, d, trainable } = c;
  const h = d.hidden_size;
  const p = `model.layers.${i}`;
  const hn = norm(b, 'rmsnorm', x, `${p}.input_layernorm`, h, d.norm_epsilon, trainable);
  const a = b.in('self_attn', () => selfAttention(c, p, hn));
  const x1 = b.op1('add', [x, a]);
  const h2 = norm(b, 'rmsnorm', x1, `${p}.post_attention_layernorm`, h, d.norm_epsilon, trainable);
  const m = b.in('mlp', () =>
    d.num_experts === 0
      ? mlp(b, h2, `${p}.mlp`, 'swiglu', h, d.ffn_hidden_size, false, trainable)
      : moeMlp(c, p, i, h2),
  );
  const out = b.op1('add', [x1, m]);
  if (deepstack === undefined) return out;
  return b.in('deepstack', () =>
    b.op1('merge_visual', [out, deepstack, c.inputs.tokens, c.inputs.imageTokenId], {
      mode: 'add',
    }),
  );
}

/** Causal attention with grouped queries (qk norm optional, rotary positions) of layer p. */
function selfAttention(c: DecoderContext, p: string, hn: string): string {
  const { b, d, trainable } = c;
  const h = d.hidden_size;
  const nh = d.num_attention_heads;
  const hd = d.kv_channels;
  const s = formatDim(c.S);
  const proj = (name: string, heads: number) => {
    const y = linear(b, hn, `${p}.self_attn.${name}`, heads * hd, h, d.add_qkv_bias, trainable);
    return b.op1('reshape', [y], { shape: [s, String(heads), String(hd)] });
  };
  let q = proj('q_proj', nh);
  let k = proj('k_proj', d.num_query_groups);
  const v = proj('v_proj', d.num_query_groups);
  if (d.qk_layernorm) {
    q = norm(b, 'rmsnorm', q, `${p}.self_attn.q_norm`, hd, d.norm_epsilon, trainable);
    k = norm(b, 'rmsnorm', k, `${p}.self_attn.k_norm`, hd, d.norm_epsilon, trainable);
  }
  const rope: Attrs = {
    theta: d.rotary_base,
    sections: d.mrope_section,
    ...(d.mrope_interleaved ? { layout: 'interleaved' } : {}),
  };
  q = b.op1('rope', [q, c.inputs.positions], rope);
  k = b.op1('rope', [k, c.inputs.positions], rope);
  // a micro-batch of several sequences attends within each (for cost: no segment is longer), and
  // a packed sequence within its samples (for cost at the expected sizes: their typical length)
  const sample =
    c.sampleTokens !== undefined
      ? Math.max(1, Math.round(Math.min(c.sampleTokens, c.seqLength)))
      : 0;
  const [o] = b.op('attention', [q, k, v, c.inputs.segments], {
    causal: true,
    scale: 1 / Math.sqrt(hd),
    ...(c.seqLength < c.maxTokens ? { max_segment: c.seqLength } : {}),
    ...(sample && sample < c.seqLength ? { expected_segment: sample } : {}),
  });
  const flat = b.op1('reshape', [o], { shape: [s, String(nh * hd)] });
  return linear(b, flat, `${p}.self_attn.o_proj`, h, nh * hd, false, trainable);
}

/**
 * The MoE MLP of layer i (scope p): the router's top-k, its auxiliary loss (added to the running
 * sum), the tokens permuted by expert, the experts' SwiGLU as grouped linears, and the weighted
 * combine.
 */
function moeMlp(c: DecoderContext, p: string, i: number, h2: string): string {
  const { b, d, trainable, auxLosses } = c;
  const h = d.hidden_size;
  // the router computes in f32 under bf16, as Megatron's (stable routing): bf16 products are
  // exact in f32, so an f32 output of the bf16 GEMM is the upcast router's
  const fp32: Attrs = b.typeOf(h2).dtype === 'f32' ? {} : { dtype: 'f32' };
  const logits = linear(b, h2, `${p}.mlp.gate`, d.num_experts, h, false, trainable, fp32);
  const [probs, weights, experts] = b.op(
    'router_topk',
    [logits],
    d.moe_router_norm_topk ? { k: d.moe_router_topk } : { k: d.moe_router_topk, normalize: false },
  );
  const aux = b.op1('moe_aux_loss', [probs, experts, c.inputs.segments], {
    coeff: d.moe_aux_loss_coeff / c.numMicrobatches,
  });
  // a running sum, added in the layer itself: one scalar crosses each pipeline boundary
  auxLosses.push(auxLosses.length ? b.op1('add', [auxLosses[auxLosses.length - 1], aux]) : aux);
  const permute = permuteAttrs(b, d, c.maxTokens, i);
  // drop policy probs ranks an expert's assignments by their routing weights
  const [rows, counts, rowOf] = b.op(
    'moe_permute',
    permute.drop_policy === 'probs' ? [h2, experts, weights] : [h2, experts],
    permute,
  );
  const f = d.moe_ffn_hidden_size;
  const expertW = (name: string, out: number, inp: number) =>
    Array.from({ length: d.num_experts }, (_, e) =>
      b.param(`${p}.mlp.experts.${e}.${name}.weight`, [out, inp], {
        init: INIT_WEIGHT,
        trainable,
      }),
    );
  const gw = expertW('gate_proj', f, h);
  const uw = expertW('up_proj', f, h);
  const dw = expertW('down_proj', h, f);
  const y = b.in('experts', () => {
    const g = b.op1('grouped_linear', [rows, counts, ...gw]);
    const u = b.op1('grouped_linear', [rows, counts, ...uw]);
    return b.op1('grouped_linear', [b.op1('swiglu', [g, u]), counts, ...dw]);
  });
  return b.op1('moe_unpermute', [y, rowOf, weights]);
}

/** The outputs: the loss (cross-entropy plus the auxiliary loss), the caption metric if asked */
function decoderLoss(c: DecoderContext, logits: string, captionMetric: boolean): void {
  const { b, auxLosses } = c;
  const { labels, mask, lossTokens } = c.inputs;
  const ce = b.in('loss', () => b.op1('cross_entropy', [logits, labels, mask, lossTokens]));
  if (!auxLosses.length) {
    b.output('loss', ce);
  } else {
    b.in('loss', () => {
      const aux = auxLosses[auxLosses.length - 1];
      b.output('loss', b.op1('add', [ce, aux]));
      b.output('ce_loss', ce);
      b.output('aux_loss', aux);
    });
  }
  if (captionMetric) {
    // a metric, not part of the loss: cross-entropy over caption positions only
    const captionMask = b.input(
      'caption_mask',
      'u8',
      [c.S],
      '1 where the label is a caption token',
    );
    const captionTokens = b.input(
      'caption_tokens',
      'f32',
      [],
      'caption tokens of the whole global batch',
    );
    const caption = b.in('loss', () =>
      b.op1('cross_entropy', [logits, labels, captionMask, captionTokens]),
    );
    b.output('caption_loss', caption);
  }
}
