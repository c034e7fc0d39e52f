// The graph view's folding (viz/app/graph/fold.ts), on small hand-built programs shaped like a
// VLM's: encoder blocks, a merger, an encoder handoff collective, decoder layers with expert
// all-to-alls, per-parameter gradient sums and an optimizer. Each case states what a reader of the
// drawn graph must be able to rely on.
import { describe, expect, it } from 'vitest';
import {
  collectiveLabel,
  fold,
  foldModule,
  foldParts,
  indexScopes,
  laidOutEdges,
  matches,
  MODEL_PARTS,
  nodeLines,
  numberedModule,
  prefixes,
  truncate,
  unfoldModule,
  UNFOLDED,
  within,
  type DrawnNode,
  type ModuleNode,
} from '../../viz/app/graph/fold.js';
import type { VizGraph, VizNode } from '../../viz/model.js';

type Spec = Partial<VizNode> & Pick<VizNode, 'op' | 'scope'>;

/** a program: the nodes in order, each reading the one before it (1 KiB a buffer) */
function chain(specs: readonly Spec[], extraEdges: [number, number, number][] = []): VizGraph {
  const nodes: VizNode[] = specs.map((s) => ({
    phase: 'forward',
    stream: 'compute',
    count: 2,
    stage: 0,
    part: 'decoder',
    shapes: [['4096']],
    dtypes: ['f32'],
    flops: 10,
    bytes: 100,
    ...s,
  }));
  const edges: [number, number, number][] = nodes.slice(1).map((_, i) => [i, i + 1, 1024]);
  return { program: 'p0', nodes, edges: [...edges, ...extraEdges] };
}

const collective = (group: string, root?: number): VizNode['collective'] => ({
  group,
  ranks: [0, 1],
  ...(root !== undefined ? { root } : {}),
});

/** a small VLM step: 2 encoder blocks, a merger, a handoff, 3 decoder layers, step */
function vlm(): VizGraph {
  const specs: Spec[] = [];
  for (let b = 0; b < 2; b++)
    for (const leaf of ['norm1', 'attn.qkv', 'attn', 'mlp.fc1', 'mlp.fc2'])
      specs.push({ op: 'matmul', scope: `visual.blocks.${b}.${leaf}`, part: 'encoder' });
  specs.push({ op: 'layernorm', scope: 'visual.merger.norm', part: 'projector' });
  specs.push({ op: 'matmul', scope: 'visual.merger.fc1', part: 'projector' });
  specs.push({
    op: 'gather_v',
    scope: 'encoder_handoff',
    part: 'encoder',
    collective: collective('enc.dp[0]', 0),
  });
  specs.push({ op: 'embedding', scope: 'model.embed_tokens' });
  for (let l = 0; l < 3; l++) {
    specs.push({ op: 'matmul', scope: `model.layers.${l}.self_attn.q_proj` });
    specs.push({ op: 'attention', scope: `model.layers.${l}.self_attn` });
    specs.push({
      op: 'all_to_all_v',
      scope: `model.layers.${l}.mlp`,
      collective: collective('ep[0]'),
    });
    specs.push({ op: 'matmul', scope: `model.layers.${l}.mlp.experts.local0.up_proj` });
    specs.push({
      op: 'all_to_all_v',
      scope: `model.layers.${l}.mlp`,
      collective: collective('ep[0]'),
    });
  }
  specs.push({ op: 'matmul', scope: 'lm_head' });
  specs.push({ op: 'cross_entropy', scope: 'loss' });
  for (let i = 0; i < 3; i++)
    specs.push({
      op: 'all_reduce',
      scope: 'gradient_sync',
      phase: 'backward',
      stream: 'comm',
      part: 'step',
      collective: collective('dp[0]'),
    });
  for (let i = 0; i < 40; i++)
    specs.push({ op: 'adamw', scope: 'optimizer', phase: 'optimizer', part: 'step', count: 1 });
  specs.push({
    op: 'all_reduce',
    scope: 'optimizer',
    phase: 'optimizer',
    part: 'step',
    collective: collective('dp[0]'),
  });
  return chain(specs);
}

