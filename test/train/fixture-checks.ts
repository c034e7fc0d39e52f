// The checks of a one-rank run against a PyTorch fixture (step.json, gradients, parameters after
// 3 steps), shared by the tiny-vlm fixtures and the tiny Qwen ones: the tolerances of
// reference/tiny-vlm.md and the Qwen issue's acceptance.
import { readFileSync } from 'node:fs';
import { expect } from 'vitest';
import { relL2 } from '../helpers.js';

export interface StepJson {
  loss: number;
  ce_loss: number;
  aux_loss: number;
  loss_tokens: number;
  grad_norm: number;
  losses: number[];
  /** the token-dropping fixture: the capacity factor, its drop policy and the real tokens'
   * assignments dropped */
  moe_expert_capacity_factor?: number;
  moe_token_drop_policy?: 'position' | 'probs';
  dropped_per_step?: number[];
}

export const readStepJson = (path: string) => JSON.parse(readFileSync(path, 'utf8')) as StepJson;

export const rel = (a: number, b: number) => Math.abs(a - b) / Math.max(Math.abs(b), 1e-30);

/** step 1's loss, its terms and the gradient norm to 1e-5 relative; the same loss tokens */
export function expectStep(got: StepJson, want: StepJson): void {
  expect(got.loss_tokens).toBe(want.loss_tokens);
  expect(rel(got.loss, want.loss)).toBeLessThan(1e-5);
  expect(rel(got.ce_loss, want.ce_loss)).toBeLessThan(1e-5);
  if (want.aux_loss) expect(rel(got.aux_loss, want.aux_loss)).toBeLessThan(1e-5);
  expect(rel(got.grad_norm, want.grad_norm)).toBeLessThan(1e-5);
}

/** the largest error of got against ref, over ref's max-abs */
export function maxAbsError(got: Float32Array, ref: Float32Array): number {
  let maxAbs = 0;
  let maxErr = 0;
  for (let i = 0; i < ref.length; i++) {
    maxAbs = Math.max(maxAbs, Math.abs(ref[i]));
    maxErr = Math.max(maxErr, Math.abs(got[i] - ref[i]));
  }
  return maxErr / Math.max(maxAbs, 1e-30);
}

/** the worst of err(name) over names: [name, error] */
export function worstOf(names: Iterable<string>, err: (name: string) => number): [string, number] {
  let worst: [string, number] = ['', 0];
  for (const name of names) {
    const e = err(name);
    if (e > worst[1]) worst = [name, e];
  }
  return worst;
}

/**
 * relL2(got, ref) over the elements whose first-step gradient in the reference is 0 or above the
 * gradient check's own tolerance (1e-4 of the tensor's max-abs), and how many were left out (1.1%
 * of tiny-vlm's elements, 0.6% of tiny-vlm-moe's).
 * AdamW scales each element's step by 1/√v, so an element whose gradient is round-off moves by
 * about lr in a direction the machine's round-off picks: tiny-vlm-moe-capacity's
 * visual.pos_embed_row has one such element (gradient 8.8e-9 against a max-abs of 0.018), which
 * alone put the tensor at 1.18e-4 on an AVX2 machine, every other element within 3e-8.
 */
export function relL2AboveNoise(
  got: Float32Array,
  ref: Float32Array,
  grad: Float32Array,
): { err: number; skipped: number } {
  let maxAbs = 0;
  for (const g of grad) maxAbs = Math.max(maxAbs, Math.abs(g));
  // a gradient of exactly 0 (a token not in the batch) is 0 on every machine
  const keep = (i: number) => grad[i] === 0 || Math.abs(grad[i]) > 1e-4 * maxAbs;
  const a: number[] = [];
  const b: number[] = [];
  for (let i = 0; i < ref.length; i++)
    if (keep(i)) {
      a.push(got[i]);
      b.push(ref[i]);
    }
  return {
    err: a.length ? relL2(Float32Array.from(a), Float32Array.from(b)) : 0,
    skipped: ref.length - a.length,
  };
}

export { relL2 };
