// lfc viz, drawn by a real browser: the page Chromium renders (headless, --dump-dom) holds a box
// per rank and one timeline box per instruction of its lanes, for a simulated timeline and for a
// measured one (lfc run --trace); bad input is a user error.
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { moduleOf, type VizData } from '../../viz/data.js';
import { cli } from '../helpers.js';

const dir = join(tmpdir(), 'viz');
const plan = join(dir, 'plan');
const FLAGS = ['--nproc-per-node', '4', '--pp', '2', '--vpp', '2', '--ep', '2'];

/** the page after its script ran, as Chromium serializes it */
function renderedDom(file: string): string {
  try {
    return execFileSync(
      'chromium',
      ['--headless', '--no-sandbox', '--disable-gpu', '--dump-dom', `file://${resolve(file)}`],
      {
        encoding: 'utf8',
        timeout: 60_000,
        maxBuffer: 256 * 2 ** 20,
        stdio: ['ignore', 'pipe', 'ignore'],
      },
    );
  } catch (e) {
    throw new Error(
      `chromium (npm test's setup installs it) could not render ${file}: ${(e as Error).message}`,
      { cause: e },
    );
  }
}

const embedded = (file: string): VizData =>
  JSON.parse(
    /<script type="application\/json" id="data">(.*?)<\/script>/s.exec(
      readFileSync(file, 'utf8'),
    )![1],
  ) as VizData;

beforeAll(async () => {
  const c = await cli('compile', 'tiny-vlm-moe', ...FLAGS, '--global-batch-size', '8', '-o', plan);
  expect(c.err).toBe('');
}, 60_000);

describe('lfc viz', () => {
  it('a simulated timeline: a box per instruction of the first rank of each program', async () => {
    const out = join(dir, 'sim.html');
    const r = await cli('viz', plan, '-o', out);
    expect(r.code).toBe(0);
    expect(r.out).toMatch(/simulated on h800/);
    const data = embedded(out);
    const p0 = JSON.parse(readFileSync(join(plan, 'programs', 'p0.json'), 'utf8')) as {
      instructions: unknown[];
    };
    const p1 = JSON.parse(readFileSync(join(plan, 'programs', 'p1.json'), 'utf8')) as {
      instructions: unknown[];
    };
    expect(data.timeline.events).toHaveLength(p0.instructions.length + p1.instructions.length);
    const dom = renderedDom(out);
    expect(dom).toContain(`data-drawn="${data.timeline.events.length}"`);
    expect(dom.match(/<rect /g)?.length).toBe(data.timeline.events.length);
    expect(dom.match(/class="rank"/g)?.length).toBe(4);
    expect(dom).toContain('stage 1: chunk 0: layer 1; chunk 1: layer 3');
  });

  it('a measured timeline from lfc run --trace: every rank, every instruction', async () => {
    const trace = join(dir, 'run.json');
    const run = await cli('run', plan, '--steps', '1', '--trace', trace, '--quiet');
    expect(run.err).toBe('');
    const out = join(dir, 'measured.html');
    const r = await cli('viz', plan, '--trace', trace, '-o', out);
    expect(r.out).toMatch(/measured/);
    const data = embedded(out);
    expect(new Set(data.timeline.lanes.map((l) => l.rank))).toEqual(new Set([0, 1, 2, 3]));
    const dom = renderedDom(out);
    expect(dom.match(/<rect /g)?.length).toBe(data.timeline.events.length);
  }, 60_000);

  it('refuses a file that is not a trace, and another plan’s trace', async () => {
    const notTrace = join(plan, 'plan.json');
    const r = await cli('viz', plan, '--trace', notTrace);
    expect(r.code).toBe(2);
    expect(r.err).toMatch(/no traceEvents/);
    const one = join(dir, 'one');
    await cli('compile', 'tiny-vlm', '-o', one);
    const r2 = await cli('viz', one, '--trace', join(dir, 'run.json'));
    expect(r2.code).toBe(2);
    expect(r2.err).toMatch(/is not a rank of this plan|instruction \d+ of p0/);
  });

  it('folds scopes to their layer or block', () => {
    expect(moduleOf('model.layers.3.mlp.experts')).toBe('model.layers.3');
    expect(moduleOf('visual.blocks.12.attn')).toBe('visual.blocks.12');
    expect(moduleOf('visual.merger.mlp')).toBe('visual.merger');
    expect(moduleOf('optimizer')).toBe('optimizer');
  });
});
