// What level 3's memory options do to stage 0's planned memory (issue: parallel compilation part
// 2, item 4), on tiny-vlm-moe over 2 ranks (pp 2, 4 microbatches: two rounds of two encodes):
//   --full-hetero-dp-cpu-offload       what the encoder leaves idle on the device across the
//                                      pipeline's peak (gathered outputs, their gradients, the
//                                      activations phase 1 keeps for phase 3) waits on the host:
//                                      the peak falls by what it moves (compiler/plan/
//                                      encoder-offload.ts); the packed arena falls with it
//   --full-hetero-dp-encoder-recompute the encoder activations kept from phase 1 for phase 3 are
//                                      dropped: the peak falls by exactly their bytes
// and the same two on the article's 30B launch line as written (stage 0's bound: 221.46 GiB; with
// offload 202.71, with recompute 203.46; bench/encoder-memory.ts prints the figures).
import { describe, expect, it } from 'vitest';
import { parseCompileArgs } from '../../cli/compile.js';
import { compile, type CompileOptions, type EncoderOptions } from '../../compiler/pipeline.js';
import type { PlanInstruction, ProgramFile } from '../../compiler/plan/format.js';
import { ARTICLE_30B, argvOf } from '../../examples/article-launch-lines.js';

const aligned = (bytes: number) => Math.ceil(Math.max(bytes, 1) / 64) * 64;

function stage0(encoder: EncoderOptions): ProgramFile {
  const r = compile({
    model: 'tiny-vlm-moe',
    nprocPerNode: 2,
    parallel: { pp: 2 },
    microBatchSize: 1,
    globalBatchSize: 4,
    encoder: { fullHeteroDp: true, ...encoder },
  });
  return r.programs.find((p) => p.id === 'p0')!;
}

/** arena buffers by their first and last instruction (views count for the buffer they share) */
function lifetimes(p: ProgramFile) {
  const first = new Map<number, number>();
  const last = new Map<number, number>();
  const producer = new Map<number, number>();
  p.instructions.forEach((ins, i) => {
    for (const id of [...ins.inputs, ...ins.outputs]) {
      const b = p.buffers[id].viewOf ?? id;
      if (p.buffers[b].region !== 'arena') continue;
      if (!first.has(b)) first.set(b, i);
      last.set(b, i);
    }
    for (const id of ins.outputs) {
      const b = p.buffers[id].viewOf ?? id;
      if (!producer.has(b)) producer.set(b, i);
    }
  });
  return { first, last, producer };
}

/** device bytes a program's offload copies move (those `keep` takes) */
const offloadedBytes = (p: ProgramFile, keep: (x: PlanInstruction) => boolean = () => true) =>
  p.instructions
    .filter((x) => x.op === 'offload' && keep(x))
    .reduce((a, x) => a + aligned(p.buffers[x.inputs[0]].bytes), 0);

/** where phase 2 begins on stage 0: its first decoder instruction */
const decoderStart = (p: ProgramFile) =>
  p.instructions.findIndex((i) => i.scope.startsWith('model.'));

