// lfc compile / run in-process: bad plans and bad flags are refused before anything runs, with
// one line naming the problem and exit code 2; a short run trains and writes its metrics.
import { existsSync, mkdtempSync, readFileSync, writeFileSync, mkdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { cli } from '../helpers.js';
import { PLAN_VERSION } from '../../compiler/plan/format.js';

const dir = mkdtempSync(join(tmpdir(), 'lfc-run-'));
const plan = join(dir, 'plan');

beforeAll(async () => {
  const r = await cli('compile', 'tiny-vlm', '--global-batch-size', '2', '-o', plan);
  expect(r.code).toBe(0);
}, 60_000);

function broken(
  name: string,
  edit: (planJson: Record<string, unknown>, program: Record<string, unknown>) => void,
): string {
  const d = join(dir, name);
  mkdirSync(join(d, 'programs'), { recursive: true });
  const p = JSON.parse(readFileSync(join(plan, 'plan.json'), 'utf8'));
  const prog = JSON.parse(readFileSync(join(plan, 'programs', 'p0.json'), 'utf8'));
  edit(p, prog);
  writeFileSync(join(d, 'plan.json'), JSON.stringify(p));
  writeFileSync(join(d, 'programs', 'p0.json'), JSON.stringify(prog));
  return d;
}

describe('lfc run refuses bad input before anything runs', () => {
  it.each([
    ['no plan here', () => join(dir, 'nothing'), /no such plan directory/],
    [
      'malformed plan.json',
      () => {
        const d = join(dir, 'malformed');
        mkdirSync(d, { recursive: true });
        writeFileSync(join(d, 'plan.json'), '{"format": "lfc-plan", ');
        return d;
      },
      /plan\.json: malformed plan\.json/,
    ],
    [
      'another schema version',
      () => broken('version', (p) => (p.version = PLAN_VERSION + 1)),
      new RegExp(`plan schema version ${PLAN_VERSION + 1}; this lfc runs version ${PLAN_VERSION}`),
    ],
    [
      'an unknown op',
      () =>
        broken(
          'unknown-op',
          (_p, prog) => ((prog.instructions as { op: string }[])[5].op = 'frobnicate'),
        ),
      /instruction 5 \(frobnicate.*unknown op/,
    ],
    [
      'a missing program',
      () => broken('missing-program', (p) => (p.rankPrograms = ['p9'])),
      /program p9 named by plan\.json is missing/,
    ],
  ])('%s', async (_what, make, message) => {
    const r = await cli('run', (make as () => string)(), '--steps', '1', '--quiet');
    expect(r.code).toBe(2);
    expect(r.err).toMatch(message as RegExp);
    expect(r.err.trim().split('\n')).toHaveLength(1);
  });

  it('a global batch with no loss token', async () => {
    // a batch file whose loss masks are all zero
    const { readBatchFile, writeBatchFile } = await import('../../runtime/batch.js');
    const mbs = readBatchFile(
      join(process.cwd(), 'test/fixtures/tiny-vlm/batch.safetensors'),
    ).slice(0, 2);
    const empty = mbs.map((mb) => ({ ...mb, lossMask: new Uint8Array(mb.lossMask.length) }));
    const file = join(dir, 'empty.safetensors');
    writeBatchFile(file, empty);
    const r = await cli('run', plan, '--steps', '1', '--batch', file, '--quiet');
    expect(r.code).toBe(2);
    expect(r.err).toMatch(/the global batch has no loss token/);
  });

  it.each([
    [['--lr-decay-style', 'linear'], /--lr-decay-style must be constant or cosine/],
    [['--steps', '0'], /--steps must be a positive integer/],
    [['--save-interval', '2'], /--save-interval needs --save DIR/],
    [['--nproc-per-node', '2'], /is a plan for 1 rank .*; this launch starts 2/],
  ])('flags %j', async (flags, message) => {
    const r = await cli('run', plan, ...(flags as string[]));
    expect(r.code).toBe(2);
    expect(r.err).toMatch(message as RegExp);
  });
});

describe('an output path that cannot be written is refused before any work', () => {
  // a file where a directory goes, a directory where a file goes, a path under a file: the
  // operating system refused them with exit 1, a run's --trace only after its steps
  const file = join(dir, 'a-file');
  const folder = join(dir, 'a-folder');
  beforeAll(() => {
    writeFileSync(file, 'x');
    mkdirSync(folder, { recursive: true });
  });
  it.each([
    [
      'run --save FILE',
      ['run', plan, '--save', file],
      /--save .*a-file: a file is there, not a directory/,
    ],
    [
      'run --save FILE/ck',
      ['run', plan, '--save', join(file, 'ck')],
      /--save .*: .*a-file is a file, not a directory/,
    ],
    [
      'run --dump-step FILE',
      ['run', plan, '--dump-step', file],
      /--dump-step .*a-file: a file is there/,
    ],
    [
      'run --metrics DIR',
      ['run', plan, '--metrics', folder],
      /--metrics .*a-folder: a directory is there; give a file/,
    ],
    [
      'run --trace DIR',
      ['run', plan, '--trace', folder],
      /--trace .*a-folder: a directory is there; give a file/,
    ],
    [
      'run --metrics FILE/m.jsonl',
      ['run', plan, '--metrics', join(file, 'm.jsonl')],
      /a-file is a file, not a directory/,
    ],
    [
      'compile -o FILE',
      ['compile', 'tiny-vlm', '-o', file],
      /-o .*a-file: a file is there, not a directory/,
    ],
    [
      'compile -o FILE/x/y',
      ['compile', 'tiny-vlm', '-o', join(file, 'x', 'y')],
      /a-file is a file, not a directory/,
    ],
    ["run --trace ''", ['run', plan, '--trace', ''], /--trace needs a path, got ''/],
    ['viz -o DIR', ['viz', plan, '-o', folder], /-o .*a-folder: a directory is there; give a file/],
  ])('%s', async (_label, argv, message) => {
    // a run that names no metrics file gets one of its own, which must not be started
    const metrics = join(dir, `metrics-${(argv as string[]).join('-').replace(/\W/g, '_')}.jsonl`);
    const own = argv[0] === 'run' && !argv.includes('--metrics') ? ['--metrics', metrics] : [];
    const args = argv[0] === 'run' ? [...argv, ...own, '--steps', '1', '--quiet'] : argv;
    const r = await cli(...(args as string[]));
    expect(r.code, r.err).toBe(2);
    expect(r.err).toMatch(message as RegExp);
    expect(r.err.trim().split('\n')).toHaveLength(1);
    if (own.length) expect(existsSync(metrics)).toBe(false);
  });
});

describe('lfc run trains', () => {
  it('two steps with metrics JSONL (caption loss recorded separately)', async () => {
    const metrics = join(dir, 'm.jsonl');
    const r = await cli('run', plan, '--steps', '2', '--metrics', metrics, '--quiet');
    expect(r.code).toBe(0);
    const lines = readFileSync(metrics, 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
    expect(lines.map((l) => l.step)).toEqual([1, 2]);
    for (const l of lines) {
      expect(l.loss).toBeGreaterThan(0);
      expect(l.caption_loss).toBeGreaterThan(0);
      expect(l.tokens_per_s).toBeGreaterThan(0);
    }
  }, 60_000);
});
