// bench/viz: how fast lfc viz's app draws a large plan in headless Chromium (Debian's, through
// playwright-core): qwen3-vl-235b-a22b on 1024 GPUs (128 nodes × 8; tp 4, pp 8, vpp 2, ep 16,
// global batch 1024, sequence 32768), the plan bench/compile.ts times.
//
//   npx tsx bench/viz.ts [--runs 5] [--layout 235b|30b-level3] [--screenshots DIR]
//
// --screenshots DIR saves each view at 1280×800 in DIR (<layout>-graph.png, …); with 30b-level3
// the article's base line (hetero TP, level 1) is compiled too, for the compare view.
//
// Figures, medians of --runs page loads at 1280×800:
// - graph: from navigation to the graph view drawn (data-ready), modules folded, rank 0's
//   program: the page's load, the fetch, the fold and the layout in its worker, the SVG;
// - timeline: the same for rank 0's timeline (canvas);
// each with the server's answers already made (the browser's part), and the first answer's
// making apart (the Node side: folding the program into its graph, simulating the step).
// Target (issue 21): each first render under 2 s.

import { execFileSync } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { chromium } from 'playwright-core';
import { setupOrExit } from '../scripts/setup.mjs';
import { openPlans } from '../viz/bundle/index.js';
import { serve } from '../viz/server.js';
import { benchDir } from './temp-dir.js';

const LAYOUTS: Record<string, string[]> = {
  '235b': [
    'qwen3-vl-235b-a22b',
    ...['--nnodes', '128', '--nproc-per-node', '8', '--tp', '4', '--pp', '8', '--vpp', '2'],
    ...['--ep', '16', '--seq-length', '32768', '--global-batch-size', '1024'],
  ],
  '30b-level3': [
    'qwen3-vl-30b-a3b',
    ...['--nnodes', '4', '--nproc-per-node', '8', '--tp', '4', '--pp', '2', '--ep', '4'],
    ...['--seq-length', '32768', '--global-batch-size', '64', '--use-distributed-optimizer'],
    ...['--bf16', '--hardware', 'a800', '--data-profile', 'configs/data/article.yaml'],
    ...['--enable-full-hetero-dp', 'model.image_encoder.tensor_model_parallel_size=1'],
  ],
};

function arg(name: string, def: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : def;
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
const time = <T>(f: () => T): [T, number] => {
  const t0 = performance.now();
  const r = f();
  return [r, performance.now() - t0];
};

setupOrExit('bench viz');
const runs = Number(arg('runs', '5'));
const layout = arg('layout', '235b');
const dir = join(benchDir('lfc-bench-viz-'), 'plan');
process.stdout.write(`compiling ${layout} (lfc compile, --no-advice)…\n`);
execFileSync(
  process.execPath,
  ['bin/lfc.js', 'compile', ...LAYOUTS[layout], '--no-advice', '-o', dir],
  {
    stdio: ['ignore', 'ignore', 'inherit'],
  },
);

const shotsDir = arg('screenshots', '');
const dirs = [dir];
if (shotsDir && layout === '30b-level3') {
  // the base line beside it, for the compare view
  const base = LAYOUTS[layout].filter((a) => a !== '--enable-full-hetero-dp');
  dirs.push(join(dir, '..', 'base'));
  execFileSync(process.execPath, ['bin/lfc.js', 'compile', ...base, '--no-advice', '-o', dirs[1]], {
    stdio: ['ignore', 'ignore', 'inherit'],
  });
}
const [bundles, openMs] = time(() => openPlans(dirs));
const [bundle] = bundles;
const program = bundle.plan.rankPrograms[0];
const instructions = bundle.programs.get(program)!.instructions.length;
const [, summaryMs] = time(() => bundles.map((b) => b.summary()));
const [graph, graphMs] = time(() => bundle.graph(program));
const [timeline, timelineMs] = time(() => bundle.timeline(0));
const server = await serve(bundles, 0);
const browser = await chromium.launch({
  executablePath: '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
});
const figures: Record<string, number[]> = { graph: [], timeline: [] };
let nodes = 0;
try {
  for (let run = 0; run < runs; run++)
    for (const view of ['graph', 'timeline']) {
      const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
      const t0 = performance.now();
      await page.goto(`${server.url}#${view}/0`);
      await page.waitForSelector(`#${view}[data-ready]`, { timeout: 120_000 });
      figures[view].push(performance.now() - t0);
      if (view === 'graph') nodes = Number(await page.getAttribute('#graph', 'data-nodes'));
      await page.close();
    }
  if (shotsDir) {
    mkdirSync(shotsDir, { recursive: true });
    for (const view of [
      'graph',
      'timeline',
      'memory',
      ...(bundles.length > 1 ? ['compare'] : []),
    ]) {
      const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
      await page.goto(`${server.url}#${view}/0`);
      await page.waitForSelector(`#${view}[data-ready]`, { timeout: 120_000 });
      const file = join(shotsDir, `${layout}-${view}.png`);
      await page.screenshot({ path: file });
      process.stdout.write(`wrote ${file}\n`);
      await page.close();
    }
  }
} finally {
  await browser.close();
  await server.close();
}

const ms = (x: number) => `${x.toFixed(0)} ms`;
process.stdout.write(
  [
    `${bundle.summary().title}: rank 0's program ${program}, ${instructions} instructions`,
    `node side (once): open the plan ${ms(openMs)}, summarize it ${ms(summaryMs)}, fold its graph ${ms(graphMs)} (${graph.nodes.length} nodes, ${graph.edges.length} edges), rank 0's timeline ${ms(timelineMs)} (${timeline.events.start.length} events, the step simulated)`,
    `first render in headless Chromium, median of ${runs} (min–max):`,
    ...Object.entries(figures).map(
      ([view, xs]) =>
        `  ${view.padEnd(8)} ${ms(median(xs))} (${ms(Math.min(...xs))}–${ms(Math.max(...xs))})${view === 'graph' ? `, ${nodes} nodes drawn (modules folded)` : ''}   target < 2000 ms`,
    ),
  ].join('\n') + '\n',
);
