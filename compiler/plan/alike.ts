// Instructions alike: what follows from an instruction's op, attrs and operands' shapes and dtypes
// (its scratch, its work in the cost model) is the same for every instruction lowered from one
// graph node, in every microbatch and on every program of a compile. Those share their attrs
// object, and buffers of one value type share their shape text (compiler/emit/draft.ts,
// ProgramBuilder), so a result is kept by attrs object and found again by comparing the operands'
// shape texts by identity and their dtypes: no key is built, and an instruction made otherwise
// (a shape text of its own) is only a miss.

import type { PlanBuffer, PlanInstruction } from './format.js';

interface Known<T> {
  readonly op: string;
  readonly shapes: readonly (readonly string[])[];
  readonly dtypes: readonly string[];
  readonly value: T;
}

/** Results by alike instruction (see the header); the caller keeps one per set of sizes. */
export class AlikeMemo<T> {
  private readonly known = new Map<object, Known<T>[]>();

  /** the result kept for an instruction alike x (its operands in `buffers`), if any */
  get(x: PlanInstruction, buffers: readonly PlanBuffer[]): T | undefined {
    const seen = this.known.get(x.attrs);
    if (seen === undefined) return undefined;
    const n = x.inputs.length;
    const m = n + x.outputs.length;
    for (let i = 0; i < seen.length; i++) {
      const k = seen[i];
      if (k.op !== x.op || k.shapes.length !== m) continue;
      let j = 0;
      for (; j < m; j++) {
        const b = buffers[j < n ? x.inputs[j] : x.outputs[j - n]];
        if (b.shape !== k.shapes[j] || b.dtype !== k.dtypes[j]) break;
      }
      if (j === m) return k.value;
    }
    return undefined;
  }

  /** keeps x's result (after a get that found none) */
  put(x: PlanInstruction, buffers: readonly PlanBuffer[], value: T): void {
    let seen = this.known.get(x.attrs);
    if (seen === undefined) this.known.set(x.attrs, (seen = []));
    const ids = [...x.inputs, ...x.outputs];
    seen.push({
      op: x.op,
      shapes: ids.map((id) => buffers[id].shape),
      dtypes: ids.map((id) => buffers[id].dtype),
      value,
    });
  }
}
