// lfc's parameter names ↔ Hugging Face's tensor names (docs/qwen-vl.md, "Hugging Face names").
// lfc names parameters as tiny-vlm does; a Hugging Face checkpoint names them by family:
//
//   qwen2_5_vl  `visual.*`, `model.layers.*`, `model.embed_tokens`, `model.norm`, `lm_head`; the
//               merger's norm / fc1 / fc2 are `ln_q` / `mlp.0` / `mlp.2`. Experts (tiny-vlm-moe
//               only: Qwen2.5-VL is dense) stay one tensor each, as Qwen3-MoE's checkpoints have them.
//   qwen3_vl    `model.visual.*`, `model.language_model.*`, `lm_head`; MLP, merger and deepstack
//               mergers' fc1 / fc2 are `linear_fc1` / `linear_fc2`; a layer's experts are two fused
//               tensors, `mlp.experts.gate_up_proj` [E, H, 2F] and `mlp.experts.down_proj` [E, F, H].
//
// Where a parameter's elements lie in its Hugging Face tensor is a strided view (LfcView): element
// (i, j) of the parameter is element `offset + i·strides[0] + j·strides[1]` of the tensor. A
// renamed parameter is the whole tensor, row-major (the conv3d patch weight [Hv, C·T·P·P] is the
// same memory as HF's [Hv, C, T, P, P]); an expert's matrices are transposed slices of the fused
// tensors. Loading (load.ts) and exporting (export.ts) both read this one table.

import type { ModelConfig } from '../../compiler/frontend/config.js';
import { familyOfModel, type HfFamily } from '../../compiler/frontend/hf-config.js';

export { familyOfModel, type HfFamily };

/**
 * Where a checkpoint puts the vision tower and the language model: `legacy` (`visual.*`,
 * `model.*`: Qwen2.5-VL's hub files) or `nested` (`model.visual.*`, `model.language_model.*`:
 * Qwen3-VL's, and Qwen2.5-VL as recent transformers re-save it).
 */
export type HfLayout = 'legacy' | 'nested';

export interface HfNaming {
  readonly family: HfFamily;
  readonly layout: HfLayout;
}

/** The naming an lfc model's checkpoint has on the hub. */
export function namingOf(m: ModelConfig['model']): HfNaming {
  const family = familyOfModel(m);
  return { family, layout: family === 'qwen3_vl' ? 'nested' : 'legacy' };
}

/**
 * Each family's renames, lfc template → Hugging Face template (legacy layout), first match wins;
 * `{x}` is one name segment, `{*}` the rest. A name no rule matches keeps its name.
 */
const RENAMES: Record<HfFamily, readonly (readonly [string, string])[]> = {
  qwen2_5_vl: [
    ['visual.merger.norm.{*}', 'visual.merger.ln_q.{*}'],
    ['visual.merger.fc1.{*}', 'visual.merger.mlp.0.{*}'],
    ['visual.merger.fc2.{*}', 'visual.merger.mlp.2.{*}'],
  ],
  qwen3_vl: [
    ['visual.blocks.{b}.mlp.fc1.{*}', 'visual.blocks.{b}.mlp.linear_fc1.{*}'],
    ['visual.blocks.{b}.mlp.fc2.{*}', 'visual.blocks.{b}.mlp.linear_fc2.{*}'],
    ['visual.merger.fc1.{*}', 'visual.merger.linear_fc1.{*}'],
    ['visual.merger.fc2.{*}', 'visual.merger.linear_fc2.{*}'],
    ['visual.deepstack_merger_list.{j}.fc1.{*}', 'visual.deepstack_merger_list.{j}.linear_fc1.{*}'],
    ['visual.deepstack_merger_list.{j}.fc2.{*}', 'visual.deepstack_merger_list.{j}.linear_fc2.{*}'],
  ],
};

const compiled = new Map<string, { re: RegExp; holes: string[] }>();

/** A template as a regular expression, with the names of its holes in order (compiled once). */
function compileTemplate(t: string): { re: RegExp; holes: string[] } {
  const hit = compiled.get(t);
  if (hit) return hit;
  const holes: string[] = [];
  const body = t
    .split(/(\{[a-z*]+\})/)
    .map((part) => {
      const hole = /^\{([a-z*]+)\}$/.exec(part);
      if (!hole) return part.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
      holes.push(hole[1]);
      return hole[1] === '*' ? '(.+)' : '([^.]+)';
    })
    .join('');
  const c = { re: new RegExp(`^${body}$`), holes };
  compiled.set(t, c);
  return c;
}