const modulesOf = (nodes: readonly DrawnNode[]): ModuleNode[] =>
  nodes.filter((d): d is ModuleNode => d.kind === 'module');
const named = (nodes: readonly DrawnNode[], module: string): ModuleNode | undefined =>
  modulesOf(nodes).find((d) => d.module === module);
const opsNamed = (nodes: readonly DrawnNode[], op: string): DrawnNode[] =>
  nodes.filter((d) => d.kind === 'op' && d.node.op === op);

describe('scope helpers', () => {
  it('a numbered module is the scope up to its first numeric segment', () => {
    expect(numberedModule('model.language_model.layers.12.mlp.experts')).toBe(
      'model.language_model.layers.12',
    );
    expect(numberedModule('visual.blocks.3.attn')).toBe('visual.blocks.3');
    expect(numberedModule('model.layers.3.mlp.experts.local0')).toBe('model.layers.3');
    expect(numberedModule('visual.merger')).toBeUndefined();
  });

  it('prefixes run from the outermost module to the scope; within respects segment bounds', () => {
    expect(prefixes('a.b.c')).toEqual(['a', 'a.b', 'a.b.c']);
    expect(prefixes('')).toEqual([]);
    expect(within('model.layers.1.mlp', 'model.layers.1')).toBe(true);
    expect(within('model.layers.1', 'model.layers.1')).toBe(true);
    expect(within('model.layers.12', 'model.layers.1')).toBe(false);
  });
});

describe('default folding', () => {
  const g = vlm();
  const index = indexScopes(g);
  const f = fold(g, index.defaults);

  it('folds every numbered layer and block into one node that counts its ops', () => {
    const layers = modulesOf(f.nodes).map((d) => d.module);
    for (const m of ['visual.blocks.0', 'visual.blocks.1', 'model.layers.0', 'model.layers.2'])
      expect(layers).toContain(m);
    expect(named(f.nodes, 'visual.blocks.0')).toMatchObject({
      ops: 5,
      instructions: 10,
      part: 'encoder',
    });
  });

  it('counts the collectives inside a folded layer, with their group', () => {
    expect(named(f.nodes, 'model.layers.1')).toMatchObject({
      ops: 5,
      collectives: 2,
      groups: ['ep[0]'],
    });
    expect(opsNamed(f.nodes, 'all_to_all_v')).toHaveLength(0);
    expect(nodeLines(named(f.nodes, 'model.layers.1')!)).toEqual([
      'model.layers.1',
      '5 ops · 2 collectives (ep[0])',
    ]);
  });

  it('draws collectives outside numbered layers as nodes of their own', () => {
    const handoff = opsNamed(f.nodes, 'gather_v');
    expect(handoff).toHaveLength(1);
    expect(nodeLines(handoff[0])[0]).toBe('gather_v · enc.dp[0] root 0');
    expect(opsNamed(f.nodes, 'all_reduce')).toHaveLength(4); // 3 gradient sums + the optimizer's
  });

  it('folds a big module with no numbered module under it, its few collectives drawn apart', () => {
    expect(index.defaults.modules.get('optimizer')).toBe('compute');
    expect(named(f.nodes, 'optimizer')).toMatchObject({ ops: 40, collectives: 0 });
    expect(named(f.nodes, 'visual.merger')).toBeUndefined(); // 2 nodes: drawn op by op
    expect(named(f.nodes, 'visual')).toBeUndefined(); // holds numbered blocks: never folded whole
  });

  it('counts a big module its many collectives in it', () => {
    const sums: Spec[] = Array.from({ length: 50 }, () => ({
      op: 'all_reduce',
      scope: 'gradient_sync',
      part: 'step',
      collective: collective('dp[0]'),
    }));
    const h = chain([{ op: 'matmul', scope: 'model.layers.0.mlp' }, ...sums]);
    const hf = fold(h, indexScopes(h).defaults);
    expect(hf.nodes).toHaveLength(2);
    expect(nodeLines(named(hf.nodes, 'gradient_sync')!)[1]).toBe('50 ops · 50 collectives (dp[0])');
  });

  it('sums the bytes of the edges it folds and drops self loops', () => {
    // the chain's 1 KiB edges: inside a layer they vanish, between two drawn nodes one remains
    const l0 = f.nodes.findIndex((d) => d.kind === 'module' && d.module === 'model.layers.0');
    const l1 = f.nodes.findIndex((d) => d.kind === 'module' && d.module === 'model.layers.1');
    expect(f.edges.filter(([a, b]) => a === b)).toEqual([]);
    expect(f.edges.filter(([a, b]) => a === l0 && b === l1)).toEqual([[l0, l1, 1024]]);
    // two more buffers from layer 0 to layer 1's attention are summed into the same edge
    const extra = fold(
      chain(
        [
          { op: 'a', scope: 'model.layers.0.x' },
          { op: 'b', scope: 'model.layers.0.y' },
          { op: 'c', scope: 'model.layers.1.x' },
        ],
        [
          [0, 2, 10],
          [1, 0, 7], // inside layer 0: dropped
        ],
      ),
      indexScopes(chain([{ op: 'a', scope: 'model.layers.0' }])).defaults,
    );
    expect(extra.edges).toEqual([[0, 1, 1024 + 10]]);
  });

  it('keeps every node and edge when nothing is folded', () => {
    const all = fold(g, UNFOLDED);
    expect(all.nodes).toHaveLength(g.nodes.length);
    expect(all.edges).toHaveLength(g.edges.length);
  });

  it('maps every program node onto the drawn node that holds it', () => {
    g.nodes.forEach((n, i) => {
      const d = f.nodes[f.drawnOf[i]];
      if (d.kind === 'op') expect(d.index).toBe(i);
      else expect(within(n.scope, d.module)).toBe(true);
    });
  });
});

