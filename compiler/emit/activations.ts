// Emission pass 8, activations: recompute and offload (DESIGN.md "Data flow": recompute /
// offload decisions), --recompute-granularity/--recompute-modules and --offload-tensors.
//
// Holds before: every instruction is in issue order (passes, gradient sums, optimizer step) and
//   numbered (pass 7); the arena is not planned yet.
// Holds after: the chosen forward values are recomputed in backward or copied to the host and
//   back (below), with the events that order the copies; the arena is still unplanned, so the
//   planner sees the shorter lifetimes this makes. Names: compiler/frontend/activation-names.ts.
//
//   pass 1  recompute (--recompute-granularity, --recompute-modules). Per microbatch and decoder
//           layer (model.layers.<i>; the vision encoder is left alone), the chosen modules'
//           forward instructions (`full`: the whole layer), with the views of what they make, are
//           the recomputed region. The values it makes that the layer's own backward reads are
//           not kept from forward to backward: their producers are issued again in backward (same
//           op, attrs and inputs; new arena buffers), each right before the first instruction
//           that reads its outputs, a backward instruction of the layer or another recomputed
//           one, and the layer's backward reads the new buffers. A value that backward outside
//           the layer reads (the layer's output, the next layer's input) is kept. The region's
//           inputs stay alive because the copies read them. Collectives inside are issued again,
//           on every rank of their group alike.
//   pass 2  offload (--offload-tensors). Each named activation is copied to a host buffer on the
//           copy stream after its last forward reader, and back into a fresh arena buffer at the
//           start of its layer's backward; the backward readers read that one:
//             offload  waits for the last forward reader on compute, which follows the producer;
//                      the first compute instruction after the layer's forward waits for it, so
//                      the device bytes are reused only once copied out
//             reload   waits for the last compute and comm instructions issued before it, so the
//                      bytes the planner gives the fresh buffer are no longer in use; the first
//                      backward reader waits for it
// The host buffers are placed by the emitter from their lifetimes (offload → reload), like the
// arena; only the copy stream touches them.

import {
  OFFLOAD_TENSORS,
  RECOMPUTE_MODULES,
  type OffloadTensor,
  type RecomputeModule,
} from '../frontend/activation-names.js';
import { instructionWith, type PlanBuffer, type PlanInstruction } from '../plan/format.js';
import {
  addCopy,
  assemble,
  copyInstruction,
  insertBefore,
  lastArenaUsers,
  layerOf,
  ProgramIndex,
  under,
  type Ctx,
} from './rewrite.js';

export interface ActivationPolicy {
  /** `full`: whole decoder layers; `selective`: the named modules of every decoder layer */
  readonly recompute?: {
    readonly granularity: 'full' | 'selective';
    readonly modules?: readonly RecomputeModule[];
  };
  /** activations kept on the host between forward and backward */
  readonly offload?: readonly OffloadTensor[];
}

/** Megatron's default --recompute-modules */
export const DEFAULT_RECOMPUTE_MODULES: readonly RecomputeModule[] = ['core_attn'];

/**
 * The policy of the compile options `recompute` and `offloadTensors` (names already checked by the
 * layout rules); undefined when neither is set.
 */
export function activationPolicyOf(o: {
  readonly recompute?: {
    readonly granularity: 'full' | 'selective';
    readonly modules?: readonly string[];
  };
  readonly offloadTensors?: readonly string[];
}): ActivationPolicy | undefined {
  const known = <K extends string>(names: readonly string[], table: object, flag: string) =>
    names.map((n) => {
      if (!Object.hasOwn(table, n)) throw new Error(`${flag}: unknown name ${n}`);
      return n as K;
    });
  const offload = o.offloadTensors?.length
    ? known<OffloadTensor>(o.offloadTensors, OFFLOAD_TENSORS, '--offload-tensors')
    : undefined;
  if (!o.recompute && !offload) return undefined;
  return {
    ...(o.recompute
      ? {
          recompute: {
            granularity: o.recompute.granularity,
            modules: known<RecomputeModule>(
              o.recompute.modules ?? DEFAULT_RECOMPUTE_MODULES,
              RECOMPUTE_MODULES,
              '--recompute-modules',
            ),
          },
        }
      : {}),
    ...(offload ? { offload } : {}),
  };
}

