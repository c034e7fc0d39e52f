// The Graph view: one program's dataflow, its numbered layers folded (fold.ts), laid out by dagre
// in a worker (layout-worker.ts) and drawn as SVG in a scrolling canvas: the wheel scrolls,
// ctrl+wheel (a pinch) zooms about the pointer, a drag pans. A folded module opens on a click
// and folds again from the bar of unfolded modules; collectives and p2p keep a thick outline
// and a label naming their group. Search highlights nodes; a click on an op shows its details.
//
// DOM contract (the app's browser tests read it): the root holds `select.program`,
// `select.color-by`, `input.search`, `button.fold-parts`, `button.fold-default`,
// `button.unfold-all`, a `.legend`, a `.unfolded` bar with `button.fold[data-module]`, and an SVG
// of `g.node` (data-op, data-scope, data-part, data-stage; folded ones `.folded[data-module]`;
// collectives `.collective[data-group][data-root]`) and `path.edge`; `.details` shows a clicked
// node. The root carries data-nodes, data-edges, data-render-ms, data-layout-in (worker, or page
// where the worker could not start) and, once drawn, data-ready.

import type { VizGraph, VizNode } from '../../model.js';
import {
  COLLECTIVE_STROKE,
  legend,
  Palette,
  PART_COLORS,
  PHASE_COLORS,
  STREAM_COLORS,
} from '../colors.js';
import {
  el,
  formatBytes,
  markReady,
  svg,
  type MountView,
  type View,
  type ViewContext,
} from '../view.js';
import {
  fold,
  foldModule,
  foldParts,
  indexScopes,
  laidOutEdges,
  matches,
  MODEL_PARTS,
  nodeLines,
  prefixes,
  truncate,
  UNFOLDED,
  unfoldModule,
  within,
  type DrawnNode,
  type FoldedGraph,
  type FoldState,
  type Part,
  type ScopeIndex,
} from './fold.js';
import type { LayoutFailure, LayoutReply, LayoutRequest } from './layout.js';
import LayoutWorker from './layout-worker.ts?worker&inline';
import './graph.css';

/** more drawn nodes than this are not laid out (dagre would take minutes): fold something first */
const MAX_DRAWN_NODES = 2500;

/** label lengths, characters: a node's title and its line of detail (scopes keep their tail) */
const TITLE_CHARS = 40;
const DETAIL_CHARS = 48;
/** node box: height, inner padding, the folded marker's width, px */
const NODE_HEIGHT = 38;
const PAD_X = 9;
const FOLD_MARK = 14;
const TITLE_FONT = '600 12px system-ui, -apple-system, "Segoe UI", sans-serif';
const DETAIL_FONT = '11px system-ui, -apple-system, "Segoe UI", sans-serif';

/** zoom limits, and the smallest scale the first view starts at (readable labels) */
const MIN_ZOOM = 0.02;
const MAX_ZOOM = 4;
const READABLE_ZOOM = 0.8;

type ColorBy = 'part' | 'stage' | 'stream' | 'phase';
const COLOR_BY: readonly ColorBy[] = ['part', 'stage', 'stream', 'phase'];
/** a folded module whose members differ in the coloured property */
const MIXED = 'mixed';
const MIXED_COLOR = '#d4d4d4';

export const mountGraph: MountView = (root, ctx) => new GraphView(root, ctx);

/** One drawn module that the user unfolded: the bar of unfolded modules folds it again. */
interface Unfolded {
  readonly module: string;
  readonly isPart: boolean;
}

/** What the SVG shows now: the folded graph, its layout and the elements drawn for it. */
interface Drawing {
  readonly folded: FoldedGraph;
  readonly layout: LayoutReply;
  readonly sizes: readonly { readonly width: number; readonly height: number }[];
  readonly nodeEls: readonly SVGGElement[];
  readonly edgeEls: readonly SVGPathElement[];
  /** per drawn node, the edges (indices) that touch it */
  readonly edgesAt: readonly number[][];
}

