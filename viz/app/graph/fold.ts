// Folding a program's dataflow (model.ts VizGraph) into the graph the view draws: a folded
// module (a scope prefix such as `model.layers.3`) becomes one node that stands for every
// instruction under it, and the edges between folded nodes are summed (bytes) with self loops
// dropped. Pure (no DOM), O(nodes + edges) per fold, so a 100k-instruction program folds on the
// main thread and only the folded graph, a few hundred nodes, is laid out.
//
// Default folding: every numbered module (`…layers.N`, `…blocks.N`: the scope up to its first
// numeric segment) is one node, collectives inside it counted in it; a module with no numbered
// module under it that still holds more than BIG_MODULE_NODES nodes (the optimizer's per-tensor
// updates, per-parameter gradient sums) is folded as well, its collectives drawn apart while it
// holds at most LOOSE_COLLECTIVES of them. Everything else (embedding, head, loss, the encoder
// handoff) is drawn op by op.

import type { VizGraph, VizNode } from '../../model.js';

export type Part = VizNode['part'];

/** the parts `fold to parts` draws as one node each (the step's gradient sums and update stay) */
export const MODEL_PARTS: readonly Part[] = ['encoder', 'projector', 'decoder'];

/** a module with no numbered module under it is folded by default above this many nodes */
export const BIG_MODULE_NODES = 32;
/** a default-folded big module draws its collectives apart while it holds at most this many */
export const LOOSE_COLLECTIVES = 16;
/** unfolding a module folds each child module holding more than this many nodes */
export const UNFOLD_CHILD_NODES = 8;

/**
 * What a folded module does with the collectives under it: 'all' counts them in the folded node,
 * 'compute' draws them apart as nodes of their own (so they stay visible).
 */
export type FoldKind = 'all' | 'compute';

/** Which modules and parts are folded. Outermost wins: a module inside a folded one is hidden. */
export interface FoldState {
  readonly modules: ReadonlyMap<string, FoldKind>;
  readonly parts: ReadonlySet<Part>;
}

/** The module tree of one graph's scopes, built once per graph: node counts per scope prefix. */
export interface ScopeIndex {
  /** nodes under each prefix (the prefix itself and every scope below it) */
  readonly nodesUnder: ReadonlyMap<string, number>;
  /** collectives under each prefix */
  readonly collectivesUnder: ReadonlyMap<string, number>;
  /** the child prefixes of each prefix, one segment deeper, in first-seen order */
  readonly children: ReadonlyMap<string, readonly string[]>;
  /** the default folding (see the file's comment) */
  readonly defaults: FoldState;
}

/** A node the view draws: one instruction of a microbatch, or a folded module or part. */
export type DrawnNode = OpNode | ModuleNode;

export interface OpNode {
  readonly kind: 'op';
  /** index in VizGraph.nodes */
  readonly index: number;
  readonly node: VizNode;
}

export interface ModuleNode {
  readonly kind: 'module';
  /** the scope prefix, or the part's name for a folded part */
  readonly module: string;
  /** true for a folded part (fold to parts), whose members share a part, not a scope prefix */
  readonly isPart: boolean;
  /** the part most of its members belong to */
  readonly part: Part;
  readonly stage: number;
  /** VizGraph nodes it holds */
  readonly ops: number;
  /** instructions of the step they stand for (sum of counts) */
  readonly instructions: number;
  /** collectives and p2p it holds, and their distinct groups (sorted) */
  readonly collectives: number;
  readonly groups: readonly string[];
  /** its members' phases and streams, each distinct value once (first-seen order) */
  readonly phases: readonly string[];
  readonly streams: readonly string[];
  /** FLOPs and bytes of one step: every member times its count */
  readonly flops: number;
  readonly bytes: number;
}

export interface FoldedGraph {
  readonly nodes: readonly DrawnNode[];
  /** [from drawn index, to drawn index, bytes]: summed over the edges they fold, no self loops */
  readonly edges: readonly (readonly [number, number, number])[];
  /** the drawn node each VizGraph node is in */
  readonly drawnOf: Int32Array;
}

const NUMERIC = /^\d+$/;

/** `model.layers.12.mlp` → `model.layers.12`; a scope with no numeric segment → undefined */
export function numberedModule(scope: string): string | undefined {
  const segs = scope.split('.');
  const i = segs.findIndex((s) => NUMERIC.test(s));
  return i < 0 ? undefined : segs.slice(0, i + 1).join('.');
}

