// lfc viz's app in a real browser (Debian's Chromium, driven by playwright-core): three layouts of
// tiny-vlm-moe on 4 ranks (the encoder levels 1, 2 and 3, decoder tp 2, ep 2) served by the local
// server. Each view loads a plan, draws it and answers one interaction — a module unfolds, the
// timeline zooms, a hover shows the tooltip, the compared plans switch — with no console error.
// At level 3 the graph shows the hand-off's gather_v and scatter_v with their groups and the
// timeline the three phases of full separation. Screenshots (1280×800) go to artifacts/viz/.
import { spawn } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { chromium, type Browser, type Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { projectRoot } from '../../compiler/paths.js';
import { openPlans } from '../../viz/bundle/index.js';
import { serve, type VizServer } from '../../viz/server.js';
import { cli } from '../helpers.js';

const dir = join(tmpdir(), 'viz-app');
const LAYOUT = ['--nproc-per-node', '4', '--tp', '2', '--ep', '2', '--global-batch-size', '8'];
// the encoder levels 1, 2 and 3, and a pipeline (pp 2 in place of tp 2)
const LEVELS = [
  [],
  ['--enable-encoder-hetero-dp'],
  ['--enable-full-hetero-dp'],
  ['--tp', '1', '--pp', '2'],
];
const plans = LEVELS.map((_, i) => join(dir, `plan${i}`));
const shots = join(projectRoot(), 'artifacts', 'viz');
/** the level-3 plan's index in the app, and the pipeline's */
const L3 = 2;
const PP = 3;

let server: VizServer;
let browser: Browser;

beforeAll(async () => {
  for (const [i, flags] of LEVELS.entries()) {
    const c = await cli(
      'compile',
      'tiny-vlm-moe',
      ...LAYOUT,
      ...flags,
      '--no-advice',
      '--save-ir',
      '-o',
      plans[i],
    );
    expect(c.err).toBe('');
  }
  server = await serve(openPlans(plans), 0);
  browser = await chromium.launch({
    executablePath: '/usr/bin/chromium',
    // a root container without a GPU or a network: no sandbox, software rendering
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
  });
  mkdirSync(shots, { recursive: true });
}, 120_000);

afterAll(async () => {
  await browser?.close();
  await server?.close();
});

/** a page at 1280×800 that records every console error and warning and uncaught exception */
async function open(url: string): Promise<{ page: Page; problems: string[] }> {
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  const problems: string[] = [];
  page.on('console', (m) => {
    if (m.type() === 'error' || m.type() === 'warning') problems.push(`${m.type()}: ${m.text()}`);
  });
  page.on('pageerror', (e) => problems.push(`uncaught: ${e.message}`));
  await page.goto(url);
  return { page, problems };
}

/** the app on one view of one plan, drawn */
async function view(name: string, plan: number) {
  const o = await open(`${server.url}#${name}/${plan}`);
  await o.page.waitForSelector(`#${name}[data-ready]`, { timeout: 30_000 });
  return o;
}

async function finish(page: Page, problems: string[], shot: string): Promise<void> {
  await page.screenshot({ path: join(shots, `${shot}.png`) });
  await page.close();
  expect(problems).toEqual([]);
}

describe('lfc viz in Chromium', () => {
  it('graph: the hand-off gather_v and scatter_v with their groups; a module unfolds; the IR after a pass', async () => {
    const { page, problems } = await view('graph', L3);
    for (const op of ['gather_v', 'scatter_v']) {
      const groups = await page.$$eval(`#graph g.node.collective[data-op="${op}"]`, (nodes) =>
        nodes.map((n) => n.getAttribute('data-group')),
      );
      expect(groups.length, op).toBeGreaterThan(0);
      for (const g of groups) expect(g).toMatch(/^mp(=tp)?\[\d\]$/);
    }
    const root = page.locator('#graph');
    expect(await root.getAttribute('data-layout-in')).toBe('worker');
    await page.screenshot({ path: join(shots, 'graph-folded.png') });
    const before = Number(await root.getAttribute('data-nodes'));
    const module = await page.$eval('#graph g.node.folded', (n) => n.getAttribute('data-module'));
    await page.click(`#graph g.node.folded[data-module="${module}"]`);
    await page.waitForFunction(
      (n) => Number(document.querySelector('#graph')!.getAttribute('data-nodes')) > n,
      before,
    );
    await page.waitForSelector('#graph[data-ready]');
    await page.screenshot({ path: join(shots, 'graph-unfolded.png') });
    // the IR after tensor parallelism: its collectives name their group by kind
    await page.selectOption('#graph select.program', 'ir:tensor-parallel');
    await page.waitForSelector('#graph[data-ready] g.node.collective[data-group="tp"]');
    await finish(page, problems, 'graph-ir');
  });

  it('timeline: the three phases of full separation; zoom narrows the window; hover shows the tooltip', async () => {
    const { page, problems } = await view('timeline', L3);
    const labels = await page.$$eval('#timeline .mark.phase', (m) =>
      m.map((x) => x.getAttribute('data-label')),
    );
    expect(labels).toEqual(
      expect.arrayContaining(['encoder forward', 'decoder pipeline', 'encoder backward']),
    );
    const root = page.locator('#timeline');
    const span = async () =>
      Number(await root.getAttribute('data-view-end')) -
      Number(await root.getAttribute('data-view-start'));
    const whole = await span();
    await page.screenshot({ path: join(shots, 'timeline-step.png') });
    await page.click('#timeline button.zoom-in');
    await expect.poll(span).toBeLessThan(whole * 0.9);
    // sweep the canvas until the pointer is over an event (not a phase band or a bubble)
    const box = (await page.locator('#timeline canvas').first().boundingBox())!;
    const tooltip = page.locator('#timeline .tooltip');
    let shown = false;
    for (let y = box.y + 4; y < box.y + box.height && !shown; y += 6)
      for (let x = box.x + box.width * 0.3; x < box.x + box.width && !shown; x += box.width / 12) {
        await page.mouse.move(x, y);
        shown = (await tooltip.isVisible()) && /microbatch/.test((await tooltip.textContent())!);
      }
    expect(shown).toBe(true);
    expect(await tooltip.textContent()).toMatch(/bytes/);
    await finish(page, problems, 'timeline');
  });

  it('timeline: one rank per stage draws the pipeline, its stages and their bubbles', async () => {
    const { page, problems } = await view('timeline', PP);
    const root = page.locator('#timeline');
    const one = Number(await root.getAttribute('data-events'));
    await page.selectOption('#timeline select.rank', 'stages');
    await expect
      .poll(async () => Number(await root.getAttribute('data-events')))
      .toBeGreaterThan(one);
    await page.waitForSelector('#timeline[data-ready]');
    expect(await page.locator('#timeline .mark.bubble').count()).toBeGreaterThan(0);
    await finish(page, problems, 'timeline-stages');
  });

  it('memory: each program over the step, its peak and the device limit marked', async () => {
    const { page, problems } = await view('memory', L3);
    expect(await page.locator('#memory svg.memory-chart .peak').count()).toBeGreaterThan(0);
    expect(await page.locator('#memory svg.memory-chart .limit').count()).toBeGreaterThan(0);
    await finish(page, problems, 'memory');
  });

  it('compare: the levels side by side; switching a compared plan redraws', async () => {
    const { page, problems } = await view('compare', 0);
    const root = page.locator('#compare');
    expect(await root.getAttribute('data-plans')).toBe('0,1,2,3');
    expect(await page.locator('#compare table.compare-figures th').count()).toBeGreaterThan(3);
    await page.selectOption('#compare select.compare-plan[data-slot="1"]', '');
    await expect.poll(() => root.getAttribute('data-plans')).toBe('0,2,3');
    await finish(page, problems, 'compare');
  });

  it('a self-contained page (--output) draws from file:// with no server', async () => {
    const out = join(dir, 'page.html');
    const r = await cli('viz', plans[L3], '--output', out);
    expect(r.err).toBe('');
    expect(r.out).toContain(`open file://${resolve(out)}`);
    const { page, problems } = await open(`file://${out}#timeline/0`);
    await page.waitForSelector('#timeline[data-ready]', { timeout: 30_000 });
    await page.click('button.tab[data-view="graph"]');
    await page.waitForSelector('#graph[data-ready]', { timeout: 30_000 });
    // the layout ran off the main thread there too (a classic worker from a blob)
    expect(await page.getAttribute('#graph', 'data-layout-in')).toBe('worker');
    await finish(page, problems, 'self-contained');
  });
});

describe('lfc viz, the command', () => {
  it('serves on a port and prints its URL; stops on SIGTERM', async () => {
    const child = spawn(process.execPath, ['bin/lfc.js', 'viz', plans[0], '--port', '0'], {
      cwd: projectRoot(),
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    child.stdout.on('data', (d) => (out += d));
    await expect.poll(() => out, { timeout: 60_000 }).toMatch(/serving on (http:\S+)/);
    const url = /serving on (http:\S+)/.exec(out)![1];
    const res = await fetch(`${url}api/plans`);
    expect(((await res.json()) as { title: string }[])[0].title).toBe('tiny-vlm-moe on 4 ranks');
    expect((await fetch(`${url}api/plans/5`)).status).toBe(404);
    child.kill('SIGTERM');
    expect(await new Promise((done) => child.on('exit', done))).toBe(0);
  }, 90_000);

  it('refuses what it cannot do, naming it', async () => {
    const five = Array.from({ length: 5 }, () => plans[0]);
    expect(await cli('viz', ...five)).toMatchObject({
      code: 2,
      err: expect.stringMatching(/compares at most 4/),
    });
    expect(await cli('viz', plans[0], '--port', 'x')).toMatchObject({
      code: 2,
      err: expect.stringMatching(/--port x: not a port/),
    });
    expect(await cli('viz', plans[0], '--output', join(dir, 'x.html'), '--open')).toMatchObject({
      code: 2,
    });
    expect(await cli('viz', join(dir, 'nothing'), '--output', join(dir, 'y.html'))).toMatchObject({
      code: 2,
      err: expect.stringMatching(/no such plan directory/),
    });
  });
});
