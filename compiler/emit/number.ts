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
// Holds before: ids are dense (buffer i has id i), every reference names an existing buffer.
// Holds after: the same, with ids renumbered; nothing else changes (offsets, names, order).

import type {
  OptimizerShard,
  PlanBuffer,
  PlanInstruction,
  ProgramInput,
  ProgramParam,
} from '../plan/format.js';

export interface NumberedParts {
  readonly buffers: readonly PlanBuffer[];
  readonly instructions: readonly PlanInstruction[];
  readonly params: readonly ProgramParam[];
  readonly inputs: readonly ProgramInput[];
  readonly scalars: Readonly<Record<string, number>>;
  readonly outputs: readonly {
    readonly name: string;
    readonly buffer: number;
    readonly microbatch: number;
  }[];
  readonly optimizerShards: readonly OptimizerShard[];
  /** buffers kept allocated until an event is waited for (emit's comm units), by event */
  readonly keepUntilWait: ReadonlyMap<number, readonly number[]>;
  readonly events: number;
}

/** The parts renumbered canonically (see the header). */
export function numberProgram(p: NumberedParts): NumberedParts {
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
    for (const id of [q.buffer, q.grad, q.expAvg, q.expAvgSq]) if (id !== undefined) visit(id);
  for (const i of p.inputs) visit(i.buffer);
  for (const id of Object.values(p.scalars)) visit(id);
  for (const ins of p.instructions) {
    for (const id of ins.inputs) visit(id);
    for (const id of ins.outputs) visit(id);
  }
  for (const o of p.outputs) visit(o.buffer);
  for (const s of p.optimizerShards) {
    visit(s.expAvg);
    visit(s.expAvgSq);
  }
  for (let id = 0; id < n; id++) visit(id);

  const newEvent = new Map<number, number>();
  const ev = (e: number) => {
    let k = newEvent.get(e);
    if (k === undefined) newEvent.set(e, (k = newEvent.size));
    return k;
  };
  for (const ins of p.instructions) {
    for (const e of ins.wait) ev(e);
    for (const e of ins.record) ev(e);
  }
  for (const e of p.keepUntilWait.keys()) ev(e);

  const b = (id: number) => newId[id];
  const buffers: PlanBuffer[] = new Array<PlanBuffer>(n);
  for (const old of p.buffers) {
    const id = b(old.id);
    buffers[id] = {
      ...old,
      id,
      ...(old.viewOf !== undefined ? { viewOf: b(old.viewOf) } : {}),
    };
  }
  return {
    buffers,
    instructions: p.instructions.map((ins) => ({
      ...ins,
      inputs: ins.inputs.map(b),
      outputs: ins.outputs.map(b),
      wait: ins.wait.map(ev),
      record: ins.record.map(ev),
    })),
    params: p.params.map((q) => ({
      ...q,
      buffer: b(q.buffer),
      ...(q.grad !== undefined ? { grad: b(q.grad) } : {}),
      ...(q.expAvg !== undefined ? { expAvg: b(q.expAvg) } : {}),
      ...(q.expAvgSq !== undefined ? { expAvgSq: b(q.expAvgSq) } : {}),
    })),
    inputs: p.inputs.map((i) => ({ ...i, buffer: b(i.buffer) })),
    scalars: Object.fromEntries(Object.entries(p.scalars).map(([k, id]) => [k, b(id)])),
    outputs: p.outputs.map((o) => ({ ...o, buffer: b(o.buffer) })),
    optimizerShards: p.optimizerShards.map((s) => ({
      ...s,
      expAvg: b(s.expAvg),
      expAvgSq: b(s.expAvgSq),
    })),
    keepUntilWait: new Map([...p.keepUntilWait].map(([e, ids]) => [ev(e), ids.map(b)])),
    events: newEvent.size,
  };
}
