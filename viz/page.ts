// The page `lfc viz` writes: one self-contained HTML file (no server, no network), its data
// embedded as JSON and drawn by viz/client.js with viz/style.css, both inlined.

import { readFileSync } from 'node:fs';
import { projectRoot } from '../compiler/paths.js';
import type { VizData } from './data.js';

const read = (name: string) => readFileSync(`${projectRoot()}/viz/${name}`, 'utf8');

/** JSON that cannot end its script element early */
const embed = (x: unknown) => JSON.stringify(x).replace(/</g, '\\u003c');

export function renderPage(data: VizData): string {
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>lfc viz: ${data.title.replace(/</g, '&lt;')}</title>
<style>
${read('style.css')}
</style>
</head>
<body>
<h1 id="title"></h1>
<div class="summary" id="summary"></div>
<h2>Ranks, by program</h2>
<div id="ranks"></div>
<h2>Pipeline stages</h2>
<ul id="stages"></ul>
<h2>Memory per rank (<span id="memory-unit"></span>)</h2>
<table id="memory"></table>
<h2>Timeline</h2>
<div class="source" id="source"></div>
<div class="controls">zoom <input id="zoom" type="range" min="1" max="40" value="1"> <span id="legend"></span></div>
<div id="timeline-wrap"></div>
<h2>Programs by module</h2>
<table id="modules"></table>
<script type="application/json" id="data">${embed(data)}</script>
<script>
${read('client.js')}
</script>
</body>
</html>
`;
}