function rewrite(name: string, from: string, to: string): string | undefined {
  const { re, holes } = compileTemplate(from);
  const m = re.exec(name);
  if (!m) return undefined;
  return to.replace(/\{([a-z*]+)\}/g, (_, h: string) => m[1 + holes.indexOf(h)]);
}

function toLayout(legacy: string, layout: HfLayout): string {
  if (layout === 'legacy') return legacy;
  if (legacy.startsWith('visual.')) return `model.${legacy}`;
  if (legacy.startsWith('model.')) return `model.language_model.${legacy.slice(6)}`;
  return legacy;
}

function fromLayout(hf: string, layout: HfLayout): string | undefined {
  if (layout === 'legacy') return hf;
  if (hf.startsWith('model.visual.')) return hf.slice(6);
  if (hf.startsWith('model.language_model.')) return `model.${hf.slice(21)}`;
  return hf.startsWith('model.') || hf.startsWith('visual.') ? undefined : hf;
}

const FUSED = /^model\.layers\.\d+\.mlp\.experts\.(gate_up_proj|down_proj)$/;
const EXPERT = /^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$/;

/** Whether the family fuses a layer's experts into gate_up_proj and down_proj. */
const fusesExperts = (n: HfNaming) => n.family === 'qwen3_vl';

/**
 * The Hugging Face tensor that holds an lfc parameter (an expert's matrix: the fused tensor it is
 * a slice of, in families that fuse them).
 */
export function hfNameOf(lfc: string, n: HfNaming): string {
  const expert = EXPERT.exec(lfc);
  if (expert && fusesExperts(n)) {
    const fused = expert[3] === 'down_proj' ? 'down_proj' : 'gate_up_proj';
    return toLayout(`model.layers.${expert[1]}.mlp.experts.${fused}`, n.layout);
  }
  for (const [from, to] of RENAMES[n.family]) {
    const hit = rewrite(lfc, from, to);
    if (hit !== undefined) return toLayout(hit, n.layout);
  }
  return toLayout(lfc, n.layout);
}

/**
 * The lfc parameter a Hugging Face tensor is, or undefined when it is none (a fused expert
 * tensor holds several: see hfMap) or the name is not the family's.
 */
export function lfcNameOf(hf: string, n: HfNaming): string | undefined {
  const legacy = fromLayout(hf, n.layout);
  if (legacy === undefined || (fusesExperts(n) && FUSED.test(legacy))) return undefined;
  const candidates = [
    ...RENAMES[n.family].map(([from, to]) => rewrite(legacy, to, from)),
    legacy,
  ].filter((c): c is string => c !== undefined);
  return candidates.find((c) => !(EXPERT.test(c) && fusesExperts(n)) && hfNameOf(c, n) === hf);
}

/** An lfc parameter as it is inside a Hugging Face tensor. */
export interface LfcView {
  /** the Hugging Face tensor */
  readonly hf: string;
  /** element offset, in that tensor, of the parameter's element (0, …, 0) */
  readonly offset: number;
  /** per dim of the parameter: the stride, in elements of that tensor */
  readonly strides: readonly number[];
}

/** A Hugging Face tensor of the checkpoint and the lfc parameters whose elements it holds. */
export interface HfTensor {
  readonly name: string;
  readonly shape: readonly number[];
  readonly sources: readonly string[];
}

export interface HfMap {
  readonly naming: HfNaming;
  /** every tensor, in the order of the parameters (a fused tensor where its first expert is) */
  readonly tensors: readonly HfTensor[];
  readonly views: ReadonlyMap<string, LfcView>;
}

export interface ParamShape {
  readonly name: string;
  readonly shape: readonly number[];
}

const rowMajor = (shape: readonly number[]) =>
  shape.map((_, d) => shape.slice(d + 1).reduce((a, b) => a * b, 1));

/**
 * How a fused expert tensor orders its dims: `hub`, as the published checkpoints have them
 * (gate_up_proj [E, H, 2F], down_proj [E, F, H]); `transposed`, transformers v5's in-memory
 * layout (gate_up_proj [E, 2F, H], down_proj [E, H, F]), which some re-saved checkpoints carry.
 */
