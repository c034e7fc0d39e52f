// Model configs: presets in configs/models/ compose an image encoder, an image projector and a
// text decoder (LoongForge's three parts) from their own YAML files; Hydra-style overrides
// (`key=value` to change a key, `+key=value` to add one, `~key` to delete one) then apply; the
// result is validated field by field against the schema below. Every problem is a UserError that
// names the file or override and the key.

import { existsSync, readdirSync } from 'node:fs';
import { basename, join } from 'node:path';
import { didYouMean, oneLine, parseFile, UserError } from '../errors.js';
import { configsDir } from '../paths.js';
import { cachedParse } from './file-cache.js';
import { yaml } from './yaml.js';

export interface EncoderConfig {
  type: 'vit';
  num_layers: number;
  hidden_size: number;
  num_attention_heads: number;
  ffn_hidden_size: number;
  patch_size: number;
  temporal_patch_size: number;
  in_channels: number;
  spatial_merge_size: number;
  normalization: 'layernorm' | 'rmsnorm';
  norm_epsilon: number;
  /** gelu: exact (erf); gelu_tanh: the tanh approximation; swiglu: silu(gate)·up (Qwen2.5's silu MLP) */
  activation: 'gelu_tanh' | 'gelu' | 'swiglu';
  add_qkv_bias: boolean;
  add_bias_linear: boolean;
  patch_embed_bias: boolean;
  /**
   * learned_row_col: row and column tables (tiny-vlm); interpolated: a learned square table
   * bilinearly interpolated to each image's patch grid (Qwen3-VL); none
   */
  position_embedding: 'learned_row_col' | 'interpolated' | 'none';
  /** rotate q and k by the patch's row (first quarter of the frequencies' pairs) and column (Qwen-VL) */
  rotary_2d: boolean;
  num_position_embeddings: number;
  rotary_base: number;
  max_image_size: number;
  deepstack_layers: number[];
  window_size: number;
  fullatt_block_indexes: number[];
  tensor_model_parallel_size: number;
  freeze: boolean;
  /**
   * The image processor (HF's preprocessor_config.json): images are resized to at least
   * min_pixels and at most max_pixels (absent: HF Qwen2-VL processor's defaults of 4 and 1280
   * merged tokens at this encoder's patch × merge), then rescaled by 1/255 and normalized with
   * image_mean and image_std, per RGB channel.
   */
  min_pixels?: number;
  max_pixels?: number;
  image_mean: [number, number, number];
  image_std: [number, number, number];
}

export interface ProjectorConfig {
  type: 'patch_merger';
  normalization: 'layernorm' | 'rmsnorm';
  norm_epsilon: number;
  activation: 'gelu_tanh' | 'gelu';
  freeze: boolean;
}

export interface DecoderConfig {
  num_layers: number;
  hidden_size: number;
  num_attention_heads: number;
  num_query_groups: number;
  kv_channels: number;
  ffn_hidden_size: number;
  vocab_size: number;
  untie_embeddings_and_output_weights: boolean;
  add_qkv_bias: boolean;
  qk_layernorm: boolean;
  normalization: 'rmsnorm';
  norm_epsilon: number;
  rotary_base: number;
  mrope_section: number[];
  /** Qwen3-VL's interleaved M-RoPE (frequency j rotates by t, h, w in turn); else sectioned */
  mrope_interleaved: boolean;
  /** the image placeholder token; a microbatch carries its own, checked against this */
  image_token_id: number;
  num_experts: number;
  moe_router_topk: number;
  moe_ffn_hidden_size: number;
  moe_aux_loss_coeff: number;
  /** renormalise the top-k routing probabilities to sum to 1 (HF norm_topk_prob) */
  moe_router_norm_topk: boolean;
  /** Megatron's --moe-expert-capacity-factor: absent, no token is dropped */
  moe_expert_capacity_factor?: number;
  /** Megatron's --moe-token-drop-policy: which assignments an expert over capacity keeps (default probs, as Megatron) */
  moe_token_drop_policy: 'position' | 'probs';
  /**
   * without a capacity: each rank's expert dispatch is planned for at most this multiple of the
   * rows balanced routing gives it, and the runtime refuses more (--moe-routing-imbalance);
   * absent, the dropless worst case (every token of the group on one rank)
   */
  moe_routing_imbalance?: number;
  /**
   * what a typical step's routing gives the busiest rank of an expert-parallel group, as a
   * multiple of balanced routing's rows (the mean, over layers and microbatches, of the largest
   * rank's received rows over the group's mean): the size the simulator prices each rank's
   * expert dispatch at, since every rank of the group waits for the busiest at the next
   * all-to-all (--moe-expected-imbalance). Absent: 1, balanced routing.
   */
  moe_expected_imbalance?: number;
  freeze: boolean;
}

