// lfc's one setup path: whatever a command needs, installed on first use, so the quick start works
// on a fresh Debian machine with Node 20. Plain Node, no npm dependencies (it runs before npm ci).
//
//   setupFor('lfc demo')        the steps of a command (COMMANDS), in order
//   PACKAGES                    the Debian packages, one row per feature
//
// The steps: npm packages (npm ci), the TypeScript build (dist/), the Debian packages of the
// command's features (apt-get as root; otherwise the one command to run is printed), the native
// runtime (cmake) and the C++ kernel checks (cmake). Every step is a no-op when its output is
// current. A failed step throws SetupError: one line naming the step and what to do; the callers
// (bin/lfc.js, scripts/ensure-setup.mjs, the benches) print it and exit 1, the code of an
// environment failure (a user error of the CLI is 2).
//
// Seams for tests and for users: LFC_NO_INSTALL=1 prints the install command instead of running
// it; LFC_SETUP_UID stands in for the process's uid (0: root); every tool is found on PATH
// (dpkg-query, dpkg, apt-get, cmake, npm), so a test can put recording stand-ins first.
import { spawnSync } from 'node:child_process';
import {
  closeSync,
  existsSync,
  openSync,
  mkdirSync,
  readFileSync,
  readdirSync,
  rmSync,
  statSync,
  utimesSync,
  writeFileSync,
} from 'node:fs';
import { availableParallelism } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

export const root = dirname(dirname(fileURLToPath(import.meta.url)));

/** The Debian packages lfc installs, by feature. A feature that needs a package adds a row. */
export const PACKAGES = {
  native: {
    for: 'the native runtime and the C++ kernel checks',
    packages: ['cmake', 'g++', 'make', 'libopenblas-dev', 'nlohmann-json3-dev', 'libgloo-dev'],
  },
  browser: {
    for: 'the tests of lfc viz (headless Chromium)',
    packages: ['chromium'],
  },
  mpi: {
    for: "bench/collectives' yardstick (OpenMPI)",
    packages: ['libopenmpi-dev', 'openmpi-bin'],
  },
  torch: {
    for: "bench/step's yardstick (PyTorch, run with /usr/bin/python3)",
    packages: ['python3-torch'],
  },
};

/** What each command sets up, in order. */
export const COMMANDS = {
  lfc: ['npm', 'tsc'],
  'lfc run': ['npm', 'tsc', 'packages:native', 'native'],
  'lfc demo': ['npm', 'tsc', 'packages:native', 'native'],
  'lfc calibrate': ['npm', 'tsc', 'packages:native', 'native'],
  'lfc viz': ['npm', 'tsc', 'viz-app'],
  'npm test': ['npm', 'tsc', 'viz-app', 'packages:native,browser', 'native', 'kernel-check'],
  // the benches run from source (tsx); each names its command here
  'bench native': ['npm', 'packages:native', 'native'],
  'bench collectives': ['npm', 'packages:native,mpi', 'native'],
  'bench step': ['npm', 'packages:native,torch', 'native'],
  'bench viz': ['npm', 'tsc', 'viz-app', 'packages:browser'],
};

/** The entry of COMMANDS for the argv of `lfc` (without node and the script): help needs no build. */
export function setupCommandOf(argv) {
  const [command, ...rest] = argv;
  const helpOnly = rest.some((a) => a === '--help' || a === '-h');
  return COMMANDS[`lfc ${command}`] && !helpOnly ? `lfc ${command}` : 'lfc';
}

/** A setup step that failed: its message is the one line the user sees. */
export class SetupError extends Error {
  constructor(message) {
    super(message);
    this.name = 'SetupError';
  }
}

/**
 * The context a setup runs in. Tests pass another root, env (PATH with stand-ins) or uid.
 * @param {{root?: string, env?: NodeJS.ProcessEnv, uid?: number,
 *          log?: (line: string) => void, lockPollMs?: number, lockTimeoutMs?: number}} [o]
 */
