// Scratch: the bytes the CPU runtime's ops and kernels take for temporaries the IR does not name,
// per instruction, as a function of its operands at the symbols' bounds. One rule per op kind,
// each mirroring the allocations of runtime-native/src (named in its comment), so that the plan
// can hold them: the memory-plan pass sizes each stream's slice of the `scratch` region as the
// most one of its instructions takes (scratchByStream), and the runtime fails an instruction that
// takes more than its stream's slice.
//
// How the runtime takes scratch (kernels/cpu/storage.h, ScratchArena): a stack per stream
// thread, every take rounded up to 64 bytes, emptied after each instruction. An op's own takes
// (ops/*.cc: c.scratch, scratchOf) stay until the instruction ends; a kernel's entry point stages
// each bf16 operand of n elements as n f32 values (Staging<float>) and takes its temporaries
// (ScratchScope) inside that, all released when the kernel returns. So an instruction needs
//   Σ its op's takes  +  max over its kernel calls of (staged operands + the kernel's temporaries)
// The kernels run in double when every float operand is f64 (then nothing is staged and
// statistics are 8 bytes), otherwise in float.
//
// This is the CPU runtime's implementation, not the op's semantics (ir/ops.ts): a CUDA runtime
// would have a table of its own. Sizes are at the bounds, so a rule is an upper bound where the
// runtime's take depends on the data (attention's longest segment, gather_v's root).

import type { DType } from '../../ir/dtype.js';
import { DTYPE_BYTES } from '../../ir/dtype.js';
import type { OpKind } from '../../ir/ops.js';
import { shapeResolver } from '../../ir/shape.js';
import type { Attrs } from '../../ir/types.js';
import { AlikeMemo } from './alike.js';
import { STREAMS, type PlanBuffer, type PlanInstruction, type StreamName } from './format.js';

/** One operand of an instruction at the symbols' bounds. */
export interface ScratchOperand {
  readonly dtype: DType;
  readonly shape: readonly number[];
}

export interface ScratchArgs {
  readonly inputs: readonly ScratchOperand[];
  readonly outputs: readonly ScratchOperand[];
  readonly attrs: Attrs;
}

/** Bytes of scratch one instruction of the op takes at most. */
export type ScratchRule = (a: ScratchArgs) => number;

// ---- the runtime's allocation rules -----------------------------------------------------------

/** a take of `bytes`, as ScratchArena::take rounds it */
export const take = (bytes: number): number => Math.ceil(Math.max(bytes, 0) / 64) * 64;

const numelOf = (t: ScratchOperand) => t.shape.reduce((n, d) => n * d, 1);
const isFloat = (t: ScratchOperand) => t.dtype === 'f32' || t.dtype === 'bf16' || t.dtype === 'f64';
const floats = (ts: readonly (ScratchOperand | undefined)[]) =>
  ts.filter((t): t is ScratchOperand => t !== undefined && isFloat(t));

/** Staging<float>: each bf16 operand of a kernel call as an f32 copy of its elements */
function staged(operands: readonly (ScratchOperand | undefined)[]): number {
  let bytes = 0;
  for (const t of operands) if (t?.dtype === 'bf16') bytes += take(numelOf(t) * 4);
  return bytes;
}

/** bytes of the kernel's Real: double when every float operand is f64 (by_dtype), else float */
function real(operands: readonly (ScratchOperand | undefined)[]): number {
  const fs = floats(operands);
  return fs.length > 0 && fs.every((t) => t.dtype === 'f64') ? 8 : 4;
}

/** computeDType(x): the statistics an op keeps for a float operand, f64 on the f64 path */
const stat = (x: ScratchOperand) => (x.dtype === 'f64' ? 8 : 4);

/** a kernel call over the instruction's float operands: their staging only */
const kernelOverAll: ScratchRule = (a) => staged([...a.inputs, ...a.outputs]);
const none: ScratchRule = () => 0;

