// Restart from the last checkpoint on several ranks: a run saved at step 2 and resumed from that
// checkpoint trains steps 3–4 with bit-identical losses to the uninterrupted run, under tensor
// parallelism (pieces of parameters and of AdamW state gathered and cut again) and under the
// distributed optimizer (state sharded over data-parallel ranks), in f32 and in bf16.
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { iterDir } from '../../runtime/checkpoint.js';
import { readSafetensors } from '../../runtime/safetensors.js';
import { cli } from '../helpers.js';

const dir = mkdtempSync(join(tmpdir(), 'lfc-resume-'));

const losses = (path: string) =>
  readFileSync(path, 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as { step: number; loss: number });

describe('resume on several ranks', () => {
  it.each([
    ['tp 2', ['--tp', '2']],
    ['dp 2, distributed optimizer', ['--use-distributed-optimizer']],
    // the checkpoint keeps the fp32 master weights (sharded here) and the bf16 parameters are
    // their rounding: a resumed run is the same run
    ['bf16, dp 2, distributed optimizer', ['--use-distributed-optimizer', '--bf16']],
    ['bf16, tp 2', ['--tp', '2', '--bf16']],
  ])(
    '%s: steps 3–4 after a restart from step 2 are bit-identical',
    async (name, flags) => {
      const plan = join(dir, name.replace(/\W+/g, '-'));
      const ckpt = `${plan}.ckpt`;
      const compiled = await cli(
        'compile',
        'tiny-vlm-moe',
        '--nproc-per-node',
        '2',
        '--global-batch-size',
        '4',
        ...flags,
        '-o',
        plan,
      );
      expect(compiled.err).toBe('');
      const whole = await cli(
        'run',
        plan,
        '--train-iters',
        '4',
        '--save',
        ckpt,
        '--save-interval',
        '2',
        '--metrics',
        `${plan}.a.jsonl`,
        '--quiet',
      );
      expect(whole.err).toBe('');
      const resumed = await cli(
        'run',
        plan,
        '--train-iters',
        '4',
        '--load',
        iterDir(ckpt, 2),
        '--metrics',
        `${plan}.b.jsonl`,
        '--quiet',
      );
      expect(resumed.err).toBe('');
      const a = losses(`${plan}.a.jsonl`);
      const b = losses(`${plan}.b.jsonl`);
      expect(b.map((x) => x.step)).toEqual([3, 4]);
      expect(b.map((x) => x.loss)).toEqual(a.slice(2).map((x) => x.loss));
      if (flags.includes('--bf16')) {
        // the saved weights are the fp32 masters: trained values bf16 cannot hold are there
        const t = readSafetensors(join(iterDir(ckpt, 2), 'model.safetensors')).tensors;
        const w = t.get('model.layers.0.self_attn.q_proj.weight')!;
        const bits = new Uint32Array((w.data as Float32Array).slice().buffer);
        expect(w.dtype).toBe('F32');
        expect(bits.some((u) => (u & 0xffff) !== 0)).toBe(true);
      }
    },
    120_000,
  );
});
