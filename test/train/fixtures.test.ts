// One rank against the independent PyTorch reference (test/reference/tiny_vlm.py, committed
// fixtures): the first step's loss, gradients and gradient norm, then the losses of 3 AdamW
// steps on the same batch and the parameters after them. tiny-vlm-moe-capacity is tiny-vlm-moe
// compiled with the fixture's --moe-expert-capacity-factor and --moe-token-drop-policy
// (position), with which the reference drops hundreds of real tokens' assignments every step.
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { compile, writePlan } from '../../compiler/pipeline.js';
import { projectRoot } from '../../compiler/paths.js';
import { readSafetensors } from '../../runtime/safetensors.js';
import { train, type TrainResult } from '../../runtime/train.js';

interface StepJson {
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

function rel(a: number, b: number): number {
  return Math.abs(a - b) / Math.max(Math.abs(b), 1e-30);
}

describe.each([
  ['tiny-vlm', 'tiny-vlm'],
  ['tiny-vlm-moe', 'tiny-vlm-moe'],
  ['tiny-vlm-moe-capacity', 'tiny-vlm-moe'],
])('%s against the PyTorch fixture', (fixture, model) => {
  const fixtures = join(projectRoot(), 'test/fixtures', fixture);
  const want = JSON.parse(readFileSync(join(fixtures, 'step.json'), 'utf8')) as StepJson;
  const dir = mkdtempSync(join(tmpdir(), `lfc-fixture-${fixture}-`));
  const dump = join(dir, 'dump');
  let result: TrainResult;

  it('trains 3 steps on the fixture batch', async () => {
    const moeExpertCapacityFactor = want.moe_expert_capacity_factor;
    if (moeExpertCapacityFactor !== undefined)
      for (const dropped of want.dropped_per_step!) expect(dropped).toBeGreaterThan(0);
    const { plan, programs } = compile({
      model,
      globalBatchSize: 3,
      moeExpertCapacityFactor,
      moeTokenDropPolicy: want.moe_token_drop_policy,
    });
    writePlan(join(dir, 'plan'), plan, programs);
    result = await train({
      planDir: join(dir, 'plan'),
      trainIters: 3,
      weights: join(fixtures, 'weights.safetensors'),
      batch: join(fixtures, 'batch.safetensors'),
      dumpStep: dump,
      metricsPath: join(dir, 'metrics.jsonl'),
    });
    expect(result.steps).toHaveLength(3);
  }, 120_000);

  it('loss, its terms and the gradient norm of step 1 to 1e-5', () => {
    const got = JSON.parse(readFileSync(join(dump, 'step.json'), 'utf8')) as StepJson;
    expect(got.loss_tokens).toBe(want.loss_tokens);
    expect(rel(got.loss, want.loss)).toBeLessThan(1e-5);
    expect(rel(got.ce_loss, want.ce_loss)).toBeLessThan(1e-5);
    if (want.aux_loss) expect(rel(got.aux_loss, want.aux_loss)).toBeLessThan(1e-5);
    expect(rel(got.grad_norm, want.grad_norm)).toBeLessThan(1e-5);
  });

  it('every gradient within 1e-4 of its max-abs', () => {
    const got = readSafetensors(join(dump, 'grads.safetensors')).tensors;
    const ref = readSafetensors(join(fixtures, 'grads.safetensors')).tensors;
    expect([...got.keys()].sort()).toEqual([...ref.keys()].sort());
    const worst: [string, number][] = [];
    for (const [name, r] of ref) {
      const g = got.get(name)!.data as Float32Array;
      const rd = r.data as Float32Array;
      let maxAbs = 0;
      let maxErr = 0;
      for (let i = 0; i < rd.length; i++) {
        maxAbs = Math.max(maxAbs, Math.abs(rd[i]));
        maxErr = Math.max(maxErr, Math.abs(g[i] - rd[i]));
      }
      worst.push([name, maxErr / Math.max(maxAbs, 1e-30)]);
    }
    worst.sort((a, b) => b[1] - a[1]);
    expect(worst[0][1], `worst: ${worst[0][0]}`).toBeLessThanOrEqual(1e-4);
  });

  it('the dumped weights and batch are the fixture files, bit for bit', () => {
    const a = readSafetensors(join(dump, 'weights.safetensors')).tensors;
    const b = readSafetensors(join(fixtures, 'weights.safetensors')).tensors;
    for (const [n, t] of b)
      expect(
        Buffer.from((a.get(n)!.data as Float32Array).buffer).equals(
          Buffer.from((t.data as Float32Array).buffer),
        ),
      ).toBe(true);
  });

  it('losses of 3 AdamW steps to 1e-5 and parameters after them to 1e-4 relative L2', () => {
    result.steps.forEach((s, i) =>
      expect(rel(s.loss, want.losses[i]), `step ${i + 1}`).toBeLessThan(1e-5),
    );
    const ref = readSafetensors(join(fixtures, 'params_step3.safetensors')).tensors;
    let worst = ['', 0] as [string, number];
    for (const [name, r] of ref) {
      const p = result.params.get(name)!;
      const rd = r.data as Float32Array;
      let num = 0;
      let den = 0;
      for (let i = 0; i < rd.length; i++) {
        num += (p[i] - rd[i]) ** 2;
        den += rd[i] ** 2;
      }
      const e = Math.sqrt(num / Math.max(den, 1e-30));
      if (e > worst[1]) worst = [name, e];
    }
    expect(worst[1], `worst: ${worst[0]}`).toBeLessThanOrEqual(1e-4);
  });
});
