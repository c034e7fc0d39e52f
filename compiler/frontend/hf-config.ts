// Hugging Face config.json ↔ lfc's model config (config.ts). A Qwen2.5-VL, Qwen3-VL or
// Qwen3-VL-MoE config.json, as the hub publishes it (Qwen2.5-VL's text keys flat beside a
// `vision_config`; Qwen3-VL's under `text_config`; transformers' re-saved nested form too), gives
// every architecture key of lfc's tree; a preset (`--model`) supplies what config.json does not say
// (training keys, tensor_model_parallel_size, freeze, max_image_size, data_profile,
// moe_routing_imbalance, …). Without one, the family's base preset does (FAMILY_BASE).
//
//   hfModelRequest(file, preset?)   the preset and the Hydra overrides (`++key=value`) that make it
//                                   config.json's model: what compile() and inspect take
//   loadHfModelConfig(file, …)      the same, loaded and validated
//   hfConfigOf(name, model)         the inverse: config.json for an lfc model (lfc export-hf)
//
// Every problem names the file and the key. An architecture lfc does not build is refused.

import { existsSync, statSync } from 'node:fs';
import { basename, dirname, join, resolve } from 'node:path';
import { parseFile, UserError } from '../errors.js';
import { loadModelConfig, type ModelConfig } from './config.js';

/** The two name families of Hugging Face's Qwen-VL checkpoints (runtime/hf/names.ts). */
export type HfFamily = 'qwen2_5_vl' | 'qwen3_vl';

interface ArchitectureInfo {
  readonly family: HfFamily;
  readonly modelType: string;
  readonly moe: boolean;
}

/** The architectures lfc reads and writes, by config.json's `architectures[0]`. */
export const HF_ARCHITECTURES = {
  Qwen2_5_VLForConditionalGeneration: { family: 'qwen2_5_vl', modelType: 'qwen2_5_vl', moe: false },
  Qwen3VLForConditionalGeneration: { family: 'qwen3_vl', modelType: 'qwen3_vl', moe: false },
  Qwen3VLMoeForConditionalGeneration: { family: 'qwen3_vl', modelType: 'qwen3_vl_moe', moe: true },
} as const satisfies Record<string, ArchitectureInfo>;

export type HfArchitecture = keyof typeof HF_ARCHITECTURES;

/** The preset that supplies what config.json lacks when no --model is given. */
const FAMILY_BASE: Record<HfArchitecture, string> = {
  Qwen2_5_VLForConditionalGeneration: 'qwen2.5-vl-7b',
  Qwen3VLForConditionalGeneration: 'qwen3-vl-30b-a3b',
  Qwen3VLMoeForConditionalGeneration: 'qwen3-vl-30b-a3b',
};

type Json = Record<string, unknown>;
const isObject = (v: unknown): v is Json =>
  typeof v === 'object' && v !== null && !Array.isArray(v);

/**
 * The name family of an lfc model: Qwen3-VL's when the encoder has an interpolated position
 * table or deepstack taps, else Qwen2.5-VL's (RMSNorm ViT, no table; also the tiny-vlm models,
 * whose names are lfc's own and so Qwen2.5-VL's `visual.*` / `model.*` with per-expert MoE).
 */
export function familyOfModel(m: ModelConfig['model']): HfFamily {
  const e = m.image_encoder;
  return e.position_embedding === 'interpolated' || e.deepstack_layers.length > 0
    ? 'qwen3_vl'
    : 'qwen2_5_vl';
}

/** The Hugging Face architecture an lfc model exports as. */
export function architectureOfModel(m: ModelConfig['model']): HfArchitecture {
  if (familyOfModel(m) === 'qwen2_5_vl') return 'Qwen2_5_VLForConditionalGeneration';
  return m.text_decoder.num_experts > 0
    ? 'Qwen3VLMoeForConditionalGeneration'
    : 'Qwen3VLForConditionalGeneration';
}