export interface TrainingConfig {
  seq_length: number;
  /** report the cross-entropy of caption tokens (the synthetic task's 2–25) as a metric */
  caption_metric: boolean;
  /** the data profile (configs/data) memory is planned for when --data-profile names none */
  data_profile: string;
}

export interface ModelConfig {
  name: string;
  aliases: string[];
  /** where the preset came from, for messages */
  source: string;
  model: {
    image_encoder: EncoderConfig;
    image_projector: ProjectorConfig;
    text_decoder: DecoderConfig;
  };
  training: TrainingConfig;
}

// ---- schema ----------------------------------------------------------------------------------

/** def: the value when the key is absent; optional: absent stays absent (no default, not required) */
type FieldSpec =
  | {
      t:
        | 'posint'
        | 'nonnegint'
        | 'posnumber'
        | 'nonnegnumber'
        | 'bool'
        | 'nonnegints'
        | 'posints'
        | 'rgb'
        | 'posrgb'
        | 'string';
      def?: unknown;
      optional?: boolean;
    }
  | { t: 'enum'; values: readonly string[]; def?: string; optional?: boolean };

type Schema = Record<string, FieldSpec>;

const ENCODER_SCHEMA: Schema = {
  type: { t: 'enum', values: ['vit'] },
  num_layers: { t: 'posint' },
  hidden_size: { t: 'posint' },
  num_attention_heads: { t: 'posint' },
  ffn_hidden_size: { t: 'posint' },
  patch_size: { t: 'posint' },
  temporal_patch_size: { t: 'posint', def: 1 },
  in_channels: { t: 'posint', def: 3 },
  spatial_merge_size: { t: 'posint', def: 2 },
  normalization: { t: 'enum', values: ['layernorm', 'rmsnorm'] },
  norm_epsilon: { t: 'posnumber', def: 1e-6 },
  activation: { t: 'enum', values: ['gelu_tanh', 'gelu', 'swiglu'] },
  add_qkv_bias: { t: 'bool', def: true },
  add_bias_linear: { t: 'bool', def: true },
  patch_embed_bias: { t: 'bool', def: true },
  position_embedding: { t: 'enum', values: ['learned_row_col', 'interpolated', 'none'] },
  rotary_2d: { t: 'bool', def: false },
  num_position_embeddings: { t: 'nonnegint', def: 0 },
  rotary_base: { t: 'posnumber', def: 10000 },
  max_image_size: { t: 'posint' },
  deepstack_layers: { t: 'nonnegints', def: [] },
  window_size: { t: 'nonnegint', def: 0 },
  fullatt_block_indexes: { t: 'nonnegints', def: [] },
  tensor_model_parallel_size: { t: 'posint', def: 1 },
  freeze: { t: 'bool', def: false },
  min_pixels: { t: 'posint', optional: true },
  max_pixels: { t: 'posint', optional: true },
  // HF's Qwen2-VL image processor's defaults (OpenAI CLIP's)
  image_mean: { t: 'rgb', def: [0.48145466, 0.4578275, 0.40821073] },
  image_std: { t: 'posrgb', def: [0.26862954, 0.26130258, 0.27577711] },
};

const PROJECTOR_SCHEMA: Schema = {
  type: { t: 'enum', values: ['patch_merger'] },
  normalization: { t: 'enum', values: ['layernorm', 'rmsnorm'] },
  norm_epsilon: { t: 'posnumber', def: 1e-6 },
  activation: { t: 'enum', values: ['gelu_tanh', 'gelu'], def: 'gelu_tanh' },
  freeze: { t: 'bool', def: false },
};