export function context(o = {}) {
  const env = o.env ?? process.env;
  const uidOverride = env.LFC_SETUP_UID;
  return {
    root: o.root ?? root,
    env,
    uid: o.uid ?? (uidOverride !== undefined ? Number(uidOverride) : (process.getuid?.() ?? 0)),
    log: o.log ?? ((line) => process.stderr.write(`lfc setup: ${line}\n`)),
    lockPollMs: o.lockPollMs ?? 5000,
    lockTimeoutMs: o.lockTimeoutMs ?? Number(env.LFC_APT_LOCK_TIMEOUT ?? 1200) * 1000,
  };
}

/** Runs the setup of one command of COMMANDS. */
export function setupFor(command, options) {
  const steps = COMMANDS[command];
  if (!steps) throw new Error(`no setup for '${command}' (COMMANDS: ${Object.keys(COMMANDS)})`);
  const ctx = context(options);
  for (const step of steps) {
    if (step === 'npm') ensureDeps(ctx);
    else if (step === 'tsc') ensureBuilt(ctx);
    else if (step === 'viz-app') ensureVizApp(ctx);
    else if (step === 'native') ensureNative(ctx);
    else if (step === 'kernel-check') ensureKernelCheck(ctx);
    else if (step.startsWith('packages:')) ensurePackages(step.slice(9).split(','), ctx);
    else throw new Error(`unknown setup step ${step}`);
  }
}

/**
 * What the entry points do around a setup: a SetupError (or a tool that cannot start) prints its
 * line and exits 1, without a stack trace.
 */
export function setupOrExit(command, options) {
  try {
    setupFor(command, options);
  } catch (e) {
    const message = e instanceof Error ? e.message.split('\n')[0] : String(e);
    process.stderr.write(`lfc setup: ${message}\n`);
    process.exit(1);
  }
}

// ---- running tools ------------------------------------------------------------------------------

/**
 * Runs a tool found on ctx's PATH. stdout: 'inherit' (the terminal), 'pipe' (returned) or a file
 * descriptor (a build log); stderr to the terminal unless captured.
 */
function tool(ctx, cmd, args, { stdout = 'inherit', capture = false, env = {} } = {}) {
  const r = spawnSync(cmd, args, {
    cwd: ctx.root,
    env: { ...ctx.env, ...env },
    stdio: ['ignore', capture ? 'pipe' : stdout, capture ? 'pipe' : 'inherit'],
    encoding: 'utf8',
    maxBuffer: 64 * 2 ** 20,
  });
  if (r.error) {
    const why = r.error.code === 'ENOENT' ? 'not found on PATH' : r.error.message;
    throw new SetupError(`${cmd} ${why}`);
  }
  return r;
}

function failed(step, cmd, r, todo) {
  const how = r.status === null ? `was killed (${r.signal})` : `exited with code ${r.status}`;
  return new SetupError(`${step} failed: ${cmd} ${how}; ${todo}`);
}

// ---- npm packages and the TypeScript build --------------------------------------------------

export function ensureDeps(ctx = context()) {
  const marker = join(ctx.root, 'node_modules', '.package-lock.json');
  const lock = join(ctx.root, 'package-lock.json');
  if (existsSync(marker) && statSync(marker).mtimeMs >= statSync(lock).mtimeMs) return;
  ctx.log('installing npm packages (npm ci)…');
  const r = tool(ctx, 'npm', ['ci', '--no-audit', '--no-fund']);
  if (r.status !== 0)
    throw failed('installing npm packages', 'npm ci', r, 'its output is above; run it again');
}

/**
 * The sources of the last build, as tsc recorded them in dist/.tsbuildinfo: every file it
 * compiled, in whichever folder (ir/, viz/, a new cli/…), so the check cannot drift from the
 * build. Undefined when there is no usable record.
 */
function builtSources(ctx) {
  const info = join(ctx.root, 'dist', '.tsbuildinfo');
  if (!existsSync(info)) return undefined;
  try {
    const names = JSON.parse(readFileSync(info, 'utf8')).fileNames;
    if (!Array.isArray(names)) return undefined;
    return names
      .map((n) => resolve(dirname(info), n))
      .filter((p) => !p.includes(`${join(ctx.root, 'node_modules')}`));
  } catch {
    return undefined;
  }
}

