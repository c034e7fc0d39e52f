// Parser of the text form written by printer.ts. Errors name the line.

import { isDType } from './dtype.js';
import {
  MODULES,
  PARAM_ROLES,
  PHASES,
  type Graph,
  type GraphOutput,
  type InputDecl,
  type Node,
  type ParamDecl,
  type ParamDist,
  type ValueDecl,
} from './graph.js';
import { isOpKind } from './ops.js';
import { parseDim, type SymbolDecl } from './shape.js';
import type { AttrValue, Attrs, TensorType } from './types.js';

export class ParseError extends Error {}

const NAME = String.raw`[A-Za-z0-9_.\-]+`;
const TYPE = String.raw`([a-z0-9]+)(@host)?\[([^\]]*)\]`;

export function parseType(text: string): TensorType {
  const m = new RegExp(`^${TYPE}$`).exec(text.trim());
  if (!m) throw new ParseError(`bad type '${text}'`);
  if (!isDType(m[1])) throw new ParseError(`unknown dtype '${m[1]}'`);
  const shape = m[3].trim() === '' ? [] : m[3].split(',').map(parseDim);
  return m[2] ? { dtype: m[1], shape, space: 'host' } : { dtype: m[1], shape };
}

/** Reads one JSON value starting at s[i]; returns it and the index after it. */
function readJSON(s: string, i: number): [unknown, number] {
  let depth = 0;
  let inStr = false;
  let j = i;
  for (; j < s.length; j++) {
    const c = s[j];
    if (inStr) {
      if (c === '\\') j++;
      else if (c === '"') inStr = false;
      if (depth === 0 && !inStr) {
        j++;
        break;
      }
      continue;
    }
    if (c === '"') inStr = true;
    else if (c === '[') depth++;
    else if (c === ']') {
      depth--;
      if (depth === 0) {
        j++;
        break;
      }
    } else if (depth === 0 && (c === ',' || c === '}')) break;
  }
  const text = s.slice(i, j).trim();
  try {
    return [JSON.parse(text), j];
  } catch {
    throw new ParseError(`bad attribute value '${text}'`);
  }
}

function parseAttrs(text: string): Attrs {
  const attrs: Record<string, AttrValue> = {};
  let i = 0;
  while (i < text.length) {
    while (text[i] === ' ' || text[i] === ',') i++;
    if (i >= text.length) break;
    const eq = text.indexOf('=', i);
    if (eq < 0) throw new ParseError(`bad attributes '${text}'`);
    const key = text.slice(i, eq).trim();
    const [v, j] = readJSON(text, eq + 1);
    attrs[key] = v as AttrValue;
    i = j;
  }
  return attrs;
}

function splitTop(s: string): string[] {
  const out: string[] = [];
  let depth = 0;
  let cur = '';
  for (const c of s) {
    if (c === '[') depth++;
    if (c === ']') depth--;
    if (c === ',' && depth === 0) {
      out.push(cur);
      cur = '';
    } else cur += c;
  }
  if (cur.trim()) out.push(cur);
  return out.map((x) => x.trim());
}

const SYM_RE = /^sym ([A-Za-z_][A-Za-z0-9_]*) <= (\d+)(?: ~ (\d+))? (".*")$/;
const TYPE_TEXT = String.raw`[a-z0-9]+(?:@host)?\[[^\]]*\]`;
const INPUT_RE = new RegExp(`^input %(${NAME}): (${TYPE_TEXT}) (".*")$`);
const PARAM_RE = new RegExp(
  `^param @(${NAME}): (${TYPE_TEXT}) role=(\\S+) trainable=(true|false) module=(\\S+) init=(\\S+)(?: dist=(\\{.*\\}))?$`,
);
const NODE_RE = new RegExp(
  `^(?:(.*?) = )?([a-z_0-9]+)\\(([^)]*)\\)(?: \\{(.*)\\})? scope=(\\S+) (\\S+)$`,
);
const OUTPUT_RE = new RegExp(`^output ([A-Za-z_][A-Za-z0-9_]*) = [%@](${NAME})$`);

export function parseGraph(text: string): Graph {
  const lines = text.split('\n');
  const symbols: SymbolDecl[] = [];
  const inputs: InputDecl[] = [];
  const params: ParamDecl[] = [];
  const nodes: Node[] = [];
  const outputs: GraphOutput[] = [];
  let name: string | undefined;
  let closed = false;
  lines.forEach((raw, idx) => {
    const line = raw.trim();
    const where = `line ${idx + 1}`;
    if (!line || line.startsWith('#')) return;
    try {
      if (name === undefined) {
        const m = /^graph (".*") \{$/.exec(line);
        if (!m) throw new ParseError(`expected 'graph "<name>" {'`);
        name = JSON.parse(m[1]) as string;
        return;
      }
      if (closed) throw new ParseError('text after the closing brace');
      if (line === '}') {
        closed = true;
        return;
      }
      let m: RegExpExecArray | null;
      if ((m = SYM_RE.exec(line))) {
        symbols.push({
          name: m[1],
          bound: Number(m[2]),
          ...(m[3] !== undefined ? { expected: Number(m[3]) } : {}),
          doc: JSON.parse(m[4]) as string,
        });
      } else if ((m = INPUT_RE.exec(line))) {
        inputs.push({ name: m[1], type: parseType(m[2]), doc: JSON.parse(m[3]) as string });
      } else if ((m = PARAM_RE.exec(line))) {
        const role = m[3];
        const module = m[5];
        if (!(PARAM_ROLES as readonly string[]).includes(role))
          throw new ParseError(`unknown role '${role}'`);
        if (!(MODULES as readonly string[]).includes(module))
          throw new ParseError(`unknown module '${module}'`);
        params.push({
          name: m[1],
          type: parseType(m[2]),
          role: role as ParamDecl['role'],
          trainable: m[4] === 'true',
          module: module as ParamDecl['module'],
          init: m[6],
          ...(m[7] ? { dist: JSON.parse(m[7]) as ParamDist } : {}),
        });
      } else if ((m = OUTPUT_RE.exec(line))) {
        outputs.push({ label: m[1], value: m[2] });
      } else if ((m = NODE_RE.exec(line))) {
        const [, lhs, op, args, attrText, scope, phase] = m;
        if (!isOpKind(op)) throw new ParseError(`unknown op '${op}'`);
        if (!(PHASES as readonly string[]).includes(phase))
          throw new ParseError(`unknown phase '${phase}'`);
        const outs: ValueDecl[] = lhs
          ? splitTop(lhs).map((o) => {
              const om = new RegExp(`^%(${NAME}): (${TYPE_TEXT})$`).exec(o);
              if (!om) throw new ParseError(`bad output '${o}'`);
              return { name: om[1], type: parseType(om[2]) };
            })
          : [];
        const ins = args.trim()
          ? args.split(',').map((a) => {
              const am = new RegExp(`^[%@](${NAME})$`).exec(a.trim());
              if (!am) throw new ParseError(`bad operand '${a.trim()}'`);
              return am[1];
            })
          : [];
        nodes.push({
          op,
          inputs: ins,
          outputs: outs,
          attrs: attrText ? parseAttrs(attrText) : {},
          scope: scope === '-' ? '' : scope,
          phase: phase as Node['phase'],
        });
      } else {
        throw new ParseError(`cannot read '${line}'`);
      }
    } catch (e) {
      throw new ParseError(`${where}: ${(e as Error).message}`);
    }
  });
  if (name === undefined) throw new ParseError('empty text: no graph');
  if (!closed) throw new ParseError('missing closing brace');
  return { name, symbols, inputs, params, nodes, outputs };
}
