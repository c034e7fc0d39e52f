// The stable text form of a program (ProgramFile, compiler/plan/format.ts): what one rank runs, one
// line per buffer and per instruction, for golden tests and for reading a schedule. The inverse of
// an unfiltered print: JSON.stringify(parseProgram(printProgram(p))) === JSON.stringify(p), key
// order included: every object is rebuilt in the key order compiler/emit/draft.ts gives it (an
// instruction in that of its `push`), attrs and dist are JSON, which keeps theirs, and every number
// round-trips exactly. (emit.ts's gradient sums are built by a spread that puts stream, microbatch,
// phase and scope first; they come back in push's order.)
//
//   program p0 format lfc-program version 3
//   regions arena 1048576 param 65536 grad 65536 optim 131072 data 4096 scalar 512 host 0 scratch 8192
//   scratch compute 8192 comm 0 copy 0                                  (per stream: scratchBytes)
//   arena-lower-bound 917504
//   events 42
//   buffers 120
//     %0 param f32[512,128] @0 +262144 mb -1 "model.embed_tokens.weight"
//     %31 arena f32[S,4,32] @4096 +65536 mb 0 "45" view %30
//     %97 host f32[S,128] @0 +65536 mb 0 "45.host" space host
//   params 10
//     model.embed_tokens.weight %0 grad %10 exp_avg %20 exp_avg_sq %21 shard [[0,512],[0,128]]
//   inputs 8
//     tokens %40 mb 0
//   scalars 2
//     loss_tokens %50
//   outputs 4
//     loss %60 mb 0
//   optimizer-shards 1                                                    (only when present)
//     dp parts 2 elements 1024 exp_avg %70 exp_avg_sq %71 params 2
//       model.norm.weight offset 0 elements 128
//   instructions 500
//     #57 compute backward mb 2 linear_dgrad %3 %9 -> %12 {"transpose":true} wait e4 record e7 @ model.layers.0.mlp
//
// Lines: a header or section line at the left margin, the entries of a section indented by two
// spaces (an optimizer shard's parameters by four). A buffer's name is a JSON string; other names
// and scopes are bare when they are plain words (letters, digits, `_ . -`), else JSON strings;
// `%N` names buffer N, `eN` event N, `@` a byte offset, `+` a size in bytes; a section's count is
// checked against its entries. An instruction's fields: index, stream, phase, microbatch, op,
// inputs -> outputs, attrs (JSON, left out when empty), the events it waits for and records, and
// its scope after `@`. A filtered print (options.instructions) says so on its first line, lists
// only the chosen instructions (under their indices) and the buffers they name, and cannot be
// parsed.
//
// The article's 30B line (examples/article-launch-lines.ts), its largest program (32k instructions,
// 44k buffers): 8.1 MB of text (its JSON is 14.9 MB), printed in about 0.2 s, parsed in 0.35-0.5 s.

import { isDType } from '../../ir/dtype.js';
import { isOpKind, OP_KINDS } from '../../ir/ops.js';
import { didYouMean, UserError } from '../errors.js';
import {
  BUFFER_REGIONS,
  PROGRAM_FORMAT,
  PROGRAM_REGIONS,
  STREAMS,
  type ProgramRegion,
  type OptimizerShard,
  type PlanBuffer,
  type PlanInstruction,
  type ProgramFile,
  type ProgramInput,
  type ProgramParam,
  type StreamName,
} from './format.js';

export interface PrintProgramOptions {
  /** print only the instructions this accepts (a golden of some ops); the text is not parseable */
  readonly instructions?: (ins: PlanInstruction, index: number) => boolean;
}

const PHASES = ['forward', 'backward', 'optimizer'] as const;
/** a name or scope printed without quotes */
const BARE = /^[A-Za-z0-9_][A-Za-z0-9_.-]*$/;
/** a dim printed as is inside `dtype[...]` (formatDim's `4*Nv`, `S/2`, `64`) */
const DIM = /^[A-Za-z0-9_*/]+$/;
/** a JSON number, nothing else (no `0x10`, ` 1`, `Infinity`) */
const NUMBER = /^-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?$/;

// ---- printing ---------------------------------------------------------------------------------

const word = (s: string): string => (BARE.test(s) ? s : JSON.stringify(s));
const ref = (id: number): string => `%${id}`;

