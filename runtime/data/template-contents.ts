// Whether a chat template writes each message's content as given: only ever into the output, as
// is or joined to other text with + or ~, or tested by `is string` / `is defined` (a constant for
// a string). Such a template's text for a conversation is the text for the same roles with
// stand-in contents, each stand-in replaced by its content; chat.ts then cuts each shape of
// conversation once and renders no sample. The check reads the parsed template (the AST of
// @huggingface/jinja) and is conservative: any other use of a content (`| trim`, `in`,
// `.startswith`, a `set`, a macro argument), a message used whole (`| tojson`, printed, passed
// on), or `messages` used other than indexed, iterated or counted, makes it false, and chat.ts
// renders every sample (once, checked against the stand-in's text).
//
// What a template may do with the rest is free: roles, the number of messages, loop.*, the
// special tokens and add_generation_prompt are the same for every conversation of one shape.

import type { Template } from '@huggingface/jinja';

type Node = { readonly type: string; readonly [field: string]: unknown };

/** where a node's value goes */
type Use =
  | 'out' // written to the output
  | 'test' // the operand of a constant test
  | 'object' // the object of a member access
  | 'iterated' // a for loop's iterable
  | 'counted' // the operand of | length
  | 'other';

const CONSTANT_TESTS = new Set(['string', 'defined', 'undefined', 'none']);
/** the fields of a message a template may read */
const MESSAGE_FIELDS = new Set(['role', 'content']);

const isNode = (x: unknown): x is Node =>
  typeof x === 'object' && x !== null && typeof (x as Node).type === 'string';

/** a member access's property name, when it is a plain one (`m.name`, `m['name']`) */
function propertyName(member: Node): string | undefined {
  const p = member.property as Node;
  if (!member.computed && p.type === 'Identifier') return p.value as string;
  if (member.computed && p.type === 'StringLiteral') return p.value as string;
  return undefined;
}

/** the identifier at the root of `a`, `a[1]`, `a[1:]` */
function rootName(n: Node): string | undefined {
  if (n.type === 'Identifier') return n.value as string;
  if (n.type === 'MemberExpression' && n.computed) return rootName(n.object as Node);
  return undefined;
}

/** The value of `m.content is string` (is defined, none, undefined) for a message's content. */
function knownTest(test: Node, isMessage: (n: Node) => boolean): boolean | undefined {
  if (test.type !== 'TestExpression') return undefined;
  const operand = test.operand as Node;
  const name = (test.test as Node).value;
  if (operand.type !== 'MemberExpression' || propertyName(operand) !== 'content') return undefined;
  if (!isMessage(operand.object as Node)) return undefined;
  const value =
    name === 'string' || name === 'defined'
      ? true
      : name === 'none' || name === 'undefined'
        ? false
        : undefined;
  return value === undefined ? undefined : value !== test.negate;
}

export function writesContentsAsGiven(template: Template): boolean {
  const messageVars = new Set<string>();
  let ok = true;

  /** a message (a loop variable over messages, or messages[i]) */
  const isMessage = (n: Node): boolean =>
    (n.type === 'Identifier' && messageVars.has(n.value as string)) ||
    (n.type === 'MemberExpression' &&
      n.computed === true &&
      (n.property as Node).type !== 'SliceExpression' &&
      rootName(n.object as Node) === 'messages' &&
      (n.object as Node).type === 'Identifier');

  const block = (list: unknown): void => {
    for (const s of (list as unknown[] | undefined) ?? []) visit(s as Node, 'out');
  };

  function visit(n: Node, use: Use, parent?: Node): void {
    if (!ok) return;
    switch (n.type) {
      case 'Program':
        return block(n.body);
      case 'If': {
        // `if m.content is string`: true for every content here, so its else is never run (a
        // Qwen-VL template's loop over content parts, for contents given as lists)
        const known = knownTest(n.test as Node, isMessage);
        visit(n.test as Node, 'other');
        if (known !== false) block(n.body);
        if (known !== true) block(n.alternate);
        return;
      }
      case 'For': {
        const iterable = n.iterable as Node;
        // a loop over messages (or a slice of them): its variable is a message
        const loopvar = n.loopvar as Node;
        if (rootName(iterable) === 'messages' && loopvar.type === 'Identifier')
          messageVars.add(loopvar.value as string);
        visit(iterable, 'iterated');
        visit(loopvar, 'other', n);
        block(n.body);
        return block(n.defaultBlock);
      }
      case 'Macro':
        return block(n.body);
      case 'BinaryExpression': {
        const op = (n.operator as { value: string }).value;
        const joins = use === 'out' && (op === '+' || op === '~');
        visit(n.left as Node, joins ? 'out' : 'other');
        return visit(n.right as Node, joins ? 'out' : 'other');
      }
      case 'Ternary':
        visit(n.condition as Node, 'other');
        visit(n.trueExpr as Node, use === 'out' ? 'out' : 'other');
        return visit(n.falseExpr as Node, use === 'out' ? 'out' : 'other');
      case 'TestExpression': {
        const test = n.test as Node;
        const constant = test.type === 'Identifier' && CONSTANT_TESTS.has(test.value as string);
        return visit(n.operand as Node, constant ? 'test' : 'other');
      }
      case 'FilterExpression': {
        const f = n.filter as Node;
        const counts = f.type === 'Identifier' && f.value === 'length';
        visit(n.operand as Node, counts ? 'counted' : 'other');
        return visit(f, 'other', n);
      }
      case 'MemberExpression': {
        const name = propertyName(n);
        const object = n.object as Node;
        if (name === 'previtem' || name === 'nextitem') {
          ok = false; // loop.previtem: a message reached another way
        } else if (name === 'content') {
          // a content read: into the output, or a constant test, only
          if (use !== 'out' && use !== 'test') ok = false;
        } else if (isMessage(object) && (name === undefined || !MESSAGE_FIELDS.has(name))) {
          ok = false; // another field of a message, or one by a computed key
        }
        if (isMessage(n) && use !== 'object') ok = false; // messages[i] used whole
        if (rootName(n) === 'messages' && !isMessage(n) && n.computed) {
          // a slice of messages: iterated or counted only
          if (
            (n.property as Node).type === 'SliceExpression' &&
            use !== 'iterated' &&
            use !== 'counted'
          )
            ok = false;
        }
        visit(object, 'object', n);
        if (n.computed) visit(n.property as Node, 'other', n);
        return;
      }
      case 'Identifier': {
        const name = n.value as string;
        if (name === 'content' && parent?.type !== 'MemberExpression') ok = false;
        if (name === 'messages' && use !== 'object' && use !== 'iterated' && use !== 'counted')
          ok = false;
        if (messageVars.has(name) && use !== 'object' && parent?.type !== 'For') ok = false;
        return;
      }
      case 'StringLiteral':
        // 'content' as a key anywhere but a member access: .get('content'), attribute='content'
        if (n.value === 'content' && parent?.type !== 'MemberExpression') ok = false;
        return;
      default:
        // anything else: its parts are used in ways not followed here
        for (const v of Object.values(n))
          if (Array.isArray(v)) v.forEach((x) => isNode(x) && visit(x, 'other', n));
          else if (isNode(v)) visit(v, 'other', n);
    }
  }

  visit(template.parsed as unknown as Node, 'out');
  return ok;
}
