// scripts/setup.mjs, the one setup path of lfc run/demo/calibrate, npm test and the benches, run
// against a scratch checkout with recording stand-ins for dpkg-query, dpkg, apt-get and cmake
// first on PATH. The stand-in cmake fails to configure, as the real one does ("Could NOT find
// BLAS"), unless apt-get installed the native packages first; so a setup that builds before it
// installs fails here, as it did on a fresh machine.
import { spawnSync } from 'node:child_process';
import {
  chmodSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  utimesSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import {
  COMMANDS,
  PACKAGES,
  buildIsStale,
  context,
  ensureKernelCheck,
  ensureNative,
  root as projectRoot,
  setupCommandOf,
  setupFor,
  vizAppIsStale,
  type SetupOptions,
} from '../../scripts/setup.mjs';

const STUBS: Record<string, string> = {
  'dpkg-query': String.raw`
printf "%s\n" "dpkg-query $*" >> "$STUB/log"
rc=0
for p in "$@"; do
  case "$p" in -*) continue;; esac
  if grep -qx "$p" "$STUB/installed"; then echo "$p install ok installed"
  else echo "dpkg-query: no packages found matching $p" >&2; rc=1; fi
done
exit $rc`,
  'apt-get': String.raw`
echo "apt-get $*" >> "$STUB/log"
n=$(cat "$STUB/locked" 2>/dev/null || echo 0)
if [ "$n" -gt 0 ]; then
  echo $((n - 1)) > "$STUB/locked"
  echo "E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 4242 (apt-get)" >&2
  exit 100
fi
if [ -e "$STUB/interrupted" ]; then
  echo "E: dpkg was interrupted, you must manually run 'dpkg --configure -a' to correct the problem." >&2
  exit 100
fi
seen=
for a in "$@"; do
  if [ "$a" = install ]; then seen=1; continue; fi
  case "$a" in -*|*=*) continue;; esac
  [ -n "$seen" ] && echo "$a" >> "$STUB/installed"
done
exit 0`,
  dpkg: String.raw`
echo "dpkg $*" >> "$STUB/log"
rm -f "$STUB/interrupted"`,
  cmake: String.raw`
echo "cmake $*" >> "$STUB/log"
if [ "$1" = --build ]; then
  case "$2" in
    *kernel-test) touch "$2/kernel_check";;
    *) mkdir -p "$2/Release" && touch "$2/Release/lfc_native.node";;
  esac
  exit 0
fi
while [ $# -gt 0 ]; do [ "$1" = -B ] && dir=$2; shift; done
if ! grep -qx libopenblas-dev "$STUB/installed"; then
  echo "CMake Error: Could NOT find BLAS (missing: BLAS_LIBRARIES)" >&2
  echo "CMAKE_GENERATOR:INTERNAL=Unix Makefiles" > "$dir/CMakeCache.txt"
  exit 1
fi
echo "CMAKE_GENERATOR:INTERNAL=Unix Makefiles" > "$dir/CMakeCache.txt"
touch "$dir/Makefile"`,
  npm: String.raw`
echo "npm $*" >> "$STUB/log"
exit 1`,
};

let scratch: string;
let stub: string;
let checkout: string;
let lines: string[];

/** A checkout whose npm packages and TypeScript build are current (they are not under test). */
function makeCheckout(dir: string): void {
  const files: Record<string, string> = {
    'package-lock.json': '{}',
    'tsconfig.json': '{}',
    'tsconfig.build.json': '{}',
    'viz/page.ts': '',
    'viz/app/main.ts': '',
    'viz/model.ts': '',
    'viz/vite.config.ts': '',
    'dist/viz-app/index.html': '',
    'runtime-native/CMakeLists.txt': '',
    'runtime-native/CMakeLists.kernels.cmake': '',
    'runtime-native/src/runtime.cc': '',
    'runtime-native/test/CMakeLists.txt': '',
    'node_modules/.package-lock.json': '{}',
    'dist/cli/main.js': '',
    'dist/.tsbuildinfo': JSON.stringify({ fileNames: ['../viz/page.ts'] }),
  };
  for (const [name, text] of Object.entries(files)) {
    mkdirSync(dirname(join(dir, name)), { recursive: true });
    writeFileSync(join(dir, name), text);
  }
  const past = new Date(Date.now() - 3600_000);
  for (const name of Object.keys(files))
    if (!name.startsWith('dist/') && !name.startsWith('node_modules/'))
      utimesSync(join(dir, name), past, past);
}

beforeEach(() => {
  scratch = mkdtempSync(join(tmpdir(), 'lfc-setup-'));
  stub = join(scratch, 'stub');
  checkout = join(scratch, 'checkout');
  const bin = join(stub, 'bin');
  mkdirSync(bin, { recursive: true });
  for (const [name, body] of Object.entries(STUBS)) {
    writeFileSync(join(bin, name), `#!/bin/sh\n${body}\n`);
    chmodSync(join(bin, name), 0o755);
  }
  writeFileSync(join(stub, 'installed'), 'cmake\ng++\nmake\n');
  writeFileSync(join(stub, 'log'), '');
  makeCheckout(checkout);
  lines = [];
});

afterEach(() => rmSync(scratch, { recursive: true, force: true }));

function options(extra: SetupOptions = {}): SetupOptions {
  return {
    root: checkout,
    env: { ...process.env, PATH: `${join(stub, 'bin')}:${process.env.PATH}`, STUB: stub },
    uid: 0,
    log: (line) => lines.push(line),
    lockPollMs: 5,
    lockTimeoutMs: 5000,
    ...extra,
  };
}

const calls = () => readFileSync(join(stub, 'log'), 'utf8').trim().split('\n').filter(Boolean);
const firstIndex = (re: RegExp) => calls().findIndex((l) => re.test(l));

describe('the setup of each command that builds the native runtime', () => {
  for (const argv of [['demo'], ['run', 'plan'], ['calibrate']]) {
    it(`lfc ${argv[0]}: installs the native packages, then configures and builds`, () => {
      const command = setupCommandOf(argv);
      expect(command).toBe(`lfc ${argv[0]}`);
      setupFor(command, options());
      const install = firstIndex(/^apt-get .*install/);
      expect(install).toBeGreaterThan(firstIndex(/^apt-get .*update/));
      expect(install).toBeGreaterThan(-1);
      expect(firstIndex(/^cmake /)).toBeGreaterThan(install);
      expect(calls()[install]).toContain('libopenblas-dev nlohmann-json3-dev libgloo-dev');
      expect(calls()[install]).not.toContain('chromium');
      expect(existsSync(join(checkout, 'runtime-native/build/Release/lfc_native.node'))).toBe(true);
      expect(lines[0]).toMatch(/^installing libopenblas-dev .* \(apt-get\)…$/);
    });
  }

  it("npm test's pretest: the native and browser packages, then the addon and the kernel checks", () => {
    setupFor('npm test', options());
    const install = firstIndex(/^apt-get .*install/);
    expect(calls()[install]).toContain('chromium');
    const cmake = calls().filter((l) => l.startsWith('cmake '));
    expect(firstIndex(/^cmake /)).toBeGreaterThan(install);
    expect(cmake).toEqual([
      'cmake -S runtime-native -B runtime-native/build -DCMAKE_BUILD_TYPE=Release',
      expect.stringMatching(/^cmake --build runtime-native\/build --parallel \d+$/),
      'cmake -S runtime-native/test -B runtime-native/build/kernel-test -DCMAKE_BUILD_TYPE=Release',
      expect.stringMatching(/^cmake --build runtime-native\/build\/kernel-test --parallel \d+$/),
    ]);
    // ran again with everything current: nothing installed, nothing built
    writeFileSync(join(stub, 'log'), '');
    setupFor('npm test', options());
    expect(calls().filter((l) => !l.startsWith('dpkg-query'))).toEqual([]);
  });

  it('the viz app is built again when a source of it is newer than the build', () => {
    expect(vizAppIsStale(context(options()))).toBe(false);
    const later = new Date(Date.now() + 60_000);
    utimesSync(join(checkout, 'viz/app/main.ts'), later, later);
    expect(vizAppIsStale(context(options()))).toBe(true);
    rmSync(join(checkout, 'dist/viz-app'), { recursive: true });
    expect(vizAppIsStale(context(options()))).toBe(true);
  });

  it('help and the commands that execute nothing need no native build', () => {
    expect(setupCommandOf(['run', '--help'])).toBe('lfc');
    expect(setupCommandOf(['compile', 'tiny-vlm'])).toBe('lfc');
    expect(COMMANDS.lfc).toEqual(['npm', 'tsc']);
  });

  it('every package of COMMANDS comes from one row of PACKAGES', () => {
    for (const steps of Object.values(COMMANDS))
      for (const step of steps.filter((s) => s.startsWith('packages:')))
        for (const feature of step.slice(9).split(',')) expect(PACKAGES[feature]).toBeDefined();
  });
});

describe('a build directory left half-configured is configured again', () => {
  for (const generator of ['Ninja', 'Unix Makefiles'])
    for (const build of ['runtime-native/build', 'runtime-native/build/kernel-test'])
      it(`${generator}, ${build}`, () => {
        writeFileSync(join(stub, 'installed'), Object.values(PACKAGES.native.packages).join('\n'));
        const dir = join(checkout, build);
        mkdirSync(dir, { recursive: true });
        // what an interrupted or failed configure leaves: a cache, no build file, no stamp
        writeFileSync(join(dir, 'CMakeCache.txt'), `CMAKE_GENERATOR:INTERNAL=${generator}\n`);
        mkdirSync(join(dir, 'CMakeFiles'));
        const ensure = build.endsWith('kernel-test') ? ensureKernelCheck : ensureNative;
        ensure(context(options()));
        expect(calls().filter((l) => l.startsWith('cmake'))[0]).toBe(
          `cmake -S ${build.endsWith('kernel-test') ? 'runtime-native/test' : 'runtime-native'} -B ${build} -DCMAKE_BUILD_TYPE=Release`,
        );
        expect(lines[0]).toBe(`${build} holds an unfinished configure; configuring it again`);
        expect(existsSync(join(dir, 'lfc-configured'))).toBe(true);
        // a finished configure is kept: a changed source only builds
        writeFileSync(join(stub, 'log'), '');
        writeFileSync(join(checkout, 'runtime-native/src/runtime.cc'), '// changed');
        utimesSync(
          join(checkout, 'runtime-native/src/runtime.cc'),
          new Date(Date.now() + 5000),
          new Date(Date.now() + 5000),
        );
        ensure(context(options()));
        expect(calls()).toEqual([expect.stringMatching(`^cmake --build ${build} --parallel`)]);
      });

  it('a configure that failed (packages missing, as root with LFC_NO_INSTALL) is redone on the next try', () => {
    const env = { ...options().env, LFC_NO_INSTALL: '1' };
    expect(() => setupFor('lfc run', options({ env }))).toThrow(
      /LFC_NO_INSTALL=1, so not installing\): run apt-get update && apt-get install -y --no-install-recommends libopenblas-dev nlohmann-json3-dev libgloo-dev$/,
    );
    expect(calls().some((l) => l.startsWith('apt-get') || l.startsWith('cmake'))).toBe(false);
    // the real cmake's failure leaves a cache and no build file behind
    expect(() => ensureNative(context(options()))).toThrow(
      /^configuring the native runtime failed: cmake exited with code 1; .* the configure is redone on the next try$/,
    );
    expect(existsSync(join(checkout, 'runtime-native/build/CMakeCache.txt'))).toBe(true);
    setupFor('lfc run', options());
    expect(calls().filter((l) => / -S /.test(l))).toHaveLength(2);
    expect(existsSync(join(checkout, 'runtime-native/build/Release/lfc_native.node'))).toBe(true);
  });
});

