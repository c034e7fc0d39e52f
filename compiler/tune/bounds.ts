// Analytic bounds that let the tuner skip a layout without compiling it. A layout is skipped only
// when its bound proves it cannot fit, never on an estimate.
//
// Static memory: the decoder layers' weights, main gradients and optimizer state fall on the
// pipeline stages layer by layer, and tensor and expert parallelism divide them (replicated
// tensors such as norms only add), so the busiest rank holds at least
//   dense · (weight + grad + master/d + moments/d) / (tp · pp)        d = dp under the distributed optimizer
//   + experts · (the same with d = edp) / (etp · ep · pp)            edp = world / (etp · ep · pp)
// with Megatron's bytes per parameter (compiler/inspect.ts bytesPerParam). The embedding, the
// output layer, the encoder and every activation come on top. If this plus the device's reserve
// is past its memory, the layout fits neither at the bounds nor at expected sizes.

import { buildForwardGraph } from '../frontend/build.js';
import type { ModelConfig } from '../frontend/config.js';
import type { Precision } from '../frontend/precision.js';
import { bytesPerParam } from '../inspect.js';
import type { Layout } from './space.js';

/** The decoder layers' parameters: dense and expert, all and trainable. */
export interface LayerParams {
  readonly dense: { readonly all: number; readonly trainable: number };
  readonly experts: { readonly all: number; readonly trainable: number };
}

export function layerParams(cfg: ModelConfig): LayerParams {
  // parameters do not depend on the sequence: a short one builds faster
  const g = buildForwardGraph(cfg, { seqLength: 64 });
  const experts = new Set<string>();
  for (const n of g.nodes)
    if (n.op === 'grouped_linear') n.inputs.slice(2).forEach((w) => experts.add(w));
  const out = { dense: { all: 0, trainable: 0 }, experts: { all: 0, trainable: 0 } };
  for (const p of g.params) {
    if (p.module !== 'text_decoder' || !/^model\.layers\./.test(p.name)) continue;
    const n = p.type.shape.reduce<number>((a, d) => a * (typeof d === 'number' ? d : 0), 1);
    const bucket = experts.has(p.name) ? out.experts : out.dense;
    bucket.all += n;
    if (p.trainable) bucket.trainable += n;
  }
  return out;
}

/** A lower bound of the static device bytes of a layout's busiest rank (the header). */
export function staticBytesLowerBound(
  p: LayerParams,
  l: Layout,
  world: number,
  precision: Precision,
): number {
  const dp = world / (l.tp * l.pp);
  const edp = world / (l.etp * l.ep * l.pp);
  const bytes = (c: LayerParams['dense'], d: number) => {
    const b = bytesPerParam({ precision, distributedOptimizer: l.distopt, dataParallelSize: d });
    return c.all * b.weight + c.trainable * (b.grad + b.master + b.moments);
  };
  return bytes(p.dense, dp) / (l.tp * l.pp) + bytes(p.experts, edp) / (l.etp * l.ep * l.pp);
}
