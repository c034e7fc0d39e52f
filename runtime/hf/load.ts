// Loading a Hugging Face checkpoint into a rank: `lfc run --load-hf DIR` (every parameter),
// `--load-hf-encoder DIR` (the vision tower: patch embedding, position table, blocks; and the
// merger and deepstack mergers when DIR has them), `--load-hf-decoder DIR` (embeddings, layers,
// final norm, lm_head). A parameter no source loads keeps its seeded init.
//
// Each rank reads only the pieces it holds (runtime/checkpoint.ts heldPieces: tensor-parallel
// rows or columns, vocabulary-parallel embedding rows, its experts), each with positioned reads of
// just those elements (reader.ts). Before the first write, every tensor every source loads is
// checked on every rank alike: present, of a dtype lfc converts, of the model's shape; config.json
// (when there) of an architecture of the model's family. A failure is one line naming the file and
// the tensor; nothing has been written.

import { UserError } from '../../compiler/errors.js';
import type { ModelConfig } from '../../compiler/frontend/config.js';
import {
  architectureOfJson,
  HF_ARCHITECTURES,
  readHfConfigJson,
} from '../../compiler/frontend/hf-config.js';
import type { PlanFile, PlanParam, ProgramFile } from '../../compiler/plan/format.js';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { heldPieces, type HeldPiece } from '../checkpoint.js';
import type { RankState } from '../state.js';
import {
  hfMap,
  hfNameOf,
  lfcNameOf,
  namingOf,
  partOf,
  type HfLayout,
  type HfMap,
  type LfcView,
  type ModelPart,
} from './names.js';
import { HfCheckpointDir, type PieceBuffer } from './reader.js';

export type HfPart = 'all' | 'encoder' | 'decoder';

/** A directory to load and the part of the model it gives. */
export interface HfSource {
  readonly dir: string;
  readonly part: HfPart;
}

/** The flag each part comes from, for messages. */
export const HF_FLAGS: Record<HfPart, string> = {
  all: '--load-hf',
  encoder: '--load-hf-encoder',
  decoder: '--load-hf-decoder',
};

/** One piece to read: a program parameter, the whole parameter it is a piece of, its view. */
export interface HfPieceRead {
  readonly param: string;
  readonly name: string;
  /** the piece's shape and, per dim, the global indices it holds */
  readonly shape: readonly number[];
  readonly index: readonly (readonly number[])[];
  readonly dir: HfCheckpointDir;
  readonly view: LfcView;
}

/** A tied embedding's check: the rank's piece of lm_head must equal its piece of embed_tokens. */
interface TieCheck {
  readonly read: HfPieceRead;
  readonly lmHead: LfcView;
}

export interface HfLoadPlan {
  readonly reads: readonly HfPieceRead[];
  readonly ties: readonly TieCheck[];
  /** whole parameters by where they come from: a source's directory, or the init */
  readonly loaded: ReadonlyMap<string, string>;
  readonly kept: readonly string[];
  readonly dirs: readonly HfCheckpointDir[];
}

const numel = (shape: readonly number[]) => shape.reduce((a, b) => a * b, 1);

/** Each part's sources may not overlap: --load-hf alone, or the encoder and decoder apart. */
export function checkSources(sources: readonly HfSource[]): void {
  const parts = sources.map((s) => s.part);
  for (const p of ['all', 'encoder', 'decoder'] as const)
    if (parts.filter((x) => x === p).length > 1)
      throw new UserError(`${HF_FLAGS[p]} is given twice; give it once`);
  if (parts.includes('all') && parts.length > 1)
    throw new UserError(
      `--load-hf loads every parameter; drop ${sources
        .filter((s) => s.part !== 'all')
        .map((s) => HF_FLAGS[s.part])
        .join(' and ')}, or load the parts with --load-hf-encoder and --load-hf-decoder`,
    );
}

/** The parts of the model a source loads: required, and (the projector with the encoder) if there. */
function partsOf(part: HfPart): { required: ModelPart[]; optional: ModelPart[] } {
  if (part === 'all') return { required: ['encoder', 'projector', 'decoder'], optional: [] };
  if (part === 'encoder') return { required: ['encoder'], optional: ['projector'] };
  return { required: ['decoder'], optional: [] };
}

/**
 * What a rank reads from the sources for its pieces, after checking every tensor the sources
 * load (on every rank alike, before anything is read). `model` is the plan's model config.
 */
