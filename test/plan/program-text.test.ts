// The text form of programs (compiler/plan/program-text.ts): every program of every layout of the
// equivalence matrix and of the article's 30B line comes back from its print byte for byte as
// JSON, and prints the same text again; a hand-made program prints as the text below; a filtered
// print shows the chosen instructions under their indices; a malformed text is a UserError that
// names the line.
import { describe, expect, it } from 'vitest';
import { parseCompileArgs } from '../../cli/compile.js';
import { UserError } from '../../compiler/errors.js';
import { compile } from '../../compiler/pipeline.js';
import {
  PLAN_VERSION,
  type PlanInstruction,
  type ProgramFile,
} from '../../compiler/plan/format.js';
import { parseProgram, printProgram } from '../../compiler/plan/program-text.js';
import { ARTICLE_30B, argvOf } from '../../examples/article-launch-lines.js';
import { BATCH, LAYOUTS } from '../layouts.js';

const LINES = [
  ...LAYOUTS.map((l) => ({
    name: l.name,
    argv: [l.model, ...BATCH, '--nproc-per-node', String(l.ranks), ...l.flags],
  })),
  { name: 'article-30b', argv: argvOf(ARTICLE_30B) },
];

const compiled = new Map<string, readonly ProgramFile[]>();
function programsOf(name: string): readonly ProgramFile[] {
  let list = compiled.get(name);
  if (!list) {
    const line = LINES.find((l) => l.name === name)!;
    list = compile(parseCompileArgs(line.argv).options).programs;
    compiled.set(name, list);
  }
  return list;
}

/** an instruction's keys in push()'s key order (compiler/emit/draft.ts: scheduled) */
const PUSH_ORDER = [
  'stream',
  'op',
  'inputs',
  'outputs',
  'attrs',
  'wait',
  'record',
  'microbatch',
  'phase',
  'scope',
] as const;
/** a === b, or a failure showing where they first differ (not an 8 MB diff) */
function expectSameText(a: string, b: string, what: string): void {
  if (a === b) return;
  let i = 0;
  while (i < a.length && a[i] === b[i]) i++;
  const around = (s: string) => JSON.stringify(s.slice(Math.max(0, i - 80), i + 80));
  expect.fail(`${what}: differ at char ${i}\n  got      ${around(a)}\n  expected ${around(b)}`);
}

describe('every emitted program round-trips through its text', () => {
  it.each(LINES.map((l) => [l.name]))(
    '%s',
    (name) => {
      for (const p of programsOf(name)) {
        const text = printProgram(p);
        const back = parseProgram(text, `${p.id}.txt`);
        // every instruction has push()'s key order, so the round trip is exact
        for (const x of p.instructions) expect(Object.keys(x)).toEqual(PUSH_ORDER);
        expectSameText(
          JSON.stringify(back),
          JSON.stringify(p),
          `${name} ${p.id}: JSON after the round trip`,
        );
        expectSameText(printProgram(back), text, `${name} ${p.id}: the text printed again`);
      }
    },
    120_000,
  );
});

