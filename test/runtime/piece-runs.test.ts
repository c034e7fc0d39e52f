// PieceRuns (runtime/checkpoint.ts), the runs by which checkpoints copy a rank's piece of a whole
// tensor, against the element-by-element definition: element i of the piece (row-major over its
// local shape, local index l_d along dim d) is element Σ_d index[d][l_d] · stride_d of the whole.
import { describe, expect, it } from 'vitest';
import { PieceRuns, type HeldPiece } from '../../runtime/checkpoint.js';

/** the definition: each piece element's flat index in the whole */
function offsetsOf(p: HeldPiece): number[] {
  let offsets = [0];
  let stride = 1;
  for (let d = p.shape.length - 1; d >= 0; d--) {
    const next: number[] = [];
    for (const g of p.index[d]) for (const o of offsets) next.push(g * stride + o);
    offsets = next;
    stride *= p.shape[d];
  }
  return offsets;
}

/** a deterministic pseudo-random source */
function lcg(seed: number): (n: number) => number {
  let x = seed;
  return (n) => {
    x = (x * 1103515245 + 12345) % 2 ** 31;
    return x % n;
  };
}

/** pieces as lfc makes them (a contiguous block per dim), and sorted strided or scattered picks */
function pieces(): HeldPiece[] {
  const rnd = lcg(7);
  const out: HeldPiece[] = [{ param: 's', name: 's', shape: [], index: [] }];
  for (let k = 0; k < 60; k++) {
    const shape = Array.from({ length: 1 + rnd(3) }, () => 1 + rnd(9));
    const index = shape.map((n) => {
      const kind = rnd(3);
      if (kind === 0) {
        const start = rnd(n);
        const length = 1 + rnd(n - start);
        return Array.from({ length }, (_, i) => start + i);
      }
      if (kind === 1) return Array.from({ length: n }, (_, i) => i).filter((i) => i % 2 === 1);
      return Array.from({ length: n }, (_, i) => i).filter(() => rnd(2) === 0);
    });
    if (index.some((ix) => ix.length === 0)) continue;
    out.push({ param: `p${k}`, name: `w${k}`, shape, index });
  }
  return out;
}

const total = (shape: readonly number[]) => shape.reduce((a, b) => a * b, 1);

describe('PieceRuns', () => {
  it('scatter and gather equal the element-by-element copy, for every sub-range', () => {
    for (const p of pieces()) {
      const at = offsetsOf(p);
      const runs = PieceRuns.of(p);
      expect(runs.elements).toBe(at.length);
      const size = total(p.shape);
      const whole = Float32Array.from({ length: size }, (_, i) => i * 0.5 + 1);
      const n = at.length;
      for (const [from, len] of [
        [0, n],
        [Math.floor(n / 3), Math.ceil(n / 3)],
        [n - 1, 1],
      ]) {
        // gather
        const want = Float32Array.from({ length: len }, (_, j) => whole[at[from + j]]);
        expect(runs.gather(whole, from, len)).toEqual(want);
        // scatter
        const values = Float32Array.from({ length: len }, (_, j) => -(j + 1));
        const got = new Float32Array(size);
        const covered = new Uint8Array(size);
        runs.scatter(got, covered, values, from);
        const ref = new Float32Array(size);
        const refCovered = new Uint8Array(size);
        for (let j = 0; j < len; j++) {
          ref[at[from + j]] = values[j];
          refCovered[at[from + j]] = 1;
        }
        expect(got).toEqual(ref);
        expect(covered).toEqual(refCovered);
      }
    }
  });

  it('a whole tensor is one run, a column block one run per row', () => {
    const rows = [0, 1, 2, 3];
    const piece = (columns: number[]): HeldPiece => ({
      param: 'p',
      name: 'p',
      shape: [4, 6],
      index: [rows, columns],
    });
    const full = piece([0, 1, 2, 3, 4, 5]);
    const cols = piece([3, 4, 5]);
    const runsOf = (p: HeldPiece) =>
      (PieceRuns.of(p) as unknown as { length: Float64Array }).length;
    expect([...runsOf(full)]).toEqual([24]);
    expect([...runsOf(cols)]).toEqual([3, 3, 3, 3]);
  });
});