/** Whether dist/ is older than any source it was built from, or than the build's configuration. */
export function buildIsStale(ctx = context()) {
  const info = join(ctx.root, 'dist', '.tsbuildinfo');
  const sources = builtSources(ctx);
  if (!sources || !existsSync(join(ctx.root, 'dist/cli/main.js'))) return true;
  const built = statSync(info).mtimeMs;
  const inputs = [...sources, 'tsconfig.json', 'tsconfig.build.json', 'package-lock.json'];
  for (const f of inputs) {
    const p = resolve(ctx.root, f);
    if (!existsSync(p) || statSync(p).mtimeMs > built) return true;
  }
  return false;
}

export function ensureBuilt(ctx = context()) {
  if (!buildIsStale(ctx)) return;
  ctx.log('compiling TypeScript…');
  const tsc = join(ctx.root, 'node_modules/typescript/bin/tsc');
  const r = tool(ctx, process.execPath, [tsc, '-p', join(ctx.root, 'tsconfig.build.json')]);
  if (r.status !== 0)
    throw failed('compiling TypeScript', 'tsc', r, "the compiler's errors are above");
}

// ---- the viz app (vite) ------------------------------------------------------------------------

/** What the viz app (dist/viz-app) is built from: its sources, its build config, the packages. */
const VIZ_APP_INPUTS = ['viz/app', 'viz/model.ts', 'viz/vite.config.ts', 'package-lock.json'];

/** the newest modification time under `path` (a file, or a folder's files at any depth) */
function newestMtime(path) {
  if (!existsSync(path)) return Infinity;
  const st = statSync(path);
  if (!st.isDirectory()) return st.mtimeMs;
  return readdirSync(path).reduce((m, name) => Math.max(m, newestMtime(join(path, name))), 0);
}

/** Whether dist/viz-app is missing or older than any of its inputs. */
export function vizAppIsStale(ctx = context()) {
  const built = join(ctx.root, 'dist', 'viz-app', 'index.html');
  if (!existsSync(built)) return true;
  const at = statSync(built).mtimeMs;
  return VIZ_APP_INPUTS.some((p) => newestMtime(join(ctx.root, p)) > at);
}

export function ensureVizApp(ctx = context()) {
  if (!vizAppIsStale(ctx)) return;
  ctx.log('building the viz app (vite)…');
  const vite = join(ctx.root, 'node_modules/vite/bin/vite.js');
  const r = tool(ctx, process.execPath, [vite, 'build', '--config', 'viz/vite.config.ts']);
  if (r.status !== 0)
    throw failed('building the viz app', 'vite build', r, "vite's errors are above");
}

// ---- Debian packages --------------------------------------------------------------------------

