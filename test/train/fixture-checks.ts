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

export { relL2 };
