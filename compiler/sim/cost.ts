// The cost model: seconds per instruction of a program on a hardware profile (hardware.ts).
//
//   compute     launch + max(FLOPs / (peak · eff), bytes / (bandwidth · memory_efficiency)):
//               matmul FLOPs and shape from the op table (ir/ops.ts), bytes from the
//               instruction's operands. Ops without matmul FLOPs (norms, activations, AdamW,
//               layout) are bound by memory traffic alone. On a GPU profile (its efficiency
//               section, hardware.ts):
//                 GEMM       eff = matmul_efficiency · q · f / (f + q · half), q = tiles · waves:
//                            f FLOPs at the quantized efficiency plus a fixed cost of half FLOPs
//                            at the full one (small GEMMs reach less of the peak; a tiny one
//                            costs about one tile's time); the m × n output is computed in whole
//                            blocks of a tile size (tiles = m·n / the blocks' area) which run in
//                            waves of one block per SM (waves = blocks / (whole waves · SMs)), at
//                            the profile's tile size that wastes least; a grouped GEMM's experts
//                            are GEMMs of their mean rows, grouped_streams of them at once sharing
//                            the waves
//                 attention  eff = peak(forward | backward) · L / (L + half) · d / d': flash
//                            attention within segments of L tokens, head dim d computed as d'
//                            (padded up to the kernel's multiple)
//               A CPU profile has no such curves: eff = matmul_efficiency · f / (f + half) for
//               every op with matmul FLOPs.
//   collective  latency · steps + factor · bytes / link bandwidth (NCCL's ring and direct
//               algorithms; n: the whole gathered or reduced size):
//                 all_reduce              2(P−1)/P · n, 2(P−1) steps
//                 all_gather, reduce_scatter, all_to_all_v, gather_v, scatter_v,
//                 all_gather_v, reduce_scatter_v
//                                         (P−1)/P · n, P−1 steps
//                 broadcast               n, log2 P steps (pipelined)
//                 send, recv              n, one step
//               A group inside one node runs on NVLink. A group over k nodes with q of its ranks
//               on the rank's own node (GroupShape) is priced by what crosses which link, at the
//               inter-node latency:
//                 rings (all_reduce, all_gather, reduce_scatter, broadcast, and the variable
//                   all_gather_v and reduce_scatter_v, as NCCL's grouped ring): the whole ring's
//                   traffic passes every node boundary, carried by the q ranks' NIC shares at once
//                   (one ring channel each, as NCCL builds them): factor · n / min(NVLink,
//                   q · NIC). A group of whole nodes then reaches the node's NIC bandwidth as its
//                   bus bandwidth, which is what nccl-tests report across nodes.
//                 direct exchanges (all_to_all_v, gather_v, scatter_v): each rank's blocks for
//                   the q − 1 peers on its node go over NVLink and those for the P − q off it over
//                   its own NIC share, both at once: max((q−1)/P · n / NVLink, (P−q)/P · n / NIC),
//                   each link at the profile's all_to_all share of its bandwidth (also inside a
//                   node).
//                 an expert dispatch (or combine) of the flex dispatcher, DeepEP's (attrs
//                   dispatcher, top_k = k; passes/parallel/expert.ts): a token crosses to each
//                   other node that holds one of its k experts once, over the NIC share, and is
//                   forwarded there over NVLink. At balanced routing over N nodes a token's k
//                   rows reach (N−1)(1 − (1 − 1/N)^k) other nodes against the k(N−1)/N rows a
//                   plain all-to-all sends off the node, so the NIC carries the off-node blocks
//                   times N(1 − (1 − 1/N)^k)/k (0.45 for N = 4, k = 8); NVLink the local blocks
//                   and the forwarded ones, (q−1)/P · n + (P−q)/P · n · (q−1)/q. DeepEP's normal
//                   kernels reach the NIC's line rate across nodes (43–58 GB/s of RDMA on a
//                   50 GB/s CX7 at EP 16–64, H800; github.com/deepseek-ai/DeepEP, README), so
//                   both links run at the profile's all_to_all share as above.
//                 send, recv: n over the NIC share.
//   offload, reload   bytes / host link
//
// Sizes are resolved at what a step is expected to see, not the bounds memory is planned at: each
// symbol at its expected size where the plan states one (the data profile's visual tokens, an
// expert dispatch, Rx<i>, at balanced routing), else at its bound (S: packed sequences); a
// run-time symbol an all_to_all_v receives without a stated one at its bound / P. Element
// sizes: an f32 plan (the CPU runtime's precision, standing for the GPU's) has its buffers priced
// at the profile's dtype_bytes (activations) or grad_dtype_bytes (optimizer-phase collectives:
// gradient reduction, parameter gathering); a --bf16 plan's buffers, its f32 master weights,
// main gradients, optimizer state and statistics too, at their own size.
//
// A compute kernel that runs while a communication kernel runs on the same GPU shares its SMs:
// the simulator (simulate.ts) lengthens it by the profile's overlap compute_slowdown for the
// part of it that overlaps.

