// The verifier rejects hand-made broken graphs, one test per rule, and accepts the valid one.
import { describe, expect, it } from 'vitest';
import {
  GraphBuilder,
  parseGraph,
  verifyGraph,
  type Graph,
  type VerifyRule,
} from '../../ir/index.js';

/** A small valid graph: x → linear → gelu → add(x) , in text form so breaking it is one edit. */
const VALID = `graph "small" {
  sym T <= 16 "tokens"
  input %x: f32[T, 8] "activations"
  param @w: f32[8, 8] role=param trainable=true module=text_decoder init=normal(0.02)
  %0: f32[T, 8] = linear(%x, @w) scope=m.fc forward
  %1: f32[T, 8] = gelu(%0) scope=m forward
  %2: f32[T, 8] = add(%1, %x) scope=m forward
  output loss = %2
}
`;

function rules(text: string): VerifyRule[] {
  return verifyGraph(parseGraph(text)).map((p) => p.rule);
}

describe('verifier', () => {
  it('accepts the valid graph', () => {
    expect(rules(VALID)).toEqual([]);
  });
  it('symbols: an undeclared symbol', () => {
    expect(rules(VALID.replace('input %x: f32[T, 8]', 'input %x: f32[U, 8]'))).toContain('symbols');
  });
  it('symbols: a symbol declared twice', () => {
    expect(
      rules(VALID.replace('sym T <= 16 "tokens"', 'sym T <= 16 "tokens"\n  sym T <= 8 "again"')),
    ).toContain('symbols');
  });
  it('single-assignment: a value defined twice', () => {
    expect(
      rules(
        VALID.replace('%1: f32[T, 8] = gelu', '%0: f32[T, 8] = gelu').replace('add(%1', 'add(%0'),
      ),
    ).toContain('single-assignment');
  });
  it('topological-order: a value read before it is defined', () => {
    const swapped = VALID.replace(
      '  %1: f32[T, 8] = gelu(%0) scope=m forward\n  %2: f32[T, 8] = add(%1, %x) scope=m forward',
      '  %2: f32[T, 8] = add(%1, %x) scope=m forward\n  %1: f32[T, 8] = gelu(%0) scope=m forward',
    );
    expect(rules(swapped)).toEqual(['topological-order']);
  });
  it('known-op: an op outside the table (JSON or programmatic input)', () => {
    const g = parseGraph(VALID);
    const broken: Graph = {
      ...g,
      nodes: g.nodes.map((n, i) => (i === 1 ? { ...n, op: 'tanh' as never } : n)),
    };
    expect(verifyGraph(broken).map((p) => p.rule)).toContain('known-op');
  });
  it('attributes: a missing required attribute', () => {
    const text = VALID.replace('gelu(%0) scope=m', 'rmsnorm(%0, @w) scope=m');
    expect(rules(text)).toContain('attributes');
  });
  it('attributes: wrong arity', () => {
    expect(rules(VALID.replace('gelu(%0)', 'gelu(%0, %x)'))).toContain('attributes');
  });
  it('shapes: a declared shape that the op does not give', () => {
    expect(rules(VALID.replace('%1: f32[T, 8] = gelu', '%1: f32[T, 9] = gelu'))).toEqual([
      'shapes',
      'shapes',
    ]);
  });
  it('shapes: inputs that break the op rule', () => {
    const text = VALID.replace('param @w: f32[8, 8]', 'param @w: f32[8, 7]').replace(
      '%0: f32[T, 8] = linear',
      '%0: f32[T, 8] = linear',
    );
    expect(rules(text)).toContain('shapes');
  });
  it('dtypes: a declared dtype that the op does not give', () => {
    expect(rules(VALID.replace('%1: f32[T, 8] = gelu', '%1: f64[T, 8] = gelu'))).toContain(
      'dtypes',
    );
  });
  it('dtypes: operands of different dtypes', () => {
    expect(rules(VALID.replace('input %x: f32[T, 8]', 'input %x: f64[T, 8]'))).toContain('shapes');
  });
  it('outputs: an undefined graph output', () => {
    expect(rules(VALID.replace('output loss = %2', 'output loss = %7'))).toEqual(['outputs']);
  });
  it('names the node and its scope', () => {
    const [p] = verifyGraph(
      parseGraph(VALID.replace('%1: f32[T, 8] = gelu', '%1: f64[T, 8] = gelu')),
    );
    expect(p).toMatchObject({ rule: 'dtypes', node: 1, scope: 'm' });
  });
  it('the builder refuses a shape error at construction, naming op and scope', () => {
    const b = new GraphBuilder('g');
    const x = b.input('x', 'f32', [4, 8]);
    const w = b.param('w', [8, 3], { init: 'zeros' });
    expect(() => b.in('blk', () => b.op1('linear', [x, w]))).toThrow(
      /linear in blk: weight in-features vs last dim of x/,
    );
  });
});
