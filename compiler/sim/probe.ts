// Kernel probes: a GPU's kernels as bench/gpu_probe.py measured them, priced by the cost model
// (cost.ts) and fitted to it. A probe directory holds the script's JSON files (eager.json: every
// family, each call launched from Python; graphs.json: the same timed as CUDA-graph replays, the
// GPU alone); each family is taken from the graph-timed file where it has one, since lfc's
// simulator prices what the GPU does (the host's launch cost is not modelled), and attention,
// whose kernels are long enough for the host not to matter, from the eager one.
//
// The fit (fitProbe): each figure of a profile's compute section and attention kernels that a
// family of cases determines, chosen on a grid to minimise that family's sum of squared log
// ratios (predicted / measured), in this order:
//   launch                 the graph-timed tiny kernel, as measured
//   memory_efficiency      the memory-bound cases that do not fit in L2 (≥ 64 MiB moved)
//   matmul_efficiency,     the GEMM cases (a linear layer's forward and both backward products;
//   matmul_half_gflop,     a GEMM's bytes are priced too, at the memory efficiency above)
//   k_half, split_k
//   attention, per kernel  forward, backward and half_segment, over that kernel's cases
// The tile and wave quantization, the grouped GEMM's streams and the head-dim padding stay the
// profile's: they are the model's structure, which the fitted figures are checked against.

import { readFileSync, existsSync } from 'node:fs';
import { join } from 'node:path';

import { matmulFlops, type MatmulShape } from '../../ir/ops.js';
import { UserError } from '../errors.js';
import { kernelSeconds } from './cost.js';
import { median } from './calibrate.js';
import { withAttentionKernel, type AttentionFigures, type HardwareProfile } from './hardware.js';

/** bench/gpu_probe.py's output (one file). */
export interface ProbeFile {
  readonly date: string;
  readonly timing?: 'eager' | 'graphs';
  readonly environment: Readonly<Record<string, unknown>>;
  readonly ceilings?: { copy_gbps: number; gemm_tflops: number; gemm_square: number };
  readonly launch?: { tiny_kernel_us: number };
  readonly gemm?: readonly {
    name: string;
    pass: string;
    m: number;
    n: number;
    k: number;
    seconds: number;
  }[];
  readonly grouped?: readonly {
    name: string;
    experts: number;
    rows: number;
    n: number;
    k: number;
    loop_seconds: number;
    streams4_seconds?: number;
    grouped_seconds?: number;
  }[];
  readonly attention?: readonly {
    backend: string;
    name: string;
    seq: number;
    batch: number;
    heads: number;
    kv_heads: number;
    head_dim: number;
    causal: boolean;
    forward_seconds?: number;
    backward_seconds?: number;
    error?: string;
  }[];
  readonly memory?: readonly { op: string; bytes: number; seconds: number }[];
}

const FAMILIES = ['ceilings', 'launch', 'gemm', 'grouped', 'attention', 'memory'] as const;

/** A probe directory's families, each from the file that times it best (the header). */
export interface Probe extends ProbeFile {
  /** where each family came from */
  readonly sources: Readonly<Record<string, string>>;
}

export function loadProbe(dir: string): Probe {
  const read = (name: string): ProbeFile | undefined => {
    const path = join(dir, name);
    if (!existsSync(path)) return undefined;
    try {
      return JSON.parse(readFileSync(path, 'utf8')) as ProbeFile;
    } catch (e) {
      throw new UserError(`${path}: not a probe file (${(e as Error).message})`);
    }
  };
  const eager = read('eager.json');
  const graphs = read('graphs.json');
  if (!eager && !graphs)
    throw new UserError(`${dir}: no eager.json or graphs.json (bench/gpu_probe.py's output)`);
  const base = (eager ?? graphs)!;
  const merged: Record<string, unknown> = { date: base.date, environment: base.environment };
  const sources: Record<string, string> = {};
  for (const f of FAMILIES) {
    const fromGraphs = f !== 'attention' && graphs?.[f] !== undefined;
    const src = fromGraphs ? graphs : eager?.[f] !== undefined ? eager : graphs;
    if (src?.[f] === undefined) continue;
    merged[f] = src[f];
    sources[f] = src === graphs ? 'graphs.json' : 'eager.json';
  }
  return { ...(merged as unknown as ProbeFile), sources };
}

/** One measured case, priced. */
export interface PricedCase {
  readonly family: string;
  readonly label: string;
  readonly measured: number;
  readonly predicted: number;
  /** bytes it moves (memory-bound cases) */
  readonly bytes?: number;
}

