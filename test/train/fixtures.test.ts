// One rank against the independent PyTorch reference (test/reference/tiny_vlm.py, committed
// fixtures): the first step's loss, gradients and gradient norm, then the losses of 3 AdamW
// steps on the same batch and the parameters after them (leaving out the elements whose gradient
// the gradient check cannot tell from 0: fixture-checks.ts relL2AboveNoise). tiny-vlm-moe-capacity
// is tiny-vlm-moe compiled with the fixture's --moe-expert-capacity-factor and
// --moe-token-drop-policy (position), with which the reference drops hundreds of real tokens'
// assignments every step.
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { compile, writePlan } from '../../compiler/pipeline.js';
import { projectRoot } from '../../compiler/paths.js';
import { readSafetensors, type Tensor } from '../../runtime/safetensors.js';
import { train, type TrainResult } from '../../runtime/train.js';
import {
  expectStep,
  maxAbsError,
  readStepJson,
  rel,
  relL2AboveNoise,
  worstOf,
} from './fixture-checks.js';

/** a tensor's own bytes */
const bytesOf = (t: Tensor) => Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength);

describe.each([
  ['tiny-vlm', 'tiny-vlm'],
  ['tiny-vlm-moe', 'tiny-vlm-moe'],
  ['tiny-vlm-moe-capacity', 'tiny-vlm-moe'],
])('%s against the PyTorch fixture', (fixture, model) => {
  const fixtures = join(projectRoot(), 'test/fixtures', fixture);
  const want = readStepJson(join(fixtures, 'step.json'));
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
    expectStep(readStepJson(join(dump, 'step.json')), want);
  });

  it('every gradient within 1e-4 of its max-abs', () => {
    const got = readSafetensors(join(dump, 'grads.safetensors')).tensors;
    const ref = readSafetensors(join(fixtures, 'grads.safetensors')).tensors;
    expect([...got.keys()].sort()).toEqual([...ref.keys()].sort());
    const [name, worst] = worstOf(ref.keys(), (n) =>
      maxAbsError(got.get(n)!.data as Float32Array, ref.get(n)!.data as Float32Array),
    );
    expect(worst, `worst: ${name}`).toBeLessThanOrEqual(1e-4);
  });

  it('the dumped weights and batch are the fixture files, bit for bit', () => {
    const a = readSafetensors(join(dump, 'weights.safetensors')).tensors;
    const b = readSafetensors(join(fixtures, 'weights.safetensors')).tensors;
    for (const [n, t] of b) expect(bytesOf(a.get(n)!).equals(bytesOf(t))).toBe(true);
  });

  it('losses of 3 AdamW steps to 1e-5 and parameters after them to 1e-4 relative L2', () => {
    result.steps.forEach((s, i) =>
      expect(rel(s.loss, want.losses[i]), `step ${i + 1}`).toBeLessThan(1e-5),
    );
    const ref = readSafetensors(join(fixtures, 'params_step3.safetensors')).tensors;
    const grads = readSafetensors(join(fixtures, 'grads.safetensors')).tensors;
    let skipped = 0;
    let total = 0;
    const [name, worst] = worstOf(ref.keys(), (n) => {
      const r = ref.get(n)!.data as Float32Array;
      const e = relL2AboveNoise(result.params.get(n)!, r, grads.get(n)!.data as Float32Array);
      skipped += e.skipped;
      total += r.length;
      return e.err;
    });
    expect(worst, `worst: ${name}`).toBeLessThanOrEqual(1e-4);
    // the elements left out (gradient within the gradient check's tolerance of 0) are few
    console.log(
      `${fixture}: ${skipped} of ${total} parameter elements with a round-off gradient left out`,
    );
    expect(skipped / total).toBeLessThan(0.05);
  });
});
