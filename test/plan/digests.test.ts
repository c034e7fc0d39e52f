// Behaviour unchanged, byte for byte: every line of test/digests.ts compiles to the plan files and
// the forecast recorded in test/goldens/plan-digests.json. LFC_RECORD_DIGESTS=1 records them anew
// (in a commit of its own that says why). All 48 lines take about 30 s on this machine.
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { projectRoot } from '../../compiler/paths.js';
import { DIGEST_LINES, planDigest } from '../digests.js';

const FILE = join(projectRoot(), 'test/goldens/plan-digests.json');
const record = process.env.LFC_RECORD_DIGESTS === '1';
const recorded: Record<string, string> = existsSync(FILE)
  ? (JSON.parse(readFileSync(FILE, 'utf8')) as Record<string, string>)
  : {};
const seen: Record<string, string> = {};

describe('plan digests', () => {
  it('there are at least 40 lines, each with a distinct name', () => {
    expect(DIGEST_LINES.length).toBeGreaterThanOrEqual(40);
    expect(new Set(DIGEST_LINES.map((l) => l.name)).size).toBe(DIGEST_LINES.length);
  });
  for (const line of DIGEST_LINES)
    it(
      line.name,
      async () => {
        seen[line.name] = await planDigest(line.argv);
        if (!record)
          expect(seen[line.name], `lfc compile ${line.argv.join(' ')}`).toBe(recorded[line.name]);
      },
      300_000,
    );
  afterAll(() => {
    if (record) writeFileSync(FILE, JSON.stringify({ ...recorded, ...seen }, null, 1) + '\n');
  });
});
