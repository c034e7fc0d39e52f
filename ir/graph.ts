// The graph: symbols, data inputs, parameters, nodes in topological order, outputs.
// Values are named once (single assignment); node outputs are numbered, inputs and parameters
// carry their checkpoint-style names. The printer marks parameters with `@`, other values `%`.

import type { DType } from './dtype.js';
import { inferTypes, type OpKind } from './ops.js';
import { sym, type Shape, type SymbolDecl, type SymDim } from './shape.js';
import type { Attrs, TensorType } from './types.js';

export type Phase = 'forward' | 'backward' | 'optimizer';
export const PHASES: readonly Phase[] = ['forward', 'backward', 'optimizer'];

/** The three modules of a vision-language model; parallel contexts attach to them. */
export type ModuleName = 'image_encoder' | 'image_projector' | 'text_decoder';
export const MODULES: readonly ModuleName[] = ['image_encoder', 'image_projector', 'text_decoder'];

export type ParamRole = 'param' | 'grad' | 'optimizer_state';
export const PARAM_ROLES: readonly ParamRole[] = ['param', 'grad', 'optimizer_state'];

export interface ValueDecl {
  readonly name: string;
  readonly type: TensorType;
}

export interface InputDecl extends ValueDecl {
  readonly doc: string;
}

export interface ParamDecl extends ValueDecl {
  readonly role: ParamRole;
  readonly trainable: boolean;
  readonly module: ModuleName;
  /** initializer, e.g. `normal(0.02)`, `ones` */
  readonly init: string;
  /** set by the parallel passes: this rank's piece of a global tensor (absent: the whole tensor) */
  readonly dist?: ParamDist;
}

/**
 * How a parameter of a rank's graph relates to the whole tensor of the checkpoint. Group kinds
 * are resolved per rank (its index in its group of that kind), so one graph serves every rank of
 * a group.
 *   global    the whole tensor's shape and checkpoint name; `{}` in the name stands for the expert
 *             index, `expert.perRank · (rank in group expert.group) + expert.local`
 *   split     per dim: null (whole), or `parts` equal pieces over a group (rank i keeps piece i);
 *             with blocks > 1 the dim is `blocks` equal blocks, each split so (a fused q/k/v)
 *   gradSum   group kinds the gradient is summed over besides data parallelism (a replicated
 *             parameter used on sequence-split activations sums over tp)
 *   replicas  group kind the parameter is replicated over for the gradient's data-parallel sum:
 *             'dp' (dense) or 'edp' (experts)
 */
export interface ParamDist {
  readonly name: string;
  readonly shape: readonly number[];
  readonly split: readonly (DimSplit | null)[];
  readonly expert?: { readonly group: string; readonly perRank: number; readonly local: number };
  readonly gradSum: readonly string[];
  readonly replicas: string;
}

export interface DimSplit {
  readonly group: string;
  readonly parts: number;
  readonly blocks: number;
}

export interface Node {
  readonly op: OpKind;
  readonly inputs: readonly string[];
  readonly outputs: readonly ValueDecl[];
  readonly attrs: Attrs;
  /** module path, e.g. `visual.blocks.3.attn` */
  readonly scope: string;
  readonly phase: Phase;
}

export interface Graph {
  readonly name: string;
  readonly symbols: readonly SymbolDecl[];
  readonly inputs: readonly InputDecl[];
  readonly params: readonly ParamDecl[];
  readonly nodes: readonly Node[];
  /** labelled results: `loss` first (what autodiff differentiates), then metrics */
  readonly outputs: readonly GraphOutput[];
}

export interface GraphOutput {
  readonly label: string;
  readonly value: string;
}

const typeIndex = new WeakMap<Graph, ReadonlyMap<string, TensorType>>();

/**
 * Map from value name to its type, over inputs, params and node outputs: made once per graph
 * (graphs never change; the passes and the pricing of one compile ask for it many times).
 */
