// Pass: wgrad-accumulation (Megatron's gradient-accumulation fusion, on by default there and
// here; --no-gradient-accumulation-fusion keeps the two steps apart).
//
// Holds before: autodiff's graph, where a weight gradient is a wgrad's output that one
// grad_accumulate adds into the parameter's `grad.` buffer (right after the wgrad).
// Holds after: each linear_wgrad whose every output only feeds such an accumulation, into a buffer
// of the output's own type, is one linear_wgrad_accumulate that sums dW (and db) into those
// buffers itself; a grouped_linear_wgrad whose every expert's gradient does, one
// grouped_linear_wgrad_accumulate. The GEMM adds into the buffer (β = 1), so no temporary weight
// gradient is made, kept or read again: per expert layer and microbatch that is E buffers and E
// instructions fewer, and the whole of the temporaries' traffic. A gradient that is summed from
// two uses (a tied weight), or that passes through anything else on its way, keeps its
// accumulation.

import { valueTypes, type Graph, type Node } from '../ir/graph.js';

const FUSED = {
  linear_wgrad: 'linear_wgrad_accumulate',
  grouped_linear_wgrad: 'grouped_linear_wgrad_accumulate',
} as const;

export function fuseWgradAccumulation(g: Graph): Graph {
  const readers = new Map<string, number>();
  for (const n of g.nodes) for (const v of n.inputs) readers.set(v, (readers.get(v) ?? 0) + 1);
  for (const o of g.outputs) readers.set(o.value, (readers.get(o.value) ?? 0) + 1);
  const types = valueTypes(g);
  /** value → the grad_accumulate that is its only reader */
  const accumulation = new Map<string, Node>();
  for (const n of g.nodes)
    if (n.op === 'grad_accumulate' && readers.get(n.inputs[0]) === 1)
      accumulation.set(n.inputs[0], n);
  const dropped = new Set<Node>();
  const nodes: Node[] = [];
  for (const n of g.nodes) {
    if (dropped.has(n)) continue;
    if (n.op !== 'linear_wgrad' && n.op !== 'grouped_linear_wgrad') {
      nodes.push(n);
      continue;
    }
    const accs = n.outputs.map((o) => accumulation.get(o.name));
    const fusable = accs.every(
      (a, i) => a !== undefined && types.get(a.inputs[1])?.dtype === n.outputs[i].type.dtype,
    );
    if (!fusable) {
      nodes.push(n);
      continue;
    }
    for (const a of accs) dropped.add(a!);
    const buffers = accs.map((a) => a!.inputs[1]);
    nodes.push({
      op: FUSED[n.op],
      inputs: [...n.inputs, ...buffers],
      outputs: [],
      attrs: n.op === 'linear_wgrad' ? { bias: n.attrs.bias === true } : {},
      scope: n.scope,
      phase: n.phase,
    });
  }
  return { ...g, nodes };
}