function typeText(b: PlanBuffer): string {
  return b.shape.every((d) => DIM.test(d))
    ? `${b.dtype}[${b.shape.join(',')}]`
    : `${b.dtype}${JSON.stringify(b.shape)}`;
}

function bufferLine(b: PlanBuffer): string {
  // the name quoted always: IR value names are often numbers (`"45"`)
  let s = `${ref(b.id)} ${b.region} ${typeText(b)} @${b.offset} +${b.bytes} mb ${b.microbatch} ${JSON.stringify(b.name)}`;
  if (b.viewOf !== undefined) s += ` view ${ref(b.viewOf)}`;
  if (b.space !== 'device') s += ` space ${word(b.space)}`;
  return s;
}

function paramLine(p: ProgramParam): string {
  let s = `${word(p.name)} ${ref(p.buffer)}`;
  if (p.grad !== undefined) s += ` grad ${ref(p.grad)}`;
  if (p.expAvg !== undefined) s += ` exp_avg ${ref(p.expAvg)}`;
  if (p.expAvgSq !== undefined) s += ` exp_avg_sq ${ref(p.expAvgSq)}`;
  if (p.master !== undefined) s += ` master ${ref(p.master)}`;
  s += ` shard ${JSON.stringify(p.shard)}`;
  if (p.dist !== undefined) s += ` dist ${JSON.stringify(p.dist)}`;
  return s;
}

export function formatInstruction(x: PlanInstruction, index: number): string {
  const parts = [`#${index}`, x.stream, x.phase, 'mb', String(x.microbatch), x.op];
  for (const id of x.inputs) parts.push(ref(id));
  parts.push('->');
  for (const id of x.outputs) parts.push(ref(id));
  const attrs = JSON.stringify(x.attrs);
  if (attrs !== '{}') parts.push(attrs);
  if (x.wait.length) parts.push('wait', ...x.wait.map((e) => `e${e}`));
  if (x.record.length) parts.push('record', ...x.record.map((e) => `e${e}`));
  parts.push('@', word(x.scope));
  return parts.join(' ');
}

/** the buffers some instructions name, and those they are views of, by id */
function namedBuffers(p: ProgramFile, chosen: readonly number[]): number[] {
  const named = new Set<number>();
  for (const i of chosen)
    for (const id of [...p.instructions[i].inputs, ...p.instructions[i].outputs]) {
      let b: number | undefined = id;
      while (b !== undefined && !named.has(b)) {
        named.add(b);
        b = p.buffers[b]?.viewOf;
      }
    }
  return [...named].filter((id) => p.buffers[id] !== undefined).sort((a, b) => a - b);
}

export function printProgram(p: ProgramFile, options: PrintProgramOptions = {}): string {
  const keep = options.instructions;
  const chosen = keep ? p.instructions.flatMap((x, i) => (keep(x, i) ? [i] : [])) : undefined;
  const head = `program ${word(p.id)} format ${word(p.format)} version ${p.version}`;
  const lines = [
    chosen
      ? `${head} filtered (${chosen.length} of ${p.instructions.length} instructions and the ` +
        'buffers they name; not parseable)'
      : head,
    `regions ${Object.entries(p.regions)
      .map(([r, bytes]) => `${word(r)} ${bytes}`)
      .join(' ')}`,
    `scratch ${Object.entries(p.scratchBytes)
      .map(([stream, bytes]) => `${word(stream)} ${bytes}`)
      .join(' ')}`,
    `arena-lower-bound ${p.arenaLowerBoundBytes}`,
    ...(p.expectedBytes
      ? [`expected-bytes arena ${p.expectedBytes.arena} data ${p.expectedBytes.data}`]
      : []),
    `events ${p.events}`,
  ];
  /** a section line and its entries; `of`: the whole count, in a filtered print */
  const section = (name: string, entries: string[], of?: number) => {
    lines.push(`${name} ${entries.length}${of === undefined ? '' : ` of ${of}`}`);
    for (const e of entries) lines.push(`  ${e}`);
  };
  if (chosen) {
    const named = namedBuffers(p, chosen);
    section(
      'buffers',
      named.map((id) => bufferLine(p.buffers[id])),
      p.buffers.length,
    );
    section(
      'instructions',
      chosen.map((i) => formatInstruction(p.instructions[i], i)),
      p.instructions.length,
    );
    return lines.join('\n') + '\n';
  }
  section('buffers', p.buffers.map(bufferLine));
  section('params', p.params.map(paramLine));
  section(
    'inputs',
    p.inputs.map((i) => `${word(i.name)} ${ref(i.buffer)} mb ${i.microbatch}`),
  );
  section(
    'scalars',
    Object.entries(p.scalars).map(([name, id]) => `${word(name)} ${ref(id)}`),
  );
  section(
    'outputs',
    p.outputs.map((o) => `${word(o.name)} ${ref(o.buffer)} mb ${o.microbatch}`),
  );
  if (p.optimizerShards) {
    lines.push(`optimizer-shards ${p.optimizerShards.length}`);
    for (const s of p.optimizerShards) {
      lines.push(
        `  ${word(s.group)} parts ${s.parts} elements ${s.elements} exp_avg ${ref(s.expAvg)} ` +
          `exp_avg_sq ${ref(s.expAvgSq)}` +
          (s.master !== undefined ? ` master ${ref(s.master)}` : '') +
          ` params ${s.params.length}`,
      );
      for (const q of s.params)
        lines.push(`    ${word(q.name)} offset ${q.offset} elements ${q.elements}`);
    }
  }
  section('instructions', p.instructions.map(formatInstruction));
  return lines.join('\n') + '\n';
}