export function valueTypes(g: Graph): ReadonlyMap<string, TensorType> {
  let m = typeIndex.get(g);
  if (m === undefined) {
    const made = new Map<string, TensorType>();
    for (const v of g.inputs) made.set(v.name, v.type);
    for (const p of g.params) made.set(p.name, p.type);
    for (const n of g.nodes) for (const o of n.outputs) made.set(o.name, o.type);
    typeIndex.set(g, (m = made));
  }
  return m;
}

const paramIndex = new WeakMap<readonly ParamDecl[], ReadonlyMap<string, ParamDecl>>();

/** The graph's parameter declarations by name, made once per params list (graphs never change). */
export function paramsByName(g: Pick<Graph, 'params'>): ReadonlyMap<string, ParamDecl> {
  let m = paramIndex.get(g.params);
  if (m === undefined) paramIndex.set(g.params, (m = new Map(g.params.map((p) => [p.name, p]))));
  return m;
}

export function symbolBounds(g: Graph): (s: string) => number {
  const m = new Map(g.symbols.map((s) => [s.name, s.bound]));
  return (s) => {
    const b = m.get(s);
    if (b === undefined) throw new Error(`undeclared symbol ${s}`);
    return b;
  };
}

export function paramModule(scope: string): ModuleName {
  if (scope.startsWith('visual.merger') || scope.startsWith('visual.deepstack_merger'))
    return 'image_projector';
  if (scope.startsWith('visual.')) return 'image_encoder';
  return 'text_decoder';
}

/** Builds a graph in topological order, deriving every output type from the op table. */
export class GraphBuilder {
  private readonly symbols: SymbolDecl[] = [];
  private readonly inputs: InputDecl[] = [];
  private readonly params: ParamDecl[] = [];
  private readonly nodes: Node[] = [];
  private readonly outputs: GraphOutput[] = [];
  private readonly types = new Map<string, TensorType>();
  private readonly scopes: string[] = [];
  private next = 0;
  private phase: Phase = 'forward';

  /** `paramDtype`: the element type of parameters declared without one (mixed precision) */
  constructor(
    private readonly name: string,
    private readonly paramDtype: DType = 'f32',
  ) {}

  /** A builder that continues an existing graph: same values, numbering after its last value. */
  static from(g: Graph): GraphBuilder {
    const b = new GraphBuilder(g.name);
    b.symbols.push(...g.symbols);
    for (const i of g.inputs) {
      b.define(i.name, i.type);
      b.inputs.push(i);
    }
    for (const p of g.params) {
      b.define(p.name, p.type);
      b.params.push(p);
    }
    for (const n of g.nodes) {
      for (const o of n.outputs) {
        b.define(o.name, o.type);
        if (/^\d+$/.test(o.name)) b.next = Math.max(b.next, Number(o.name) + 1);
      }
      b.nodes.push(n);
    }
    b.outputs.push(...g.outputs);
    return b;
  }

  /** Declares a parameter exactly as given (a pass that rewrites parameters keeps their fields). */
  declare(p: ParamDecl): string {
    this.define(p.name, p.type);
    this.params.push(p);
    return p.name;
  }

  /** Declares a symbol exactly as given (a pass that rebuilds a graph keeps its symbols). */
  declareSymbol(s: SymbolDecl): void {
    this.symbols.push(s);
  }

  /** Adds a parameter-like value (gradient buffer, optimizer state) with an explicit role. */
  state(name: string, type: TensorType, role: ParamRole, module: ModuleName, init: string): string {
    this.define(name, type);
    this.params.push({ name, type, role, trainable: false, module, init });
    return name;
  }

  /** Runs fn with nodes in the given phase and at the given absolute scope. */
  at<T>(scope: string, phase: Phase, fn: () => T): T {
    const saved = this.scopes.splice(0, this.scopes.length, ...(scope ? [scope] : []));
    const savedPhase = this.phase;
    this.phase = phase;
    try {
      return fn();
    } finally {
      this.scopes.splice(0, this.scopes.length, ...saved);
      this.phase = savedPhase;
    }
  }