import {
  OP_TABLE,
  type MatmulShape,
  type OpCategory,
  type OpInfo,
  type OpKind,
} from '../../ir/ops.js';
import { shapeResolver } from '../../ir/shape.js';
import type { Attrs } from '../../ir/types.js';
import { AlikeMemo } from '../plan/alike.js';
import type { PlanFile, PlanInstruction, ProgramFile } from '../plan/format.js';
import type { Efficiency, HardwareProfile, HostSide, Link } from './hardware.js';

/** How a collective's group lies on the machines (for a send or recv: the pair). */
export interface GroupShape {
  readonly size: number;
  /** the nodes its ranks are on */
  readonly nodes: number;
  /** its ranks on the node of the rank being priced (that rank included) */
  readonly local: number;
}

/** A group of `size` ranks on one node. */
export const oneNode = (size: number): GroupShape => ({ size, nodes: 1, local: size });

/** The symbol sizes costs are taken at (see the header). */
export function expectedSizes(
  plan: PlanFile,
  programs: Iterable<ProgramFile>,
): Map<string, number> {
  const bounds = new Map(plan.symbols.map((s) => [s.name, s.bound]));
  const sizes = new Map(plan.symbols.map((s) => [s.name, s.expected ?? s.bound]));
  const stated = new Set(plan.symbols.filter((s) => s.expected !== undefined).map((s) => s.name));
  for (const p of programs)
    for (let i = 0; i < p.instructions.length; i++) {
      const x = p.instructions[i];
      if (x.op !== 'all_to_all_v') continue;
      const rows = (x.attrs.out_rows as string[] | undefined)?.[0];
      if (rows === undefined || stated.has(rows)) continue;
      const bound = bounds.get(rows);
      const P = x.attrs.group_size as number | undefined;
      if (bound !== undefined && P) sizes.set(rows!, Math.ceil(bound / P));
    }
  return sizes;
}

/** What one instruction moves and computes, at the sizes and element sizes given. */
export interface Work {
  readonly category: OpCategory;
  /** matmul FLOPs (compute instructions) */
  readonly flops: number;
  /** how they run (an op with matmul FLOPs) */
  readonly matmul?: MatmulShape;
  /** compute: bytes read and written; collective: the larger of sent and received; memory: the
   * bytes copied */
  readonly bytes: number;
}

/**
 * Work already worked out, shared by the programs of one plan priced at one set of sizes and
 * element sizes (instructionWork): by alike instruction (compiler/plan/alike.ts), apart for
 * mixed-precision programs, whose f32 values are priced as f32.
 */
export class WorkMemo {
  readonly alike = [new AlikeMemo<Work>(), new AlikeMemo<Work>()];
  /** each program's work, once worked out (the costs and the host's issue both read it) */
  readonly programs = new WeakMap<ProgramFile, Work[]>();
  constructor(
    readonly sizes: ReadonlyMap<string, number>,
    readonly dtypeBytes: number,
    readonly gradDtypeBytes: number,
  ) {}
}

/**
 * Each instruction's work: shapes at `sizes`; in an f32 program, f32 buffers at `dtypeBytes` per
 * element (the optimizer phase's collectives at `gradDtypeBytes`); other dtypes, and every buffer
 * of a mixed-precision program, at their own size. `memo` (made for the same sizes and element
 * sizes) carries what one program worked out to the next.
 */