class GraphView implements View {
  // ---- elements
  private readonly programSelect = el('select', { class: 'program', 'aria-label': 'program' });
  private readonly colorSelect = el('select', { class: 'color-by', 'aria-label': 'colour by' });
  private readonly search = el('input', {
    class: 'search',
    type: 'search',
    placeholder: 'search op or scope (Enter: go to)',
    'aria-label': 'search',
  });
  private readonly matchCount = el('span', { class: 'match-count' });
  private readonly status = el('span', { class: 'graph-status' });
  private readonly legendBox = el('div', { class: 'graph-legend' });
  private readonly unfoldedBar = el('div', { class: 'unfolded' });
  private readonly notice = el('div', { class: 'notice', hidden: '' });
  /** the scrolling canvas, the drawing in it, and the details panel over it */
  private readonly stage = el('div', { class: 'graph-stage' });
  private readonly canvas = el('div', { class: 'graph-canvas' });
  private readonly svgEl = svg('svg', { class: 'graph-svg' });
  private readonly viewport = svg('g', { class: 'viewport' });
  private readonly details = el('div', { class: 'details', hidden: '' });

  // ---- state
  private plan = -1;
  private graph: VizGraph | null = null;
  private index: ScopeIndex | null = null;
  private state: FoldState = UNFOLDED;
  private unfolded: Unfolded[] = [];
  private drawing: Drawing | null = null;
  private selected = -1;
  /** request number: a load or layout older than the newest is dropped when it finishes */
  private seq = 0;
  private worker: Worker | null = null;
  /** the worker could not start (a module worker from a blob, on a file:// page): lay out here */
  private workerBroken = false;
  private workerAnswered = false;
  private readonly pending = new Map<number, LayoutRequest>();
  private readonly resolvers = new Map<number, [(r: LayoutReply) => void, (e: Error) => void]>();
  /** zoom: screen pixels per layout pixel (the canvas scrolls) */
  private zoom = 1;
  private readonly measure = document.createElement('canvas').getContext('2d');

  constructor(
    private readonly root: HTMLElement,
    private readonly ctx: ViewContext,
  ) {
    root.classList.add('graph-view');
    for (const c of COLOR_BY) this.colorSelect.append(new Option(c, c, c === 'part', c === 'part'));
    const button = (cls: string, text: string, title: string, onClick: () => void) => {
      const b = el('button', { class: cls, type: 'button', title }, text);
      b.addEventListener('click', onClick);
      return b;
    };
    const toolbar = el(
      'div',
      { class: 'graph-toolbar' },
      el('label', {}, 'program ', this.programSelect),
      el('label', {}, 'colour by ', this.colorSelect),
      this.search,
      this.matchCount,
      button('fold-parts', 'Fold to parts', 'encoder, projector and decoder as one node each', () =>
        this.refold(foldParts(this.state, MODEL_PARTS, true), []),
      ),
      button('fold-default', 'Default folding', 'every numbered layer as one node', () =>
        this.refold(this.index!.defaults, []),
      ),
      button('unfold-all', 'Unfold all', 'every op as a node (small programs)', () =>
        this.refold(UNFOLDED, []),
      ),
      button('fit', 'Fit', 'zoom to the whole graph', () => this.fit(true)),
      button('zoom-out', '−', 'zoom out (or ctrl+wheel)', () => this.zoomTo(this.zoom / 1.25)),
      button('zoom-in', '+', 'zoom in (or ctrl+wheel)', () => this.zoomTo(this.zoom * 1.25)),
      button('zoom-1', '1:1', 'zoom to 100%', () => this.zoomTo(1)),
      this.status,
    );
    this.canvas.append(this.svgEl);
    this.stage.append(this.canvas, this.details);
    this.svgEl.append(arrowDefs(), this.viewport);
    root.append(toolbar, this.legendBox, this.unfoldedBar, this.notice, this.stage);

    this.programSelect.addEventListener('change', () => {
      this.load(this.programSelect.value).catch(report);
    });
    this.colorSelect.addEventListener('change', () => this.recolor());
    this.search.addEventListener('input', () => this.highlight());
    this.search.addEventListener('keydown', (e) => {
      if (e.key === 'Enter') this.goToMatch();
    });
    this.listenPanZoom();
  }

  async show(plan: number): Promise<void> {
    this.plan = plan;
    const summary = this.ctx.plans[plan];
    // the programs, then the IR after each graph pass where the plan kept it (--save-ir)
    const programs = el('optgroup', { label: 'programs' });
    programs.append(
      ...summary.programs.map((p) => new Option(`${p.id} (${ranksLabel(p.ranks)})`, p.id)),
    );
    const ir = el('optgroup', { label: 'IR after a pass (one rank, one microbatch)' });
    ir.append(...summary.irPasses.map((pass) => new Option(`IR after ${pass}`, `ir:${pass}`)));
    this.programSelect.replaceChildren(programs, ...(summary.irPasses.length ? [ir] : []));
    const first = summary.ranks.find((r) => r.rank === 0)?.program ?? summary.programs[0]?.id;
    if (first === undefined) throw new Error(`plan ${plan} has no programs`);
    this.programSelect.value = first;
    await this.load(first);
  }

