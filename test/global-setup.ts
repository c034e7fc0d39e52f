// Every file a test run writes goes under one directory of its own, removed when the run ends:
// the tests and the rank processes they start take os.tmpdir() from TMPDIR, which is set here
// before any worker starts. A run left over a gigabyte in /tmp before (the equivalence test's plans,
// checkpoints and logs alone), and a disk shared with other work filled up with them.
// LFC_KEEP_TEST_TMP=1 keeps the directory (its path is printed) to look at after a failure.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export default function setup(): () => void {
  const dir = mkdtempSync(join(tmpdir(), 'lfc-test-'));
  process.env.TMPDIR = dir;
  const keep = process.env.LFC_KEEP_TEST_TMP === '1';
  if (keep) console.log(`test files kept in ${dir}`);
  return () => {
    if (!keep) rmSync(dir, { recursive: true, force: true });
  };
}
