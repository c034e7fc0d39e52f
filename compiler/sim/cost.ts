// The cost model: seconds per instruction of a program on a hardware profile (hardware.ts).
//
//   compute     launch + max(FLOPs / (peak · eff(FLOPs)), bytes / (bandwidth · efficiency)):
//               matmul FLOPs from the op table (ir/ops.ts), bytes from the instruction's
//               operands; eff(f) = efficiency · f / (f + half), so small GEMMs reach less of the
//               peak. Ops without matmul FLOPs (norms, activations, AdamW, layout) are bound by
//               memory traffic alone.
//   collective  latency · steps + factor · bytes / link bandwidth, over the link the group needs:
//               inside one node, or across nodes (the slower link bounds a ring):
//                 all_reduce              2(P−1)/P · n, 2(P−1) steps
//                 all_gather, reduce_scatter, all_to_all_v, gather_v, scatter_v
//                                         (P−1)/P · n, P−1 steps (n: the whole gathered size)
//                 broadcast               n, log2 P steps (pipelined)
//                 send, recv              n, one step
//   offload, reload   bytes / host link
//
// Sizes are resolved at what a step is expected to see, not the bounds memory is planned at: S and
// Nv at their bounds (packed sequences, a microbatch's image budget), and a run-time symbol an
// all_to_all_v receives (an expert dispatch, Rx<i>) at its bound / P: balanced routing. Element
// sizes are the profile's: the plan's f32 buffers are priced at dtype_bytes (activations) or
// grad_dtype_bytes (optimizer-phase collectives: gradient reduction, parameter gathering).

import { OP_TABLE, type OpKind } from '../../ir/ops.js';
import { parseDim, resolveShape, type Dim } from '../../ir/shape.js';
import type { Attrs } from '../../ir/types.js';
import type { PlanFile, PlanInstruction, ProgramFile } from '../plan/format.js';
import type { HardwareProfile, Link } from './hardware.js';

/** How a collective's group lies on the machines: its size and whether it crosses nodes. */
export interface GroupShape {
  readonly size: number;
  readonly crossesNodes: boolean;
}

/** The symbol sizes costs are taken at (see the header). */
export function expectedSizes(
  plan: PlanFile,
  programs: Iterable<ProgramFile>,
): Map<string, number> {
  const sizes = new Map(plan.symbols.map((s) => [s.name, s.bound]));
  for (const p of programs)
    for (const x of p.instructions) {
      if (x.op !== 'all_to_all_v') continue;
      const rows = (x.attrs.out_rows as string[] | undefined)?.[0];
      const P = x.attrs.group_size as number | undefined;
      if (rows === undefined || !P || !sizes.has(rows)) continue;
      const bound = plan.symbols.find((s) => s.name === rows)!.bound;
      sizes.set(rows, Math.ceil(bound / P));
    }
  return sizes;
}

/** Prices the instructions of one program; `groupOf` says how a collective's group lies. */
export function instructionCosts(
  program: ProgramFile,
  hw: HardwareProfile,
  sizes: ReadonlyMap<string, number>,
  groupOf: (x: PlanInstruction) => GroupShape,
): Float64Array {
  const dimCache = new Map<string, Dim>();
  const size = (sym: string) => sizes.get(sym) ?? 0;
  const shapes = program.buffers.map((b) =>
    resolveShape(
      b.shape.map((t) => {
        let d = dimCache.get(t);
        if (d === undefined) dimCache.set(t, (d = parseDim(t)));
        return d;
      }),
      size,
    ),
  );
  const elems = (id: number) => shapes[id].reduce((a, b) => a * b, 1);
  const f32 = (id: number) => program.buffers[id].dtype === 'f32';
  const c = hw.compute;
  const costs = new Float64Array(program.instructions.length);
  program.instructions.forEach((x, i) => {
    const info = OP_TABLE[x.op as OpKind];
    const scale = (id: number, dtypeBytes: number) =>
      elems(id) * (f32(id) ? dtypeBytes : bytesOf(program.buffers[id].dtype));
    const bytes = (ids: readonly number[], dtypeBytes = c.dtypeBytes) =>
      ids.reduce((a, id) => a + scale(id, dtypeBytes), 0);
    if (info.category === 'collective') {
      const g = groupOf(x);
      const dtypeBytes = x.phase === 'optimizer' ? c.gradDtypeBytes : c.dtypeBytes;
      const n = Math.max(bytes(x.inputs, dtypeBytes), bytes(x.outputs, dtypeBytes));
      const link = g.crossesNodes ? hw.links.interNode : hw.links.intraNode;
      costs[i] = collectiveSeconds(x.op, g.size, n, link);
      return;
    }
    if (info.category === 'memory') {
      const link = hw.links.host;
      costs[i] = link.latencyUs * 1e-6 + bytes(x.inputs) / (link.gbps * 1e9);
      return;
    }
    const flops = info.flops({
      inputs: x.inputs.map((id) => shapes[id]),
      outputs: x.outputs.map((id) => shapes[id]),
      attrs: x.attrs as Attrs, // the verifier checked them against the op table
    });
    const traffic = bytes(x.inputs) + bytes(x.outputs);
    const memory = traffic / (c.memoryGbps * 1e9 * c.memoryEfficiency);
    const gflop = flops / 1e9;
    const eff = gflop > 0 ? (c.matmulEfficiency * gflop) / (gflop + c.matmulHalfGflop) : 1;
    const math = flops > 0 ? flops / (c.matmulTflops * 1e12 * eff) : 0;
    // a view (reshape) moves nothing: no kernel
    costs[i] = x.op === 'reshape' ? 0 : c.launchUs * 1e-6 + Math.max(math, memory);
  });
  return costs;
}

function bytesOf(dtype: string): number {
  return dtype === 'f64' || dtype === 'i64' ? 8 : dtype === 'f16' || dtype === 'bf16' ? 2 : 4;
}

/** One collective of `bytes` (the whole gathered or reduced size) over P ranks on `link`. */
export function collectiveSeconds(op: string, P: number, bytes: number, link: Link): number {
  if (op === 'send' || op === 'recv') return link.latencyUs * 1e-6 + bytes / (link.gbps * 1e9);
  if (P <= 1) return 0;
  const bw = link.gbps * 1e9;
  const lat = link.latencyUs * 1e-6;
  const part = (P - 1) / P;
  switch (op) {
    case 'all_reduce':
      return 2 * (P - 1) * lat + (2 * part * bytes) / bw;
    case 'broadcast':
      return Math.ceil(Math.log2(P)) * lat + bytes / bw;
    default: // all_gather, reduce_scatter, all_to_all_v, gather_v, scatter_v
      return (P - 1) * lat + (part * bytes) / bw;
  }
}
