// The encoder apart (levels 2 and 3; compiler/parallel/encoder.ts), part of lowering: where the
// encoder runs, and how its outputs reach the decoder and their gradients come back.
//
//   level 2  stage 0, before the decoder's first forward of a TP group's microbatches: every TP
//            rank encodes its own one of the group (microbatch g·tp + i on TP rank i); before
//            each microbatch's decoder forward, a broadcast of its encoder outputs from the owner
//            over tp. After the group's last decoder backward, the owner's encoder backward (the
//            output gradients are whole on every TP rank; a mock slot's are empty blocks).
//   level 3  phase 1, before the pipeline: round r encodes slot r·M + mpRank on every rank of
//            the model-parallel group (M = tp·pp) and gathers the outputs to its rank 0
//            (gather_v, mock slots as empty blocks); stage 0's TP ranks get each microbatch's
//            outputs by broadcast from TP rank 0 before its decoder forward. Phase 3, after the
//            pipeline: each round scatters the output gradients back from rank 0 (scatter_v) and
//            runs the encoder backward (the forward again first under
//            --full-hetero-dp-encoder-recompute).

import { valueTypes } from '../../ir/graph.js';
import { isEncoderScope } from '../parallel/encoder.js';
import type { EmitEncoder } from './options.js';
import type { Lowering } from './lower.js';

export class EncoderHandoff {
  private readonly enc?: EmitEncoder;
  private readonly level: number;
  /** decoder TP size */
  private readonly T: number;
  /** encoding ranks of a level-3 round (the model-parallel group) */
  private readonly M: number;
  /** model-parallel group rank (level 3's gather and scatter root is 0) */
  private readonly mpRank: number;
  /** values the encoder's forward makes that the decoder reads */
  private readonly encoderOutputs: string[];
  /** their gradients: values the decoder's backward makes that the encoder's backward reads */
  private readonly outputGrads: string[];
  private readonly valueType;

  constructor(private readonly lo: Lowering) {
    const { g, opts, s } = lo;
    this.enc = opts.encoder;
    this.level = this.enc?.placement.level ?? 0;
    this.T = this.enc?.tpSize ?? 1;
    this.M = this.enc?.placement.encoders ?? 1;
    this.mpRank = s.pipe.stage * this.T + (this.enc?.tp ?? 0);
    this.valueType = valueTypes(g);
    const encoderMade = new Set(s.encoderForward.flatMap((n) => n.outputs.map((o) => o.name)));
    this.encoderOutputs = [
      ...new Set(
        g.nodes
          .filter((n) => n.phase === 'forward' && !isEncoderScope(n.scope))
          .flatMap((n) => n.inputs.filter((v) => encoderMade.has(v))),
      ),
    ];
    const decoderMade = new Set(
      g.nodes.filter((n) => !isEncoderScope(n.scope)).flatMap((n) => n.outputs.map((o) => o.name)),
    );
    this.outputGrads = [
      ...new Set(s.encoderBackward.flatMap((n) => n.inputs.filter((v) => decoderMade.has(v)))),
    ];
  }

  /** a zero-row block of a value's width: a mock slot's part in gather_v / scatter_v */
  private mockRows(v: string): number {
    const t = this.valueType.get(v)!;
    return this.lo.b.addBuffer(`${v}.mock`, { ...t, shape: [0, t.shape[1]] }, 'arena', -1);
  }

  private collective(
    op: 'broadcast' | 'gather_v' | 'scatter_v',
    inputs: number[],
    outputs: number[],
    attrs: Record<string, unknown>,
    microbatch: number,
    phase: 'forward' | 'backward',
  ): void {
    this.lo.pushCompute({
      stream: 'compute',
      op,
      inputs,
      outputs,
      attrs,
      microbatch,
      phase,
      scope: 'encoder_handoff',
    });
  }