  /** fetches a program's graph and draws it with the default folding */
  private async load(program: string): Promise<void> {
    const seq = ++this.seq;
    delete this.root.dataset.ready;
    this.status.textContent = `loading ${program}…`;
    const graph = await this.ctx.source.graph(this.plan, program);
    if (seq !== this.seq) return;
    this.graph = graph;
    this.index = indexScopes(graph);
    this.search.value = '';
    await this.refold(this.index.defaults, []);
  }

  /** folds the graph by `state`, lays it out and draws it; refuses a graph too big to lay out */
  private async refold(state: FoldState, unfolded: Unfolded[]): Promise<void> {
    const { graph } = this;
    if (!graph) return;
    const t0 = performance.now();
    const folded = fold(graph, state);
    if (folded.nodes.length > MAX_DRAWN_NODES) {
      this.say(
        `that would draw ${folded.nodes.length.toLocaleString('en-US')} nodes, more than ` +
          `${MAX_DRAWN_NODES} can be laid out: unfold a smaller module`,
      );
      return;
    }
    this.say('');
    this.state = state;
    this.unfolded = unfolded;
    const seq = ++this.seq;
    delete this.root.dataset.ready;
    this.status.textContent = `laying out ${folded.nodes.length} nodes…`;
    const laid = laidOutEdges(folded);
    const sizes = folded.nodes.map((d) => this.nodeSize(d));
    const foldMs = performance.now() - t0;
    const layout = await this.layout({
      id: seq,
      nodes: sizes,
      edges: folded.edges.filter((_, e) => laid[e]).map(([a, b]) => [a, b] as const),
    });
    if (seq !== this.seq) return;
    this.draw(folded, laid, sizes, layout);
    const hubLines = laid.length - laid.reduce((s, v) => s + v, 0);
    const ms = performance.now() - t0;
    this.status.textContent =
      `${folded.nodes.length} nodes, ${folded.edges.length} edges` +
      (hubLines ? ` (${hubLines} from hubs, faint)` : '') +
      ` · ${graph.nodes.length.toLocaleString('en-US')} ops · fold ${foldMs.toFixed(0)} ms,` +
      ` layout ${layout.ms.toFixed(0)} ms`;
    this.root.dataset.renderMs = ms.toFixed(0);
    markReady(this.root, this.plan);
  }

  // ---- layout ----------------------------------------------------------------------------------

  /** lays `req` out in the worker, or on this thread where the worker cannot start */
  private layout(req: LayoutRequest): Promise<LayoutReply> {
    return new Promise((resolve, reject) => {
      this.resolvers.set(req.id, [resolve, reject]);
      if (this.workerBroken) {
        this.layoutHere(req);
        return;
      }
      this.pending.set(req.id, req);
      this.startWorker().postMessage(req);
    });
  }

  private startWorker(): Worker {
    if (this.worker) return this.worker;
    const worker = new LayoutWorker();
    worker.onmessage = (e: MessageEvent<LayoutReply | LayoutFailure>) => {
      this.workerAnswered = true;
      this.root.dataset.layoutIn = 'worker';
      const r = e.data;
      this.pending.delete(r.id);
      const [resolve, reject] = this.resolvers.get(r.id) ?? [];
      this.resolvers.delete(r.id);
      if ('error' in r) reject?.(new Error(`graph layout failed: ${r.error}`));
      else resolve?.(r);
    };
    worker.onerror = (e) => {
      e.preventDefault();
      if (this.workerAnswered) {
        for (const [, reject] of this.resolvers.values())
          reject(new Error(`graph layout worker: ${e.message}`));
        this.resolvers.clear();
        this.pending.clear();
        return;
      }
      // it never started: Chromium refuses a module worker from a blob on a file:// page
      this.workerBroken = true;
      worker.terminate();
      const waiting = [...this.pending.values()];
      this.pending.clear();
      for (const req of waiting) this.layoutHere(req);
    };
    return (this.worker = worker);
  }