  /** a symbolic size: at most `bound`, `expected` in a typical step (default: the bound) */
  symbol(name: string, bound: number, doc: string, expected?: number): SymDim {
    if (!Number.isInteger(bound) || bound < 1)
      throw new Error(`symbol ${name}: bound ${bound} must be a positive integer`);
    if (
      expected !== undefined &&
      !(Number.isInteger(expected) && expected >= 0 && expected <= bound)
    )
      throw new Error(`symbol ${name}: expected ${expected} must be an integer in 0 … ${bound}`);
    this.symbols.push({
      name,
      bound,
      doc,
      ...(expected !== undefined && expected !== bound ? { expected } : {}),
    });
    return sym(name);
  }

  input(name: string, dtype: DType, shape: Shape, doc = ''): string {
    this.define(name, { dtype, shape });
    this.inputs.push({ name, type: { dtype, shape }, doc });
    return name;
  }

  param(
    name: string,
    shape: Shape,
    opts: { init: string; trainable?: boolean; module?: ModuleName; dtype?: DType },
  ): string {
    const type: TensorType = { dtype: opts.dtype ?? this.paramDtype, shape };
    this.define(name, type);
    this.params.push({
      name,
      type,
      role: 'param',
      trainable: opts.trainable ?? true,
      module: opts.module ?? paramModule(name),
      init: opts.init,
    });
    return name;
  }

  /** Adds a node; returns the names of its outputs. */
  op(kind: OpKind, inputs: readonly string[], attrs: Attrs = {}): string[] {
    const phase = this.phase;
    const inTypes = inputs.map((n) => {
      const t = this.types.get(n);
      if (!t) throw new Error(`${kind} in ${this.scope()}: undefined value ${n}`);
      return t;
    });
    let outTypes: TensorType[];
    try {
      outTypes = inferTypes(kind, inTypes, attrs);
    } catch (e) {
      throw new Error(`${kind} in ${this.scope() || '<root>'}: ${(e as Error).message}`, {
        cause: e,
      });
    }
    const outputs = outTypes.map((type) => {
      const name = String(this.next++);
      this.define(name, type);
      return { name, type };
    });
    this.nodes.push({
      op: kind,
      inputs: [...inputs],
      outputs,
      attrs: sortedAttrs(attrs),
      scope: this.scope(),
      phase,
    });
    return outputs.map((o) => o.name);
  }

  /** Adds a single-output node and returns its output. */
  op1(kind: OpKind, inputs: readonly string[], attrs: Attrs = {}): string {
    const outs = this.op(kind, inputs, attrs);
    if (outs.length !== 1) throw new Error(`${kind} has ${outs.length} outputs, op1 wants one`);
    return outs[0];
  }

  /** Runs fn with `name` appended to the module scope. */
  in<T>(name: string, fn: () => T): T {
    this.scopes.push(name);
    try {
      return fn();
    } finally {
      this.scopes.pop();
    }
  }

  scope(): string {
    return this.scopes.join('.');
  }

  typeOf(name: string): TensorType {
    const t = this.types.get(name);
    if (!t) throw new Error(`undefined value ${name}`);
    return t;
  }

  output(label: string, value: string): void {
    this.typeOf(value);
    if (this.outputs.some((o) => o.label === label))
      throw new Error(`output ${label} declared twice`);
    this.outputs.push({ label, value });
  }

  build(): Graph {
    return {
      name: this.name,
      symbols: [...this.symbols],
      inputs: [...this.inputs],
      params: [...this.params],
      nodes: [...this.nodes],
      outputs: [...this.outputs],
    };
  }

  private define(name: string, t: TensorType): void {
    if (this.types.has(name)) throw new Error(`value ${name} defined twice`);
    this.types.set(name, t);
  }
}

/** Attributes with their keys in sorted order: the canonical form the printer and JSON share. */
export function sortedAttrs(attrs: Attrs): Attrs {
  // most come sorted already (a builder's node has a key or two): a copy, with no sort
  let previous = '';
  let sorted = true;
  for (const k in attrs) {
    if (k < previous) {
      sorted = false;
      break;
    }
    previous = k;
  }
  if (sorted) return { ...attrs };
  return Object.fromEntries(
    Object.keys(attrs)
      .sort()
      .map((k) => [k, attrs[k]]),
  );
}