// ---- parsing ----------------------------------------------------------------------------------

/** One non-blank line: its number (1-based), indentation and the text after it. */
interface Line {
  readonly n: number;
  readonly indent: number;
  readonly body: string;
}

/** The tokens of one line, read left to right; every error names the line. */
class Tokens {
  private readonly toks: string[];
  private i = 0;

  constructor(
    private readonly line: Line,
    private readonly where: string,
    /** what this line is, for messages: `buffer %3`, `instruction #57` */
    public what: string,
  ) {
    this.toks = tokenize(line.body, (msg) => this.fail(msg));
  }

  fail(msg: string): never {
    throw new UserError(`${this.where}line ${this.line.n}: ${this.what}: ${msg}`);
  }

  peek(): string | undefined {
    return this.toks[this.i];
  }

  /** the next token; `expected` says what it should have been when the line ends */
  next(expected: string): string {
    const t = this.toks[this.i];
    if (t === undefined) this.fail(`expected ${expected}, the line ends`);
    this.i++;
    return t;
  }

  /** consumes `k` when it is next */
  accept(k: string): boolean {
    if (this.toks[this.i] !== k) return false;
    this.i++;
    return true;
  }

  keyword(k: string): void {
    const t = this.next(`'${k}'`);
    if (t !== k) this.fail(`expected '${k}', found '${t}'`);
  }

  oneOf<T extends string>(what: string, options: readonly T[]): T {
    const t = this.next(what);
    if (!(options as readonly string[]).includes(t))
      this.fail(`unknown ${what} '${t}'${didYouMean(t, options)}; one of ${options.join(', ')}`);
    return t as T;
  }

  name(what: string): string {
    const t = this.next(what);
    if (t.startsWith('"')) {
      const v = parseJSON(t, () => this.fail(`bad ${what} ${t}`));
      if (typeof v !== 'string') this.fail(`bad ${what} ${t}: not a string`);
      return v;
    }
    if (!BARE.test(t)) this.fail(`bad ${what} '${t}' (quote it as a JSON string)`);
    return t;
  }

  /** a number, after a prefix (`@` offset, `+` bytes) when given */
  number(what: string, prefix = ''): number {
    const t = this.next(`${prefix ? `'${prefix}'` : ''}<${what}>`);
    if (!t.startsWith(prefix)) this.fail(`expected '${prefix}<${what}>', found '${t}'`);
    const text = t.slice(prefix.length);
    if (!NUMBER.test(text)) this.fail(`bad number '${text}' for ${what}`);
    return Number(text);
  }

  int(what: string, min = -Infinity): number {
    const v = this.number(what);
    if (!Number.isSafeInteger(v) || v < min)
      this.fail(`bad ${what} ${v}: ${min === 0 ? 'a non-negative' : 'an'} integer`);
    return v;
  }

  /** `%N`, a buffer of the program (`count` buffers) */
  buffer(what: string, count: number): number {
    const t = this.next(`%<buffer> (${what})`);
    return this.refTo(t, '%', 'buffer', what, count);
  }

  /** `eN`, an event of the program (`count` events) */
  event(count: number): number {
    return this.refTo(this.next('e<event>'), 'e', 'event', 'event', count);
  }