  /** the same layout on the main thread (loaded on first need) */
  private layoutHere(req: LayoutRequest): void {
    const [resolve, reject] = this.resolvers.get(req.id)!;
    this.resolvers.delete(req.id);
    this.root.dataset.layoutIn = 'page';
    import('./layout.js').then(({ layoutGraph }) => resolve(layoutGraph(req)), reject);
  }

  /** a node's box: wide enough for its two lines (measured in their fonts) */
  private nodeSize(d: DrawnNode): { width: number; height: number } {
    const [title, detail] = labelText(d);
    const m = this.measure;
    let w: number;
    if (m) {
      m.font = TITLE_FONT;
      w = m.measureText(title).width;
      m.font = DETAIL_FONT;
      w = Math.max(w, m.measureText(detail).width);
    } else w = Math.max(title.length * 7.2, detail.length * 6.2);
    return {
      width: Math.ceil(w) + 2 * PAD_X + (d.kind === 'module' ? FOLD_MARK : 0) + 2,
      height: NODE_HEIGHT,
    };
  }

  // ---- drawing ---------------------------------------------------------------------------------

  private draw(
    folded: FoldedGraph,
    laid: Uint8Array,
    sizes: readonly { width: number; height: number }[],
    layout: LayoutReply,
  ): void {
    const edgeLayer = svg('g', { class: 'edges' });
    const nodeLayer = svg('g', { class: 'nodes' });
    const maxBytes = folded.edges.reduce((m, e) => Math.max(m, e[2]), 1);
    const edgesAt: number[][] = folded.nodes.map(() => []);
    let nextLaid = 0;
    const edgeEls = folded.edges.map(([a, b, bytes], e) => {
      edgesAt[a].push(e);
      edgesAt[b].push(e);
      const points = laid[e] ? layout.edges[nextLaid++] : hubLine(layout, sizes, a, b);
      const path = svg('path', {
        class: laid[e] ? 'edge' : 'edge hub',
        d: pathOf(points),
        'stroke-width': (1 + (3 * Math.log1p(bytes)) / Math.log1p(maxBytes)).toFixed(2),
        'marker-end': 'url(#lfc-graph-arrow)',
      });
      const t = svg('title');
      t.textContent = `${formatBytes(bytes)}: ${labelText(folded.nodes[a])[0]} → ${labelText(folded.nodes[b])[0]}`;
      path.append(t);
      edgeLayer.append(path);
      return path;
    });
    const nodeEls = folded.nodes.map((d, i) => {
      const g = this.nodeElement(d, i, sizes[i]);
      const { x, y } = layout.nodes[i];
      g.setAttribute(
        'transform',
        `translate(${(x - sizes[i].width / 2).toFixed(1)},${(y - sizes[i].height / 2).toFixed(1)})`,
      );
      nodeLayer.append(g);
      return g;
    });
    this.viewport.replaceChildren(edgeLayer, nodeLayer);
    this.drawing = { folded, layout, sizes, nodeEls, edgeEls, edgesAt };
    this.root.dataset.nodes = String(nodeEls.length);
    this.root.dataset.edges = String(edgeEls.length);
    this.selected = -1;
    this.details.hidden = true;
    this.recolor();
    this.highlight();
    this.drawUnfoldedBar();
    this.fit(false);
  }

