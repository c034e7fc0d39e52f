// Worker threads from a module beside the caller, whether this checkout runs compiled (dist/,
// .js) or from source through tsx (.ts: the tests, the benches). tsx's loader does not reach a
// worker thread by --import, so from source the worker registers it first, then imports its
// entry.

import { createRequire } from 'node:module';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { Worker } from 'node:worker_threads';

/**
 * A worker running `entry` (a file name without extension, beside `callerUrl`: the caller's
 * import.meta.url) with `workerData`.
 */
export function spawnWorker(callerUrl: string, entry: string, workerData: unknown): Worker {
  const here = fileURLToPath(callerUrl);
  if (!here.endsWith('.ts')) return new Worker(new URL(`./${entry}.js`, callerUrl), { workerData });
  const api = createRequire(callerUrl)
    .resolve('tsx/esm/api')
    .replace(/index\.cjs$/, 'index.mjs');
  const url = new URL(`./${entry}.ts`, callerUrl).href;
  const boot =
    `import(${JSON.stringify(pathToFileURL(api).href)})` +
    `.then((m) => { m.register(); return import(${JSON.stringify(url)}); })`;
  return new Worker(boot, { eval: true, workerData });
}