const DECODER_SCHEMA: Schema = {
  num_layers: { t: 'posint' },
  hidden_size: { t: 'posint' },
  num_attention_heads: { t: 'posint' },
  num_query_groups: { t: 'posint' },
  kv_channels: { t: 'posint' },
  ffn_hidden_size: { t: 'posint' },
  vocab_size: { t: 'posint' },
  untie_embeddings_and_output_weights: { t: 'bool', def: true },
  add_qkv_bias: { t: 'bool', def: false },
  qk_layernorm: { t: 'bool', def: false },
  normalization: { t: 'enum', values: ['rmsnorm'], def: 'rmsnorm' },
  norm_epsilon: { t: 'posnumber', def: 1e-6 },
  rotary_base: { t: 'posnumber', def: 1e6 },
  mrope_section: { t: 'posints' },
  mrope_interleaved: { t: 'bool', def: false },
  image_token_id: { t: 'nonnegint', def: 1 },
  num_experts: { t: 'nonnegint', def: 0 },
  moe_router_topk: { t: 'nonnegint', def: 0 },
  moe_ffn_hidden_size: { t: 'nonnegint', def: 0 },
  moe_aux_loss_coeff: { t: 'nonnegnumber', def: 0 },
  moe_router_norm_topk: { t: 'bool', def: true },
  moe_expert_capacity_factor: { t: 'posnumber', optional: true },
  // Megatron's default, probs
  moe_token_drop_policy: { t: 'enum', values: ['position', 'probs'], def: 'probs' },
  moe_routing_imbalance: { t: 'posnumber', optional: true },
  moe_expected_imbalance: { t: 'posnumber', optional: true },
  freeze: { t: 'bool', def: false },
};

const TRAINING_SCHEMA: Schema = {
  seq_length: { t: 'posint' },
  caption_metric: { t: 'bool', def: false },
  data_profile: { t: 'string', def: 'default' },
};

const SECTIONS = {
  'model.image_encoder': ENCODER_SCHEMA,
  'model.image_projector': PROJECTOR_SCHEMA,
  'model.text_decoder': DECODER_SCHEMA,
  training: TRAINING_SCHEMA,
} as const;

const PART_DIRS = ['image_encoder', 'image_projector', 'text_decoder'] as const;

// ---- presets ---------------------------------------------------------------------------------

type Tree = Record<string, unknown>;

