// Hardware profiles: what the cost model prices instructions with. A profile is a YAML file
// (configs/hardware/<name>.yaml, or any path): peak matmul rate and how much of it a GEMM of a
// given size reaches, memory bandwidth, kernel launch overhead, the element sizes a GPU runtime
// computes and reduces in, and per-GPU link bandwidth and latency inside a node, across nodes
// and to pinned host memory. Every field is required; a missing or bad one is an error naming
// the key and the file.

import { existsSync, readdirSync, readFileSync } from 'node:fs';
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

/** A profile by preset name or by path to a YAML file. */
export function loadHardware(nameOrPath: string): HardwareProfile {
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
    doc = YAML.parse(readFileSync(path, 'utf8'));
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
  const gpusPerNode = positive('gpus_per_node');
  if (!Number.isInteger(gpusPerNode))
    throw new UserError(`${path}: gpus_per_node must be an integer, got ${gpusPerNode}`);
  return {
    name: String(at('name')),
    description: String(at('description')),
    path,
    gpusPerNode,
    memoryGiB: positive('memory_gib'),
    memoryReserveGiB: nonNegative('memory_reserve_gib'),
    runtime: runtimeOf(doc, path),
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
  };
}
