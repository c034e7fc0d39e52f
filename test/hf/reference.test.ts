// Acceptance 3 of the HF interop: a tiny Qwen model trained here, exported with
// `lfc export-hf --dtype fp32` and loaded back with `--load-hf` into a fresh run (a fresh
// optimizer) gives the loss the run it came from had on its next batch, exactly; and the
// independent PyTorch reference (test/reference/qwen_vl.py --load-hf) reads that directory by its
// Hugging Face names and reproduces the loss to 1e-5. Every step replays the fixture's batch, so
// "the next batch" is the same batch the reference scores. The reference needs /usr/bin/python3
// with torch (Debian's python3-torch): without it that one check is skipped, saying so.
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { compile, writePlan } from '../../compiler/pipeline.js';
import { projectRoot } from '../../compiler/paths.js';
import { iterDir } from '../../runtime/checkpoint.js';
import { readPlan } from '../../runtime/plan-io.js';
import { cli } from '../helpers.js';

const dir = mkdtempSync(join(tmpdir(), 'lfc-hf-reference-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const hasTorch =
  spawnSync('/usr/bin/python3', ['-c', 'import torch'], { stdio: 'ignore' }).status === 0;

const lossesOf = (metrics: string) =>
  readFileSync(metrics, 'utf8')
    .trim()
    .split('\n')
    .map((l) => (JSON.parse(l) as { loss: number }).loss);

describe.each(['qwen2.5-vl-tiny', 'qwen3-vl-moe-tiny'])(
  '%s: export-hf, then --load-hf',
  (model) => {
    const at = (...p: string[]) => join(dir, model, ...p);
    const batch = join(projectRoot(), 'test/fixtures', model, 'batch.safetensors');
    let nextLoss: number;

    it('a fresh run from the exported directory has the loss of the next step, exactly', async () => {
      const { plan, programs } = compile({ model, globalBatchSize: 3 });
      writePlan(at('plan'), plan, programs);
      const run = (...flags: string[]) =>
        cli('run', at('plan'), '--quiet', '--batch', batch, ...flags);
      // 3 steps, saved after 2: the third step's loss is the loss of the saved weights
      const r = await run(
        '--train-iters',
        '3',
        ...['--save', at('ckpt'), '--save-interval', '2', '--metrics', at('a.jsonl')],
      );
      expect(r.err).toBe('');
      nextLoss = lossesOf(at('a.jsonl'))[2];
      const e = await cli(
        'export-hf',
        at('hf'),
        ...['--load', iterDir(at('ckpt'), 2), '--plan', at('plan'), '--dtype', 'fp32'],
      );
      expect(e.code).toBe(0);
      const b = await run('--train-iters', '1', '--load-hf', at('hf'), '--metrics', at('b.jsonl'));
      expect(b.err).toBe('');
      expect(lossesOf(at('b.jsonl'))[0]).toBe(nextLoss);
    }, 120_000);

    it('the run says what it loads: the decoder from the directory, the rest kept at init', async () => {
      const r = await cli(
        'run',
        at('plan'),
        ...['--train-iters', '1', '--batch', batch, '--load-hf-decoder', at('hf')],
        ...['--metrics', at('c.jsonl')],
      );
      expect(r.code).toBe(0);
      const { plan } = readPlan(at('plan'));
      const decoder = plan.params.filter((p) => !p.name.startsWith('visual.')).length;
      const line = r.err.split('\n')[0];
      expect(line).toMatch(
        new RegExp(
          `^--load-hf-decoder \\S+: ${decoder} parameters; ${plan.params.length - decoder} keep their init \\(visual\\.`,
        ),
      );
    }, 60_000);

    it.skipIf(!hasTorch)(
      'the PyTorch reference reads it by its HF names: the same loss to 1e-5',
      () => {
        const out = execFileSync(
          '/usr/bin/python3',
          [
            join(projectRoot(), 'test/reference/qwen_vl.py'),
            '--load-hf',
            at('hf'),
            '--batch',
            batch,
          ],
          { encoding: 'utf8' },
        );
        const ref = JSON.parse(out) as { loss: number };
        const rel = Math.abs(ref.loss - nextLoss) / nextLoss;
        console.log(
          `${model}: reference loss ${ref.loss}, lfc ${nextLoss} (rel ${rel.toExponential(2)})`,
        );
        expect(rel).toBeLessThan(1e-5);
      },
      120_000,
    );
  },
);
