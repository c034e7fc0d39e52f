// The loader in a worker thread: a rank's next steps are read, tokenized, decoded and packed
// there while the native runtime runs the step on its own threads, so loading overlaps the step.
// The worker (prefetch-worker.ts) owns a DataLoader (loader.ts); this side sends it requests in
// order and gets each step's microbatches back with their arrays transferred, not copied.
// Errors come back as one line: a UserError (bad data under --strict-data, a bad tokenizer) stays
// one, anything else keeps its stack.

import type { Worker } from 'node:worker_threads';
import { UserError } from '../../compiler/errors.js';
import { spawnWorker } from '../../compiler/threads.js';
import type { DataCounts, LoaderOptions, StepData } from './loader.js';
import type { ImagePlaceholder } from './tokenizer.js';

/** The loader's options as the worker takes them: plain data (no functions). */
export type WorkerLoaderOptions = Omit<LoaderOptions, 'encodes' | 'ropeIndex' | 'observe'> & {
  /** slot j: whether this rank encodes its images */
  readonly encodes: readonly boolean[];
  /** M-RoPE position ids (the worker loads the native addon for ropeIndex) */
  readonly rope: boolean;
};

/** What the worker says once its loader is open. */
export interface WorkerReady {
  readonly image?: ImagePlaceholder;
  readonly vocabSize: number;
  readonly epochSamples: number;
}

export type WorkerRequest =
  | { readonly kind: 'next'; readonly decodeAll: boolean }
  | { readonly kind: 'seek'; readonly position: number }
  | { readonly kind: 'counts' };

export type WorkerReply =
  | { readonly kind: 'ready'; readonly ready: WorkerReady }
  | { readonly kind: 'step'; readonly step: StepData }
  | { readonly kind: 'counts'; readonly counts: DataCounts }
  | { readonly kind: 'done' }
  | { readonly kind: 'error'; readonly user: boolean; readonly message: string };

/** The worker's entry (prefetch-worker.ts). */
const spawn = (options: WorkerLoaderOptions): Worker =>
  spawnWorker(import.meta.url, 'prefetch-worker', { options });

export class PrefetchingLoader {
  private replies: ((r: WorkerReply) => void)[] = [];
  private failure: Error | undefined;

  private constructor(
    private readonly worker: Worker,
    readonly ready: WorkerReady,
  ) {}

  static async open(options: WorkerLoaderOptions): Promise<PrefetchingLoader> {
    const worker = spawn(options);
    const first = await new Promise<WorkerReply>((resolve, reject) => {
      worker.once('message', resolve);
      worker.once('error', reject);
    });
    if (first.kind === 'error') {
      await worker.terminate();
      throw first.user ? new UserError(first.message) : new Error(first.message);
    }
    if (first.kind !== 'ready') throw new Error(`the data worker began with '${first.kind}'`);
    // an idle worker does not keep the process alive (a run that fails leaves without close())
    worker.unref();
    const loader = new PrefetchingLoader(worker, first.ready);
    worker.on('message', (r: WorkerReply) => loader.replies.shift()?.(r));
    worker.on('error', (e) => {
      loader.failure = e;
      for (const pending of loader.replies.splice(0))
        pending({ kind: 'error', user: false, message: e.stack ?? e.message });
    });
    return loader;
  }

  get image(): ImagePlaceholder | undefined {
    return this.ready.image;
  }

  /** Requests are answered in the order they are sent. */
  private request(q: WorkerRequest): Promise<WorkerReply> {
    if (this.failure) return Promise.reject(this.failure);
    return new Promise((resolve, reject) => {
      this.replies.push((r) =>
        r.kind === 'error'
          ? reject(r.user ? new UserError(r.message) : new Error(`data worker: ${r.message}`))
          : resolve(r),
      );
      this.worker.postMessage(q);
    });
  }

  async seek(position: number): Promise<void> {
    await this.request({ kind: 'seek', position });
  }

  async nextStep(opts: { decodeAll?: boolean } = {}): Promise<StepData> {
    const r = await this.request({ kind: 'next', decodeAll: !!opts.decodeAll });
    if (r.kind !== 'step') throw new Error(`the data worker answered '${r.kind}' to next`);
    return r.step;
  }

  async counts(): Promise<DataCounts> {
    const r = await this.request({ kind: 'counts' });
    if (r.kind !== 'counts') throw new Error(`the data worker answered '${r.kind}' to counts`);
    return r.counts;
  }

  async close(): Promise<void> {
    await this.worker.terminate();
  }
}

/** The buffers of a step's arrays, to transfer rather than copy. */
export function transferables(step: StepData): ArrayBuffer[] {
  const out = new Set<ArrayBuffer>();
  const add = (a: ArrayBufferView | undefined) => {
    if (a && a.buffer instanceof ArrayBuffer && a.byteLength) out.add(a.buffer);
  };
  for (const mb of step.microbatches) {
    for (const a of [
      mb.tokens,
      mb.labels,
      mb.lossMask,
      mb.positions,
      mb.segments,
      mb.pixelValues,
      mb.grids,
      mb.captionMask,
    ])
      add(a);
    for (const im of mb.images) add(im.pixels);
  }
  return [...out];
}
