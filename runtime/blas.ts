// OpenBLAS's kernel for this CPU. Debian's OpenBLAS 0.3.21 (a DYNAMIC_ARCH build) picks its
// kernels from CPUID when the library initialises, and does not recognise newer CPUs: on this
// project's machines it falls back to its Prescott (SSE3) kernels, sgemm at 2048³ 36 GFLOP/s on 2
// threads against 215 with the SkylakeX kernels. Its OPENBLAS_CORETYPE variable names the kernels
// instead; it is read once, when the library loads. So before the native addon (which links
// OpenBLAS) loads, lfc names the kernels the CPU's CPUID feature flags (as Linux reports them in
// /proc/cpuinfo) can run, unless OPENBLAS_CORETYPE is set already: a value given wins, since a
// machine may set it because other kernels fail there. Child processes (ranks, the kernel checks,
// the benches' PyTorch) inherit the choice through the environment.
//
//   AVX-512 F, CD, BW, DQ, VL   + BF16: Cooperlake; else SkylakeX
//   AVX2 and FMA                Haswell
//   otherwise                   none: OpenBLAS's own choice

import { readFileSync } from 'node:fs';

/** The CPU's feature flags (the first processor's `flags` line of /proc/cpuinfo). */
export function cpuFlags(cpuinfo?: string): Set<string> {
  let text = cpuinfo;
  if (text === undefined) {
    try {
      text = readFileSync('/proc/cpuinfo', 'utf8');
    } catch {
      return new Set(); // not Linux: OpenBLAS's own choice
    }
  }
  const line = /^flags\s*:(.*)$/m.exec(text);
  return new Set(line ? line[1].trim().split(/\s+/) : []);
}

/** The OpenBLAS core type whose kernels these flags run, or undefined. */
export function openblasCoretypeFor(flags: ReadonlySet<string>): string | undefined {
  if (['avx512f', 'avx512cd', 'avx512bw', 'avx512dq', 'avx512vl'].every((f) => flags.has(f)))
    return flags.has('avx512_bf16') ? 'Cooperlake' : 'SkylakeX';
  if (flags.has('avx2') && flags.has('fma')) return 'Haswell';
  return undefined;
}

export interface BlasChoice {
  /** the core type OpenBLAS is told, or undefined (its own choice) */
  readonly coretype?: string;
  /** given by OPENBLAS_CORETYPE (kept), or chosen here */
  readonly source: 'environment' | 'cpu' | 'none';
}

/**
 * Sets OPENBLAS_CORETYPE in `env` for this CPU where it is unset; call before OpenBLAS loads (the
 * native addon, a child process).
 */
export function chooseOpenblasKernel(
  env: NodeJS.ProcessEnv = process.env,
  flags: ReadonlySet<string> = cpuFlags(),
): BlasChoice {
  const given = env.OPENBLAS_CORETYPE;
  if (given) return { coretype: given, source: 'environment' };
  const coretype = openblasCoretypeFor(flags);
  if (!coretype) return { source: 'none' };
  env.OPENBLAS_CORETYPE = coretype;
  return { coretype, source: 'cpu' };
}