/** The packages of `features` that dpkg does not report installed (none on a non-Debian system). */
export function missingPackages(features, ctx = context()) {
  const wanted = [...new Set(features.flatMap((f) => featureRow(f).packages))];
  const r = spawnSync('dpkg-query', ['-W', '-f=${Package} ${Status}\\n', ...wanted], {
    env: ctx.env,
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  if (r.error) return []; // no dpkg: not Debian; the build says what is missing
  const ok = new Set(
    r.stdout
      .split('\n')
      .filter((l) => l.endsWith(' install ok installed'))
      .map((l) => l.split(' ')[0]),
  );
  return wanted.filter((p) => !ok.has(p));
}

function featureRow(feature) {
  const row = PACKAGES[feature];
  if (!row) throw new Error(`no package row for feature '${feature}'`);
  return row;
}

/** Installs the missing packages of `features` as root; otherwise names the command to run. */
export function ensurePackages(features, ctx = context()) {
  const missing = missingPackages(features, ctx);
  if (!missing.length) return;
  const what = features
    .filter((f) => featureRow(f).packages.some((p) => missing.includes(p)))
    .map((f) => featureRow(f).for)
    .join(', and ');
  const install = `apt-get install -y --no-install-recommends ${missing.join(' ')}`;
  if (ctx.env.LFC_NO_INSTALL === '1')
    throw new SetupError(
      `${what} need Debian packages that are not installed ` +
        `(LFC_NO_INSTALL=1, so not installing): run apt-get update && ${install}`,
    );
  if (ctx.uid !== 0)
    throw new SetupError(
      `${what} need Debian packages that are not installed: ${missing.join(', ')}. ` +
        `Install them with: sudo sh -c 'apt-get update && ${install}'`,
    );
  ctx.log(`installing ${missing.join(' ')} for ${what} (apt-get)…`);
  const started = Date.now();
  apt(ctx, ['update', '-qq']);
  apt(ctx, ['install', '-y', '-qq', '--no-install-recommends', ...missing]);
  const still = missingPackages(features, ctx);
  if (still.length)
    throw new SetupError(
      `installing Debian packages failed: apt-get reported success but ${still.join(', ')} ` +
        'still not installed',
    );
  ctx.log(`installed ${missing.length} packages in ${Math.round((Date.now() - started) / 1000)} s`);
}

const LOCKED = /Could not get lock|Unable to acquire the dpkg frontend lock|Unable to lock/;
const INTERRUPTED = /dpkg was interrupted/;

/**
 * One apt-get call that waits for the apt/dpkg lock (another apt-get, unattended-upgrades) rather
 * than failing on it, and finishes an interrupted dpkg run (dpkg --configure -a) once.
 */
function apt(ctx, args) {
  const env = { DEBIAN_FRONTEND: 'noninteractive' };
  const deadline = Date.now() + ctx.lockTimeoutMs;
  let said = false;
  let repaired = false;
  for (;;) {
    const r = tool(ctx, 'apt-get', ['-o', 'DPkg::Lock::Timeout=60', ...args], {
      capture: true,
      env,
    });
    if (r.status === 0) return;
    const err = r.stderr ?? '';
    if (LOCKED.test(err) && Date.now() < deadline) {
      if (!said) ctx.log('waiting for the apt/dpkg lock (another package manager is running)…');
      said = true;
      sleep(ctx.lockPollMs);
      continue;
    }
    if (INTERRUPTED.test(err) && !repaired) {
      ctx.log('finishing an interrupted dpkg run (dpkg --configure -a)…');
      repaired = true;
      const d = tool(ctx, 'dpkg', ['--configure', '-a'], { capture: true, env });
      if (d.status === 0) continue;
    }
    process.stderr.write(err);
    const todo = LOCKED.test(err)
      ? `the apt/dpkg lock stayed held for ${Math.round(ctx.lockTimeoutMs / 1000)} s; run it again when the other package manager is done`
      : "apt-get's message is above";
    throw failed('installing Debian packages', `apt-get ${args[0]}`, r, todo);
  }
}

function sleep(ms) {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
}

// ---- the native builds (cmake) -------------------------------------------------------------

const STAMP = 'lfc-configured';

/** The build file a configured directory's generator writes (CMakeCache.txt: CMAKE_GENERATOR). */
function generatorFile(cache) {
  const generator = /^CMAKE_GENERATOR:INTERNAL=(.*)$/m.exec(readFileSync(cache, 'utf8'))?.[1];
  if (generator === undefined) return undefined;
  return generator.startsWith('Ninja') ? 'build.ninja' : 'Makefile';
}

/**
 * Whether `dir` holds a configure that finished: ours writes STAMP after cmake succeeds, so an
 * interrupted or failed configure (a CMakeCache.txt but no build file, or no stamp) is not one.
 */
export function configured(dir) {
  const cache = join(dir, 'CMakeCache.txt');
  if (!existsSync(join(dir, STAMP)) || !existsSync(cache)) return false;
  const file = generatorFile(cache);
  return file !== undefined && existsSync(join(dir, file));
}

/** Removes what a configure writes in `dir` (not the other builds nested under it). */
function resetConfigure(dir) {
  for (const name of [STAMP, 'CMakeCache.txt', 'CMakeFiles', 'build.ninja', 'Makefile'])
    rmSync(join(dir, name), { recursive: true, force: true });
}

/**
 * Configures (when needed) and builds one cmake project; `label` names it in messages. The tools'
 * stdout goes to BUILD/lfc-setup.log, their warnings and errors to the terminal.
 */
function cmakeBuild(ctx, { source, build, target, label, what }) {
  const dir = join(ctx.root, build);
  const fresh = !configured(dir);
  if (fresh) {
    if (existsSync(join(dir, 'CMakeCache.txt')))
      ctx.log(`${build} holds an unfinished configure; configuring it again`);
    resetConfigure(dir);
  }
  mkdirSync(dir, { recursive: true });
  const logFile = join(build, 'lfc-setup.log');
  const log = openSync(join(ctx.root, logFile), 'w');
  try {
    if (fresh) {
      ctx.log(`configuring ${label} (cmake)…`);
      const args = ['-S', source, '-B', build, '-DCMAKE_BUILD_TYPE=Release'];
      const r = tool(ctx, 'cmake', args, { stdout: log });
      if (r.status !== 0)
        throw failed(
          `configuring ${label}`,
          'cmake',
          r,
          `its message is above and its log in ${logFile} (${what}); the configure is redone on the next try`,
        );
      writeFileSync(join(dir, STAMP), `cmake ${args.join(' ')}\n`);
    }
    ctx.log(`building ${label} (cmake --build; a few minutes on 2 cores the first time)…`);
    const started = Date.now();
    const jobs = String(availableParallelism());
    const r = tool(ctx, 'cmake', ['--build', build, '--parallel', jobs], { stdout: log });
    if (r.status !== 0)
      throw failed(
        `building ${label}`,
        `cmake --build ${build}`,
        r,
        `the compiler's errors are above and the whole log in ${logFile}`,
      );
    const made = join(ctx.root, target);
    if (!existsSync(made))
      throw new SetupError(`building ${label} failed: the build made no ${target}`);
    // current against every native file, built or not (a README edit must not rebuild each time)
    const now = new Date();
    utimesSync(made, now, now);
    if (fresh || Date.now() - started > 2000)
      ctx.log(`built ${label} in ${Math.round((Date.now() - started) / 1000)} s`);
  } finally {
    closeSync(log);
  }
}

/** Whether any file under `dir` (but the folders in `skip`) is newer than `t`. */
function newerThan(dir, t, skip) {
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, entry.name);
    if (entry.isDirectory() ? !skip.has(p) && newerThan(p, t, skip) : statSync(p).mtimeMs > t)
      return true;
  }
  return false;
}