/** What the emitter hands over: instructions rewritten in place, buffers appended to. */
export interface ActivationProgram {
  readonly instructions: PlanInstruction[];
  readonly buffers: PlanBuffer[];
  /** events numbered so far */
  readonly events: number;
}

/** Applies the policy to the program; returns the number of events after it. */
export function applyActivationPolicy(
  p: ActivationProgram,
  policy: ActivationPolicy | undefined,
): number {
  const ctx: Ctx = { ins: p.instructions, buffers: p.buffers, events: p.events };
  if (policy?.recompute) {
    const { granularity, modules = DEFAULT_RECOMPUTE_MODULES } = policy.recompute;
    recompute(ctx, granularity === 'full' ? 'full' : modules);
  }
  if (policy?.offload?.length) offload(ctx, policy.offload);
  if (ctx.ins !== p.instructions) {
    p.instructions.length = 0;
    for (const x of ctx.ins) p.instructions.push(x);
  }
  return ctx.events;
}

// ---- pass 1: recompute ----------------------------------------------------------------------

/** the forward instructions of a module in one layer's forward (`fw`, issue order) */
type ModuleRule = (fw: readonly number[], ins: readonly Ins[], layer: string) => number[];

/** what the module and tensor rules read of an instruction (lfc tune applies them to graph nodes) */
type Ins = Pick<PlanInstruction, 'op' | 'scope' | 'inputs' | 'outputs'>;

const isMoe = (fw: readonly number[], ins: readonly Ins[], p: string) =>
  fw.some((i) => ins[i].op === 'router_topk' && under(ins[i].scope, `${p}.mlp`));

const pick = (fw: readonly number[], keep: (i: number) => boolean) => fw.filter(keep);

/** the first instruction of scope exactly `scope` in fw, or -1 */
const firstIn = (fw: readonly number[], ins: readonly Ins[], scope: string) =>
  fw.find((i) => ins[i].scope === scope) ?? -1;

const MODULES: Record<RecomputeModule, ModuleRule> = {
  core_attn: (fw, ins, p) =>
    pick(fw, (i) => ins[i].op === 'attention' && under(ins[i].scope, `${p}.self_attn`)),
  // the two norms, and under sequence parallelism the all_gather of their outputs (what the
  // linears after them read)
  layernorm: (fw, ins, p) => {
    const norms = pick(
      fw,
      (i) =>
        under(ins[i].scope, `${p}.input_layernorm`) ||
        under(ins[i].scope, `${p}.post_attention_layernorm`),
    );
    const made = new Set(norms.flatMap((i) => ins[i].outputs));
    return pick(
      fw,
      (i) => norms.includes(i) || (ins[i].op === 'all_gather' && made.has(ins[i].inputs[0])),
    );
  },
  mlp: (fw, ins, p) => {
    const scope = isMoe(fw, ins, p) ? `${p}.mlp.experts` : `${p}.mlp`;
    return pick(fw, (i) => under(ins[i].scope, scope));
  },
  moe: (fw, ins, p) => (isMoe(fw, ins, p) ? pick(fw, (i) => under(ins[i].scope, `${p}.mlp`)) : []),
  moe_act: (fw, ins, p) =>
    pick(fw, (i) => ins[i].op === 'swiglu' && under(ins[i].scope, `${p}.mlp.experts`)),
  // input_layernorm → o_proj, and what follows in the layer's own scope before the next norm
  // (tensor parallelism's all_reduce of o_proj, the residual add)
  a2a_overlap_attn: (fw, ins, p) => {
    const norm = firstIn(fw, ins, `${p}.post_attention_layernorm`);
    return pick(
      fw,
      (i) =>
        under(ins[i].scope, `${p}.input_layernorm`) ||
        under(ins[i].scope, `${p}.self_attn`) ||
        (ins[i].scope === p && (norm < 0 || i < norm)),
    );
  },
  // post_attention_layernorm, the router, moe_permute and the count exchange: everything of the
  // MoE block before the dispatch all_to_all_v (ep 1: before the experts)
  a2a_overlap_post_attn: (fw, ins, p) => {
    const permute = fw.find((i) => ins[i].op === 'moe_permute' && ins[i].scope === `${p}.mlp`);
    const rows = permute === undefined ? -1 : ins[permute].outputs[0];
    const dispatch =
      fw.find(
        (i) =>
          under(ins[i].scope, `${p}.mlp.experts`) ||
          (ins[i].op === 'all_to_all_v' && ins[i].inputs[0] === rows),
      ) ?? Infinity;
    return pick(
      fw,
      (i) =>
        under(ins[i].scope, `${p}.post_attention_layernorm`) ||
        under(ins[i].scope, `${p}.mlp.gate`) ||
        (permute !== undefined && ins[i].scope === `${p}.mlp` && i < dispatch),
    );
  },
  a2a_overlap_mlp: (fw, ins, p) => pick(fw, (i) => under(ins[i].scope, `${p}.mlp.experts`)),
};

