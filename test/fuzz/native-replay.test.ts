// The committed corpus of the native fuzzers (runtime-native/fuzz/corpus/<target>/, grown by
// bench/fuzz.ts) replayed through the same entry points with the g++ build: every input is
// accepted or rejected with one line, none crashes or hangs (runtime-native/fuzz/replay.cc). The
// driver is built here, in the runtime's cmake build (npm test's setup step configured it).
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { projectRoot } from '../../compiler/paths.js';

const root = projectRoot();
const build = join(root, 'runtime-native/build');
const exe = join(build, 'lfc_fuzz_replay');
const fuzz = join(root, 'runtime-native/fuzz');

describe('native fuzz corpus replay', () => {
  beforeAll(() => {
    execFileSync('cmake', ['--build', build, '--target', 'lfc_fuzz_replay', '-j2'], {
      stdio: 'pipe',
      timeout: 300_000,
    });
  }, 300_000);

  for (const target of ['plan', 'batch', 'params']) {
    it(`${target}: every input accepted or rejected in one line`, () => {
      const dirs = ['corpus', 'seeds'].map((d) => join(fuzz, d, target)).filter(existsSync);
      const files = dirs.flatMap((d) => readdirSync(d));
      expect(files.length).toBeGreaterThan(0);
      // small enough to commit and to replay in npm test
      expect(files.length).toBeLessThan(1000);
      const out = execFileSync(exe, [target, ...dirs], {
        encoding: 'utf8',
        timeout: 120_000,
        env: { ...process.env, LFC_FUZZ_TIMEOUT_S: '20' },
      });
      expect(out).toMatch(new RegExp(`${target}: ${files.length} inputs, no finding`));
    }, 150_000);
  }

  it('the corpus stays small (a few MB)', () => {
    let bytes = 0;
    for (const target of ['plan', 'batch', 'params']) {
      const d = join(fuzz, 'corpus', target);
      if (existsSync(d)) for (const f of readdirSync(d)) bytes += statSync(join(d, f)).size;
    }
    expect(bytes).toBeLessThan(8 * 1024 * 1024);
  });
});
