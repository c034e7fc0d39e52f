// The tiny Qwen presets on one rank against their independent PyTorch reference
// (test/reference/qwen_vl.py, committed fixtures under Hugging Face names): the fixture's weights
// loaded as a Hugging Face directory (--load-hf), its batch in the batch contract (patches and
// grids, M-RoPE ids, window ids, the image token id), then the first step's loss and gradients
// and the parameters after 3 AdamW steps on the same batch. Acceptance: loss within 1e-5
// relative, each gradient within 1e-4 of its max-abs, parameters within 1e-4 relative L2.
import { mkdirSync, mkdtempSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { compile, writePlan } from '../../compiler/pipeline.js';
import { projectRoot } from '../../compiler/paths.js';
import type { ModelConfig } from '../../compiler/frontend/config.js';
import { hfMap, type LfcView } from '../../runtime/hf/names.js';
import { readSafetensors } from '../../runtime/safetensors.js';
import { train, type TrainResult } from '../../runtime/train.js';
import { expectStep, maxAbsError, readStepJson, rel, relL2, worstOf } from './fixture-checks.js';

/** the lfc parameter's elements inside a Hugging Face tensor (its view: offset and strides) */
function viewed(hf: Float32Array, view: LfcView, shape: readonly number[]): Float32Array {
  const out = new Float32Array(shape.reduce((a, b) => a * b, 1));
  const at = (i: number) => {
    let off = view.offset;
    let rest = i;
    for (let d = shape.length - 1; d >= 0; d--) {
      off += (rest % shape[d]) * view.strides[d];
      rest = Math.floor(rest / shape[d]);
    }
    return off;
  };
  for (let i = 0; i < out.length; i++) out[i] = hf[at(i)];
  return out;
}

describe.each(['qwen2.5-vl-tiny', 'qwen3-vl-moe-tiny'])(
  '%s against the PyTorch fixture',
  (model) => {
    const fixtures = join(projectRoot(), 'test/fixtures', model);
    const want = readStepJson(join(fixtures, 'step.json'));
    const dir = mkdtempSync(join(tmpdir(), `lfc-fixture-${model}-`));
    const dump = join(dir, 'dump');
    const hfDir = join(dir, 'hf');
    let result: TrainResult;
    let views: ReadonlyMap<string, LfcView>;
    let shapes: Map<string, readonly number[]>;
    afterAll(() => rmSync(dir, { recursive: true, force: true }));
    /** a fixture file's tensors (HF names), each lfc parameter read through its view */
    const asLfc = (ref: ReadonlyMap<string, { data: unknown }>) => (name: string) => {
      const view = views.get(name)!;
      return viewed(ref.get(view.hf)!.data as Float32Array, view, shapes.get(name)!);
    };

    it('trains 3 steps on the fixture batch from its Hugging Face weights', async () => {
      const { plan, programs } = compile({ model, globalBatchSize: 3 });
      writePlan(join(dir, 'plan'), plan, programs);
      const cfg = plan.model.config as unknown as ModelConfig['model'];
      shapes = new Map(plan.params.map((p) => [p.name, p.shape]));
      views = hfMap(plan.params, cfg).views;
      // a model directory: the fixture's weights as its one safetensors file
      mkdirSync(hfDir);
      symlinkSync(join(fixtures, 'weights.safetensors'), join(hfDir, 'model.safetensors'));
      result = await train({
        planDir: join(dir, 'plan'),
        trainIters: 3,
        loadHf: [{ dir: hfDir, part: 'all' }],
        batch: join(fixtures, 'batch.safetensors'),
        dumpStep: dump,
      });
      expect(result.steps).toHaveLength(3);
    }, 120_000);

    it('loss, its terms and the gradient norm of step 1 to 1e-5', () => {
      const got = readStepJson(join(dump, 'step.json'));
      console.log(
        `${model}: loss ${got.loss} against ${want.loss} (rel ${rel(got.loss, want.loss).toExponential(2)})`,
      );
      expectStep(got, want);
    });

    it('every gradient within 1e-4 of its max-abs', () => {
      const got = readSafetensors(join(dump, 'grads.safetensors')).tensors;
      const ref = readSafetensors(join(fixtures, 'grads.safetensors')).tensors;
      expect(got.size).toBe(views.size);
      const refOf = asLfc(ref);
      const worst = worstOf(got.keys(), (n) =>
        maxAbsError(got.get(n)!.data as Float32Array, refOf(n)),
      );
      console.log(
        `${model}: worst gradient error ${worst[1].toExponential(2)} of max-abs (${worst[0]})`,
      );
      expect(worst[1], `worst: ${worst[0]}`).toBeLessThanOrEqual(1e-4);
    });

    it('losses of 3 AdamW steps to 1e-5 and parameters after them to 1e-4 relative L2', () => {
      result.steps.forEach((s, i) =>
        expect(rel(s.loss, want.losses[i]), `step ${i + 1}`).toBeLessThan(1e-5),
      );
      const ref = readSafetensors(join(fixtures, 'params_step3.safetensors')).tensors;
      const refOf = asLfc(ref);
      const worst = worstOf(result.params.keys(), (n) => relL2(result.params.get(n)!, refOf(n)));
      console.log(
        `${model}: worst parameter rel L2 after 3 steps ${worst[1].toExponential(2)} (${worst[0]})`,
      );
      expect(worst[1], `worst: ${worst[0]}`).toBeLessThanOrEqual(1e-4);
    });
  },
);
