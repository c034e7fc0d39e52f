// `lfc run --dump-step` under every multi-rank layout writes the one-rank dump: tiny-vlm-moe
// compiled for local CPU ranks dumps its first step, and rank 0's assembled files must hold the
// one-rank dump's tensors under its names — weights and batch files byte for byte, every gradient
// (summed over the global batch, before clipping) within 1e-4 of its tensor's max-abs, and
// step.json's loss and gradient norm within 1e-5 relative. The one-rank plan takes the same
// global batch (4 microbatches of one sample), so one one-rank run serves every layout.

import { existsSync, mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { cli, DEMO_LAYOUT } from '../helpers.js';
import { readSafetensors } from '../../runtime/safetensors.js';

const dir = mkdtempSync(join(tmpdir(), 'lfc-dump-'));
const MODEL = 'tiny-vlm-moe';
const BATCH = ['--global-batch-size', '4', '--micro-batch-size', '1'];
const GRAD_TOLERANCE = 1e-4;

interface Layout {
  readonly name: string;
  readonly ranks: number;
  readonly flags: readonly string[];
}

const LAYOUTS: readonly Layout[] = [
  { name: 'dp2', ranks: 2, flags: [] },
  { name: 'tp2', ranks: 2, flags: ['--tp', '2'] },
  { name: 'tp2-sp', ranks: 2, flags: ['--tp', '2', '--sequence-parallel'] },
  { name: 'pp2', ranks: 2, flags: ['--pp', '2'] },
  { name: 'pp2-vpp2', ranks: 2, flags: ['--pp', '2', '--vpp', '2'] },
  { name: 'ep2', ranks: 2, flags: ['--ep', '2'] },
  { name: 'ep4', ranks: 4, flags: ['--ep', '4'] },
  { name: 'tp2-pp2', ranks: 4, flags: ['--tp', '2', '--pp', '2'] },
  { name: 'dist-opt-dp2', ranks: 2, flags: ['--use-distributed-optimizer'] },
  // the encoder levels: ranks of one TP group run different programs
  { name: 'level2-tp2', ranks: 2, flags: ['--tp', '2', '--enable-encoder-hetero-dp'] },
  {
    name: 'level3-tp2-pp2',
    ranks: 4,
    flags: ['--tp', '2', '--pp', '2', '--enable-full-hetero-dp'],
  },
  {
    name: 'level3-a2a-overlap',
    ranks: 4,
    flags: [...DEMO_LAYOUT],
  },
  // images encoded away from their microbatch's rank, their gradients brought back
  { name: 'vit-balance-dp2', ranks: 2, flags: ['--use-vit-dp-balance'] },
];

const ONE = join(dir, 'one');
const dumpOf = (plan: string) => join(plan, 'dump');

/** `lfc run PLAN --dump-step OUT` for one step, on `ranks` local ranks */
async function dumpStep(plan: string, ranks: number, out: string, ...flags: string[]) {
  const launch = ranks > 1 ? ['--nproc-per-node', String(ranks)] : [];
  const r = await cli(
    'run',
    plan,
    ...launch,
    '--steps',
    '1',
    '--quiet',
    ...flags,
    '--dump-step',
    out,
  );
  expect(r.err).toBe('');
  expect(r.code).toBe(0);
}

async function compileAndDump(plan: string, ranks: number, flags: readonly string[]) {
  const c = await cli(
    'compile',
    MODEL,
    ...BATCH,
    '--nproc-per-node',
    String(ranks),
    ...flags,
    '-o',
    plan,
  );
  expect(c.err).toBe('');
  expect(c.code).toBe(0);
  await dumpStep(plan, ranks, dumpOf(plan));
}

const bytes = (dump: string, file: string) => readFileSync(join(dump, file));
const grads = (dump: string) => readSafetensors(join(dump, 'grads.safetensors')).tensors;
const stepJson = (dump: string) =>
  JSON.parse(readFileSync(join(dump, 'step.json'), 'utf8')) as Record<string, number>;

beforeAll(async () => {
  await compileAndDump(ONE, 1, []);
}, 60_000);

describe('--dump-step on local ranks writes the one-rank dump', () => {
  for (const l of LAYOUTS) {
    it(`${l.name} (${l.ranks} ranks${l.flags.length ? ' ' + l.flags.join(' ') : ''})`, async () => {
      const plan = join(dir, l.name);
      await compileAndDump(plan, l.ranks, l.flags);
      const want = dumpOf(ONE);
      const got = dumpOf(plan);
      expect(existsSync(join(got, '.shares')), 'the ranks’ shares are removed').toBe(false);
      for (const file of ['weights.safetensors', 'batch.safetensors'])
        expect(bytes(got, file).equals(bytes(want, file)), file).toBe(true);

      const g1 = grads(want);
      const g2 = grads(got);
      expect([...g2.keys()].sort()).toEqual([...g1.keys()].sort());
      let worst: [string, number] = ['', 0];
      for (const [name, t] of g1) {
        const a = t.data as Float32Array;
        const b = g2.get(name)!.data as Float32Array;
        expect(g2.get(name)!.shape).toEqual(t.shape);
        let maxAbs = 0;
        let maxErr = 0;
        for (let i = 0; i < a.length; i++) {
          maxAbs = Math.max(maxAbs, Math.abs(a[i]));
          maxErr = Math.max(maxErr, Math.abs(b[i] - a[i]));
        }
        const e = maxErr / Math.max(maxAbs, 1e-30);
        if (e > worst[1]) worst = [name, e];
      }
      console.log(`${l.name}: max grad error / max-abs ${worst[1].toExponential(2)} (${worst[0]})`);
      expect(worst[1], `worst: ${worst[0]}`).toBeLessThanOrEqual(GRAD_TOLERANCE);

      const s1 = stepJson(want);
      const s2 = stepJson(got);
      expect(s2.loss_tokens).toBe(s1.loss_tokens);
      for (const key of ['loss', 'ce_loss', 'aux_loss', 'grad_norm'])
        expect(Math.abs(s2[key] - s1[key]) / Math.abs(s1[key]), key).toBeLessThan(1e-5);
    }, 60_000);
  }

  it('--shuffle-images on several ranks moves the same images as on one rank (the demo control)', async () => {
    const dumps = { one: join(dir, 'one.shuffled'), dp2: join(dir, 'dp2.shuffled') };
    for (const [name, ranks] of [
      ['one', 1],
      ['dp2', 2],
    ] as const) {
      await dumpStep(join(dir, name), ranks, dumps[name], '--shuffle-images');
    }
    const shuffled = bytes(dumps.dp2, 'batch.safetensors');
    expect(shuffled.equals(bytes(dumps.one, 'batch.safetensors'))).toBe(true);
    expect(shuffled.equals(bytes(dumpOf(ONE), 'batch.safetensors'))).toBe(false);
    const [s1, s2] = [stepJson(dumps.one), stepJson(dumps.dp2)];
    expect(Math.abs(s2.loss - s1.loss) / s1.loss).toBeLessThan(1e-5);
  });
});
