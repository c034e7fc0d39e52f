// Shapes of numeric or symbolic dims.
//
// A dim is a number, or a rational multiple of one declared symbol (`Np`, `Np/4`, `2*S`).
// Symbols carry an upper bound: memory plans size buffers by bounds, the runtime resolves the
// symbol per microbatch from the data. The symbols of a graph are declared in its symbol table.

export interface SymDim {
  readonly sym: string;
  /** value = sym · num / den, num/den reduced, den ≥ 1 */
  readonly num: number;
  readonly den: number;
}
export type Dim = number | SymDim;
export type Shape = readonly Dim[];

export interface SymbolDecl {
  readonly name: string;
  /** the most it can be: buffers are planned at it, and the runtime refuses more */
  readonly bound: number;
  readonly doc: string;
  /** what a typical step sees (a data profile's mean, balanced routing); absent: the bound */
  readonly expected?: number;
}

export type SymbolTable = ReadonlyMap<string, SymbolDecl>;

export class ShapeError extends Error {}

function gcd(a: number, b: number): number {
  a = Math.abs(a);
  b = Math.abs(b);
  while (b) [a, b] = [b, a % b];
  return a;
}

export function sym(name: string, num = 1, den = 1): SymDim {
  if (!Number.isInteger(num) || !Number.isInteger(den) || num <= 0 || den <= 0) {
    throw new ShapeError(`symbolic dim ${name}: factor ${num}/${den} must be positive integers`);
  }
  const g = gcd(num, den);
  return { sym: name, num: num / g, den: den / g };
}

export function isSym(d: Dim): d is SymDim {
  return typeof d !== 'number';
}

export function dimEq(a: Dim, b: Dim): boolean {
  if (typeof a === 'number' || typeof b === 'number') return a === b;
  return a.sym === b.sym && a.num * b.den === b.num * a.den;
}

export function shapeEq(a: Shape, b: Shape): boolean {
  return a.length === b.length && a.every((d, i) => dimEq(d, b[i]));
}

/** d · k; exact for symbols, checked integer for numbers. */
export function dimMul(d: Dim, k: number): Dim {
  if (typeof d === 'number') return d * k;
  return sym(d.sym, d.num * k, d.den);
}

/** d / k; a numeric dim must divide exactly. */
export function dimDiv(d: Dim, k: number): Dim {
  if (typeof d === 'number') {
    if (d % k !== 0) throw new ShapeError(`dim ${d} is not divisible by ${k}`);
    return d / k;
  }
  return sym(d.sym, d.num, d.den * k);
}

export function formatDim(d: Dim): string {
  if (typeof d === 'number') return String(d);
  return `${d.num === 1 ? '' : `${d.num}*`}${d.sym}${d.den === 1 ? '' : `/${d.den}`}`;
}

export function formatShape(s: Shape): string {
  return `[${s.map(formatDim).join(', ')}]`;
}

const DIM_RE = /^(?:(\d+)\*)?([A-Za-z_][A-Za-z0-9_]*)(?:\/(\d+))?$/;

export function parseDim(text: string): Dim {
  const t = text.trim();
  if (/^\d+$/.test(t)) return Number(t);
  const m = DIM_RE.exec(t);
  if (!m) throw new ShapeError(`bad dim '${text}'`);
  return sym(m[2], m[1] ? Number(m[1]) : 1, m[3] ? Number(m[3]) : 1);
}

/** Value of a dim given a value per symbol (bounds, or the sizes of one microbatch). */
export function resolveDim(d: Dim, sizes: (sym: string) => number): number {
  if (typeof d === 'number') return d;
  return Math.floor((sizes(d.sym) * d.num) / d.den);
}

export function resolveShape(s: Shape, sizes: (sym: string) => number): number[] {
  return s.map((d) => resolveDim(d, sizes));
}

/**
 * Shapes written as text (a plan buffer's), resolved at `sizes`: each dim text parsed once, and
 * each shape array once (the buffers of one value share their shape's array, one per
 * microbatch). The result is shared: do not change it.
 */
export function shapeResolver(
  sizes: (sym: string) => number,
): (shape: readonly string[]) => readonly number[] {
  const dims = new Map<string, number>();
  const shapes = new Map<readonly string[], readonly number[]>();
  const dim = (t: string) => {
    let v = dims.get(t);
    if (v === undefined) dims.set(t, (v = resolveDim(parseDim(t), sizes)));
    return v;
  };
  return (shape) => {
    let r = shapes.get(shape);
    if (r === undefined) shapes.set(shape, (r = shape.map(dim)));
    return r;
  };
}

/**
 * Element count as a monomial: coefficient × product of symbols (with multiplicity, sorted).
 * Two shapes hold the same number of elements for every symbol value iff their monomials match.
 */
export function numelMonomial(s: Shape): { coef: number; syms: string[] } {
  let num = 1;
  let den = 1;
  const syms: string[] = [];
  for (const d of s) {
    if (typeof d === 'number') num *= d;
    else {
      num *= d.num;
      den *= d.den;
      syms.push(d.sym);
    }
  }
  return { coef: num / den, syms: syms.sort() };
}

export function sameNumel(a: Shape, b: Shape): boolean {
  const x = numelMonomial(a);
  const y = numelMonomial(b);
  return Math.abs(x.coef - y.coef) < 1e-9 * Math.max(1, x.coef) && x.syms.join() === y.syms.join();
}

export function numel(s: Shape, sizes: (sym: string) => number): number {
  return resolveShape(s, sizes).reduce((a, b) => a * b, 1);
}
