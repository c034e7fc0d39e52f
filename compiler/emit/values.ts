// Value numbers for lowering: each value name of a graph gets a small integer once, and a node's
// inputs and outputs are kept as arrays of those numbers. Lowering looks up every input of every
// node of every microbatch (the article's level-3 programs: 345k instructions over 8 programs), so
// a microbatch's buffers by value are an Int32Array indexed by number (Values), not a Map keyed by
// name: no string hashing and no table growth per microbatch.

import type { Graph, Node } from '../../ir/graph.js';
import { expAvgName, expAvgSqName, gradName, masterName } from '../../passes/autodiff.js';

/** A parameter's value and its state's, by name and number: [PARAM], [GRAD], … (ValueNumbering.stateOf) */
export interface ParamState {
  readonly names: readonly string[];
  readonly numbers: Int32Array;
}
/** where a ParamState lists the parameter, its gradient, AdamW's moments and its fp32 master copy */
export const PARAM = 0;
export const GRAD = 1;
export const EXP_AVG = 2;
export const EXP_AVG_SQ = 3;
export const MASTER = 4;
/** a parameter's state values' names, in ParamState order (the names autodiff gives them) */
const stateNames = (param: string) => [
  param,
  gradName(param),
  expAvgName(param),
  expAvgSqName(param),
  masterName(param),
];

/** A graph's value names by number; names it has not seen (a pass's own values) get one when asked. */
export class ValueNumbering {
  private readonly numbers = new Map<string, number>();
  private readonly nodes = new WeakMap<Node, { ins: Int32Array; outs: Int32Array }>();
  private readonly states = new Map<string, ParamState>();

  constructor(g: Pick<Graph, 'inputs' | 'params' | 'nodes'>) {
    for (const i of g.inputs) this.of(i.name);
    for (const p of g.params) this.of(p.name);
    for (const n of g.nodes) for (const o of n.outputs) this.of(o.name);
  }

  /** how many names have numbers */
  get size(): number {
    return this.numbers.size;
  }

  /** name's number, given one now if it has none */
  of(name: string): number {
    let k = this.numbers.get(name);
    if (k === undefined) this.numbers.set(name, (k = this.numbers.size));
    return k;
  }

  /**
   * A parameter's state values, named and numbered once per name: every program of a compile
   * looks up each parameter's gradient and optimizer state, and a name built anew each time is
   * hashed anew.
   */
  stateOf(param: string): ParamState {
    let x = this.states.get(param);
    if (!x) {
      const names = stateNames(param);
      x = { names, numbers: Int32Array.from(names, (n) => this.of(n)) };
      this.states.set(param, x);
    }
    return x;
  }

  /** node's input and output value numbers (once per node) */
  node(n: Node): { ins: Int32Array; outs: Int32Array } {
    let x = this.nodes.get(n);
    if (!x) {
      x = {
        ins: Int32Array.from(n.inputs, (v) => this.of(v)),
        outs: Int32Array.from(n.outputs, (o) => this.of(o.name)),
      };
      this.nodes.set(n, x);
    }
    return x;
  }
}

const numberings = new WeakMap<Graph, ValueNumbering>();

/** The numbering of graph g (one per graph object). */
export function valueNumbering(g: Graph): ValueNumbering {
  let v = numberings.get(g);
  if (!v) numberings.set(g, (v = new ValueNumbering(g)));
  return v;
}

/** Buffer ids by value: by number (`at`, `put`: the hot path) or by name (the Map-like rest). */
export class Values {
  private ids: Int32Array;

  constructor(
    readonly numbering: ValueNumbering,
    ids?: Int32Array,
  ) {
    this.ids = ids ?? new Int32Array(numbering.size).fill(-1);
  }

  /** the buffer of value number k, -1 if none */
  at(k: number): number {
    return k < this.ids.length ? this.ids[k] : -1;
  }

  put(k: number, id: number): void {
    if (k >= this.ids.length) {
      const grown = new Int32Array(Math.max(k + 1, this.numbering.size, 2 * this.ids.length)).fill(
        -1,
      );
      grown.set(this.ids);
      this.ids = grown;
    }
    this.ids[k] = id;
  }

  get(name: string): number | undefined {
    const id = this.at(this.numbering.of(name));
    return id < 0 ? undefined : id;
  }

  set(name: string, id: number): this {
    this.put(this.numbering.of(name), id);
    return this;
  }

  has(name: string): boolean {
    return this.at(this.numbering.of(name)) >= 0;
  }

  /** a copy that changes apart from this one */
  clone(): Values {
    return new Values(this.numbering, this.ids.slice());
  }
}
