// Hardware profiles: what the cost model prices instructions with. A profile is a YAML file
// (configs/hardware/<name>.yaml, or any path): peak matmul rate and how much of it a GEMM of a
// given size reaches, memory bandwidth, kernel launch overhead, the element sizes a GPU runtime
// computes and reduces in, and per-GPU link bandwidth and latency inside a node, across nodes
// and to pinned host memory. Every field is required; a missing or bad one is an error naming
// the key and the file. The `efficiency:` section (how a GPU's kernels and collectives fall short
// of those rates by shape: GEMM tiles and waves, flash attention, direct exchanges, compute that
// shares the SMs with communication) is required of a GPU profile; a CPU profile (lfc
// calibrate's) has none, and its kernels are priced by FLOPs and bytes alone.
//
// Attention is priced by the kernel a run uses: a profile lists each kernel it has figures for
// (FlashAttention-2, FlashAttention-3, cuDNN's fused attention, …) under `efficiency.attention`,
// and names the default; `--attention-kernel` picks another (loadHardware's second argument).

import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { cachedParse } from '../frontend/file-cache.js';
import { basename, join } from 'node:path';
import YAML from 'yaml';
import { didYouMean, UserError } from '../errors.js';
import { configsDir } from '../paths.js';

export interface Link {
  /**
   * GB/s per GPU, one direction, as collectives reach it: the profile's peak `gbps` times its
   * `efficiency` (a measured bus bandwidth over the peak; absent: 1)
   */
  readonly gbps: number;
  /** the profile's peak GB/s (the data sheet's); absent: gbps (a measured link) */
  readonly peakGbps?: number;
  readonly latencyUs: number;
}

export interface HardwareProfile {
  readonly name: string;
  readonly description: string;
  readonly path: string;
  readonly gpusPerNode: number;
  readonly memoryGiB: number;
  /**
   * device memory a plan cannot use (CUDA context, communication buffers, the allocator's
   * fragmentation): a plan fits when its device bytes plus this are at most memoryGiB
   */
  readonly memoryReserveGiB: number;
  /**
   * the runtime the profile stands for (`runtime:`, default gpu): cpu for `lfc calibrate`'s
   * profile of this machine, whose memory the CPU runtime's planned scratch counts against
   */
  readonly runtime: 'cpu' | 'gpu';
  readonly compute: {
    readonly matmulTflops: number;
    /** the fraction of the peak a large GEMM reaches */
    readonly matmulEfficiency: number;
    /** GFLOP at which a GEMM reaches half of matmulEfficiency */
    readonly matmulHalfGflop: number;
    readonly memoryGbps: number;
    readonly memoryEfficiency: number;
    readonly launchUs: number;
    /** bytes per element of activations and their collectives (the plan's are f32) */
    readonly dtypeBytes: number;
    /** bytes per element of gradient reductions */
    readonly gradDtypeBytes: number;
  };
  readonly links: { readonly intraNode: Link; readonly interNode: Link; readonly host: Link };
  /** a GPU's efficiency curves (cost.ts); absent on a CPU profile */
  readonly efficiency?: Efficiency;
  /** the training framework's host side (simulate.ts); absent: the host is never the bound */
  readonly host?: HostSide;
}

/**
 * The host thread that issues a rank's kernels (a training framework in PyTorch eager mode): the
 * GPU runs an instruction only once the host has issued it, and the host issues in program order,
 * `opUs` an instruction and `groupedGemmUs` more for each GEMM of a grouped one (one library call
 * an expert); the optimizer phase costs the host nothing (a fused multi-tensor update), nor does
 * an instruction with no work at the expected sizes (an encoder given no images is not run). At a
 * forward expert dispatch the host waits for the GPU: dropless routing's row counts are read back
 * before the exchange is posted.
 */
export interface HostSide {
  readonly opUs: number;
  readonly groupedGemmUs: number;
}