/** Whether `target` exists, its build directory is configured and no native source is newer. */
function upToDate(ctx, build, target) {
  const file = join(ctx.root, target);
  if (!existsSync(file) || !configured(join(ctx.root, build))) return false;
  const native = join(ctx.root, 'runtime-native');
  return !newerThan(native, statSync(file).mtimeMs, new Set([join(native, 'build')]));
}

export const NATIVE_ADDON = 'runtime-native/build/Release/lfc_native.node';
const NATIVE_NEEDS = `it needs ${PACKAGES.native.packages.join(', ')} and npm ci's node-api-headers`;

/** The native runtime addon (runtime-native/build/Release/lfc_native.node). */
export function ensureNative(ctx = context()) {
  const build = 'runtime-native/build';
  if (upToDate(ctx, build, NATIVE_ADDON)) return;
  const label = 'the native runtime';
  cmakeBuild(ctx, {
    source: 'runtime-native',
    build,
    target: NATIVE_ADDON,
    label,
    what: NATIVE_NEEDS,
  });
}

export const KERNEL_CHECK = 'runtime-native/build/kernel-test/kernel_check';

/** The C++ kernel checks (runtime-native/test → runtime-native/build/kernel-test/kernel_check). */
export function ensureKernelCheck(ctx = context()) {
  const build = 'runtime-native/build/kernel-test';
  if (upToDate(ctx, build, KERNEL_CHECK)) return;
  const what = `they need ${PACKAGES.native.packages.join(', ')}`;
  const label = 'the C++ kernel checks';
  cmakeBuild(ctx, { source: 'runtime-native/test', build, target: KERNEL_CHECK, label, what });
}

// `node scripts/setup.mjs [COMMAND]`: the setup of one command (default: npm test's)
if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url))
  setupOrExit(process.argv[2] ?? 'npm test');