/** config.json's path for a file or a model directory. */
export function hfConfigPath(fileOrDir: string): string {
  return existsSync(fileOrDir) && statSync(fileOrDir).isDirectory()
    ? join(fileOrDir, 'config.json')
    : fileOrDir;
}

/** A config.json (or a directory holding one), parsed; unreadable or malformed is a UserError. */
export function readHfConfigJson(fileOrDir: string): { path: string; json: Json } {
  const path = hfConfigPath(fileOrDir);
  const json: unknown = parseFile(path, 'JSON', (text) => JSON.parse(text) as unknown);
  if (!isObject(json)) throw new UserError(`${path}: expected a JSON object at the top level`);
  return { path, json };
}

/** config.json's architecture: `architectures[0]`, else its `model_type`; unknown is refused. */
export function architectureOfJson(json: Json, path: string): HfArchitecture {
  const known = Object.keys(HF_ARCHITECTURES) as HfArchitecture[];
  const archs = json.architectures;
  const named = Array.isArray(archs) && typeof archs[0] === 'string' ? archs[0] : undefined;
  if (named !== undefined) {
    // own keys only: `in` finds __proto__, constructor and the rest of Object's prototype too
    if (Object.hasOwn(HF_ARCHITECTURES, named)) return named as HfArchitecture;
    throw new UserError(
      `${path}: architecture ${named} is not one lfc builds (${known.join(', ')})`,
    );
  }
  const byType = known.find((a) => HF_ARCHITECTURES[a].modelType === json.model_type);
  if (byType) return byType;
  throw new UserError(
    `${path}: model_type ${JSON.stringify(json.model_type)} and no architectures: not one lfc builds (${known.join(', ')})`,
  );
}

// ---- config.json → lfc keys --------------------------------------------------------------------

/** Typed reads of one object of config.json, each error naming the file and the key's path. */
class Keys {
  constructor(
    private readonly path: string,
    private readonly obj: Json,
    private readonly prefix: string,
  ) {}

  has(key: string): boolean {
    return this.obj[key] !== undefined && this.obj[key] !== null;
  }

  raw(key: string): unknown {
    return this.obj[key];
  }

  private get(key: string, want: string, ok: (v: unknown) => boolean, def?: unknown): unknown {
    const v = this.obj[key];
    if (v === undefined || v === null) {
      if (def !== undefined) return def;
      throw new UserError(`${this.path}: ${this.prefix}${key} is missing`);
    }
    if (!ok(v))
      throw new UserError(
        `${this.path}: ${this.prefix}${key} must be ${want}, got ${JSON.stringify(v)}`,
      );
    return v;
  }

  int(key: string, def?: number): number {
    return this.get(
      key,
      'a positive integer',
      (v) => Number.isInteger(v) && (v as number) > 0,
      def,
    ) as number;
  }

  nonneg(key: string, def?: number): number {
    return this.get(
      key,
      'a non-negative integer',
      (v) => Number.isInteger(v) && (v as number) >= 0,
      def,
    ) as number;
  }

  num(key: string, def?: number): number {
    return this.get(key, 'a positive number', (v) => typeof v === 'number' && v > 0, def) as number;
  }

  bool(key: string, def?: boolean): boolean {
    return this.get(key, 'true or false', (v) => typeof v === 'boolean', def) as boolean;
  }

  str(key: string, def?: string): string {
    return this.get(key, 'a string', (v) => typeof v === 'string', def) as string;
  }

  ints(key: string, def?: number[]): number[] {
    const ok = (v: unknown) =>
      Array.isArray(v) && v.every((x) => Number.isInteger(x) && (x as number) >= 0);
    return this.get(key, 'a list of non-negative integers', ok, def) as number[];
  }

  /** the value must be one of these (what lfc builds); `why` says what the others would need */
  only<T>(key: string, value: T, allowed: readonly T[], why: string): T {
    if (!allowed.includes(value))
      throw new UserError(
        `${this.path}: ${this.prefix}${key} ${JSON.stringify(value)} is not built: ${why}`,
      );
    return value;
  }

