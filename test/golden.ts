// Golden files: expected text under test/goldens/, refreshed with UPDATE_GOLDENS=1 and reviewed
// as a diff.
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { expect } from 'vitest';

const DIR = join(dirname(fileURLToPath(import.meta.url)), 'goldens');

export function expectGolden(name: string, actual: string): void {
  const path = join(DIR, name);
  if (process.env.UPDATE_GOLDENS === '1' || !existsSync(path)) {
    if (process.env.CI && !existsSync(path))
      throw new Error(`golden ${name} is missing; run with UPDATE_GOLDENS=1`);
    mkdirSync(dirname(path), { recursive: true });
    writeFileSync(path, actual);
    return;
  }
  expect(actual).toBe(readFileSync(path, 'utf8'));
}