/** How a GPU's kernels and collectives fall short of the peak rates, by shape (cost.ts). */
export interface Efficiency {
  /**
   * GEMM tile quantization and wave quantization: a GEMM's m × n output is computed in tiles of
   * one of these [rows, columns] (the library picks the one that wastes least), and the tiles run
   * in waves of one per SM, so a partial tile or a partial last wave costs as much as a whole one
   */
  readonly gemmTiles: readonly (readonly [number, number])[];
  readonly sms: number;
  /** a grouped GEMM runs one GEMM per expert, this many at once (their tiles share the waves) */
  readonly groupedStreams: number;
  /** the reduction depth k at which a GEMM reaches half its efficiency (each tile's prologue and
   * epilogue amortised over k); 0: k does not matter */
  readonly gemmKHalf: number;
  /** split-K: a GEMM whose output fills fewer blocks than SMs splits k into parts at least this
   * deep; 0: never split */
  readonly gemmSplitK: number;
  /** the attention kernel the step is priced with: the profile's default or the chosen */
  readonly attentionKernel: string;
  /** its figures (attentionKernels[attentionKernel], or those scaled by scaleEfficiency) */
  readonly attention: AttentionFigures;
  /** every attention kernel the profile has figures for, by name */
  readonly attentionKernels: Readonly<Record<string, AttentionFigures>>;
  /** a direct exchange's (all-to-all, gather, scatter) bandwidth over a ring's on the same link */
  readonly allToAll: number;
  /** how much longer a compute kernel takes while a communication kernel runs on the rank's GPU
   * (they share the SMs): 0.1 is 10% */
  readonly overlapSlowdown: number;
}

/** One attention kernel's figures (a profile's `efficiency.attention.<kernel>`). */
export interface AttentionFigures {
  /** the most it reaches, forward and backward, as a fraction of the peak */
  readonly forward: number;
  readonly backward: number;
  /** the segment length (tokens a query attends within) at which it reaches half of that */
  readonly halfSegment: number;
  /** head dims are computed padded up to a multiple of this (the kernel's instantiations) */
  readonly headDimMultiple: number;
}

/**
 * The profile with its attention priced as `kernel` runs it (one of the profile's
 * `efficiency.attention` kernels); undefined: the profile as it is (its default kernel).
 */
export function withAttentionKernel(
  hw: HardwareProfile,
  kernel: string | undefined,
): HardwareProfile {
  if (kernel === undefined) return hw;
  const e = hw.efficiency;
  if (!e)
    throw new UserError(
      `--attention-kernel ${kernel}: ${hw.name} is a CPU profile; its attention is priced by FLOPs and bytes, with no kernels to choose`,
    );
  const names = Object.keys(e.attentionKernels);
  const f = Object.hasOwn(e.attentionKernels, kernel) ? e.attentionKernels[kernel] : undefined;
  if (!f)
    throw new UserError(
      `--attention-kernel ${kernel}: ${hw.name} has no figures for it${didYouMean(kernel, names)} (its kernels: ${names.join(', ')}; ${hw.path})`,
    );
  return { ...hw, efficiency: { ...e, attentionKernel: kernel, attention: f } };
}

/** The efficiency families lfc tune's sensitivity table moves one at a time. */
export const EFFICIENCY_FAMILIES = [
  'gemm',
  'attention',
  'memory',
  'nvlink',
  'network',
  'all-to-all',
  'overlap',
] as const;
export type EfficiencyFamily = (typeof EFFICIENCY_FAMILIES)[number];

/**
 * The profile with one family's efficiency times `factor` (capped at 1 where it is a fraction
 * of a peak): gemm (matmul_efficiency), attention (forward and backward), memory
 * (memory_efficiency), nvlink and network (the intra- and inter-node links' bandwidth),
 * all-to-all (the direct exchanges' share of a link), overlap (compute under communication: its
 * slowdown divided by `factor`, so that a factor above 1 is faster here too).
 */
export function scaleEfficiency(
  hw: HardwareProfile,
  family: EfficiencyFamily,
  factor: number,
): HardwareProfile {
  const frac = (x: number) => Math.min(1, x * factor);
  const c = hw.compute;
  const e = hw.efficiency;
  const link = (l: Link): Link => ({
    ...l,
    gbps: l.peakGbps !== undefined ? Math.min(l.peakGbps, l.gbps * factor) : l.gbps * factor,
  });
  switch (family) {
    case 'gemm':
      return { ...hw, compute: { ...c, matmulEfficiency: frac(c.matmulEfficiency) } };
    case 'memory':
      return { ...hw, compute: { ...c, memoryEfficiency: frac(c.memoryEfficiency) } };
    case 'attention':
      return e
        ? {
            ...hw,
            efficiency: {
              ...e,
              attention: {
                ...e.attention,
                forward: frac(e.attention.forward),
                backward: frac(e.attention.backward),
              },
            },
          }
        : hw;
    case 'all-to-all':
      return e ? { ...hw, efficiency: { ...e, allToAll: frac(e.allToAll) } } : hw;
    case 'overlap':
      return e ? { ...hw, efficiency: { ...e, overlapSlowdown: e.overlapSlowdown / factor } } : hw;
    case 'nvlink':
      return { ...hw, links: { ...hw.links, intraNode: link(hw.links.intraNode) } };
    case 'network':
      return { ...hw, links: { ...hw.links, interNode: link(hw.links.interNode) } };
  }
}

