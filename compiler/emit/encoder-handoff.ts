// Emission pass 3, encoder-handoff: the data movement of encoder levels 2 and 3 (DESIGN.md
// "Parallel topology"), as instructions on the compute stream, scope encoder_handoff.
//
// Holds before: lowering's handoff marks (compiler/emit/encoder-runs.ts) and its imports: buffers
//   the decoder reads for encoder outputs it did not make, and the encoder backward for output
//   gradients it did not make.
// Holds after: every import is filled and named for how:
//   decoder-forward   a broadcast over tp of each encoder output of the microbatch, in place,
//                     from its owner (level 2: TP rank mb mod tp; level 3: TP rank 0): `.broadcast`
//   encoded           level 3, each round: a gather_v over the model-parallel group to its rank 0
//                     of each output, a mock slot's part an empty block: `.gathered`
//   encoder-backward  level 3, each round: a scatter_v of each output gradient from rank 0:
//                     `.scattered`
//   level 2's mock slots read empty gradients (`.mock`, zero rows). Each mark's first instruction
//   waits for what lowering left pending there. No marks of these kinds and no imports remain.

import { valueTypes, type Graph } from '../../ir/graph.js';
import { formatDim } from '../../ir/shape.js';
import type { TensorType } from '../../ir/types.js';
import { isEncoderScope } from '../parallel/encoder.js';
import { bufferWith, type PlanInstruction } from '../plan/format.js';
import {
  insertAtMarks,
  nextNonComm,
  ProgramBuilder,
  scheduled,
  waitingFirst,
  type Mark,
  type ProgramDraft,
} from './draft.js';
import type { EmitOptions } from './options.js';

export interface EncoderBoundary {
  /** made by the encoder's forward, read by the decoder */
  readonly outputs: readonly string[];
  /** their gradients: made by the decoder's backward, read by the encoder's backward */
  readonly grads: readonly string[];
  readonly types: ReadonlyMap<string, TensorType>;
}

const boundaries = new WeakMap<Graph, EncoderBoundary>();

/**
 * The values that cross between encoder and decoder, in graph order, with their types: once per
 * graph (lowering and the handoff of every program ask).
 */
export function encoderBoundary(g: Graph): EncoderBoundary {
  let b = boundaries.get(g);
  if (!b) boundaries.set(g, (b = boundaryOf(g)));
  return b;
}

function boundaryOf(g: Graph): EncoderBoundary {
  const encoder = (phase: string) =>
    g.nodes.filter((n) => n.phase === phase && isEncoderScope(n.scope));
  const encoderMade = new Set(encoder('forward').flatMap((n) => n.outputs.map((o) => o.name)));
  const outputs = new Set(
    g.nodes
      .filter((n) => n.phase === 'forward' && !isEncoderScope(n.scope))
      .flatMap((n) => n.inputs.filter((v) => encoderMade.has(v))),
  );
  const decoderMade = new Set(
    g.nodes.filter((n) => !isEncoderScope(n.scope)).flatMap((n) => n.outputs.map((o) => o.name)),
  );
  const grads = new Set(
    encoder('backward').flatMap((n) => n.inputs.filter((v) => decoderMade.has(v))),
  );
  return { outputs: [...outputs], grads: [...grads], types: valueTypes(g) };
}

const HANDOFF_MARKS = new Set<Mark['kind']>(['encoded', 'decoder-forward', 'encoder-backward']);

export function encoderHandoff(d: ProgramDraft, g: Graph, opts: EmitOptions): ProgramDraft {
  const enc = opts.encoder;
  if (!enc || enc.placement.level < 2) return d;
  const h = new Handoff(d, g, opts);
  const inserts = new Map<number, PlanInstruction[]>();
  d.marks.forEach((m, k) => {
    if (m.kind === 'decoder-forward') inserts.set(k, h.broadcasts(m.mb));
    else if (m.kind === 'encoded') inserts.set(k, h.gathers(m.round, m.outputs));
    else if (m.kind === 'encoder-backward') inserts.set(k, h.scatters(m.round));
  });
  h.emptyMockGradients();
  // each mark's first instruction waits for what was pending there
  for (const [k, list] of inserts) {
    const m = d.marks[k];
    if (m.kind !== 'p2p' && list.length) list[0] = waitingFirst(list[0], m.wait);
  }
  const r = insertAtMarks(h.b.instructions, d.marks, inserts);
  let openWaits = d.openWaits;
  r.marks.forEach((m, k) => {
    if (m.kind === 'p2p' || inserts.get(k)?.length || !m.wait.length) return;
    const i = nextNonComm(r.instructions, m.pos);
    if (i >= 0) r.instructions[i] = waitingFirst(r.instructions[i], m.wait);
    else openWaits = [...m.wait, ...openWaits];
  });
  return {
    ...d,
    buffers: h.b.buffers,
    regions: h.b.regionTop,
    instructions: r.instructions,
    marks: r.marks.filter((m) => !HANDOFF_MARKS.has(m.kind)),
    imports: [],
    values: [],
    openWaits,
  };
}