  sub(key: string): Keys {
    const v = this.obj[key];
    if (!isObject(v)) throw new UserError(`${this.path}: ${this.prefix}${key} is missing`);
    return new Keys(this.path, v, `${this.prefix}${key}.`);
  }

  /** an optional object (rope_scaling, rope_parameters) */
  maybe(key: string): Keys | undefined {
    return isObject(this.obj[key]) ? this.sub(key) : undefined;
  }
}

/** lfc's keys config.json determines, by dotted path (model.text_decoder.hidden_size → 3584). */
export type LfcKeys = Record<string, unknown>;

export interface HfConfigRead {
  readonly architecture: HfArchitecture;
  readonly family: HfFamily;
  readonly keys: LfcKeys;
}

const ENC = 'model.image_encoder.';
const PROJ = 'model.image_projector.';
const DEC = 'model.text_decoder.';

/** Every lfc architecture key a config.json determines (config.ts's schema names). */
export function lfcKeysOfHfConfig(json: Json, path: string): HfConfigRead {
  const architecture = architectureOfJson(json, path);
  const { family, moe } = HF_ARCHITECTURES[architecture];
  const top = new Keys(path, json, '');
  // Qwen2.5-VL's hub files keep the text keys at the top level; re-saved ones nest them
  const text = family === 'qwen3_vl' || top.has('text_config') ? top.sub('text_config') : top;
  const vision = top.sub('vision_config');
  const keys: LfcKeys = {
    ...visionKeys(vision, family),
    ...textKeys(text, top, family, moe),
  };
  const out = vision.int('out_hidden_size', keys[`${DEC}hidden_size`] as number);
  if (out !== keys[`${DEC}hidden_size`])
    throw new UserError(
      `${path}: vision_config.out_hidden_size ${out} differs from the text hidden_size ${String(keys[`${DEC}hidden_size`])}: lfc's merger projects to the decoder's width`,
    );
  return { architecture, family, keys };
}

function visionKeys(v: Keys, family: HfFamily): LfcKeys {
  const common: LfcKeys = {
    [`${ENC}num_layers`]: v.int('depth'),
    [`${ENC}hidden_size`]: v.int('hidden_size'),
    [`${ENC}num_attention_heads`]: v.int('num_heads'),
    [`${ENC}ffn_hidden_size`]: v.int('intermediate_size'),
    [`${ENC}patch_size`]: v.int(
      'patch_size',
      v.has('spatial_patch_size') ? v.int('spatial_patch_size') : undefined,
    ),
    [`${ENC}temporal_patch_size`]: v.int('temporal_patch_size', 2),
    [`${ENC}in_channels`]: v.int('in_channels', v.has('in_chans') ? v.int('in_chans') : 3),
    [`${ENC}spatial_merge_size`]: v.int('spatial_merge_size', 2),
    // fixed in transformers' Qwen-VL vision towers
    [`${ENC}norm_epsilon`]: 1e-6,
    [`${ENC}rotary_2d`]: true,
    [`${ENC}rotary_base`]: 10000,
    [`${ENC}add_qkv_bias`]: true,
    [`${ENC}add_bias_linear`]: true,
    [`${PROJ}norm_epsilon`]: 1e-6,
    [`${PROJ}activation`]: 'gelu',
  };
  if (family === 'qwen2_5_vl') {
    v.only(
      'hidden_act',
      v.str('hidden_act', 'silu'),
      ['silu'],
      "lfc's Qwen2.5-VL vision MLP is silu-gated (swiglu)",
    );
    return {
      ...common,
      [`${ENC}normalization`]: 'rmsnorm',
      [`${ENC}activation`]: 'swiglu',
      [`${ENC}patch_embed_bias`]: false,
      [`${ENC}position_embedding`]: 'none',
      [`${ENC}num_position_embeddings`]: 0,
      [`${ENC}deepstack_layers`]: [],
      [`${ENC}window_size`]: v.nonneg('window_size', 112),
      [`${ENC}fullatt_block_indexes`]: v.ints('fullatt_block_indexes', [7, 15, 23, 31]),
      [`${PROJ}normalization`]: 'rmsnorm',
    };
  }
  const act = v.str('hidden_act', 'gelu_pytorch_tanh');
  const GELU: Record<string, string> = {
    gelu_pytorch_tanh: 'gelu_tanh',
    gelu_new: 'gelu_tanh',
    gelu: 'gelu',
  };
  v.only('hidden_act', act, Object.keys(GELU), 'the vision MLP is GELU (exact or tanh)');
  return {
    ...common,
    [`${ENC}normalization`]: 'layernorm',
    [`${ENC}activation`]: GELU[act],
    [`${ENC}patch_embed_bias`]: true,
    [`${ENC}position_embedding`]: 'interpolated',
    [`${ENC}num_position_embeddings`]: v.int('num_position_embeddings', 2304),
    [`${ENC}deepstack_layers`]: v.ints('deepstack_visual_indexes', [8, 16, 24]),
    [`${ENC}window_size`]: 0,
    [`${ENC}fullatt_block_indexes`]: [],
    [`${PROJ}normalization`]: 'layernorm',
  };
}

