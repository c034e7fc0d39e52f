// OpenBLAS's kernels for the CPU (runtime/blas.ts): the core type its CPUID flags run, a value
// already in OPENBLAS_CORETYPE kept, and the addon running what was chosen.
import { describe, expect, it } from 'vitest';
import { chooseOpenblasKernel, cpuFlags, openblasCoretypeFor } from '../../runtime/blas.js';
import { loadNative } from '../../runtime/native.js';

const AVX512 = [
  'sse3',
  'avx',
  'avx2',
  'fma',
  'avx512f',
  'avx512cd',
  'avx512bw',
  'avx512dq',
  'avx512vl',
];

describe('the OpenBLAS kernels for a CPU', () => {
  it('by its flags: Cooperlake with AVX-512 BF16, SkylakeX with AVX-512, Haswell with AVX2', () => {
    // a Sapphire Rapids (avx512_fp16, which OpenBLAS 0.3.21 does not know) and a Zen 4
    expect(openblasCoretypeFor(new Set([...AVX512, 'avx512_bf16', 'avx512_fp16']))).toBe(
      'Cooperlake',
    );
    expect(openblasCoretypeFor(new Set([...AVX512, 'avx512_bf16']))).toBe('Cooperlake');
    expect(openblasCoretypeFor(new Set(AVX512))).toBe('SkylakeX');
    expect(openblasCoretypeFor(new Set(['sse3', 'avx', 'avx2', 'fma']))).toBe('Haswell');
    expect(openblasCoretypeFor(new Set(['sse3', 'avx']))).toBeUndefined();
  });

  it('reads the flags from cpuinfo', () => {
    const text = 'processor\t: 0\nflags\t\t: fpu sse3 avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu\n';
    expect([...cpuFlags(text)]).toEqual(['fpu', 'sse3', 'avx2', 'fma']);
  });

  it('keeps OPENBLAS_CORETYPE when it is set, and sets it when not', () => {
    const given = { OPENBLAS_CORETYPE: 'Haswell' };
    expect(chooseOpenblasKernel(given, new Set(AVX512))).toEqual({
      coretype: 'Haswell',
      source: 'environment',
    });
    expect(given.OPENBLAS_CORETYPE).toBe('Haswell');
    const unset: NodeJS.ProcessEnv = {};
    expect(chooseOpenblasKernel(unset, new Set(AVX512))).toEqual({
      coretype: 'SkylakeX',
      source: 'cpu',
    });
    expect(unset.OPENBLAS_CORETYPE).toBe('SkylakeX');
    expect(chooseOpenblasKernel({}, new Set(['sse3']))).toEqual({ source: 'none' });
  });

  it('the addon runs the kernels chosen for this CPU', () => {
    const native = loadNative();
    const chosen = process.env.OPENBLAS_CORETYPE;
    if (chosen) expect(native.blasCore.toLowerCase()).toBe(chosen.toLowerCase());
    expect(native.blasCore).not.toBe('');
  });

  it('sgemmGflops times cblas_sgemm (bench/mfu.ts) and refuses sizes it cannot run', () => {
    const native = loadNative();
    const gflops = native.sgemmGflops(64, 1, 2);
    expect(Number.isFinite(gflops) && gflops > 0).toBe(true);
    expect(() => native.sgemmGflops(0, 1, 1)).toThrow(/n in 1..16384/);
    expect(() => native.sgemmGflops(64, 0, 1)).toThrow(/threads and reps/);
  });

  it('collectiveFloor times the shared-memory sum and copy (bench/collectives.ts), its sums checked', () => {
    const native = loadNative();
    // blocks of an odd number of floats (the kernels' tails run); the addon checks the sums
    for (const ranks of [2, 3]) {
      const { sumMs, copyMs } = native.collectiveFloor(ranks * 4 * 2 ** 16 + 12, ranks, 2);
      expect(sumMs > 0 && copyMs > 0 && Number.isFinite(sumMs + copyMs)).toBe(true);
    }
    expect(() => native.collectiveFloor(2 ** 20, 1, 1)).toThrow(/ranks in 2..64/);
    expect(() => native.collectiveFloor(4, 2, 1)).toThrow(/bytes in/);
  });
});