export function hardwareDir(): string {
  return configsDir('hardware');
}

/** The profiles shipped in configs/hardware, by name. */
export function listHardware(): string[] {
  return readdirSync(hardwareDir())
    .filter((f) => f.endsWith('.yaml'))
    .map((f) => basename(f, '.yaml'))
    .sort();
}

function runtimeOf(doc: unknown, path: string): 'cpu' | 'gpu' {
  const v = (doc as Record<string, unknown> | null)?.runtime;
  if (v === undefined) return 'gpu';
  if (v === 'cpu' || v === 'gpu') return v;
  throw new UserError(`${path}: runtime must be cpu or gpu, got ${JSON.stringify(v)}`);
}

/** whether a parsed document has a dotted key (a.b.c) */
function hasKey(doc: unknown, key: string): boolean {
  let x: unknown = doc;
  for (const k of key.split('.')) {
    if (typeof x !== 'object' || x === null || !(k in x)) return false;
    x = (x as Record<string, unknown>)[k];
  }
  return true;
}

/** a profile's efficiency.attention in the form before kernels were named: how to write it now */
const flatAttention = (path: string) =>
  new UserError(
    `${path}: efficiency.attention lists its figures by kernel: write default: <kernel> and <kernel>: { forward, backward, half_segment, head_dim_multiple } (e.g. flash2; see configs/hardware/a100.yaml)`,
  );

/**
 * A profile by preset name or by path to a YAML file; `attentionKernel`: price attention as that
 * kernel of the profile's runs it (--attention-kernel), not as its default.
 */
