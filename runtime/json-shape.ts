// The shape of a JSON file's fields, as a loader reads them: a small table per file (plan.json:
// runtime/plan-io.ts, a checkpoint's state.json: runtime/checkpoint.ts) checked before any field
// is used, so a damaged file is a one-line error naming the field, never a TypeError later.
import { oneLine } from '../compiler/errors.js';

export type Shape =
  | 'string'
  | 'number' // finite
  | 'count' // an integer ≥ 0
  | 'positive' // an integer ≥ 1
  | 'integer'
  | 'boolean'
  | 'object' // any JSON object
  | { readonly list: Shape }
  | { readonly record: Shape }
  | { readonly optional: Shape }
  | { readonly [field: string]: Shape };

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

const WANT: Record<string, string> = {
  string: 'a string',
  number: 'a finite number',
  count: 'an integer ≥ 0',
  positive: 'an integer ≥ 1',
  integer: 'an integer',
  boolean: 'true or false',
  object: 'an object',
};

/** The first field of `v` (depth first) that does not have the shape, as a message; undefined: none. */
export function shapeProblem(v: unknown, shape: Shape, at = ''): string | undefined {
  const bad = (want: string): string =>
    `${at || 'the file'} must be ${want}, got ${oneLine(JSON.stringify(v) ?? 'nothing').slice(0, 60)}`;
  if (typeof shape === 'string') {
    const ok = {
      string: typeof v === 'string',
      number: typeof v === 'number' && Number.isFinite(v),
      count: Number.isSafeInteger(v) && (v as number) >= 0,
      positive: Number.isSafeInteger(v) && (v as number) >= 1,
      integer: Number.isSafeInteger(v),
      boolean: typeof v === 'boolean',
      object: isObject(v),
    }[shape];
    return ok ? undefined : bad(WANT[shape]);
  }
  if ('optional' in shape)
    return v === undefined ? undefined : shapeProblem(v, shape.optional as Shape, at);
  if ('list' in shape) {
    if (!Array.isArray(v)) return bad('a list');
    for (let i = 0; i < v.length; i++) {
      const p = shapeProblem(v[i], shape.list as Shape, `${at}[${i}]`);
      if (p) return p;
    }
    return undefined;
  }
  if (!isObject(v)) return bad('an object');
  const fields = 'record' in shape ? Object.keys(v) : Object.keys(shape);
  for (const k of fields) {
    const s = 'record' in shape ? (shape.record as Shape) : (shape as Record<string, Shape>)[k];
    const p = shapeProblem(v[k], s, at ? `${at}.${k}` : k);
    if (p) return p;
  }
  return undefined;
}
