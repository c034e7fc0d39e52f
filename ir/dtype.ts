// Element types of IR values and their sizes.

export const DTYPES = ['f32', 'f64', 'bf16', 'f16', 'i32', 'i64', 'u8'] as const;
export type DType = (typeof DTYPES)[number];

export const DTYPE_BYTES: Record<DType, number> = {
  f32: 4,
  f64: 8,
  bf16: 2,
  f16: 2,
  i32: 4,
  i64: 8,
  u8: 1,
};

export function isDType(s: string): s is DType {
  return (DTYPES as readonly string[]).includes(s);
}

export function isFloat(d: DType): boolean {
  return d === 'f32' || d === 'f64' || d === 'bf16' || d === 'f16';
}

export function isInt(d: DType): boolean {
  return d === 'i32' || d === 'i64' || d === 'u8';
}