const BF16 = 2;

/** PyTorch's scaled_dot_product_attention backends, by the profile kernel they are */
const BACKEND_KERNEL: Record<string, string> = { flash: 'flash2', cudnn: 'cudnn' };

/** Every measured case, priced on `hw` (attention on the profile's kernel of that backend). */
export function priceProbe(probe: ProbeFile, hw: HardwareProfile): PricedCase[] {
  const out: PricedCase[] = [];
  const gemm = (m: number, n: number, k: number, groups = 1): number => {
    const shape: MatmulShape = { kind: 'gemm', m, n, k, groups };
    return kernelSeconds(matmulFlops(shape), BF16 * groups * (m * k + n * k + m * n), hw, shape);
  };
  for (const g of probe.gemm ?? [])
    out.push({
      family: 'gemm',
      label: `${g.name} ${g.pass} ${g.m}×${g.n}×${g.k}`,
      measured: g.seconds,
      predicted: gemm(g.m, g.n, g.k),
    });
  for (const g of probe.grouped ?? []) {
    const predicted = gemm(g.rows, g.n, g.k, g.experts);
    const label = `${g.name} ${g.experts} experts × ${g.rows} rows`;
    const add = (how: string, measured?: number) => {
      if (measured !== undefined)
        out.push({ family: `grouped (${how})`, label, measured, predicted });
    };
    add('one stream', g.loop_seconds);
    add('4 streams', g.streams4_seconds);
    add('_grouped_mm', g.grouped_seconds);
  }
  const kernels = hw.efficiency?.attentionKernels ?? {};
  const onKernel = new Map<string, HardwareProfile>();
  for (const a of probe.attention ?? []) {
    const kernel = BACKEND_KERNEL[a.backend];
    if (a.error || a.forward_seconds === undefined || !kernel) continue;
    if (!Object.hasOwn(kernels, kernel)) continue;
    let priced = onKernel.get(kernel);
    if (!priced) onKernel.set(kernel, (priced = withAttentionKernel(hw, kernel)));
    const T = a.batch * a.seq;
    const qo = 2 * T * a.heads * a.head_dim;
    const kv = 2 * T * a.kv_heads * a.head_dim;
    for (const backward of [false, true]) {
      const shape: MatmulShape = {
        kind: 'attention',
        backward,
        causal: a.causal,
        tokens: T,
        heads: a.heads,
        headDim: a.head_dim,
        segment: a.seq,
      };
      const bytes = BF16 * (backward ? 2 * (qo + kv) + qo : qo + kv);
      out.push({
        family: `attention ${kernel} ${backward ? 'backward' : 'forward'}`,
        label: `${a.name} L ${a.seq}${a.causal ? ' causal' : ''}`,
        measured: (backward ? a.backward_seconds : a.forward_seconds)!,
        predicted: kernelSeconds(matmulFlops(shape), bytes, priced, shape),
      });
    }
  }
  for (const m of probe.memory ?? []) {
    // PyTorch runs silu(a) * b as two kernels: silu reads a and writes t, the product reads t and
    // b and writes the result, five passes where the probe counted the fused three
    const kernels = m.op === 'swiglu' ? 2 : 1;
    const bytes = m.op === 'swiglu' ? (m.bytes * 5) / 3 : m.bytes;
    out.push({
      family: 'memory-bound',
      label: `${m.op} ${(m.bytes / 2 ** 20).toFixed(1)} MiB`,
      measured: m.seconds,
      predicted: kernelSeconds(0, bytes, hw) + (kernels - 1) * hw.compute.launchUs * 1e-6,
      bytes,
    });
  }
  if (probe.launch)
    out.push({
      family: 'launch',
      label: 'tiny kernel',
      measured: probe.launch.tiny_kernel_us * 1e-6,
      predicted: hw.compute.launchUs * 1e-6,
    });
  return out;
}

/** Per family: cases, the median ratio predicted / measured, its range, and how many lie within
 * ±`band` (0.15: ±15%). */
export function summarize(cases: readonly PricedCase[], band = 0.15) {
  const families = [...new Set(cases.map((c) => c.family))];
  return families.map((family) => {
    const r = cases.filter((c) => c.family === family).map((c) => c.predicted / c.measured);
    return {
      family,
      cases: r.length,
      median: median(r),
      min: Math.min(...r),
      max: Math.max(...r),
      within: r.filter((x) => x >= 1 - band && x <= 1 + band).length,
    };
  });
}