describe('apt-get', () => {
  it('waits for the apt/dpkg lock rather than failing on it', () => {
    writeFileSync(join(stub, 'locked'), '3');
    setupFor('lfc demo', options());
    expect(calls().filter((l) => l.startsWith('apt-get')).length).toBe(5); // 3 refused, update, install
    expect(lines).toContain('waiting for the apt/dpkg lock (another package manager is running)…');
    expect(existsSync(join(checkout, 'runtime-native/build/Release/lfc_native.node'))).toBe(true);
  });

  it('gives up on a lock held past the timeout, naming it', () => {
    writeFileSync(join(stub, 'locked'), '1000000');
    expect(() => setupFor('lfc demo', options({ lockTimeoutMs: 50 }))).toThrow(
      /^installing Debian packages failed: apt-get update exited with code 100; the apt\/dpkg lock stayed held/,
    );
    expect(calls().some((l) => l.startsWith('cmake'))).toBe(false);
  });

  it('finishes an interrupted dpkg run once, then installs', () => {
    writeFileSync(join(stub, 'interrupted'), '');
    setupFor('lfc demo', options());
    expect(calls()).toContain('dpkg --configure -a');
    expect(firstIndex(/^apt-get .*install/)).toBeGreaterThan(firstIndex(/^dpkg --configure/));
  });
});