/** The forward instructions of `module` in one layer's forward `fw` (pass 1's region). */
export const moduleInstructions = (
  module: RecomputeModule,
  fw: readonly number[],
  ins: readonly Ins[],
  layer: string,
): number[] => MODULES[module](fw, ins, layer);

function recompute(ctx: Ctx, modules: 'full' | readonly RecomputeModule[]): void {
  const ix = new ProgramIndex(ctx);
  const { ins, buffers } = ctx;
  const before = new Map<number, PlanInstruction[]>();
  /** new inputs of backward instructions that read recomputed buffers */
  const redirected = new Map<number, number[]>();
  for (const { mb, layer, fw } of ix.layers.values()) {
    const chosen = new Set(
      modules === 'full' ? fw : modules.flatMap((m) => MODULES[m](fw, ins, layer)),
    );
    if (!chosen.size) continue;
    // the region: the chosen instructions that write arena buffers only (not a reported loss),
    // and the forward views of what they make, wherever those are
    const region = new Set<number>();
    const made = new Set<number>();
    for (const i of [...chosen].sort((a, b) => a - b)) {
      const x = ins[i];
      if (x.stream !== 'compute' || !x.outputs.every((o) => buffers[o].region === 'arena'))
        continue;
      region.add(i);
      for (const o of x.outputs) {
        made.add(o);
        for (const v of ix.views[ix.root(o)]) {
          const j = ix.producer[v];
          if (j >= 0 && ins[j].phase === 'forward' && ins[j].microbatch === mb) {
            region.add(j);
            made.add(v);
          }
        }
      }
    }
    const inLayerBackward = (j: number) =>
      ins[j].phase === 'backward' &&
      ins[j].microbatch === mb &&
      ins[j].stream === 'compute' &&
      layerOf(ins[j].scope) === layer;
    // a root is kept when anything but this microbatch's forward and the layer's backward reads it
    const keptMemo = new Map<number, boolean>();
    const kept = (r: number) => {
      let k = keptMemo.get(r);
      if (k === undefined) {
        k = ix
          .readersOfRoot(r)
          .some(
            (j) => !inLayerBackward(j) && !(ins[j].phase === 'forward' && ins[j].microbatch === mb),
          );
        keptMemo.set(r, k);
      }
      return k;
    };
    // made here, on bytes made here, and not kept: the layer's backward reads a recomputed copy
    const fresh = (b: number) => made.has(b) && made.has(ix.root(b)) && !kept(ix.root(b));
    // the instructions to issue again: producers of what the layer's backward reads, and of what
    // those read, inside the region
    const again = new Set<number>();
    const readsOf = new Map<number, number[]>(); // backward instruction → its fresh inputs
    const work: number[] = [];
    for (const b of made) {
      if (!fresh(b)) continue;
      for (const j of ix.readers[b]) {
        if (!inLayerBackward(j)) continue;
        readsOf.set(j, [...(readsOf.get(j) ?? []), b]);
        work.push(ix.producer[b]);
      }
    }
    while (work.length) {
      const i = work.pop()!;
      if (again.has(i)) continue;
      again.add(i);
      for (const v of ins[i].inputs) if (fresh(v)) work.push(ix.producer[v]);
    }
    if (!again.size) continue;
    const order = [...again].sort((a, b) => a - b);
    // where each copy goes: before the first reader of its outputs (a backward instruction of
    // the layer, or the place of a later copy); consumers first
    const at = new Map<number, number>();
    for (const i of [...order].reverse()) {
      let first = Infinity;
      for (const o of ins[i].outputs) {
        if (!fresh(o)) continue;
        for (const j of ix.readers[o]) {
          if (inLayerBackward(j)) first = Math.min(first, j);
          else if (again.has(j)) first = Math.min(first, at.get(j)!);
        }
      }
      at.set(i, first);
    }
    const renamed = new Map<number, number>();
    for (const i of order) {
      const x = ins[i];
      const outputs = x.outputs.map((o) => {
        const view = buffers[o].viewOf;
        const id = addCopy(ctx, o, '.recompute', {
          viewOf: view === undefined ? undefined : (renamed.get(view) ?? view),
        });
        renamed.set(o, id);
        return id;
      });
      const copy = instructionWith(x, {
        inputs: x.inputs.map((v) => (fresh(v) ? renamed.get(v)! : v)),
        outputs,
        wait: [],
        record: [],
        phase: 'backward',
      });
      const place = at.get(i)!;
      if (!Number.isFinite(place)) continue;
      insertBefore(before, place, copy);
    }
    for (const j of readsOf.keys()) {
      const inputs = redirected.get(j) ?? [...ins[j].inputs];
      redirected.set(
        j,
        inputs.map((v) => (fresh(v) ? renamed.get(v)! : v)),
      );
    }
  }
  if (!before.size) return;
  const next = ins.map((x, j) => {
    const inputs = redirected.get(j);
    return inputs ? instructionWith(x, { inputs }) : x;
  });
  // the waits of an instruction move to the first copy before it (same stream, so it still waits)
  for (const [j, list] of before) {
    list[0] = instructionWith(list[0], { wait: [...list[0].wait, ...next[j].wait] });
    next[j] = instructionWith(next[j], { wait: [] });
  }
  ctx.ins = assemble(next, before);
}

