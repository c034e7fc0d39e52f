// Emission pass 9, encoder-offload: --full-hetero-dp-cpu-offload (encoder level 3). What the
// encoder's phases leave idle on the device across the peak of the decoder's pipeline waits on the
// host instead.
//
// Holds before: the program after activations (pass 8), the arena unplanned.
// Holds after: each chosen idle gap of an encoder buffer is an offload after its last use before
//   the gap and a reload into a fresh device buffer before its first use after it, on the copy
//   stream with their events; its bytes stay allocated until those events are waited for
//   (keepUntilWait). The arena is still unplanned.
//
// Level 3 encodes every microbatch before the decoder's pipeline starts (phase 1) and runs the
// encoder's backward after it ends (phase 3), so three kinds of bytes sit idle through decoder
// compute: the gathered encoder outputs (phase 1 to the decoder forward that reads them), the
// gradients of those outputs (the decoder backward that makes them to phase 3's scatter_v), and
// the activations the encoder's forward keeps for its backward (phase 1 to phase 3; none under
// --full-hetero-dp-encoder-recompute, which drops them). LoongForge moves the first kind, all of
// it ("intermediate results": visual embeddings, masks, deepstack embeddings), and keeps the whole
// list on the device until the step ends when it does not. lfc frees each output at the decoder's
// last read of it, so at the pipeline's peak the outputs of the microbatches already started are
// gone with or without offload, while the kept activations are all still there.
//
// The candidates: each gap between consecutive uses of a buffer of the encoder (one that an
// instruction of scope visual.* or encoder_handoff writes or reads) with decoder compute in it.
// A spilled gap is:
//   offload  on the copy stream right after the use before the gap, waiting for it; the next
//            compute instruction of another group (microbatch and decoder layer, or encoder pass)
//            waits for the copy, and the device buffer stays allocated until then (`keep`), so
//            its bytes are reused only once the host holds them
//   reload   on the copy stream at the start of the next use's group (a decoder layer reads its
//            deepstack embedding when that layer starts, not when the microbatch does), waiting
//            for the last compute and comm instructions before it, so the bytes the planner gives
//            the fresh buffer are free; the next use waits for the reload, and every later use
//            reads and writes the fresh buffer
// So the device is rid of a spilled buffer from its offload's waiter to its reload. The arena is
// as large as its peak, and a copy away from the peak saves nothing but costs host bandwidth:
// the gaps spilled are those the peak falls inside, found again after each round (the peak moves
// when it drops) until the peak falls inside none. The rounds work on the emitted program's live
// bytes per instruction (the lifetimes the arena would be planned from), less each chosen gap's
// bytes between its waiter and its reload, which is what the rewrite, done once at the end, makes.

import { isEncoderScope } from '../parallel/encoder.js';
import { instructionWith, type PlanInstruction } from '../plan/format.js';
import type { ActivationProgram } from './activations.js';
import { align, type Lifetime } from '../plan/memory.js';
import {
  addCopy,
  assemble,
  copyInstruction,
  eventAt,
  insertBefore,
  lastArenaUsers,
  layerOf,
  rootOf,
  type Ctx,
} from './rewrite.js';

export interface EncoderOffloadResult {
  /** events numbered after the rewrite */
  readonly events: number;
  /** [event] the device buffers that stay allocated until an instruction waits for the event */
  readonly keep: ReadonlyMap<number, readonly number[]>;
}

const HANDOFF = 'encoder_handoff';
const ofEncoder = (x: PlanInstruction) => isEncoderScope(x.scope) || x.scope === HANDOFF;

/** instructions that run as one: a decoder layer of a microbatch, an encoder pass, a collective */
function groupOf(x: PlanInstruction): string {
  const part = isEncoderScope(x.scope) ? 'visual' : (layerOf(x.scope) ?? x.scope);
  return `${x.microbatch} ${x.phase} ${part}`;
}

/** a gap between two uses of an encoder buffer that a spill can take the buffer off the device */
interface Gap {
  /** the arena root buffer */
  readonly root: number;
  /** the uses before and after the gap */
  readonly a: number;
  readonly b: number;
  /** the first instruction the device is rid of it (the offload's waiter), the reload's place */
  readonly w: number;
  readonly s: number;
}

