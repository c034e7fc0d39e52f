// Each program's planned memory per rank, from its regions: what `lfc compile`'s report tabulates,
// its fits check reads and `lfc viz` draws.
//
// Two figures per program:
//   bound     every buffer at the bound of its sizes: the visual-token cap of the data profile,
//             an expert dispatch at its planned bound (capacity, or the routing imbalance). The
//             runtime refuses a microbatch over them, so the bound is what a rank can need.
//   expected  the arena's most bytes live at once and the batch, with every size at its expected
//             value (the data profile's means, balanced routing): a typical step (scratch stays
//             at its bound).
// A program fits a device when its bound plus the hardware profile's reserve (CUDA context,
// communication buffers, fragmentation) is at most the device's memory.

import { stageOfRank, type PlanFile, type ProgramFile } from '../plan/format.js';
import type { HardwareProfile } from '../sim/hardware.js';

/** One program's planned memory on each rank that runs it (bytes, from its regions). */
export interface ProgramMemory {
  readonly program: string;
  readonly ranks: number;
  /** the pipeline stages its ranks are on */
  readonly stages: readonly number[];
  readonly parameters: number;
  readonly gradients: number;
  readonly optimizer: number;
  /** the runtime-filled inputs of every microbatch slot, and the step scalars */
  readonly batch: number;
  readonly activations: number;
  /** the streams' scratch (ProgramFile.scratchBytes): the runtime's temporaries the IR does not
   * name (staged f32 copies of bf16 operands, norm statistics, attention tiles, …) */
  readonly scratch: number;
  /** everything above: the device memory the plan asks of each of its ranks */
  readonly device: number;
  /** offloaded activations: pinned host memory */
  readonly host: number;
  readonly bound: { readonly deviceBytes: number };
  /** at expected sizes: the activations and batch of a typical step, and the device total */
  readonly expected: {
    readonly deviceBytes: number;
    readonly activations: number;
    readonly batch: number;
  };
  readonly hostBytes: number;
  /** against a device (fitsOn): whether bound + reserve ≤ the device's memory */
  readonly fits?: boolean;
}

/** What a device offers a plan: its memory and the part of it a plan cannot use. */
export interface DeviceMemory {
  readonly name: string;
  readonly bytes: number;
  readonly reserveBytes: number;
  /**
   * the runtime it stands for: 'cpu' (the native CPU runtime, whose scratch the plan sizes) or
   * 'gpu' (a GPU runtime: no CPU staging or tiles; its workspaces are in the reserve, so the
   * plan's scratch is not counted against it)
   */
  readonly runtime: 'cpu' | 'gpu';
}

/** Each distinct program's device and host memory per rank, the largest device total first. */
export function memoryByProgram(
  result: {
    readonly plan: PlanFile;
    readonly programs: readonly ProgramFile[];
  },
  device?: DeviceMemory,
): ProgramMemory[] {
  const ranksOf = new Map<string, number[]>();
  result.plan.rankPrograms.forEach((id, rank) => {
    ranksOf.set(id, [...(ranksOf.get(id) ?? []), rank]);
  });
  return result.programs
    .map((p) => {
      const r = p.regions;
      const ranks = ranksOf.get(p.id) ?? [];
      const { batch, scratch, total, activations, expectedBatch, expectedTotal } = programBytes(
        p,
        device,
      );
      return {
        program: p.id,
        ranks: ranks.length,
        stages: [...new Set(ranks.map((rank) => stageOfRank(result.plan, rank)))],
        parameters: r.param,
        gradients: r.grad,
        optimizer: r.optim,
        batch,
        activations: r.arena,
        scratch,
        device: total,
        host: r.host,
        bound: { deviceBytes: total },
        expected: {
          deviceBytes: expectedTotal,
          activations,
          batch: expectedBatch,
        },
        hostBytes: r.host,
      };
    })
    .map((m) => (device ? { ...m, fits: fitsOn(m.bound.deviceBytes, device) } : m))
    .sort((a, b) => b.device - a.device || a.program.localeCompare(b.program));
}

/** One program's figures of ProgramMemory (see there), from its regions. */
function programBytes(p: ProgramFile, device?: DeviceMemory) {
  const r = p.regions;
  const batch = r.data + r.scalar;
  // a GPU runtime has none of the CPU runtime's staging and tiles (its workspaces are in the
  // device's reserve)
  const scratch = device?.runtime === 'gpu' ? 0 : r.scratch;
  const fixed = r.param + r.grad + r.optim + scratch;
  const total = fixed + batch + r.arena;
  const activations = p.expectedBytes?.arena ?? p.arenaLowerBoundBytes;
  const expectedBatch = (p.expectedBytes?.data ?? r.data) + r.scalar;
  const expectedTotal = fixed + expectedBatch + activations;
  return { batch, scratch, fixed, total, activations, expectedBatch, expectedTotal };
}

/** A program's device bytes per rank, at the bounds and at expected sizes (ProgramMemory's). */
export function programDeviceBytes(
  p: ProgramFile,
  device?: DeviceMemory,
): { readonly bound: number; readonly expected: number } {
  const b = programBytes(p, device);
  return { bound: b.total, expected: b.expectedTotal };
}

/** what a hardware profile's device offers a plan */
export function deviceMemoryOf(hw: HardwareProfile): DeviceMemory {
  return {
    name: hw.name,
    bytes: hw.memoryGiB * 2 ** 30,
    reserveBytes: hw.memoryReserveGiB * 2 ** 30,
    runtime: hw.runtime,
  };
}

/** bound + reserve ≤ the device's memory */
export function fitsOn(deviceBytes: number, device: DeviceMemory): boolean {
  return deviceBytes + device.reserveBytes <= device.bytes;
}