// ---- pass 2: offload ------------------------------------------------------------------------

/** the root buffers a name means in one layer's forward (`fw`, issue order) */
type TensorRule = (fw: readonly number[], ins: readonly Ins[], layer: string) => number[];

const inputsOf = (x: Ins | undefined, k: number[]) =>
  x ? k.map((n) => x.inputs[n]).filter((v) => v !== undefined) : [];
const firstOf = (fw: readonly number[], ins: readonly Ins[], keep: (x: Ins) => boolean) => {
  const i = fw.find((j) => keep(ins[j]));
  return i === undefined ? undefined : ins[i];
};
const norm = (fw: readonly number[], ins: readonly Ins[], scope: string) =>
  firstOf(fw, ins, (x) => x.scope === scope);
const expertFc1: TensorRule = (fw, ins, p) =>
  inputsOf(
    firstOf(fw, ins, (x) => x.op === 'grouped_linear' && under(x.scope, `${p}.mlp.experts`)),
    [0],
  );

const TENSORS: Record<OffloadTensor, TensorRule> = {
  dispatched_input: expertFc1,
  expert_fc1: expertFc1,
  // what the router (dense: the MLP) reads: the norm's output, gathered under sequence parallelism
  pre_mlp_layernorm_output: (fw, ins, p) =>
    inputsOf(
      firstOf(fw, ins, (x) => x.op === 'linear' && under(x.scope, `${p}.mlp`)),
      [0],
    ),
  attn_norm: (fw, ins, p) => inputsOf(norm(fw, ins, `${p}.input_layernorm`), [0]),
  qkv_linear: (fw, ins, p) =>
    inputsOf(
      firstOf(fw, ins, (x) => x.op === 'linear' && under(x.scope, `${p}.self_attn`)),
      [0],
    ),
  core_attn: (fw, ins, p) =>
    inputsOf(
      firstOf(fw, ins, (x) => x.op === 'attention' && under(x.scope, `${p}.self_attn`)),
      [0, 1, 2],
    ),
  attn_proj: (fw, ins, p) =>
    inputsOf(
      firstOf(fw, ins, (x) => x.op === 'linear' && x.scope === `${p}.self_attn.o_proj`),
      [0],
    ),
  mlp_norm: (fw, ins, p) => inputsOf(norm(fw, ins, `${p}.post_attention_layernorm`), [0]),
  moe_act: (fw, ins, p) =>
    inputsOf(
      firstOf(fw, ins, (x) => x.op === 'swiglu' && under(x.scope, `${p}.mlp.experts`)),
      [0, 1],
    ),
};