export function instructionWork(
  program: ProgramFile,
  sizes: ReadonlyMap<string, number>,
  dtypeBytes: number,
  gradDtypeBytes: number,
  memo: WorkMemo = new WorkMemo(sizes, dtypeBytes, gradDtypeBytes),
): Work[] {
  if (
    memo.sizes !== sizes ||
    memo.dtypeBytes !== dtypeBytes ||
    memo.gradDtypeBytes !== gradDtypeBytes
  )
    throw new Error('instructionWork: a memo made for other sizes');
  const known = memo.programs.get(program);
  if (known) return known;
  const resolve = shapeResolver((sym: string) => sizes.get(sym) ?? 0);
  const { buffers } = program;
  const elems = (id: number) => {
    let n = 1;
    for (const d of resolve(buffers[id].shape)) n *= d;
    return n;
  };
  const mixed = isMixed(buffers);
  // a compute instruction's work follows from its op, attrs and operands: once per alike group
  const alike = memo.alike[+mixed];
  const out = new Array<Work>(program.instructions.length);
  for (let i = 0; i < out.length; i++) {
    const x = program.instructions[i];
    const info: OpInfo = OP_TABLE[x.op as OpKind];
    if (info.category === 'collective' || info.category === 'memory') {
      out[i] = workOf(x, info);
      continue;
    }
    let work = alike.get(x, buffers);
    if (work === undefined) alike.put(x, buffers, (work = workOf(x, info)));
    out[i] = work;
  }
  memo.programs.set(program, out);
  return out;

  function workOf(x: PlanInstruction, info: OpInfo): Work {
    const per = mixed
      ? 4
      : info.category === 'collective' && x.phase === 'optimizer'
        ? gradDtypeBytes
        : dtypeBytes;
    const bytes = (ids: readonly number[]) =>
      ids.reduce((a, id) => {
        const dtype = program.buffers[id].dtype;
        return a + elems(id) * elementBytes(dtype, per);
      }, 0);
    if (info.category === 'collective')
      return {
        category: info.category,
        flops: 0,
        bytes: Math.max(bytes(x.inputs), bytes(x.outputs)),
      };
    if (info.category === 'memory')
      return { category: info.category, flops: 0, bytes: bytes(x.inputs) };
    const args = {
      inputs: x.inputs.map((id) => resolve(buffers[id].shape)),
      outputs: x.outputs.map((id) => resolve(buffers[id].shape)),
      attrs: x.attrs as Attrs, // the verifier checked them against the op table
    };
    const flops = info.flops(args);
    const matmul = flops > 0 ? info.matmul?.(args) : undefined;
    // a view (reshape) moves nothing
    const moved = x.op === 'reshape' ? 0 : bytes(x.inputs) + bytes(x.outputs);
    return { category: info.category, flops, bytes: moved, matmul };
  }
}

/** The framework's host side where the profile prices it: a GPU profile with a host section. */
export function pricedHost(hw: HardwareProfile): HostSide | undefined {
  const host = hw.host;
  return hw.runtime !== 'cpu' && host && (host.opUs > 0 || host.groupedGemmUs > 0)
    ? host
    : undefined;
}

/**
 * The host's seconds to issue work `w` (hardware.ts HostSide): an op, and a library call for each
 * GEMM of a grouped one; nothing for work that is empty at the expected sizes (a framework runs no
 * module over empty tensors: an encoder with no images, a view).
 */
export function issueSeconds(
  host: HostSide,
  w: { readonly flops: number; readonly bytes: number; readonly matmul?: MatmulShape },
): number {
  if (w.flops === 0 && w.bytes === 0) return 0;
  const m = w.matmul;
  const groups = m?.kind === 'gemm' && m.groups > 1 ? m.groups : 0;
  return (host.opUs + groups * host.groupedGemmUs) * 1e-6;
}

/**
 * A kernel's seconds: launch + max(FLOPs at the efficiency its shape reaches, bytes at the
 * memory bandwidth) (the header's model).
 */
export function kernelSeconds(
  flops: number,
  bytes: number,
  hw: Pick<HardwareProfile, 'compute' | 'efficiency'>,
  matmul?: MatmulShape,
): number {
  const c = hw.compute;
  const memory = bytes / (c.memoryGbps * 1e9 * c.memoryEfficiency);
  const math =
    flops > 0 ? flops / (c.matmulTflops * 1e12 * matmulEfficiency(flops, hw, matmul)) : 0;
  return c.launchUs * 1e-6 + Math.max(math, memory);
}

