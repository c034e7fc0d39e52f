// Planned against measured memory on CPU: on the tiny models, one rank and a few layouts, f32 and
// --bf16, the most device bytes the native runtime holds on a rank in a step (its regions,
// allocated whole at the program's sizes, plus each stream's scratch high-water) never exceed that
// rank's planned device total at the bounds (compiler/report/memory.ts, scratch included), and the
// scratch it uses reaches a stated share of the planned scratch, so the plan is not wildly over.
//
// The batch fills every microbatch with five 32×32 images (the largest the tiny encoder takes: 80
// of the 128 visual tokens) and 110 of the 128 tokens, near the bounds the plan is made at.
// A program whose scratch slice is cut below what an instruction takes fails that instruction with
// a message naming it, what it asked and what was planned.

import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ProgramFile } from '../../compiler/plan/format.js';
import { memoryByProgram } from '../../compiler/report/memory.js';
import { writeBatchFile, type Microbatch } from '../../runtime/batch.js';
import { loadNative } from '../../runtime/native.js';
import { readPlan } from '../../runtime/plan-io.js';
import { cli } from '../helpers.js';
import { A2A_OVERLAP, BATCH } from '../layouts.js';
import { textMicrobatch } from '../runtime/program-builder.js';

const dir = mkdtempSync(join(tmpdir(), 'lfc-planned-memory-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/**
 * Σ scratch high-water over a rank's streams ≥ this share of its planned scratch (f32, bf16).
 * Measured on every rank of every case below: 0.152 in f32 on ranks that run the encoder and
 * 0.113 on pp 2's second stage (0.306 and 1.000 while the norm backwards still wrote their
 * forward's y into scratch; they now recompute the statistics alone, and attention's score tiles,
 * planned for one segment of the whole sequence, are the largest), 0.625 in bf16 on ranks that
 * run the encoder and 1.000 on pp 2's second stage (the report printed after the tests lists
 * each). What stays under the bound is the data: the plan sizes
 * attention's score tiles for one image of all 4·Nv = 512 patches (the runtime's longest segment
 * here is an image of 64; the encoder takes none larger), and bf16's staged copies for S and Nv at
 * their bounds (here 110 of 128 tokens, 80 of 128 visual tokens). The high-water also varies
 * from run to run: one-dense f32 measured 25,344 bytes, 0.092, once under a loaded CI run, against
 * 41,984 every other time (also at --threads 1). The 16,640 bytes between them are one 64 × 64
 * f32 attention score tile and a 256-byte take. Attention takes its tiles inside the kernel pool's
 * blocks (kernels/cpu/attention.cc), and the stream's thread counts only the blocks it runs: a
 * pool worker's takes are heap blocks of its own (kernels/cpu/storage.h, an unbound arena). When
 * the worker claims every block of that loop first, which a loaded machine makes likelier, the
 * stream's high-water lacks the tile. The f32 share allows that run.
 */
const SCRATCH_SHARE = { f32: 0.08, bf16: 0.5 };

const LEVEL3_A2A = [
  ...['--pp', '2', '--vpp', '2', '--ep', '2', '--enable-full-hetero-dp'],
  ...A2A_OVERLAP,
];
const CASES: readonly { name: string; model: string; ranks: number; flags: readonly string[] }[] = [
  { name: 'one-dense', model: 'tiny-vlm', ranks: 1, flags: [] },
  { name: 'one-moe', model: 'tiny-vlm-moe', ranks: 1, flags: [] },
  { name: 'tp2', model: 'tiny-vlm-moe', ranks: 2, flags: ['--tp', '2'] },
  { name: 'pp2', model: 'tiny-vlm-moe', ranks: 2, flags: ['--pp', '2'] },
  { name: 'ep2', model: 'tiny-vlm-moe', ranks: 2, flags: ['--ep', '2'] },
  { name: 'level3-a2a', model: 'tiny-vlm-moe', ranks: 4, flags: LEVEL3_A2A },
];

const BIG = join(dir, 'big-images.safetensors');
function bigImageBatch(): Microbatch[] {
  const [height, width] = [32, 32]; // the largest image the tiny encoder takes (8 × 8 patches)
  const microbatch = (seed: number): Microbatch => {
    const samples = [0, 1, 2, 3, 4].map((k) => [
      ...new Array<number>((height / 8) * (width / 8)).fill(1),
      ...[2 + ((seed + k) % 8), 10 + ((seed + 3 * k) % 8), 18 + (k % 4)],
      ...[40, 41, 42],
    ]);
    return {
      ...textMicrobatch(samples, 128),
      images: samples.map((_, k) => ({
        height,
        width,
        pixels: Float32Array.from({ length: 3 * height * width }, (_, i) =>
          Math.sin(0.41 * i + 11 * k + 101 * seed),
        ),
      })),
    };
  };
  return [0, 1, 2, 3].map(microbatch);
}

interface RankMemory {
  readonly rank: number;
  readonly program: string;
  readonly plannedBytes: number;
  readonly measuredBytes: number;
  readonly plannedScratch: number;
  readonly measuredScratch: number;
}