/** The buffers `name` means in one layer's forward `fw` (pass 2's copies). */
export const offloadedBuffers = (
  name: OffloadTensor,
  fw: readonly number[],
  ins: readonly Ins[],
  layer: string,
): number[] => TENSORS[name](fw, ins, layer);

function offload(ctx: Ctx, names: readonly OffloadTensor[]): void {
  const ix = new ProgramIndex(ctx);
  const { buffers } = ctx;
  const n = ctx.ins.length;
  const before = new Map<number, PlanInstruction[]>();
  const addWait = (j: number, e: number) => {
    ctx.ins[j] = instructionWith(ctx.ins[j], { wait: [...ctx.ins[j].wait, e] });
  };
  const last = lastArenaUsers(ctx);
  const done = new Set<number>();
  for (const { mb, layer, fw } of ix.layers.values()) {
    const ins = ctx.ins;
    const roots = names.flatMap((name) => TENSORS[name](fw, ins, layer)).map((b) => ix.root(b));
    for (const t of roots) {
      if (done.has(t) || buffers[t].region !== 'arena') continue;
      // read in this microbatch's forward, then only by its backward on compute
      const readers = ix.readersOfRoot(t);
      const isForward = (j: number) => ins[j].phase === 'forward' && ins[j].microbatch === mb;
      const isBackward = (j: number) => ins[j].phase === 'backward' && ins[j].microbatch === mb;
      const backward = readers.filter(isBackward);
      if (!backward.length || backward.some((j) => ins[j].stream !== 'compute')) continue;
      if (readers.some((j) => !isForward(j) && !isBackward(j))) continue;
      const touching = [ix.producer[t], ...readers].filter(
        (j) => j >= 0 && isForward(j) && ins[j].stream === 'compute',
      );
      if (!touching.length) continue;
      const lastRead = Math.max(...touching);
      // the offload goes before the first compute instruction after the last reader's layer
      const lastLayer = layerOf(ins[lastRead].scope);
      let k = lastRead + 1;
      while (
        k < n &&
        (ins[k].stream !== 'compute' ||
          (lastLayer !== undefined && isForward(k) && layerOf(ins[k].scope) === lastLayer))
      )
        k++;
      const b1 = backward[0];
      if (k >= n || b1 < k) continue;
      done.add(t);
      // the reload at the start of the first backward reader's run of its layer's instructions
      const readerLayer = layerOf(ins[b1].scope);
      let s = b1;
      while (
        readerLayer !== undefined &&
        s > k &&
        ins[s - 1].stream === 'compute' &&
        ins[s - 1].phase === 'backward' &&
        ins[s - 1].microbatch === mb &&
        layerOf(ins[s - 1].scope) === readerLayer
      )
        s--;
      const scope = ix.producer[t] >= 0 ? ins[ix.producer[t]].scope : layer;
      const host = addCopy(ctx, t, '.host', { region: 'host', space: 'host' });
      const eOut = ctx.events++;
      insertBefore(
        before,
        k,
        copyInstruction('offload', t, host, [ix.eventAt(lastRead)], eOut, {
          microbatch: mb,
          phase: 'forward',
          scope,
        }),
      );
      addWait(k, eOut);
      const device = addCopy(ctx, t, '.reload');
      const waits = [last.compute[s], last.comm[s]].filter((j) => j >= 0).map((j) => ix.eventAt(j));
      const eIn = ctx.events++;
      insertBefore(
        before,
        s,
        copyInstruction('reload', host, device, waits, eIn, {
          microbatch: mb,
          phase: 'backward',
          scope,
        }),
      );
      addWait(b1, eIn);
      // backward reads the reloaded buffer (a view of the tensor: a view of it)
      const renamed = new Map<number, number>([[t, device]]);
      for (const v of ix.views[t]) renamed.set(v, addCopy(ctx, v, '.reload', { viewOf: device }));
      for (const j of backward) {
        const x = ctx.ins[j];
        ctx.ins[j] = instructionWith(x, { inputs: x.inputs.map((v) => renamed.get(v) ?? v) });
      }
    }
  }
  if (before.size) ctx.ins = assemble(ctx.ins, before);
}