/** the large memory-bound cases the memory efficiency is fitted on: out of a 60 MB L2 */
export const DRAM_BYTES = 64 * 2 ** 20;

const sumSquaredLog = (cases: readonly PricedCase[]) =>
  cases.reduce((a, c) => a + Math.log(c.predicted / c.measured) ** 2, 0);

const grid = (lo: number, hi: number, steps: number, log = false): number[] =>
  Array.from({ length: steps + 1 }, (_, i) =>
    log ? lo * (hi / lo) ** (i / steps) : lo + ((hi - lo) * i) / steps,
  );

/** The candidate of least cost, and that cost. */
function argmin<T>(candidates: Iterable<T>, cost: (x: T) => number): { x: T; cost: number } {
  let best: { x: T; cost: number } | undefined;
  for (const x of candidates) {
    const c = cost(x);
    if (!best || c < best.cost) best = { x, cost: c };
  }
  return best!;
}

/** The figures of `hw` fitted to `probe` (the header's fit). */
export function fitProbe(probe: ProbeFile, hw: HardwareProfile): HardwareProfile {
  let fitted = hw;
  const withCompute = (h: HardwareProfile, c: Partial<HardwareProfile['compute']>) => ({
    ...h,
    compute: { ...h.compute, ...c },
  });
  // a probe of one family: its cases' squared log residual on a profile
  const residual = (family: Partial<ProbeFile>) => {
    const sub: ProbeFile = { date: probe.date, environment: probe.environment, ...family };
    return (h: HardwareProfile) => sumSquaredLog(priceProbe(sub, h));
  };
  if (probe.launch) fitted = withCompute(fitted, { launchUs: probe.launch.tiny_kernel_us });
  const big = (probe.memory ?? []).filter((m) => m.bytes >= DRAM_BYTES);
  if (big.length) {
    const err = residual({ memory: big });
    const { x } = argmin(grid(0.3, 1, 140), (eff) =>
      err(withCompute(fitted, { memoryEfficiency: eff })),
    );
    fitted = withCompute(fitted, { memoryEfficiency: x });
  }
  if (probe.gemm?.length) {
    const err = residual({ gemm: probe.gemm });
    const e0 = fitted.efficiency;
    const base = fitted;
    const candidates = function* () {
      for (const splitK of e0 ? [0, 128, 256, 512, 1024, 2048] : [0])
        for (const kHalf of e0 ? grid(0, 512, 16) : [0])
          for (const eff of grid(0.5, 0.95, 45))
            for (const half of grid(0.01, 10, 30, true)) {
              const h = withCompute(base, { matmulEfficiency: eff, matmulHalfGflop: half });
              yield e0 ? { ...h, efficiency: { ...e0, gemmKHalf: kHalf, gemmSplitK: splitK } } : h;
            }
    };
    fitted = argmin(candidates(), err).x;
  }
  const e = fitted.efficiency;
  if (e && probe.attention?.length) {
    const kernels: Record<string, AttentionFigures> = { ...e.attentionKernels };
    for (const [backend, kernel] of Object.entries(BACKEND_KERNEL)) {
      const rows = probe.attention.filter((a) => a.backend === backend && !a.error);
      if (!rows.length || !kernels[kernel]) continue;
      const at = (f: AttentionFigures): HardwareProfile => ({
        ...fitted,
        efficiency: { ...e, attentionKernels: { ...kernels, [kernel]: f } },
      });
      const sub: ProbeFile = { date: probe.date, environment: probe.environment, attention: rows };
      // forward and backward cases depend on their own figure and the shared half segment:
      // for each half, the best of each alone
      const pick = (halfSegment: number, pass: 'forward' | 'backward') =>
        argmin(grid(0.15, 0.9, 75), (v) =>
          sumSquaredLog(
            priceProbe(sub, at({ ...kernels[kernel], halfSegment, [pass]: v })).filter((c) =>
              c.family.endsWith(pass),
            ),
          ),
        );
      const { x } = argmin(
        grid(0, 2000, 80).map((halfSegment) => {
          const fwd = pick(halfSegment, 'forward');
          const bwd = pick(halfSegment, 'backward');
          return {
            f: { ...kernels[kernel], halfSegment, forward: fwd.x, backward: bwd.x },
            err: fwd.cost + bwd.cost,
          };
        }),
        (c) => c.err,
      );
      kernels[kernel] = x.f;
    }
    fitted = {
      ...fitted,
      efficiency: {
        ...e,
        attentionKernels: kernels,
        attention: kernels[e.attentionKernel] ?? e.attention,
      },
    };
  }
  return fitted;
}
