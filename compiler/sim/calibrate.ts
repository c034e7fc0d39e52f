// Calibration: a hardware profile of this machine, fitted to the CPU runtime's own per-instruction
// times (its timing option), so that the simulator's predictions can be checked against real
// runs. The samples are kernels of one-rank steps and collectives of a two-rank step; the fit:
//   launch          the median time of the smallest kernels (no FLOPs, under 16 KiB moved)
//   memory          the median of bytes / (time − launch) over kernels without FLOPs that move at
//                   least 256 KiB (efficiency 1: the bandwidth as reached)
//   matmul          rate(f) = peak · f / (f + half) for a kernel of f FLOPs: for each half on a
//                   log grid, the peak that best fits log rate in the least-squares sense; the pair
//                   of least residual (efficiency 1: the peak as reached)
//   link            time = latency · steps + bytes moved / bandwidth, least squares over the
//                   collectives' transfer times (each the shorter of the two ranks' times: the
//                   rank that arrived last waited for nobody)
// Element sizes are the CPU runtime's: f32 everywhere.

import type { HardwareProfile, Link } from './hardware.js';

export interface KernelSample {
  readonly flops: number;
  readonly bytes: number;
  readonly seconds: number;
}

export interface TransferSample {
  /** latency steps of the collective (collectiveSeconds' count) */
  readonly steps: number;
  /** bytes over the link: the formula's factor × the collective's size */
  readonly moved: number;
  readonly seconds: number;
}

/** the lower median (NaN for none) */
export const median = (xs: readonly number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[(s.length - 1) >> 1] : NaN;
};

export function fitCompute(samples: readonly KernelSample[]): HardwareProfile['compute'] {
  const small = samples.filter((s) => s.flops === 0 && s.bytes < 16 * 1024);
  if (small.length < 5) throw new Error(`calibration: ${small.length} small kernels; need 5`);
  const launch = median(small.map((s) => s.seconds));
  const streams = samples.filter((s) => s.flops === 0 && s.bytes >= 256 * 1024);
  if (streams.length < 5) throw new Error(`calibration: ${streams.length} memory-bound kernels`);
  const bandwidth = median(streams.map((s) => s.bytes / Math.max(s.seconds - launch, 1e-9)));
  const gemms = samples
    .filter((s) => s.flops > 0 && s.seconds > launch)
    .map((s) => ({ f: s.flops, rate: s.flops / (s.seconds - launch) }));
  if (gemms.length < 5) throw new Error(`calibration: ${gemms.length} matmul kernels`);
  let best = { err: Infinity, peak: 0, half: 0 };
  for (let e = -6; e <= 2; e += 0.05) {
    const half = 10 ** e * 1e9;
    const logs = gemms.map((g) => Math.log(g.rate) - Math.log(g.f / (g.f + half)));
    const logPeak = logs.reduce((a, b) => a + b, 0) / logs.length;
    const err = logs.reduce((a, l) => a + (l - logPeak) ** 2, 0);
    if (err < best.err) best = { err, peak: Math.exp(logPeak), half };
  }
  return {
    matmulTflops: best.peak / 1e12,
    matmulEfficiency: 1,
    matmulHalfGflop: best.half / 1e9,
    memoryGbps: bandwidth / 1e9,
    memoryEfficiency: 1,
    launchUs: launch * 1e6,
    dtypeBytes: 4,
    gradDtypeBytes: 4,
  };
}

/** latency and bandwidth by least squares on seconds = latency · steps + moved / bandwidth */
export function fitLink(samples: readonly TransferSample[]): Link {
  if (samples.length < 3) throw new Error(`calibration: ${samples.length} collectives; need 3`);
  // normal equations of [steps, moved] · [latency, 1/bandwidth] = seconds
  let [a, b, c, d, e] = [0, 0, 0, 0, 0];
  for (const s of samples) {
    a += s.steps * s.steps;
    b += s.steps * s.moved;
    c += s.moved * s.moved;
    d += s.steps * s.seconds;
    e += s.moved * s.seconds;
  }
  const det = a * c - b * b;
  let latency = det !== 0 ? (d * c - b * e) / det : 0;
  let inverse = det !== 0 ? (a * e - b * d) / det : 0;
  if (!(latency >= 0) || !(inverse > 0)) {
    // a degenerate spread: the bandwidth of the largest transfers, latency from the smallest
    const big = samples.filter((s) => s.moved >= median(samples.map((x) => x.moved)));
    inverse = median(big.map((s) => s.seconds / Math.max(s.moved, 1)));
    latency = Math.max(0, median(samples.map((s) => (s.seconds - s.moved * inverse) / s.steps)));
  }
  return { gbps: 1 / inverse / 1e9, latencyUs: latency * 1e6 };
}

/** The profile as YAML, in the form configs/hardware/*.yaml take. */
export function profileYaml(p: Omit<HardwareProfile, 'path'>, about: string): string {
  const c = p.compute;
  const n = (x: number) => Number(x.toPrecision(4));
  const link = (l: Link) =>
    l.peakGbps !== undefined && l.peakGbps !== l.gbps
      ? `{ gbps: ${n(l.peakGbps)}, efficiency: ${n(l.gbps / l.peakGbps)}, latency_us: ${n(l.latencyUs)} }`
      : `{ gbps: ${n(l.gbps)}, latency_us: ${n(l.latencyUs)} }`;
  const e = p.efficiency;
  const efficiency = e
    ? [
        'efficiency:',
        `  gemm: { tiles: ${JSON.stringify(e.gemmTiles)}, sms: ${e.sms}, grouped_streams: ${e.groupedStreams}, k_half: ${n(e.gemmKHalf)}, split_k: ${n(e.gemmSplitK)} }`,
        '  attention:',
        `    default: ${e.attentionKernel}`,
        ...Object.entries(e.attentionKernels).map(
          ([k, f]) =>
            `    ${k}: { forward: ${n(f.forward)}, backward: ${n(f.backward)}, half_segment: ${n(f.halfSegment)}, head_dim_multiple: ${f.headDimMultiple} }`,
        ),
        `  collectives: { all_to_all: ${n(e.allToAll)} }`,
        `  overlap: { compute_slowdown: ${n(e.overlapSlowdown)} }`,
      ]
    : [];
  return [
    ...about.split('\n').map((line) => `# ${line}`),
    `name: ${JSON.stringify(p.name)}`,
    `description: ${JSON.stringify(p.description)}`,
    `gpus_per_node: ${p.gpusPerNode}`,
    `memory_gib: ${p.memoryGiB}`,
    `memory_reserve_gib: ${p.memoryReserveGiB}`,
    `runtime: ${p.runtime}`,
    'compute:',
    `  matmul_tflops: ${c.matmulTflops.toPrecision(4)}`,
    `  matmul_efficiency: ${c.matmulEfficiency}`,
    `  matmul_half_gflop: ${c.matmulHalfGflop.toPrecision(4)}`,
    `  memory_gbps: ${c.memoryGbps.toPrecision(4)}`,
    `  memory_efficiency: ${c.memoryEfficiency}`,
    `  launch_us: ${c.launchUs.toPrecision(4)}`,
    `  dtype_bytes: ${c.dtypeBytes}`,
    `  grad_dtype_bytes: ${c.gradDtypeBytes}`,
    ...efficiency,
    'links:',
    `  intra_node: ${link(p.links.intraNode)}`,
    `  inter_node: ${link(p.links.interNode)}`,
    `  host: ${link(p.links.host)}`,
    '',
  ].join('\n');
}
