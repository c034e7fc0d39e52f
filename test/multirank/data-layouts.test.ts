// Datasets under parallel layouts (dp 2, tp 2, pp 2, level 3, the ViT balance): every rank of a
// data-parallel replica reads that replica's samples, the same ones, and the replicas together
// read each sample exactly once per epoch
// (counted from each rank's --data-log); the global batch is the same under every layout, so the
// first step's loss equals the one-rank run's.

import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { cli } from '../helpers.js';
import { configsDir } from '../../compiler/paths.js';
import { demoDataset } from '../../runtime/data/demo-dataset.js';

const dir = mkdtempSync(join(tmpdir(), 'lfc-data-layouts-'));
const SAMPLES = 48;
const BATCH = ['--global-batch-size', '4', '--micro-batch-size', '1'];
let jsonl = '';

interface Logged {
  step: number;
  replica: number;
  samples: { position: number; dataset: number; index: number }[][];
}

const LAYOUTS = [
  { name: 'one', ranks: 1, flags: [] as string[] },
  { name: 'dp2', ranks: 2, flags: [] },
  { name: 'tp2', ranks: 2, flags: ['--tp', '2'] },
  { name: 'pp2', ranks: 2, flags: ['--pp', '2'] },
  {
    name: 'level3-tp2-pp2',
    ranks: 4,
    flags: ['--tp', '2', '--pp', '2', '--enable-full-hetero-dp'],
  },
  // images encoded away from their microbatch's rank: each rank still reads its own replica's
  { name: 'vit-balance-dp2', ranks: 2, flags: ['--use-vit-dp-balance'] },
] as const;

const firstLoss = new Map<string, number>();
const losses = new Map<string, number[]>();
const lossesOf = (file: string) =>
  readFileSync(file, 'utf8')
    .trim()
    .split('\n')
    .map((l) => (JSON.parse(l) as { loss: number }).loss);

beforeAll(async () => {
  jsonl = (await demoDataset(join(dir, 'demo'), SAMPLES, 9)).train;
}, 60_000);

describe('the ranks together read each sample once per epoch', () => {
  it.each(LAYOUTS)(
    '$name',
    async ({ name, ranks, flags }) => {
      const plan = join(dir, name);
      const c = await cli(
        'compile',
        'tiny-vlm-moe',
        ...BATCH,
        '--nproc-per-node',
        String(ranks),
        ...flags,
        '-o',
        plan,
      );
      expect(c.err).toBe('');
      const log = join(plan, 'data-log');
      const r = await cli(
        'run',
        plan,
        ...(ranks > 1 ? ['--nproc-per-node', String(ranks)] : []),
        '--data-path',
        jsonl,
        '--tokenizer-model',
        configsDir('tokenizers', 'tiny'),
        '--train-iters',
        '3',
        '--data-log',
        log,
        '--quiet',
      );
      expect(r.err).toBe('');
      expect(r.code).toBe(0);
      const byRank = Array.from({ length: ranks }, (_, k) =>
        readFileSync(join(log, `rank-${k}.jsonl`), 'utf8')
          .trim()
          .split('\n')
          .map((l) => JSON.parse(l) as Logged),
      );
      // the ranks of a replica read the same samples; one rank speaks for each replica
      const replicas = new Map<number, Logged[]>();
      for (const steps of byRank) {
        const replica = steps[0].replica;
        const seen = replicas.get(replica);
        if (seen) expect(steps).toEqual(seen);
        else replicas.set(replica, steps);
      }
      const read = [...replicas.values()].flatMap((steps) =>
        steps.flatMap((s) => s.samples.flat()),
      );
      // three steps of 4 microbatches of several samples pass one epoch: its positions are read
      // once each, and they are the epoch's samples, each once
      const epoch = read.filter((s) => s.position < SAMPLES);
      expect(epoch.map((s) => s.position).sort((a, b) => a - b)).toEqual([
        ...Array(SAMPLES).keys(),
      ]);
      expect(epoch.map((s) => s.index).sort((a, b) => a - b)).toEqual([...Array(SAMPLES).keys()]);
      expect(new Set(read.map((s) => s.position)).size).toBe(read.length);
      losses.set(name, lossesOf(join(plan, 'metrics.jsonl')));
      firstLoss.set(name, losses.get(name)![0]);
      const one = firstLoss.get('one')!;
      expect(Math.abs(firstLoss.get(name)! - one) / one).toBeLessThan(1e-5);
    },
    240_000,
  );

  it('an evaluation on the validation split gives the one-rank figures under dp 2, pp 2 and level 3', async () => {
    const evalOf = async (name: string, ranks: number) => {
      const metrics = join(dir, `${name}-eval.jsonl`);
      const r = await cli(
        'run',
        join(dir, name),
        ...(ranks > 1 ? ['--nproc-per-node', String(ranks)] : []),
        '--data-path',
        jsonl,
        '--tokenizer-model',
        configsDir('tokenizers', 'tiny'),
        '--split',
        '75,25,0',
        '--train-iters',
        '2',
        '--eval-interval',
        '1',
        '--eval-iters',
        '2',
        '--metrics',
        metrics,
        '--quiet',
      );
      expect(r.err).toBe('');
      expect(r.code).toBe(0);
      const lines = readFileSync(metrics, 'utf8')
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l) as Record<string, number>);
      // each step's line, then its evaluation's
      expect(lines.map((l) => l.step ?? `eval ${l.eval_after_step}`)).toEqual([
        1,
        'eval 1',
        2,
        'eval 2',
      ]);
      return lines.filter((l) => 'eval_after_step' in l).map((l) => l.validation_loss);
    };
    const one = await evalOf('one', 1);
    expect(one[1]).not.toBe(one[0]); // the weights moved between the two
    for (const [name, ranks] of [
      ['dp2', 2],
      ['pp2', 2],
      ['level3-tp2-pp2', 4],
    ] as const) {
      const got = await evalOf(name, ranks);
      got.forEach((v, k) =>
        expect(Math.abs(v - one[k]) / one[k], `${name} eval ${k}`).toBeLessThan(1e-5),
      );
    }
  }, 240_000);

  it('a checkpoint saved under dp 2 resumes on one rank: step 3 continues, same data', async () => {
    const data = ['--data-path', jsonl, '--tokenizer-model', configsDir('tokenizers', 'tiny')];
    const save = join(dir, 'dp2-ckpt');
    const a = await cli(
      'run',
      join(dir, 'dp2'),
      '--nproc-per-node',
      '2',
      ...data,
      '--train-iters',
      '2',
      '--save',
      save,
      '--metrics',
      join(dir, 'dp2-first.jsonl'),
      '--quiet',
    );
    expect(a.code).toBe(0);
    const metrics = join(dir, 'resumed.jsonl');
    const b = await cli(
      'run',
      join(dir, 'one'),
      ...data,
      '--train-iters',
      '3',
      '--load',
      save,
      '--metrics',
      metrics,
      '--quiet',
    );
    expect(b.err).toBe('');
    const [step3] = lossesOf(metrics);
    const straight = losses.get('one')![2];
    expect(Math.abs(step3 - straight) / straight).toBeLessThan(1e-5);
  }, 120_000);
});
