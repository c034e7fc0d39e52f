// The encoder's levels (DESIGN.md "Parallel topology"): where the vision encoder and its projector
// run, which microbatch each rank encodes, and which ranks its gradients are summed over. As data,
// so emission, the tests and the report read one rule.
//
//   level 0  the encoder shares the decoder's TP (encoder TP = decoder TP): stage 0, split like
//            the decoder, gradients summed over dp
//   level 1  hetero TP (encoder TP < decoder TP): stage 0, the tp/encoderTp replicas inside a tp
//            group encode the same microbatch; gradients summed over dp (distinct data only)
//   level 2  hetero DP (--enable-encoder-hetero-dp, encoder TP 1): stage 0; microbatch g·tp + i
//            is encoded by TP rank i alone (its owner) and broadcast to the TP group before the
//            decoder reads it; the owner's encoder backward runs after the decoder backward of
//            the group's last microbatch; gradients summed over every rank of stage 0
//   level 3  full separation (--enable-full-hetero-dp, encoder TP 1): every rank encodes; in round
//            r, model-parallel rank (pp, tp) encodes microbatch r·M + pp·tp_size + tp (M = tp·pp);
//            the outputs are gathered to model-parallel rank 0, which broadcasts each to stage 0's
//            TP group before the decoder reads it; after the pipeline, the embedding gradients
//            are scattered back, each owner runs its encoder backward, and the gradients are
//            summed over every rank
// Mock microbatches pad the count to a multiple of tp (level 2) or M (level 3): slots that encode
// nothing and never reach the decoder.

import type { EncoderLevel, EncoderPlacement } from '../../passes/parallel/placement.js';

// declared beside the passes that read them (passes/ imports nothing from compiler/)
export type { EncoderLevel, EncoderPlacement } from '../../passes/parallel/placement.js';
export { isEncoderScope } from '../../passes/parallel/placement.js';

/** The encoder flags of a compile (CompileOptions.encoder). */
export interface EncoderOptions {
  /** --enable-encoder-hetero-dp (level 2) */
  readonly heteroDp?: boolean;
  /** --enable-full-hetero-dp (level 3) */
  readonly fullHeteroDp?: boolean;
  /** --full-hetero-dp-cpu-offload: level 3's encoder outputs wait on the host */
  readonly cpuOffload?: boolean;
  /** --full-hetero-dp-encoder-recompute: level 3 drops encoder activations, recomputes them */
  readonly recompute?: boolean;
  /** --use-vit-dp-balance */
  readonly vitDpBalance?: boolean;
}

export interface PlacementInput {
  readonly tp: number;
  readonly pp: number;
  readonly encoderTp: number;
  readonly heteroDp?: boolean;
  readonly fullHeteroDp?: boolean;
  /** microbatches per data-parallel rank */
  readonly microbatches: number;
}

export function encoderLevel(o: PlacementInput): EncoderLevel {
  if (o.fullHeteroDp) return 3;
  if (o.heteroDp) return 2;
  return o.encoderTp < o.tp ? 1 : 0;
}

export function encoderPlacement(o: PlacementInput): EncoderPlacement {
  const level = encoderLevel(o);
  const m = o.microbatches;
  const encoders = level === 3 ? o.tp * o.pp : level === 2 ? o.tp : 1;
  const slots = Math.ceil(m / encoders) * encoders;
  const ownerOf = (slot: number) => {
    if (level < 2) return undefined;
    const j = slot % encoders;
    return { tp: j % o.tp, pp: Math.floor(j / o.tp) };
  };
  return {
    level,
    encoderTp: level >= 2 ? 1 : o.encoderTp,
    microbatches: m,
    slots,
    encoders,
    gradGroup: level === 3 ? 'world' : level === 2 ? 'tp_dp_cp' : 'dp',
    ownerOf,
    slotsOf(tp, pp) {
      if (level < 2) return pp === 0 ? Array.from({ length: m }, (_, k) => k) : [];
      if (level === 2 && pp !== 0) return [];
      const mine: number[] = [];
      for (let k = 0; k < slots; k++) {
        const w = ownerOf(k)!;
        if (w.tp === tp && w.pp === pp) mine.push(k);
      }
      return mine;
    },
  };
}

/** One line for `lfc compile`'s report: the level, where the encoder runs, what it sums over. */
export function describeEncoder(p: EncoderPlacement): string {
  const mock = p.slots - p.microbatches;
  const pad = mock ? `, ${mock} mock slot${mock > 1 ? 's' : ''}` : '';
  switch (p.level) {
    case 0:
      return `encoder: shares the decoder's TP on stage 0; gradients summed over dp`;
    case 1:
      return `encoder: hetero TP (level 1), encoder tp ${p.encoderTp} on stage 0; gradients summed over dp`;
    case 2:
      return `encoder: hetero DP (level 2), microbatch g·tp + i encoded by TP rank i of stage 0 and broadcast${pad}; gradients summed over stage 0 (tp·dp)`;
    case 3:
      return `encoder: full separation (level 3), ${p.encoders === 1 ? 'the one rank of each model-parallel group encodes' : `${p.encoders} ranks of each model-parallel group encode in turn`}, gather_v to its rank 0, scatter_v back${pad}; gradients summed over every rank`;
  }
}