export function loadHardware(nameOrPath: string, attentionKernel?: string): HardwareProfile {
  const isPath = nameOrPath.includes('/') || nameOrPath.endsWith('.yaml');
  const path = isPath ? nameOrPath : join(hardwareDir(), `${nameOrPath}.yaml`);
  if (!existsSync(path)) {
    if (isPath) throw new UserError(`--hardware ${nameOrPath}: no such file`);
    throw new UserError(
      `--hardware ${nameOrPath}: no such profile${didYouMean(nameOrPath, listHardware())} (profiles: ${listHardware().join(', ')}; or a YAML file's path)`,
    );
  }
  let doc: unknown;
  try {
    doc = cachedParse(path, (): unknown => YAML.parse(readFileSync(path, 'utf8')));
  } catch (e) {
    throw new UserError(`${path}: malformed YAML (${(e as Error).message.split('\n')[0]})`);
  }
  const at = (key: string): unknown => {
    let x: unknown = doc;
    const parts = key.split('.');
    parts.forEach((k, depth) => {
      if (typeof x !== 'object' || x === null || !(k in x))
        throw new UserError(`${path}: ${parts.slice(0, depth + 1).join('.')} is missing`);
      x = (x as Record<string, unknown>)[k];
    });
    return x;
  };
  const positive = (key: string, max = Infinity): number => {
    const v = at(key);
    if (typeof v !== 'number' || !(v > 0) || v > max)
      throw new UserError(
        `${path}: ${key} must be a number in (0, ${max}], got ${JSON.stringify(v)}`,
      );
    return v;
  };
  const nonNegative = (key: string): number => {
    const v = at(key);
    if (typeof v !== 'number' || !(v >= 0))
      throw new UserError(`${path}: ${key} must be a number ≥ 0, got ${JSON.stringify(v)}`);
    return v;
  };
  const link = (key: string): Link => {
    const peak = positive(`${key}.gbps`);
    const linkDoc = at(key);
    const given = typeof linkDoc === 'object' && linkDoc !== null && 'efficiency' in linkDoc;
    const efficiency = given ? positive(`${key}.efficiency`, 1) : 1;
    return { gbps: peak * efficiency, peakGbps: peak, latencyUs: nonNegative(`${key}.latency_us`) };
  };
  const has = (key: string) => hasKey(doc, key);
  const runtime = runtimeOf(doc, path);
  if (runtime === 'gpu' && !has('efficiency'))
    throw new UserError(
      `${path}: efficiency is missing (a GPU profile's kernel and collective efficiency curves; see configs/hardware/a100.yaml)`,
    );
  const integer = (key: string) => {
    const v = positive(key);
    if (!Number.isInteger(v))
      throw new UserError(`${path}: ${key} must be an integer, got ${JSON.stringify(v)}`);
    return v;
  };
  const tiles = (key: string): [number, number][] => {
    const v = at(key);
    const ok = (d: unknown) => typeof d === 'number' && Number.isInteger(d) && d > 0;
    if (
      !Array.isArray(v) ||
      v.length === 0 ||
      !v.every((t) => Array.isArray(t) && t.length === 2 && t.every(ok))
    )
      throw new UserError(
        `${path}: ${key} must be a list of [rows, columns] tile sizes, got ${JSON.stringify(v)}`,
      );
    return v as [number, number][];
  };
  // efficiency.attention: `default: <kernel>` and one entry of figures per kernel
  const attentionKernels = (): Record<string, AttentionFigures> => {
    const v = at('efficiency.attention');
    const names = typeof v === 'object' && v !== null ? Object.keys(v) : [];
    if (names.includes('forward')) throw flatAttention(path);
    const kernels = names.filter((k) => k !== 'default');
    if (kernels.length === 0)
      throw new UserError(
        `${path}: efficiency.attention must list at least one kernel's figures (e.g. flash2: { forward, backward, half_segment, head_dim_multiple }) and name the default`,
      );
    return Object.fromEntries(
      kernels.map((k) => {
        const key = `efficiency.attention.${k}`;
        return [
          k,
          {
            forward: positive(`${key}.forward`, 1),
            backward: positive(`${key}.backward`, 1),
            halfSegment: nonNegative(`${key}.half_segment`),
            headDimMultiple: integer(`${key}.head_dim_multiple`),
          },
        ];
      }),
    );
  };
  const efficiency = (): Efficiency => {
    const kernels = attentionKernels();
    const chosen = at('efficiency.attention.default');
    if (typeof chosen !== 'string' || !Object.hasOwn(kernels, chosen))
      throw new UserError(
        `${path}: efficiency.attention.default must name one of its kernels (${Object.keys(kernels).join(', ')}), got ${JSON.stringify(chosen)}`,
      );
    return {
      gemmTiles: tiles('efficiency.gemm.tiles'),
      sms: integer('efficiency.gemm.sms'),
      groupedStreams: integer('efficiency.gemm.grouped_streams'),
      gemmKHalf: has('efficiency.gemm.k_half') ? nonNegative('efficiency.gemm.k_half') : 0,
      gemmSplitK: has('efficiency.gemm.split_k') ? nonNegative('efficiency.gemm.split_k') : 0,
      attentionKernel: chosen,
      attention: kernels[chosen],
      attentionKernels: kernels,
      allToAll: positive('efficiency.collectives.all_to_all', 1),
      overlapSlowdown: nonNegative('efficiency.overlap.compute_slowdown'),
    };
  };
  const gpusPerNode = positive('gpus_per_node');
  if (!Number.isInteger(gpusPerNode))
    throw new UserError(`${path}: gpus_per_node must be an integer, got ${gpusPerNode}`);
  const profile: HardwareProfile = {
    name: String(at('name')),
    description: String(at('description')),
    path,
    gpusPerNode,
    memoryGiB: positive('memory_gib'),
    memoryReserveGiB: nonNegative('memory_reserve_gib'),
    runtime,
    compute: {
      matmulTflops: positive('compute.matmul_tflops'),
      matmulEfficiency: positive('compute.matmul_efficiency', 1),
      matmulHalfGflop: nonNegative('compute.matmul_half_gflop'),
      memoryGbps: positive('compute.memory_gbps'),
      memoryEfficiency: positive('compute.memory_efficiency', 1),
      launchUs: nonNegative('compute.launch_us'),
      dtypeBytes: positive('compute.dtype_bytes', 8),
      gradDtypeBytes: positive('compute.grad_dtype_bytes', 8),
    },
    links: {
      intraNode: link('links.intra_node'),
      interNode: link('links.inter_node'),
      host: link('links.host'),
    },
    efficiency: has('efficiency') ? efficiency() : undefined,
    host: has('host')
      ? { opUs: nonNegative('host.op_us'), groupedGemmUs: nonNegative('host.grouped_gemm_us') }
      : undefined,
  };
  return withAttentionKernel(profile, attentionKernel);
}
