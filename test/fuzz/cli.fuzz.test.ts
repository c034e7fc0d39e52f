// Property tests of the CLI's flag handling (cli/, run in-process as `lfc` runs it): lfc inspect,
// compile and run with random combinations of their own flags (read from the commands, so a new
// flag is fuzzed too), each given a value from a pool of good, wrong-typed and extreme ones, and
// unknown flags among them. The CLI exits 0, or 2 with one line on stderr, never a stack.
import fc from 'fast-check';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { makeProgram } from '../../cli/index.js';
import { cli } from '../helpers.js';
import { expectCliOutcome, limitMs, runs } from './fuzz.js';

const dir = mkdtempSync(join(tmpdir(), 'lfc-fuzz-cli-'));
const cwd = process.cwd();

const VALUES = [
  '0',
  '-1',
  '1',
  '2',
  '4',
  '1.5',
  '1e9',
  '9007199254740993',
  'NaN',
  'Infinity',
  '-0',
  '0x10',
  '',
  'abc',
  'tiny-vlm',
  'cosine',
  'h800',
  'nowhere/file.json',
  '1,2',
  '--steps',
];

/** A command's flags: the long name, and whether it takes a value. */
function flagsOf(command: string, leaveOut: readonly string[]): [string, boolean][] {
  const c = makeProgram({ out: () => {}, err: () => {} }).commands.find(
    (x) => x.name() === command,
  )!;
  return c.options
    .filter((o) => o.long && !leaveOut.includes(o.long))
    .map((o) => [o.long!, o.required || o.optional]);
}

/** Up to `max` flags of the command, each with a value from the pool where it takes one. */
function flags(
  command: string,
  max: number,
  leaveOut: readonly string[] = [],
): fc.Arbitrary<string[]> {
  const known = flagsOf(command, leaveOut);
  const one = fc.oneof(
    {
      weight: 9,
      arbitrary: fc
        .tuple(fc.constantFrom(...known), fc.constantFrom(...VALUES))
        .map(([[flag, takesValue], v]) => (takesValue ? [flag, v] : [flag])),
    },
    { weight: 1, arbitrary: fc.constantFrom(['--bogus'], ['-x'], ['--tp=2'], ['extra']) },
  );
  return fc.array(one, { maxLength: max }).map((xs) => xs.flat());
}

describe('CLI flag combinations', () => {
  // files the flags name (a trace, a report) land in a scratch directory
  beforeAll(() => process.chdir(dir));
  afterAll(() => process.chdir(cwd));

  it(
    'lfc inspect',
    async () => {
      await fc.assert(
        fc.asyncProperty(
          fc.constantFrom('tiny-vlm', 'qwen3-vl-moe-tiny'),
          flags('inspect', 4),
          async (m, f) => {
            expectCliOutcome(await cli('inspect', m, ...f));
          },
        ),
        runs(60),
      );
    },
    limitMs(60, 1000),
  );

  it(
    'lfc compile',
    async () => {
      await fc.assert(
        fc.asyncProperty(flags('compile', 4, ['--output']), async (f) => {
          expectCliOutcome(
            await cli('compile', 'tiny-vlm', '--seq-length', '32', ...f, '-o', join(dir, 'plan')),
          );
        }),
        runs(40),
      );
    },
    limitMs(40, 3000),
  );

  it('regressions', async () => {
    // the TS campaign (seed 7): --gpus-per-node 2^53 ran the compiler out of memory; a global
    // batch of 2^53 was a RangeError in the schedule
    for (const f of [
      ['--gpus-per-node', '9007199254740993'],
      ['--gpus-per-node', '100000'],
      ['--global-batch-size', '2147483647'],
      ['--seq-length', '2147483647', '--micro-batch-size', '4'],
    ]) {
      const r = await cli('compile', 'tiny-vlm', ...f, '-o', join(dir, 'plan'));
      expectCliOutcome(r);
      expect(r.code).toBe(2);
    }
  });

  it(
    'lfc run',
    async () => {
      const plan = join(dir, 'run-plan');
      const r = await cli(
        'compile',
        'tiny-vlm',
        '--seq-length',
        '32',
        '--global-batch-size',
        '2',
        '-o',
        plan,
      );
      expect(r.code, r.err).toBe(0);
      // one step each, on this process (no flags that launch ranks or pick another plan)
      const leaveOut = [
        '--train-iters',
        '--steps',
        '--nproc-per-node',
        '--nnodes',
        '--node-rank',
        '--master-addr',
      ];
      await fc.assert(
        fc.asyncProperty(flags('run', 3, leaveOut), async (f) => {
          expectCliOutcome(await cli('run', plan, ...f, '--steps', '1', '--quiet'));
        }),
        runs(10),
      );
    },
    limitMs(20, 4000),
  );
});
