// Sets up what lfc needs on first use, so the quick-start commands work on a fresh machine:
// npm packages (npm ci), the TypeScript build (dist/). Plain Node, no dependencies.
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync, statSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

export const root = dirname(dirname(fileURLToPath(import.meta.url)));

function newestMtime(dir, exts = ['.ts']) {
  let newest = 0;
  if (!existsSync(dir)) return 0;
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, entry.name);
    if (entry.isDirectory()) newest = Math.max(newest, newestMtime(p, exts));
    else if (exts.some((e) => entry.name.endsWith(e)))
      newest = Math.max(newest, statSync(p).mtimeMs);
  }
  return newest;
}

function say(quiet, text) {
  if (!quiet) process.stderr.write(`lfc setup: ${text}\n`);
}

export function ensureDeps({ quiet = false } = {}) {
  const marker = join(root, 'node_modules', '.package-lock.json');
  const lock = join(root, 'package-lock.json');
  if (existsSync(marker) && statSync(marker).mtimeMs >= statSync(lock).mtimeMs) return;
  process.stderr.write('lfc setup: installing npm packages (npm ci)…\n');
  execFileSync('npm', ['ci', '--no-audit', '--no-fund'], {
    cwd: root,
    stdio: ['ignore', 'inherit', 'inherit'],
  });
  say(quiet, 'npm packages installed');
}

export async function ensureBuilt({ quiet = false } = {}) {
  ensureDeps({ quiet });
  const info = join(root, 'dist', '.tsbuildinfo');
  const sources = Math.max(
    ...['ir', 'passes', 'compiler', 'runtime'].map((d) => newestMtime(join(root, d))),
  );
  if (
    existsSync(info) &&
    statSync(info).mtimeMs >= sources &&
    existsSync(join(root, 'dist/compiler/cli/main.js'))
  )
    return;
  process.stderr.write('lfc setup: compiling TypeScript…\n');
  execFileSync(
    process.execPath,
    [join(root, 'node_modules/typescript/bin/tsc'), '-p', join(root, 'tsconfig.build.json')],
    {
      cwd: root,
      stdio: ['ignore', 'inherit', 'inherit'],
    },
  );
}

/** Debian packages the native runtime and its checks build against. */
export const SYSTEM_PACKAGES = [
  'cmake',
  'g++',
  'make',
  'libopenblas-dev',
  'nlohmann-json3-dev',
  'libgloo-dev',
];

function installed(pkg) {
  try {
    const status = execFileSync('dpkg-query', ['-W', '-f=${Status}', pkg], {
      stdio: ['ignore', 'pipe', 'ignore'],
    });
    return status.toString().includes('install ok installed');
  } catch {
    return false;
  }
}

function missingPackages() {
  return SYSTEM_PACKAGES.filter((p) => !installed(p));
}

/** Installs the missing Debian packages when running as root; otherwise says how. */
export function ensureSystemPackages() {
  const missing = missingPackages();
  if (!missing.length) return;
  const cmd = `apt-get update && apt-get install -y --no-install-recommends ${missing.join(' ')}`;
  if (process.getuid?.() !== 0) {
    throw new Error(
      `lfc needs these Debian packages: ${missing.join(', ')}. Install them with: sudo sh -c '${cmd}'`,
    );
  }
  process.stderr.write(`lfc setup: installing ${missing.join(', ')} (apt-get)…\n`);
  const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' };
  execFileSync('apt-get', ['update', '-qq'], { stdio: ['ignore', 'ignore', 'inherit'], env });
  execFileSync('apt-get', ['install', '-y', '-qq', '--no-install-recommends', ...missing], {
    stdio: ['ignore', 'ignore', 'inherit'],
    env,
  });
}

function run(cmd, args, quiet) {
  execFileSync(cmd, args, {
    cwd: root,
    stdio: ['ignore', quiet ? 'ignore' : 'inherit', 'inherit'],
  });
}

/** The C++ kernel checks (runtime-native/test): configured once, rebuilt when sources change. */
export function ensureKernelCheck({ quiet = false } = {}) {
  ensureSystemPackages();
  const dir = join(root, 'runtime-native/build/kernel-test');
  if (!existsSync(join(dir, 'CMakeCache.txt'))) {
    process.stderr.write('lfc setup: configuring the C++ kernel checks (cmake)…\n');
    run(
      'cmake',
      [
        '-S',
        'runtime-native/test',
        '-B',
        'runtime-native/build/kernel-test',
        '-DCMAKE_BUILD_TYPE=Release',
      ],
      true,
    );
  }
  run('cmake', ['--build', 'runtime-native/build/kernel-test', '-j2'], quiet);
}

/** The native runtime addon (runtime-native/build/Release/lfc_native.node), built by cmake-js. */
export function ensureNative({ quiet = false } = {}) {
  const addon = join(root, 'runtime-native/build/Release/lfc_native.node');
  if (!existsSync(addon))
    process.stderr.write('lfc setup: building the native runtime (cmake-js, a minute or two)…\n');
  // cmake-js build is incremental: a no-op when nothing changed
  run(
    process.execPath,
    [
      join(root, 'node_modules/cmake-js/bin/cmake-js'),
      'build',
      '-d',
      'runtime-native',
      '-l',
      'error',
    ],
    quiet || existsSync(addon),
  );
}
