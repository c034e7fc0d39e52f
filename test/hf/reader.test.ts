// The streaming reader (runtime/hf/reader.ts) on a hand-written file: a piece's elements come
// with one read per contiguous run (a row range: one read; a column slice: one per row, never the
// rows' other columns), converted exactly from BF16 and F16 (subnormals, ±0, ±∞, NaN) to f32,
// and rounded to nearest even into bf16.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { roundToBf16 } from '../../runtime/bf16.js';
import { halfToF32, HfCheckpointDir } from '../../runtime/hf/reader.js';
import { serializeSafetensors, type Tensor } from '../../runtime/safetensors.js';

const dir = mkdtempSync(join(tmpdir(), 'lfc-hf-reader-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const R = 6;
const C = 10;
const f32 = Float32Array.from({ length: R * C }, (_, i) => i + 0.5 + i / 1024);
const halves = Uint16Array.from([
  0x0000, 0x8000, 0x0001, 0x03ff, 0x3c00, 0xbc00, 0x7bff, 0x7c00, 0xfc00, 0x7e00,
]);
const tensors = new Map<string, Tensor>([
  ['m', { dtype: 'F32', shape: [R, C], data: f32 }],
  ['h', { dtype: 'F16', shape: [halves.length], data: halves }],
]);
writeFileSync(join(dir, 'model.safetensors'), serializeSafetensors(tensors));
const hf = HfCheckpointDir.open(dir);
afterAll(() => hf.close());

const range = (a: number, n: number) => Array.from({ length: n }, (_, i) => a + i);
const view = { hf: 'm', offset: 0, strides: [C, 1] };

describe('the reader', () => {
  it('a row range is one read of exactly its bytes', () => {
    const before = { ...hf.stats };
    const out = new Float32Array(2 * C);
    hf.readView(view, [range(3, 2), range(0, C)], out);
    expect([...out]).toEqual([...f32.subarray(3 * C, 5 * C)]);
    expect(hf.stats.reads - before.reads).toBe(1);
    expect(hf.stats.bytes - before.bytes).toBe(2 * C * 4);
  });

  it("a column slice is one read per row, of the slice's bytes only", () => {
    const before = { ...hf.stats };
    const out = new Float32Array(R * 3);
    hf.readView(view, [range(0, R), range(4, 3)], out);
    const want = range(0, R).flatMap((r) => [4, 5, 6].map((c) => f32[r * C + c]));
    expect([...out]).toEqual(want);
    expect(hf.stats.reads - before.reads).toBe(R);
    expect(hf.stats.bytes - before.bytes).toBe(R * 3 * 4);
  });

  it('a transposed view (an expert of a fused tensor) scatters each run into the piece', () => {
    // the piece is mᵀ [C, R]: element (c, r) at r·C + c
    const out = new Float32Array(C * R);
    hf.readView({ hf: 'm', offset: 0, strides: [1, C] }, [range(0, C), range(0, R)], out);
    for (let c = 0; c < C; c++)
      for (let r = 0; r < R; r++) expect(out[c * R + r]).toBe(f32[r * C + c]);
  });

  it('F16 → f32 is exact, F16 → bf16 rounds to nearest even', () => {
    const want = [0, -0, 2 ** -24, 1023 * 2 ** -24, 1, -1, 65504, Infinity, -Infinity, NaN];
    expect(Array.from(halves, halfToF32)).toEqual(want);
    const v = { hf: 'h', offset: 0, strides: [1] };
    const out = new Float32Array(halves.length);
    hf.readView(v, [range(0, halves.length)], out);
    expect([...out]).toEqual(want);
    const bf = new Uint16Array(halves.length);
    hf.readView(v, [range(0, halves.length)], { bf16: bf });
    expect([...bf]).toEqual(want.map((x) => roundToBf16(x)));
  });

  it('F32 → bf16 rounds to nearest even', () => {
    const bf = new Uint16Array(R * C);
    hf.readView(view, [range(0, R), range(0, C)], { bf16: bf });
    expect([...bf]).toEqual(Array.from(f32, (x) => roundToBf16(x)));
  });
});
