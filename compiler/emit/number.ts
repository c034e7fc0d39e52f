// Emission pass 7, number: canonical numbering of a program's buffers and events: by first appearance, not by the order
// the emitter happened to create them. Emission passes may then add buffers and events in any
// order (a handoff pass after lowering, a bucket pass after the passes) and still write the same
// program, byte for byte: the memory planner, which places buffers in id order, sees the same list.
//
// Order of appearance: the parameters (`params`: buffer, grad, exp_avg, exp_avg_sq), the data
// inputs, the step scalars, then the instructions in issue order (inputs, then outputs), the
// reported outputs and the optimizer shards' state; a buffer nobody names comes last, in its old
// order. A view is numbered right after the buffer it views, which keeps viewOf < id. Events are
// numbered by the first instruction that names them (wait or record).
//
// Holds before: ids are dense (buffer i has id i), every reference names an existing buffer, and
//   no two instructions share a non-empty id list (each has its own arrays; empty event lists
//   are one shared array, draft.ts NO_EVENTS, which renaming leaves as it is).
// Holds after: the same, with ids renumbered; nothing else changes (offsets, names, order).

import type { ProgramDraft } from './draft.js';
import type { MutableBuffer } from './rewrite.js';
import type { PlanBuffer } from '../plan/format.js';

/** What numbering reads and rewrites of a draft. */
export type NumberedParts = Pick<
  ProgramDraft,
  | 'buffers'
  | 'instructions'
  | 'params'
  | 'inputs'
  | 'scalars'
  | 'outputs'
  | 'optimizerShards'
  | 'keepUntilWait'
  | 'events'
>;

/**
 * The parts renumbered canonically (see the header). The buffers and instructions are renumbered
 * in place (compiler/emit/draft.ts: drafts are linear): copying every one of them cost a second
 * and 0.2 GiB on the 235B layout's 400k instructions.
 */
export function numberProgram(p: NumberedParts): NumberedParts {
  const b = bufferOrder(p);
  const ev = eventOrder(p);
  const buffers: PlanBuffer[] = new Array<PlanBuffer>(p.buffers.length);
  const list = p.buffers as MutableBuffer[];
  for (let k = 0; k < list.length; k++) {
    const x = list[k];
    const id = b[x.id];
    x.id = id;
    if (x.viewOf !== undefined) x.viewOf = b[x.viewOf];
    buffers[id] = x;
  }
  const rename = (ids: readonly number[], table: Int32Array) => {
    const list = ids as number[];
    for (let i = 0; i < list.length; i++) list[i] = table[list[i]];
  };
  for (let k = 0; k < p.instructions.length; k++) {
    const x = p.instructions[k];
    rename(x.inputs, b);
    rename(x.outputs, b);
    rename(x.wait, ev.table);
    rename(x.record, ev.table);
  }
  return {
    buffers,
    instructions: p.instructions,
    params: p.params.map((q) => ({
      ...q,
      buffer: b[q.buffer],
      ...(q.grad !== undefined ? { grad: b[q.grad] } : {}),
      ...(q.expAvg !== undefined ? { expAvg: b[q.expAvg] } : {}),
      ...(q.expAvgSq !== undefined ? { expAvgSq: b[q.expAvgSq] } : {}),
      ...(q.master !== undefined ? { master: b[q.master] } : {}),
    })),
    inputs: p.inputs.map((i) => ({ ...i, buffer: b[i.buffer] })),
    scalars: Object.fromEntries(Object.entries(p.scalars).map(([k, id]) => [k, b[id]])),
    outputs: p.outputs.map((o) => ({ ...o, buffer: b[o.buffer] })),
    optimizerShards: p.optimizerShards.map((s) => ({
      ...s,
      expAvg: b[s.expAvg],
      expAvgSq: b[s.expAvgSq],
      ...(s.master !== undefined ? { master: b[s.master] } : {}),
    })),
    keepUntilWait: new Map(
      [...p.keepUntilWait].map(([e, ids]) => [ev.table[e], ids.map((id) => b[id])] as const),
    ),
    events: ev.count,
  };
}

/** [old id] the new id of each buffer, by first appearance (a view right after its base) */
function bufferOrder(p: NumberedParts): Int32Array {
  const n = p.buffers.length;
  const newId = new Int32Array(n).fill(-1);
  let next = 0;
  const visit = (id: number) => {
    if (newId[id] >= 0) return;
    const base = p.buffers[id].viewOf;
    if (base !== undefined) visit(base);
    newId[id] = next++;
  };
  for (const q of p.params)
    for (const id of [q.buffer, q.grad, q.expAvg, q.expAvgSq, q.master])
      if (id !== undefined) visit(id);
  for (const i of p.inputs) visit(i.buffer);
  for (const id of Object.values(p.scalars)) visit(id);
  for (let i = 0; i < p.instructions.length; i++) {
    const ins = p.instructions[i];
    for (let k = 0; k < ins.inputs.length; k++) visit(ins.inputs[k]);
    for (let k = 0; k < ins.outputs.length; k++) visit(ins.outputs[k]);
  }
  for (const o of p.outputs) visit(o.buffer);
  for (const s of p.optimizerShards) {
    visit(s.expAvg);
    visit(s.expAvgSq);
    if (s.master !== undefined) visit(s.master);
  }
  for (let id = 0; id < n; id++) visit(id);
  return newId;
}

/** [old event] the new number of each event, by the first instruction that names it */
function eventOrder(p: NumberedParts): { table: Int32Array; count: number } {
  const table = new Int32Array(p.events).fill(-1);
  let count = 0;
  const ev = (e: number) => {
    if (table[e] < 0) table[e] = count++;
  };
  for (let i = 0; i < p.instructions.length; i++) {
    const ins = p.instructions[i];
    for (let k = 0; k < ins.wait.length; k++) ev(ins.wait[k]);
    for (let k = 0; k < ins.record.length; k++) ev(ins.record[k]);
  }
  for (const e of p.keepUntilWait.keys()) ev(e);
  return { table, count };
}