export function planHfLoad(
  sources: readonly HfSource[],
  modelName: string,
  model: ModelConfig['model'],
  params: readonly Pick<PlanParam, 'name' | 'shape'>[],
  pieces: readonly HeldPiece[],
): HfLoadPlan {
  checkSources(sources);
  const loaded = new Map<string, string>();
  const reads: HfPieceRead[] = [];
  const ties: TieCheck[] = [];
  const dirs: HfCheckpointDir[] = [];
  try {
    for (const source of sources) {
      const dir = HfCheckpointDir.open(source.dir);
      dirs.push(dir);
      const map = mapOfDir(dir, source, modelName, model, params);
      const { required, optional } = partsOf(source.part);
      const present = optional.filter((part) =>
        params.some((p) => partOf(p.name) === part && dir.tensors.has(map.views.get(p.name)!.hf)),
      );
      const parts = new Set([...required, ...present]);
      const views = checkedViews(dir, map, source, params, parts);
      checkExtra(dir, map, params, parts, source);
      for (const p of params) if (views.has(p.name)) loaded.set(p.name, source.dir);
      for (const piece of pieces) {
        const view = views.get(piece.name);
        if (!view) continue;
        const read = {
          param: piece.param,
          name: piece.name,
          shape: piece.index.map((l) => l.length),
          index: piece.index,
          dir,
          view,
        };
        reads.push(read);
        const lmHead = tiedHead(dir, map, params, piece.name);
        if (lmHead) ties.push({ read, lmHead });
      }
    }
  } catch (e) {
    for (const d of dirs) d.close();
    throw e;
  }
  const kept = params.map((p) => p.name).filter((n) => !loaded.has(n));
  return { reads, ties, loaded, kept, dirs };
}

/**
 * The names of a directory: the model's family, in the layout the directory has (Qwen2.5-VL
 * re-saved by recent transformers is nested), after checking config.json's architecture.
 */
function mapOfDir(
  dir: HfCheckpointDir,
  source: HfSource,
  modelName: string,
  model: ModelConfig['model'],
  params: readonly Pick<PlanParam, 'name' | 'shape'>[],
): HfMap {
  const naming = namingOf(model);
  if (existsSync(join(source.dir, 'config.json'))) {
    const { path, json } = readHfConfigJson(join(source.dir, 'config.json'));
    const arch = architectureOfJson(json, path);
    if (HF_ARCHITECTURES[arch].family !== naming.family)
      throw new UserError(
        `${path}: a ${arch} checkpoint (${HF_ARCHITECTURES[arch].family} names), but ${modelName} has ${naming.family} names`,
      );
  }
  const names = [...dir.tensors.keys()];
  const nested = names.some(
    (n) => n.startsWith('model.language_model.') || n.startsWith('model.visual.'),
  );
  const legacy = names.some(
    (n) =>
      n.startsWith('visual.') ||
      n.startsWith('model.layers.') ||
      n.startsWith('model.embed_tokens.'),
  );
  const layout: HfLayout = nested === legacy ? naming.layout : nested ? 'nested' : 'legacy';
  const hub = hfMap(params, model, { ...naming, layout });
  // fused experts as transformers v5 holds them in memory, when the directory has them so
  const fused = hub.tensors.find((t) => t.sources.length > 1 && dir.tensors.has(t.name));
  const [E, a, b] = fused?.shape ?? [];
  const shape = fused && dir.tensors.get(fused.name)!.shape;
  return shape && a !== b && shape.join() === [E, b, a].join()
    ? hfMap(params, model, { ...naming, layout }, 'transposed')
    : hub;
}

/**
 * Every parameter of the parts a source loads, with its view, after checking its tensor: present,
 * readable, of the shape the model wants. An untied lm_head the directory lacks comes from the
 * embedding when its config.json says the two are tied.
 */
function checkedViews(
  dir: HfCheckpointDir,
  map: HfMap,
  source: HfSource,
  params: readonly Pick<PlanParam, 'name' | 'shape'>[],
  parts: ReadonlySet<ModelPart>,
): Map<string, LfcView> {
  const shapes = new Map(map.tensors.map((t) => [t.name, t.shape]));
  const views = new Map<string, LfcView>();
  for (const p of params) {
    if (!parts.has(partOf(p.name))) continue;
    let view = map.views.get(p.name)!;
    if (p.name === 'lm_head.weight' && !dir.tensors.has(view.hf) && tiedInConfig(source.dir)) {
      view = { ...map.views.get('model.embed_tokens.weight')!, strides: view.strides };
    }
    const what = `lfc parameter ${p.name}, from ${HF_FLAGS[source.part]} ${source.dir}`;
    const shape = view.hf === map.views.get(p.name)!.hf ? shapes.get(view.hf)! : p.shape;
    dir.entry(view.hf, shape, what);
    views.set(p.name, view);
  }
  return views;
}

function tiedInConfig(dir: string): boolean {
  const path = join(dir, 'config.json');
  if (!existsSync(path)) return false;
  const { json } = readHfConfigJson(path);
  const text = (json.text_config ?? {}) as Record<string, unknown>;
  return (json.tie_word_embeddings ?? text.tie_word_embeddings) === true;
}

/**
 * A tied model (no lm_head parameter) given a directory that has lm_head: its view, to check the
 * rank's piece of the embedding against (a different lm_head is refused).
 */