// a program made by hand: quoting, a view, host space, floats, no attrs, an empty scope, a dist,
// optimizer shards
const SAMPLE: ProgramFile = {
  format: 'lfc-program',
  version: PLAN_VERSION,
  id: 'p0',
  regions: {
    arena: 4096,
    param: 131072,
    grad: 131072,
    optim: 131072,
    data: 512,
    scalar: 128,
    host: 2048,
    scratch: 1152,
  },
  scratchBytes: { compute: 1024, comm: 128, copy: 0, grad: 0 },
  arenaLowerBoundBytes: 3072,
  buffers: [
    ...[
      ['model.embed_tokens.weight', 'param'],
      ['grad.model.embed_tokens.weight', 'grad'],
    ].map(([name, region], id) => ({
      id,
      name,
      region: region as 'param' | 'grad',
      space: 'device' as const,
      dtype: 'f32',
      shape: ['512', '64'],
      offset: 0,
      bytes: 131072,
      microbatch: -1,
    })),
    {
      id: 2,
      name: 'tokens.mb0',
      region: 'data',
      space: 'device',
      dtype: 'i32',
      shape: ['S'],
      offset: 0,
      bytes: 512,
      microbatch: 0,
    },
    {
      id: 3,
      name: '7',
      region: 'arena',
      space: 'device',
      dtype: 'f32',
      shape: ['S', '64'],
      offset: 1024,
      bytes: 2048,
      microbatch: 0,
    },
    {
      id: 4,
      name: '8',
      region: 'arena',
      space: 'device',
      dtype: 'f32',
      shape: ['S', '4', '16'],
      offset: 1024,
      bytes: 2048,
      viewOf: 3,
      microbatch: 0,
    },
    {
      id: 5,
      name: '8 "on the host"',
      region: 'host',
      space: 'host',
      dtype: 'f32',
      shape: ['S', '4', '16'],
      offset: 0,
      bytes: 2048,
      microbatch: 0,
    },
    {
      id: 6,
      name: 'loss_tokens',
      region: 'scalar',
      space: 'device',
      dtype: 'f32',
      shape: [],
      offset: 0,
      bytes: 4,
      microbatch: -1,
    },
    {
      id: 7,
      name: 'loss.mb0',
      region: 'scalar',
      space: 'device',
      dtype: 'f32',
      shape: [],
      offset: 64,
      bytes: 4,
      microbatch: 0,
    },
    ...['exp_avg_shard0', 'exp_avg_sq_shard0'].map((name, k) => ({
      id: 8 + k,
      name,
      region: 'optim' as const,
      space: 'device' as const,
      dtype: 'f32',
      shape: ['16384'],
      offset: 65536 * k,
      bytes: 65536,
      microbatch: -1,
    })),
  ],
  params: [
    {
      name: 'model.embed_tokens.weight',
      buffer: 0,
      grad: 1,
      shard: [
        [0, 512],
        [0, 64],
      ],
      dist: {
        name: 'model.embed_tokens.weight',
        shape: [1024, 64],
        split: [{ group: 'tp', parts: 2, blocks: 1 }, null],
        gradSum: [],
        replicas: 'dp',
      },
    },
  ],
  inputs: [{ name: 'tokens', buffer: 2, microbatch: 0 }],
  scalars: { loss_tokens: 6 },
  outputs: [{ name: 'loss', buffer: 7, microbatch: 0 }],
  events: 2,
  instructions: [
    ['compute', 'embedding', [2, 0], [3], {}, [], [0], 0, 'forward', 'model.embed_tokens'],
    ['compute', 'reshape', [3], [4], { shape: ['S', 4, 16] }, [], [], 0, 'forward', 'model.x'],
    ['copy', 'offload', [4], [5], {}, [0], [1], 0, 'forward', 'model.layers.0 (offload)'],
    [
      'compute',
      'adamw',
      [0, 1, 8, 9, 6],
      [],
      { beta1: 0.9, eps: 1e-8, weight_decay: 0.1, lr_scale: 0.1 + 0.2, tiny: 5e-324 },
      [1],
      [],
      -1,
      'optimizer',
      '',
    ],
  ].map(
    (row) =>
      Object.fromEntries(PUSH_ORDER.map((k, i) => [k, row[i]])) as unknown as PlanInstruction,
  ),
  optimizerShards: [
    {
      group: 'dp',
      parts: 2,
      elements: 32768,
      expAvg: 8,
      expAvgSq: 9,
      params: [{ name: 'model.embed_tokens.weight', offset: 0, elements: 32768 }],
    },
  ],
};

