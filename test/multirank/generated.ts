// Buffers too large to list in a worker spec: a formula both the worker and the test evaluate.

export interface Generator {
  readonly count: number;
  readonly mul: number;
  readonly add: number;
  readonly mod: number;
  /** each value times this (uneven values, not exact sums); 1 when absent */
  readonly scale?: number;
}

/** The values a generator fills in (small integers without a scale: their sums are exact in f32
 * and i32). */
export function generated(g: Generator): number[] {
  const scale = g.scale ?? 1;
  return Array.from(
    { length: g.count },
    (_, i) => (((i * g.mul + g.add) % g.mod) - g.mod / 2) * scale,
  );
}