export type ExpertLayout = 'hub' | 'transposed';

/**
 * The checkpoint of these (whole) parameters under a naming: each tensor with its shape and
 * sources, each parameter's view. The patch weight takes its conv3d shape from the encoder.
 */
export function hfMap(
  params: readonly ParamShape[],
  model: ModelConfig['model'],
  naming: HfNaming = namingOf(model),
  experts: ExpertLayout = 'hub',
): HfMap {
  const tensors = new Map<string, { shape: number[]; sources: string[] }>();
  const views = new Map<string, LfcView>();
  const byName = new Map(params.map((p) => [p.name, p]));
  const expertsOf = new Map<string, number>();
  const e = model.image_encoder;
  for (const p of params) {
    const hf = hfNameOf(p.name, naming);
    const expert = EXPERT.exec(p.name);
    if (expert && fusesExperts(naming)) {
      const [, layer, index, kind] = expert;
      const E = expertsOf.get(layer) ?? countExperts(byName, layer);
      expertsOf.set(layer, E);
      const [out, inp] = p.shape;
      // gate/up [F, H] and down [H, F] of every expert share F and H
      const [F, H] = kind === 'down_proj' ? [inp, out] : [out, inp];
      const x = Number(index);
      const down = kind === 'down_proj';
      const up = kind === 'up_proj';
      // hub: down[e] is [F, H], (h, f) at f·H + h; gate_up[e] is [H, 2F], gate (f, h) at h·2F + f
      // transposed: down[e] is [H, F] and gate_up[e] [2F, H], row-major as lfc's matrices
      const view: LfcView =
        experts === 'hub'
          ? down
            ? { hf, offset: x * F * H, strides: [1, H] }
            : { hf, offset: x * H * 2 * F + (up ? F : 0), strides: [1, 2 * F] }
          : down
            ? { hf, offset: x * H * F, strides: [F, 1] }
            : { hf, offset: x * 2 * F * H + (up ? F * H : 0), strides: [H, 1] };
      views.set(p.name, view);
      const hub = down ? [E, F, H] : [E, H, 2 * F];
      const t = tensors.get(hf) ?? {
        shape: experts === 'hub' ? hub : [E, hub[2], hub[1]],
        sources: [],
      };
      t.sources.push(p.name);
      tensors.set(hf, t);
      continue;
    }
    const patchIn = e.in_channels * e.temporal_patch_size * e.patch_size ** 2;
    const shape =
      p.name === 'visual.patch_embed.proj.weight' && p.shape.length === 2 && p.shape[1] === patchIn
        ? [p.shape[0], e.in_channels, e.temporal_patch_size, e.patch_size, e.patch_size]
        : [...p.shape];
    if (tensors.has(hf)) throw new Error(`${p.name} and another parameter both map to ${hf}`);
    tensors.set(hf, { shape, sources: [p.name] });
    views.set(p.name, { hf, offset: 0, strides: rowMajor(p.shape) });
  }
  return {
    naming,
    tensors: [...tensors].map(([name, t]) => ({ name, shape: t.shape, sources: t.sources })),
    views,
  };
}

/** A layer's experts: every index from 0 up, each with gate, up and down. */
function countExperts(byName: ReadonlyMap<string, ParamShape>, layer: string): number {
  let n = 0;
  while (byName.has(`model.layers.${layer}.mlp.experts.${n}.gate_proj.weight`)) n++;
  for (let x = 0; x < n; x++)
    for (const k of ['up_proj', 'down_proj'])
      if (!byName.has(`model.layers.${layer}.mlp.experts.${x}.${k}.weight`))
        throw new Error(`layer ${layer}: expert ${x} has no ${k}`);
  return n;
}

/** Which part of the model an lfc parameter is, for --load-hf-encoder / --load-hf-decoder. */
export type ModelPart = 'encoder' | 'projector' | 'decoder';

export function partOf(lfc: string): ModelPart {
  if (lfc.startsWith('visual.merger.') || lfc.startsWith('visual.deepstack_merger_list.'))
    return 'projector';
  return lfc.startsWith('visual.') ? 'encoder' : 'decoder';
}