function isTree(v: unknown): v is Tree {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function readYaml(path: string): Tree {
  const doc: unknown = cachedParse(path, () =>
    parseFile(path, 'YAML', (text): unknown => yaml().parse(text, { logLevel: 'error' })),
  );
  if (!isTree(doc)) throw new UserError(`${path}: expected a mapping at the top level`);
  return doc;
}

export interface PresetEntry {
  name: string;
  aliases: string[];
  path: string;
}

export function listPresets(): PresetEntry[] {
  const dir = configsDir('models');
  return readdirSync(dir)
    .filter((f) => f.endsWith('.yaml'))
    .sort()
    .map((f) => {
      const path = join(dir, f);
      // names only: kept apart from the parsed file, so that a search's thousands of lookups do
      // not copy every preset each time
      return cachedParse(
        path,
        (): PresetEntry => {
          const doc = readYaml(path);
          const aliases = Array.isArray(doc.aliases) ? doc.aliases.map(String) : [];
          return { name: String(doc.name ?? basename(f, '.yaml')), aliases, path };
        },
        `${path}\0entry`,
      );
    });
}

function findPreset(ref: string): string {
  if (ref.endsWith('.yaml') || ref.endsWith('.yml') || ref.includes('/')) {
    if (!existsSync(ref)) throw new UserError(`model file ${ref} does not exist`);
    return ref;
  }
  const presets = listPresets();
  const hit = presets.find((p) => p.name === ref || p.aliases.includes(ref));
  if (!hit) {
    const names = presets.flatMap((p) => [p.name, ...p.aliases]);
    throw new UserError(
      `unknown model '${ref}'${didYouMean(ref, names)}; presets: ${presets.map((p) => p.name).join(', ')}`,
    );
  }
  return hit.path;
}

function deepMerge(base: Tree, over: Tree): Tree {
  const out: Tree = { ...base };
  for (const [k, v] of Object.entries(over)) {
    out[k] = isTree(v) && isTree(out[k]) ? deepMerge(out[k] as Tree, v) : v;
  }
  return out;
}

/** The preset's raw tree: parts composed from `defaults`, then the preset's own `model:` keys. */
function composePreset(path: string): Tree {
  const doc = readYaml(path);
  const defaults = doc.defaults ?? {};
  if (!isTree(defaults))
    throw new UserError(
      `${path}: 'defaults' must map image_encoder/image_projector/text_decoder to part names`,
    );
  for (const k of Object.keys(defaults)) {
    if (!(PART_DIRS as readonly string[]).includes(k)) {
      throw new UserError(`${path}: defaults.${k}: unknown part${didYouMean(k, PART_DIRS)}`);
    }
  }
  const model: Tree = {};
  for (const part of PART_DIRS) {
    const ref = defaults[part];
    if (ref === undefined) continue;
    if (typeof ref !== 'string')
      throw new UserError(`${path}: defaults.${part} must be a part name`);
    const file = configsDir('models', part, `${ref}.yaml`);
    if (!existsSync(file)) {
      const known = readdirSync(configsDir('models', part)).map((f) => basename(f, '.yaml'));
      throw new UserError(
        `${path}: defaults.${part}: no ${part} config '${ref}'${didYouMean(ref, known)}`,
      );
    }
    model[part] = readYaml(file);
  }
  const ownModel = doc.model ?? {};
  if (!isTree(ownModel)) throw new UserError(`${path}: 'model' must be a mapping`);
  for (const k of Object.keys(doc)) {
    if (!['name', 'aliases', 'defaults', 'model', 'training'].includes(k)) {
      throw new UserError(
        `${path}: unknown top-level key '${k}'${didYouMean(k, ['name', 'aliases', 'defaults', 'model', 'training'])}`,
      );
    }
  }
  return {
    name: doc.name ?? basename(path).replace(/\.ya?ml$/, ''),
    aliases: doc.aliases ?? [],
    model: deepMerge(model, ownModel),
    training: doc.training ?? {},
  };
}

// ---- overrides -------------------------------------------------------------------------------

const OVERRIDE_RE = /^(\+{0,2}|~)([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*)(?:=(.*))?$/s;

export function isOverride(arg: string): boolean {
  return /^(\+{1,2}|~)?[A-Za-z_][A-Za-z0-9_.]*=/.test(arg) || /^~[A-Za-z_]/.test(arg);
}

/** Applies one Hydra-style override to the tree in place. */
export function applyOverride(tree: Tree, text: string): void {
  const shown = oneLine(text); // the override as messages quote it
  const m = OVERRIDE_RE.exec(text);
  if (!m) throw new UserError(`override '${shown}': expected key=value, +key=value or ~key`);
  const [, prefix, key, rawValue] = m;
  if (prefix !== '~' && rawValue === undefined)
    throw new UserError(`override '${shown}': missing '=value'`);
  const path = key.split('.');
  let node: Tree = tree;
  for (let i = 0; i < path.length - 1; i++) {
    const next = node[path[i]];
    if (!isTree(next)) {
      const where = path.slice(0, i + 1).join('.');
      const siblings = Object.keys(node);
      throw new UserError(
        `override '${shown}': no config group '${where}'${didYouMean(path[i], siblings)}`,
      );
    }
    node = next;
  }
  const leaf = path[path.length - 1];
  if (prefix === '~') {
    if (!(leaf in node)) throw new UserError(`override '${shown}': no key '${key}' to delete`);
    delete node[leaf];
    return;
  }
  if (prefix === '' && !(leaf in node)) {
    throw new UserError(
      `override '${shown}': no key '${key}'${didYouMean(leaf, Object.keys(node))}; use +${key}=… to add a new key`,
    );
  }
  let value: unknown;
  try {
    value = rawValue === '' ? '' : yaml().parse(rawValue, { logLevel: 'error' });
  } catch {
    value = rawValue;
  }
  node[leaf] = value;
}

// ---- validation ------------------------------------------------------------------------------

function checkField(where: string, spec: FieldSpec, v: unknown): unknown {
  const bad = (want: string) =>
    new UserError(`${where}: must be ${want}, got ${JSON.stringify(v)}`);
  switch (spec.t) {
    case 'posint':
      if (!Number.isInteger(v) || (v as number) <= 0) throw bad('a positive integer');
      return v;
    case 'nonnegint':
      if (!Number.isInteger(v) || (v as number) < 0) throw bad('a non-negative integer');
      return v;
    case 'posnumber':
      if (typeof v !== 'number' || !Number.isFinite(v) || v <= 0) throw bad('a positive number');
      return v;
    case 'nonnegnumber':
      if (typeof v !== 'number' || !Number.isFinite(v) || v < 0) throw bad('a non-negative number');
      return v;
    case 'bool':
      if (typeof v !== 'boolean') throw bad('true or false');
      return v;
    case 'string':
      if (typeof v !== 'string' || v === '') throw bad('a non-empty string');
      return v;
    case 'nonnegints':
    case 'posints': {
      const min = spec.t === 'posints' ? 1 : 0;
      if (!Array.isArray(v) || !v.every((x) => Number.isInteger(x) && x >= min)) {
        throw bad(`a list of ${min ? 'positive' : 'non-negative'} integers`);
      }
      return v;
    }
    case 'rgb':
    case 'posrgb': {
      const pos = spec.t === 'posrgb';
      if (
        !Array.isArray(v) ||
        v.length !== 3 ||
        !v.every((x) => typeof x === 'number' && Number.isFinite(x) && (!pos || x > 0))
      )
        throw bad(`a list of 3 ${pos ? 'positive ' : ''}numbers (R, G, B)`);
      return v;
    }
    case 'enum':
      if (typeof v !== 'string' || !spec.values.includes(v))
        throw bad(`one of ${spec.values.join(', ')}`);
      return v;
  }
}

function validateSection(tree: Tree, section: keyof typeof SECTIONS, source: string): Tree {
  const schema = SECTIONS[section];
  const path = section.split('.');
  let raw: unknown = tree;
  for (const p of path) raw = isTree(raw) ? raw[p] : undefined;
  if (raw === undefined) raw = section === 'training' ? {} : undefined;
  if (!isTree(raw)) throw new UserError(`${source}: ${section} is missing`);
  const out: Tree = {};
  for (const k of Object.keys(raw)) {
    if (!(k in schema))
      throw new UserError(
        `${source}: ${section}.${k}: unknown key${didYouMean(k, Object.keys(schema))}`,
      );
  }
  for (const [k, spec] of Object.entries(schema)) {
    let v = raw[k];
    if (v === undefined || v === null) {
      if (spec.optional) continue;
      if (spec.def === undefined) throw new UserError(`${source}: ${section}.${k} is required`);
      v = spec.def;
    }
    out[k] = checkField(`${source}: ${section}.${k}`, spec, v);
  }
  return out;
}

/** Rules between fields of one model, each named in its message. */
function checkConsistency(c: ModelConfig): void {
  const e = c.model.image_encoder;
  const d = c.model.text_decoder;
  const src = c.source;
  if (e.hidden_size % e.num_attention_heads !== 0) {
    throw new UserError(
      `${src}: model.image_encoder.hidden_size ${e.hidden_size} is not divisible by num_attention_heads ${e.num_attention_heads}`,
    );
  }
  if (e.max_image_size % (e.patch_size * e.spatial_merge_size) !== 0) {
    throw new UserError(
      `${src}: model.image_encoder.max_image_size ${e.max_image_size} is not a multiple of patch_size × spatial_merge_size = ${e.patch_size * e.spatial_merge_size}`,
    );
  }
  const factor = e.patch_size * e.spatial_merge_size;
  for (const key of ['min_pixels', 'max_pixels'] as const) {
    const v = e[key];
    if (v !== undefined && v < factor * factor)
      throw new UserError(
        `${src}: model.image_encoder.${key} ${v} is below one merged token (patch_size × spatial_merge_size squared = ${factor * factor} pixels)`,
      );
  }
  if (e.min_pixels !== undefined && e.max_pixels !== undefined && e.min_pixels > e.max_pixels)
    throw new UserError(
      `${src}: model.image_encoder.min_pixels ${e.min_pixels} is above max_pixels ${e.max_pixels}`,
    );
  for (const l of [...e.deepstack_layers, ...e.fullatt_block_indexes]) {
    if (l >= e.num_layers)
      throw new UserError(
        `${src}: model.image_encoder names block ${l}, but it has ${e.num_layers} blocks`,
      );
  }
  if (e.position_embedding === 'interpolated' && e.num_position_embeddings === 0) {
    throw new UserError(
      `${src}: model.image_encoder.num_position_embeddings must be set for learned position embeddings`,
    );
  }
  if (d.num_attention_heads % d.num_query_groups !== 0) {
    throw new UserError(
      `${src}: model.text_decoder.num_attention_heads ${d.num_attention_heads} is not a multiple of num_query_groups ${d.num_query_groups}`,
    );
  }
  const half = d.mrope_section.reduce((a, b) => a + b, 0);
  if (half * 2 !== d.kv_channels) {
    throw new UserError(
      `${src}: model.text_decoder.mrope_section sums to ${half}; it must be kv_channels/2 = ${d.kv_channels / 2}`,
    );
  }
  if (d.num_experts > 0) {
    if (d.moe_router_topk < 1 || d.moe_router_topk > d.num_experts) {
      throw new UserError(
        `${src}: model.text_decoder.moe_router_topk ${d.moe_router_topk} must be in [1, num_experts = ${d.num_experts}]`,
      );
    }
    if (d.moe_ffn_hidden_size < 1)
      throw new UserError(
        `${src}: model.text_decoder.moe_ffn_hidden_size must be set for an MoE decoder`,
      );
  }
  if (e.deepstack_layers.length > d.num_layers) {
    throw new UserError(
      `${src}: ${e.deepstack_layers.length} deepstack taps but only ${d.num_layers} decoder layers`,
    );
  }
}

/** Loads a preset (name, alias or YAML path), applies overrides, validates. */
export function loadModelConfig(ref: string, overrides: readonly string[] = []): ModelConfig {
  const path = findPreset(ref);
  const tree = composePreset(path);
  for (const o of overrides) applyOverride(tree, o);
  const source = overrides.length ? `${ref} (with overrides)` : ref;
  if (!Array.isArray(tree.aliases))
    throw new UserError(
      `${source}: aliases must be a list of names, got ${JSON.stringify(tree.aliases)}`,
    );
  const config = {
    name: String(tree.name),
    aliases: (tree.aliases as unknown[]).map(String),
    source,
    model: {
      image_encoder: validateSection(tree, 'model.image_encoder', source),
      image_projector: validateSection(tree, 'model.image_projector', source),
      text_decoder: validateSection(tree, 'model.text_decoder', source),
    },
    training: validateSection(tree, 'training', source),
  } as unknown as ModelConfig;
  for (const k of Object.keys(tree.model as Tree)) {
    if (!(PART_DIRS as readonly string[]).includes(k)) {
      throw new UserError(`${source}: model.${k}: unknown part${didYouMean(k, PART_DIRS)}`);
    }
  }
  checkConsistency(config);
  return config;
}

/**
 * A resolved model config read back (a plan's model.config): each part checked as a preset's is,
 * so a damaged one is a UserError naming `source` and the key.
 */
export function checkModelParts(model: unknown, source: string): ModelConfig['model'] {
  const tree: Tree = { model: model as Tree };
  const parts = {
    image_encoder: validateSection(tree, 'model.image_encoder', source),
    image_projector: validateSection(tree, 'model.image_projector', source),
    text_decoder: validateSection(tree, 'model.text_decoder', source),
  } as unknown as ModelConfig['model'];
  checkConsistency({
    name: '',
    aliases: [],
    source,
    model: parts,
    training: {},
  } as unknown as ModelConfig);
  return parts;
}

export function isMoE(c: ModelConfig): boolean {
  return c.model.text_decoder.num_experts > 0;
}