  refTo(t: string, sigil: string, kind: string, what: string, count: number): number {
    if (!t.startsWith(sigil) || !/^\d+$/.test(t.slice(1)))
      this.fail(`bad ${kind} reference '${t}' for ${what} (expected ${sigil}<number>)`);
    const id = Number(t.slice(1));
    if (id >= count)
      this.fail(`bad ${kind} reference ${t} for ${what}: the program has ${count} ${kind}s`);
    return id;
  }

  /** a JSON value; `check` says whether it has the expected form */
  json(what: string, check: (v: unknown) => boolean): unknown {
    const t = this.next(what);
    const v = parseJSON(t, () => this.fail(`bad ${what} '${t}' (not JSON)`));
    if (!check(v)) this.fail(`bad ${what} '${t}'`);
    return v;
  }

  end(): void {
    const t = this.peek();
    if (t !== undefined) this.fail(`unexpected '${t}'`);
  }
}

function parseJSON(text: string, onError: () => never): unknown {
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return onError();
  }
}

/**
 * Splits a line at spaces outside JSON strings and brackets: `f32[S,64]`, `{"a": [1, 2]}` and
 * `"a name"` are one token each.
 */
function tokenize(s: string, fail: (msg: string) => never): string[] {
  const out: string[] = [];
  let i = 0;
  while (i < s.length) {
    if (s[i] === ' ') {
      i++;
      continue;
    }
    const start = i;
    let depth = 0;
    for (; i < s.length; i++) {
      const c = s[i];
      if (c === '"') {
        for (i++; i < s.length && s[i] !== '"'; i++) if (s[i] === '\\') i++;
        if (i >= s.length) fail(`unterminated string ${s.slice(start)}`);
      } else if (c === '[' || c === '{') depth++;
      else if (c === ']' || c === '}') {
        if (--depth < 0) fail(`unbalanced '${c}' in '${s.slice(start, i + 1)}'`);
      } else if (c === ' ' && depth === 0) break;
    }
    if (depth > 0) fail(`unclosed bracket in '${s.slice(start)}'`);
    out.push(s.slice(start, i));
  }
  return out;
}

/** the top-level lines in the order a print writes them; optimizer-shards only when present */
const TOP = [
  'program',
  'regions',
  'scratch',
  'arena-lower-bound',
  'expected-bytes',
  'events',
  'buffers',
  'params',
  'inputs',
  'scalars',
  'outputs',
  'optimizer-shards',
  'instructions',
] as const;
type Top = (typeof TOP)[number];
const OPTIONAL: ReadonlySet<Top> = new Set(['expected-bytes', 'optimizer-shards']);
/** the lines from buffers on head sections of entries */
const SECTIONS: ReadonlySet<Top> = new Set(TOP.slice(TOP.indexOf('buffers')));

const isShard = (v: unknown): boolean =>
  Array.isArray(v) &&
  v.every((d) => Array.isArray(d) && d.length === 2 && d.every((x) => typeof x === 'number'));
const isObject = (v: unknown): boolean => typeof v === 'object' && v !== null && !Array.isArray(v);

/** The state of one parse: the program's parts as the sections give them. */
class ProgramParser {
  id = '';
  format = '';
  version = 0;
  readonly regions: Record<string, number> = {};
  readonly scratchBytes: Record<string, number> = {};
  arenaLowerBoundBytes = 0;
  expectedBytes: ProgramFile['expectedBytes'];
  events = 0;
  nBuffers = 0;
  readonly buffers: PlanBuffer[] = [];
  readonly params: ProgramParam[] = [];
  readonly inputs: ProgramInput[] = [];
  readonly scalars: Record<string, number> = {};
  readonly outputs: { name: string; buffer: number; microbatch: number }[] = [];
  readonly instructions: PlanInstruction[] = [];
  shards: OptimizerShard[] | undefined;

  constructor(readonly where: string) {}

  /** one indented line of a section (index: its place in the section) */
  entry(top: string, t: Tokens, index: number, sub: Line[]): void {
    if (top === 'buffers') this.buffer(t, index);
    else if (top === 'params') this.param(t);
    else if (top === 'inputs') this.input(t);
    else if (top === 'scalars') this.scalar(t);
    else if (top === 'outputs') this.output(t);
    else if (top === 'optimizer-shards') this.shard(t, index, sub);
    else this.instruction(t, index);
  }

