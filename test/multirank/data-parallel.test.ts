// Every layout against one rank: the data-parallel plans of tiny-vlm and tiny-vlm-moe, launched on
// 2 local ranks (`lfc run --nproc-per-node 2`), train the same 3 steps as one rank running the
// whole global batch: losses within 1e-5 relative, every parameter after step 3 within 1e-4
// relative L2.
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { cli, relL2 } from '../helpers.js';
import { iterDir } from '../../runtime/checkpoint.js';
import { readSafetensors } from '../../runtime/safetensors.js';

const dir = mkdtempSync(join(tmpdir(), 'lfc-dp-'));
const MODELS = [
  ['tiny-vlm', []],
  ['tiny-vlm-moe', []],
] as const;

beforeAll(async () => {
  for (const [model, overrides] of MODELS) {
    const dp = await cli(
      'compile',
      model,
      ...overrides,
      '--nproc-per-node',
      '2',
      '-o',
      join(dir, `${model}.dp2`),
    );
    expect(dp.err).toBe('');
    const one = await cli(
      'compile',
      model,
      ...overrides,
      '--global-batch-size',
      '2',
      '-o',
      join(dir, `${model}.one`),
    );
    expect(one.err).toBe('');
  }
}, 120_000);

function metrics(path: string): { loss: number; ce_loss: number; grad_norm: number }[] {
  return readFileSync(path, 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l));
}

describe('data parallel on 2 ranks = one rank with the global batch', () => {
  it.each(MODELS.map(([m]) => m))(
    '%s: 3 steps, losses and parameters',
    async (model) => {
      const one = join(dir, `${model}.one`);
      const dp = join(dir, `${model}.dp2`);
      const r1 = await cli('run', one, '--steps', '3', '--save', join(one, 'ckpt'), '--quiet');
      expect(r1.code).toBe(0);
      const r2 = await cli(
        'run',
        dp,
        '--nproc-per-node',
        '2',
        '--steps',
        '3',
        '--save',
        join(dp, 'ckpt'),
        '--quiet',
      );
      expect(r2.err).toBe('');
      expect(r2.code).toBe(0);
      expect(r2.out).toMatch(
        /on 2 ranks to step 3.*\npeak memory per rank \(MiB\): r0 \d+, r1 \d+/,
      );
      // each rank's log says how its communicators move data: one machine, shared memory
      for (const r of [0, 1]) {
        const log = readFileSync(join(dp, 'logs', `rank-${r}.log`), 'utf8').split('\n');
        expect(log.find((l) => l.startsWith(`rank ${r} collectives: `))).toMatch(
          /dp\[0\]\/grad[^;]* over shared memory/,
        );
      }

      const m1 = metrics(join(one, 'metrics.jsonl'));
      const m2 = metrics(join(dp, 'metrics.jsonl'));
      expect(m2).toHaveLength(3);
      m2.forEach((m, i) => {
        expect(Math.abs(m.loss - m1[i].loss) / m1[i].loss).toBeLessThan(1e-5);
        expect(Math.abs(m.grad_norm - m1[i].grad_norm) / m1[i].grad_norm).toBeLessThan(1e-4);
      });

      const p1 = readSafetensors(join(iterDir(join(one, 'ckpt'), 3), 'model.safetensors')).tensors;
      const p2 = readSafetensors(join(iterDir(join(dp, 'ckpt'), 3), 'model.safetensors')).tensors;
      expect([...p2.keys()].sort()).toEqual([...p1.keys()].sort());
      const worst = Math.max(
        ...[...p1].map(([name, t]) =>
          relL2(p2.get(name)!.data as Float32Array, t.data as Float32Array),
        ),
      );
      expect(worst).toBeLessThan(1e-4);
    },
    120_000,
  );

  it('a plan launched with another number of ranks is refused in one line', async () => {
    const r = await cli('run', join(dir, 'tiny-vlm.dp2'), '--nproc-per-node', '4', '--steps', '1');
    expect(r.code).toBe(2);
    expect(r.err.trim().split('\n')).toHaveLength(1);
    expect(r.err).toMatch(
      /is a plan for 2 ranks \(compiled for --nnodes 1 × --nproc-per-node 2\); this launch starts 4 \(--nnodes 1 × --nproc-per-node 4\)/,
    );
  });
});
