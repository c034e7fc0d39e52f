// Bad precision and data-profile input on `lfc compile`: one line naming the problem, exit 2, no
// plan written; and what --bf16 and --data-profile change in the plan and the report.
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { cli, gpuSideProfile } from '../helpers.js';

const dir = mkdtempSync(join(tmpdir(), 'lfc-precision-'));

async function refused(...argv: string[]) {
  const out = join(dir, `plan-${argv.join('_').replace(/\W+/g, '_')}`);
  const r = await cli('compile', 'tiny-vlm', ...argv, '-o', out);
  expect(r.code).toBe(2);
  expect(r.out).toBe('');
  expect(r.err.trim().split('\n')).toHaveLength(1);
  expect(r.err).not.toMatch(/\n\s+at /); // no stack trace
  expect(existsSync(out)).toBe(false);
  return r.err;
}

describe('lfc compile: precision and data-profile errors', () => {
  it('--fp16 is refused, naming what it lacks and what to use', async () => {
    expect(await refused('--fp16')).toMatch(/--fp16 is not built: .*loss scaling.*use --bf16/);
  });

  it('an unknown dtype flag is an unknown option', async () => {
    expect(await refused('--bf17')).toMatch(/unknown option '--bf17'/);
  });

  it('--grad-reduce-in-bf16 needs --bf16; it contradicts --accumulate-allreduce-grads-in-fp32', async () => {
    expect(await refused('--grad-reduce-in-bf16')).toMatch(/--grad-reduce-in-bf16 needs --bf16/);
    expect(
      await refused('--bf16', '--grad-reduce-in-bf16', '--accumulate-allreduce-grads-in-fp32'),
    ).toMatch(/contradict/);
  });

  it('a malformed data profile names its file and field', async () => {
    const bad = join(dir, 'bad.yaml');
    writeFileSync(
      bad,
      'name: bad\ndescription: x\nreasons: x\nimages_per_sample: {1: -1}\nimage_grid: {"1x1": 1}\ntext_tokens: {8: 1}\n',
    );
    expect(await refused('--data-profile', bad)).toMatch(/bad\.yaml: images_per_sample/);
    expect(await refused('--data-profile', 'nonesuch')).toMatch(/nonesuch/);
  });

  it('--bf16 plans bf16 parameters with fp32 main gradients and master weights', async () => {
    const out = join(dir, 'bf16');
    const r = await cli('compile', 'tiny-vlm', '--bf16', '--json', '-o', out);
    expect(r.code).toBe(0);
    const j = JSON.parse(r.out) as {
      training: { precision?: { compute: string; grad: string } };
      memory: { programs: { parameters: number; gradients: number; optimizer: number }[] };
    };
    expect(j.training.precision).toEqual({ compute: 'bf16', grad: 'f32' });
    const [m] = j.memory.programs;
    // 2 bytes a parameter, 4 a gradient, 12 of optimizer state (master, exp_avg, exp_avg_sq)
    expect(m.gradients / m.parameters).toBeCloseTo(2, 2);
    expect(m.optimizer / m.parameters).toBeCloseTo(6, 2);
  });
});

describe('lfc run: an expert dispatch past its planned routing imbalance', () => {
  it('is a user error naming the bound and the flag that raises it', async () => {
    const plan = join(dir, 'tight');
    const c = await cli(
      'compile',
      'tiny-vlm-moe',
      '--nproc-per-node',
      '4',
      '--ep',
      '4',
      '--moe-routing-imbalance',
      '1',
      '-o',
      plan,
    );
    expect(c.code).toBe(0);
    const r = await cli('run', plan, '--nproc-per-node', '4', '--steps', '1', '--quiet');
    expect(r.code).toBe(2);
    expect(r.err).toMatch(
      /out_rows Rx\d+.*planned for 1× balanced routing: raise --moe-routing-imbalance/,
    );
    expect(r.err).not.toMatch(/internal error/);
  }, 60_000);
});

describe('lfc compile --moe-expected-imbalance', () => {
  const H800 = gpuSideProfile('h800');
  /** the plan's Rx symbols (an expert dispatch's received rows) and its simulated step */
  async function compiled(name: string, ...flags: string[]) {
    const plan = join(dir, name);
    const c = await cli(
      'compile',
      'tiny-vlm-moe',
      '--nproc-per-node',
      '2',
      '--ep',
      '2',
      '--moe-routing-imbalance',
      '1.5',
      // the GPU's side: on h800 as shipped this model's step is its host's, whatever the rows
      ...['--hardware', H800],
      ...flags,
      '--json',
      '-o',
      plan,
    );
    expect(c.err).toBe('');
    const p = JSON.parse(readFileSync(join(plan, 'plan.json'), 'utf8')) as {
      symbols: { name: string; bound: number; expected?: number }[];
    };
    const j = JSON.parse(c.out) as { forecast: { stepSeconds: number } };
    return { rx: p.symbols.filter((s) => /^Rx\d+$/.test(s.name)), step: j.forecast.stepSeconds };
  }

  it("prices each dispatch at the busiest rank's rows, within the planned bound", async () => {
    const balanced = await compiled('balanced');
    const skewed = await compiled('skewed', '--moe-expected-imbalance', '1.25');
    const past = await compiled('past', '--moe-expected-imbalance', '3');
    expect(balanced.rx.length).toBeGreaterThan(0);
    balanced.rx.forEach((s, i) => {
      expect(skewed.rx[i].bound).toBe(s.bound);
      expect(skewed.rx[i].expected).toBe(Math.round(1.25 * s.expected!));
      // past the bound the runtime refuses: the bound is the most a step can see (a symbol
      // expected at its bound states no expected size)
      expect(past.rx[i].expected ?? past.rx[i].bound).toBe(s.bound);
    });
    expect(skewed.step).toBeGreaterThan(balanced.step);
  }, 60_000);

  it('refuses a value below 1', async () => {
    const r = await cli('compile', 'tiny-vlm-moe', '--moe-expected-imbalance', '0.5');
    expect(r.code).toBe(2);
    expect(r.err).toMatch(/--moe-expected-imbalance/);
  });
});
