// bench/fuzz: the coverage-guided fuzzers of the native loaders (runtime-native/fuzz/targets.h:
// plan, batch, params), with libFuzzer from Debian's clang, ASan and UBSan. A bench-time tool: it
// installs clang (apt-get) and builds its own instrumented runtime in runtime-native/build/fuzz;
// npm test only replays the committed corpus through the g++ driver (test/fuzz/native-replay.test.ts).
//
//   npx tsx bench/fuzz.ts programs            recompile the programs the targets load
//                                             (runtime-native/fuzz/programs/*.json)
//   npx tsx bench/fuzz.ts seeds               write the seed inputs (runtime-native/fuzz/seeds/)
//   npx tsx bench/fuzz.ts run [--minutes 10] [--targets plan,batch,params] [--jobs 1]
//                                             build, fuzz each target for that long (nice 19),
//                                             then merge what it found into the committed corpus
//                                             (runtime-native/fuzz/corpus/<target>/)
//
// A finding (crash, sanitizer report, timeout, out of memory) stops its target and is left in
// runtime-native/build/fuzz/findings/<target>/; the run prints it and exits 1.

import { spawn, spawnSync } from 'node:child_process';
import {
  existsSync,
  mkdirSync,
  readFileSync,
  readdirSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { run } from '../cli/index.js';
import type { PlanFile, ProgramFile } from '../compiler/plan/format.js';
import type { ModelConfig } from '../compiler/frontend/config.js';
import { visionOptions } from '../runtime/batch.js';
import { benchDir } from './temp-dir.js';

const root = fileURLToPath(new URL('..', import.meta.url));
const fuzzDir = join(root, 'runtime-native', 'fuzz');
const buildDir = join(root, 'runtime-native', 'build', 'fuzz');
const TARGETS = ['plan', 'batch', 'params'] as const;
type Target = (typeof TARGETS)[number];

/** The models whose programs the batch and params targets load (targets.cc reads these names). */
const MODELS = ['tiny-vlm', 'qwen2.5-vl-tiny'];

/**
 * Both at small widths and depths, so a params input (every parameter initialized) runs in
 * milliseconds under ASan: the loaders' paths do not depend on the widths.
 */
const SHRINK: Record<string, string[]> = {
  'tiny-vlm': ['model.image_encoder.num_layers=1', 'model.text_decoder.mrope_section=[4]'],
  'qwen2.5-vl-tiny': [
    'model.image_encoder.num_layers=2',
    'model.image_encoder.fullatt_block_indexes=[1]',
    'model.text_decoder.mrope_section=[2, 1, 1]',
  ],
};
const SHRINK_COMMON = [
  'model.image_encoder.hidden_size=16',
  'model.image_encoder.num_attention_heads=2',
  'model.image_encoder.ffn_hidden_size=32',
  'model.text_decoder.num_layers=1',
  'model.text_decoder.hidden_size=32',
  'model.text_decoder.num_attention_heads=4',
  'model.text_decoder.num_query_groups=2',
  'model.text_decoder.kv_channels=8',
  'model.text_decoder.ffn_hidden_size=64',
  'model.text_decoder.vocab_size=64',
];

function sh(cmd: string, args: string[]): void {
  const r = spawnSync(cmd, args, { stdio: 'inherit' });
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(' ')} exited ${r.status}`);
}

async function compilePlan(
  model: string,
  dir: string,
): Promise<{ plan: PlanFile; program: ProgramFile }> {
  const quiet = { out: () => {}, err: (t: string) => process.stderr.write(t) };
  const args = [
    model,
    ...SHRINK_COMMON,
    ...SHRINK[model],
    '--seq-length',
    '32',
    '--micro-batch-size',
    '1',
    '--global-batch-size',
    '2',
  ];
  const code = await run(['compile', ...args, '-o', dir], quiet);
  if (code !== 0) throw new Error(`lfc compile ${args.join(' ')} exited ${code}`);
  const plan = JSON.parse(readFileSync(join(dir, 'plan.json'), 'utf8')) as PlanFile;
  const id = plan.rankPrograms[0];
  const program = JSON.parse(readFileSync(join(dir, 'programs', `${id}.json`), 'utf8'));
  return { plan, program };
}

/** runtime-native/fuzz/programs/<model>.json: the runtime's options, the plan's symbols and params, the program. */
async function writePrograms(): Promise<void> {
  const tmp = benchDir('lfc-fuzz-');
  mkdirSync(join(fuzzDir, 'programs'), { recursive: true });
  for (const model of MODELS) {
    const { plan, program } = await compilePlan(model, join(tmp, model));
    const v = visionOptions(plan.model.config as unknown as ModelConfig['model']);
    const options = {
      patchSize: v.patchSize,
      mergeSize: v.mergeSize,
      temporalPatch: v.temporalPatch,
      windowMerged: v.windowMerged,
      tableSide: v.tableSide,
      imageTokenId: v.imageTokenId,
      positionRows: v.positionRows,
    };
    const symbols = plan.symbols.map((s) => ({ name: s.name, bound: s.bound }));
    const params = plan.params.map((p) => ({ name: p.name, init: p.init, shape: p.shape }));
    const path = join(fuzzDir, 'programs', `${model}.json`);
    writeFileSync(path, JSON.stringify({ options, symbols, params, program }) + '\n');
    console.log(`wrote ${path}`);
  }
}

/**
 * A smaller program cut from a real one: its first `count` instructions without events, the
 * buffers they (and the inputs and params) name renumbered; scalars and outputs kept where their
 * buffers are. Seeds of the plan target, small enough for the fuzzer's input size.
 */
function cutProgram(p: ProgramFile, count: number): unknown {
  const instrs = p.instructions.slice(0, count);
  const keep = new Set<number>();
  const add = (id: number): void => {
    for (let b: number | null | undefined = id; b !== undefined && b !== null && !keep.has(b);) {
      keep.add(b);
      b = p.buffers[b].viewOf;
    }
  };
  for (const i of instrs) [...i.inputs, ...i.outputs].forEach(add);
  const kept = [...keep].sort((a, b) => a - b);
  const newId = new Map(kept.map((id, k) => [id, k]));
  const remap = (id: number): number => newId.get(id)!;
  const has = (id: number | undefined): boolean => id !== undefined && newId.has(id);
  return {
    ...p,
    expectedBytes: undefined,
    events: 0,
    buffers: kept.map((id) => {
      const b = p.buffers[id];
      return { ...b, id: remap(id), viewOf: has(b.viewOf ?? undefined) ? remap(b.viewOf!) : null };
    }),
    params: p.params
      .filter((q) => has(q.buffer))
      .map((q) => ({ name: q.name, buffer: remap(q.buffer), shard: q.shard })),
    inputs: p.inputs.filter((i) => has(i.buffer)).map((i) => ({ ...i, buffer: remap(i.buffer) })),
    scalars: Object.fromEntries(
      Object.entries(p.scalars)
        .filter(([, id]) => has(id))
        .map(([n, id]) => [n, remap(id)]),
    ),
    outputs: p.outputs.filter((o) => has(o.buffer)).map((o) => ({ ...o, buffer: remap(o.buffer) })),
    instructions: instrs.map((i) => ({
      ...i,
      inputs: i.inputs.map(remap),
      outputs: i.outputs.map(remap),
      wait: [],
      record: [],
    })),
  };
}

/** runtime-native/fuzz/seeds/<target>/: a few valid and nearly valid inputs per target. */
function writeSeeds(): void {
  for (const t of TARGETS) {
    rmSync(join(fuzzDir, 'seeds', t), { recursive: true, force: true });
    mkdirSync(join(fuzzDir, 'seeds', t), { recursive: true });
  }
  const seed = (t: Target, name: string, bytes: Uint8Array | string): void =>
    writeFileSync(join(fuzzDir, 'seeds', t, name), bytes);
  for (const model of MODELS) {
    const { program } = JSON.parse(
      readFileSync(join(fuzzDir, 'programs', `${model}.json`), 'utf8'),
    );
    for (const count of [0, 1, 2, 4, 8, 16]) {
      const text = JSON.stringify(cutProgram(program as ProgramFile, count));
      // mode byte: bit 0 collectives, bit 1 the plan's symbols S and Nv (targets.cc plan())
      seed('plan', `${model}-${count}`, '\x02' + text);
    }
  }
  // batch (targets.cc batch()): fixture, slot + 1, the bits of the fields made to fit, S, the
  // text fields, the positions' form (0: [S], 1: [3, S]), the caption flag, the images' form
  // (1: images, 2: patches with grids, 3: both); the bytes past the end read as 0
  const microbatch = (
    fixture: number,
    slot: number,
    S: number,
    rows: number,
    images: number[],
  ): Uint8Array => {
    const text = (v: number): number[] => new Array(S).fill(v);
    const positions = Array.from({ length: rows * S }, (_, i) => i % S);
    return Uint8Array.from([
      ...[fixture, slot + 1, 0xff, S],
      ...[...text(30), ...text(31), ...text(1), ...text(0)],
      ...[rows === 3 ? 1 : 0, ...positions, 0],
      ...images,
    ]);
  };
  const batchSeeds: Record<string, Uint8Array> = {
    'text-only': microbatch(0, 0, 16, 1, [0]),
    // one 8×8 image (every bit of its fit set)
    images: microbatch(0, 0, 24, 1, [1, 1, 7, 0, 0]),
    'images-slot-1': microbatch(0, 1, 32, 1, [1, 2, 7, 1, 0, 7, 0, 1]),
    // qwen2.5-vl-tiny: M-RoPE positions [3, S], one grid (1, 2, 2) as patches
    patches: microbatch(1, 0, 24, 3, [2, 1, 1, 0, 0]),
    'patches-two': microbatch(1, 1, 32, 3, [2, 2, 1, 1, 0, 1, 0, 1]),
    'both-forms': microbatch(0, 0, 30, 1, [3, 1, 7, 0, 0]),
    'slot-out-of-range': Uint8Array.from([0, 0, 0, 4]),
  };
  for (const [name, bytes] of Object.entries(batchSeeds)) seed('batch', name, bytes);
  // params: fixture, seed (8 bytes), one mode byte per param (< 200: as the plan gives it)
  for (const fixture of [0, 1]) {
    seed('params', `valid-${fixture}`, Uint8Array.from([fixture, 1, 2, 3, 4, 5, 6, 7, 8]));
    for (const mode of [200, 201, 202, 203, 204, 205, 206, 207])
      seed(
        'params',
        `mode-${mode}-${fixture}`,
        Uint8Array.from([fixture, 0, 0, 0, 0, 0, 0, 0, 0, 0, mode, 3, 1, 5, 1, 9]),
      );
  }
  console.log(`wrote ${join(fuzzDir, 'seeds')}`);
}

/** The JSON dictionary of the plan target: the program format's keys and words. */
function writeDictionary(): string {
  const words = new Set<string>();
  const { program } = JSON.parse(
    readFileSync(join(fuzzDir, 'programs', `${MODELS[1]}.json`), 'utf8'),
  );
  const walk = (v: unknown): void => {
    if (Array.isArray(v)) v.forEach(walk);
    else if (v && typeof v === 'object')
      for (const [k, x] of Object.entries(v)) {
        words.add(JSON.stringify(k));
        walk(x);
      }
    else if (typeof v === 'string' && v.length < 24) words.add(JSON.stringify(v));
  };
  walk(program);
  for (const w of ['null', 'true', '-1', '1e308', '9007199254740993', '"S"', '"Nv"', '[]', '{}'])
    words.add(w);
  const path = join(buildDir, 'plan.dict');
  const esc = (w: string): string => w.replace(/\\/g, '\\\\').replace(/"/g, '\\"');
  writeFileSync(path, [...words].map((w) => `"${esc(w)}"`).join('\n') + '\n');
  return path;
}

function build(targets: readonly Target[]): void {
  if (spawnSync('clang++', ['--version']).status !== 0) {
    console.log('installing clang (libFuzzer and the sanitizers) with apt-get…');
    sh('apt-get', ['install', '-y', '-qq', 'clang', 'libclang-rt-dev']);
  }
  mkdirSync(buildDir, { recursive: true });
  sh('cmake', [
    '-S',
    join(root, 'runtime-native'),
    '-B',
    buildDir,
    '-DCMAKE_BUILD_TYPE=RelWithDebInfo',
    '-DCMAKE_CXX_COMPILER=clang++',
    '-DLFC_FUZZ=ON',
  ]);
  sh('nice', [
    '-n',
    '19',
    'cmake',
    '--build',
    buildDir,
    '-j2',
    '--target',
    ...targets.map((t) => `fuzz_${t}`),
  ]);
}

interface Campaign {
  target: Target;
  seconds: number;
  execs: number;
  cov: number;
  ft: number;
  corpus: number;
  finding?: string;
}

/** One target for `seconds` under nice 19, from the committed corpus and the seeds. */
function fuzz(target: Target, seconds: number, dict: string): Promise<Campaign> {
  const work = join(buildDir, 'corpus', target);
  const findings = join(buildDir, 'findings', target);
  mkdirSync(work, { recursive: true });
  mkdirSync(findings, { recursive: true });
  mkdirSync(join(fuzzDir, 'corpus', target), { recursive: true });
  const args = [
    '-n',
    '19',
    join(buildDir, `fuzz_${target}`),
    `-max_total_time=${seconds}`,
    '-timeout=10',
    '-rss_limit_mb=2048',
    '-malloc_limit_mb=1024',
    '-max_len=65536',
    '-print_final_stats=1',
    `-artifact_prefix=${findings}/`,
    ...(target === 'plan' ? [`-dict=${dict}`] : []),
    work,
    join(fuzzDir, 'corpus', target),
    join(fuzzDir, 'seeds', target),
  ];
  const log = join(buildDir, `${target}.log`);
  const start = Date.now();
  return new Promise((resolve) => {
    const child = spawn('nice', args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let text = '';
    child.stdout.on('data', (d) => (text += d));
    child.stderr.on('data', (d) => (text += d));
    child.on('close', () => {
      writeFileSync(log, text);
      const stat = (k: string): number =>
        Number(new RegExp(`${k}:\\s*(\\d+)`).exec(text)?.[1] ?? 0);
      const last = [...text.matchAll(/cov: (\d+) ft: (\d+) corp: (\d+)/g)].pop();
      const found = readdirSync(findings);
      resolve({
        target,
        seconds: Math.round((Date.now() - start) / 1000),
        execs: stat('stat::number_of_executed_units'),
        cov: Number(last?.[1] ?? 0),
        ft: Number(last?.[2] ?? 0),
        corpus: Number(last?.[3] ?? 0),
        ...(found.length ? { finding: `${findings}/${found[0]} (log ${log})` } : {}),
      });
    });
  });
}

/** Merges the work corpus into the committed one: the inputs that add coverage, minimized. */
function merge(target: Target): void {
  const committed = join(fuzzDir, 'corpus', target);
  const fresh = join(buildDir, 'merged', target);
  rmSync(fresh, { recursive: true, force: true });
  mkdirSync(fresh, { recursive: true });
  mkdirSync(committed, { recursive: true });
  const r = spawnSync(
    'nice',
    [
      '-n',
      '19',
      join(buildDir, `fuzz_${target}`),
      '-merge=1',
      '-use_counters=0', // edges, not hit counts: a corpus of a few hundred files
      `-artifact_prefix=${join(buildDir, 'findings', target)}/`,
      '-timeout=10',
      '-rss_limit_mb=2048',
      fresh,
      committed,
      join(fuzzDir, 'seeds', target),
      join(buildDir, 'corpus', target),
    ],
    { encoding: 'utf8' },
  );
  if (r.status !== 0) throw new Error(`merge of ${target} failed: ${r.stderr.slice(-2000)}`);
  // the regression inputs of fixed findings stay by name (regression-<what>)
  for (const f of readdirSync(committed))
    if (f.startsWith('regression-'))
      writeFileSync(join(fresh, f), readFileSync(join(committed, f)));
  rmSync(committed, { recursive: true, force: true });
  mkdirSync(committed, { recursive: true });
  let bytes = 0;
  for (const f of readdirSync(fresh)) {
    const data = readFileSync(join(fresh, f));
    bytes += data.length;
    writeFileSync(join(committed, f), data);
  }
  console.log(
    `${target}: corpus ${readdirSync(committed).length} inputs, ${(bytes / 1024).toFixed(0)} KiB`,
  );
}

function flag(name: string, fallback: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : fallback;
}

async function main(): Promise<void> {
  const command = process.argv[2] ?? 'run';
  if (command === 'programs') return writePrograms();
  if (command === 'seeds') return writeSeeds();
  if (command !== 'run') throw new Error(`unknown command ${command} (programs, seeds, run)`);
  const minutes = Number(flag('minutes', '10'));
  const targets = flag('targets', TARGETS.join(',')).split(',') as Target[];
  const jobs = Number(flag('jobs', '1'));
  build(targets);
  const dict = writeDictionary();
  const results: Campaign[] = [];
  for (let k = 0; k < targets.length; k += jobs) {
    const batch = targets.slice(k, k + jobs);
    results.push(...(await Promise.all(batch.map((t) => fuzz(t, minutes * 60, dict)))));
  }
  for (const t of targets) merge(t);
  console.log('target   seconds   executions   exec/s   cov    ft     corpus   finding');
  for (const r of results) {
    const rate = r.execs / Math.max(1, r.seconds);
    console.log(
      `${r.target.padEnd(8)} ${String(r.seconds).padStart(7)}   ${String(r.execs).padStart(10)}   ${rate.toFixed(0).padStart(6)}   ${String(r.cov).padStart(5)}  ${String(r.ft).padStart(5)}  ${String(r.corpus).padStart(6)}   ${r.finding ?? 'none'}`,
    );
  }
  const size = (d: string): number =>
    readdirSync(d).reduce((s, f) => s + statSync(join(d, f)).size, 0);
  for (const t of targets)
    if (existsSync(join(fuzzDir, 'corpus', t)))
      console.log(`corpus/${t}: ${(size(join(fuzzDir, 'corpus', t)) / 1024).toFixed(0)} KiB`);
  if (results.some((r) => r.finding)) process.exitCode = 1;
}

await main();
