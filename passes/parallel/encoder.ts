// Pass: the encoder's data parallelism (levels 2 and 3 of DESIGN.md's table). The graph itself is
// unchanged: where the encoder runs and how its outputs move is emission's work
// (compiler/parallel/encoder.ts gives the placement). What changes is which ranks the encoder's
// and projector's gradients are summed over: every rank that encoded different data, never a
// replica that encoded the same: dp at levels 0 and 1, every rank of stage 0 at level 2 (tp·dp·cp),
// every rank at level 3. Parameters get a `dist` (whole tensors) where they had none.

import type { Graph, ParamDist } from '../../ir/graph.js';
import { isEncoderScope, type EncoderPlacement } from './placement.js';

export function encoderDataParallel(g: Graph, placement: EncoderPlacement): Graph {
  if (placement.gradGroup === 'dp') return g;
  return {
    ...g,
    params: g.params.map((p) => {
      if (p.role !== 'param' || !isEncoderScope(p.dist?.name ?? p.name)) return p;
      const whole: ParamDist = {
        name: p.name,
        shape: p.type.shape as readonly number[],
        split: p.type.shape.map(() => null),
        gradSum: [],
        replicas: 'dp',
      };
      return { ...p, dist: { ...(p.dist ?? whole), replicas: placement.gradGroup } };
    }),
  };
}
