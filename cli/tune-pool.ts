// lfc tune's work on worker threads: each worker rebuilds the search's pricing request from its
// plain description (TuneSpec) and runs a LocalPricer (compiler/tune/search.ts); the pool hands
// out the layouts and puts each outcome back where it was asked, so the search sees the same
// answers in the same order whatever the number of workers. Estimates go out as one part per
// worker, the same worker's share each time (its cached reduced models serve it); compiles go out
// one at a time to whichever worker is free.

import { availableParallelism } from 'node:os';
import type { Worker } from 'node:worker_threads';
import { loadModelConfig } from '../compiler/frontend/config.js';
import { resolvePrecision } from '../compiler/frontend/precision.js';
import { spawnWorker } from '../compiler/threads.js';
import type { Estimate } from '../compiler/tune/estimate.js';
import type {
  EstimateOutcome,
  PriceMode,
  PriceOutcome,
  Pricer,
  PricingRequest,
} from '../compiler/tune/search.js';
import type { Layout } from '../compiler/tune/space.js';
import { parseCompileArgs } from './compile.js';
import { deviceMemoryOf } from '../compiler/report/memory.js';

/** What a worker rebuilds the pricing request from: plain data. */
export interface TuneSpec {
  readonly model: string;
  readonly overrides: readonly string[];
  /** the `lfc compile` arguments every layout shares (model and overrides first) */
  readonly base: readonly string[];
  readonly bf16: boolean;
  readonly nnodes: number;
  readonly nprocPerNode: number;
  readonly globalBatchSize: number;
  readonly fit: 'bound' | 'expected';
}

export function pricingRequestOf(s: TuneSpec): PricingRequest {
  const baseOptions = parseCompileArgs([...s.base]).options;
  // the base line names the profile (--hardware, and --attention-kernel where given)
  const hardware = baseOptions.hardware!;
  return {
    space: {
      config: loadModelConfig(s.model, [...s.overrides]),
      nnodes: s.nnodes,
      nprocPerNode: s.nprocPerNode,
      globalBatchSize: s.globalBatchSize,
    },
    baseOptions,
    hardware,
    device: deviceMemoryOf(hardware),
    precision: resolvePrecision({ bf16: s.bf16 }),
    fit: s.fit,
  };
}

/** the default: a worker per core, at most 8 (each holds a compile of its own in memory) */
export const defaultWorkers = (): number => Math.min(8, availableParallelism());

export type PoolRequest =
  | { readonly id: number; readonly kind: 'estimate'; readonly layouts: readonly Layout[] }
  | {
      readonly id: number;
      readonly kind: 'price';
      readonly layout: Layout;
      readonly estimate: Estimate;
      readonly mode: PriceMode;
    };

export type PoolReply =
  | {
      readonly id: number;
      readonly kind: 'estimate';
      readonly outcomes: EstimateOutcome[];
      readonly graphs: number;
    }
  | {
      readonly id: number;
      readonly kind: 'price';
      readonly outcome: PriceOutcome;
      readonly graphs: number;
    }
  | { readonly id: number; readonly kind: 'failed'; readonly message: string };

interface Slot {
  readonly worker: Worker;
  /** requests for this worker alone (its share of the estimates) */
  readonly queue: Task[];
  graphs: number;
  busy: boolean;
}

interface Task {
  readonly request: PoolRequest;
  readonly done: (reply: PoolReply) => void;
}

export class TunePool implements Pricer {
  private readonly slots: Slot[];
  private readonly queue: Task[] = [];
  private readonly pending = new Map<number, Task>();
  private nextId = 0;
  private failure: Error | undefined;

  constructor(spec: TuneSpec, workers: number) {
    this.slots = Array.from({ length: workers }, () => {
      const slot: Slot = {
        worker: spawnWorker(import.meta.url, 'tune-worker', { spec }),
        queue: [],
        graphs: 0,
        busy: false,
      };
      slot.worker.on('message', (reply: PoolReply) => this.answer(slot, reply));
      slot.worker.on('error', (e) => this.fail(e));
      slot.worker.on('exit', (code) => {
        if (code !== 0) this.fail(new Error(`a tune worker exited with code ${code}`));
      });
      return slot;
    });
  }

  get graphs(): number {
    return this.slots.reduce((s, x) => s + x.graphs, 0);
  }

  get threads(): number {
    return this.slots.length;
  }

  /** part i on worker i */
  estimate(parts: readonly (readonly Layout[])[]): Promise<EstimateOutcome[][]> {
    return Promise.all(
      parts.map((layouts, w) =>
        this.submit(
          (id) => ({ id, kind: 'estimate', layouts }),
          this.slots[w % this.slots.length],
        ).then((r) => (r.kind === 'estimate' ? r.outcomes : [])),
      ),
    );
  }

  price(
    items: readonly { readonly layout: Layout; readonly estimate: Estimate }[],
    mode: PriceMode,
  ): Promise<PriceOutcome[]> {
    return Promise.all(
      items.map((x) =>
        this.submit((id) => ({
          id,
          kind: 'price',
          layout: x.layout,
          estimate: x.estimate,
          mode,
        })).then((r): PriceOutcome => (r.kind === 'price' ? r.outcome : { error: 'no reply' })),
      ),
    );
  }

  async close(): Promise<void> {
    await Promise.all(this.slots.map((s) => s.worker.terminate()));
  }

  /** a request for `slot` alone, or (without one) for whichever worker is free first */
  private submit(make: (id: number) => PoolRequest, slot?: Slot): Promise<PoolReply> {
    if (this.failure) return Promise.reject(this.failure);
    return new Promise((resolve, reject) => {
      const request = make(this.nextId++);
      (slot ? slot.queue : this.queue).push({
        request,
        done: (reply) =>
          reply.kind === 'failed' ? reject(new Error(reply.message)) : resolve(reply),
      });
      this.dispatch();
    });
  }

  private dispatch(): void {
    for (const slot of this.slots) {
      if (slot.busy) continue;
      const task = slot.queue.shift() ?? this.queue.shift();
      if (!task) continue;
      slot.busy = true;
      this.pending.set(task.request.id, task);
      slot.worker.postMessage(task.request);
    }
  }

  private answer(slot: Slot, reply: PoolReply): void {
    slot.busy = false;
    if (reply.kind !== 'failed') slot.graphs = reply.graphs;
    const task = this.pending.get(reply.id);
    this.pending.delete(reply.id);
    task?.done(reply);
    this.dispatch();
  }

  private fail(e: Error): void {
    if (this.failure) return;
    this.failure = e;
    const message = `a tune worker failed: ${e.message}`;
    const waiting = [
      ...this.pending.values(),
      ...this.queue,
      ...this.slots.flatMap((s) => s.queue),
    ];
    for (const task of waiting) task.done({ id: task.request.id, kind: 'failed', message });
    this.pending.clear();
    this.queue.length = 0;
    for (const s of this.slots) s.queue.length = 0;
  }
}