  /** stage 0, before microbatch mb's first decoder forward: encode (level 2), hand over */
  beforeDecoderForward(mb: number): void {
    const { enc, lo, T } = this;
    if (!enc || this.level < 2) return;
    if (this.level === 2 && mb % T === 0) {
      // the group's first microbatch: every TP rank encodes its own one of the group
      const j = mb + enc.tp;
      if (j < lo.slots) lo.runNodes(lo.s.encoderForward, j, lo.locals[j]);
    }
    if (T === 1) return;
    const root = this.level === 2 ? mb % T : 0;
    for (const v of this.encoderOutputs) {
      const own = lo.locals[mb].get(v);
      const id = own ?? lo.b.addBuffer(`${v}.broadcast`, this.valueType.get(v)!, 'arena', mb);
      lo.locals[mb].set(v, id);
      this.collective('broadcast', [id], [id], { group: 'tp', group_size: T, root }, mb, 'forward');
    }
  }

  /** stage 0, after microbatch mb's last decoder backward: level 2's deferred encoder backward */
  afterDecoderBackward(mb: number): void {
    const { enc, lo, T } = this;
    if (!enc || this.level !== 2 || !lo.s.encoderBackward.length) return;
    if (mb % T !== T - 1 && mb !== lo.m - 1) return;
    const j = mb - (mb % T) + enc.tp;
    if (j >= lo.slots) return;
    // a mock slot's outputs reach no decoder: their gradients are empty
    if (j >= lo.m) for (const v of this.outputGrads) lo.locals[j].set(v, this.mockRows(v));
    lo.runNodes(lo.s.encoderBackward, j, lo.locals[j]);
  }

  /** level 3, phase 1: each round, encode this rank's slot, gather the outputs to rank 0 */
  encoderPhase1(): void {
    const { enc, lo, M, mpRank } = this;
    if (!enc || this.level !== 3) return;
    for (let r = 0; r < enc.placement.slots / M; r++) {
      const slot = r * M + mpRank;
      const encodes = slot < lo.slots; // a real slot, or a mock one under the ViT balance
      if (encodes) lo.runNodes(lo.s.encoderForward, slot, lo.locals[slot]);
      for (const v of this.encoderOutputs) {
        const x = encodes ? lo.locals[slot].get(v)! : this.mockRows(v);
        const outs = mpRank === 0 ? this.gathered(v, r) : [this.mockRows(v)];
        const rows = outs.map((id) => lo.b.buffers[id].shape[0]);
        const attrs = { group: 'mp', group_size: M, root: 0, out_rows: rows };
        // its blocks are of different microbatches: each buffer's own sizes (microbatch -1)
        this.collective('gather_v', [x], outs, attrs, -1, 'forward');
      }
    }
  }

  /** rank 0's buffers for round r's gathered outputs of v (mock slots: empty blocks) */
  private gathered(v: string, r: number): number[] {
    const { lo, M } = this;
    return Array.from({ length: M }, (_, i) => {
      const k = r * M + i;
      if (k >= lo.m) return this.mockRows(v);
      const id = lo.b.addBuffer(`${v}.gathered`, this.valueType.get(v)!, 'arena', k);
      lo.locals[k].set(v, id);
      return id;
    });
  }

  /** level 3, phase 3: each round, scatter the output gradients back, run the encoder backward */
  encoderPhase3(): void {
    const { enc, lo, M, mpRank } = this;
    if (!enc || this.level !== 3 || !lo.s.encoderBackward.length) return;
    for (let r = 0; r < enc.placement.slots / M; r++) {
      const slot = r * M + mpRank;
      const encodes = slot < lo.slots;
      const local = encodes ? lo.locals[slot] : undefined;
      for (const v of this.outputGrads) {
        const ins =
          mpRank === 0
            ? Array.from({ length: M }, (_, i) => {
                const k = r * M + i;
                return k < lo.m ? lo.locals[k].get(v)! : this.mockRows(v);
              })
            : [this.mockRows(v)];
        const out = encodes
          ? lo.b.addBuffer(`${v}.scattered`, this.valueType.get(v)!, 'arena', slot)
          : this.mockRows(v);
        const attrs = {
          group: 'mp',
          group_size: M,
          root: 0,
          out_rows: [lo.b.buffers[out].shape[0]],
        };
        this.collective('scatter_v', ins, [out], attrs, -1, 'backward');
        local?.set(v, out);
      }
      if (!encodes) continue;
      // --full-hetero-dp-encoder-recompute: phase 1's activations are gone; the forward again
      if (enc.recompute) lo.runNodes(lo.s.encoderForward, slot, local!);
      lo.runNodes(lo.s.encoderBackward, slot, local!);
    }
  }
}
