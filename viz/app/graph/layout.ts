// The folded graph's layout, by dagre (layered, top to bottom): pure, so the worker
// (layout-worker.ts) runs it off the main thread and tests and benchmarks run it in Node.

import dagre from '@dagrejs/dagre';

export interface LayoutRequest {
  /** the view's request number: a reply to an older request is dropped */
  readonly id: number;
  /** node sizes in pixels, by drawn index */
  readonly nodes: readonly { readonly width: number; readonly height: number }[];
  /** [from drawn index, to drawn index] */
  readonly edges: readonly (readonly [number, number])[];
}

export interface LayoutReply {
  readonly id: number;
  /** the drawing's size */
  readonly width: number;
  readonly height: number;
  /** node centres, by drawn index */
  readonly nodes: readonly { readonly x: number; readonly y: number }[];
  /** each edge's polyline, in the request's edge order */
  readonly edges: readonly (readonly { readonly x: number; readonly y: number }[])[];
  /** how long dagre took */
  readonly ms: number;
}

/** what a failed layout sends back instead */
export interface LayoutFailure {
  readonly id: number;
  readonly error: string;
}

/** spacing between ranks and between nodes of a rank, px */
const RANK_SEP = 36;
const NODE_SEP = 24;
const MARGIN = 16;

export function layoutGraph(req: LayoutRequest): LayoutReply {
  const t0 = performance.now();
  const g = new dagre.graphlib.Graph();
  g.setGraph({
    rankdir: 'TB',
    ranksep: RANK_SEP,
    nodesep: NODE_SEP,
    edgesep: 10,
    marginx: MARGIN,
    marginy: MARGIN,
  });
  g.setDefaultEdgeLabel(() => ({}));
  req.nodes.forEach((n, i) => g.setNode(String(i), { width: n.width, height: n.height }));
  for (const [a, b] of req.edges) g.setEdge(String(a), String(b));
  dagre.layout(g);
  const label = g.graph();
  return {
    id: req.id,
    width: label.width ?? 0,
    height: label.height ?? 0,
    nodes: req.nodes.map((_, i) => {
      const n = g.node(String(i));
      return { x: n.x ?? 0, y: n.y ?? 0 };
    }),
    edges: req.edges.map(([a, b]) => g.edge(String(a), String(b))?.points ?? []),
    ms: performance.now() - t0,
  };
}
