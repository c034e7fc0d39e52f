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

export type EncoderLevel = 0 | 1 | 2 | 3;

export interface EncoderPlacement {
  readonly level: EncoderLevel;
  /** the encoder's TP size (1 at levels 2 and 3) */
  readonly encoderTp: number;
  /** microbatches per data-parallel rank (real ones) */
  readonly microbatches: number;
  /** slots, mock ones included: microbatches rounded up to a multiple of the encoding ranks */
  readonly slots: number;
  /** ranks of one model-parallel group that encode distinct microbatches (1, tp or tp·pp) */
  readonly encoders: number;
  /** the group kind encoder and projector gradients are summed over */
  readonly gradGroup: 'dp' | 'tp_dp_cp' | 'world';
  /** the decoder coordinates (tp index, pipeline stage) that encode slot k; undefined: all of stage 0 */
  ownerOf(slot: number): { readonly tp: number; readonly pp: number } | undefined;
  /** the slots the rank at (tp, pp) encodes, real and mock, in order */
  slotsOf(tp: number, pp: number): readonly number[];
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

/** The encoder and its projector: `visual.*` parameters and node scopes. */
export function isEncoderScope(name: string): boolean {
  return name === 'visual' || name.startsWith('visual.');
}
