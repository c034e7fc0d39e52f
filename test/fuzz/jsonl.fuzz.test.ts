// Property tests of the data path's readers (runtime/data/jsonl.ts, records.ts) and of the
// commands that read datasets (lfc data stats, lfc run --data-path, with --strict-data): the demo
// dataset's JSONL with records edited structurally (turns dropped, roles and texts retyped, image
// names broken) and lines flipped or cut. A sample is read, or refused with a one-line DataError
// naming `file:LINE`; the commands exit 0 or 2 with one line.
import fc from 'fast-check';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { configsDir } from '../../compiler/paths.js';
import { demoDataset } from '../../runtime/data/demo-dataset.js';
import { openJsonl } from '../../runtime/data/jsonl.js';
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
} from './fuzz.js';

const dir = mkdtempSync(join(tmpdir(), 'lfc-fuzz-jsonl-'));
const tokenizer = configsDir('tokenizers', 'tiny');
let lines: string[] = [];
let records: unknown[] = [];
let folder = '';

/** A JSONL file beside the demo's images (their names are relative to it). */
function writeJsonl(text: string | Buffer): string {
  const path = join(folder, 'fuzz.jsonl');
  writeFileSync(path, text);
  return path;
}

/** Every sample and every image of the file read: each accepted, or refused with one line. */
function readEverything(path: string): void {
  let ds: ReturnType<typeof openJsonl> | undefined;
  expectAcceptOrUserError(() => (ds = openJsonl(path)));
  if (!ds) return;
  for (let i = 0; i < ds.size; i++)
    expectAcceptOrUserError(() => ds!.sample(i).images.forEach((im) => im.read()));
}

describe('JSONL datasets under mutation', () => {
  beforeAll(async () => {
    const train = (await demoDataset(join(dir, 'demo'), 12, 2)).train;
    folder = join(train, '..');
    lines = readFileSync(train, 'utf8').split('\n').filter(Boolean);
    records = lines.map((l) => JSON.parse(l) as unknown);
  }, 60_000);

  it(
    'records edited structurally',
    () => {
      fc.assert(
        fc.property(fc.nat(records.length - 1), jsonEdits(3), (i, edits) => {
          const edited = [...lines];
          edited[i] = JSON.stringify(mutateJson(records[i], edits));
          readEverything(writeJsonl(edited.join('\n') + '\n'));
        }),
        runs(40),
      );
    },
    limitMs(150, 60),
  );

  it(
    'the file flipped, cut, with bytes inserted',
    () => {
      const text = Buffer.from(lines.join('\n') + '\n');
      fc.assert(
        fc.property(byteEdits(4), (edits) => readEverything(writeJsonl(mutateBytes(text, edits)))),
        runs(100),
      );
    },
    limitMs(100, 60),
  );

  it(
    'lfc data stats --strict-data on an edited record',
    async () => {
      await fc.assert(
        fc.asyncProperty(fc.nat(records.length - 1), jsonEdits(2), async (i, edits) => {
          const edited = [...lines];
          edited[i] = JSON.stringify(mutateJson(records[i], edits));
          const path = writeJsonl(edited.join('\n') + '\n');
          expectCliOutcome(
            await cli(
              'data',
              'stats',
              path,
              '--tokenizer-model',
              tokenizer,
              '--strict-data',
              '--quiet',
            ),
          );
        }),
        runs(20),
      );
    },
    limitMs(20, 3000),
  );

  it('regressions', () => {
    // a role or an image name with a line break made a two-line message
    const path = writeJsonl(
      [
        '{"conversations": [{"from": "a\\nb", "value": "x"}]}',
        '{"image": "no\\nsuch.png", "conversations": [{"from": "human", "value": "<image>"}]}',
      ].join('\n'),
    );
    readEverything(path);
    expect(() => openJsonl(path).sample(0)).toThrow(/unknown role 'a\\nb'/);
  });
});
