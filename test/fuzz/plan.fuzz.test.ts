// Property tests of the plan loader the runtime uses (runtime/plan-io.ts readPlan, then `lfc run`
// on what it read): a compiled plan's plan.json and program edited structurally or byte by byte.
// readPlan accepts or throws a one-line UserError naming the file; `lfc run` exits 0, or 2 with
// one line on stderr.
import fc from 'fast-check';
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { readPlan } from '../../runtime/plan-io.js';
import { cli } from '../helpers.js';
import {
  byteEdits,
  expectAcceptOrUserError,
  expectCliOutcome,
  jsonEdits,
  limitMs,
  mutateBytes,
  mutateJson,
  runs,
  SMALL_PLAN,
} from './fuzz.js';

const dir = mkdtempSync(join(tmpdir(), 'lfc-fuzz-plan-'));
const good = join(dir, 'good');
const work = join(dir, 'work');
let planJson: unknown;
let programText: string;
let program: unknown;

/** The work plan directory: the good one with plan.json and programs/p0.json as given. */
function writeWork(plan: string | Buffer, prog: string | Buffer = programText): void {
  rmSync(work, { recursive: true, force: true });
  cpSync(good, work, { recursive: true });
  writeFileSync(join(work, 'plan.json'), plan);
  writeFileSync(join(work, 'programs', 'p0.json'), prog);
}

describe('plan files under mutation', () => {
  beforeAll(async () => {
    const r = await cli('compile', ...SMALL_PLAN, '-o', good);
    expect(r.code, r.err).toBe(0);
    planJson = JSON.parse(readFileSync(join(good, 'plan.json'), 'utf8'));
    programText = readFileSync(join(good, 'programs', 'p0.json'), 'utf8');
    program = JSON.parse(programText);
  }, 60_000);

  it(
    'readPlan: plan.json edited',
    () => {
      fc.assert(
        fc.property(jsonEdits(3), (edits) => {
          writeWork(JSON.stringify(mutateJson(planJson, edits)));
          expectAcceptOrUserError(() => readPlan(work));
        }),
        runs(150),
      );
    },
    limitMs(150, 50),
  );

  it(
    'readPlan: plan.json and the program, bytes flipped or cut',
    () => {
      const planBytes = Buffer.from(JSON.stringify(planJson));
      fc.assert(
        fc.property(byteEdits(3), fc.boolean(), (edits, inProgram) => {
          if (inProgram) writeWork(planBytes, mutateBytes(Buffer.from(programText), edits));
          else writeWork(mutateBytes(planBytes, edits));
          expectAcceptOrUserError(() => readPlan(work));
        }),
        runs(100),
      );
    },
    limitMs(100, 80),
  );

  it(
    'lfc run: plan.json edited',
    async () => {
      await fc.assert(
        fc.asyncProperty(jsonEdits(2), async (edits) => {
          writeWork(JSON.stringify(mutateJson(planJson, edits)));
          expectCliOutcome(await cli('run', work, '--steps', '1'));
        }),
        runs(25),
      );
    },
    limitMs(25, 3000),
  );

  it(
    'lfc run: the program edited',
    async () => {
      await fc.assert(
        fc.asyncProperty(jsonEdits(2), async (edits) => {
          writeWork(JSON.stringify(planJson), JSON.stringify(mutateJson(program, edits)));
          expectCliOutcome(await cli('run', work, '--steps', '1'));
        }),
        runs(12),
      );
    },
    limitMs(12, 4000),
  );

  it('regressions', async () => {
    // a persistent f32 buffer moved to an odd byte (campaign, seed 34): the step ran, and reading
    // the parameters back after it threw a RangeError (a Float32Array at that offset)
    const edited = structuredClone(program) as {
      buffers: { region: string; dtype: string; offset: number }[];
    };
    const k = edited.buffers.findIndex((b) => b.region === 'param' && b.dtype === 'f32');
    edited.buffers[k].offset += 1;
    writeWork(JSON.stringify(planJson), JSON.stringify(edited));
    const r = await cli('run', work, '--steps', '1');
    expect(r.code, r.err).toBe(2);
    expect(r.err).toMatch(new RegExp(`buffer ${k}\\b.*not a multiple of its f32's 4 bytes`));
  });

  it.each([
    // campaign, seed 35: the step's data was made at 33 tokens for buffers of 32, and the native
    // loader's refusal came out as an internal error
    ['seqLength', 33, /training\.seqLength 33 × microBatchSize 1 is not the 32 tokens of symbol S/],
    // these trained another step than the plan's, without a word
    ['seqLength', 16, /training\.seqLength 16 × microBatchSize 1 is not the 32 tokens/],
    ['numMicrobatches', 1, /training\.numMicrobatches 1 × .* is not globalBatchSize 2/],
    ['maxVisualTokens', 33, /training\.maxVisualTokens 33 is not the 32 of symbol Nv/],
  ])('regression: training.%s %d against the symbols', async (field, value, message) => {
    const edited = structuredClone(planJson) as { training: Record<string, number> };
    edited.training[field] = value;
    writeWork(JSON.stringify(edited));
    const r = await cli('run', work, '--steps', '1');
    expect(r.code, r.err).toBe(2);
    expect(r.err).toMatch(message);
  });
});
