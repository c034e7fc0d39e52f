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

import { compile, type CompileOptions } from '../pipeline.js';
import { UserError } from '../errors.js';
import { fitsOn, memoryByProgram, type DeviceMemory } from './memory.js';

export interface Remedy {
  /** the flags that make the change, as a user would add them */
  readonly change: string;
  /** the largest device total over the alternative's programs, at the bounds */
  readonly deviceBytes: number;
  readonly fits: boolean;
}

interface Alternative {
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

/**
 * Plans each applicable change and returns them all, smallest device total first (fitting or
 * not: with none that fits, the closest say how far a single change gets); `onEach` sees each as
 * it is planned, for a progress line.
 */
export function remediesFor(
  o: CompileOptions,
  world: number,
  device: DeviceMemory,
  onEach?: (r: Remedy) => void,
): Remedy[] {
  const remedies: Remedy[] = [];
  for (const alt of alternativesOf(o, world)) {
    let result;
    try {
      result = compile({ ...alt.options, skipVerify: true, dumpAfter: undefined });
    } catch (e) {
      if (e instanceof UserError) continue; // a layout the rules refuse
      throw e;
    }
    const worst = Math.max(...memoryByProgram(result, device).map((m) => m.bound.deviceBytes));
    const r = { change: alt.change, deviceBytes: worst, fits: fitsOn(worst, device) };
    onEach?.(r);
    remedies.push(r);
  }
  return remedies.sort((a, b) => a.deviceBytes - b.deviceBytes);
}
