// The fits check's advice: when a plan does not fit its device, the single changes of the compile
// request that would make it fit. Each is planned for real (compile without the verifier or the
// simulation), so its figure is the memory plan of that layout, not an estimate: the largest
// device total over the alternative's programs at the bounds, against the device.
//
// The changes considered, where they apply to the request: full or selective recompute, the
// fine-grained activation offload, the distributed optimizer, sequence parallelism, a smaller
// micro-batch, twice the pipeline or tensor parallelism, and level 3's encoder-output offload and
// encoder recompute. A change the layout rules refuse (pp that no longer divides the layers, tp
// over a node) is left out.

import type { Worker } from 'node:worker_threads';
import { compile, type CompileOptions } from '../pipeline.js';
import { spawnWorker } from '../threads.js';
import { UserError } from '../errors.js';
import { fitsOn, memoryByProgram, type DeviceMemory } from './memory.js';

export interface Remedy {
  /** the flags that make the change, as a user would add them */
  readonly change: string;
  /** the largest device total over the alternative's programs, at the bounds */
  readonly deviceBytes: number;
  readonly fits: boolean;
}

export interface Alternative {
  readonly change: string;
  readonly options: CompileOptions;
}

/** The single changes of `o` that apply, each as the options it compiles. */
export function alternativesOf(o: CompileOptions, world: number): Alternative[] {
  const out: Alternative[] = [];
  const add = (change: string, patch: Partial<CompileOptions>) =>
    out.push({ change, options: { ...o, ...patch } });
  const p = o.parallel ?? {};
  if (o.recompute?.granularity !== 'full')
    add('--recompute-granularity full', { recompute: { granularity: 'full' } });
  if (!o.recompute)
    add('--recompute-granularity selective --recompute-modules core_attn mlp moe_act', {
      recompute: { granularity: 'selective', modules: ['core_attn', 'mlp', 'moe_act'] },
    });
  if (!o.offloadTensors?.length)
    add(
      '--fine-grained-activation-offloading --offload-tensors dispatched_input pre_mlp_layernorm_output',
      { offloadTensors: ['dispatched_input', 'pre_mlp_layernorm_output'] },
    );
  if (!o.distributedOptimizer) add('--use-distributed-optimizer', { distributedOptimizer: true });
  if ((p.tp ?? 1) > 1 && !o.sequenceParallel)
    add('--sequence-parallel', { sequenceParallel: true });
  const mbs = o.microBatchSize ?? 1;
  if (mbs > 1)
    add(`--micro-batch-size ${Math.floor(mbs / 2)}`, { microBatchSize: Math.floor(mbs / 2) });
  const pp = (p.pp ?? 1) * 2;
  if (pp <= world) add(`--pp ${pp}`, { parallel: { ...p, pp } });
  const tp = (p.tp ?? 1) * 2;
  if (tp <= (o.nprocPerNode ?? 1))
    add(`--tp ${tp}${o.sequenceParallel ? '' : ' --sequence-parallel'}`, {
      parallel: { ...p, tp },
      sequenceParallel: true,
    });
  if (o.encoder?.fullHeteroDp) {
    if (!o.encoder.cpuOffload)
      add('--full-hetero-dp-cpu-offload', { encoder: { ...o.encoder, cpuOffload: true } });
    if (!o.encoder.recompute)
      add('--full-hetero-dp-encoder-recompute', { encoder: { ...o.encoder, recompute: true } });
  }
  return out;
}

/** One change planned: its largest program at the bounds; undefined where the rules refuse it. */
export function remedyOf(alt: Alternative, device: DeviceMemory): Remedy | undefined {
  let result;
  try {
    result = compile({ ...alt.options, skipVerify: true, dumpAfter: undefined });
  } catch (e) {
    if (e instanceof UserError) return undefined; // a layout the rules refuse
    throw e;
  }
  const worst = Math.max(...memoryByProgram(result, device).map((m) => m.bound.deviceBytes));
  return { change: alt.change, deviceBytes: worst, fits: fitsOn(worst, device) };
}

/**
 * Plans each applicable change and returns them all, smallest device total first (fitting or
 * not: with none that fits, the closest say how far a single change gets). With `workers` > 1
 * the changes are planned on that many worker threads at once (advice-worker.ts), each change
 * whole on one; `onEach` sees each as it is planned, for a progress line. The answer does not
 * depend on the number of workers.
 */
export async function remediesFor(
  o: CompileOptions,
  world: number,
  device: DeviceMemory,
  { workers = 1, onEach }: { workers?: number; onEach?: (done: number, of: number) => void } = {},
): Promise<Remedy[]> {
  const alts = alternativesOf(o, world);
  const found: (Remedy | undefined)[] = new Array(alts.length);
  const n = Math.max(1, Math.min(workers, alts.length));
  let done = 0;
  const settle = (i: number, r: Remedy | undefined) => {
    found[i] = r;
    onEach?.(++done, alts.length);
  };
  if (n === 1) alts.forEach((alt, i) => settle(i, remedyOf(alt, device)));
  else await onWorkers(alts, device, n, settle);
  return found
    .filter((r): r is Remedy => r !== undefined)
    .sort((a, b) => a.deviceBytes - b.deviceBytes || a.change.localeCompare(b.change));
}

/** the alternatives planned on `n` worker threads, each given the next one when it is free */
async function onWorkers(
  alts: readonly Alternative[],
  device: DeviceMemory,
  n: number,
  settle: (i: number, r: Remedy | undefined) => void,
): Promise<void> {
  let next = 0;
  const run = (worker: Worker) =>
    new Promise<void>((resolve, reject) => {
      const give = () => {
        if (next >= alts.length) return resolve();
        const i = next++;
        worker.postMessage({ i, alt: alts[i], device } satisfies AdviceRequest);
      };
      worker.on('message', (a: AdviceReply) => {
        if ('error' in a) return reject(new Error(`planning ${alts[a.i].change}: ${a.error}`));
        settle(a.i, a.remedy ?? undefined);
        give();
      });
      worker.on('error', reject);
      give();
    });
  const workers = Array.from({ length: n }, () =>
    spawnWorker(import.meta.url, 'advice-worker', {}),
  );
  try {
    await Promise.all(workers.map(run));
  } finally {
    await Promise.all(workers.map((w) => w.terminate()));
  }
}

/** what the advice's worker threads are sent, and answer */
export interface AdviceRequest {
  readonly i: number;
  readonly alt: Alternative;
  readonly device: DeviceMemory;
}
export type AdviceReply =
  | { readonly i: number; readonly remedy: Remedy | null }
  | { readonly i: number; readonly error: string };
