// The tiny Qwen presets on one rank against their independent PyTorch reference
// (test/reference/qwen_vl.py, committed fixtures under Hugging Face names): the fixture's weights
// loaded as a Hugging Face directory (--load-hf), its batch in the batch contract (patches and
// grids, M-RoPE ids, window ids, the image token id), then the first step's loss and gradients
// and the parameters after 3 AdamW steps on the same batch. Acceptance: loss within 1e-5
// relative, each gradient within 1e-4 of its max-abs, parameters within 1e-4 relative L2.
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { compile, writePlan } from '../../compiler/pipeline.js';
import { projectRoot } from '../../compiler/paths.js';
import type { ModelConfig } from '../../compiler/frontend/config.js';
import { hfMap, type LfcView } from '../../runtime/hf/names.js';
import { readSafetensors } from '../../runtime/safetensors.js';
import { train, type TrainResult } from '../../runtime/train.js';

interface StepJson {
  loss: number;
  ce_loss: number;
  aux_loss: number;
  loss_tokens: number;
  grad_norm: number;
  losses: number[];
}

const rel = (a: number, b: number) => Math.abs(a - b) / Math.max(Math.abs(b), 1e-30);

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
    const want = JSON.parse(readFileSync(join(fixtures, 'step.json'), 'utf8')) as StepJson;
    const dir = mkdtempSync(join(tmpdir(), `lfc-fixture-${model}-`));
    const dump = join(dir, 'dump');
    const hfDir = join(dir, 'hf');
    let result: TrainResult;
    let views: ReadonlyMap<string, LfcView>;
    let shapes: Map<string, readonly number[]>;
    afterAll(() => rmSync(dir, { recursive: true, force: true }));

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
      const got = JSON.parse(readFileSync(join(dump, 'step.json'), 'utf8')) as StepJson;
      expect(got.loss_tokens).toBe(want.loss_tokens);
      console.log(
        `${model}: loss ${got.loss} against ${want.loss} (rel ${rel(got.loss, want.loss).toExponential(2)})`,
      );
      expect(rel(got.loss, want.loss)).toBeLessThan(1e-5);
      expect(rel(got.ce_loss, want.ce_loss)).toBeLessThan(1e-5);
      if (want.aux_loss) expect(rel(got.aux_loss, want.aux_loss)).toBeLessThan(1e-5);
      expect(rel(got.grad_norm, want.grad_norm)).toBeLessThan(1e-5);
    });

    it('every gradient within 1e-4 of its max-abs', () => {
      const got = readSafetensors(join(dump, 'grads.safetensors')).tensors;
      const ref = readSafetensors(join(fixtures, 'grads.safetensors')).tensors;
      expect(got.size).toBe(views.size);
      let worst = ['', 0] as [string, number];
      for (const [name, g] of got) {
        const view = views.get(name)!;
        const r = viewed(ref.get(view.hf)!.data as Float32Array, view, shapes.get(name)!);
        const gd = g.data as Float32Array;
        let maxAbs = 0;
        let maxErr = 0;
        for (let i = 0; i < r.length; i++) {
          maxAbs = Math.max(maxAbs, Math.abs(r[i]));
          maxErr = Math.max(maxErr, Math.abs(gd[i] - r[i]));
        }
        const e = maxErr / Math.max(maxAbs, 1e-30);
        if (e > worst[1]) worst = [name, e];
      }
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
      let worst = ['', 0] as [string, number];
      for (const [name, p] of result.params) {
        const view = views.get(name)!;
        const r = viewed(ref.get(view.hf)!.data as Float32Array, view, shapes.get(name)!);
        let num = 0;
        let den = 0;
        for (let i = 0; i < r.length; i++) {
          num += (p[i] - r[i]) ** 2;
          den += r[i] ** 2;
        }
        const e = Math.sqrt(num / Math.max(den, 1e-30));
        if (e > worst[1]) worst = [name, e];
      }
      console.log(
        `${model}: worst parameter rel L2 after 3 steps ${worst[1].toExponential(2)} (${worst[0]})`,
      );
      expect(worst[1], `worst: ${worst[0]}`).toBeLessThanOrEqual(1e-4);
    });
  },
);