const rows = (x: ScratchOperand) => {
  const last = x.shape.at(-1) ?? 1;
  return last === 0 ? 0 : numelOf(x) / last;
};
const num = (a: ScratchArgs, name: string): number => Number(a.attrs[name]);

/** attention_forward/backward (kernels/cpu/attention.cc): runs (T × 24-byte Run) and ids (T i32)
 * of segment_runs, then per row block of ≤ 64 rows × the longest segment (≤ T) columns */
function attentionTiles(T: number, realBytes: number, blocks: number, rowVector: boolean): number {
  const tile = Math.min(64, T) * T;
  return (
    take(T * 24) +
    take(T * 4) +
    blocks * take(tile * realBytes) +
    (rowVector ? take(64 * realBytes) : 0)
  );
}

/** rope_rotate (kernels/cpu/rope.cc): inv_freq, section_of (d/2 × 8 bytes), cos_t, sin_t (d/2 Real) */
function ropeTemps(x: ScratchOperand, realBytes: number): number {
  const half = (x.shape[2] ?? 0) / 2;
  return 2 * take(half * 8) + 2 * take(half * realBytes);
}

/**
 * attention windows (kernels/cpu/attention.cc: segments that are not contiguous runs): the
 * outer call's runs and ids, the token order (T i64) and sorted ids (T i32), and copies in that
 * order — forward: q, out [T, nh, d], k, v [T, nkv, d], lse [T, nh]; backward (pass 2) also dout, dq
 * [T, nh, d] and dk, dv — before the inner call takes its own runs, ids and tiles
 */
function windowCopies(
  q: ScratchOperand,
  k: ScratchOperand,
  realBytes: number,
  pass: 1 | 2,
): number {
  const [T, nh, d] = q.shape;
  const nkv = k.shape[1];
  const nq = take(T * nh * d * realBytes);
  const nk = take(T * nkv * d * realBytes);
  const runs = take(T * 24) + take(T * 4) + take(T * 8) + take(T * 4);
  return pass === 1
    ? runs + 2 * nq + 2 * nk + take(T * nh * realBytes)
    : runs + 4 * nq + 4 * nk + take(T * nh * realBytes);
}

// ---- the table ---------------------------------------------------------------------------------

