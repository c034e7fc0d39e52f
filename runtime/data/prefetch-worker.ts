// The data worker (prefetch.ts): opens a DataLoader with the options it is given, says ready, then
// answers requests in order: the next step's data (arrays transferred), a seek, the counts.

import { setPriority } from 'node:os';
import { parentPort, workerData } from 'node:worker_threads';
import { UserError } from '../../compiler/errors.js';
import { loadNative } from '../native.js';
import { DataLoader } from './loader.js';
import {
  transferables,
  type WorkerLoaderOptions,
  type WorkerReply,
  type WorkerRequest,
} from './prefetch.js';

const port = parentPort!;
const send = (r: WorkerReply, transfer: ArrayBuffer[] = []) => port.postMessage(r, transfer);
const failed = (e: unknown): WorkerReply => ({
  kind: 'error',
  user: e instanceof UserError,
  message: e instanceof UserError ? e.message : ((e as Error).stack ?? String(e)),
});

/**
 * The worker's nice value (Linux's is per thread: this one alone), 0 unless LFC_DATA_WORKER_NICE
 * says otherwise. A lower priority was meant to let the step's kernel threads take a core back
 * from the worker sooner; bench/data.ts measured the step no faster at nice 10 than at 0 on this
 * machine (data − preloaded 11.8% and 10.9% of the step at 10, 3.1% at 0, rounds spread ±20-40%),
 * and a worker that waits behind other processes delays a step that waits on its data.
 */
export const DATA_WORKER_NICE = 0;

async function main(): Promise<void> {
  // LFC_DATA_WORKER_NICE=0 … 19 replaces it (docs/data.md)
  const nice = Number(process.env.LFC_DATA_WORKER_NICE ?? DATA_WORKER_NICE);
  try {
    if (Number.isInteger(nice) && nice >= 0 && nice <= 19) setPriority(nice);
  } catch {
    // not permitted here: the worker runs at the process's priority
  }
  const { options } = workerData as { options: WorkerLoaderOptions };
  let loader: DataLoader;
  try {
    const native = options.rope ? loadNative() : undefined;
    loader = await DataLoader.open({
      ...options,
      encodes: (slot) => options.encodes[slot] ?? false,
      ...(native ? { ropeIndex: native.ropeIndex.bind(native) } : {}),
    });
  } catch (e) {
    send(failed(e));
    return;
  }
  send({
    kind: 'ready',
    ready: {
      ...(loader.tokenizer.image ? { image: loader.tokenizer.image } : {}),
      vocabSize: loader.tokenizer.vocabSize,
      epochSamples: loader.epochSamples,
    },
  });
  // one request at a time, in order
  let queue = Promise.resolve();
  port.on('message', (q: WorkerRequest) => {
    queue = queue.then(async () => {
      try {
        if (q.kind === 'next') {
          const step = await loader.nextStep({ decodeAll: q.decodeAll });
          send({ kind: 'step', step }, transferables(step));
        } else if (q.kind === 'seek') {
          loader.seek(q.position);
          send({ kind: 'done' });
        } else send({ kind: 'counts', counts: loader.counts });
      } catch (e) {
        send(failed(e));
      }
    });
  });
}

void main();