  /** one node's group: its box, its two lines, and its data attributes */
  private nodeElement(
    d: DrawnNode,
    i: number,
    size: { width: number; height: number },
  ): SVGGElement {
    const [title, detail] = labelText(d);
    const [fullTitle, fullDetail] = nodeLines(d);
    const g = svg('g', { class: 'node', 'data-index': i });
    const rect = svg('rect', { class: 'box', width: size.width, height: size.height, rx: 4 });
    const tip = svg('title');
    g.append(tip, rect);
    if (d.kind === 'op') {
      const n = d.node;
      Object.assign(g.dataset, { op: n.op, scope: n.scope, part: n.part, stage: String(n.stage) });
      if (n.collective) {
        g.classList.add('collective');
        g.dataset.group = n.collective.group;
        if (n.collective.root !== undefined) g.dataset.root = String(n.collective.root);
        if (n.collective.peer !== undefined) g.dataset.peer = String(n.collective.peer);
        rect.setAttribute('stroke', COLLECTIVE_STROKE);
      }
      tip.textContent = `${fullTitle}\n${fullDetail}\n(click for details)`;
    } else {
      g.classList.add('folded');
      Object.assign(g.dataset, {
        op: 'module',
        module: d.module,
        scope: d.isPart ? '' : d.module,
        part: d.part,
        stage: String(d.stage),
      });
      rect.setAttribute('rx', '9');
      if (d.collectives > 0) {
        g.classList.add('has-collectives');
        if (d.groups.length === 1) g.dataset.group = d.groups[0];
        // a bar on the left edge in the collectives' colour: some are inside
        g.append(svg('rect', { class: 'coll-bar', x: 0, y: 4, width: 4, height: size.height - 8 }));
      }
      const plus = svg('text', { class: 'fold-mark', x: size.width - PAD_X, y: 24 });
      plus.textContent = '+';
      g.append(plus);
      tip.textContent =
        `${fullTitle}\n${fullDetail}\n${d.instructions.toLocaleString('en-US')} instructions` +
        ` in the step, phases ${d.phases.join(', ')}` +
        (d.groups.length ? `\ngroups: ${d.groups.join(', ')}` : '') +
        '\n(click to unfold)';
    }
    const t1 = svg('text', { class: 'l1', x: PAD_X, y: 16 });
    t1.textContent = title;
    const t2 = svg('text', { class: 'l2', x: PAD_X, y: 30 });
    t2.textContent = detail;
    g.append(t1, t2);
    return g;
  }

  /** fills the boxes by the colour-by choice, and redraws the legend */
  private recolor(): void {
    const drawing = this.drawing;
    if (!drawing) return;
    const by = this.colorSelect.value as ColorBy;
    const palette = paletteFor(by);
    const used = new Set<string>();
    drawing.folded.nodes.forEach((d, i) => {
      const key = colorKey(d, by);
      used.add(key);
      const color = palette.of(key);
      const rect = drawing.nodeEls[i].querySelector('rect.box')!;
      rect.setAttribute('fill', color);
      if (!drawing.nodeEls[i].classList.contains('collective')) rect.setAttribute('stroke', color);
    });
    const rows: [string, string][] = palette.entries().filter(([k]) => used.has(k));
    const box = legend([...rows, ['collective / p2p (outline)', COLLECTIVE_STROKE]], by);
    const outline = box.querySelectorAll<HTMLElement>('.swatch');
    outline[outline.length - 1].classList.add('outline');
    this.legendBox.replaceChildren(box);
  }

  private drawUnfoldedBar(): void {
    if (this.unfolded.length === 0) {
      this.unfoldedBar.replaceChildren(
        el('span', { class: 'hint' }, 'click a folded module (+) to unfold it'),
      );
      return;
    }
    this.unfoldedBar.replaceChildren(
      el('span', { class: 'hint' }, 'unfolded:'),
      ...this.unfolded.map((u) => {
        const b = el(
          'button',
          { class: 'fold', type: 'button', 'data-module': u.module, title: `fold ${u.module}` },
          `${u.module} ⊟`,
        );
        b.addEventListener('click', () => this.foldAgain(u).catch(report));
        return b;
      }),
    );
  }

  private say(text: string): void {
    this.notice.textContent = text;
    this.notice.hidden = text === '';
  }

  // ---- folding -----------------------------------------------------------------------------------

  private async unfold(d: DrawnNode): Promise<void> {
    if (d.kind !== 'module' || !this.index) return;
    const next = d.isPart
      ? foldParts(this.state, [d.module as Part], false)
      : unfoldModule(this.state, this.index, d.module);
    await this.refold(next, [...this.unfolded, { module: d.module, isPart: d.isPart }]);
  }

  /** folds `u` again: a part, or a module (with the kind its default folding gave it) */
  private async foldAgain(u: Unfolded): Promise<void> {
    if (!this.index) return;
    if (u.isPart) {
      await this.refold(
        foldParts(this.state, [u.module as Part], true),
        this.unfolded.filter((x) => x !== u),
      );
      return;
    }
    await this.foldScope(u.module);
  }

  /** folds the module `module` (from the bar, or from an op's details) */
  private async foldScope(module: string): Promise<void> {
    const kind = this.index?.defaults.modules.get(module) ?? 'all';
    await this.refold(
      foldModule(this.state, module, kind),
      this.unfolded.filter((x) => x.isPart || !within(x.module, module)),
    );
  }

  // ---- selection, details, search --------------------------------------------------------------

