// The wgrad-accumulation pass: every weight gradient a wgrad makes only to add into its buffer is
// summed by the wgrad itself, each gradient buffer is still updated exactly once per microbatch,
// nothing else changes, and the result verifies. (The numbers: test/runtime/ops.test.ts for the
// ops, the fixtures and the equivalence matrix for whole steps, which run fused.)
import { describe, expect, it } from 'vitest';
import { buildForwardGraph } from '../../compiler/frontend/build.js';
import { loadModelConfig } from '../../compiler/frontend/config.js';
import { verifyGraph, type Graph } from '../../ir/index.js';
import { updatedInputs } from '../../ir/ops.js';
import { autodiff } from '../../passes/autodiff.js';
import { fuseWgradAccumulation } from '../../passes/wgrad-accumulation.js';

const byOp = (g: Graph, op: string) => g.nodes.filter((n) => n.op === op);

/** gradient buffer → how many nodes update it in place (the optimizer step excluded) */
function updates(g: Graph): Map<string, number> {
  const out = new Map<string, number>();
  for (const n of g.nodes) {
    if (n.phase === 'optimizer') continue;
    for (const k of updatedInputs(n.op, n.inputs.length))
      out.set(n.inputs[k], (out.get(n.inputs[k]) ?? 0) + 1);
  }
  return out;
}

describe.each(['tiny-vlm', 'tiny-vlm-moe'])('%s', (model) => {
  const before = autodiff(buildForwardGraph(loadModelConfig(model))).graph;
  const after = fuseWgradAccumulation(before);
  it('verifies', () => expect(verifyGraph(after)).toEqual([]));
  it('leaves no wgrad whose gradients only feed accumulations', () => {
    expect(byOp(after, 'linear_wgrad')).toHaveLength(0);
    expect(byOp(after, 'grouped_linear_wgrad')).toHaveLength(0);
    expect(byOp(after, 'linear_wgrad_accumulate')).toHaveLength(
      byOp(before, 'linear_wgrad').length,
    );
    expect(byOp(after, 'grouped_linear_wgrad_accumulate')).toHaveLength(
      byOp(before, 'grouped_linear_wgrad').length,
    );
  });
  it('updates each gradient buffer as often as before, and drops exactly the fused accumulations', () => {
    expect(updates(after)).toEqual(updates(before));
    const fusedGradients =
      byOp(before, 'linear_wgrad').reduce((s, n) => s + n.outputs.length, 0) +
      byOp(before, 'grouped_linear_wgrad').reduce((s, n) => s + n.outputs.length, 0);
    expect(byOp(after, 'grad_accumulate')).toHaveLength(
      byOp(before, 'grad_accumulate').length - fusedGradients,
    );
    const others = (g: Graph) =>
      g.nodes.filter((n) => !/wgrad|grad_accumulate/.test(n.op)).map((n) => n.op);
    expect(others(after)).toEqual(others(before));
  });
});

describe('what stays apart', () => {
  it('a weight gradient that also feeds another node keeps its wgrad and accumulation', () => {
    const g = autodiff(buildForwardGraph(loadModelConfig('tiny-vlm'))).graph;
    const wgrad = byOp(g, 'linear_wgrad')[0];
    // a second reader of its gradient (a node reading it as a data value)
    const extra = {
      ...byOp(g, 'grad_accumulate').find((n) => n.inputs[0] === wgrad.outputs[0].name)!,
    };
    const withReader: Graph = { ...g, nodes: [...g.nodes, { ...extra }] };
    const fused = fuseWgradAccumulation(withReader);
    expect(fused.nodes).toContain(wgrad);
    expect(byOp(fused, 'linear_wgrad')).toHaveLength(1);
  });
});
