// Checkpoints: a directory per saved step, `<save>/iter_<step>/` with
//   model.safetensors      every parameter, whole tensors, checkpoint names
//   optimizer.safetensors  AdamW moments `exp_avg.<name>`, `exp_avg_sq.<name>` of trainable ones
//   state.json             format, version, model, step, seed, the data position, lr settings
// written into a temporary directory and renamed, then `<save>/latest` (the step) replaced
// atomically: a crash never leaves a torn checkpoint, and the previous one stays intact.
//
// Checkpoints hold whole tensors whatever the layout, so a run resumes under another one. A rank
// holds pieces of them: a shard of a parameter split over a group (tensor or expert parallelism,
// runtime/shard.ts), the parameters of its pipeline stage, and, with the distributed optimizer,
// one slice of each flat bucket of AdamW moments (ProgramFile.optimizerShards). Saving gathers
// each rank's share (rankShare) into whole tensors (assembleCheckpoint); loading cuts each rank's
// share out of them.

import { existsSync, mkdirSync, readFileSync, renameSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { makeDirs } from '../compiler/files.js';
import { UserError } from '../compiler/errors.js';
import type { PlanFile, PlanParam, ProgramFile } from '../compiler/plan/format.js';
import {
  readSafetensors,
  serializeSafetensors,
  writeFileAtomic,
  type Tensor,
} from './safetensors.js';
import { shapeProblem, type Shape } from './json-shape.js';
import { groupRanksOf, pieceOf } from './shard.js';
import type { RankState } from './state.js';

export const CHECKPOINT_FORMAT = 'lfc-checkpoint';
export const CHECKPOINT_VERSION = 1;

export interface CheckpointState {
  readonly format: typeof CHECKPOINT_FORMAT;
  readonly version: number;
  readonly model: string;
  /** the last completed step; training resumes at step + 1 */
  readonly step: number;
  readonly seed: number;
  /** the next step's index into the synthetic data stream */
  readonly dataStep: number;
  /**
   * a run on datasets (--data-path): the data position of the next step's first sample, a global
   * sample index no layout changes (runtime/data/sampler.ts), and the data it indexes
   */
  readonly data?: { readonly position: number; readonly sources: readonly string[] };
  readonly lr: Record<string, unknown>;
}

/** state.json's fields as loadCheckpoint's callers read them (runtime/json-shape.ts) */
const STATE_SHAPE: Shape = {
  version: 'integer',
  model: 'string',
  step: 'count',
  seed: 'integer',
  dataStep: 'count',
  data: { optional: { position: 'count', sources: { list: 'string' } } },
  lr: 'object',
};

export type CheckpointMeta = Omit<CheckpointState, 'format' | 'version'>;

export function iterDir(save: string, step: number): string {
  return join(save, `iter_${String(step).padStart(7, '0')}`);
}

/** A program parameter as a piece of a whole tensor. */
export interface HeldPiece {
  /** the program's parameter name */
  readonly param: string;
  /** the whole tensor's checkpoint name and shape */
  readonly name: string;
  readonly shape: readonly number[];
  /** per dim, the global index of each local index */
  readonly index: readonly (readonly number[])[];
}

const range = (start: number, length: number) => Array.from({ length }, (_, i) => start + i);
const numel = (shape: readonly number[]) => shape.reduce((a, b) => a * b, 1);

/** The pieces of whole tensors the program of `rank` holds, in the program's parameter order. */
export function heldPieces(plan: PlanFile, program: ProgramFile, rank: number): HeldPiece[] {
  const groupRank = groupRanksOf(plan, rank);
  const byName = new Map(plan.params.map((p) => [p.name, p]));
  return program.params.map((q) => {
    if (q.dist) return { param: q.name, ...pieceOf(q.dist, groupRank) };
    const whole = byName.get(q.name);
    if (!whole) throw new Error(`program ${program.id}: parameter ${q.name} is not in plan.json`);
    return {
      param: q.name,
      name: q.name,
      shape: whole.shape,
      index: q.shard.map(([start, length]) => range(start, length)),
    };
  });
}

/**
 * Where a piece lies in its whole tensor: runs of elements contiguous in both, in the piece's
 * row-major order. A piece split along any dims is a few runs per row (one for a whole row), so
 * checkpoints copy runs, not elements.
 */
export class PieceRuns {
  /** [run] its first element in the piece, in the whole, and its length */
  private constructor(
    private readonly local: Float64Array,
    private readonly global: Float64Array,
    private readonly length: Float64Array,
    /** the piece's elements */
    readonly elements: number,
  ) {}

  static of(piece: HeldPiece): PieceRuns {
    const D = piece.shape.length;
    if (D === 0)
      return new PieceRuns(Float64Array.of(0), Float64Array.of(0), Float64Array.of(1), 1);
    // the last dim's global indices as contiguous segments
    const last = piece.index[D - 1];
    const segments: [number, number, number][] = []; // [local, global, length]
    last.forEach((g, j) => {
      const s = segments[segments.length - 1];
      if (s && s[1] + s[2] === g) s[2]++;
      else segments.push([j, g, 1]);
    });
    // the whole's flat offset of each row (every leading index), row-major over the piece
    let rows = [0];
    let stride = piece.shape[D - 1];
    for (let d = D - 2; d >= 0; d--) {
      const next: number[] = [];
      for (const g of piece.index[d]) for (const o of rows) next.push(g * stride + o);
      rows = next;
      stride *= piece.shape[d];
    }
    const local: number[] = [];
    const global: number[] = [];
    const length: number[] = [];
    rows.forEach((row, r) => {
      for (const [j, g, n] of segments) {
        const k = length.length - 1;
        const l0 = r * last.length + j;
        if (k >= 0 && local[k] + length[k] === l0 && global[k] + length[k] === row + g)
          length[k] += n;
        else {
          local.push(l0);
          global.push(row + g);
          length.push(n);
        }
      }
    });
    const elements = rows.length * last.length;
    return new PieceRuns(
      Float64Array.from(local),
      Float64Array.from(global),
      Float64Array.from(length),
      elements,
    );
  }

  /** Writes the piece's elements [from, from + values.length) into the whole, marking them. */
  scatter(whole: Float32Array, covered: Uint8Array, values: Float32Array, from = 0): void {
    const to = from + values.length;
    for (let k = 0; k < this.length.length; k++) {
      const a = Math.max(from, this.local[k]);
      const b = Math.min(to, this.local[k] + this.length[k]);
      if (a >= b) continue;
      const g = this.global[k] + (a - this.local[k]);
      whole.set(values.subarray(a - from, b - from), g);
      covered.fill(1, g, g + (b - a));
    }
  }

  /** The piece's elements [from, from + n) read from the whole. */
  gather(whole: Float32Array, from = 0, n = this.elements): Float32Array {
    const out = new Float32Array(n);
    const to = from + n;
    for (let k = 0; k < this.length.length; k++) {
      const a = Math.max(from, this.local[k]);
      const b = Math.min(to, this.local[k] + this.length[k]);
      if (a >= b) continue;
      const g = this.global[k] + (a - this.local[k]);
      out.set(whole.subarray(g, g + (b - a)), a - from);
    }
    return out;
  }
}

/** One flat bucket slice of the distributed optimizer's moments on a rank. */
interface BucketSlice {
  readonly key: string;
  /** [lo, hi) of the bucket's elements this rank holds */
  readonly lo: number;
  readonly hi: number;
  readonly params: readonly {
    readonly name: string;
    readonly offset: number;
    readonly elements: number;
  }[];
  readonly expAvg: number;
  readonly expAvgSq: number;
  /** mixed precision: this rank's slice of the bucket's fp32 master weights */
  readonly master?: number;
}

function bucketSlices(plan: PlanFile, program: ProgramFile, rank: number): BucketSlice[] {
  const groupRank = groupRanksOf(plan, rank);
  return (program.optimizerShards ?? []).map((s, k) => {
    const length = s.elements / s.parts;
    const lo = groupRank(s.group) * length;
    return {
      key: `shard${k}`,
      lo,
      hi: lo + length,
      params: s.params,
      expAvg: s.expAvg,
      expAvgSq: s.expAvgSq,
      ...(s.master !== undefined ? { master: s.master } : {}),
    };
  });
}

/**
 * A rank's share of a checkpoint, by key: `param.<p>` for each program parameter p (its fp32
 * master weights where it has them), `exp_avg.<p>` and `exp_avg_sq.<p>` where p has its own
 * moments, and `shard<k>.exp_avg` / `shard<k>.exp_avg_sq` (and under mixed precision
 * `shard<k>.param`, the fp32 master slice), this rank's slice of optimizer bucket k.
 */
export function rankShare(state: RankState, program: ProgramFile): Map<string, Tensor> {
  const share = new Map<string, Tensor>();
  const f32 = (data: Float32Array, shape: readonly number[]): Tensor => ({
    dtype: 'F32',
    shape: [...shape],
    data: data.slice(),
  });
  for (const name of state.names()) {
    const shape = state.shape(name);
    share.set(`param.${name}`, f32(state.read(name, 'param'), shape));
    if (state.has(name, 'expAvg')) {
      share.set(`exp_avg.${name}`, f32(state.read(name, 'expAvg'), shape));
      share.set(`exp_avg_sq.${name}`, f32(state.read(name, 'expAvgSq'), shape));
    }
  }
  (program.optimizerShards ?? []).forEach((s, k) => {
    const length = s.elements / s.parts;
    share.set(`shard${k}.exp_avg`, f32(state.buffer(s.expAvg).subarray(0, length), [length]));
    share.set(`shard${k}.exp_avg_sq`, f32(state.buffer(s.expAvgSq).subarray(0, length), [length]));
    if (s.master !== undefined)
      share.set(`shard${k}.param`, f32(state.buffer(s.master).subarray(0, length), [length]));
  });
  return share;
}

export interface WholeTensors {
  readonly model: Map<string, Tensor>;
  readonly optim: Map<string, Tensor>;
}

/**
 * Per-parameter state a rank's share holds: `<kind>.<p>`, the piece of program parameter p, and
 * `shard<k>.<kind>`, this rank's slice of optimizer bucket k (rankShare, runtime/dump.ts).
 */
export type ShareKind = 'param' | 'grad' | 'exp_avg' | 'exp_avg_sq';

/**
 * Whole tensors of each kind, by checkpoint name, from every rank's share (`shareOf(rank)`;
 * replicas give the same values): a piece goes where its parameter's dist or shard puts it, a
 * bucket slice to the parameters it covers. Every element of every parameter `wanted` for a kind
 * must come from some rank; pieces of parameters not wanted are ignored.
 */
export function assembleWhole(
  plan: PlanFile,
  programs: ReadonlyMap<string, ProgramFile>,
  shareOf: (rank: number) => ReadonlyMap<string, Tensor>,
  kinds: readonly ShareKind[],
  wanted: (kind: ShareKind, p: PlanParam) => boolean,
): Map<ShareKind, Map<string, Tensor>> {
  interface Whole {
    readonly data: Float32Array;
    readonly covered: Uint8Array;
  }
  const wholes = new Map(
    kinds.map((kind) => [
      kind,
      new Map<string, Whole>(
        plan.params
          .filter((p) => wanted(kind, p))
          .map((p) => [
            p.name,
            { data: new Float32Array(numel(p.shape)), covered: new Uint8Array(numel(p.shape)) },
          ]),
      ),
    ]),
  );
  const put = (w: Whole | undefined, runs: PieceRuns, values: Float32Array, from = 0) => {
    if (w) runs.scatter(w.data, w.covered, values, from);
  };
  // pieces first, then bucket slices, over all ranks: a slice of fp32 master weights wins over
  // the rounded bf16 parameter another rank's piece holds
  const ranks = plan.rankPrograms.map((id, rank) => {
    const program = programs.get(id)!;
    const pieces = heldPieces(plan, program, rank);
    return {
      id,
      rank,
      program,
      share: shareOf(rank),
      pieces,
      runsOf: new Map(pieces.map((p) => [p.param, PieceRuns.of(p)])),
      wholeOf: new Map(pieces.map((p) => [p.param, p.name])),
    };
  });
  for (const { share, pieces, runsOf } of ranks)
    for (const [kind, whole] of wholes)
      for (const p of pieces) {
        const t = share.get(`${kind}.${p.param}`);
        if (t) put(whole.get(p.name), runsOf.get(p.param)!, t.data as Float32Array);
      }
  for (const { id, rank, program, share, runsOf, wholeOf } of ranks) {
    for (const [kind, whole] of wholes) {
      for (const s of bucketSlices(plan, program, rank)) {
        const t = share.get(`${s.key}.${kind}`);
        if (!t) continue;
        const slice = t.data as Float32Array;
        for (const bp of s.params) {
          const start = Math.max(s.lo, bp.offset);
          const end = Math.min(s.hi, bp.offset + bp.elements);
          if (start >= end) continue;
          const name = wholeOf.get(bp.name);
          if (name === undefined)
            throw new Error(
              `program ${id}: optimizer bucket ${s.key} holds ${bp.name}, not a parameter of it`,
            );
          const at = runsOf.get(bp.name)!;
          put(whole.get(name), at, slice.subarray(start - s.lo, end - s.lo), start - bp.offset);
        }
      }
    }
  }
  const out = new Map<ShareKind, Map<string, Tensor>>();
  for (const [kind, whole] of wholes) {
    const tensors = new Map<string, Tensor>();
    for (const p of plan.params) {
      const w = whole.get(p.name);
      if (!w) continue;
      if (w.covered.indexOf(0) >= 0) {
        let missing = 0;
        for (const c of w.covered) missing += 1 - c;
        const what = kind === 'param' ? `parameter ${p.name}` : `${kind}.${p.name}`;
        throw new Error(`${missing} elements of ${what} are held by no rank of the plan`);
      }
      tensors.set(p.name, { dtype: 'F32', shape: [...p.shape], data: w.data });
    }
    out.set(kind, tensors);
  }
  return out;
}

/** A checkpoint's whole tensors from every rank's share (rankShare). */
export function assembleCheckpoint(
  plan: PlanFile,
  programs: ReadonlyMap<string, ProgramFile>,
  shareOf: (rank: number) => ReadonlyMap<string, Tensor>,
): WholeTensors {
  const whole = assembleWhole(
    plan,
    programs,
    shareOf,
    ['param', 'exp_avg', 'exp_avg_sq'],
    (kind, p) => kind === 'param' || p.trainable,
  );
  const optim = new Map<string, Tensor>();
  for (const p of plan.params) {
    if (!p.trainable) continue;
    for (const kind of ['exp_avg', 'exp_avg_sq'] as const)
      optim.set(`${kind}.${p.name}`, whole.get(kind)!.get(p.name)!);
  }
  return { model: whole.get('param')!, optim };
}

/** Writes a checkpoint of whole tensors atomically; returns its directory. */
export function writeCheckpoint(save: string, whole: WholeTensors, meta: CheckpointMeta): string {
  makeDirs(save);
  const final = iterDir(save, meta.step);
  const tmp = `${final}.tmp-${process.pid}`;
  rmSync(tmp, { recursive: true, force: true });
  mkdirSync(tmp);
  writeFileAtomic(join(tmp, 'model.safetensors'), serialize(whole.model, meta.model));
  writeFileAtomic(join(tmp, 'optimizer.safetensors'), serialize(whole.optim, meta.model));
  writeFileAtomic(
    join(tmp, 'state.json'),
    JSON.stringify({ format: CHECKPOINT_FORMAT, version: CHECKPOINT_VERSION, ...meta }, null, 1),
  );
  rmSync(final, { recursive: true, force: true });
  renameSync(tmp, final);
  writeFileAtomic(join(save, 'latest'), `${meta.step}\n`);
  return final;
}

/** A one-rank plan's checkpoint, from its runtime's state. */
export function saveCheckpoint(
  save: string,
  plan: PlanFile,
  program: ProgramFile,
  state: RankState,
  meta: CheckpointMeta,
): string {
  const share = rankShare(state, program);
  const whole = assembleCheckpoint(plan, new Map([[program.id, program]]), () => share);
  return writeCheckpoint(save, whole, meta);
}

function serialize(t: Map<string, Tensor>, model: string): Buffer {
  return serializeSafetensors(t, { format: CHECKPOINT_FORMAT, model });
}

/** The checkpoint directory `--load` names: an iter_ directory, or a save directory with `latest`. */
export function resolveCheckpoint(load: string): string {
  if (existsSync(join(load, 'state.json'))) return load;
  const latest = join(load, 'latest');
  if (!existsSync(latest))
    throw new UserError(`${load}: not a checkpoint (no state.json, no latest)`);
  const step = Number(readFileSync(latest, 'utf8').trim());
  if (!Number.isInteger(step) || step < 0)
    throw new UserError(`${latest}: malformed (want a step number)`);
  return iterDir(load, step);
}

/**
 * Loads this rank's share of a checkpoint into the runtime's state after checking it fits the
 * plan: the same parameter names and whole shapes. Nothing is written to the runtime before every
 * check passed.
 */
export function loadCheckpoint(
  load: string,
  state: RankState,
  plan: PlanFile,
  program: ProgramFile,
  rank: number,
): CheckpointState {
  const dir = resolveCheckpoint(load);
  const statePath = join(dir, 'state.json');
  let meta: CheckpointState;
  try {
    meta = JSON.parse(readFileSync(statePath, 'utf8')) as CheckpointState;
  } catch (e) {
    throw new UserError(
      `${statePath}: unreadable checkpoint state: ${(e as Error).message.split('\n')[0]}`,
    );
  }
  if (meta?.format !== CHECKPOINT_FORMAT)
    throw new UserError(`${statePath}: not an lfc checkpoint`);
  const problem = shapeProblem(meta, STATE_SHAPE);
  if (problem) throw new UserError(`${statePath}: malformed checkpoint state: ${problem}`);
  if (meta.version !== CHECKPOINT_VERSION) {
    throw new UserError(
      `${statePath}: checkpoint version ${meta.version}; this lfc reads version ${CHECKPOINT_VERSION}`,
    );
  }
  if (meta.model !== plan.model.name)
    throw new UserError(`${dir}: a checkpoint of model ${meta.model}, not ${plan.model.name}`);
  // read only: each piece is cut from them (a copy)
  const weights = readSafetensors(join(dir, 'model.safetensors'), true).tensors;
  const optim = readSafetensors(join(dir, 'optimizer.safetensors'), true).tensors;
  const hint = ' (a checkpoint of another model?)';
  const whole = (t: Map<string, Tensor>, key: string, shape: readonly number[], what: string) =>
    fitting(t.get(key), shape, dir, what, hint).data as Float32Array;
  const writes: (() => void)[] = [];
  const pieces = heldPieces(plan, program, rank);
  const runsOf = new Map(pieces.map((p) => [p.param, PieceRuns.of(p)]));
  const wholeOf = new Map(pieces.map((p) => [p.param, p]));
  for (const p of pieces) {
    const at = runsOf.get(p.param)!;
    const values = at.gather(whole(weights, p.name, p.shape, `parameter ${p.name}`));
    writes.push(() => state.write(p.param, 'param', values));
    if (state.has(p.param, 'expAvg')) {
      for (const [kind, key] of [
        ['expAvg', 'exp_avg'],
        ['expAvgSq', 'exp_avg_sq'],
      ] as const) {
        const src = whole(optim, `${key}.${p.name}`, p.shape, `optimizer state ${key}.${p.name}`);
        const moment = at.gather(src);
        writes.push(() => state.write(p.param, kind, moment));
      }
    }
  }
  for (const s of bucketSlices(plan, program, rank)) {
    // the moments from the optimizer file; the fp32 master slice from the (fp32) weights
    const parts = [
      [s.expAvg, optim, 'exp_avg.'],
      [s.expAvgSq, optim, 'exp_avg_sq.'],
      ...(s.master !== undefined ? [[s.master, weights, ''] as const] : []),
    ] as const;
    for (const [buffer, file, prefix] of parts) {
      const slice = new Float32Array(s.hi - s.lo);
      for (const bp of s.params) {
        const start = Math.max(s.lo, bp.offset);
        const end = Math.min(s.hi, bp.offset + bp.elements);
        if (start >= end) continue;
        const p = wholeOf.get(bp.name)!;
        const what = prefix ? `optimizer state ${prefix}${p.name}` : `parameter ${p.name}`;
        const src = whole(file, `${prefix}${p.name}`, p.shape, what);
        const at = runsOf.get(bp.name)!;
        slice.set(at.gather(src, start - bp.offset, end - start), start - s.lo);
      }
      writes.push(() => state.buffer(buffer).set(slice));
    }
  }
  const known = new Set(plan.params.map((p) => p.name));
  const extra = [...weights.keys()].filter((n) => !known.has(n));
  if (extra.length)
    throw new UserError(
      `${dir}: holds parameters this model lacks: ${extra.slice(0, 3).join(', ')}${extra.length > 3 ? ', …' : ''}`,
    );
  for (const write of writes) write();
  return meta;
}

/** Loads only weights (the `--weights FILE` of a replayed step), checked the same way. */
export function loadWeights(path: string, state: RankState): void {
  const tensors = readSafetensors(path).tensors;
  const plans = state.names().map((name) => {
    const t = fitting(tensors.get(name), state.shape(name), path, `parameter ${name}`);
    return [name, t.data as Float32Array] as const;
  });
  for (const [name, values] of plans) state.write(name, 'param', values);
}

/** The tensor, if it is F32 of the wanted shape; otherwise a UserError naming file and tensor. */
function fitting(
  t: Tensor | undefined,
  want: readonly number[],
  where: string,
  what: string,
  hint = '',
): Tensor {
  if (!t) throw new UserError(`${where}: ${what} is missing${hint}`);
  if (t.dtype !== 'F32' || t.shape.join() !== want.join()) {
    throw new UserError(
      `${where}: ${what} is ${t.dtype}[${t.shape.join(', ')}], this plan wants F32[${want.join(', ')}]`,
    );
  }
  return t;
}
