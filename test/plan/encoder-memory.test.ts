// What level 3's memory options do to stage 0's planned memory (issue: parallel compilation part
// 2, item 4), on tiny-vlm-moe over 2 ranks (pp 2, 4 microbatches: two rounds of two encodes):
//   --full-hetero-dp-cpu-offload       the gathered encoder outputs wait on the host: when the
//                                      decoder starts, the device holds exactly their bytes less;
//                                      their gradients wait there for phase 3 the same way; the
//                                      peak never rises
//   --full-hetero-dp-encoder-recompute the encoder activations kept from phase 1 for phase 3 are
//                                      dropped: the peak falls by exactly their bytes
// The plan frees each microbatch's outputs at the decoder's last read of them, so once the
// pipeline's chunk-0 forwards are done the offload has nothing left to save (see the README).
import { describe, expect, it } from 'vitest';
import { compile, type EncoderOptions } from '../../compiler/pipeline.js';
import type { ProgramFile } from '../../compiler/plan/format.js';

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

/** where phase 2 begins on stage 0: its first decoder instruction, or the reload before it */
const decoderStart = (p: ProgramFile) =>
  p.instructions.findIndex(
    (i) => i.scope.startsWith('model.') || (i.op === 'reload' && i.scope === 'encoder_handoff'),
  );

/** arena bytes live just before instruction t */
function liveBefore(p: ProgramFile, t: number): number {
  const { first, last } = lifetimes(p);
  let live = 0;
  for (const [b, s] of first) if (s < t && last.get(b)! >= t) live += aligned(p.buffers[b].bytes);
  return live;
}

describe('level 3 memory options on stage 0 (tiny-vlm-moe, pp 2, 4 microbatches)', () => {
  const plain = stage0({});

  const offload = stage0({ cpuOffload: true });
  /** host bytes the handoff offloads in one phase (outputs: forward, their gradients: backward) */
  const offloaded = (phase: string) =>
    offload.instructions
      .filter((i) => i.op === 'offload' && i.scope === 'encoder_handoff' && i.phase === phase)
      .reduce((a, i) => a + aligned(offload.buffers[i.outputs[0]].bytes), 0);

  it('cpu offload: the device holds the gathered outputs less when phase 2 starts; the peak does not rise', () => {
    expect(offloaded('forward')).toBeGreaterThan(0);
    const saved =
      liveBefore(plain, decoderStart(plain)) - liveBefore(offload, decoderStart(offload));
    expect(saved).toBe(offloaded('forward'));
    expect(offload.arenaLowerBoundBytes).toBeLessThanOrEqual(plain.arenaLowerBoundBytes);
  });

  it('cpu offload: the output gradients wait for phase 3 on the host', () => {
    expect(offloaded('backward')).toBeGreaterThan(0);
    // phase 3 begins with the first scatter_v, or the reload of its gradients before it
    const phase3 = (p: ProgramFile) =>
      p.instructions.findIndex(
        (i) =>
          i.op === 'scatter_v' ||
          (i.op === 'reload' && i.scope === 'encoder_handoff' && i.phase === 'backward'),
      );
    const saved = liveBefore(plain, phase3(plain)) - liveBefore(offload, phase3(offload));
    expect(saved).toBe(offloaded('backward'));
  });

  it('encoder recompute: the peak falls by exactly the encoder activations phase 1 kept for phase 3', () => {
    const recompute = stage0({ recompute: true });
    // buffers the encoder's forward made in phase 1 that are still needed after phase 2 starts,
    // other than the outputs the decoder reads (its phase-3 backward's saved activations)
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
    expect(kept).toBeGreaterThan(0);
    expect(plain.arenaLowerBoundBytes - recompute.arenaLowerBoundBytes).toBe(kept);
  });
});
