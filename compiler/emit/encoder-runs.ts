// Where the encoder runs at levels 2 and 3 (compiler/parallel/encoder.ts), part of lowering: its
// forward and backward for the microbatch slots this rank encodes, and, where its outputs or
// their gradients cross ranks, an import for the reader and a mark for the encoder-handoff pass.
//
//   level 2  stage 0, before the decoder's first forward of a TP group's microbatches: every TP
//            rank encodes its own one of the group (microbatch g·tp + i on TP rank i). Before each
//            microbatch's decoder forward (tp > 1) a mark: the outputs come from their owner, into
//            an import where this rank is not the owner. After the group's last decoder backward,
//            the owner's encoder backward (the output gradients are whole on every TP rank; a mock
//            slot's are imports the handoff makes empty).
//   level 3  phase 1, before the pipeline: round r encodes slot r·M + mpRank on every rank of the
//            model-parallel group (M = tp·pp), then a mark; model-parallel rank 0 reads every
//            microbatch's outputs from imports (the gathered ones). Stage 0's other TP ranks get
//            them before each decoder forward into imports, their own slots' too. Phase 3, after
//            the pipeline: each round a mark, then the encoder backward reading its output
//            gradients from imports (the scattered ones), the forward again first under
//            --full-hetero-dp-encoder-recompute.

import { encoderBoundary, type EncoderBoundary } from './encoder-handoff.js';
import type { EmitEncoder } from './options.js';
import type { Lowering } from './lower.js';
import type { Values } from './values.js';

export class EncoderRuns {
  private readonly enc?: EmitEncoder;
  private readonly level: number;
  /** decoder TP size */
  private readonly T: number;
  /** encoding ranks of a level-3 round (the model-parallel group) */
  private readonly M: number;
  /** model-parallel group rank (level 3's gather and scatter root is 0) */
  private readonly mpRank: number;

  constructor(private readonly lo: Lowering) {
    const { opts, s } = lo;
    this.enc = opts.encoder;
    this.level = this.enc?.placement.level ?? 0;
    this.T = this.enc?.tpSize ?? 1;
    this.M = this.enc?.placement.encoders ?? 1;
    this.mpRank = s.pipe.stage * this.T + (this.enc?.tp ?? 0);
  }

  /** the values that cross between encoder and decoder (only levels 2 and 3 ask) */
  private get boundary(): EncoderBoundary {
    return encoderBoundary(this.lo.g);
  }

  /** v of slot mb, read from an import made now */
  private imported(local: Values, v: string, mb: number): void {
    local.set(v, this.lo.importOf(v, mb, this.boundary.types.get(v)!));
  }

  /** stage 0, before microbatch mb's first decoder forward: encode (level 2), mark the handoff */
  beforeDecoderForward(mb: number): void {
    const { enc, lo, T } = this;
    if (!enc || this.level < 2) return;
    if (this.level === 2 && mb % T === 0) {
      // the group's first microbatch: every TP rank encodes its own one of the group
      const j = mb + enc.tp;
      if (j < lo.slots) lo.runNodes(lo.s.encoderForward, j, lo.locals[j]);
    }
    if (T === 1) return;
    // level 3: a TP rank other than the root reads every slot from an import, its own slots too
    // (the root's broadcast of what it gathered), so that its program differs from its TP
    // siblings' only in the slots it encodes (alike-programs.ts)
    const fresh = this.level === 3 && this.mpRank !== 0;
    for (const v of this.boundary.outputs)
      if (fresh || !lo.locals[mb].has(v)) this.imported(lo.locals[mb], v, mb);
    lo.mark({ kind: 'decoder-forward', mb, wait: lo.computeWait.splice(0) });
  }

  /** stage 0, after microbatch mb's last decoder backward: level 2's deferred encoder backward */
  afterDecoderBackward(mb: number): void {
    const { enc, lo, T } = this;
    if (!enc || this.level !== 2 || !lo.s.encoderBackward.length) return;
    if (mb % T !== T - 1 && mb !== lo.m - 1) return;
    const j = mb - (mb % T) + enc.tp;
    if (j >= lo.slots) return;
    // a mock slot's outputs reach no decoder: their gradients are imports (empty blocks)
    if (j >= lo.m) for (const v of this.boundary.grads) this.imported(lo.locals[j], v, j);
    lo.runNodes(lo.s.encoderBackward, j, lo.locals[j]);
  }

  /** level 3, phase 1: each round, encode this rank's slot, mark the gather */
  phase1(): void {
    const { enc, lo, M, mpRank } = this;
    if (!enc || this.level !== 3) return;
    for (let r = 0; r < enc.placement.slots / M; r++) {
      const slot = r * M + mpRank;
      // a real slot, or a mock one under the ViT balance
      const encodes = slot < lo.slots;
      if (encodes) lo.runNodes(lo.s.encoderForward, slot, lo.locals[slot]);
      const outputs = new Map<string, number>();
      if (encodes) for (const v of this.boundary.outputs) outputs.set(v, lo.locals[slot].get(v)!);
      if (mpRank === 0)
        for (let k = r * M; k < Math.min((r + 1) * M, lo.m); k++)
          for (const v of this.boundary.outputs) this.imported(lo.locals[k], v, k);
      lo.mark({ kind: 'encoded', round: r, outputs, wait: lo.computeWait.splice(0) });
    }
  }

  /** level 3, phase 3: each round, mark the scatter, run the encoder backward */
  phase3(): void {
    const { enc, lo, M, mpRank } = this;
    if (!enc || this.level !== 3 || !lo.s.encoderBackward.length) return;
    for (let r = 0; r < enc.placement.slots / M; r++) {
      const slot = r * M + mpRank;
      lo.mark({ kind: 'encoder-backward', round: r, wait: lo.computeWait.splice(0) });
      if (slot >= lo.slots) continue;
      // the decoder's gradients stay in the slot's values (rank 0 scatters them); the backward
      // reads the scattered ones
      const local = lo.locals[slot].clone();
      for (const v of this.boundary.grads) this.imported(local, v, slot);
      // --full-hetero-dp-encoder-recompute: phase 1's activations are gone; the forward again
      if (enc.recompute) lo.runNodes(lo.s.encoderForward, slot, local);
      lo.runNodes(lo.s.encoderBackward, slot, local);
    }
  }
}
