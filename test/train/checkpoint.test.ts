// Checkpoints: resuming from step k gives bit-identical losses to the uninterrupted run; a
// truncated or foreign checkpoint is refused with a clear error before anything is written.
import {
  copyFileSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  statSync,
  truncateSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { compile, writePlan } from '../../compiler/pipeline.js';
import { iterDir } from '../../runtime/checkpoint.js';
import { train, type TrainResult } from '../../runtime/train.js';

const dir = mkdtempSync(join(tmpdir(), 'lfc-ckpt-'));
const planDir = join(dir, 'plan');
const save = join(dir, 'save');
let full: TrainResult;

beforeAll(async () => {
  const { plan, programs } = compile({ model: 'tiny-vlm-moe', globalBatchSize: 2 });
  writePlan(planDir, plan, programs);
  full = await train({ planDir, trainIters: 5, seed: 7, save, saveInterval: 2 });
}, 120_000);

describe('checkpoint and resume', () => {
  it('saves at the interval and at the end, with latest pointing at the last', () => {
    for (const s of [2, 4, 5])
      expect(statSync(join(iterDir(save, s), 'model.safetensors')).size).toBeGreaterThan(0);
    expect(readFileSync(join(save, 'latest'), 'utf8').trim()).toBe('5');
  });

  it('resuming at step 2 gives bit-identical losses for steps 3–5', async () => {
    const resumed = await train({ planDir, trainIters: 5, seed: 7, load: iterDir(save, 2) });
    expect(resumed.steps.map((s) => s.step)).toEqual([3, 4, 5]);
    expect(resumed.steps.map((s) => s.loss)).toEqual(full.steps.slice(2).map((s) => s.loss));
    for (const [name, p] of full.params)
      expect(Buffer.from(resumed.params.get(name)!.buffer).equals(Buffer.from(p.buffer))).toBe(
        true,
      );
  }, 120_000);

  it('resuming under another thread count stays bit-identical (the kernel pool and OpenBLAS)', async () => {
    // full ran on the machine's cores; the pooled kernels' blocks and partial sums do not depend
    // on the thread count (runtime-native/src/core/thread_pool.h)
    for (const threads of [1, 3]) {
      const resumed = await train({
        planDir,
        trainIters: 5,
        seed: 7,
        load: iterDir(save, 2),
        threads,
      });
      expect(resumed.steps.map((s) => s.loss)).toEqual(full.steps.slice(2).map((s) => s.loss));
      for (const [name, p] of full.params)
        expect(Buffer.from(resumed.params.get(name)!.buffer).equals(Buffer.from(p.buffer))).toBe(
          true,
        );
    }
  }, 120_000);

  it('a truncated checkpoint is refused, naming the file, and the save directory is untouched', async () => {
    const bad = join(dir, 'truncated');
    mkdirSync(bad);
    for (const f of ['model.safetensors', 'optimizer.safetensors', 'state.json'])
      copyFileSync(join(iterDir(save, 4), f), join(bad, f));
    truncateSync(
      join(bad, 'model.safetensors'),
      statSync(join(bad, 'model.safetensors')).size - 1000,
    );
    const before = readFileSync(join(iterDir(save, 4), 'model.safetensors'));
    await expect(train({ planDir, trainIters: 6, load: bad, save })).rejects.toThrow(
      /model\.safetensors: not a valid safetensors file: .*truncated/,
    );
    expect(readFileSync(join(iterDir(save, 4), 'model.safetensors')).equals(before)).toBe(true);
    expect(readFileSync(join(save, 'latest'), 'utf8').trim()).toBe('5');
  });

  it('a checkpoint of another model is refused', async () => {
    const other = join(dir, 'other-plan');
    const { plan, programs } = compile({ model: 'tiny-vlm', globalBatchSize: 1 });
    writePlan(other, plan, programs);
    await expect(train({ planDir: other, trainIters: 6, load: save })).rejects.toThrow(
      /a checkpoint of model tiny-vlm-moe, not tiny-vlm/,
    );
  });

  it('a foreign file is refused', async () => {
    const foreign = join(dir, 'foreign');
    mkdirSync(foreign);
    writeFileSync(join(foreign, 'state.json'), JSON.stringify({ hello: 'world' }));
    await expect(train({ planDir, trainIters: 6, load: foreign })).rejects.toThrow(
      /not an lfc checkpoint/,
    );
  });
});