  private select(i: number): void {
    const drawing = this.drawing;
    if (!drawing) return;
    if (this.selected >= 0) {
      drawing.nodeEls[this.selected]?.classList.remove('selected');
      for (const e of drawing.edgesAt[this.selected] ?? [])
        drawing.edgeEls[e].classList.remove('hl');
    }
    this.selected = i;
    if (i < 0) {
      this.details.hidden = true;
      return;
    }
    drawing.nodeEls[i].classList.add('selected');
    for (const e of drawing.edgesAt[i]) drawing.edgeEls[e].classList.add('hl');
    const d = drawing.folded.nodes[i];
    if (d.kind === 'op') this.showDetails(d.node, drawing, i);
  }

  private showDetails(n: VizNode, drawing: Drawing, i: number): void {
    const rows: [string, string][] = [
      ['op', n.op],
      ['scope', n.scope || '(none)'],
      ['phase', n.phase],
      ['stream', n.stream],
      ['count', `${n.count} (instructions of the step: one per microbatch that runs it)`],
      ['stage', n.stage < 0 ? '—' : String(n.stage)],
      ['part', n.part],
    ];
    if (n.collective) {
      const c = n.collective;
      rows.push(['group', `${c.group} (${ranksLabel(c.ranks)})`]);
      if (c.root !== undefined) rows.push(['root', String(c.root)]);
      if (c.peer !== undefined) rows.push(['peer', String(c.peer)]);
    }
    rows.push(
      ['shapes', n.shapes.map((s) => `[${s.join(', ')}]`).join(' ') || '—'],
      ['dtypes', n.dtypes.join(', ') || '—'],
      ['FLOPs', formatFlops(n.flops)],
      ['bytes', formatBytes(n.bytes)],
    );
    const edgeBytes = (dir: 0 | 1) =>
      drawing.edgesAt[i]
        .filter((e) => drawing.folded.edges[e][dir === 0 ? 1 : 0] === i)
        .reduce((s, e) => s + drawing.folded.edges[e][2], 0);
    rows.push(['in / out', `${formatBytes(edgeBytes(0))} / ${formatBytes(edgeBytes(1))}`]);
    const close = el('button', { class: 'close', type: 'button', title: 'close' }, '×');
    close.addEventListener('click', () => this.select(-1));
    const table = el(
      'table',
      {},
      ...rows.map(([k, v]) => el('tr', {}, el('th', {}, k), el('td', {}, v))),
    );
    // fold any module this op is in
    const folds = prefixes(n.scope).map((p) => {
      const b = el('button', { class: 'fold-scope', type: 'button', 'data-module': p }, p);
      b.addEventListener('click', () => this.foldScope(p).catch(report));
      return b;
    });
    this.details.replaceChildren(
      close,
      el('div', { class: 'details-title' }, nodeLines({ kind: 'op', index: 0, node: n })[0]),
      table,
      ...(folds.length ? [el('div', { class: 'fold-scopes' }, 'fold: ', ...folds)] : []),
    );
    this.details.hidden = false;
  }

  /** marks the nodes that match the search (op or scope, a folded module's members too) */
  private highlight(): void {
    const drawing = this.drawing;
    if (!drawing || !this.graph) return;
    const q = this.search.value;
    const hit = matches(this.graph, drawing.folded, q);
    let n = 0;
    drawing.nodeEls.forEach((g, i) => {
      g.classList.toggle('match', hit[i] === 1);
      n += hit[i];
    });
    const searching = q.trim() !== '';
    this.svgEl.classList.toggle('searching', searching);
    this.matchCount.textContent = searching ? `${n} match${n === 1 ? '' : 'es'}` : '';
  }

  /** centres the first match (in drawing order) */
  private goToMatch(): void {
    const drawing = this.drawing;
    if (!drawing) return;
    const i = drawing.nodeEls.findIndex((g) => g.classList.contains('match'));
    if (i < 0) return;
    if (this.zoom < READABLE_ZOOM) this.setZoom(1);
    const { x, y } = drawing.layout.nodes[i];
    this.scrollTo(x, y);
  }

  // ---- zoom and pan ------------------------------------------------------------------------------

  /** sizes the drawing for zoom `k` (the canvas's scroll bars pan it) */
  private setZoom(k: number): void {
    const layout = this.drawing?.layout;
    if (!layout) return;
    this.zoom = Math.min(MAX_ZOOM, Math.max(MIN_ZOOM, k));
    this.svgEl.setAttribute(
      'viewBox',
      `0 0 ${layout.width.toFixed(0)} ${layout.height.toFixed(0)}`,
    );
    this.svgEl.setAttribute('width', (layout.width * this.zoom).toFixed(0));
    this.svgEl.setAttribute('height', (layout.height * this.zoom).toFixed(0));
  }

