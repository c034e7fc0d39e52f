// reduce_scatter on 2 and 4 ranks, through shared memory and over Gloo's TCP, against its plain
// computation on one process: every rank's input, summed block by block in group order (rank 0
// first) in f32, or in f32 and rounded to bf16 once for bf16, bit for bit. The values are uneven
// (each rank's at another scale), so a sum in any other order would differ in its last bits. Sizes
// span one round and many (the shared-memory lanes of 32–64 KiB, TCP's 1 MiB messages), in place
// (the distributed optimizer's buckets: only this rank's block is read back) and into a block.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { bf16ToF32, roundToBf16 } from '../../runtime/bf16.js';
import { ProgramBuilder } from '../runtime/program-builder.js';
import { generated, type Generator } from './generated.js';
import type { WorkerSpec } from './rank-worker.js';
import { range, runRanks } from './run-ranks.js';

type Case = { dtype: 'f32' | 'bf16'; block: number; inPlace: boolean };
const CASES: Case[] = [
  { dtype: 'f32', block: 5, inPlace: true },
  { dtype: 'f32', block: 700_001, inPlace: false }, // 3 TCP rounds, 11–22 shm rounds; streamed stores (≥ 2 MiB apart)
  { dtype: 'f32', block: 300_007, inPlace: true },
  { dtype: 'bf16', block: 37, inPlace: true },
  { dtype: 'bf16', block: 1_100_003, inPlace: false }, // 3 TCP rounds; streamed stores, rounded first
];

/** rank r's input of case k: its own scale, so the ranks' values differ in magnitude */
const gen = (P: number, r: number, k: number): Generator => ({
  count: P * CASES[k].block,
  mul: 7919 + 2 * r + k,
  add: 13 * r + k,
  mod: 1001,
  scale: [0.37, 1.3e-3, 291.7, 0.011][r] * (k + 1),
});

/** the values the worker stores for rank r, case k (f32, or bf16 rounded, both as f32) */
const storedCache = new Map<string, Float32Array>();
function stored(P: number, r: number, k: number): Float32Array {
  const key = `${P}/${r}/${k}`;
  let v = storedCache.get(key);
  if (!v) {
    v = Float32Array.from(generated(gen(P, r, k)));
    if (CASES[k].dtype === 'bf16') v = bf16ToF32(Uint16Array.from(v, roundToBf16));
    storedCache.set(key, v);
  }
  return v;
}

/** block r of the sum, in group order in f32 (rounded to bf16 once for bf16): the bits, as u32 or u16 */
function plainBlock(P: number, r: number, k: number): number[] {
  const { block, dtype } = CASES[k];
  const inputs = range(P, (j) => stored(P, j, k).subarray(r * block, (r + 1) * block));
  const acc = Float32Array.from(inputs[0]);
  for (let j = 1; j < P; j++) for (let i = 0; i < block; i++) acc[i] += inputs[j][i];
  return dtype === 'f32' ? [...new Uint32Array(acc.buffer)] : Array.from(acc, roundToBf16);
}

function bitsOf(base64: string, dtype: 'f32' | 'bf16', from: number, count: number): number[] {
  const bytes = Buffer.from(base64, 'base64');
  const all =
    dtype === 'f32'
      ? new Uint32Array(bytes.buffer, bytes.byteOffset, bytes.length / 4)
      : new Uint16Array(bytes.buffer, bytes.byteOffset, bytes.length / 2);
  return [...all.subarray(from, from + count)];
}

describe('reduce_scatter against its plain computation', () => {
  it.each([
    [2, 'shared memory'],
    [4, 'shared memory'],
    [2, 'tcp'],
    [4, 'tcp'],
  ] as const)(
    '%i ranks (%s): f32 and bf16, in place and into a block, summed in group order',
    async (P, transport) => {
      const b = new ProgramBuilder('p');
      const g = { group: 'dp', group_size: P };
      // an in-place buffer is written: an arena, filled like the parameters
      const xs = CASES.map((c, k) =>
        c.inPlace
          ? b.arena(`x${k}`, c.dtype, [P * c.block])
          : b.param(`x${k}`, [P * c.block], { dtype: c.dtype, trainable: false }).buffer,
      );
      const ys = CASES.map((c, k) => {
        const y = c.inPlace ? xs[k] : b.arena(`y${k}`, c.dtype, [c.block]);
        b.instr('comm', 'reduce_scatter', [xs[k]], [y], g);
        return y;
      });
      const rdzv = mkdtempSync(join(tmpdir(), 'lfc-rdzv-'));
      const spec: WorkerSpec = {
        programs: { p: b.build() },
        rankPrograms: range(P, () => 'p'),
        comm: {
          worldSize: P,
          store: `file:${rdzv}`,
          prefix: 'rs',
          groups: [{ name: 'dp[0]', ranks: range(P, (r) => r) }],
          rankGroups: { dp: range(P, () => 0) },
          contexts: [{ group: 0, stream: 'comm' }],
          timeoutMs: 20_000,
        },
        ranks: range(P, (r) => ({
          fill: {},
          generate: Object.fromEntries(xs.map((id, k) => [String(id), gen(P, r, k)])),
        })),
        read: ys,
        binary: true,
      };
      const env = { ...process.env, LFC_COMM_SHM: transport === 'tcp' ? '0' : '1' };
      const results = await runRanks(spec, P, env);
      rmSync(rdzv, { recursive: true, force: true });
      results.forEach((res, r) => {
        expect(res.error).toBeUndefined();
        expect(res.communicators).toContainEqual({
          name: 'dp[0]/comm',
          size: P,
          transport,
          direct: transport === 'shared memory',
        });
        CASES.forEach((c, k) => {
          const got = bitsOf(
            res.buffers![ys[k]] as string,
            c.dtype,
            c.inPlace ? r * c.block : 0,
            c.block,
          );
          const want = plainBlock(P, r, k);
          let wrong = 0;
          for (let i = 0; i < c.block; i++) if (got[i] !== want[i]) wrong++;
          expect({ rank: r, case: c, wrong }).toEqual({ rank: r, case: c, wrong: 0 });
        });
      });
    },
    120_000,
  );
});