describe('not root', () => {
  it('names the one command to run, and installs and builds nothing', () => {
    expect(() => setupFor('lfc demo', options({ uid: 1000 }))).toThrow(
      "the native runtime and the C++ kernel checks need Debian packages that are not installed: libopenblas-dev, nlohmann-json3-dev, libgloo-dev. Install them with: sudo sh -c 'apt-get update && apt-get install -y --no-install-recommends libopenblas-dev nlohmann-json3-dev libgloo-dev'",
    );
    expect(calls().some((l) => l.startsWith('apt-get') || l.startsWith('cmake'))).toBe(false);
  });

  it('bin/lfc.js run, with LFC_SETUP_UID=1000: one line, exit 1, no stack trace', () => {
    const r = spawnSync(process.execPath, [join(projectRoot, 'bin/lfc.js'), 'run', 'nowhere'], {
      env: { ...options().env, LFC_SETUP_UID: '1000' },
      encoding: 'utf8',
    });
    expect(r.status).toBe(1);
    expect(r.stdout).toBe('');
    // (the TypeScript build may be brought up to date first: its own line)
    const out = r.stderr
      .trim()
      .split('\n')
      .filter((l) => l !== 'lfc setup: compiling TypeScript…');
    expect(out).toHaveLength(1);
    expect(out[0]).toMatch(
      /^lfc setup: the native runtime .* need Debian packages that are not installed: .*Install them with: sudo sh -c 'apt-get update && apt-get install -y --no-install-recommends .*libgloo-dev'$/,
    );
    expect(calls().some((l) => l.startsWith('apt-get') || l.startsWith('cmake'))).toBe(false);
  });
});

describe('the TypeScript build', () => {
  it('is stale when any file tsc compiled changed, whichever folder it is in', () => {
    const ctx = context(options());
    expect(buildIsStale(ctx)).toBe(false);
    const later = new Date(Date.now() + 5000);
    utimesSync(join(checkout, 'viz/page.ts'), later, later);
    expect(buildIsStale(ctx)).toBe(true);
  });

  it('is stale without a record of its sources', () => {
    writeFileSync(join(checkout, 'dist/.tsbuildinfo'), 'not json');
    expect(buildIsStale(context(options()))).toBe(true);
  });
});