function textKeys(t: Keys, top: Keys, family: HfFamily, moe: boolean): LfcKeys {
  const qwen3 = family === 'qwen3_vl';
  t.only('hidden_act', t.str('hidden_act', 'silu'), ['silu'], "lfc's decoder MLP is SwiGLU");
  const hidden = t.int('hidden_size');
  const heads = t.int('num_attention_heads');
  const rope = t.maybe('rope_scaling') ?? t.maybe('rope_parameters');
  const params = t.maybe('rope_parameters');
  const theta = t.has('rope_theta') ? t.num('rope_theta') : params?.num('rope_theta');
  if (theta === undefined) t.num('rope_theta'); // names the missing key
  if (!rope) t.sub('rope_scaling'); // names the missing key
  if (qwen3 && t.bool('attention_bias', false))
    t.only('attention_bias', true, [false], "lfc's attention output projection has no bias");
  // the top-level key is the one transformers ties by; a nested config may carry its own
  const tie = top.has('tie_word_embeddings')
    ? top.bool('tie_word_embeddings')
    : t.bool('tie_word_embeddings', false);
  const keys: LfcKeys = {
    [`${DEC}num_layers`]: t.int('num_hidden_layers'),
    [`${DEC}hidden_size`]: hidden,
    [`${DEC}num_attention_heads`]: heads,
    [`${DEC}num_query_groups`]: t.int('num_key_value_heads', heads),
    [`${DEC}kv_channels`]: qwen3 ? t.int('head_dim', hidden / heads) : hidden / heads,
    [`${DEC}ffn_hidden_size`]: t.int('intermediate_size'),
    [`${DEC}vocab_size`]: t.int('vocab_size'),
    [`${DEC}untie_embeddings_and_output_weights`]: !tie,
    [`${DEC}add_qkv_bias`]: !qwen3,
    [`${DEC}qk_layernorm`]: qwen3,
    [`${DEC}norm_epsilon`]: t.num('rms_norm_eps', qwen3 ? 1e-6 : 1e-5),
    [`${DEC}rotary_base`]: theta,
    [`${DEC}mrope_section`]: rope!.ints('mrope_section'),
    [`${DEC}mrope_interleaved`]: qwen3,
    [`${DEC}image_token_id`]: top.nonneg('image_token_id', 151655),
  };
  if (!moe)
    return {
      ...keys,
      [`${DEC}num_experts`]: 0,
      [`${DEC}moe_router_topk`]: 0,
      [`${DEC}moe_ffn_hidden_size`]: 0,
      [`${DEC}moe_aux_loss_coeff`]: 0,
    };
  if (t.int('decoder_sparse_step', 1) !== 1)
    t.only(
      'decoder_sparse_step',
      t.raw('decoder_sparse_step'),
      [1],
      'lfc builds every decoder layer as MoE',
    );
  if (t.ints('mlp_only_layers', []).length)
    t.only(
      'mlp_only_layers',
      t.raw('mlp_only_layers'),
      [[]],
      'lfc builds every decoder layer as MoE',
    );
  return {
    ...keys,
    [`${DEC}num_experts`]: t.int('num_experts'),
    [`${DEC}moe_router_topk`]: t.int('num_experts_per_tok'),
    [`${DEC}moe_ffn_hidden_size`]: t.int('moe_intermediate_size'),
    [`${DEC}moe_aux_loss_coeff`]: t.has('router_aux_loss_coef')
      ? (t.raw('router_aux_loss_coef') as number)
      : 0.001,
    // Qwen3-VL-MoE's router renormalises its top-k whatever norm_topk_prob says
    [`${DEC}moe_router_norm_topk`]: true,
  };
}