/**
 * Spills the gaps the arena's peak falls in, round by round. `arena`: the emitted program's arena
 * lifetimes, by root buffer.
 */
export function offloadIdleEncoderBytes(
  p: ActivationProgram,
  arena: readonly Lifetime[],
): EncoderOffloadResult {
  const ctx: Ctx = { ins: p.instructions, buffers: p.buffers, events: p.events };
  const { gaps, uses } = findGaps(ctx);
  const n = p.instructions.length;
  const bytes = (id: number) => align(Math.max(p.buffers[id].bytes, 1));
  // live bytes at each instruction, as a difference array
  const diff = new Float64Array(n + 1);
  for (const b of arena) {
    diff[b.start] += bytes(b.id);
    diff[b.end + 1] -= bytes(b.id);
  }
  const chosen = new Set<Gap>();
  let peak: number;
  for (;;) {
    // the first instruction where the most bytes are live
    let [live, t] = [0, 0];
    peak = -1;
    for (let i = 0; i < n; i++) {
      live += diff[i];
      if (live > peak) [peak, t] = [live, i];
    }
    const more = gaps.filter((g) => !chosen.has(g) && g.w < t && t < g.s);
    if (!more.length) break;
    for (const g of more) {
      chosen.add(g);
      diff[g.w + 1] -= bytes(g.root);
      diff[g.s] += bytes(g.root);
    }
  }
  if (!chosen.size) return { events: p.events, keep: new Map() };
  // a gap taken for an earlier round's peak may not be needed to stay under the last one: put
  // back each whose bytes fit under it (largest first), so nothing is copied that lowers no peak
  const live = new Float64Array(n);
  for (let i = 0, sum = 0; i < n; i++) live[i] = sum += diff[i];
  for (const g of [...chosen].sort((x, y) => bytes(y.root) - bytes(x.root) || x.a - y.a)) {
    const k = bytes(g.root);
    let fits = true;
    for (let i = g.w + 1; i < g.s && fits; i++) fits = live[i] + k <= peak;
    if (!fits) continue;
    chosen.delete(g);
    for (let i = g.w + 1; i < g.s; i++) live[i] += k;
  }
  const result = spill(
    ctx,
    gaps.filter((g) => chosen.has(g)),
    uses,
  );
  p.instructions.length = 0;
  for (const x of ctx.ins) p.instructions.push(x);
  return result;
}

/** every use (read or write, through the buffer or a view) of the roots `want` takes, in issue
 * order */
function usesOf(ctx: Ctx, want: Uint8Array): Map<number, number[]> {
  const uses = new Map<number, number[]>();
  ctx.ins.forEach((x, i) => {
    for (const ids of [x.inputs, x.outputs])
      for (const id of ids) {
        const r = rootOf(ctx.buffers, id);
        if (!want[r]) continue;
        let list = uses.get(r);
        if (!list) uses.set(r, (list = []));
        if (list[list.length - 1] !== i) list.push(i);
      }
  });
  return uses;
}

/** every gap with decoder compute in it, on the program as emitted; the uses of their buffers */
function findGaps(ctx: Ctx): { gaps: Gap[]; uses: Map<number, number[]> } {
  const { ins, buffers } = ctx;
  const n = ins.length;
  const decoder = new Int32Array(n + 1);
  const encoderRoot = new Uint8Array(buffers.length);
  for (let i = 0; i < n; i++) {
    const x = ins[i];
    const encoder = ofEncoder(x);
    decoder[i + 1] =
      decoder[i] + (x.stream === 'compute' && x.phase !== 'optimizer' && !encoder ? 1 : 0);
    if (!encoder) continue;
    for (const ids of [x.inputs, x.outputs])
      for (const id of ids) {
        const r = rootOf(buffers, id);
        if (buffers[r].region === 'arena' && buffers[r].bytes > 0) encoderRoot[r] = 1;
      }
  }
  const uses = usesOf(ctx, encoderRoot);
  const gaps: Gap[] = [];
  for (const [root, list] of uses) {
    // the uses after a gap are ordered after its reload only on the reload's waiter's stream
    let lastOther = -1;
    list.forEach((j, u) => {
      if (ins[j].stream !== 'compute') lastOther = u;
    });
    for (let u = lastOther < 0 ? 0 : lastOther; u + 1 < list.length; u++) {
      const [a, b] = [list[u], list[u + 1]];
      if (decoder[b] - decoder[a + 1] === 0) continue;
      let w = a + 1;
      while (w < b && (ins[w].stream !== 'compute' || groupOf(ins[w]) === groupOf(ins[a]))) w++;
      let s = b;
      while (s > w && ins[s - 1].stream === 'compute' && groupOf(ins[s - 1]) === groupOf(ins[b]))
        s--;
      gaps.push({ root, a, b, w, s });
    }
  }
  return { gaps, uses };
}

