// Forward cost of each piece a pipeline layout places: every decoder layer, what sits before
// layer 0 (embedding, merge_visual; the encoder and projector where they run on stage 0) and what
// sits after the last layer (final norm, lm_head, loss). Read off a built forward graph by module
// scope, with matmul FLOPs from the op table (the FLOP convention of `lfc inspect`).
//
// Backward costs 2 × forward under that convention (a training step is 3 × forward), the same
// factor for every piece, so layouts balance on forward FLOPs alone.
//
// Symbols (compiler/frontend/build.ts):
//   S   tokens of a microbatch
//   Nv  visual tokens of a microbatch; here the expected count, default the graph's bound
//   any other (Nk<i>, rows kept under an expert capacity): at its bound

import type { Graph } from '../../ir/graph.js';
import { valueTypes } from '../../ir/graph.js';
import { nodeFlops } from '../../ir/ops.js';
import { UserError } from '../errors.js';

export interface ForwardCosts {
  /** the symbol sizes the costs were taken at */
  readonly sizes: { readonly S: number; readonly Nv: number };
  /** forward FLOPs of decoder layer i (scope `model.layers.i`), one entry per layer */
  readonly layerFlops: readonly number[];
  /** token embedding and merge_visual: always before layer 0 */
  readonly embedFlops: number;
  /** encoder and projector (scope `visual.*`) for Nv visual tokens */
  readonly encoderFlops: number;
  /** final norm, lm_head and loss: always after the last layer */
  readonly postFlops: number;
}

/** Where a node's cost goes, by its module scope. */
export type CostSite = { readonly layer: number } | 'embed' | 'encoder' | 'post';

const LAYER_SCOPE = /^model\.layers\.(\d+)(\.|$)/;

export function costSite(scope: string): CostSite {
  const layer = LAYER_SCOPE.exec(scope);
  if (layer) return { layer: Number(layer[1]) };
  if (scope === 'visual' || scope.startsWith('visual.')) return 'encoder';
  const top = scope.split('.').slice(0, 2).join('.');
  if (top === 'model.embed_tokens' || top === 'model.merge_visual') return 'embed';
  if (top === 'model.norm' || scope.startsWith('lm_head') || scope.startsWith('loss'))
    return 'post';
  throw new Error(`schedule costs: node scope '${scope}' belongs to no pipeline piece`);
}

/** Forward FLOPs of every pipeline piece of a forward graph, at sizes S and Nv (default: bounds). */
export function forwardCosts(
  g: Graph,
  sizes: { readonly S?: number; readonly Nv?: number } = {},
): ForwardCosts {
  const bound = (name: string) => {
    const s = g.symbols.find((d) => d.name === name);
    if (!s) throw new Error(`schedule costs: graph ${g.name} declares no symbol ${name}`);
    return s.bound;
  };
  const S = sizes.S ?? bound('S');
  const Nv = sizes.Nv ?? bound('Nv');
  if (!Number.isInteger(S) || S < 1 || S > bound('S'))
    throw new UserError(`schedule costs: tokens per microbatch S ${S} must lie in 1…${bound('S')}`);
  if (!Number.isInteger(Nv) || Nv < 0 || Nv > bound('Nv'))
    throw new UserError(
      `schedule costs: visual tokens per microbatch Nv ${Nv} must lie in 0…${bound('Nv')}`,
    );
  const size = (s: string) => {
    if (s === 'S') return S;
    if (s === 'Nv') return Nv;
    return bound(s);
  };

  const types = valueTypes(g);
  const layerFlops: number[] = [];
  let embedFlops = 0;
  let encoderFlops = 0;
  let postFlops = 0;
  for (const n of g.nodes) {
    if (n.phase !== 'forward') continue;
    const flops = nodeFlops(
      n.op,
      n.inputs.map((i) => types.get(i)!),
      n.outputs.map((o) => o.type),
      n.attrs,
      size,
    );
    const site = costSite(n.scope);
    if (site === 'embed') embedFlops += flops;
    else if (site === 'encoder') encoderFlops += flops;
    else if (site === 'post') postFlops += flops;
    else layerFlops[site.layer] = (layerFlops[site.layer] ?? 0) + flops;
  }
  for (let i = 0; i < layerFlops.length; i++) {
    if (layerFlops[i] === undefined) throw new Error(`schedule costs: no nodes for layer ${i}`);
  }
  return { sizes: { S, Nv }, layerFlops, embedFlops, encoderFlops, postFlops };
}

/**
 * Forward FLOPs before layer 0 in the first virtual stage: the embedding, plus the encoder and
 * projector when they run on stage 0 (levels 1–2; not under full separation, level 3).
 */
export function preFlops(c: ForwardCosts, encoderOnStage0: boolean): number {
  return c.embedFlops + (encoderOnStage0 ? c.encoderFlops : 0);
}
