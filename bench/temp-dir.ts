// A benchmark's working directory: a fresh one under the system temp directory, removed when the
// benchmark's process exits (plans, metrics and logs are scratch; the figures are printed).
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export function benchDir(prefix: string): string {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  process.on('exit', () => rmSync(dir, { recursive: true, force: true }));
  return dir;
}
