// Learning for real, a short version for CI: after 150 steps the tiny VLM predicts caption
// tokens clearly better with its images than the same run with images shuffled across samples
// (captions can only come from the image). The full criterion — below half the control — is
// what `lfc demo` shows in about three minutes (README).
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { finalCaptionLoss } from '../../compiler/cli/demo.js';
import { compile, writePlan } from '../../compiler/pipeline.js';
import { train } from '../../runtime/train.js';

describe('the tiny VLM learns to read its images', () => {
  it('caption loss with images < 0.8 × the shuffled-image control after 150 steps', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'lfc-learn-'));
    const { plan, programs } = compile({
      model: 'tiny-vlm',
      globalBatchSize: 4,
      optimizer: { lr: 2e-3 },
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
  }, 300_000);
});