/** The fraction of the peak a matmul of `flops` and this shape reaches (the header's model). */
export function matmulEfficiency(
  flops: number,
  hw: Pick<HardwareProfile, 'compute' | 'efficiency'>,
  s?: MatmulShape,
): number {
  const c = hw.compute;
  const e = hw.efficiency;
  if (e && s?.kind === 'attention') {
    const a = e.attention;
    const peak = s.backward ? a.backward : a.forward;
    const padded = Math.ceil(s.headDim / a.headDimMultiple) * a.headDimMultiple;
    return ((peak * s.segment) / (s.segment + a.halfSegment)) * (s.headDim / padded);
  }
  // the time of f FLOPs at the quantized efficiency, plus a fixed cost of `half` FLOPs at the
  // full one: the tiles a GEMM wastes slow its math, not its launch and latency (so a tiny GEMM
  // costs about one tile's time, not 1 / (tiles · waves) times a small GEMM's). A grouped GEMM
  // pays the fixed cost once per round of grouped_streams GEMMs. A short reduction dimension k
  // amortises each tile's prologue and epilogue over fewer steps: k / (k + k_half).
  const gflop = flops / 1e9;
  const gemm = e && s?.kind === 'gemm' ? s : undefined;
  const q = gemm ? gemmQuantization(gemm, e!) : 1;
  const rounds = gemm ? Math.ceil(Math.max(1, gemm.groups) / e!.groupedStreams) : 1;
  const short = gemm && e!.gemmKHalf > 0 ? gemm.k / (gemm.k + e!.gemmKHalf) : 1;
  return (c.matmulEfficiency * short * q * gflop) / (gflop + q * rounds * c.matmulHalfGflop);
}

/**
 * Tile and wave quantization: the useful share of the tiles and waves a GEMM's output takes, at
 * the tile size that wastes least. A grouped GEMM's experts run `groupedStreams` at a time, their
 * tiles sharing the waves.
 */
export function gemmQuantization(
  s: Extract<MatmulShape, { kind: 'gemm' }>,
  e: Pick<Efficiency, 'gemmTiles' | 'sms' | 'groupedStreams'> &
    Partial<Pick<Efficiency, 'gemmSplitK'>>,
): number {
  if (!(s.m > 0 && s.n > 0)) return 1;
  const together = Math.max(1, Math.min(Math.round(s.groups), e.groupedStreams));
  let best = 0;
  for (const [rows, cols] of e.gemmTiles) {
    const blocks = Math.ceil(s.m / rows) * Math.ceil(s.n / cols);
    const tiles = (s.m * s.n) / (blocks * rows * cols);
    // split-K (cuBLAS's split-K and stream-K kernels): k split into parts at least split_k deep,
    // as many as fill the waves best
    const most = e.gemmSplitK ? Math.max(1, Math.min(16, Math.floor(s.k / e.gemmSplitK))) : 1;
    for (let splits = 1; splits <= most; splits++) {
      const inWave = blocks * together * splits;
      best = Math.max(best, tiles * (inWave / (Math.ceil(inWave / e.sms) * e.sms)));
    }
  }
  return best;
}

/**
 * Prices the instructions of one program; `groupOf` says how a collective's group lies (given the
 * instruction and its index).
 */
export function instructionCosts(
  program: ProgramFile,
  hw: HardwareProfile,
  sizes: ReadonlyMap<string, number>,
  groupOf: (x: PlanInstruction, i: number) => GroupShape,
  memo?: WorkMemo,
): Float64Array {
  const c = hw.compute;
  const work = instructionWork(program, sizes, c.dtypeBytes, c.gradDtypeBytes, memo);
  // a kernel's time by its work (instructionWork shares one object among alike instructions)
  const kernel = new Map<Work, number>();
  const out = new Float64Array(program.instructions.length);
  for (let i = 0; i < out.length; i++) {
    const x = program.instructions[i];
    const w = work[i];
    if (w.category === 'collective') {
      out[i] = groupCollectiveSeconds(
        x.op,
        groupOf(x, i),
        w.bytes,
        hw.links,
        hw.efficiency?.allToAll,
        flexTopKOf(x.attrs),
      );
    } else if (w.category === 'memory') {
      const link = hw.links.host;
      out[i] = link.latencyUs * 1e-6 + w.bytes / (link.gbps * 1e9);
    } else if (x.op !== 'reshape') {
      let t = kernel.get(w);
      if (t === undefined) kernel.set(w, (t = kernelSeconds(w.flops, w.bytes, hw, w.matmul)));
      out[i] = t;
    }
  }
  return out;
}

/**
 * Whether values (buffers, tensor types) are a mixed-precision plan's (any of them bf16 or f16):
 * its f32 values are then real f32 (master weights, main gradients, optimizer state, statistics),
 * where an f32 plan's stand for the profile's element sizes.
 */