describe('level 3 memory options on stage 0 (tiny-vlm-moe, pp 2, 4 microbatches)', () => {
  const plain = stage0({});

  const offload = stage0({ cpuOffload: true });
  const copies = (op: 'offload' | 'reload') =>
    offload.instructions.flatMap((x, i) => (x.op === op ? [{ x, i }] : []));
  const offloaded = (keep: (x: PlanInstruction) => boolean) => offloadedBytes(offload, keep);
  const all = offloadedBytes(offload);

  it('cpu offload: the peak falls by the bytes it moves to the host (within 5%); the packed arena falls too', () => {
    expect(all).toBeGreaterThan(0);
    const drop = plain.arenaLowerBoundBytes - offload.arenaLowerBoundBytes;
    expect(drop).toBeGreaterThan(0.95 * all);
    expect(drop).toBeLessThanOrEqual(all);
    expect(offload.regions.arena).toBeLessThan(plain.regions.arena);
  });

  it('cpu offload: it moves gathered outputs, their gradients and the activations kept for phase 3', () => {
    // the gathered outputs: made by gather_v (the handoff); their gradients: made by the
    // decoder's backward; the kept activations: made by the encoder's forward
    expect(
      offloaded((x) => x.scope === 'encoder_handoff' && x.phase === 'forward'),
    ).toBeGreaterThan(0);
    expect(
      offloaded((x) => x.scope.startsWith('model.') && x.phase === 'backward'),
    ).toBeGreaterThan(0);
    expect(
      offloaded((x) => x.scope.startsWith('visual.') && x.phase === 'forward'),
    ).toBeGreaterThan(0);
  });

  it('cpu offload: every copy is on the copy stream; nothing reads a buffer once it is reloaded elsewhere', () => {
    const root = (id: number) => offload.buffers[id].viewOf ?? id;
    for (const { x } of [...copies('offload'), ...copies('reload')]) expect(x.stream).toBe('copy');
    const offloadOf = new Map(copies('offload').map(({ x }) => [x.outputs[0], x.inputs[0]]));
    const reloads = copies('reload');
    expect(reloads.length).toBe(offloadOf.size);
    for (const { x, i } of reloads) {
      const gone = root(offloadOf.get(x.inputs[0])!);
      const later = offload.instructions.slice(i + 1);
      expect(later.some((y) => [...y.inputs, ...y.outputs].some((id) => root(id) === gone))).toBe(
        false,
      );
      // the next reader waits for the reload
      const [e] = x.record;
      const reader = later.find((y) => y.inputs.some((id) => root(id) === x.outputs[0]));
      expect(reader?.wait).toContain(e);
    }
  });

  it('encoder recompute: the peak falls by exactly the encoder activations phase 1 kept for phase 3', () => {
    const recompute = stage0({ recompute: true });
    const kept = keptForPhase3(plain);
    expect(kept).toBeGreaterThan(0);
    expect(plain.arenaLowerBoundBytes - recompute.arenaLowerBoundBytes).toBe(kept);
  });
});

/** bytes of buffers the encoder's forward made in phase 1 that are still needed after phase 2
 * starts, other than the outputs the decoder reads: its phase-3 backward's saved activations */
function keptForPhase3(plain: ProgramFile): number {
  const { first, last, producer } = lifetimes(plain);
  const start = decoderStart(plain);
  const decoderReads = new Set(
    plain.instructions
      .filter((i) => !i.scope.startsWith('visual') && i.scope !== 'encoder_handoff')
      .flatMap((i) => i.inputs.map((id) => plain.buffers[id].viewOf ?? id)),
  );
  let kept = 0;
  for (const [b, s] of first) {
    const made = plain.instructions[producer.get(b)!];
    if (s >= start || last.get(b)! < start || decoderReads.has(b)) continue;
    if (made.scope.startsWith('visual') && made.phase === 'forward')
      kept += aligned(plain.buffers[b].bytes);
  }
  return kept;
}

describe("level 3 memory options on the article's 30B line (stage 0)", () => {
  const line: CompileOptions = parseCompileArgs(argvOf(ARTICLE_30B)).options;
  const stage0Of = (encoder: EncoderOptions) =>
    compile({ ...line, encoder: { ...line.encoder, ...encoder } }).programs.find(
      (p) => p.id === 'p0',
    )!;
  const plain = stage0Of({});

  it('cpu offload: the planned peak falls by the bytes it moves (within 5%)', () => {
    const offload = stage0Of({ cpuOffload: true });
    // the line's fine-grained activation offload copies the same with and without
    const moved = offloadedBytes(offload) - offloadedBytes(plain);
    const drop = plain.arenaLowerBoundBytes - offload.arenaLowerBoundBytes;
    expect(moved).toBeGreaterThan(2 ** 30);
    expect(Math.abs(drop - moved)).toBeLessThanOrEqual(0.05 * moved);
    expect(offload.regions.arena).toBeLessThan(plain.regions.arena);
  });

  it('encoder recompute: the planned peak falls by exactly the activations it drops', () => {
    const recompute = stage0Of({ recompute: true });
    const kept = keptForPhase3(plain);
    expect(kept).toBeGreaterThan(2 ** 30);
    expect(plain.arenaLowerBoundBytes - recompute.arenaLowerBoundBytes).toBe(kept);
  });
});
