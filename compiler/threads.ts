// Worker threads from a module beside the caller, whether this checkout runs compiled (dist/,
// .js) or from source through tsx (.ts: the tests, the benches). tsx's loader does not reach a
// worker thread by --import, so from source the worker registers it first, then imports its
// entry.

import { createRequire } from 'node:module';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { Worker, type ResourceLimits } from 'node:worker_threads';

/**
 * The young generation of a worker: 192 MiB, V8's semi-spaces at 64 MiB against the default 16.
 * A worker's work (a search's compiles and estimates) makes many short-lived objects; with the
 * default, scavenges took a quarter of lfc tune's time. Item 3's search on one worker took 57.4 s
 * with node's --max-semi-space-size=64 against 75.7 s without (docs/benchmarks.md).
 */
const LIMITS: ResourceLimits = { maxYoungGenerationSizeMb: 192 };

/**
 * A worker running `entry` (a file name without extension, beside `callerUrl`: the caller's
 * import.meta.url) with `workerData`.
 */
export function spawnWorker(callerUrl: string, entry: string, workerData: unknown): Worker {
  const here = fileURLToPath(callerUrl);
  if (!here.endsWith('.ts'))
    return new Worker(new URL(`./${entry}.js`, callerUrl), { workerData, resourceLimits: LIMITS });
  const api = createRequire(callerUrl)
    .resolve('tsx/esm/api')
    .replace(/index\.cjs$/, 'index.mjs');
  const url = new URL(`./${entry}.ts`, callerUrl).href;
  const boot =
    `import(${JSON.stringify(pathToFileURL(api).href)})` +
    `.then((m) => { m.register(); return import(${JSON.stringify(url)}); })`;
  return new Worker(boot, { eval: true, workerData, resourceLimits: LIMITS });
}
