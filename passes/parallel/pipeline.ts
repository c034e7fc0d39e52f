// Pass: pipeline partition of a training-step graph (after autodiff). Every forward and backward
// node goes to the virtual stage (chunk) that holds its scope: the encoder, projector, embedding
// and visual merge to the first, decoder layer i to the chunk the partition gives it, the final
// norm, lm_head and loss to the last; backward nodes and gradient accumulation follow their
// forward scope. Values produced in one chunk and used in another are transfers between
// consecutive virtual stages (s runs on rank s mod pp, so neighbours are different ranks): a send
// at the end of a pass and a recv before the neighbour's pass of the same microbatch, forward
// values up in forward passes, gradients down in backward passes; a value for a chunk further on
// is relayed by the chunks between, as Megatron-LM carries extra tensors with the activations.

import type { Graph } from '../../ir/graph.js';
import { formatDim, isSym } from '../../ir/shape.js';
import type { TensorType } from '../../ir/types.js';

export class PipelineError extends Error {}

export interface PipelineSplit {
  readonly pp: number;
  readonly vpp: number;
  /** virtual stage of every node; -1 for the optimizer step (every rank runs its own part) */
  readonly chunkOf: readonly number[];
  readonly transfers: readonly Transfer[];
}

/** One value crossing pipeline ranks, once per microbatch. */
export interface Transfer {
  readonly value: string;
  readonly type: TensorType;
  readonly from: { readonly chunk: number; readonly phase: 'forward' | 'backward' };
  readonly to: { readonly chunk: number; readonly phase: 'forward' | 'backward' };
  /** tags of microbatch mb: tag + mb */
  readonly tag: number;
}

/**
 * The chunk of each node from its scope. `firstLayerOf[c]` is the first decoder layer of
 * virtual stage c (the partition's), in layer order.
 */
export function splitPipeline(
  g: Graph,
  layout: { readonly pp: number; readonly vpp: number; readonly firstLayerOf: readonly number[] },
  numMicrobatches: number,
): PipelineSplit {
  const { pp, vpp, firstLayerOf } = layout;
  const chunks = pp * vpp;
  const last = chunks - 1;
  const layerChunk = (layer: number) => {
    let c = 0;
    while (c + 1 < chunks && firstLayerOf[c + 1] <= layer) c++;
    return c;
  };
  const chunkOfScope = (scope: string): number => {
    const m = /^model\.layers\.(\d+)(\.|$)/.exec(scope);
    if (m) return layerChunk(Number(m[1]));
    if (
      scope.startsWith('visual') ||
      scope.startsWith('model.embed_tokens') ||
      scope.startsWith('model.merge_visual')
    )
      return 0;
    if (/^(model|model\.norm|lm_head|loss)(\.|$)/.test(scope)) return last;
    throw new PipelineError(`pipeline: no stage holds scope '${scope}'`);
  };
  const chunkOf = g.nodes.map((n) => (n.phase === 'optimizer' ? -1 : chunkOfScope(n.scope)));

  const producer = new Map<string, number>();
  g.nodes.forEach((n, i) => n.outputs.forEach((o) => producer.set(o.name, i)));
  // values travel hop by hop between consecutive virtual stages, in the passes that carry
  // activations (forward values up, gradients down), so every batch of sends and recvs pairs with
  // its neighbour's
  const hops = new Map<string, { value: string; chunk: number; phase: 'forward' | 'backward' }>();
  g.nodes.forEach((n, i) => {
    const c = chunkOf[i];
    if (c < 0) return;
    for (const v of n.inputs) {
      const p = producer.get(v);
      if (p === undefined || chunkOf[p] === c) continue;
      const from = chunkOf[p];
      if (from < 0) throw new Error(`pipeline: ${v} comes from the optimizer step`);
      const phase = g.nodes[p].phase as 'forward' | 'backward';
      const up = from < c;
      if (up !== (phase === 'forward'))
        throw new PipelineError(
          `pipeline: ${v} (${g.nodes[p].scope}, ${phase}) flows from stage chunk ${from} to ${c}, against the pipeline`,
        );
      for (let h = from; h !== c; h += up ? 1 : -1) {
        const key = `${v}\u0000${h}`;
        if (!hops.has(key)) hops.set(key, { value: v, chunk: h, phase });
      }
    }
  });
  const transfers: Transfer[] = [];
  const types = new Map(g.nodes.flatMap((n) => n.outputs.map((o) => [o.name, o.type] as const)));
  for (const h of hops.values()) {
    const type = types.get(h.value)!;
    for (const d of type.shape) {
      if (isSym(d) && d.sym !== 'S' && d.sym !== 'Nv')
        throw new PipelineError(
          `pipeline: ${h.value} crosses stages with a data-dependent size ${formatDim(d)}`,
        );
    }
    const next = h.phase === 'forward' ? h.chunk + 1 : h.chunk - 1;
    transfers.push({
      value: h.value,
      type,
      from: { chunk: h.chunk, phase: h.phase },
      to: { chunk: next, phase: h.phase },
      tag: transfers.length * numMicrobatches,
    });
  }
  return { pp, vpp, chunkOf, transfers };
}