  buffer(t: Tokens, index: number): void {
    const bid = t.buffer('buffer', this.nBuffers);
    if (bid !== index) t.fail(`buffer %${bid} out of order: expected %${index}`);
    t.what = `buffer %${bid}`;
    const region = t.oneOf('region', BUFFER_REGIONS);
    const type = t.next('dtype[shape]');
    const m = /^([a-z0-9]+)\[(.*)\]$/.exec(type);
    if (!m) t.fail(`bad type '${type}' (expected dtype[dims])`);
    if (!isDType(m[1])) t.fail(`unknown dtype '${m[1]}'`);
    let shape: string[];
    if (m[2].startsWith('"')) {
      const v = parseJSON(`[${m[2]}]`, () => t.fail(`bad shape in '${type}'`));
      if (!Array.isArray(v) || !v.every((d) => typeof d === 'string'))
        t.fail(`bad shape in '${type}'`);
      shape = v as string[];
    } else {
      shape = m[2] === '' ? [] : m[2].split(',');
      for (const d of shape) if (!DIM.test(d)) t.fail(`bad dim '${d}' in '${type}'`);
    }
    const offset = t.number('offset', '@');
    const bytes = t.number('bytes', '+');
    t.keyword('mb');
    const microbatch = t.int('microbatch');
    const name = t.name('name');
    const viewOf = t.accept('view') ? t.buffer('view', this.nBuffers) : undefined;
    const space = t.accept('space') ? t.oneOf('space', ['device', 'host'] as const) : 'device';
    t.end();
    this.buffers.push({
      id: bid,
      name,
      region,
      space,
      dtype: m[1],
      shape,
      offset,
      bytes,
      ...(viewOf !== undefined ? { viewOf } : {}),
      microbatch,
    });
  }

  param(t: Tokens): void {
    const name = t.name('parameter name');
    t.what = `parameter ${name}`;
    const buffer = t.buffer('buffer', this.nBuffers);
    const grad = t.accept('grad') ? t.buffer('grad', this.nBuffers) : undefined;
    const expAvg = t.accept('exp_avg') ? t.buffer('exp_avg', this.nBuffers) : undefined;
    const expAvgSq = t.accept('exp_avg_sq') ? t.buffer('exp_avg_sq', this.nBuffers) : undefined;
    const master = t.accept('master') ? t.buffer('master', this.nBuffers) : undefined;
    t.keyword('shard');
    const shard = t.json('shard', isShard) as ProgramParam['shard'];
    const dist = t.accept('dist')
      ? (t.json('dist', isObject) as NonNullable<ProgramParam['dist']>)
      : undefined;
    t.end();
    this.params.push({
      name,
      buffer,
      ...(grad !== undefined ? { grad } : {}),
      ...(expAvg !== undefined ? { expAvg } : {}),
      ...(expAvgSq !== undefined ? { expAvgSq } : {}),
      ...(master !== undefined ? { master } : {}),
      shard,
      ...(dist !== undefined ? { dist } : {}),
    });
  }

  /** an input or output entry: name, buffer, microbatch */
  private slotted(t: Tokens, what: 'input' | 'output'): ProgramInput {
    const name = t.name(`${what} name`);
    t.what = `${what} ${name}`;
    const buffer = t.buffer('buffer', this.nBuffers);
    t.keyword('mb');
    const microbatch = t.int('microbatch');
    t.end();
    return { name, buffer, microbatch };
  }

  input(t: Tokens): void {
    this.inputs.push(this.slotted(t, 'input'));
  }

  scalar(t: Tokens): void {
    const name = t.name('scalar name');
    t.what = `scalar ${name}`;
    if (Object.hasOwn(this.scalars, name)) t.fail('named twice');
    this.scalars[name] = t.buffer('buffer', this.nBuffers);
    t.end();
  }

  output(t: Tokens): void {
    this.outputs.push(this.slotted(t, 'output'));
  }