export const SCRATCH_RULES = {
  // embedding_forward (kernels/cpu/embedding.cc): f32 in place; with a bf16 operand it converts
  // only the gathered rows, so nothing is staged; the weighted bag (ids [T, K]) stages every operand
  embedding: (a) => (a.inputs.length > 2 ? kernelOverAll(a) : 0),
  // linear_forward: staging of y, x, w, b
  patch_embed: kernelOverAll,
  linear: kernelOverAll,
  // run_layernorm (ops/compute.cc): mean, rstd [R] in scratch (scratchOf); layernorm_forward
  // stages y, x, w, b
  layernorm: (a) => {
    const x = a.inputs[0];
    return 2 * take(rows(x) * stat(x)) + staged([...a.inputs, ...a.outputs]);
  },
  // run_rmsnorm: rstd [R]; rmsnorm_forward stages y, x, w
  rmsnorm: (a) => {
    const x = a.inputs[0];
    return take(rows(x) * stat(x)) + staged([...a.inputs, ...a.outputs]);
  },
  // rope_forward: staging of y, x; rope_rotate's tables
  rope: (a) =>
    staged([a.outputs[0], a.inputs[0]]) + ropeTemps(a.inputs[0], real([a.outputs[0], a.inputs[0]])),
  // attention_forward: staging of out, lse, q, k, v; runs, ids and one score tile
  attention: (a) => {
    const [q, k, v] = a.inputs;
    const ops = [...a.outputs, q, k, v];
    const tiles = attentionTiles(q.shape[0], real(ops), 1, false);
    return staged(ops) + (a.attrs.windows ? windowCopies(q, k, real(ops), 1) : 0) + tiles;
  },
  gelu: kernelOverAll,
  swiglu: kernelOverAll,
  add: kernelOverAll,
  merge_visual: kernelOverAll,
  // router_topk_forward: staging of probs, weights, logits
  router_topk: kernelOverAll,
  // moe_permute_forward (kernels/cpu/moe.cc): staging of rows, x, priority; keep [T·k] u8 and
  // next [E] i64; with a capacity also the per-expert lists: start [E+1], of [T·k], fill [E] i64
  moe_permute: (a) => {
    const A = numelOf(a.inputs[1]);
    const E = num(a, 'num_experts');
    const lists =
      a.attrs.capacity !== undefined ? take((E + 1) * 8) + take(A * 8) + take(E * 8) : 0;
    return staged([a.outputs[0], a.inputs[0], a.inputs[2]]) + take(A) + lists + take(E * 8);
  },
  // grouped_linear_forward: staging of y, x and every expert's weight
  grouped_linear: kernelOverAll,
  moe_unpermute: kernelOverAll,
  // moe_aux_loss_forward: staging of probs; count [E] i64, P [E] f64
  moe_aux_loss: (a) => staged([a.inputs[0]]) + 2 * take(a.inputs[0].shape[1] * 8),
  // run_cross_entropy: the log-sum-exp [T] (scratchOf); cross_entropy_forward stages logits
  cross_entropy: (a) => take(a.inputs[0].shape[0] * stat(a.inputs[0])) + staged([a.inputs[0]]),
  vocab_logsumexp: kernelOverAll,
  lse_combine: kernelOverAll,
  vocab_target_logit: (a) => staged([a.outputs[0], a.inputs[0]]),
  ce_from_stats: (a) => staged([a.inputs[0], a.inputs[1]]),
  moe_rank_counts: none,
  // moe_sort_chunks: staging of y, rows; pstart, lstart [P·L] i64
  moe_sort_chunks: (a) => staged([a.outputs[0], a.inputs[0]]) + 2 * take(numelOf(a.inputs[1]) * 8),
  moe_local_counts: none,
  // image_sizes (kernels/cpu/balance.cc): count [images] i32
  image_sizes: (a) => take(num(a, 'images') * 4),
  // vit_balance_route: start [I] i64, dest [P·I] i32; balance_assign's images [P·I] i64,
  // load, rows [P] i64, chosen [P·I] i32
  vit_balance_route: (a) => {
    const I = num(a, 'images');
    const P = numelOf(a.inputs[0]) / Math.max(I, 1);
    return take(I * 8) + take(P * I * 4) + take(P * I * 8) + 2 * take(P * 8) + take(P * I * 4);
  },
  segment_offset: none,
  gather_rows: none,
  // embedding_backward: staging of dtable, dy
  embedding_grad: kernelOverAll,
  linear_dgrad: kernelOverAll,
  linear_wgrad: kernelOverAll,
  // run_layernorm_grad (ops/backward.cc): mean, rstd [R] in scratch; then layernorm_stats
  // stages x and layernorm_backward dx, dw, db, dy, x, w
  layernorm_grad: (a) => {
    const [dy, x, w] = a.inputs;
    const own = 2 * take(rows(x) * stat(x));
    return own + Math.max(staged([x]), staged([...a.outputs, dy, x, w]));
  },
  // run_rmsnorm_grad: rstd [R]; rmsnorm_stats stages x, rmsnorm_backward dx, dw, dy, x, w
  rmsnorm_grad: (a) => {
    const [dy, x, w] = a.inputs;
    const own = take(rows(x) * stat(x));
    return own + Math.max(staged([x]), staged([...a.outputs, dy, x, w]));
  },
  rope_grad: (a) =>
    staged([a.outputs[0], a.inputs[0]]) + ropeTemps(a.inputs[0], real([a.outputs[0], a.inputs[0]])),
  // attention_backward: staging of dq, dk, dv, dout, q, k, v, out, lse; runs, ids, two tiles
  // (probs, dprobs) and D [64]
  attention_grad: (a) => {
    const [dout, q, k, v, , out, lse] = a.inputs;
    const ops = [...a.outputs, dout, q, k, v, out, lse];
    const tiles = attentionTiles(q.shape[0], real(ops), 2, true);
    return staged(ops) + (a.attrs.windows ? windowCopies(q, k, real(ops), 2) : 0) + tiles;
  },
  gelu_grad: kernelOverAll,
  swiglu_grad: kernelOverAll,
  merge_visual_grad: kernelOverAll,
  // run_router_topk_grad: the renormalized weights [T, k] (scratchOf); router_topk_weights stages
  // probs, router_topk_backward stages dlogits, dprobs, dweights, probs and takes dp [E] f64
  router_topk_grad: (a) => {
    const [dprobs, dweights, probs] = a.inputs;
    const own = take(numelOf(dweights) * stat(probs));
    return (
      own +
      Math.max(
        staged([probs]),
        staged([a.outputs[0], dprobs, dweights, probs]) + take(probs.shape[1] * 8),
      )
    );
  },
  moe_permute_grad: (a) => staged([a.outputs[0], a.inputs[0]]),
  grouped_linear_dgrad: kernelOverAll,
  grouped_linear_wgrad: kernelOverAll,
  // the accumulators are inputs (updated in place): staged like any operand
  linear_wgrad_accumulate: kernelOverAll,
  grouped_linear_wgrad_accumulate: kernelOverAll,
  moe_unpermute_grad: kernelOverAll,
  // moe_aux_loss_backward: staging of dprobs; count [E] i64, g [E] Real
  moe_aux_loss_grad: (a) => {
    const dprobs = a.outputs[0];
    return staged([dprobs]) + take(dprobs.shape[1] * 8) + take(dprobs.shape[1] * real([dprobs]));
  },
  // run_cross_entropy_grad: the log-sum-exp [T]; cross_entropy_forward stages logits,
  // cross_entropy_backward dlogits, logits
  cross_entropy_grad: (a) => {
    const logits = a.inputs[1];
    return (
      take(logits.shape[0] * stat(logits)) +
      Math.max(staged([logits]), staged([a.outputs[0], logits]))
    );
  },
  vocab_logsumexp_grad: kernelOverAll,
  lse_combine_grad: kernelOverAll,
  vocab_target_logit_grad: (a) => staged([a.outputs[0], a.inputs[0]]),
  ce_from_stats_grad: (a) => staged(a.outputs),
  // scatter_rows: staging of dx, dy
  scatter_rows: (a) => staged([a.outputs[0], a.inputs[0]]),
  // layout ops move bytes (ops/layout.cc); constant fills in place
  reshape: none,
  split: none,
  concat: none,
  constant: none,
  copy_to_group: none,
  group_slice: none,
  // grad_accumulate: staging of acc, g (both inputs: acc is updated in place)
  grad_accumulate: (a) => staged(a.inputs),
  // run_sum_squares: one sum_squares call per input, each staging it: the largest
  sum_squares: (a) => Math.max(0, ...a.inputs.map((x) => staged([x]))),
  clip_coef: none,
  // adamw_step (kernels/cpu/optimizer.cc): staging of param, grad, m, v; adamw_step_master of
  // master, grad, m, v (the bf16 param is written by convert, unstaged)
  adamw: (a) => {
    const [p, g, m, v, , master] = a.inputs;
    return staged([master ?? p, g, m, v]);
  },
  // all_reduce over Gloo's TCP (comm/gloo.cc bf16AllReduce): a bf16 sum runs on an f32 copy
  // [n]; planned whenever the group has more than one rank (shared memory sums in place)
  all_reduce: (a) => gloo32(a.inputs[0], a),
  all_gather: none,
  // run_reduce_scatter (comm/collectives.cc): the communicator's reduceScatter, in place or into
  // the block; no scratch on any transport (bf16 travels as bf16 and is summed on arrival)
  reduce_scatter: none,
  broadcast: none,
  all_to_all_v: none,
  // run_gather_v with one output per group rank: the root receives every block into scratch
  // [Σ rows, H] first (planned as the root)
  gather_v: (a) => (a.outputs.length > 1 ? take(a.outputs.reduce((n, y) => n + bytesOf(y), 0)) : 0),
  // run_scatter_v with one input per group rank: the root packs them in scratch first
  scatter_v: (a) => (a.inputs.length > 1 ? take(a.inputs.reduce((n, x) => n + bytesOf(x), 0)) : 0),
  // run_all_gather_v: one broadcast per group rank straight into its block of the output
  all_gather_v: none,
  // run_reduce_scatter_v: every rank's contribution to this rank's block [out_rows, H] lands in
  // scratch (P blocks) and is summed from there in group order
  reduce_scatter_v: (a) => take(groupSize(a) * bytesOf(a.outputs[0])),
  send: none,
  recv: none,
  offload: none,
  reload: none,
} satisfies Record<OpKind, ScratchRule>;

