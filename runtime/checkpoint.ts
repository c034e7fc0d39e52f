// Checkpoints: a directory per saved step, `<save>/iter_<step>/` with
//   model.safetensors      every parameter, whole tensors, checkpoint names
//   optimizer.safetensors  AdamW moments `exp_avg.<name>`, `exp_avg_sq.<name>` of trainable ones
//   state.json             format, version, model, step, seed, the data position, lr settings
// written into a temporary directory and renamed, then `<save>/latest` (the step) replaced
// atomically: a crash never leaves a torn checkpoint, and the previous one stays intact.

import { existsSync, mkdirSync, readFileSync, renameSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { UserError } from '../compiler/errors.js';
import {
  readSafetensors,
  serializeSafetensors,
  writeFileAtomic,
  type Tensor,
} from './safetensors.js';
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
  /** data position: the next step's index into the data stream */
  readonly dataStep: number;
  readonly lr: Record<string, unknown>;
}

export function iterDir(save: string, step: number): string {
  return join(save, `iter_${String(step).padStart(7, '0')}`);
}

export function saveCheckpoint(
  save: string,
  state: RankState,
  meta: Omit<CheckpointState, 'format' | 'version'>,
): string {
  mkdirSync(save, { recursive: true });
  const final = iterDir(save, meta.step);
  const tmp = `${final}.tmp-${process.pid}`;
  rmSync(tmp, { recursive: true, force: true });
  mkdirSync(tmp);
  const model = new Map<string, Tensor>();
  const optim = new Map<string, Tensor>();
  for (const name of state.names()) {
    const shape = state.shape(name);
    model.set(name, { dtype: 'F32', shape, data: state.view(name, 'param').slice() });
    if (state.has(name, 'expAvg')) {
      optim.set(`exp_avg.${name}`, {
        dtype: 'F32',
        shape,
        data: state.view(name, 'expAvg').slice(),
      });
      optim.set(`exp_avg_sq.${name}`, {
        dtype: 'F32',
        shape,
        data: state.view(name, 'expAvgSq').slice(),
      });
    }
  }
  writeFileAtomic(join(tmp, 'model.safetensors'), serialize(model, meta.model));
  writeFileAtomic(join(tmp, 'optimizer.safetensors'), serialize(optim, meta.model));
  writeFileAtomic(
    join(tmp, 'state.json'),
    JSON.stringify({ format: CHECKPOINT_FORMAT, version: CHECKPOINT_VERSION, ...meta }, null, 1),
  );
  rmSync(final, { recursive: true, force: true });
  renameSync(tmp, final);
  writeFileAtomic(join(save, 'latest'), `${meta.step}\n`);
  return final;
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
 * Loads a checkpoint into the runtime's state after checking it fits this plan: the same
 * parameter names and shapes. Nothing is written to the runtime before every check passed.
 */
export function loadCheckpoint(load: string, state: RankState, model: string): CheckpointState {
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
  if (meta.format !== CHECKPOINT_FORMAT) throw new UserError(`${statePath}: not an lfc checkpoint`);
  if (meta.version !== CHECKPOINT_VERSION) {
    throw new UserError(
      `${statePath}: checkpoint version ${meta.version}; this lfc reads version ${CHECKPOINT_VERSION}`,
    );
  }
  if (meta.model !== model)
    throw new UserError(`${dir}: a checkpoint of model ${meta.model}, not ${model}`);
  const weights = readSafetensors(join(dir, 'model.safetensors')).tensors;
  const optim = readSafetensors(join(dir, 'optimizer.safetensors')).tensors;
  const plans: [Float32Array, Tensor][] = [];
  for (const name of state.names()) {
    const want = state.shape(name);
    const take = (t: Tensor | undefined, what: string) =>
      fitting(t, want, dir, what, ' (a checkpoint of another model or layout?)');
    plans.push([state.view(name, 'param'), take(weights.get(name), `parameter ${name}`)]);
    if (state.has(name, 'expAvg')) {
      plans.push([
        state.view(name, 'expAvg'),
        take(optim.get(`exp_avg.${name}`), `optimizer state exp_avg.${name}`),
      ]);
      plans.push([
        state.view(name, 'expAvgSq'),
        take(optim.get(`exp_avg_sq.${name}`), `optimizer state exp_avg_sq.${name}`),
      ]);
    }
  }
  const extra = [...weights.keys()].filter((n) => !state.names().includes(n));
  if (extra.length)
    throw new UserError(
      `${dir}: holds parameters this model lacks: ${extra.slice(0, 3).join(', ')}${extra.length > 3 ? ', …' : ''}`,
    );
  for (const [dst, t] of plans) dst.set(t.data as Float32Array);
  return meta;
}

/** Loads only weights (the `--weights FILE` of a replayed step), checked the same way. */
export function loadWeights(path: string, state: RankState): void {
  const tensors = readSafetensors(path).tensors;
  const plans = state.names().map((name) => {
    const t = fitting(tensors.get(name), state.shape(name), path, `parameter ${name}`);
    return [state.view(name, 'param'), t.data as Float32Array] as const;
  });
  for (const [dst, src] of plans) dst.set(src);
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
