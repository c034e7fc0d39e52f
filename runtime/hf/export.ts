// An lfc checkpoint as a Hugging Face model directory (lfc export-hf): config.json (the model's
// Hugging Face config, compiler/frontend/hf-config.ts), the tensors in the model's name family
// (names.ts) in safetensors shards of at most --max-shard-size, and model.safetensors.index.json
// (one shard: model.safetensors alone, as transformers writes it).
//
// Streamed: the checkpoint's model.safetensors is read with positioned reads, and each Hugging Face
// tensor is written in slabs — a chunk of rows of a renamed tensor, one expert of a fused one — so
// memory stays at one slab whatever the model's size. Written into a temporary directory beside
// the target and renamed: a failure leaves no partial directory, and an existing target is refused.

import {
  closeSync,
  existsSync,
  openSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
} from 'node:fs';
import { basename, dirname, join } from 'node:path';
import { makeDirs } from '../../compiler/files.js';
import { UserError } from '../../compiler/errors.js';
import type { ModelConfig } from '../../compiler/frontend/config.js';
import { hfConfigOf } from '../../compiler/frontend/hf-config.js';
import { f32ToBf16 } from '../bf16.js';
import { CHECKPOINT_FORMAT, resolveCheckpoint, type CheckpointState } from '../checkpoint.js';
import {
  readRange,
  readSafetensorsHeader,
  SafetensorsWriter,
  writeFileAtomic,
  type HeaderEntry,
  type SafeDType,
} from '../safetensors.js';
import { hfMap, type HfMap, type HfTensor, type ParamShape } from './names.js';
import { INDEX_FILE, SINGLE_FILE } from './reader.js';

export interface ExportOptions {
  /** the directory to write (must not exist, or be empty) */
  readonly out: string;
  /** an lfc checkpoint: an iter_ directory, or a save directory with `latest` */
  readonly checkpoint: string;
  /** the model the checkpoint is of: its name (checked against the checkpoint's) and config */
  readonly modelName: string;
  readonly model: ModelConfig['model'];
  /** the parameters, whole (the plan's, or the forward graph's) */
  readonly params: readonly ParamShape[];
  readonly dtype: 'BF16' | 'F32';
  readonly maxShardBytes: number;
}

export interface ExportResult {
  readonly files: readonly string[];
  readonly tensors: number;
  readonly bytes: number;
  /** what of the model config.json cannot say (hf-config.ts inexactFeatures) */
  readonly inexact: readonly string[];
}

/** 5 GB, transformers' save_pretrained default */
export const DEFAULT_MAX_SHARD_BYTES = 5e9;

/** elements of a slab of a renamed tensor */
const SLAB_ELEMENTS = 4 << 20;

const numel = (shape: readonly number[]) => shape.reduce((a, b) => a * b, 1);

export function exportHf(o: ExportOptions): ExportResult {
  const dir = resolveCheckpoint(o.checkpoint);
  checkCheckpointModel(dir, o.modelName);
  const weights = join(dir, 'model.safetensors');
  const header = readSafetensorsHeader(weights);
  checkWeights(header.entries, o.params, weights);
  checkTarget(o.out);
  const map = hfMap(o.params, o.model);
  const shards = assignShards(map.tensors, o.dtype, o.maxShardBytes);
  const { json, inexact } = hfConfigOf(o.model, o.dtype === 'BF16' ? 'bfloat16' : 'float32');
  const tmp = join(dirname(o.out), `.${basename(o.out)}.tmp-${process.pid}`);
  rmSync(tmp, { recursive: true, force: true });
  makeDirs(tmp);
  const fd = openSync(weights, 'r');
  try {
    writeFileAtomic(join(tmp, 'config.json'), JSON.stringify(json, null, 2) + '\n');
    const files =
      shards.length === 1 ? [SINGLE_FILE] : shards.map((_, i) => shardName(i, shards.length));
    const byName = new Map(o.params.map((p) => [p.name, p]));
    shards.forEach((tensors, i) => {
      const w = new SafetensorsWriter(
        join(tmp, files[i]),
        tensors.map((t) => ({ name: t.name, dtype: o.dtype, shape: t.shape })),
        { format: 'pt' },
      );
      try {
        for (const t of tensors)
          writeTensor(
            t,
            map,
            o.dtype,
            byName,
            (name) => header.entries.get(name)!,
            fd,
            weights,
            (chunk) => w.write(t.name, chunk),
          );
        w.close();
      } catch (e) {
        w.abandon();
        throw e;
      }
    });
    const bytesOf = (t: HfTensor) => numel(t.shape) * (o.dtype === 'BF16' ? 2 : 4);
    const total = map.tensors.reduce((a, t) => a + bytesOf(t), 0);
    if (shards.length > 1) {
      const weightMap: Record<string, string> = {};
      shards.forEach((tensors, i) => tensors.forEach((t) => (weightMap[t.name] = files[i])));
      writeFileAtomic(
        join(tmp, INDEX_FILE),
        JSON.stringify({ metadata: { total_size: total }, weight_map: weightMap }, null, 2) + '\n',
      );
    }
    closeSync(fd);
    if (existsSync(o.out)) rmSync(o.out, { recursive: true }); // empty: checkTarget
    renameSync(tmp, o.out);
    return {
      files: ['config.json', ...files, ...(shards.length > 1 ? [INDEX_FILE] : [])],
      tensors: map.tensors.length,
      bytes: total,
      inexact,
    };
  } catch (e) {
    try {
      closeSync(fd);
    } catch {
      // already closed
    }
    rmSync(tmp, { recursive: true, force: true });
    throw e;
  }
}