// ---- config.json + preset → a model request ----------------------------------------------------

export interface HfModelRequest {
  /** the preset the overrides apply to */
  readonly model: string;
  /** `++key=value` for every key config.json determines (and the name without a preset) */
  readonly overrides: readonly string[];
  readonly path: string;
  readonly architecture: HfArchitecture;
}

/**
 * The preset (the one given, or the family's base) and the overrides that make it config.json's
 * model. Without a preset the model is named after config.json's directory.
 */
export function hfModelRequest(fileOrDir: string, preset?: string): HfModelRequest {
  const { path, json } = readHfConfigJson(fileOrDir);
  const { architecture, keys } = lfcKeysOfHfConfig(json, path);
  const base = preset ?? FAMILY_BASE[architecture];
  const overrides = Object.entries({ ...keys, ...processorKeys(path, keys, base) }).map(
    ([k, v]) => `++${k}=${JSON.stringify(v)}`,
  );
  if (preset === undefined) {
    const name = basename(dirname(resolve(path))) || 'hf-model';
    overrides.unshift(`++name=${JSON.stringify(name)}`, '++aliases=[]');
  }
  return { model: base, overrides, path, architecture };
}

/**
 * The image processor's keys of a model from config.json: preprocessor_config.json's, beside it
 * (Qwen2.5-VL's min_pixels and max_pixels, Qwen3-VL's size.shortest_edge and longest_edge, both
 * image_mean and image_std); without it, the preset's, but for its min and max pixels where
 * config.json's patch × merge differs from the preset's (they belong to its own patch size: HF's
 * defaults at config.json's apply).
 */
function processorKeys(
  configPath: string,
  keys: Record<string, unknown>,
  preset: string,
): Record<string, unknown> {
  const E = 'model.image_encoder.';
  const file = join(dirname(configPath), 'preprocessor_config.json');
  if (!existsSync(file)) {
    const e = loadModelConfig(preset, []).model.image_encoder;
    const patch = (keys[`${E}patch_size`] as number | undefined) ?? e.patch_size;
    const merge = (keys[`${E}spatial_merge_size`] as number | undefined) ?? e.spatial_merge_size;
    if (patch * merge === e.patch_size * e.spatial_merge_size) return {};
    return { [`${E}min_pixels`]: null, [`${E}max_pixels`]: null };
  }
  const json = parseFile(file, 'JSON', (text) => JSON.parse(text) as unknown);
  if (!isObject(json)) throw new UserError(`${file}: expected a JSON object at the top level`);
  const size = isObject(json.size) ? json.size : {};
  const pixels = (key: string, v: unknown) => {
    if (v === undefined) return null;
    if (!Number.isInteger(v) || (v as number) <= 0)
      throw new UserError(`${file}: ${key} must be a positive integer, got ${JSON.stringify(v)}`);
    return v;
  };
  const rgb = (key: string) => {
    const v = json[key];
    if (v === undefined) return {};
    if (!Array.isArray(v) || v.length !== 3 || !v.every((x) => typeof x === 'number'))
      throw new UserError(`${file}: ${key} must be 3 numbers, got ${JSON.stringify(v)}`);
    return { [`${E}${key}`]: v };
  };
  return {
    [`${E}min_pixels`]: pixels('min_pixels', json.min_pixels ?? size.shortest_edge),
    [`${E}max_pixels`]: pixels('max_pixels', json.max_pixels ?? size.longest_edge),
    ...rgb('image_mean'),
    ...rgb('image_std'),
  };
}