function groupSize(a: ScratchArgs): number {
  return a.attrs.group_size === undefined ? 2 : Number(a.attrs.group_size);
}
const bytesOf = (t: ScratchOperand) => numelOf(t) * DTYPE_BYTES[t.dtype];
const gloo32 = (x: ScratchOperand, a: ScratchArgs) =>
  x.dtype === 'bf16' && groupSize(a) > 1 ? take(numelOf(x) * 4) : 0;

// ---- a program's scratch -----------------------------------------------------------------------

/** Each buffer as an operand at the bounds `sizeOf` gives each symbol (resolved once, on use). */
function operandsOf(buffers: readonly PlanBuffer[], sizeOf: (sym: string) => number) {
  const cache: (ScratchOperand | undefined)[] = new Array(buffers.length);
  const resolve = shapeResolver(sizeOf);
  return (id: number): ScratchOperand => {
    let t = cache[id];
    if (!t) {
      const b = buffers[id];
      t = { dtype: b.dtype as DType, shape: resolve(b.shape) };
      cache[id] = t;
    }
    return t;
  };
}

function ruleOf(op: string): ScratchRule {
  const rule = (SCRATCH_RULES as Record<string, ScratchRule>)[op];
  if (!rule) throw new Error(`scratch: no rule for op ${op}`);
  return rule;
}