  /** scrolls layout point (x, y) to the canvas's centre */
  private scrollTo(x: number, y: number): void {
    const c = this.canvas;
    c.scrollLeft = x * this.zoom - c.clientWidth / 2;
    c.scrollTop = y * this.zoom - c.clientHeight / 2;
  }

  /**
   * the whole graph when it fits at a readable scale (or `whole`: at any scale); else its top at
   * a readable scale, the first node centred
   */
  private fit(whole: boolean): void {
    const layout = this.drawing?.layout;
    const c = this.canvas;
    if (!layout || layout.width === 0) return;
    if (c.clientWidth === 0) {
      this.setZoom(READABLE_ZOOM); // drawn while hidden: sized, fitted on the next Fit
      return;
    }
    const fitK = Math.min(c.clientWidth / layout.width, c.clientHeight / layout.height, 1);
    if (whole || fitK >= READABLE_ZOOM) {
      this.setZoom(fitK);
      c.scrollLeft = 0;
      c.scrollTop = 0;
      return;
    }
    this.setZoom(READABLE_ZOOM);
    const top = layout.nodes.reduce((t, n) => (n.y < t.y ? n : t), layout.nodes[0]);
    c.scrollLeft = top.x * this.zoom - c.clientWidth / 2;
    c.scrollTop = 0;
  }

  /** zooms to `k` about the canvas's centre */
  private zoomTo(k: number): void {
    this.zoomAt(this.canvas.clientWidth / 2, this.canvas.clientHeight / 2, k);
  }

  /** zooms to `k` keeping the layout point under canvas pixel (cx, cy) in place */
  private zoomAt(cx: number, cy: number, k: number): void {
    const c = this.canvas;
    const before = this.zoom;
    const x = (c.scrollLeft + cx) / before;
    const y = (c.scrollTop + cy) / before;
    this.setZoom(k);
    c.scrollLeft = x * this.zoom - cx;
    c.scrollTop = y * this.zoom - cy;
  }

  /** ctrl+wheel zooms about the pointer, a drag pans, a click (no drag) selects or unfolds */
  private listenPanZoom(): void {
    const c = this.canvas;
    c.addEventListener(
      'wheel',
      (e) => {
        if (!e.ctrlKey && !e.metaKey) return; // a plain wheel scrolls
        e.preventDefault();
        const r = c.getBoundingClientRect();
        const lines = e.deltaMode === 1 ? 20 : 1; // lines → pixels
        const k = this.zoom * Math.exp(-e.deltaY * lines * 0.002);
        this.zoomAt(e.clientX - r.left, e.clientY - r.top, k);
      },
      { passive: false },
    );
    let drag: { x: number; y: number; left: number; top: number; moved: boolean } | null = null;
    let dragged = false;
    c.addEventListener('pointerdown', (e) => {
      if (e.button !== 0) return;
      drag = { x: e.clientX, y: e.clientY, left: c.scrollLeft, top: c.scrollTop, moved: false };
      dragged = false;
    });
    c.addEventListener('pointermove', (e) => {
      if (!drag) return;
      const dx = e.clientX - drag.x;
      const dy = e.clientY - drag.y;
      if (!drag.moved && Math.hypot(dx, dy) < 4) return;
      if (!drag.moved) {
        drag.moved = true;
        c.setPointerCapture(e.pointerId); // only now: a plain click keeps its target
        c.classList.add('panning');
      }
      c.scrollLeft = drag.left - dx;
      c.scrollTop = drag.top - dy;
    });
    const end = () => {
      if (drag?.moved) dragged = true;
      drag = null;
      c.classList.remove('panning');
    };
    c.addEventListener('pointerup', end);
    c.addEventListener('pointercancel', end);
    c.addEventListener('click', (e) => {
      if (dragged) {
        dragged = false;
        return;
      }
      const g = (e.target as Element).closest<SVGGElement>('g.node');
      const drawing = this.drawing;
      if (!g || !drawing) {
        this.select(-1);
        return;
      }
      const d = drawing.folded.nodes[Number(g.dataset.index)];
      if (d.kind === 'module') this.unfold(d).catch(report);
      else this.select(Number(g.dataset.index));
    });
    this.root.addEventListener('keydown', (e) => {
      if (e.key === 'Escape') this.select(-1);
    });
  }
}

