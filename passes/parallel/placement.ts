// What the passes read of the encoder's placement (its levels: compiler/parallel/encoder.ts, which
// builds it and re-exports these): which ranks encode which microbatch and which ranks the
// encoder's gradients are summed over, and which names are the encoder's. Declared here, below
// the compiler, so a pass takes a placement without importing the compiler.

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

/** The encoder and its projector: `visual.*` parameters and node scopes. */
export function isEncoderScope(name: string): boolean {
  return name === 'visual' || name.startsWith('visual.');
}