/** compiles and runs one step of a case; per rank, planned against measured */
async function measure(
  c: (typeof CASES)[number],
  precision: readonly string[],
): Promise<RankMemory[]> {
  const out = join(dir, `${c.name}${precision.length ? '-bf16' : ''}`);
  const nproc = c.ranks > 1 ? ['--nproc-per-node', String(c.ranks)] : [];
  const compiled = await cli(
    'compile',
    c.model,
    ...BATCH,
    ...nproc,
    ...c.flags,
    ...precision,
    '-o',
    out,
  );
  expect(compiled.err).toBe('');
  expect(compiled.code).toBe(0);
  const ran = await cli(
    'run',
    out,
    ...nproc,
    ...['--steps', '1', '--seed', '7', '--batch', BIG, '--quiet'],
  );
  expect(ran.err).toBe('');
  expect(ran.code).toBe(0);
  const metrics = JSON.parse(readFileSync(join(out, 'metrics.jsonl'), 'utf8').trim()) as {
    device_high_bytes: number;
    scratch_high_bytes: number;
    device_high_bytes_per_rank?: number[];
    scratch_high_bytes_per_rank?: number[];
  };
  const loaded = readPlan(out);
  const programs = [...loaded.programs.values()];
  const planned = new Map(
    memoryByProgram({ plan: loaded.plan, programs }).map((m) => [m.program, m]),
  );
  return loaded.plan.rankPrograms.map((id, rank) => ({
    rank,
    program: id,
    plannedBytes: planned.get(id)!.bound.deviceBytes,
    measuredBytes: metrics.device_high_bytes_per_rank?.[rank] ?? metrics.device_high_bytes,
    plannedScratch: planned.get(id)!.scratch,
    measuredScratch: metrics.scratch_high_bytes_per_rank?.[rank] ?? metrics.scratch_high_bytes,
  }));
}

const report: string[] = [];
afterAll(() => console.log(['planned vs measured device bytes per rank:', ...report].join('\n')));

beforeAll(() => writeBatchFile(BIG, bigImageBatch()));

describe('planned against measured memory (CPU runtime)', () => {
  for (const precision of [[], ['--bf16']] as const)
    for (const c of CASES)
      it(`${c.name}${precision.length ? ' --bf16' : ''} (${c.ranks} rank${c.ranks > 1 ? 's' : ''}): no rank holds more than its plan`, async () => {
        const ranks = await measure(c, precision);
        for (const r of ranks) {
          report.push(
            `  ${c.name}${precision.length ? ' bf16' : ''} r${r.rank} ${r.program}: planned ${r.plannedBytes} measured ${r.measuredBytes}` +
              ` (scratch planned ${r.plannedScratch} measured ${r.measuredScratch}, ${(r.measuredScratch / r.plannedScratch).toFixed(3)})`,
          );
          expect(r.measuredBytes, `rank ${r.rank} (${r.program})`).toBeLessThanOrEqual(
            r.plannedBytes,
          );
          expect(r.measuredScratch, `rank ${r.rank} (${r.program})`).toBeGreaterThanOrEqual(
            SCRATCH_SHARE[precision.length ? 'bf16' : 'f32'] * r.plannedScratch,
          );
        }
      }, 120_000);

  it('a scratch slice cut below what an instruction takes fails it, naming what it asked and what was planned', async () => {
    const out = join(dir, 'shrunk');
    expect((await cli('compile', 'tiny-vlm', ...BATCH, '--bf16', '-o', out)).code).toBe(0);
    const loaded = readPlan(out);
    const program = JSON.parse(loaded.programTexts.get('p0')!) as ProgramFile;
    const cut = 1024;
    const shrunk: ProgramFile = {
      ...program,
      regions: {
        ...program.regions,
        scratch: cut + program.scratchBytes.comm + program.scratchBytes.copy,
      },
      scratchBytes: { ...program.scratchBytes, compute: cut },
    };
    const rt = new (loadNative().Runtime)(JSON.stringify(shrunk), { symbols: loaded.plan.symbols });
    rt.initParams(7, loaded.plan.params);
    let lossTokens = 0;
    let captionTokens = 0;
    for (let j = 0; j < loaded.plan.training.numMicrobatches; j++) {
      const mb = rt.synthesize(j, 7, 0, j, {
        seqLength: loaded.plan.training.seqLength,
        vocab: 512,
      });
      lossTokens += mb.lossMask.reduce((a, b) => a + b, 0);
      captionTokens += rt.captionMask(j).reduce((a, b) => a + b, 0);
    }
    rt.setScalar('loss_tokens', lossTokens);
    rt.setScalar('caption_tokens', captionTokens);
    await expect(rt.step({ lr: 1e-3, step: 1 })).rejects.toThrow(
      /^step failed at instruction \d+ \(\w+, scope [^)]*\): scratch of stream compute: asked \d+ bytes with \d+ in use, but the plan gives 1024 /,
    );
    // the full plan runs
    const whole = new (loadNative().Runtime)(JSON.stringify(program), {
      symbols: loaded.plan.symbols,
    });
    whole.initParams(7, loaded.plan.params);
    for (let j = 0; j < loaded.plan.training.numMicrobatches; j++)
      whole.synthesize(j, 7, 0, j, { seqLength: loaded.plan.training.seqLength, vocab: 512 });
    whole.setScalar('loss_tokens', lossTokens);
    whole.setScalar('caption_tokens', captionTokens);
    const r = await whole.step({ lr: 1e-3, step: 1 });
    expect(r.memory.scratchHighBytes.compute).toBeGreaterThan(cut);
    expect(r.memory.scratchHighBytes.compute).toBeLessThanOrEqual(program.scratchBytes.compute);
  });
});
