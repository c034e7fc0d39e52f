// Every file a test run writes goes under one directory of its own, removed when the run ends:
// the tests and the rank processes they start take os.tmpdir() from TMPDIR, which is set here
// before any worker starts. A run left over a gigabyte in /tmp before (the equivalence test's plans,
// checkpoints and logs alone), and a disk shared with other work filled up with them.
// LFC_KEEP_TEST_TMP=1 keeps the directory (its path is printed) to look at after a failure.
//
// Vitest calls this once for the root config and once for each project (vitest.config.ts): the
// first call makes the directory and the others keep it. Each making its own inside the last
// one's nested them; with three projects Chromium's profile socket path passed its 108-byte
// limit ("Socket path too long") and the browser tests could not start.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const MARK = 'LFC_TEST_RUN_TMPDIR';

export default function setup(): () => void {
  if (process.env[MARK] !== undefined) return () => {};
  const dir = mkdtempSync(join(tmpdir(), 'lfc-test-'));
  process.env.TMPDIR = dir;
  process.env[MARK] = dir;
  const keep = process.env.LFC_KEEP_TEST_TMP === '1';
  if (keep) console.log(`test files kept in ${dir}`);
  return () => {
    if (!keep) rmSync(dir, { recursive: true, force: true });
    delete process.env[MARK];
  };
}