/** transformers' shard names: model-00001-of-00003.safetensors */
export function shardName(i: number, n: number): string {
  const pad = (k: number) => String(k).padStart(5, '0');
  return `model-${pad(i + 1)}-of-${pad(n)}.safetensors`;
}

function checkCheckpointModel(dir: string, modelName: string): void {
  const path = join(dir, 'state.json');
  let meta: CheckpointState;
  try {
    meta = JSON.parse(readFileSync(path, 'utf8')) as CheckpointState;
  } catch (e) {
    throw new UserError(
      `${path}: unreadable checkpoint state: ${(e as Error).message.split('\n')[0]}`,
    );
  }
  if (meta.format !== CHECKPOINT_FORMAT) throw new UserError(`${path}: not an lfc checkpoint`);
  if (meta.model !== modelName)
    throw new UserError(`${dir}: a checkpoint of model ${meta.model}, not ${modelName}`);
}

function checkWeights(
  entries: ReadonlyMap<string, HeaderEntry>,
  params: readonly ParamShape[],
  path: string,
): void {
  for (const p of params) {
    const e = entries.get(p.name);
    if (!e)
      throw new UserError(
        `${path}: parameter ${p.name} is missing (a checkpoint of another model?)`,
      );
    if (e.dtype !== 'F32' || e.shape.join() !== p.shape.join())
      throw new UserError(
        `${path}: parameter ${p.name} is ${e.dtype}[${e.shape.join(', ')}], this model wants F32[${p.shape.join(', ')}]`,
      );
  }
  const known = new Set(params.map((p) => p.name));
  const extra = [...entries.keys()].filter((n) => !known.has(n));
  if (extra.length)
    throw new UserError(
      `${path}: holds parameters this model lacks: ${extra.slice(0, 3).join(', ')}`,
    );
}

function checkTarget(out: string): void {
  if (existsSync(out) && readdirSync(out).length > 0)
    throw new UserError(`${out} exists and is not empty; export into a new directory`);
}

/** Tensors into shards in order, each shard at most `max` bytes (a larger tensor alone). */
export function assignShards(
  tensors: readonly HfTensor[],
  dtype: SafeDType,
  max: number,
): HfTensor[][] {
  const shards: HfTensor[][] = [[]];
  let bytes = 0;
  for (const t of tensors) {
    const n = numel(t.shape) * (dtype === 'BF16' ? 2 : 4);
    if (bytes > 0 && bytes + n > max) {
      shards.push([]);
      bytes = 0;
    }
    shards[shards.length - 1].push(t);
    bytes += n;
  }
  return shards;
}

/** a tensor that is one parameter, row-major (renamed, or reshaped: the patch weight) */
function isWhole(t: HfTensor, map: HfMap, params: ReadonlyMap<string, ParamShape>): boolean {
  if (t.sources.length !== 1) return false;
  const v = map.views.get(t.sources[0])!;
  const shape = params.get(t.sources[0])!.shape;
  return v.offset === 0 && v.strides.every((s, d) => s === numel(shape.slice(d + 1)));
}

/**
 * Writes one Hugging Face tensor in slabs: a renamed parameter in chunks of SLAB_ELEMENTS, a fused
 * expert tensor one expert at a time (that expert's matrices read whole and transposed in).
 */
function writeTensor(
  t: HfTensor,
  map: HfMap,
  dtype: 'BF16' | 'F32',
  params: ReadonlyMap<string, ParamShape>,
  entryOf: (name: string) => HeaderEntry,
  fd: number,
  path: string,
  put: (chunk: Uint8Array) => void,
): void {
  const emit = (values: Float32Array) => {
    if (dtype === 'F32')
      return put(new Uint8Array(values.buffer, values.byteOffset, values.byteLength));
    const bits = new Uint16Array(values.length);
    f32ToBf16(values, bits);
    put(new Uint8Array(bits.buffer));
  };
  const read = (name: string, from: number, count: number): Float32Array => {
    const bytes = readRange(fd, entryOf(name).start + from * 4, count * 4, path);
    return new Float32Array(bytes.buffer, bytes.byteOffset, count);
  };
  if (isWhole(t, map, params)) {
    const n = numel(t.shape);
    for (let at = 0; at < n; at += SLAB_ELEMENTS)
      emit(read(t.sources[0], at, Math.min(SLAB_ELEMENTS, n - at)));
    return;
  }
  // a fused expert tensor [E, a, b]: slab e holds expert e's sources, scattered by their views
  const [E, a, b] = t.shape;
  const slab = new Float32Array(a * b);
  for (let e = 0; e < E; e++) {
    for (const name of t.sources) {
      const v = map.views.get(name)!;
      if (Math.floor(v.offset / (a * b)) !== e) continue;
      const [rows, cols] = params.get(name)!.shape;
      const m = read(name, 0, rows * cols);
      const base = v.offset - e * a * b;
      for (let i = 0; i < rows; i++)
        for (let j = 0; j < cols; j++)
          slab[base + i * v.strides[0] + j * v.strides[1]] = m[i * cols + j];
    }
    emit(slab);
  }
}
