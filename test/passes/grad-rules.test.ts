// The gradient rules of the parallel ops: collectives and region boundaries placed on the forward
// graph (before autodiff, Megatron style) get their conjugate collective as backward; the
// vocab-parallel cross-entropy and expert-parallel helpers get their backward ops. Small graphs
// built by hand, differentiated by the real autodiff pass, checked op by op and verified. (The
// numbers are checked by the C++ kernel checks and test/runtime/ops.test.ts.)
import { describe, expect, it } from 'vitest';
import { GraphBuilder, sym, verifyGraph, type Graph, type Node } from '../../ir/index.js';
import { autodiff } from '../../passes/autodiff.js';

const TP = { group: 'tp', group_size: 2 };

function backward(g: Graph): Node[] {
  return g.nodes.filter((n) => n.phase === 'backward');
}

function only(g: Graph, op: string): Node {
  const ns = backward(g).filter((n) => n.op === op);
  expect(ns, `backward ${op} nodes`).toHaveLength(1);
  return ns[0];
}

/** A tensor-parallel LM head with the vocab-parallel cross-entropy of Megatron. */
function vocabParallelHead(): Graph {
  const b = new GraphBuilder('vocab-parallel');
  const S = b.symbol('S', 8, 'tokens');
  const h = b.param('decoder.h', [S, 4], { init: 'normal(1)' });
  const w = b.param('decoder.output.weight', [6, 4], { init: 'normal(1)' }); // Vl = 6 of V = 12
  const labels = b.input('labels', 'i32', [S]);
  const mask = b.input('loss_mask', 'u8', [S]);
  const count = b.input('loss_tokens', 'f32', []);
  const x = b.op1('copy_to_group', [h], TP);
  const logits = b.op1('linear', [x, w]);
  const lseLocal = b.op1('vocab_logsumexp', [logits]);
  const row = b.op1('reshape', [lseLocal], { shape: ['1', 'S'] });
  const gathered = b.op1('all_gather', [row], { ...TP, grad: 'slice' });
  const lse = b.op1('lse_combine', [gathered]);
  const partial = b.op1('vocab_target_logit', [logits, labels, mask], {
    shard_group: 'tp',
    group_size: 2,
  });
  const target = b.op1('all_reduce', [partial], TP);
  b.output('loss', b.op1('ce_from_stats', [lse, target, mask, count]));
  return autodiff(b.build()).graph;
}

describe('vocab-parallel cross-entropy', () => {
  const g = vocabParallelHead();
  it('verifies', () => expect(verifyGraph(g)).toEqual([]));
  it('differentiates every piece; the gathered lse comes back as this rank’s slice', () => {
    const ce = only(g, 'ce_from_stats_grad');
    const comb = only(g, 'lse_combine_grad');
    expect(comb.inputs[0]).toBe(ce.outputs[0].name);
    const slice = only(g, 'group_slice');
    expect(slice.attrs).toEqual(TP);
    expect(slice.inputs[0]).toBe(comb.outputs[0].name);
    only(g, 'vocab_logsumexp_grad');
    const tgt = only(g, 'vocab_target_logit_grad');
    expect(tgt.attrs).toEqual({ shard_group: 'tp', group_size: 2, columns: 6 });
    expect(tgt.inputs).toHaveLength(3); // dy, labels, mask
  });
  it('all_reduce is the identity backward; copy_to_group all-reduces its gradient', () => {
    const tgt = only(g, 'vocab_target_logit_grad');
    const ce = only(g, 'ce_from_stats_grad');
    expect(tgt.inputs[0]).toBe(ce.outputs[1].name); // dtarget straight through the all_reduce
    const ar = only(g, 'all_reduce');
    expect(ar.attrs).toEqual(TP);
    expect(ar.inputs[0]).toBe(only(g, 'linear_dgrad').outputs[0].name);
  });
});