function tiedHead(
  dir: HfCheckpointDir,
  map: HfMap,
  params: readonly Pick<PlanParam, 'name'>[],
  name: string,
): LfcView | undefined {
  if (name !== 'model.embed_tokens.weight' || params.some((p) => p.name === 'lm_head.weight'))
    return undefined;
  const embed = map.views.get(name)!;
  const hf = hfNameOf('lm_head.weight', map.naming);
  if (!dir.tensors.has(hf)) return undefined;
  dir.entry(
    hf,
    dir.tensors.get(embed.hf)!.shape,
    'lm_head, which this model ties to model.embed_tokens.weight',
  );
  return { ...embed, hf };
}

/**
 * A source must not hold tensors of the parts it loads that the model lacks (a checkpoint of a
 * bigger model, or another one); --load-hf, tensors of no part at all.
 */
function checkExtra(
  dir: HfCheckpointDir,
  map: HfMap,
  params: readonly Pick<PlanParam, 'name'>[],
  parts: ReadonlySet<ModelPart>,
  source: HfSource,
): void {
  const known = new Set(map.tensors.map((t) => t.name));
  const tied = !params.some((p) => p.name === 'lm_head.weight');
  const extra = [...dir.tensors.keys()].filter((hf) => {
    if (known.has(hf) || (tied && hf === 'lm_head.weight')) return false;
    const lfc = lfcNameOf(hf, map.naming);
    return lfc === undefined ? source.part === 'all' : parts.has(partOf(lfc));
  });
  if (extra.length)
    throw new UserError(
      `${dir.listing}: holds tensors this model lacks: ${extra.slice(0, 3).join(', ')}${extra.length > 3 ? `, … (${extra.length})` : ''} (a checkpoint of another model?)`,
    );
}

/**
 * Reads every piece of a load plan, after the tied-embedding checks, one at a time: into the
 * buffer `bufferOf(read)` gives (f32, or a bf16 plan's bits), then `done(read, buffer)`.
 */
export function readPieces<B extends PieceBuffer>(
  lp: HfLoadPlan,
  bufferOf: (r: HfPieceRead) => B,
  done: (r: HfPieceRead, buffer: B) => void = () => {},
): void {
  for (const t of lp.ties) {
    const n = numel(t.read.shape);
    const embed = new Float32Array(n);
    const head = new Float32Array(n);
    t.read.dir.readView(t.read.view, t.read.index, embed);
    t.read.dir.readView(t.lmHead, t.read.index, head);
    const a = new Uint32Array(embed.buffer);
    const b = new Uint32Array(head.buffer);
    const at = a.findIndex((x, i) => x !== b[i]);
    if (at >= 0)
      throw new UserError(
        `${t.read.dir.tensors.get('lm_head.weight')!.file}: tensor lm_head.weight differs from ${t.read.view.hf} (element ${at} of this rank's piece), but this model ties them (untie_embeddings_and_output_weights: false); compile it untied to load both`,
      );
  }
  for (const r of lp.reads) {
    const buffer = bufferOf(r);
    r.dir.readView(r.view, r.index, buffer);
    done(r, buffer);
  }
}

export function closeLoadPlan(lp: HfLoadPlan): void {
  for (const d of lp.dirs) d.close();
}

/**
 * What --load-hf (or its part flags) will load of a plan's model, for the run's first line:
 * parameters per directory and those that keep their init. Reads the directories' headers only.
 */
export function describeHfLoad(sources: readonly HfSource[], plan: PlanFile): string {
  const lp = planHfLoad(
    sources,
    plan.model.name,
    plan.model.config as ModelConfig['model'],
    plan.params,
    [],
  );
  closeLoadPlan(lp);
  const from = sources.map((s) => {
    const n = [...lp.loaded.values()].filter((d) => d === s.dir).length;
    return `${HF_FLAGS[s.part]} ${s.dir}: ${n} parameter${n === 1 ? '' : 's'}`;
  });
  const kept = lp.kept.length
    ? `; ${lp.kept.length} keep their init (${lp.kept.slice(0, 3).join(', ')}${lp.kept.length > 3 ? ', …' : ''})`
    : '';
  return `${from.join('; ')}${kept}`;
}

export interface HfLoadSummary {
  readonly loaded: number;
  readonly kept: number;
}

/**
 * Loads this rank's pieces from the sources into the runtime's state (a bf16 plan's parameters
 * rounded, its fp32 master weights exact), called after the initializer.
 */
export function loadHfWeights(
  sources: readonly HfSource[],
  state: RankState,
  plan: PlanFile,
  program: ProgramFile,
  rank: number,
): HfLoadSummary {
  const model = plan.model.config as ModelConfig['model'];
  const lp = planHfLoad(
    sources,
    plan.model.name,
    model,
    plan.params,
    heldPieces(plan, program, rank),
  );
  try {
    // one piece at a time: read as f32, then written (rounded where the parameter is bf16)
    readPieces(
      lp,
      (r) => new Float32Array(numel(r.shape)),
      (r, v) => state.write(r.param, 'param', v),
    );
  } finally {
    closeLoadPlan(lp);
  }
  return { loaded: lp.loaded.size, kept: lp.kept.length };
}
