// Learning for real, a short version for CI: after 150 steps the tiny VLM predicts caption
// tokens clearly better with its images than the same run with images shuffled across samples
// (captions can only come from the image), in f32 and in bf16 (--bf16), on the runtime's
// synthetic task; so does `lfc demo`'s default (tiny-vlm-moe on 4 local ranks, full separation
// and A2A overlap) after 60 of its 300 steps, through the data path: its dataset of PNG files
// and captions, the tiny tokenizer's chat template, the control's images shuffled across its
// samples. The full criterion — below half the control — is what `lfc demo` shows in under five
// minutes (README).
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { cli } from '../helpers.js';
import { finalCaptionLoss } from '../../cli/demo.js';
import { compile, writePlan } from '../../compiler/pipeline.js';
import { train, type StepMetrics } from '../../runtime/train.js';

describe('the tiny VLM learns to read its images', () => {
  it.each([
    { precision: 'f32', bf16: false },
    { precision: 'bf16', bf16: true },
  ])(
    '$precision: caption loss with images < 0.8 × the shuffled-image control after 150 steps',
    async ({ bf16 }) => {
      const dir = mkdtempSync(join(tmpdir(), 'lfc-learn-'));
      const { plan, programs } = compile({
        model: 'tiny-vlm',
        globalBatchSize: 4,
        optimizer: { lr: 2e-3 },
        precision: { bf16 },
      });
      writePlan(dir, plan, programs);
      const base = { planDir: dir, trainIters: 150, lrWarmupIters: 20, seed: 1 };
      const seeing = await train(base);
      const control = await train({ ...base, shuffleImages: true });
      const a = finalCaptionLoss(seeing.steps);
      const b = finalCaptionLoss(control.steps);
      // the control cannot beat the entropy of the caption values (≈ (ln 8 + ln 7 + ln 4) / 3)
      expect(b).toBeGreaterThan(1.6);
      expect(a).toBeLessThan(0.8 * b);
    },
    300_000,
  );

  it('lfc demo (4 ranks, pp 2 × vpp 2, ep 2, full separation, A2A overlap): caption loss < 0.8 × the control after 60 steps', async () => {
    const out = mkdtempSync(join(tmpdir(), 'lfc-demo-'));
    const r = await cli(
      'demo',
      '--steps',
      '60',
      '--out',
      out,
      '--data-dir',
      join(out, 'data'),
      '--quiet',
    );
    expect(r.err).toBe('');
    expect(r.code).toBe(0);
    // the layout it chose, in the compile report's words
    expect(r.out).toContain(
      'tiny-vlm-moe on 4 local CPU ranks (tp 1, pp 2 × vpp 2, dp 2, ep 2 (expert dp 1)), 8 microbatches',
    );
    expect(r.out).toMatch(/encoder: full separation \(level 3\)/);
    expect(r.out).toMatch(/MoE all-to-all overlap: on/);
    const caption = (file: string) =>
      finalCaptionLoss(
        readFileSync(join(out, file), 'utf8')
          .trim()
          .split('\n')
          .map((l) => {
            const m = JSON.parse(l) as { caption_loss: number };
            return { captionLoss: m.caption_loss } as StepMetrics;
          }),
      );
    const a = caption('metrics.jsonl');
    const b = caption('metrics-control.jsonl');
    // the demo's dataset: a reply of 7 words, 4 of which only the image tells (square and
    // background colour, top or bottom, left or right): the control cannot beat
    // (ln 8 + ln 7 + 2 ln 2) / 7 ≈ 0.77 a reply token
    expect(b).toBeGreaterThan(0.7);
    expect(a).toBeLessThan(0.8 * b);
    expect(r.out).toMatch(/data: .*16384 PNG images with a caption each/);
  }, 300_000);
});
