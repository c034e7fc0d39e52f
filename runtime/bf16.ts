// bfloat16 as the runtime stores it (runtime-native/src/core/bf16.h): the upper 16 bits of an
// IEEE f32. Converting to f32 is exact; from f32 rounds to nearest, ties to even, and keeps NaN a
// (quiet) NaN, as the native runtime's conversion does.

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** bf16 bits → f32 values */
export function bf16ToF32(bits: Uint16Array): Float32Array {
  const out = new Float32Array(bits.length);
  const outBits = new Uint32Array(out.buffer);
  for (let i = 0; i < bits.length; i++) outBits[i] = bits[i] << 16;
  return out;
}

/** one f32 → its bf16 bits, round to nearest even */
export function roundToBf16(x: number): number {
  f32[0] = x;
  const u = u32[0];
  if ((u & 0x7f800000) === 0x7f800000 && (u & 0x007fffff) !== 0) return (u >>> 16) | 0x0040;
  return ((u + 0x7fff + ((u >>> 16) & 1)) >>> 16) & 0xffff;
}

/** f32 values into bf16 bits (`into`, same length), rounded to nearest even */
export function f32ToBf16(values: Float32Array, into: Uint16Array): void {
  if (into.length !== values.length)
    throw new Error(`bf16: ${values.length} values into ${into.length} elements`);
  for (let i = 0; i < values.length; i++) into[i] = roundToBf16(values[i]);
}