const SAMPLE_TEXT = `program p0 format lfc-program version ${PLAN_VERSION}
regions arena 4096 param 131072 grad 131072 optim 131072 data 512 scalar 128 host 2048 scratch 1152
scratch compute 1024 comm 128 copy 0 grad 0
arena-lower-bound 3072
events 2
buffers 10
  %0 param f32[512,64] @0 +131072 mb -1 "model.embed_tokens.weight"
  %1 grad f32[512,64] @0 +131072 mb -1 "grad.model.embed_tokens.weight"
  %2 data i32[S] @0 +512 mb 0 "tokens.mb0"
  %3 arena f32[S,64] @1024 +2048 mb 0 "7"
  %4 arena f32[S,4,16] @1024 +2048 mb 0 "8" view %3
  %5 host f32[S,4,16] @0 +2048 mb 0 "8 \\"on the host\\"" space host
  %6 scalar f32[] @0 +4 mb -1 "loss_tokens"
  %7 scalar f32[] @64 +4 mb 0 "loss.mb0"
  %8 optim f32[16384] @0 +65536 mb -1 "exp_avg_shard0"
  %9 optim f32[16384] @65536 +65536 mb -1 "exp_avg_sq_shard0"
params 1
  model.embed_tokens.weight %0 grad %1 shard [[0,512],[0,64]] dist {"name":"model.embed_tokens.weight","shape":[1024,64],"split":[{"group":"tp","parts":2,"blocks":1},null],"gradSum":[],"replicas":"dp"}
inputs 1
  tokens %2 mb 0
scalars 1
  loss_tokens %6
outputs 1
  loss %7 mb 0
optimizer-shards 1
  dp parts 2 elements 32768 exp_avg %8 exp_avg_sq %9 params 1
    model.embed_tokens.weight offset 0 elements 32768
instructions 4
  #0 compute forward mb 0 embedding %2 %0 -> %3 record e0 @ model.embed_tokens
  #1 compute forward mb 0 reshape %3 -> %4 {"shape":["S",4,16]} @ model.x
  #2 copy forward mb 0 offload %4 -> %5 wait e0 record e1 @ "model.layers.0 (offload)"
  #3 compute optimizer mb -1 adamw %0 %1 %8 %9 %6 -> {"beta1":0.9,"eps":1e-8,"weight_decay":0.1,"lr_scale":0.30000000000000004,"tiny":5e-324} wait e1 @ ""
`;