/** `a.b.c` → ['a', 'a.b', 'a.b.c'] (an empty scope has none) */
export function prefixes(scope: string): string[] {
  if (scope === '') return [];
  const out: string[] = [];
  let at = scope.indexOf('.');
  while (at >= 0) {
    out.push(scope.slice(0, at));
    at = scope.indexOf('.', at + 1);
  }
  out.push(scope);
  return out;
}

/** is `scope` the module `prefix` or inside it */
export const within = (scope: string, prefix: string): boolean =>
  scope === prefix || (scope.startsWith(prefix) && scope.charCodeAt(prefix.length) === 46); // '.'

/** the module tree of `g` and its default folding, in O(nodes + distinct scopes × depth) */
export function indexScopes(g: VizGraph): ScopeIndex {
  // pass 1: nodes and collectives per distinct scope
  const perScope = new Map<string, { nodes: number; collectives: number }>();
  for (const n of g.nodes) {
    let s = perScope.get(n.scope);
    if (!s) perScope.set(n.scope, (s = { nodes: 0, collectives: 0 }));
    s.nodes++;
    if (n.collective) s.collectives++;
  }
  // pass 2: the counts summed up the prefix tree, and the tree's children
  const nodesUnder = new Map<string, number>();
  const collectivesUnder = new Map<string, number>();
  const children = new Map<string, string[]>();
  for (const [scope, s] of perScope) {
    let parent: string | undefined;
    for (const p of prefixes(scope)) {
      if (!nodesUnder.has(p) && parent !== undefined) {
        let c = children.get(parent);
        if (!c) children.set(parent, (c = []));
        c.push(p);
      }
      nodesUnder.set(p, (nodesUnder.get(p) ?? 0) + s.nodes);
      collectivesUnder.set(p, (collectivesUnder.get(p) ?? 0) + s.collectives);
      parent = p;
    }
  }
  return { nodesUnder, collectivesUnder, children, defaults: defaultFolding(perScope) };
}

/** the default folding of a graph's scopes (see the file's comment) */
function defaultFolding(
  perScope: ReadonlyMap<string, { nodes: number; collectives: number }>,
): FoldState {
  const modules = new Map<string, FoldKind>();
  // numbered modules, and the prefixes above them (never folded whole by default)
  const aboveNumbered = new Set<string>();
  for (const scope of perScope.keys()) {
    const m = numberedModule(scope);
    if (m === undefined) continue;
    modules.set(m, 'all');
    for (const p of prefixes(m)) if (p !== m) aboveNumbered.add(p);
  }
  // the nodes outside numbered modules, counted per prefix
  const loose = new Map<string, { nodes: number; collectives: number }>();
  for (const [scope, s] of perScope) {
    if (numberedModule(scope) !== undefined) continue;
    for (const p of prefixes(scope)) {
      if (aboveNumbered.has(p)) continue;
      let l = loose.get(p);
      if (!l) loose.set(p, (l = { nodes: 0, collectives: 0 }));
      l.nodes += s.nodes;
      l.collectives += s.collectives;
    }
  }
  // big ones, outermost first (a prefix's ancestors come before it in `prefixes` order)
  for (const [p, l] of loose) {
    if (l.nodes <= BIG_MODULE_NODES) continue;
    if (prefixes(p).some((a) => a !== p && modules.has(a))) continue;
    modules.set(p, l.collectives <= LOOSE_COLLECTIVES ? 'compute' : 'all');
  }
  return { modules, parts: new Set() };
}

/** the state with `module` folded (its collectives counted in it) */
export function foldModule(state: FoldState, module: string, kind: FoldKind = 'all'): FoldState {
  const modules = new Map(state.modules);
  modules.set(module, kind);
  return { modules, parts: state.parts };
}

/**
 * the state with `module` unfolded: its child modules holding more than UNFOLD_CHILD_NODES nodes
 * are folded in its place (same kind), so a big module opens one level at a time
 */
export function unfoldModule(state: FoldState, index: ScopeIndex, module: string): FoldState {
  const kind = state.modules.get(module) ?? 'all';
  const modules = new Map(state.modules);
  modules.delete(module);
  for (const c of index.children.get(module) ?? [])
    if ((index.nodesUnder.get(c) ?? 0) > UNFOLD_CHILD_NODES && !modules.has(c))
      modules.set(c, kind);
  return { modules, parts: state.parts };
}

