// Property tests of what `lfc run` loads besides the plan: a checkpoint (--load: state.json,
// latest, model.safetensors' header), a replayed batch (--batch, the --dump-step format) and
// weights (--weights). Each is a valid file of a real run, edited structurally or byte by byte;
// `lfc run` trains, or exits 2 with one line on stderr naming the file.
import fc from 'fast-check';
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { cli } from '../helpers.js';
import {
  byteEdits,
  expectCliOutcome,
  jsonEdits,
  limitMs,
  mutateBytes,
  mutateJson,
  runs,
  SMALL_PLAN,
} from './fuzz.js';

const dir = mkdtempSync(join(tmpdir(), 'lfc-fuzz-ckpt-'));
const plan = join(dir, 'plan');
const save = join(dir, 'save');
const dump = join(dir, 'dump');
const work = join(dir, 'work');
const iter = 'iter_0000001';
let state: unknown;
let batchFile: Buffer;

/** A safetensors file split into its header (parsed) and data. */
function split(bytes: Buffer): { header: unknown; data: Buffer } {
  const n = Number(bytes.readBigUInt64LE(0));
  return {
    header: JSON.parse(bytes.subarray(8, 8 + n).toString('utf8')),
    data: bytes.subarray(8 + n),
  };
}
function join8(header: unknown, data: Buffer): Buffer {
  const json = Buffer.from(JSON.stringify(header));
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(json.length));
  return Buffer.concat([len, json, data]);
}

/** A fresh copy of the saved checkpoint to edit. */
function workCopy(): string {
  rmSync(work, { recursive: true, force: true });
  cpSync(save, work, { recursive: true });
  return work;
}

describe('checkpoints, batch and weight files under mutation', () => {
  beforeAll(async () => {
    const compiled = await cli('compile', ...SMALL_PLAN, '-o', plan);
    expect(compiled.code, compiled.err).toBe(0);
    const trained = await cli(
      'run',
      plan,
      '--steps',
      '1',
      '--save',
      save,
      '--dump-step',
      dump,
      '--quiet',
    );
    expect(trained.code, trained.err).toBe(0);
    state = JSON.parse(readFileSync(join(save, iter, 'state.json'), 'utf8'));
    batchFile = readFileSync(join(dump, 'batch.safetensors'));
  }, 120_000);

  it(
    '--load: state.json edited',
    async () => {
      await fc.assert(
        fc.asyncProperty(jsonEdits(2), async (edits) => {
          const w = workCopy();
          writeFileSync(join(w, iter, 'state.json'), JSON.stringify(mutateJson(state, edits)));
          expectCliOutcome(await cli('run', plan, '--steps', '2', '--load', w, '--quiet'));
        }),
        runs(8),
      );
    },
    limitMs(15, 4000),
  );

  it(
    '--load: latest and state.json bytes',
    async () => {
      const text = Buffer.from(JSON.stringify(state));
      await fc.assert(
        fc.asyncProperty(byteEdits(2), fc.boolean(), async (edits, latest) => {
          const w = workCopy();
          if (latest) writeFileSync(join(w, 'latest'), mutateBytes(Buffer.from('1\n'), edits));
          else writeFileSync(join(w, iter, 'state.json'), mutateBytes(text, edits));
          expectCliOutcome(await cli('run', plan, '--steps', '2', '--load', w, '--quiet'));
        }),
        runs(15),
      );
    },
    limitMs(15, 4000),
  );

  it(
    '--load: model.safetensors header edited',
    async () => {
      const model = split(readFileSync(join(save, iter, 'model.safetensors')));
      await fc.assert(
        fc.asyncProperty(jsonEdits(2), async (edits) => {
          const w = workCopy();
          writeFileSync(
            join(w, iter, 'model.safetensors'),
            join8(mutateJson(model.header, edits), model.data),
          );
          expectCliOutcome(await cli('run', plan, '--steps', '2', '--load', w, '--quiet'));
        }),
        runs(15),
      );
    },
    limitMs(15, 4000),
  );

  it(
    '--batch: the dumped batch edited',
    async () => {
      const b = split(batchFile);
      const path = join(dir, 'batch.safetensors');
      await fc.assert(
        fc.asyncProperty(
          jsonEdits(2),
          byteEdits(2),
          fc.boolean(),
          async (edits, bytes, inHeader) => {
            writeFileSync(
              path,
              inHeader ? join8(mutateJson(b.header, edits), b.data) : mutateBytes(batchFile, bytes),
            );
            expectCliOutcome(await cli('run', plan, '--steps', '1', '--batch', path, '--quiet'));
          },
        ),
        runs(25),
      );
    },
    limitMs(25, 3000),
  );

  it(
    '--batch: token, position and segment values out of range',
    async () => {
      const b = split(batchFile);
      const header = b.header as Record<string, { dtype: string; data_offsets: [number, number] }>;
      const path = join(dir, 'values.safetensors');
      const fields = Object.keys(header).filter((k) => header[k].dtype === 'I32');
      await fc.assert(
        fc.asyncProperty(
          fc.constantFrom(...fields),
          fc.nat(),
          fc.constantFrom(-1, -(2 ** 31), 2 ** 31 - 1, 512, 513, 4096, 1, 0),
          async (field, at, value) => {
            const data = Buffer.from(b.data);
            const [begin, end] = header[field].data_offsets;
            const n = (end - begin) / 4;
            if (n > 0) data.writeInt32LE(value, begin + 4 * (at % n));
            writeFileSync(path, join8(header, data));
            expectCliOutcome(await cli('run', plan, '--steps', '1', '--batch', path, '--quiet'));
          },
        ),
        runs(8),
      );
    },
    limitMs(12, 4000),
  );

  it(
    '--weights: the dumped weights header edited',
    async () => {
      const weights = split(readFileSync(join(dump, 'weights.safetensors')));
      const path = join(dir, 'weights.safetensors');
      await fc.assert(
        fc.asyncProperty(jsonEdits(2), async (edits) => {
          writeFileSync(path, join8(mutateJson(weights.header, edits), weights.data));
          expectCliOutcome(await cli('run', plan, '--steps', '1', '--weights', path, '--quiet'));
        }),
        runs(4),
      );
    },
    limitMs(10, 4000),
  );
});