/** config.json's model: the preset, config.json's keys over it, then the user's overrides. */
export function loadHfModelConfig(
  fileOrDir: string,
  preset?: string,
  overrides: readonly string[] = [],
): ModelConfig {
  const r = hfModelRequest(fileOrDir, preset);
  try {
    return loadModelConfig(r.model, [...r.overrides, ...overrides]);
  } catch (e) {
    if (e instanceof UserError) throw new UserError(`${r.path}: ${e.message}`);
    throw e;
  }
}

// ---- lfc model → config.json -------------------------------------------------------------------

export interface HfConfigWritten {
  readonly json: Json;
  readonly architecture: HfArchitecture;
  /** what of the lfc model config.json cannot say (the architecture computes otherwise) */
  readonly inexact: readonly string[];
}

/** config.json for an lfc model (the inverse of lfcKeysOfHfConfig for the Qwen-VL presets). */
export function hfConfigOf(
  m: ModelConfig['model'],
  dtype: 'bfloat16' | 'float32',
): HfConfigWritten {
  const architecture = architectureOfModel(m);
  const { family, modelType, moe } = HF_ARCHITECTURES[architecture];
  const e = m.image_encoder;
  const d = m.text_decoder;
  const inexact = inexactFeatures(m, family);
  const rope = { mrope_section: d.mrope_section };
  const vision: Json = {
    depth: e.num_layers,
    hidden_size: e.hidden_size,
    num_heads: e.num_attention_heads,
    intermediate_size: e.ffn_hidden_size,
    patch_size: e.patch_size,
    temporal_patch_size: e.temporal_patch_size,
    in_channels: e.in_channels,
    spatial_merge_size: e.spatial_merge_size,
    out_hidden_size: d.hidden_size,
  };
  const text: Json = {
    hidden_size: d.hidden_size,
    intermediate_size: d.ffn_hidden_size,
    num_hidden_layers: d.num_layers,
    num_attention_heads: d.num_attention_heads,
    num_key_value_heads: d.num_query_groups,
    hidden_act: 'silu',
    rms_norm_eps: d.norm_epsilon,
    rope_theta: d.rotary_base,
    vocab_size: d.vocab_size,
  };
  const tie = !d.untie_embeddings_and_output_weights;
  if (family === 'qwen2_5_vl') {
    const json: Json = {
      architectures: [architecture],
      model_type: modelType,
      ...text,
      rope_scaling: { type: 'mrope', ...rope },
      tie_word_embeddings: tie,
      image_token_id: d.image_token_id,
      torch_dtype: dtype,
      vision_config: {
        ...vision,
        hidden_act: 'silu',
        in_chans: e.in_channels,
        spatial_patch_size: e.patch_size,
        window_size: e.window_size,
        fullatt_block_indexes: e.fullatt_block_indexes,
        tokens_per_second: 2,
      },
    };
    return { json, architecture, inexact };
  }
  const experts: Json = moe
    ? {
        num_experts: d.num_experts,
        num_experts_per_tok: d.moe_router_topk,
        moe_intermediate_size: d.moe_ffn_hidden_size,
        norm_topk_prob: true,
        decoder_sparse_step: 1,
        mlp_only_layers: [],
        router_aux_loss_coef: d.moe_aux_loss_coeff,
      }
    : {};
  const json: Json = {
    architectures: [architecture],
    model_type: modelType,
    image_token_id: d.image_token_id,
    tie_word_embeddings: tie,
    torch_dtype: dtype,
    text_config: {
      model_type: `${modelType}_text`,
      ...text,
      head_dim: d.kv_channels,
      attention_bias: false,
      rope_scaling: { rope_type: 'default', mrope_interleaved: true, ...rope },
      tie_word_embeddings: tie,
      ...experts,
      dtype,
    },
    vision_config: {
      model_type: modelType,
      ...vision,
      hidden_act: e.activation === 'gelu' ? 'gelu' : 'gelu_pytorch_tanh',
      num_position_embeddings: e.num_position_embeddings,
      deepstack_visual_indexes: e.deepstack_layers,
    },
  };
  return { json, architecture, inexact };
}

