// The viz app's shell: a plan selector, the four views as tabs (each mounted on first use), and
// the data source — the local server's /api, or the JSON a self-contained page embeds in
// <script id="lfc-viz-data">. The URL's hash keeps the tab and plan (#timeline/1), so a reload
// or a shared link opens the same view.

import type { VizEmbedded } from '../model.js';
import { mountCompare } from './compare/view.js';
import { mountGraph } from './graph/view.js';
import { mountMemory } from './memory/view.js';
import { embeddedSource, serverSource, type VizSource } from './source.js';
import { mountTimeline } from './timeline/view.js';
import type { MountView, View, ViewContext } from './view.js';
import './style.css';

const VIEWS: Readonly<Record<string, MountView>> = {
  graph: mountGraph,
  timeline: mountTimeline,
  memory: mountMemory,
  compare: mountCompare,
};

function source(): VizSource {
  const embedded = document.getElementById('lfc-viz-data');
  return embedded?.textContent
    ? embeddedSource(JSON.parse(embedded.textContent) as VizEmbedded)
    : serverSource();
}

/** shows an error in the page's banner, and on the console for the browser tests */
function fail(e: unknown): void {
  const box = document.querySelector<HTMLElement>('.error')!;
  box.textContent = e instanceof Error ? e.message : String(e);
  box.hidden = false;
  console.error(e);
}

async function main(): Promise<void> {
  const src = source();
  const plans = await src.plans();
  const ctx: ViewContext = { source: src, plans };
  const planSelect = document.querySelector<HTMLSelectElement>('select.plan')!;
  for (const p of plans)
    planSelect.append(new Option(`${p.index}: ${p.title} — ${p.dir}`, String(p.index)));
  const mounted = new Map<string, View>();
  const shown = new Map<string, number>();
  const state = { view: 'graph', plan: 0 };
  const [hashView, hashPlan] = location.hash.slice(1).split('/');
  if (hashView in VIEWS) state.view = hashView;
  if (Number(hashPlan) >= 0 && Number(hashPlan) < plans.length) state.plan = Number(hashPlan);

  const show = async (): Promise<void> => {
    const { view, plan } = state;
    history.replaceState(null, '', `#${view}/${plan}`);
    planSelect.value = String(plan);
    document.querySelector('.plan-layout')!.textContent = plans[plan].layout;
    for (const b of document.querySelectorAll<HTMLButtonElement>('button.tab'))
      b.classList.toggle('active', b.dataset.view === view);
    for (const s of document.querySelectorAll<HTMLElement>('section.view'))
      s.hidden = s.id !== view;
    let v = mounted.get(view);
    if (!v) mounted.set(view, (v = VIEWS[view](document.getElementById(view)!, ctx)));
    if (shown.get(view) === plan) return;
    shown.set(view, plan);
    await v.show(plan);
  };
  planSelect.addEventListener('change', () => {
    state.plan = Number(planSelect.value);
    show().catch(fail);
  });
  for (const b of document.querySelectorAll<HTMLButtonElement>('button.tab'))
    b.addEventListener('click', () => {
      state.view = b.dataset.view!;
      show().catch(fail);
    });
  await show();
}

main().catch(fail);