describe('sequence-parallel conjugates', () => {
  it('all_gather ↔ reduce_scatter, group_slice ↔ all_gather(slice)', () => {
    const b = new GraphBuilder('sp');
    b.symbol('S', 8, 'tokens');
    const x = b.param('decoder.x', [sym('S', 1, 2), 4], { init: 'normal(1)' });
    const w = b.param('decoder.w', [4, 4], { init: 'normal(1)' });
    const full = b.op1('all_gather', [x], TP);
    const y = b.op1('linear', [full, w]);
    const part = b.op1('reduce_scatter', [y], TP);
    const mine = b.op1('group_slice', [part], TP); // [S/4, 4]
    const lse = b.op1('vocab_logsumexp', [mine]);
    const mask = b.input('mask', 'u8', [sym('S', 1, 4)]);
    const count = b.input('loss_tokens', 'f32', []);
    b.output('loss', b.op1('ce_from_stats', [lse, lse, mask, count]));
    const g = autodiff(b.build()).graph;
    expect(verifyGraph(g)).toEqual([]);
    // backward, in order: group_slice → all_gather(slice); reduce_scatter → all_gather(reduce_scatter);
    // linear_dgrad; all_gather (default) → reduce_scatter
    const [fromSlice, fromRs] = backward(g).filter((n) => n.op === 'all_gather');
    expect(fromSlice.attrs).toEqual({ ...TP, grad: 'slice' });
    expect(fromRs.attrs).toEqual({ ...TP, grad: 'reduce_scatter' });
    expect(fromRs.inputs[0]).toBe(fromSlice.outputs[0].name);
    const dgrad = only(g, 'linear_dgrad');
    expect(dgrad.inputs[0]).toBe(fromRs.outputs[0].name);
    const rs = only(g, 'reduce_scatter');
    expect(rs.attrs).toEqual(TP);
    expect(rs.inputs[0]).toBe(dgrad.outputs[0].name);
  });
  it('reduce_scatter backward is all_gather with grad reduce_scatter', () => {
    const b = new GraphBuilder('rs');
    b.symbol('S', 8, 'tokens');
    const y = b.param('decoder.y', [sym('S'), 4], { init: 'normal(1)' });
    const part = b.op1('reduce_scatter', [y], TP);
    const lse = b.op1('vocab_logsumexp', [part]);
    const mask = b.input('mask', 'u8', [sym('S', 1, 2)]);
    const count = b.input('loss_tokens', 'f32', []);
    b.output('loss', b.op1('ce_from_stats', [lse, lse, mask, count]));
    const g = autodiff(b.build()).graph;
    expect(verifyGraph(g)).toEqual([]);
    expect(only(g, 'all_gather').attrs).toEqual({ ...TP, grad: 'reduce_scatter' });
  });
});

describe('expert-parallel dispatch', () => {
  it('all_to_all_v sends the gradient back with the received counts; sort_chunks inverts', () => {
    const EP = { group: 'ep', group_size: 2 };
    const b = new GraphBuilder('ep');
    b.symbol('S', 8, 'tokens');
    const rows = b.param('decoder.rows', [sym('S', 2), 4], { init: 'normal(1)' });
    const counts = b.input('counts', 'i32', [4]); // E = 4 experts, L = 2 per rank
    const sendCounts = b.op1('moe_rank_counts', [counts], { group_size: 2 });
    const matrix = b.op1('reshape', [counts], { shape: ['2', '2'] });
    const [recvMatrix] = b.op('all_to_all_v', [matrix, b.op1('constant', [], ones2)], {
      ...EP,
      out_rows: ['2'],
    });
    const local = b.op1('moe_local_counts', [recvMatrix]);
    const [recv] = b.op('all_to_all_v', [rows, sendCounts], { ...EP, out_rows: ['4*S'] });
    const sorted = b.op1('moe_sort_chunks', [recv, recvMatrix], { inverse: false });
    const w0 = b.param('decoder.experts.0', [3, 4], { init: 'normal(1)' });
    const w1 = b.param('decoder.experts.1', [3, 4], { init: 'normal(1)' });
    const h = b.op1('grouped_linear', [sorted, local, w0, w1]);
    const lse = b.op1('vocab_logsumexp', [h]);
    const mask = b.input('mask', 'u8', [sym('S', 4)]);
    const count = b.input('loss_tokens', 'f32', []);
    b.output('loss', b.op1('ce_from_stats', [lse, lse, mask, count]));
    const g = autodiff(b.build()).graph;
    expect(verifyGraph(g)).toEqual([]);
    const sortBack = only(g, 'moe_sort_chunks');
    expect(sortBack.attrs).toEqual({ inverse: true });
    expect(sortBack.inputs[1]).toBe(recvMatrix);
    const a2a = only(g, 'all_to_all_v');
    const fwdRows = g.nodes.find((n) => n.op === 'all_to_all_v' && n.inputs[0] === rows)!;
    expect(a2a.inputs).toEqual([sortBack.outputs[0].name, fwdRows.outputs[1].name]);
    expect(a2a.attrs).toEqual({ ...EP, out_rows: ['2*S'] });
    expect(a2a.outputs[0].type).toEqual(g.params.find((p) => p.name === rows)!.type);
  });
});

const ones2 = { value: 1, dtype: 'i32', shape: ['2'] };

describe('vocab-parallel embedding', () => {
  it('embedding_grad keeps the shard attributes', () => {
    const b = new GraphBuilder('emb');
    b.symbol('S', 8, 'tokens');
    const ids = b.input('tokens', 'i32', [sym('S')]);
    const table = b.param('decoder.embed', [6, 4], { init: 'normal(1)' });
    const y = b.op1('embedding', [ids, table], { shard_group: 'tp', group_size: 2 });
    const h = b.op1('all_reduce', [y], TP);
    const lse = b.op1('vocab_logsumexp', [h]);
    const mask = b.input('mask', 'u8', [sym('S')]);
    const count = b.input('loss_tokens', 'f32', []);
    b.output('loss', b.op1('ce_from_stats', [lse, lse, mask, count]));
    const g = autodiff(b.build()).graph;
    expect(verifyGraph(g)).toEqual([]);
    expect(only(g, 'embedding_grad').attrs).toEqual({ rows: 6, shard_group: 'tp', group_size: 2 });
  });
});