/** The features of an lfc model its Hugging Face architecture computes otherwise. */
function inexactFeatures(m: ModelConfig['model'], family: HfFamily): string[] {
  const e = m.image_encoder;
  const p = m.image_projector;
  const d = m.text_decoder;
  const want: [string, unknown, unknown][] =
    family === 'qwen2_5_vl'
      ? [
          ['image_encoder.normalization', e.normalization, 'rmsnorm'],
          ['image_encoder.activation', e.activation, 'swiglu'],
          ['image_encoder.position_embedding', e.position_embedding, 'none'],
          ['image_encoder.patch_embed_bias', e.patch_embed_bias, false],
          ['image_projector.normalization', p.normalization, 'rmsnorm'],
          ['text_decoder.add_qkv_bias', d.add_qkv_bias, true],
          ['text_decoder.qk_layernorm', d.qk_layernorm, false],
          ['text_decoder.mrope_interleaved', d.mrope_interleaved, false],
          ['text_decoder.num_experts', d.num_experts, 0],
          ['text_decoder.kv_channels', d.kv_channels, d.hidden_size / d.num_attention_heads],
        ]
      : [
          ['image_encoder.normalization', e.normalization, 'layernorm'],
          ['image_encoder.position_embedding', e.position_embedding, 'interpolated'],
          ['image_encoder.patch_embed_bias', e.patch_embed_bias, true],
          ['image_encoder.window_size', e.window_size, 0],
          ['image_encoder.activation', e.activation === 'swiglu' ? 'swiglu' : 'gelu', 'gelu'],
          ['image_projector.normalization', p.normalization, 'layernorm'],
          ['text_decoder.add_qkv_bias', d.add_qkv_bias, false],
          ['text_decoder.qk_layernorm', d.qk_layernorm, true],
          ['text_decoder.mrope_interleaved', d.mrope_interleaved, true],
          [
            'text_decoder.moe_router_norm_topk',
            d.num_experts === 0 || d.moe_router_norm_topk,
            true,
          ],
        ];
  want.push(
    ['image_encoder.rotary_2d', e.rotary_2d, true],
    ['image_encoder.rotary_base', e.rotary_base, 10000],
    ['image_encoder.add_qkv_bias', e.add_qkv_bias, true],
    ['image_encoder.add_bias_linear', e.add_bias_linear, true],
    ['image_encoder.norm_epsilon', e.norm_epsilon, 1e-6],
    ['image_projector.norm_epsilon', p.norm_epsilon, 1e-6],
    ['image_projector.activation', p.activation, 'gelu'],
    ['text_decoder.mrope_section', d.mrope_section.length, 3],
  );
  return want
    .filter(([, have, should]) => have !== should)
    .map(([key, have, should]) =>
      key === 'text_decoder.mrope_section'
        ? `${key} has ${String(have)} sections (M-RoPE has 3)`
        : `${key} is ${JSON.stringify(have)} (the architecture's: ${JSON.stringify(should)})`,
    );
}