describe('the text of a program', () => {
  it('prints a hand-made program as written here, and reads it back byte for byte', () => {
    expect(printProgram(SAMPLE)).toBe(SAMPLE_TEXT);
    expect(JSON.stringify(parseProgram(SAMPLE_TEXT))).toBe(JSON.stringify(SAMPLE));
  });

  it('keeps the key order of regions, and no optimizerShards key when the program has none', () => {
    const { optimizerShards: _, ...rest } = SAMPLE;
    const p: ProgramFile = { ...rest, regions: { ...{ host: 2048 }, ...SAMPLE.regions } };
    const back = parseProgram(printProgram(p));
    expect(JSON.stringify(back)).toBe(JSON.stringify(p));
    expect(Object.keys(back.regions)[0]).toBe('host');
    expect('optimizerShards' in back).toBe(false);
  });

  it('a filtered print shows only the chosen instructions, under their indices, and the buffers they name', () => {
    const p = programsOf('level3-tp2-pp2')[0];
    const ops = new Set(['broadcast', 'gather_v', 'scatter_v']);
    const chosen = p.instructions.flatMap((x, i) => (ops.has(x.op) ? [i] : []));
    expect(chosen.length).toBeGreaterThan(2);
    const text = printProgram(p, { instructions: (x) => ops.has(x.op) });
    const lines = text.split('\n');
    expect(lines[0]).toMatch(
      new RegExp(
        `^program p0\\.t0 format lfc-program version ${PLAN_VERSION} filtered .*not parseable`,
      ),
    );
    const shown = lines.filter((l) => l.startsWith('  #'));
    expect(shown.map((l) => Number(/^ {2}#(\d+) /.exec(l)![1]))).toEqual(chosen);
    // each shown line is the unfiltered print's line of that instruction
    const full = new Set(printProgram(p).split('\n'));
    for (const l of shown) expect(full.has(l)).toBe(true);
    const named = new Set(
      chosen.flatMap((i) => [...p.instructions[i].inputs, ...p.instructions[i].outputs]),
    );
    const buffers = lines
      .filter((l) => /^ {2}%/.test(l))
      .map((l) => Number(/^ {2}%(\d+) /.exec(l)![1]));
    expect(new Set(buffers)).toEqual(named); // none of them is a view here
    expect(lines).toContain(`instructions ${chosen.length} of ${p.instructions.length}`);
    expect(() => parseProgram(text)).toThrow(/^line 1: program: a filtered print/);
  });
});

describe('a malformed text is a UserError naming the line', () => {
  /** the sample with its first line containing `find` changed; that line's number */
  const edit = (find: string, change: (line: string) => string | undefined) => {
    const lines = SAMPLE_TEXT.split('\n');
    const i = lines.findIndex((l) => l.includes(find));
    const changed = change(lines[i]);
    if (changed === undefined) lines.splice(i, 1);
    else lines[i] = changed;
    return { text: lines.join('\n'), line: i + 1 };
  };
  const lineOf = (text: string) => SAMPLE_TEXT.split('\n').indexOf(text) + 1;
  const CASES: [string, ReturnType<typeof edit>, RegExp][] = [
    [
      'an unknown section',
      edit('inputs 1', () => 'inptus 1'),
      /unknown section 'inptus' \(did you mean 'inputs'\?\)/,
    ],
    [
      'a bad buffer reference',
      edit('#0 ', (l) => l.replace('%2 %0', '%2 %12')),
      /instruction #0: bad buffer reference %12 for input: the program has 10 buffers/,
    ],
    [
      'a buffer reference that is not one',
      edit('tokens %2', (l) => l.replace('%2', '2')),
      /input tokens: bad buffer reference '2' for buffer \(expected %<number>\)/,
    ],
    [
      'a bad event reference',
      edit('#3 ', (l) => l.replace('wait e1', 'wait e9')),
      /instruction #3: bad event reference e9 for event: the program has 2 events/,
    ],
    [
      'a bad number',
      edit('%3 arena', (l) => l.replace('@1024', '@10z4')),
      /buffer %3: bad number '10z4' for offset/,
    ],
    [
      'a truncated instruction',
      edit('#2 ', (l) => l.slice(0, l.indexOf(' record'))),
      /instruction #2: expected '@', the line ends/,
    ],
    [
      'an instruction cut inside its attrs',
      edit('#3 ', (l) => l.slice(0, l.indexOf(',"eps"'))),
      /instructions: unclosed bracket in '\{"beta1":0.9'/,
    ],
    [
      'a truncated buffer',
      edit('%7 scalar', (l) => l.slice(0, l.indexOf(' mb'))),
      /buffer %7: expected 'mb', the line ends/,
    ],
    [
      'a buffer out of order',
      edit('%5 host', (l) => l.replace('%5', '%6')),
      /buffer %6 out of order: expected %5/,
    ],
    [
      'an unknown op',
      edit('#0 ', (l) => l.replace('embedding', 'embeding')),
      /did you mean 'embedding'/,
    ],
    [
      'a section missing an entry (the error is on the section line)',
      { ...edit('  #3 ', () => undefined), line: lineOf('instructions 4') },
      /instructions: declares 4 entries, has 3 \(the text ends\)/,
    ],
    [
      'a section out of place',
      edit('scalars 1', () => 'params 1'),
      /params: out of place: after 'inputs' come scalars/,
    ],
  ];
  it.each(CASES)('%s', (_, { text, line }, message) => {
    let error: unknown;
    try {
      parseProgram(text, 'p0.txt');
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(UserError);
    const msg = (error as UserError).message;
    expect(msg).toMatch(new RegExp(`^p0\\.txt: line ${line}: `));
    expect(msg).toMatch(message);
    expect(msg).not.toContain('\n');
  });
});