  shard(t: Tokens, index: number, sub: Line[]): void {
    t.what = `optimizer shard ${index}`;
    const group = t.name('group');
    t.keyword('parts');
    const parts = t.int('parts', 0);
    t.keyword('elements');
    const elements = t.int('elements', 0);
    t.keyword('exp_avg');
    const expAvg = t.buffer('exp_avg', this.nBuffers);
    t.keyword('exp_avg_sq');
    const expAvgSq = t.buffer('exp_avg_sq', this.nBuffers);
    const master = t.accept('master') ? t.buffer('master', this.nBuffers) : undefined;
    t.keyword('params');
    const count = t.int('params', 0);
    t.end();
    if (sub.length !== count) t.fail(`declares ${count} parameters, has ${sub.length}`);
    const list = sub.map((line) => {
      const q = new Tokens(line, this.where, `parameter of optimizer shard ${index}`);
      const name = q.name('parameter name');
      q.keyword('offset');
      const offset = q.int('offset');
      q.keyword('elements');
      const n = q.int('elements', 0);
      q.end();
      return { name, offset, elements: n };
    });
    this.shards!.push({
      group,
      parts,
      elements,
      expAvg,
      expAvgSq,
      ...(master !== undefined ? { master } : {}),
      params: list,
    });
  }

  instruction(t: Tokens, index: number): void {
    const head = t.next('#<index>');
    if (head !== `#${index}`)
      t.fail(
        /^#\d+$/.test(head)
          ? `instruction ${head} out of order: expected #${index}`
          : `expected '#${index}', found '${head}'`,
      );
    t.what = `instruction ${head}`;
    const stream: StreamName = t.oneOf('stream', STREAMS);
    const phase = t.oneOf('phase', PHASES);
    t.keyword('mb');
    const microbatch = t.int('microbatch');
    const op = t.next('op');
    if (!isOpKind(op)) t.fail(`unknown op '${op}'${didYouMean(op, OP_KINDS)}`);
    const ins: number[] = [];
    while (!t.accept('->')) ins.push(t.buffer('input', this.nBuffers));
    const outs: number[] = [];
    while (t.peek()?.startsWith('%')) outs.push(t.buffer('output', this.nBuffers));
    const attrs = t.peek()?.startsWith('{')
      ? (t.json('attrs', isObject) as PlanInstruction['attrs'])
      : {};
    const wait: number[] = [];
    if (t.accept('wait')) while (t.peek()?.startsWith('e')) wait.push(t.event(this.events));
    const record: number[] = [];
    if (t.accept('record')) while (t.peek()?.startsWith('e')) record.push(t.event(this.events));
    t.keyword('@');
    const scope = t.name('scope');
    t.end();
    // push()'s key order (compiler/emit/draft.ts: scheduled)
    this.instructions.push({
      stream,
      op,
      inputs: ins,
      outputs: outs,
      attrs,
      wait,
      record,
      microbatch,
      phase,
      scope,
    });
  }

  /** a one-line section (program, regions, scratch, arena-lower-bound, events); false for the others */
  header(top: string, t0: Tokens): boolean {
    switch (top) {
      case 'program': {
        this.id = t0.name('program id');
        t0.keyword('format');
        this.format = t0.name('format');
        if (this.format !== PROGRAM_FORMAT) t0.fail(`not an lfc program: format '${this.format}'`);
        t0.keyword('version');
        this.version = t0.int('version');
        if (t0.peek() === 'filtered')
          t0.fail('a filtered print (instructions left out) cannot be parsed');
        t0.end();
        return true;
      }
      case 'regions':
        while (t0.peek() !== undefined) {
          const r = t0.oneOf('region', PROGRAM_REGIONS);
          if (Object.hasOwn(this.regions, r)) t0.fail(`region ${r} named twice`);
          this.regions[r] = t0.number(`bytes of region ${r}`);
        }
        return true;
      case 'scratch':
        while (t0.peek() !== undefined) {
          const stream = t0.oneOf('stream', STREAMS);
          if (Object.hasOwn(this.scratchBytes, stream)) t0.fail(`stream ${stream} named twice`);
          this.scratchBytes[stream] = t0.number(`scratch bytes of stream ${stream}`);
        }
        return true;
      case 'arena-lower-bound':
        this.arenaLowerBoundBytes = t0.number('bytes');
        t0.end();
        return true;
      case 'expected-bytes': {
        t0.keyword('arena');
        const arena = t0.number('expected arena bytes');
        t0.keyword('data');
        this.expectedBytes = { arena, data: t0.number('expected data bytes') };
        t0.end();
        return true;
      }
      case 'events':
        this.events = t0.int('events', 0);
        t0.end();
        return true;
    }
    return false;
  }