/** Bytes of scratch the instruction takes at most. */
export function instructionScratchBytes(
  ins: PlanInstruction,
  buffers: readonly PlanBuffer[],
  sizeOf: (sym: string) => number,
): number {
  const operand = operandsOf(buffers, sizeOf);
  return ruleOf(ins.op)({
    inputs: ins.inputs.map(operand),
    outputs: ins.outputs.map(operand),
    attrs: ins.attrs as Attrs,
  });
}

/**
 * Each stream's scratch: the most one of its instructions takes (a multiple of 64). `memo` keeps
 * each alike group's bytes (compiler/plan/alike.ts) for the programs of one compile: it must come
 * with the same `sizeOf`.
 */
export function scratchByStream(
  instructions: readonly PlanInstruction[],
  buffers: readonly PlanBuffer[],
  sizeOf: (sym: string) => number,
  memo: AlikeMemo<number> = new AlikeMemo(),
): Record<StreamName, number> {
  const bytes = Object.fromEntries(STREAMS.map((s) => [s, 0])) as Record<StreamName, number>;
  const operand = operandsOf(buffers, sizeOf);
  for (let i = 0; i < instructions.length; i++) {
    const ins = instructions[i];
    const rule = ruleOf(ins.op);
    if (rule === none) continue; // a sixth of a large program's instructions: no lookup
    let need = memo.get(ins, buffers);
    if (need === undefined) {
      need = rule({
        inputs: ins.inputs.map(operand),
        outputs: ins.outputs.map(operand),
        attrs: ins.attrs as Attrs,
      });
      memo.put(ins, buffers, need);
    }
    if (need > bytes[ins.stream]) bytes[ins.stream] = need;
  }
  return bytes;
}