describe('unfolding and folding again', () => {
  const g = vlm();
  const index = indexScopes(g);

  it('unfolding a layer draws its ops and collectives', () => {
    const f = fold(g, unfoldModule(index.defaults, index, 'model.layers.1'));
    expect(named(f.nodes, 'model.layers.1')).toBeUndefined();
    expect(
      f.nodes.filter((d) => d.kind === 'op' && within(d.node.scope, 'model.layers.1')),
    ).toHaveLength(5);
    expect(opsNamed(f.nodes, 'all_to_all_v')).toHaveLength(2);
  });

  it('unfolding a big module folds its big children, one level at a time', () => {
    const specs: Spec[] = [];
    for (const child of ['self_attn', 'mlp'])
      for (let i = 0; i < 10; i++)
        specs.push({ op: 'matmul', scope: `model.layers.0.${child}.p${i}` });
    specs.push({ op: 'add', scope: 'model.layers.0' });
    specs.push({ op: 'rmsnorm', scope: 'model.layers.0.input_layernorm' });
    const h = chain(specs);
    const hi = indexScopes(h);
    const state = unfoldModule(hi.defaults, hi, 'model.layers.0');
    const f = fold(h, state);
    expect(modulesOf(f.nodes).map((d) => d.module)).toEqual([
      'model.layers.0.self_attn',
      'model.layers.0.mlp',
    ]);
    expect(f.nodes.filter((d) => d.kind === 'op').map((d) => d.kind === 'op' && d.node.op)).toEqual(
      ['add', 'rmsnorm'],
    );
    // folding the layer again hides its children's folds under it
    expect(fold(h, foldModule(state, 'model.layers.0')).nodes).toHaveLength(1);
  });

  it('folds the model to its parts, keeping the step apart', () => {
    const f = fold(g, foldParts(index.defaults, MODEL_PARTS, true));
    const parts = modulesOf(f.nodes).filter((d) => d.isPart);
    expect(parts.map((d) => d.module).sort()).toEqual(['decoder', 'encoder', 'projector']);
    expect(named(f.nodes, 'encoder')).toMatchObject({ ops: 11, collectives: 1 }); // the handoff too
    expect(opsNamed(f.nodes, 'all_reduce')).toHaveLength(4);
    const back = fold(
      g,
      foldParts(foldParts(index.defaults, MODEL_PARTS, true), ['decoder'], false),
    );
    expect(named(back.nodes, 'decoder')).toBeUndefined();
    expect(named(back.nodes, 'model.layers.0')).toBeDefined();
  });
});