/** the state with each of `parts` folded to one node, or unfolded (`folded` false) */
export function foldParts(state: FoldState, parts: readonly Part[], folded: boolean): FoldState {
  const next = new Set(state.parts);
  for (const p of parts) {
    if (folded) next.add(p);
    else next.delete(p);
  }
  return { modules: state.modules, parts: next };
}

/** nothing folded */
export const UNFOLDED: FoldState = { modules: new Map(), parts: new Set() };

/** `g` folded by `state`: drawn nodes in program order of their first member, summed edges */
export function fold(g: VizGraph, state: FoldState): FoldedGraph {
  // the outermost folded module of each distinct scope (null: none)
  const moduleOfScope = new Map<string, string | null>();
  const outermost = (scope: string): string | null => {
    let m = moduleOfScope.get(scope);
    if (m === undefined) {
      m = prefixes(scope).find((p) => state.modules.has(p)) ?? null;
      moduleOfScope.set(scope, m);
    }
    return m;
  };

  // pass 1: each node's drawn node; a module's slot gathers its members, summarized after
  type Slot = OpNode | { kind: 'pending'; module: string; isPart: boolean; members: number[] };
  const drawnOf = new Int32Array(g.nodes.length);
  const slots: Slot[] = [];
  const slotOf = new Map<string, number>(); // `part|module \0 name` → slot index
  g.nodes.forEach((n, i) => {
    let module: string | undefined;
    const isPart = state.parts.has(n.part);
    if (isPart) module = n.part;
    else {
      const m = outermost(n.scope);
      if (m !== null && (state.modules.get(m) === 'all' || !n.collective)) module = m;
    }
    if (module === undefined) {
      drawnOf[i] = slots.length;
      slots.push({ kind: 'op', index: i, node: n });
      return;
    }
    const key = `${isPart ? 'part' : 'module'}\u0000${module}`;
    let at = slotOf.get(key);
    if (at === undefined) {
      slotOf.set(key, (at = slots.length));
      slots.push({ kind: 'pending', module, isPart, members: [] });
    }
    (slots[at] as { members: number[] }).members.push(i);
    drawnOf[i] = at;
  });
  const nodes: DrawnNode[] = slots.map((s) =>
    s.kind === 'pending' ? summarize(g, s.module, s.isPart, s.members) : s,
  );

  // pass 2: edges between drawn nodes, bytes summed, self loops dropped
  const edges: [number, number, number][] = [];
  const edgeAt = new Map<number, number>();
  const width = nodes.length;
  for (const [a, b, bytes] of g.edges) {
    const from = drawnOf[a];
    const to = drawnOf[b];
    if (from === to) continue;
    const key = from * width + to;
    const at = edgeAt.get(key);
    if (at === undefined) {
      edgeAt.set(key, edges.length);
      edges.push([from, to, bytes]);
    } else edges[at][2] += bytes;
  }
  return { nodes, edges, drawnOf };
}

/** a folded module's node, from its members */
function summarize(
  g: VizGraph,
  module: string,
  isPart: boolean,
  memberIndices: readonly number[],
): ModuleNode {
  const partCounts = new Map<Part, number>();
  const groups = new Set<string>();
  const phases = new Set<string>();
  const streams = new Set<string>();
  let instructions = 0;
  let collectives = 0;
  let flops = 0;
  let bytes = 0;
  for (const i of memberIndices) {
    const n = g.nodes[i];
    partCounts.set(n.part, (partCounts.get(n.part) ?? 0) + 1);
    phases.add(n.phase);
    streams.add(n.stream);
    instructions += n.count;
    flops += n.flops * n.count;
    bytes += n.bytes * n.count;
    if (n.collective) {
      collectives++;
      groups.add(n.collective.group);
    }
  }
  let part: Part = g.nodes[memberIndices[0]].part;
  for (const [p, c] of partCounts) if (c > (partCounts.get(part) ?? 0)) part = p;
  return {
    kind: 'module',
    module,
    isPart,
    part,
    stage: g.nodes[memberIndices[0]].stage,
    ops: memberIndices.length,
    instructions,
    collectives,
    groups: [...groups].sort(),
    phases: [...phases],
    streams: [...streams],
    flops,
    bytes,
  };
}

// ---- labels ------------------------------------------------------------------------------------