/** The handoff's instructions, and the imports named as they are filled. */
class Handoff {
  readonly b: ProgramBuilder;
  private readonly level: number;
  private readonly T: number;
  private readonly M: number;
  private readonly mpRank: number;
  private readonly m: number;
  private readonly boundary;
  /** import buffer → its value and slot */
  private readonly importAt = new Map<number, { value: string; mb: number }>();
  private readonly importOf = new Map<string, number>();
  private readonly named = new Set<number>();

  constructor(
    private readonly d: ProgramDraft,
    g: Graph,
    opts: EmitOptions,
  ) {
    const enc = opts.encoder!;
    this.b = new ProgramBuilder(g, d);
    this.level = enc.placement.level;
    this.T = enc.tpSize;
    this.M = enc.placement.encoders;
    this.mpRank = (opts.pipeline?.stage ?? 0) * this.T + enc.tp;
    this.m = opts.numMicrobatches;
    this.boundary = encoderBoundary(g);
    for (const i of d.imports) {
      this.importAt.set(i.buffer, i);
      this.importOf.set(`${i.value}|${i.mb}`, i.buffer);
    }
  }

  /** names an import for how it is first filled (level 3's gathered outputs are broadcast too) */
  private filled(id: number, suffix: string): number {
    const i = this.importAt.get(id);
    if (i && !this.named.has(id)) {
      this.b.buffers[id] = bufferWith(this.b.buffers[id], { name: `${i.value}${suffix}` });
      this.named.add(id);
    }
    return id;
  }

  /** a zero-row block of a value's width: a mock slot's part in gather_v / scatter_v */
  private mockRows(v: string): number {
    const t = this.boundary.types.get(v)!;
    return this.b.addBuffer(`${v}.mock`, { ...t, shape: [0, t.shape[1]] }, 'arena', -1);
  }

  private collective(
    op: 'broadcast' | 'gather_v' | 'scatter_v',
    inputs: number[],
    outputs: number[],
    attrs: Record<string, unknown>,
    microbatch: number,
    phase: 'forward' | 'backward',
  ): PlanInstruction {
    const scope = 'encoder_handoff';
    return scheduled(
      { stream: 'compute', op, inputs, outputs, attrs, microbatch, phase, scope },
      [],
    );
  }

  /** before mb's decoder forward: each output from its owner over tp, in place */
  broadcasts(mb: number): PlanInstruction[] {
    const root = this.level === 2 ? mb % this.T : 0;
    return this.boundary.outputs.map((v) => {
      const id = this.filled(this.d.values[mb].get(v)!, '.broadcast');
      const attrs = { group: 'tp', group_size: this.T, root };
      return this.collective('broadcast', [id], [id], attrs, mb, 'forward');
    });
  }

  /** level 3, after round r's encode: each output gathered to model-parallel rank 0 */
  gathers(r: number, outputs: ReadonlyMap<string, number>): PlanInstruction[] {
    const { M } = this;
    return this.boundary.outputs.map((v) => {
      const x = outputs.get(v) ?? this.mockRows(v);
      const outs =
        this.mpRank === 0
          ? Array.from({ length: M }, (_, i) => {
              const k = r * M + i;
              return k < this.m
                ? this.filled(this.d.values[k].get(v)!, '.gathered')
                : this.mockRows(v);
            })
          : [this.mockRows(v)];
      const rows = outs.map((id) => this.b.buffers[id].shape[0]);
      const attrs = { group: 'mp', group_size: M, root: 0, out_rows: rows };
      // its blocks are of different microbatches: each buffer's own sizes (microbatch -1)
      return this.collective('gather_v', [x], outs, attrs, -1, 'forward');
    });
  }

  /** level 3, before round r's encoder backward: each output gradient scattered from rank 0 */
  scatters(r: number): PlanInstruction[] {
    const { M } = this;
    const slot = r * M + this.mpRank;
    return this.boundary.grads.map((v) => {
      const ins =
        this.mpRank === 0
          ? Array.from({ length: M }, (_, i) => {
              const k = r * M + i;
              return k < this.m ? this.d.values[k].get(v)! : this.mockRows(v);
            })
          : [this.mockRows(v)];
      const into = this.importOf.get(`${v}|${slot}`);
      const out = into !== undefined ? this.filled(into, '.scattered') : this.mockRows(v);
      const attrs = {
        group: 'mp',
        group_size: M,
        root: 0,
        out_rows: [this.b.buffers[out].shape[0]],
      };
      return this.collective('scatter_v', ins, [out], attrs, -1, 'backward');
    });
  }

  /** level 2: a mock slot's output gradients are empty blocks (the import becomes one) */
  emptyMockGradients(): void {
    if (this.level !== 2) return;
    for (const i of this.d.imports) {
      if (i.mb < this.m || !this.boundary.grads.includes(i.value)) continue;
      const t = this.boundary.types.get(i.value)!;
      this.b.buffers[i.buffer] = {
        id: i.buffer,
        name: `${i.value}.mock`,
        region: 'arena',
        space: t.space ?? 'device',
        dtype: t.dtype,
        shape: ['0', formatDim(t.shape[1])],
        offset: 0,
        bytes: 0,
        viewOf: undefined,
        microbatch: -1,
      };
    }
  }
}
