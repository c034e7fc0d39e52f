// The IR verifier. Rules, each with a name that errors carry:
//   symbols            every symbolic dim names a declared symbol; bounds are positive integers
//   single-assignment  every value is defined exactly once
//   topological-order  every operand is defined before the node that reads it
//   known-op           every node's op is in the op table
//   attributes         arity and attributes as the op table declares them
//   shapes             output types re-derived from the op table equal the declared ones
//   dtypes             declared output dtypes equal the derived ones
//   outputs            graph outputs are defined values

import { isDType } from './dtype.js';
import type { Graph, Node } from './graph.js';
import { checkAttrs, isOpKind, OP_TABLE } from './ops.js';
import { formatShape, isSym, shapeEq, type Shape } from './shape.js';
import { formatType } from './printer.js';
import type { TensorType } from './types.js';

export type VerifyRule =
  | 'symbols'
  | 'single-assignment'
  | 'topological-order'
  | 'known-op'
  | 'attributes'
  | 'shapes'
  | 'dtypes'
  | 'outputs';

export interface VerifyProblem {
  readonly rule: VerifyRule;
  readonly message: string;
  /** index of the node, when the problem is in one */
  readonly node?: number;
  readonly scope?: string;
}

export class VerifyError extends Error {
  constructor(readonly problems: readonly VerifyProblem[]) {
    super(problems.map(formatProblem).join('\n'));
  }
}

export function formatProblem(p: VerifyProblem): string {
  const at = p.node === undefined ? '' : ` at node ${p.node}${p.scope ? ` (${p.scope})` : ''}`;
  return `[${p.rule}]${at}: ${p.message}`;
}

export function verifyGraph(g: Graph): VerifyProblem[] {
  const problems: VerifyProblem[] = [];
  const symbols = new Set<string>();
  for (const s of g.symbols) {
    if (symbols.has(s.name))
      problems.push({ rule: 'symbols', message: `symbol ${s.name} declared twice` });
    if (!Number.isInteger(s.bound) || s.bound < 1) {
      problems.push({
        rule: 'symbols',
        message: `symbol ${s.name} has bound ${s.bound}; want a positive integer`,
      });
    }
    symbols.add(s.name);
  }
  const checkShape = (shape: Shape, what: string, node?: Node, idx?: number) => {
    for (const d of shape) {
      if (isSym(d) ? !symbols.has(d.sym) : !Number.isInteger(d) || d < 0) {
        problems.push({
          rule: 'symbols',
          message: `${what} has dim ${isSym(d) ? d.sym : String(d)} in ${formatShape(shape)}: ${isSym(d) ? 'undeclared symbol' : 'not a size'}`,
          node: idx,
          scope: node?.scope,
        });
      }
    }
  };

  const defined = new Map<string, TensorType>();
  const define = (name: string, t: TensorType, what: string, idx?: number, scope?: string) => {
    if (defined.has(name)) {
      problems.push({
        rule: 'single-assignment',
        message: `${what} ${name} is already defined`,
        node: idx,
        scope,
      });
    }
    if (!isDType(t.dtype))
      problems.push({
        rule: 'dtypes',
        message: `${what} ${name} has unknown dtype ${t.dtype}`,
        node: idx,
        scope,
      });
    checkShape(t.shape, `${what} ${name}`, undefined, idx);
    defined.set(name, t);
  };
  for (const i of g.inputs) define(i.name, i.type, 'input');
  for (const p of g.params) define(p.name, p.type, 'param');

  g.nodes.forEach((n, idx) => {
    const at = { node: idx, scope: n.scope };
    if (!isOpKind(n.op)) {
      problems.push({ rule: 'known-op', message: `unknown op '${String(n.op)}'`, ...at });
      for (const o of n.outputs) define(o.name, o.type, 'value', idx, n.scope);
      return;
    }
    const inTypes: TensorType[] = [];
    let operandsOk = true;
    for (const name of n.inputs) {
      const t = defined.get(name);
      if (!t) {
        operandsOk = false;
        problems.push({
          rule: 'topological-order',
          message: `${n.op} reads ${name} before it is defined`,
          ...at,
        });
      } else inTypes.push(t);
    }
    const [lo, hi] = OP_TABLE[n.op].inputs;
    const attrProblems = checkAttrs(n.op, n.attrs);
    if (n.inputs.length < lo || n.inputs.length > hi) {
      attrProblems.push(
        `${n.op} takes ${lo === hi ? lo : `${lo}–${hi}`} inputs, got ${n.inputs.length}`,
      );
    }
    for (const m of attrProblems) problems.push({ rule: 'attributes', message: m, ...at });
    if (operandsOk && attrProblems.length === 0) {
      let derived: TensorType[] | undefined;
      try {
        derived = OP_TABLE[n.op].shape(inTypes, n.attrs);
      } catch (e) {
        problems.push({ rule: 'shapes', message: `${n.op}: ${(e as Error).message}`, ...at });
      }
      if (derived) {
        if (derived.length !== n.outputs.length) {
          problems.push({
            rule: 'shapes',
            message: `${n.op} has ${derived.length} outputs, ${n.outputs.length} declared`,
            ...at,
          });
        } else {
          derived.forEach((d, i) => {
            const o = n.outputs[i].type;
            if (d.dtype !== o.dtype) {
              problems.push({
                rule: 'dtypes',
                message: `output ${n.outputs[i].name} declared ${o.dtype}, ${n.op} gives ${d.dtype}`,
                ...at,
              });
            }
            if (!shapeEq(d.shape, o.shape) || (d.space ?? 'device') !== (o.space ?? 'device')) {
              problems.push({
                rule: 'shapes',
                message: `output ${n.outputs[i].name} declared ${formatType(o)}, ${n.op} gives ${formatType(d)}`,
                ...at,
              });
            }
          });
        }
      }
    }
    for (const o of n.outputs) define(o.name, o.type, 'value', idx, n.scope);
  });

  const labels = new Set<string>();
  for (const o of g.outputs) {
    if (!defined.has(o.value)) {
      problems.push({
        rule: 'outputs',
        message: `graph output ${o.label} = ${o.value} is not defined`,
      });
    }
    if (labels.has(o.label))
      problems.push({ rule: 'outputs', message: `graph output ${o.label} declared twice` });
    labels.add(o.label);
  }
  return problems;
}

/** Throws a VerifyError listing every problem, prefixed with `context` (the pass that ran). */
export function assertValid(g: Graph, context = ''): void {
  const problems = verifyGraph(g);
  if (problems.length) {
    const e = new VerifyError(problems);
    if (context) e.message = `${context}: ${e.message}`;
    throw e;
  }
}