/** the rewrite with these gaps spilled */
function spill(
  ctx: Ctx,
  gaps: readonly Gap[],
  uses: ReadonlyMap<number, readonly number[]>,
): EncoderOffloadResult {
  const { ins, buffers } = ctx;
  const last = lastArenaUsers(ctx);
  const before = new Map<number, PlanInstruction[]>();
  const waits = new Map<number, number[]>();
  const addWait = (j: number, e: number) => waits.set(j, [...(waits.get(j) ?? []), e]);
  const keep = new Map<number, number[]>();
  /** [instruction] its buffers renamed (a root or view → the reloaded copy) */
  const renames = new Map<number, Map<number, number>>();
  // per root, in issue order: each spill renames the uses after it
  const byRoot = new Map<number, Gap[]>();
  for (const g of gaps) byRoot.set(g.root, [...(byRoot.get(g.root) ?? []), g]);
  const views = new Map<number, number[]>([...byRoot.keys()].map((r) => [r, []]));
  for (const b of buffers) if (b.viewOf !== undefined) views.get(b.viewOf)?.push(b.id);
  for (const [r, list] of byRoot) {
    list.sort((x, y) => x.a - y.a);
    const current = new Map<number, number>([[r, r], ...views.get(r)!.map((v) => [v, v] as const)]);
    // the copies carry the scope of the instruction that made the buffer
    const scope = ins[uses.get(r)![0]].scope;
    for (const { a, b, w, s } of list) {
      const root = current.get(r)!;
      const host = addCopy(ctx, root, '.host', { region: 'host', space: 'host' });
      const eOut = ctx.events++;
      const out = copyInstruction('offload', root, host, [eventAt(ctx, a)], eOut, {
        ...ins[a],
        scope,
      });
      insertBefore(before, a + 1, out);
      addWait(w, eOut);
      keep.set(eOut, [root]);
      const fresh = [last.compute[s], last.comm[s]]
        .filter((j) => j >= 0)
        .map((j) => eventAt(ctx, j));
      const device = addCopy(ctx, root, '.reloaded');
      const eIn = ctx.events++;
      insertBefore(
        before,
        s,
        copyInstruction('reload', host, device, fresh, eIn, { ...ins[b], scope }),
      );
      addWait(b, eIn);
      // the uses from b on name the fresh buffer (a view of the root: a view of it)
      current.set(r, device);
      for (const v of views.get(r)!)
        current.set(v, addCopy(ctx, v, '.reloaded', { viewOf: device }));
      for (const j of uses.get(r)!) {
        if (j < b) continue;
        const m = renames.get(j) ?? new Map<number, number>();
        for (const [id, now] of current) m.set(id, now);
        renames.set(j, m);
      }
    }
  }
  for (const [j, m] of renames) {
    const x = ins[j];
    const to = (id: number) => m.get(id) ?? id;
    ins[j] = instructionWith(x, { inputs: x.inputs.map(to), outputs: x.outputs.map(to) });
  }
  for (const [j, es] of waits) ins[j] = instructionWith(ins[j], { wait: [...ins[j].wait, ...es] });
  if (before.size) ctx.ins = assemble(ins, before);
  return { events: ctx.events, keep };
}