// ---- helpers -------------------------------------------------------------------------------------

/** a node's two lines as drawn: cut to fit (the full text is in its tooltip) */
function labelText(d: DrawnNode): [string, string] {
  const [title, detail] = nodeLines(d);
  return [
    truncate(title, TITLE_CHARS, d.kind === 'module'),
    truncate(detail, DETAIL_CHARS, d.kind === 'op'),
  ];
}

/** the key a node is coloured by; a folded module whose members differ is 'mixed' */
function colorKey(d: DrawnNode, by: ColorBy): string {
  const one = (values: readonly string[]) => (values.length === 1 ? values[0] : MIXED);
  switch (by) {
    case 'part':
      return d.kind === 'op' ? d.node.part : d.part;
    case 'stage': {
      const s = d.kind === 'op' ? d.node.stage : d.stage;
      return s < 0 ? 'no stage' : `stage ${s}`;
    }
    case 'stream':
      return d.kind === 'op' ? d.node.stream : one(d.streams);
    case 'phase':
      return d.kind === 'op' ? d.node.phase : one(d.phases);
  }
}

function paletteFor(by: ColorBy): Palette {
  switch (by) {
    case 'part':
      return new Palette({ ...PART_COLORS, [MIXED]: MIXED_COLOR });
    case 'stage':
      return new Palette();
    case 'stream':
      return new Palette({ ...STREAM_COLORS, [MIXED]: MIXED_COLOR });
    case 'phase':
      return new Palette({ ...PHASE_COLORS, [MIXED]: MIXED_COLOR });
  }
}

/** `ranks 0, 2`, or `1024 ranks: 0, 1, 2, …, 1023` */
function ranksLabel(ranks: readonly number[]): string {
  if (ranks.length === 1) return `rank ${ranks[0]}`;
  if (ranks.length <= 6) return `ranks ${ranks.join(', ')}`;
  return `${ranks.length} ranks: ${ranks.slice(0, 3).join(', ')}, …, ${ranks[ranks.length - 1]}`;
}

/** 1.5e12 → '1.50 TFLOP' */
function formatFlops(f: number): string {
  const units = ['FLOP', 'kFLOP', 'MFLOP', 'GFLOP', 'TFLOP', 'PFLOP'];
  let i = 0;
  while (Math.abs(f) >= 1000 && i < units.length - 1) {
    f /= 1000;
    i++;
  }
  return `${i === 0 ? f : f.toFixed(f >= 100 ? 0 : f >= 10 ? 1 : 2)} ${units[i]}`;
}

/** an SVG path through a polyline */
function pathOf(points: readonly { x: number; y: number }[]): string {
  return points.map((p, i) => `${i ? 'L' : 'M'}${p.x.toFixed(1)},${p.y.toFixed(1)}`).join('');
}

/** a hub's edge, not laid out: a straight line between the facing sides of the two boxes */
function hubLine(
  layout: LayoutReply,
  sizes: readonly { height: number }[],
  a: number,
  b: number,
): { x: number; y: number }[] {
  const p = layout.nodes[a];
  const q = layout.nodes[b];
  const down = q.y >= p.y ? 1 : -1;
  return [
    { x: p.x, y: p.y + (down * sizes[a].height) / 2 },
    { x: q.x, y: q.y - (down * sizes[b].height) / 2 },
  ];
}

/** the edges' arrow head */
function arrowDefs(): SVGDefsElement {
  const defs = svg('defs');
  const marker = svg('marker', {
    id: 'lfc-graph-arrow',
    viewBox: '0 0 10 10',
    refX: 9,
    refY: 5,
    markerWidth: 7,
    markerHeight: 7,
    markerUnits: 'userSpaceOnUse',
    orient: 'auto',
  });
  marker.append(svg('path', { d: 'M0,0L10,5L0,10z', class: 'arrow' }));
  defs.append(marker);
  return defs;
}

/** an error from a click (not from show(), whose caller reports it): the page's error banner */
function report(e: unknown): void {
  const box = document.querySelector<HTMLElement>('.error');
  if (box) {
    box.textContent = e instanceof Error ? e.message : String(e);
    box.hidden = false;
  }
  console.error(e);
}