export function isMixed(values: Iterable<{ readonly dtype: string }>): boolean {
  for (const { dtype } of values) if (dtype === 'bf16' || dtype === 'f16') return true;
  return false;
}

/** Bytes of one element as a profile prices it: f32 at `f32`, the others at their own size. */
export function elementBytes(dtype: string, f32: number): number {
  if (dtype === 'f32') return f32;
  return dtype === 'f64' || dtype === 'i64' ? 8 : dtype === 'f16' || dtype === 'bf16' ? 2 : 4;
}

/**
 * A collective's latency steps and the factor of its size that crosses a rank's link (ring
 * algorithms; a broadcast pipelined down a tree).
 */
export function collectiveSteps(op: string, P: number): { steps: number; factor: number } {
  if (op === 'send' || op === 'recv') return { steps: 1, factor: 1 };
  if (P <= 1) return { steps: 0, factor: 0 };
  const part = (P - 1) / P;
  switch (op) {
    case 'all_reduce':
      return { steps: 2 * (P - 1), factor: 2 * part };
    case 'broadcast':
      return { steps: Math.ceil(Math.log2(P)), factor: 1 };
    default: // all_gather, reduce_scatter, the four variable-row exchanges
      return { steps: P - 1, factor: part };
  }
}

/** the direct exchanges, which run at a profile's all_to_all share of a link */
const DIRECT = new Set(['all_to_all_v', 'gather_v', 'scatter_v']);

/**
 * One collective of `bytes` (the whole gathered or reduced size) over P ranks on `link`; a
 * direct exchange at `direct` of the link's bandwidth.
 */
export function collectiveSeconds(
  op: string,
  P: number,
  bytes: number,
  link: Link,
  direct = 1,
): number {
  const { steps, factor } = collectiveSteps(op, P);
  const share = DIRECT.has(op) ? direct : 1;
  return steps * link.latencyUs * 1e-6 + (factor * bytes) / (link.gbps * share * 1e9);
}

/** An expert exchange's router k if the flex dispatcher runs it (its attrs), else 0. */
export function flexTopKOf(attrs: Readonly<Record<string, unknown>>): number {
  return attrs.dispatcher === 'flex' ? (attrs.top_k as number) : 0;
}

/**
 * The share of a plain all-to-all's off-node bytes a flex (DeepEP) dispatch sends over the NIC:
 * a token once to each other node that holds one of its k experts, at balanced routing over
 * `nodes` nodes (the header's model).
 */
export function flexNodeShare(nodes: number, k: number): number {
  if (nodes <= 1) return 1;
  return Math.min(1, (nodes * (1 - (1 - 1 / nodes) ** k)) / k);
}

/**
 * One collective of `bytes` over a group as it lies on the machines (the header's model);
 * `flexTopK`: an all_to_all_v of the flex dispatcher, its router's k.
 */
export function groupCollectiveSeconds(
  op: string,
  g: GroupShape,
  bytes: number,
  links: Pick<HardwareProfile['links'], 'intraNode' | 'interNode'>,
  direct = 1,
  flexTopK = 0,
): number {
  if (g.nodes <= 1) return collectiveSeconds(op, g.size, bytes, links.intraNode, direct);
  const { intraNode: nvlink, interNode: nic } = links;
  const P = g.size;
  const q = Math.max(1, Math.min(g.local, P - 1));
  const { steps, factor } = collectiveSteps(op, P);
  const latency = steps * nic.latencyUs * 1e-6;
  const GB = 1e9;
  if (op === 'all_to_all_v' && flexTopK > 0) {
    const off = ((P - q) / P) * bytes;
    return (
      latency +
      Math.max(
        (((q - 1) / P) * bytes + (off * (q - 1)) / q) / (nvlink.gbps * direct * GB),
        (off * flexNodeShare(g.nodes, flexTopK)) / (nic.gbps * direct * GB),
      )
    );
  }
  switch (op) {
    case 'send':
    case 'recv':
      return latency + bytes / (nic.gbps * GB);
    case 'all_to_all_v':
    case 'gather_v':
    case 'scatter_v':
      return (
        latency +
        Math.max(
          (((q - 1) / P) * bytes) / (nvlink.gbps * direct * GB),
          (((P - q) / P) * bytes) / (nic.gbps * direct * GB),
        )
      );
    default: // rings
      return latency + (factor * bytes) / (Math.min(nvlink.gbps, q * nic.gbps) * GB);
  }
}