  result(): ProgramFile {
    return {
      format: this.format as typeof PROGRAM_FORMAT,
      version: this.version,
      id: this.id,
      regions: this.regions as Record<ProgramRegion, number>,
      scratchBytes: this.scratchBytes as Record<StreamName, number>,
      arenaLowerBoundBytes: this.arenaLowerBoundBytes,
      ...(this.expectedBytes ? { expectedBytes: this.expectedBytes } : {}),
      buffers: this.buffers,
      params: this.params,
      inputs: this.inputs,
      scalars: this.scalars,
      outputs: this.outputs,
      events: this.events,
      instructions: this.instructions,
      ...(this.shards !== undefined ? { optimizerShards: this.shards } : {}),
    };
  }
}

/** The text's non-blank lines with their indentation (0, 2 or 4 spaces). */
function linesOf(text: string, where: string): Line[] {
  const lines: Line[] = [];
  text.split('\n').forEach((raw, k) => {
    const s = raw.endsWith('\r') ? raw.slice(0, -1) : raw;
    const body = s.trimStart();
    if (body === '') return;
    const indent = s.length - body.length;
    if (indent !== 0 && indent !== 2 && indent !== 4)
      throw new UserError(`${where}line ${k + 1}: bad indentation (0, 2 or 4 spaces)`);
    if (s.slice(0, indent).includes('\t'))
      throw new UserError(`${where}line ${k + 1}: bad indentation (spaces, not tabs)`);
    lines.push({ n: k + 1, indent, body });
  });
  if (!lines.length) throw new UserError(`${where}empty text: no program`);
  return lines;
}

/**
 * The program of an unfiltered print. Throws a UserError naming the line (and `source`, a file
 * name, when given) for a text it cannot read.
 */
export function parseProgram(text: string, source?: string): ProgramFile {
  const where = source ? `${source}: ` : '';
  const lines = linesOf(text, where);
  const p = new ProgramParser(where);
  let k = 0;
  let place = -1; // index in TOP of the last top-level line read
  while (k < lines.length) {
    const line = lines[k++];
    const t0 = new Tokens(line, where, 'program');
    if (line.indent !== 0) t0.fail('an indented line outside a section');
    const key = t0.next('a section');
    const at = (TOP as readonly string[]).indexOf(key);
    if (at < 0) {
      t0.what = `unknown section '${key}'${didYouMean(key, TOP)}`;
      t0.fail(`expected one of ${TOP.join(', ')}`);
    }
    const top = key as Top;
    t0.what = top;
    if (at <= place)
      t0.fail(
        `out of place: after '${TOP[place]}' come ${TOP.slice(place + 1).join(', ') || 'no more lines'}`,
      );
    const skipped = TOP.slice(place + 1, at).filter((x) => !OPTIONAL.has(x));
    if (skipped.length) t0.fail(`expected '${skipped[0]}' before it`);
    place = at;
    // the entries of a section: the indented lines after it
    const body: Line[] = [];
    while (k < lines.length && lines[k].indent > 0) body.push(lines[k++]);
    if (!SECTIONS.has(top)) {
      if (body.length) new Tokens(body[0], where, top).fail('an indented line outside a section');
    }
    if (p.header(top, t0)) continue;
    const count = t0.int('count', 0);
    if (t0.peek() === 'of') t0.fail('a filtered print (entries left out) cannot be parsed');
    t0.end();
    if (top === 'buffers') p.nBuffers = count;
    if (top === 'optimizer-shards') p.shards = [];
    // entries at indentation 2; an optimizer shard's parameters below it at 4
    const items: { line: Line; sub: Line[] }[] = [];
    for (const l of body) {
      if (l.indent === 2) items.push({ line: l, sub: [] });
      else if (top === 'optimizer-shards' && items.length) items[items.length - 1].sub.push(l);
      else new Tokens(l, where, top).fail('bad indentation (entries are indented 2 spaces)');
    }
    if (items.length !== count)
      t0.fail(
        `declares ${count} entries, has ${items.length}` +
          (k >= lines.length ? ' (the text ends)' : ''),
      );
    items.forEach((it, index) => p.entry(top, new Tokens(it.line, where, top), index, it.sub));
  }
  const missing = TOP.slice(place + 1).filter((x) => !OPTIONAL.has(x));
  if (missing.length)
    throw new UserError(
      `${where}line ${lines[lines.length - 1].n}: the text ends before '${missing[0]}'`,
    );
  return p.result();
}