/** a collective's label: `gather_v · enc.dp[0] root 0`, `send · pp[1] peer 3` */
export function collectiveLabel(n: VizNode): string {
  const c = n.collective;
  if (!c) return n.op;
  let s = `${n.op} · ${c.group}`;
  if (c.root !== undefined) s += ` root ${c.root}`;
  if (c.peer !== undefined) s += ` peer ${c.peer}`;
  return s;
}

/** the two lines a drawn node shows: a title and a line of detail */
export function nodeLines(d: DrawnNode): [string, string] {
  if (d.kind === 'op') {
    const n = d.node;
    const times = n.count > 1 ? ` ×${n.count}` : '';
    return [collectiveLabel(n), `${n.scope || '(no scope)'} · ${n.phase}${times}`];
  }
  let detail = `${d.ops.toLocaleString('en-US')} op${d.ops === 1 ? '' : 's'}`;
  if (d.collectives > 0) {
    detail += ` · ${d.collectives.toLocaleString('en-US')} collective${d.collectives === 1 ? '' : 's'}`;
    if (d.groups.length <= 2) detail += ` (${d.groups.join(', ')})`;
  }
  return [d.module, detail];
}

/**
 * `text` cut to `max` characters with an ellipsis; `fromLeft` keeps the end (a scope's tail,
 * `…layers.3.mlp.experts`, says more than its head)
 */
export function truncate(text: string, max: number, fromLeft = false): string {
  if (text.length <= max) return text;
  return fromLeft ? `…${text.slice(text.length - max + 1)}` : `${text.slice(0, max - 1)}…`;
}

/** does the drawn node match a search (its op or scope, or any member's, contains `query`) */
export function matches(
  g: VizGraph,
  folded: FoldedGraph,
  query: string,
): Uint8Array /* per drawn node: 1 matches */ {
  const out = new Uint8Array(folded.nodes.length);
  const q = query.trim().toLowerCase();
  if (q === '') return out;
  // a scope or op string's verdict is computed once per distinct string
  const seen = new Map<string, boolean>();
  const has = (s: string): boolean => {
    let v = seen.get(s);
    if (v === undefined) seen.set(s, (v = s.toLowerCase().includes(q)));
    return v;
  };
  folded.nodes.forEach((d, at) => {
    if (d.kind === 'module' && has(d.module)) out[at] = 1;
  });
  g.nodes.forEach((n, i) => {
    if (has(n.op) || has(n.scope) || (n.collective && has(n.collective.group)))
      out[folded.drawnOf[i]] = 1;
  });
  return out;
}

// ---- hubs --------------------------------------------------------------------------------------

/** a node with more edges out (or in) than this is a hub: most of those edges skip the layout */
export const HUB_DEGREE = 16;

/**
 * Which edges the layout places. A hub (a constant read by every layer, a sum every layer's
 * gradient feeds) has edges spanning the whole graph; each is a chain of dummy nodes to dagre,
 * which made the 235B plan's folded graph take seconds to lay out. A hub keeps one edge in the
 * layout, to its first reader (or from its last writer), so it sits next to it; the view draws
 * the rest as straight, faint lines. Returns per edge: 1 laid out, 0 drawn as a hub line.
 */
export function laidOutEdges(folded: FoldedGraph): Uint8Array {
  const n = folded.nodes.length;
  const outDegree = new Int32Array(n);
  const inDegree = new Int32Array(n);
  for (const [a, b] of folded.edges) {
    outDegree[a]++;
    inDegree[b]++;
  }
  // each hub's anchor edge: the first reader of an out-hub, the last writer of an in-hub
  const firstReader = new Int32Array(n).fill(-1);
  const lastWriter = new Int32Array(n).fill(-1);
  folded.edges.forEach(([a, b], e) => {
    if (outDegree[a] > HUB_DEGREE && (firstReader[a] < 0 || b < folded.edges[firstReader[a]][1]))
      firstReader[a] = e;
    if (inDegree[b] > HUB_DEGREE && (lastWriter[b] < 0 || a > folded.edges[lastWriter[b]][0]))
      lastWriter[b] = e;
  });
  return Uint8Array.from(folded.edges, ([a, b], e) => {
    const fromHub = outDegree[a] > HUB_DEGREE;
    const toHub = inDegree[b] > HUB_DEGREE;
    if (!fromHub && !toHub) return 1;
    return firstReader[a] === e || lastWriter[b] === e ? 1 : 0;
  });
}