describe('labels and search', () => {
  const node = (c: VizNode['collective']): VizNode =>
    ({ op: 'send', scope: 'pp', collective: c }) as VizNode;

  it('names a collective by its op, group, root and peer', () => {
    expect(collectiveLabel(node({ group: 'pp[1]', ranks: [1, 3], peer: 3 }))).toBe(
      'send · pp[1] peer 3',
    );
    expect(collectiveLabel(node(undefined))).toBe('send');
  });

  it('truncates with an ellipsis, keeping a scope’s tail', () => {
    expect(truncate('abcdef', 4)).toBe('abc…');
    expect(truncate('model.layers.3.mlp', 8, true)).toBe('…s.3.mlp');
    expect(truncate('short', 8)).toBe('short');
  });

  it('matches a folded node by its members’ ops and scopes', () => {
    const g = vlm();
    const f = fold(g, indexScopes(g).defaults);
    const hit = matches(g, f, 'ALL_TO_ALL');
    const hitModules = [...hit.keys()].filter((i) => hit[i]).map((i) => nodeLines(f.nodes[i])[0]);
    expect(hitModules).toEqual(['model.layers.0', 'model.layers.1', 'model.layers.2']);
    expect(matches(g, f, '  ').every((v) => v === 0)).toBe(true);
  });
});

describe('a large program', () => {
  it('folds 94 layers of 400 ops into about 94 nodes', () => {
    const specs: Spec[] = [{ op: 'embedding', scope: 'model.embed_tokens' }];
    for (let l = 0; l < 94; l++)
      for (let i = 0; i < 400; i++)
        specs.push({
          op: i % 100 ? 'matmul' : 'all_to_all_v',
          scope: `model.layers.${l}.mlp.p${i % 20}`,
          ...(i % 100 ? {} : { collective: collective('ep[0]') }),
        });
    specs.push({ op: 'matmul', scope: 'lm_head' });
    const g = chain(specs);
    const f = fold(g, indexScopes(g).defaults);
    expect(f.nodes).toHaveLength(96);
    expect(f.edges).toHaveLength(95);
    expect(named(f.nodes, 'model.layers.93')).toMatchObject({ ops: 400, collectives: 4 });
  });
});

describe('hubs', () => {
  it('lays out one edge of a hub, to its first reader; the rest are drawn apart', () => {
    // a constant read by 20 layers: its 19 later edges skip the layout, the chain stays
    const specs: Spec[] = [{ op: 'constant', scope: 'rope' }];
    for (let l = 0; l < 20; l++) specs.push({ op: 'matmul', scope: `model.layers.${l}.mlp` });
    const reads: [number, number, number][] = specs.slice(2).map((_, i) => [0, i + 2, 8]);
    const g = chain(specs, reads);
    const f = fold(g, indexScopes(g).defaults);
    const laid = laidOutEdges(f);
    const skipped = f.edges.filter((_, e) => !laid[e]);
    expect(skipped).toHaveLength(19);
    expect(skipped.every(([a]) => a === 0)).toBe(true);
    expect(f.edges.filter((_, e) => laid[e])).toContainEqual([0, 1, 1024 + 0]);
  });

  it('lays out every edge of a graph without hubs', () => {
    const g = vlm();
    expect(laidOutEdges(fold(g, indexScopes(g).defaults)).every((v) => v === 1)).toBe(true);
  });
});
